/* Whole-buffer reads and writes (short transfers and EINTR resumed): one loop for every layer. */
#ifndef COVE_FILE_IO_H
#define COVE_FILE_IO_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* Reads exactly len bytes at off. 0, -errno, or -EIO at end of file. */
int pread_full(int fd, void *buf, size_t len, off_t off);
/* Writes exactly len bytes at off. 0 or -errno (-EIO if the kernel wrote nothing). */
int pwrite_full(int fd, const void *buf, size_t len, off_t off);
/* Writes `text` to the existing file `path` in one write (a /proc or cgroup control file):
 * 0, -EIO when it was cut short, or -errno. */
int file_write_str(const char *path, const char *text);
/*
 * Copies the data runs of in's bytes [from, end) to the same offsets of out; holes stay holes
 * (SEEK_DATA/SEEK_HOLE; a filesystem without them gives the whole range). copy_file_range where
 * the kernel can (a reflink on some filesystems), else pread/pwrite. 0 or -errno (-EIO when in
 * is shorter than it said).
 */
int file_copy_runs(int in, int out, off_t from, off_t end);
/* A run of a file's data: (offset, length). */
struct file_run {
	uint64_t off, len;
};
/*
 * The data runs of fd's first `size` bytes (SEEK_DATA/SEEK_HOLE): layers and overlays are mostly
 * holes. A filesystem without them, or more than `max` runs, gives one run of the whole file.
 * *out (malloc'ed, may be NULL when *n is 0) and *n. 0 or -ENOMEM.
 */
int file_data_runs(int fd, uint64_t size, size_t max, struct file_run **out, size_t *n);
#endif
