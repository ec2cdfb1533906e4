/* A snapshot chain directory: chain.json lists the layers (full base, then increments) and is the commit point. */
#include "snapshot/chain.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "common/dirfd_io.h"
#include "common/errmsg.h"
#include "common/fd_io.h"
#include "common/file_io.h"

void chain_id_hex(const uint8_t id[16], char out[33])
{
	for (int i = 0; i < 16; i++)
		snprintf(out + 2 * i, 3, "%02x", id[i]);
}

static int unhex(const char *s, uint8_t out[16])
{
	if (strlen(s) != 32)
		return -EINVAL;
	for (int i = 0; i < 32; i++)
		if (!isxdigit((unsigned char)s[i]))
			return -EINVAL;
	for (int i = 0; i < 16; i++) {
		unsigned v;
		if (sscanf(s + 2 * i, "%2x", &v) != 1)
			return -EINVAL;
		out[i] = (uint8_t)v;
	}
	return 0;
}

/* A file name inside the chain directory (dirfd_io.h), short enough for struct chain_layer. */
static bool plain_name(const char *s)
{
	return strlen(s) < CHAIN_NAME_MAX && dirfd_plain_name(s);
}

static int get_u64(json_t *o, const char *key, uint64_t *out)
{
	json_t *v = json_object_get(o, key);
	if (!json_is_integer(v) || json_integer_value(v) < 0)
		return -EINVAL;
	*out = (uint64_t)json_integer_value(v);
	return 0;
}

static int get_name(json_t *o, const char *key, char out[CHAIN_NAME_MAX])
{
	json_t *v = json_object_get(o, key);
	if (!json_is_string(v) || !plain_name(json_string_value(v)))
		return -EINVAL;
	snprintf(out, CHAIN_NAME_MAX, "%s", json_string_value(v));
	return 0;
}

int chain_parse(const char *text, size_t len, struct chain *c, char *err, size_t errlen)
{
	json_error_t je;
	json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
	if (!root)
		return errmsg(err, errlen, -EINVAL, "chain.json is not valid JSON (line %d: %s)",
			      je.line, je.text);
	int r = -EINVAL;
	json_t *fmt = json_object_get(root, "format");
	json_t *layers = json_object_get(root, "layers");
	json_t *id = json_object_get(root, "chain_id");
	uint64_t version;
	if (!json_is_string(fmt) || strcmp(json_string_value(fmt), "cove-chain") ||
	    get_u64(root, "version", &version)) {
		errmsg(err, errlen, -EINVAL, "chain.json is not a cove chain file");
		goto out;
	}
	if (version != 1) {
		errmsg(err, errlen, -EINVAL, "chain.json version %llu is not supported",
		       (unsigned long long)version);
		goto out;
	}
	if (!json_is_string(id) || unhex(json_string_value(id), c->chain_id) ||
	    get_u64(root, "ram_size", &c->ram_size) || !json_is_array(layers) ||
	    c->ram_size == 0 || c->ram_size % 4096 || c->ram_size > (1ULL << 40)) {
		errmsg(err, errlen, -EINVAL, "chain.json: chain_id, ram_size or layers is missing or bad");
		goto out;
	}
	if (json_array_size(layers) > CHAIN_MAX_LAYERS) {
		errmsg(err, errlen, -EINVAL, "chain.json has more than %d layers", CHAIN_MAX_LAYERS);
		goto out;
	}
	c->nr_layers = 0;
	size_t i;
	json_t *l;
	json_array_foreach(layers, i, l)
	{
		struct chain_layer *cl = &c->layers[c->nr_layers];
		memset(cl, 0, sizeof(*cl));
		json_t *full = json_object_get(l, "full");
		if (!json_is_object(l) || get_u64(l, "id", &cl->id) ||
		    get_u64(l, "parent", &cl->parent) || !json_is_boolean(full) ||
		    get_name(l, "mem", cl->mem) || get_name(l, "state", cl->state) ||
		    get_u64(l, "present", &cl->present) || get_u64(l, "stored", &cl->stored) ||
		    get_u64(l, "created_ns", &cl->created_ns)) {
			errmsg(err, errlen, -EINVAL, "chain.json: layer %zu is malformed", i);
			goto out;
		}
		cl->full = json_is_true(full);
		if (cl->stored > cl->present) {
			errmsg(err, errlen, -EINVAL, "chain.json: layer %zu stores more pages than it holds", i);
			goto out;
		}
		/* Layer 0 is a full one; each later layer names the one before as its parent. */
		bool ok = c->nr_layers == 0 ? cl->full
					    : (!cl->full && cl->parent == c->layers[c->nr_layers - 1].id &&
					       cl->id > cl->parent);
		if (!ok || cl->id == 0) {
			errmsg(err, errlen, -EINVAL, "chain.json: layer %zu does not follow layer %zu", i,
			       i ? i - 1 : 0);
			goto out;
		}
		c->nr_layers++;
	}
	r = 0;
out:
	json_decref(root);
	return r;
}

int chain_load(const char *dir, struct chain *c, char *err, size_t errlen)
{
	memset(c, 0, sizeof(*c));
	if (snprintf(c->dir, sizeof(c->dir), "%s", dir) >= (int)sizeof(c->dir))
		return errmsg(err, errlen, -ENAMETOOLONG, "chain directory name is too long");
	char path[4200];
	snprintf(path, sizeof(path), "%s/%s", dir, CHAIN_FILE);
	int fd = open(path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0) {
		int e = errno;
		return errmsg(err, errlen, -e, "cannot open %s: %s", path, strerror(e));
	}
	char *buf = malloc(CHAIN_MAX_BYTES + 1);
	if (!buf) {
		close(fd);
		return -ENOMEM;
	}
	ssize_t n = read_upto(fd, buf, CHAIN_MAX_BYTES + 1);
	size_t got = n < 0 ? 0 : (size_t)n;
	int r = n < 0 ? (int)n : 0;
	close(fd);
	if (r)
		r = errmsg(err, errlen, r, "cannot read %s: %s", path, strerror(-r));
	else if (got > CHAIN_MAX_BYTES)
		r = errmsg(err, errlen, -EFBIG, "%s is larger than %u bytes", path, CHAIN_MAX_BYTES);
	else
		r = chain_parse(buf, got, c, err, errlen);
	free(buf);
	return r;
}

const struct chain_layer *chain_latest(const struct chain *c)
{
	return c->nr_layers ? &c->layers[c->nr_layers - 1] : NULL;
}

int chain_commit(const struct chain *c, char *err, size_t errlen)
{
	char hex[33];
	chain_id_hex(c->chain_id, hex);
	json_t *layers = json_array();
	for (int i = 0; i < c->nr_layers; i++) {
		const struct chain_layer *l = &c->layers[i];
		json_array_append_new(
			layers, json_pack("{s:I,s:I,s:b,s:s,s:s,s:I,s:I,s:I}", "id", (json_int_t)l->id,
					  "parent", (json_int_t)l->parent, "full", l->full, "mem",
					  l->mem, "state", l->state, "present", (json_int_t)l->present,
					  "stored", (json_int_t)l->stored, "created_ns",
					  (json_int_t)l->created_ns));
	}
	json_t *root = json_pack("{s:s,s:i,s:s,s:I,s:o}", "format", "cove-chain", "version", 1,
				 "chain_id", hex, "ram_size", (json_int_t)c->ram_size, "layers",
				 layers);
	char *text = root ? json_dumps(root, JSON_INDENT(1)) : NULL;
	json_decref(root);
	if (!text)
		return -ENOMEM;
	static const char tmp[] = "." CHAIN_FILE ".tmp";
	int dfd = dirfd_open_dir(c->dir, false, err, errlen);
	if (dfd < 0) {
		free(text);
		return dfd;
	}
	int r = 0;
	int fd = dirfd_create(dfd, tmp, O_WRONLY, 0600);
	if (fd < 0) {
		r = errmsg(err, errlen, fd, "cannot write %s/%s: %s", c->dir, tmp, strerror(-fd));
		goto out;
	}
	r = pwrite_full(fd, text, strlen(text), 0);
	if (r)
		errmsg(err, errlen, r, "writing %s/%s: %s", c->dir, tmp, strerror(-r));
	if (!r && fsync(fd) < 0)
		r = errmsg(err, errlen, -errno, "fsync %s/%s: %s", c->dir, tmp, strerror(errno));
	close(fd);
	if (!r && (r = dirfd_rename(dfd, tmp, CHAIN_FILE)))
		errmsg(err, errlen, r, "rename %s/%s: %s", c->dir, CHAIN_FILE, strerror(-r));
	if (r)
		(void)dirfd_unlink(dfd, tmp);
	else
		(void)dirfd_sync(dfd);
out:
	close(dfd);
	free(text);
	return r;
}
