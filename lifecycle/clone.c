/* A sandbox directory cloned for `cove fork NAME NEW`: spec rewritten, committed layers shared. */
#include "lifecycle/clone.h"
#include "lifecycle/lazy_files.h"
#include "lifecycle/broker.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/fs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/dirfd_io.h"
#include "common/errmsg.h"
#include "common/file_io.h"
#include "devices/overlay.h"
#include "lifecycle/image_files.h"
#include "lifecycle/archive.h"
#include "lifecycle/name.h"
#include "lifecycle/policy.h"
#include "lifecycle/spec.h"
#include "lifecycle/state.h"
#include "lifecycle/tombstone.h"
#include "lifecycle/tree.h"
#include "lifecycle/vmm_args.h"
#include "sandbox/event_log.h"
#include "snapshot/chain.h"
#include "snapshot/keyfile.h"

#define LAYER_SEQ "layer-seq" /* snapshot/keyfile.c's counter of layer ids */

int sbx_clone_check(const struct sbx_root *r, const char *from, const char *const *names, int n,
		    char *err, size_t errlen)
{
	struct stat st;

	for (int i = 0; i < n; i++) {
		int ret = sbx_name_check(names[i], err, errlen);

		if (ret)
			return ret;
		for (int j = 0; j < i; j++)
			if (!strcmp(names[i], names[j]))
				return errmsg(err, errlen, -EALREADY, "%s is named twice",
					      names[i]);
		if ((from && !strcmp(names[i], from)) ||
		    fstatat(r->dfd, names[i], &st, AT_SYMLINK_NOFOLLOW) == 0 || errno != ENOENT)
			return errmsg(err, errlen, -EEXIST, "sandbox %s already exists", names[i]);
	}
	return 0;
}

/* Copies sdfd/name to ddfd/name (0600, synced): a reflink where the filesystem has them. */
static int copy_file(int sdfd, int ddfd, const char *name, struct sbx_clone_stats *st)
{
	int in = dirfd_open(sdfd, name, O_RDONLY | O_CLOEXEC), out = -1, ret;
	struct stat s;

	if (in < 0)
		return in;
	if (fstat(in, &s) < 0) {
		ret = -errno;
		goto out;
	}
	if (!S_ISREG(s.st_mode)) {
		ret = -ENOTSUP;
		goto out;
	}
	out = dirfd_create(ddfd, name, O_WRONLY | O_CLOEXEC, 0600);
	if (out < 0) {
		ret = out;
		goto out;
	}
	ret = ioctl(out, FICLONE, in) == 0 ? 0 : file_copy_runs(in, out, 0, s.st_size);
	if (!ret && ftruncate(out, s.st_size) < 0)
		ret = -errno;
	if (!ret && fsync(out) < 0)
		ret = -errno;
	if (!ret) {
		st->copied++;
		st->bytes_copied += (uint64_t)s.st_size;
	}
out:
	close(in);
	if (out >= 0)
		close(out);
	return ret;
}

/*
 * A committed file into the clone: a hard link (it is never written again: later snapshots,
 * compaction and rekeys make new files and rename them), else a copy.
 */
static int share_file(int sdfd, int ddfd, const char *name, unsigned flags,
		      struct sbx_clone_stats *st, char *err, size_t errlen)
{
	struct stat s;
	int ret;

	if (fstatat(sdfd, name, &s, AT_SYMLINK_NOFOLLOW) < 0)
		return errmsg(err, errlen, -errno, "%s: %s", name, strerror(errno));
	if (!S_ISREG(s.st_mode))
		return errmsg(err, errlen, -ENOTSUP, "%s is not a regular file", name);
	if (!(flags & SBX_CLONE_COPY)) {
		if (linkat(sdfd, name, ddfd, name, 0) == 0) {
			st->linked++;
			return 0;
		}
		if (errno != EXDEV && errno != EPERM && errno != EMLINK && errno != EOPNOTSUPP)
			return errmsg(err, errlen, -errno, "link %s: %s", name, strerror(errno));
	}
	ret = copy_file(sdfd, ddfd, name, st);
	return ret ? errmsg(err, errlen, ret, "copy %s: %s", name, strerror(-ret)) : 0;
}

/*
 * 1 when name (an overlay map in the chain) is a frozen layer's: the whole map passes
 * overlay_map_parse and says frozen. A live top (not frozen) is the running VMM's, never shared.
 */
static int map_frozen(int cdfd, const char *name)
{
	struct overlay_map_info m;
	char err[160];
	struct stat s;
	uint8_t *buf = NULL;
	int fd = dirfd_open(cdfd, name, O_RDONLY | O_CLOEXEC), frozen = 0;

	if (fd < 0)
		return 0;
	if (fstat(fd, &s) == 0 && S_ISREG(s.st_mode) && s.st_size > 0 &&
	    (uint64_t)s.st_size <= OVERLAY_MAP_HDR_SEALED + (uint64_t)OVERLAY_BITMAP_MAX &&
	    (buf = malloc((size_t)s.st_size)) && pread_full(fd, buf, (size_t)s.st_size, 0) == 0 &&
	    overlay_map_parse(buf, (size_t)s.st_size, &m, err, sizeof(err)) == 0)
		frozen = (m.flags & OVERLAY_MAP_FROZEN) != 0;
	free(buf);
	close(fd);
	return frozen;
}

/* The frozen disk layers in the chain directory: X.ovl.map marked frozen, and X.ovl. */
static int share_disk_layers(int sdfd, int ddfd, unsigned flags, struct sbx_clone_stats *st,
			     char *err, size_t errlen)
{
	static const char suffix[] = ".ovl" OVERLAY_MAP_SUFFIX;
	int fd = dup(sdfd), ret = 0;
	struct dirent *e;
	DIR *d;

	if (fd < 0 || !(d = fdopendir(fd))) {
		ret = errmsg(err, errlen, -errno, "chain: %s", strerror(errno));
		if (fd >= 0)
			close(fd);
		return ret;
	}
	rewinddir(d);
	while (!ret && (e = readdir(d))) {
		size_t len = strlen(e->d_name), sl = sizeof(suffix) - 1;
		char data[256];

		if (!dirfd_plain_name(e->d_name) || len <= sl ||
		    strcmp(e->d_name + len - sl, suffix) || !map_frozen(sdfd, e->d_name))
			continue;
		snprintf(data, sizeof(data), "%.*s", (int)(len - strlen(OVERLAY_MAP_SUFFIX)),
			 e->d_name);
		ret = share_file(sdfd, ddfd, e->d_name, flags, st, err, errlen)
			  ?: share_file(sdfd, ddfd, data, flags, st, err, errlen);
	}
	closedir(d);
	return ret;
}

/*
 * The newest committed generation (the clone's own chain.json: a copy of these bytes), parsed
 * into c. A running parent's VMM commits generation files chain.N.json (snapshot/DIGEST.md):
 * chain_load finds the newest valid one; chain.json alone is only the host's settled copy.
 */
static int read_chain(int cdfd, char **text, size_t *len, struct chain *c, char *err, size_t errlen)
{
	char self[64], name[CHAIN_NAME_MAX];
	snprintf(self, sizeof(self), "/proc/self/fd/%d", cdfd);
	int ret = chain_load(self, c, err, errlen);
	if (ret == -ENOENT)
		return errmsg(err, errlen, -ENOENT, "it has no committed snapshot to fork from");
	if (ret)
		return ret;
	snprintf(name, sizeof(name), "%s", c->source[0] ? c->source : CHAIN_FILE);
	int fd = dirfd_open(cdfd, name, O_RDONLY | O_CLOEXEC);
	struct stat s;

	if (fd < 0)
		return errmsg(err, errlen, fd == -ENOENT ? -ENOENT : fd,
			      fd == -ENOENT ? "it has no committed snapshot to fork from"
					    : "chain.json: %s",
			      strerror(-fd));
	if (fstat(fd, &s) < 0 || !S_ISREG(s.st_mode) || s.st_size <= 0 ||
	    s.st_size > CHAIN_MAX_BYTES) {
		close(fd);
		return errmsg(err, errlen, -EINVAL, "chain.json: empty or too large");
	}
	*len = (size_t)s.st_size;
	*text = malloc(*len + 1);
	ret = *text ? pread_full(fd, *text, *len, 0) : -ENOMEM;
	close(fd);
	if (ret)
		return errmsg(err, errlen, ret, "chain.json: %s", strerror(-ret));
	(*text)[*len] = '\0';
	ret = chain_parse(*text, *len, c, err, errlen);
	if (!ret && c->nr_layers == 0)
		ret = errmsg(err, errlen, -ENOENT, "it has no committed snapshot to fork from");
	return ret;
}

static int write_file(int dfd, const char *name, const char *text, size_t len)
{
	char tmp[80];
	int fd, ret;

	snprintf(tmp, sizeof(tmp), ".%s.tmp", name);
	fd = dirfd_create(dfd, tmp, O_WRONLY | O_CLOEXEC, 0600);
	if (fd < 0)
		return fd;
	ret = pwrite_full(fd, text, len, 0);
	if (!ret && fsync(fd) < 0)
		ret = -errno;
	close(fd);
	return ret ?: dirfd_rename(dfd, tmp, name);
}

static int open_sub(int dfd, const char *name, bool create)
{
	if (create && mkdirat(dfd, name, 0700) < 0)
		return -errno;
	int fd = openat(dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);

	return fd < 0 ? -errno : fd;
}

/* The name of the highest layer-seq.NNNNNNNNNNNNNNNNNNNN step in the chain: 0, or -ENOENT. */
static int newest_seq_step(int cdfd, char *out, size_t cap)
{
	int fd = dup(cdfd), found = -ENOENT;
	size_t pl = strlen(LAYER_SEQ) + 1;
	struct dirent *e;
	DIR *d;

	if (fd < 0 || !(d = fdopendir(fd))) {
		if (fd >= 0)
			close(fd);
		return -ENOENT;
	}
	rewinddir(d);
	while ((e = readdir(d))) {
		const char *n = e->d_name;
		if (strlen(n) != pl + 20 || strncmp(n, LAYER_SEQ ".", pl) ||
		    strspn(n + pl, "0123456789") != 20)
			continue;
		/* Zero-padded to one width: the greatest name is the greatest step. */
		if (found || strcmp(n, out) > 0) {
			snprintf(out, cap, "%s", n);
			found = 0;
		}
	}
	closedir(d);
	return found;
}

/* NAME/chain/ into the clone: committed layers, frozen disk layers, keys, then chain.json. */
static int clone_chain(int sdfd, int tdfd, unsigned flags, struct sbx_clone_stats *st, char *err,
		       size_t errlen)
{
	struct chain *c = malloc(sizeof(*c));
	int scd = open_sub(sdfd, SBX_CHAIN, false), dcd = -1, ret;
	char *text = NULL, name_buf[64];
	size_t len = 0;

	if (!c) {
		ret = errmsg(err, errlen, -ENOMEM, "out of memory");
		goto out;
	}
	if (scd < 0) {
		ret = errmsg(err, errlen, scd,
			     scd == -ENOENT ? "it has no committed snapshot to fork from"
					    : "chain: %s",
			     strerror(-scd));
		goto out;
	}
	ret = read_chain(scd, &text, &len, c, err, errlen);
	if (ret)
		goto out;
	dcd = open_sub(tdfd, SBX_CHAIN, true);
	if (dcd < 0) {
		ret = errmsg(err, errlen, dcd, "chain: %s", strerror(-dcd));
		goto out;
	}
	for (int i = 0; !ret && i < c->nr_layers; i++)
		ret = share_file(scd, dcd, c->layers[i].mem, flags, st, err, errlen)
			  ?: share_file(scd, dcd, c->layers[i].state, flags, st, err, errlen);
	ret = ret ?: share_disk_layers(scd, dcd, flags, st, err, errlen);
	/* Small files a rekey or the next snapshot rewrites: copies, not links. */
	if (!ret && faccessat(scd, KEYFILE_NAME, F_OK, AT_SYMLINK_NOFOLLOW) == 0)
		ret = share_file(scd, dcd, KEYFILE_NAME, flags | SBX_CLONE_COPY, st, err, errlen);
	if (!ret && (ret = write_file(dcd, CHAIN_FILE, text, len)))
		errmsg(err, errlen, ret, "chain.json: %s", strerror(-ret));
	/*
	 * The layer id counter last: the source burns an id before any file carries it, so a
	 * counter read after the files is above every id the clone holds. The clone counts on
	 * from there on its own; ids that repeat across the two chains are safe under one data
	 * key because every layer draws a fresh salt (snapshot/CRYPTO.md).
	 */
	if (!ret && faccessat(scd, LAYER_SEQ, F_OK, AT_SYMLINK_NOFOLLOW) == 0)
		ret = share_file(scd, dcd, LAYER_SEQ, flags | SBX_CLONE_COPY, st, err, errlen);
	/* A running parent's counter moves by create-only steps layer-seq.N: its highest. */
	if (!ret && newest_seq_step(scd, name_buf, sizeof(name_buf)) == 0)
		ret = share_file(scd, dcd, name_buf, flags | SBX_CLONE_COPY, st, err, errlen);
	if (!ret && (ret = dirfd_sync(dcd)))
		errmsg(err, errlen, ret, "chain: sync: %s", strerror(-ret));
out:
	if (scd >= 0)
		close(scd);
	if (dcd >= 0)
		close(dcd);
	free(text);
	free(c);
	return ret;
}

/* NAME/archive/ into the clone: every file linked (unpacking reads them and removes its own). */
static int clone_archive(int sdfd, int tdfd, unsigned flags, struct sbx_clone_stats *st, char *err,
			 size_t errlen)
{
	int sad = open_sub(sdfd, SBX_ARCHIVE, false), dad, fd, ret = 0;
	struct dirent *e;
	DIR *d;

	if (sad < 0)
		return errmsg(err, errlen, sad, "archive: %s", strerror(-sad));
	dad = open_sub(tdfd, SBX_ARCHIVE, true);
	fd = dad < 0 ? -1 : dup(sad);
	if (fd < 0 || !(d = fdopendir(fd))) {
		ret = errmsg(err, errlen, dad < 0 ? dad : -errno, "archive: %s",
			     strerror(dad < 0 ? -dad : errno));
		if (fd >= 0)
			close(fd);
		goto out;
	}
	while (!ret && (e = readdir(d)))
		if (dirfd_plain_name(e->d_name))
			ret = share_file(sad, dad, e->d_name, flags, st, err, errlen);
	closedir(d);
	if (!ret && (ret = dirfd_sync(dad)))
		errmsg(err, errlen, ret, "archive: sync: %s", strerror(-ret));
	st->archived = !ret;
out:
	close(sad);
	if (dad >= 0)
		close(dad);
	return ret;
}

/* "cove.hostname=FROM" in the command line becomes "cove.hostname=TO" (used on a cold boot). */
static void rename_cmdline(char *cmdline, size_t cap, const char *from, const char *to)
{
	static const char key[] = "cove.hostname=";
	char *out = malloc(cap);
	size_t fl = strlen(from);

	for (char *p = cmdline; out && (p = strstr(p, key)); p += sizeof(key) - 1) {
		char *v = p + sizeof(key) - 1;

		if ((p != cmdline && p[-1] != ' ') || strncmp(v, from, fl) ||
		    (v[fl] && v[fl] != ' '))
			continue;
		if ((size_t)snprintf(out, cap, "%.*s%s%s", (int)(v - cmdline), cmdline, to,
				     v + fl) < cap)
			strcpy(cmdline, out);
		break;
	}
	free(out);
}

/*
 * A sandbox with a policy: the clone keeps a copy of its own, and its spec names that copy (its
 * broker's audit key goes beside it, its own), so the clone does not lean on the parent's files.
 */
static int clone_policy(const struct sbx_root *r, int sdfd, int tdfd, const char *to,
			struct sbx_spec *s, char *err, size_t errlen)
{
	char *buf = NULL, why[256];
	size_t len = 0;
	int ret;

	if (!s->policy[0])
		return 0;
	ret = sbx_policy_load_at(sdfd, &buf, &len, why, sizeof(why));
	if (ret)
		return errmsg(err, errlen, ret, "its policy: %s", why);
	ret = sbx_policy_write(tdfd, buf, len);
	free(buf);
	if (ret)
		return errmsg(err, errlen, ret, "cannot write its policy: %s", strerror(-ret));
	if ((size_t)snprintf(s->policy, sizeof(s->policy), "%s/%s/%s", r->state, to, SBX_POLICY) >=
	    sizeof(s->policy))
		return errmsg(err, errlen, -ENAMETOOLONG, "its policy path is too long");
	return 0;
}

static int clone_spec(const struct sbx_root *r, int sdfd, int tdfd, const char *from,
		      const char *to, char *err, size_t errlen)
{
	struct sbx_spec *s = malloc(sizeof(*s));
	int ret;

	if (!s)
		return errmsg(err, errlen, -ENOMEM, "out of memory");
	ret = sbx_spec_read(sdfd, s, err, errlen)
		  ?: clone_policy(r, sdfd, tdfd, to, s, err, errlen)
		  ?: sbx_image_files_clone(r->state, sdfd, tdfd, to, s, err, errlen);
	if (!ret) {
		rename_cmdline(s->cmdline, sizeof(s->cmdline), from, to);
		s->created_ms = realtime_ms();
		/* A new machine: its guest takes this id at its first identity event. */
		ret = sbx_spec_new_machine_id(s) ?: sbx_spec_write(tdfd, s);
		if (ret)
			errmsg(err, errlen, ret, "cannot write its spec: %s", strerror(-ret));
	}
	free(s);
	return ret;
}

/* The parent's CA into the clone (a copy, 0600): the clone's disk trusts the certificate the
 * parent's create installed, so the clone's broker signs with the same CA. None: nothing. */
static int clone_mitm_ca(int sdfd, int tdfd, struct sbx_clone_stats *st, char *err, size_t errlen)
{
	static const char *const files[] = {SBX_BROKER_MITM_CA_KEY, SBX_BROKER_MITM_CA_CERT};
	int s = open_sub(sdfd, SBX_BROKER_MITM_CA, false), t, ret = 0;

	if (s == -ENOENT)
		return 0;
	if (s < 0)
		return errmsg(err, errlen, s, "%s: %s", SBX_BROKER_MITM_CA, strerror(-s));
	t = open_sub(tdfd, SBX_BROKER_MITM_CA, true);
	if (t < 0) {
		close(s);
		return errmsg(err, errlen, t, "%s: %s", SBX_BROKER_MITM_CA, strerror(-t));
	}
	for (size_t i = 0; !ret && i < sizeof(files) / sizeof(*files); i++) {
		if (faccessat(s, files[i], F_OK, AT_SYMLINK_NOFOLLOW) < 0 && errno == ENOENT)
			continue;
		ret = copy_file(s, t, files[i], st);
		if (ret)
			errmsg(err, errlen, ret, "copy %s/%s: %s", SBX_BROKER_MITM_CA, files[i],
			       strerror(-ret));
	}
	if (!ret && (ret = dirfd_sync(t)))
		errmsg(err, errlen, ret, "sync %s: %s", SBX_BROKER_MITM_CA, strerror(-ret));
	close(s);
	close(t);
	return ret;
}

int sbx_clone(const struct sbx_root *r, const char *from, int sdfd, const char *to, unsigned flags,
	      const char *cause, struct sbx_clone_stats *st, char *err, size_t errlen)
{
	const char *names[1] = {to};
	enum sbx_state state;
	char tmp[SBX_NAME_MAX + 32];
	int tdfd = -1, ret;

	memset(st, 0, sizeof(*st));
	ret = sbx_clone_check(r, flags & SBX_CLONE_TEMPLATE ? NULL : from, names, 1, err, errlen);
	if (ret)
		return ret;
	ret = sbx_state_read(sdfd, &state, NULL);
	if (ret)
		return errmsg(err, errlen, ret, "%s: cannot read its state (%s)", from,
			      strerror(-ret));
	if (state == SBX_CREATING || state == SBX_DELETED)
		return errmsg(err, errlen, -ENOENT, "%s is %s: it has no snapshot to fork from",
			      from, sbx_state_name(state));
	/* A clone maps its layers whole: not while some still arrive from the store. */
	if (sbx_lazy_pending(sdfd))
		return errmsg(err, errlen, -EBUSY,
			      "%s: its memory layers are still arriving from the store: fork it "
			      "once they are here",
			      from);
	/* A dot name is never a sandbox: a crash leaves a directory gc and ls do not see. */
	snprintf(tmp, sizeof(tmp), ".clone-%s-%d", to, (int)getpid());
	sbx_tree_remove(r->dfd, tmp);
	tdfd = open_sub(r->dfd, tmp, true);
	if (tdfd < 0)
		return errmsg(err, errlen, tdfd, "%s/%s: %s", r->state, tmp, strerror(-tdfd));
	ret = clone_spec(r, sdfd, tdfd, from, to, err, errlen);
	if (!ret)
		ret = state == SBX_ARCHIVED ? clone_archive(sdfd, tdfd, flags, st, err, errlen)
					    : clone_chain(sdfd, tdfd, flags, st, err, errlen);
	if (!ret && !(flags & SBX_CLONE_TEMPLATE))
		ret = clone_mitm_ca(sdfd, tdfd, st, err, errlen);
	/* A template's frozen stamps name the very files just linked: the clone's first check
	 * reads none of them (chain_stamps_freeze). Copies never match them. */
	if (!ret && (flags & SBX_CLONE_TEMPLATE) && !(flags & SBX_CLONE_COPY)) {
		struct sbx_clone_stats ignored = {0};
		int e = copy_file(sdfd, tdfd, SBX_DIGEST_STAMPS, &ignored);

		if (e && e != -ENOENT)
			ret =
			    errmsg(err, errlen, e, "copy %s: %s", SBX_DIGEST_STAMPS, strerror(-e));
	}
	if (!ret && (ret = sbx_event_append(tdfd, sbx_state_name(SBX_CREATING),
					    st->archived ? "archived" : "stopped", cause)))
		errmsg(err, errlen, ret, "event log: %s", strerror(-ret));
	if (!ret && (ret = dirfd_sync(tdfd)))
		errmsg(err, errlen, ret, "sync: %s", strerror(-ret));
	if (!ret && renameat2(r->dfd, tmp, r->dfd, to, RENAME_NOREPLACE) < 0)
		ret = errmsg(err, errlen, -errno,
			     errno == EEXIST ? "sandbox %s already exists" : "rename to %s: %s", to,
			     strerror(errno));
	close(tdfd);
	if (ret) {
		sbx_tree_remove(r->dfd, tmp);
		return ret;
	}
	dirfd_sync(r->dfd);
	sbx_tombstone_clear(r, to);
	return 0;
}
