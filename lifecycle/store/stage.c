/* A generation's files packed into blobs, and fetched blobs placed as files (stage.h). */
#include "lifecycle/store/stage.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/dirfd_io.h"
#include "common/errmsg.h"
#include "snapshot/chain.h"
#include "snapshot/keyfile.h"

static int add_name(char (*names)[STORE_FILE_NAME_MAX], size_t max, size_t *n, const char *name,
		    char *err, size_t errlen)
{
	for (size_t i = 0; i < *n; i++)
		if (!strcmp(names[i], name))
			return 0;
	if (!store_file_name_ok(name))
		return errmsg(err, errlen, -EINVAL,
			      "chain file \"%.64s\" has no name a store takes", name);
	if (*n >= max)
		return errmsg(err, errlen, -E2BIG, "the chain has more than %zu files", max);
	snprintf(names[(*n)++], STORE_FILE_NAME_MAX, "%s", name);
	return 0;
}

/* keys, layer-seq and its create-only steps layer-seq.N: what restore needs beside layers. */
static bool side_file(const char *n)
{
	return !strcmp(n, KEYFILE_NAME) || !strncmp(n, "layer-seq", 9);
}

int store_stage_list(const char *dir, char (*names)[STORE_FILE_NAME_MAX], size_t max, size_t *n,
		     uint64_t *layer, char *err, size_t errlen)
{
	struct chain *c = calloc(1, sizeof(*c));
	if (!c)
		return errmsg(err, errlen, -ENOMEM, "out of memory");
	*n = 0;
	int r = chain_load(dir, c, err, errlen);
	const struct chain_layer *top = r ? NULL : chain_latest(c);
	if (!r && !top)
		r = errmsg(err, errlen, -ENOENT, "%s: the chain has no layer", dir);
	if (!r && !c->has_digests)
		r = errmsg(err, errlen, -EINVAL,
			   "%s: the chain records no digests (taken before cove did): take a "
			   "snapshot first",
			   dir);
	for (int i = 0; !r && i < c->nr_layers; i++) {
		r = add_name(names, max, n, c->layers[i].mem, err, errlen);
		if (!r)
			r = add_name(names, max, n, c->layers[i].state, err, errlen);
	}
	for (int i = 0; !r && i < c->nr_digests; i++)
		r = add_name(names, max, n, c->digests[i].name, err, errlen);
	DIR *d = r ? NULL : opendir(dir);
	if (!r && !d)
		r = errmsg(err, errlen, -errno, "%s: %s", dir, strerror(errno));
	struct dirent *e;
	while (!r && d && (e = readdir(d)))
		if (e->d_type == DT_REG && side_file(e->d_name))
			r = add_name(names, max, n, e->d_name, err, errlen);
	if (d)
		closedir(d);
	if (!r)
		r = add_name(names, max, n, c->source, err, errlen); /* last: it names the rest */
	if (!r)
		*layer = top->id;
	free(c);
	return r;
}

int store_stage_fd(int in, const char *as, const uint8_t *recorded, int stage_dfd,
		   struct store_file *f, int *blob_fd, uint64_t *blob_len, uint8_t **chunks,
		   char *err, size_t errlen)
{
	if (!store_file_name_ok(as))
		return errmsg(err, errlen, -EINVAL, "\"%.64s\": not a plain file name", as);
	struct stat st;
	int r = fstat(in, &st) < 0 ? -errno : S_ISREG(st.st_mode) ? 0 : -EINVAL;
	if (r)
		return errmsg(err, errlen, r, "%s: not a regular file", as);
	int out = openat(stage_dfd, ".", O_TMPFILE | O_RDWR | O_CLOEXEC, 0600);
	if (out < 0)
		return errmsg(err, errlen, -errno, "staging %s: %s", as, strerror(errno));
	memset(f, 0, sizeof(*f));
	snprintf(f->name, sizeof(f->name), "%s", as);
	f->size = (uint64_t)st.st_size;
	r = store_blob_pack(in, out, f->digest, blob_len, chunks, err, errlen);
	if (!r && recorded && memcmp(recorded, f->digest, DIGEST_LEN))
		r = errmsg(err, errlen, -EBADMSG,
			   "%s: its bytes do not match the digest the chain recorded (changed "
			   "since its commit): not uploaded",
			   as);
	if (r) {
		if (chunks) {
			free(*chunks);
			*chunks = NULL;
		}
		close(out);
		return r;
	}
	*blob_fd = out;
	return 0;
}

int store_stage_file(int src_dfd, const char *name, const uint8_t *recorded, int stage_dfd,
		     struct store_file *f, int *blob_fd, uint64_t *blob_len, char *err,
		     size_t errlen)
{
	if (!store_file_name_ok(name))
		return errmsg(err, errlen, -EINVAL, "\"%.64s\": not a plain file name", name);
	int in = dirfd_open(src_dfd, name, O_RDONLY);
	if (in < 0)
		return errmsg(err, errlen, in, "%s: %s", name, strerror(-in));
	int r =
	    store_stage_fd(in, name, recorded, stage_dfd, f, blob_fd, blob_len, NULL, err, errlen);
	close(in);
	return r;
}

int store_place_file(int blob_fd, uint64_t blob_len, const struct store_file *f, int dst_dfd,
		     char *err, size_t errlen)
{
	if (!store_file_name_ok(f->name))
		return errmsg(err, errlen, -EINVAL, "\"%.64s\": not a plain file name", f->name);
	struct store_blob_info info;
	int r =
	    store_blob_verify(blob_fd, blob_len, f->size, f->digest, f->name, &info, err, errlen);
	if (r)
		return r;
	if (info.size != f->size)
		return errmsg(err, errlen, -EBADMSG,
			      "%s: blob holds %llu bytes, the manifest says %llu", f->name,
			      (unsigned long long)info.size, (unsigned long long)f->size);
	char tmp[STORE_FILE_NAME_MAX + 64];
	int out = dirfd_create_tmp(dst_dfd, f->name, tmp, sizeof(tmp), O_RDWR, 0600);
	if (out < 0)
		return errmsg(err, errlen, out, "%s: cannot create: %s", f->name, strerror(-out));
	r = store_blob_unpack(blob_fd, &info, out, err, errlen);
	if (!r && fsync(out) < 0)
		r = errmsg(err, errlen, -errno, "%s: fsync: %s", f->name, strerror(errno));
	close(out);
	if (!r) {
		r = dirfd_rename_noreplace(dst_dfd, tmp, f->name);
		if (r)
			errmsg(err, errlen, r, "%s: %s", f->name,
			       r == -EEXIST ? "already there" : strerror(-r));
	}
	if (r)
		(void)dirfd_unlink(dst_dfd, tmp);
	return r;
}
