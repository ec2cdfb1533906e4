/* Files beneath a directory fd, never through a link: every write into a chain or overlay directory
 * goes through here. */
#ifndef COVE_DIRFD_IO_H
#define COVE_DIRFD_IO_H

#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

/*
 * A file name a chain names (untrusted): 1..255 bytes, no '/', not starting with '.' (so
 * neither "." nor ".." nor our temp files), printable ASCII. The other functions take names
 * of our own making: any single component but "." and "..".
 */
bool dirfd_plain_name(const char *name);
/*
 * Opens the directory `path` (the host named it), creating it 0700 when `create` and absent.
 * A directory that exists must be ours (euid) and not writable by group or others: anyone else
 * could plant links in it. The fd, or -errno with a one-line message in `err`.
 */
int dirfd_open_dir(const char *path, bool create, char *err, size_t errlen);
/*
 * The parent directory of `path` (no ownership check: a host path the user named) and the
 * last component copied into name[cap]. The fd, or -errno.
 */
int dirfd_open_parent(const char *path, char *name, size_t cap);
/*
 * Creates `name` in `dfd` afresh: a stale file or link of that name is removed first (it is
 * ours: a temp file a crash left), then O_CREAT|O_EXCL|O_NOFOLLOW. The fd, or -errno.
 */
int dirfd_create(int dfd, const char *name, int flags, mode_t mode);
/*
 * Creates `name` in `dfd` only if no file or link of that name exists (O_CREAT|O_EXCL|
 * O_NOFOLLOW; never unlinks: the jailed VMM may not). The fd, or -errno (-EEXIST).
 */
int dirfd_create_new(int dfd, const char *name, int flags, mode_t mode);
/*
 * A fresh temporary file for `final` in `dfd`: ".FINAL.PID-XXXXXXXX.tmp" (random hex), created
 * by dirfd_create_new, another name tried on EEXIST. Its name goes into tmp[cap]. The fd, or
 * -errno. chain_settle recognises these names (and the older ".FINAL.tmp") as leftovers.
 */
int dirfd_create_tmp(int dfd, const char *final, char *tmp, size_t cap, int flags, mode_t mode);
/* Opens an existing `name` in `dfd` without following a link (O_CREAT is refused). */
int dirfd_open(int dfd, const char *name, int flags);
/* renameat within `dfd`, unlinkat, fsync of the directory: 0 or -errno. */
int dirfd_rename(int dfd, const char *from, const char *to);
int dirfd_unlink(int dfd, const char *name);
/* renameat2(RENAME_NOREPLACE) within `dfd`: -EEXIST when `to` exists; never replaces a file. */
int dirfd_rename_noreplace(int dfd, const char *from, const char *to);
int dirfd_sync(int dfd);

#endif
