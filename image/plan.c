/* OCI image layouts and docker-archives, read into one plan (image/plan.h). */
#include "image/plan.h"

#include "common/errmsg.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/openat2.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#define MT_OCI_INDEX	"application/vnd.oci.image.index.v1+json"
#define MT_DOCKER_LIST	"application/vnd.docker.distribution.manifest.list.v2+json"
#define REF_ANNOTATION	"org.opencontainers.image.ref.name"
#define MAX_LAYER_BYTES (64ULL << 30)

int plan_open_beneath(int dfd, const char *path)
{
	struct open_how how = {
	    .flags = O_RDONLY | O_CLOEXEC | O_NOCTTY,
	    .resolve = RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS,
	};
	long fd = syscall(SYS_openat2, dfd, path, &how, sizeof(how));
	if (fd < 0)
		return -errno;
	struct stat s;
	if (fstat((int)fd, &s) < 0 || !S_ISREG(s.st_mode)) {
		close((int)fd);
		return -EINVAL;
	}
	return (int)fd;
}

/* A whole small file beneath dfd (at most `max` bytes) into *out (NUL-terminated). */
static int read_small(int dfd, const char *path, size_t max, char **out, size_t *len, char *err,
		      size_t errlen)
{
	int fd = plan_open_beneath(dfd, path);
	if (fd < 0)
		return errmsg(err, errlen, fd, "%s: %s", path,
			      fd == -EINVAL ? "not a regular file" : strerror(-fd));
	struct stat s;
	if (fstat(fd, &s) < 0 || (uint64_t)s.st_size > max) {
		close(fd);
		return errmsg(err, errlen, -EFBIG, "%s: larger than %zu bytes: refused", path, max);
	}
	char *buf = malloc((size_t)s.st_size + 1);
	size_t got = 0;
	while (buf && got < (size_t)s.st_size) {
		ssize_t n = read(fd, buf + got, (size_t)s.st_size - got);
		if (n <= 0)
			break;
		got += (size_t)n;
	}
	close(fd);
	if (!buf || got != (size_t)s.st_size) {
		free(buf);
		return errmsg(err, errlen, -EIO, "%s: cannot read it", path);
	}
	buf[got] = '\0';
	*out = buf;
	*len = got;
	return 0;
}

static int parse_json(const char *what, const char *buf, size_t len, json_t **out, char *err,
		      size_t errlen)
{
	json_error_t je;
	json_t *j = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &je);
	if (!j)
		return errmsg(err, errlen, -EINVAL, "%s: not JSON: %s (line %d)", what, je.text,
			      je.line);
	*out = j;
	return 0;
}

struct desc {
	char hex[DIGEST_HEX + 1];
	uint64_t size;
	const char *media;
};

static int desc_of(json_t *d, const char *what, struct desc *out, char *err, size_t errlen)
{
	json_t *dg = json_object_get(d, "digest"), *sz = json_object_get(d, "size");
	if (!json_is_object(d) || !json_is_string(dg) ||
	    digest_parse(json_string_value(dg), out->hex) != 0)
		return errmsg(err, errlen, -EINVAL, "%s: no sha256 digest in its descriptor", what);
	if (!json_is_integer(sz) || json_integer_value(sz) < 0 ||
	    (uint64_t)json_integer_value(sz) > MAX_LAYER_BYTES)
		return errmsg(err, errlen, -EINVAL, "%s: no usable size in its descriptor", what);
	out->size = (uint64_t)json_integer_value(sz);
	json_t *mt = json_object_get(d, "mediaType");
	out->media = json_is_string(mt) ? json_string_value(mt) : "";
	return 0;
}

/* A JSON blob (index, manifest or config) whose bytes must match its descriptor. */
static int read_blob_json(int dfd, const struct desc *d, const char *what, json_t **out, char *err,
			  size_t errlen)
{
	if (d->size > PLAN_MAX_JSON)
		return errmsg(err, errlen, -EFBIG, "%s: %llu bytes, more than %d: refused", what,
			      (unsigned long long)d->size, PLAN_MAX_JSON);
	char path[96], *buf, hex[DIGEST_HEX + 1];
	size_t len;
	snprintf(path, sizeof(path), "blobs/sha256/%s", d->hex);
	int r = read_small(dfd, path, PLAN_MAX_JSON, &buf, &len, err, errlen);
	if (r)
		return r;
	if (len != d->size || sha256_hex(buf, len, hex) != 0 || strcmp(hex, d->hex) != 0) {
		free(buf);
		return errmsg(
		    err, errlen, -EBADMSG,
		    "%s (sha256:%.12s...): its bytes do not match its descriptor: refused", what,
		    d->hex);
	}
	r = parse_json(what, buf, len, out, err, errlen);
	free(buf);
	return r;
}

static bool is_amd64_linux(json_t *d)
{
	json_t *pl = json_object_get(d, "platform");
	if (!json_is_object(pl))
		return false;
	const char *a = json_string_value(json_object_get(pl, "architecture"));
	const char *o = json_string_value(json_object_get(pl, "os"));
	return a && o && !strcmp(a, "amd64") && !strcmp(o, "linux");
}

static bool ref_matches(json_t *d, const char *want)
{
	const char *n =
	    json_string_value(json_object_get(json_object_get(d, "annotations"), REF_ANNOTATION));
	if (!n)
		return false;
	if (!strcmp(n, want))
		return true;
	/* "localhost/bb:latest" asked as "latest" or the other way round */
	size_t ln = strlen(n), lw = strlen(want);
	if (lw > ln && want[lw - ln - 1] == ':' && !strcmp(want + lw - ln, n))
		return true;
	return ln > lw && n[ln - lw - 1] == ':' && !strcmp(n + ln - lw, want);
}

/* The manifest descriptor an index names: by ref, the only one, or linux/amd64. */
static json_t *pick(json_t *ms, const char *want, const char *what, char *err, size_t errlen)
{
	size_t n = json_array_size(ms);
	if (!json_is_array(ms) || n == 0) {
		errmsg(err, errlen, -EINVAL, "%s lists no manifests", what);
		return NULL;
	}
	if (n > 1024) {
		errmsg(err, errlen, -E2BIG, "%s lists %zu manifests: refused", what, n);
		return NULL;
	}
	if (want && *want) {
		for (size_t i = 0; i < n; i++)
			if (ref_matches(json_array_get(ms, i), want))
				return json_array_get(ms, i);
		errmsg(err, errlen, -ENOENT, "%s has no image named '%.100s'", what, want);
		return NULL;
	}
	if (n == 1)
		return json_array_get(ms, 0);
	for (size_t i = 0; i < n; i++)
		if (is_amd64_linux(json_array_get(ms, i)))
			return json_array_get(ms, i);
	errmsg(err, errlen, -EINVAL, "%s holds %zu images and none for linux/amd64: name one", what,
	       n);
	return NULL;
}

static int plan_oci(int dfd, const char *want, struct image_plan *p, char *err, size_t errlen)
{
	char *buf;
	size_t len;
	json_t *index = NULL, *sub = NULL, *man = NULL;
	int r = read_small(dfd, "index.json", PLAN_MAX_JSON, &buf, &len, err, errlen);
	if (r)
		return r;
	r = parse_json("index.json", buf, len, &index, err, errlen);
	free(buf);
	if (r)
		return r;
	json_t *d = pick(json_object_get(index, "manifests"), want, "index.json", err, errlen);
	struct desc md;
	r = d ? desc_of(d, "the image's manifest", &md, err, errlen) : -EINVAL;
	const char *name = d ? json_string_value(json_object_get(json_object_get(d, "annotations"),
								 REF_ANNOTATION))
			     : NULL;
	if (name)
		snprintf(p->ref, sizeof(p->ref), "%s", name);
	/* A multi-platform image: one level of index more. */
	if (!r && (!strcmp(md.media, MT_OCI_INDEX) || !strcmp(md.media, MT_DOCKER_LIST))) {
		r = read_blob_json(dfd, &md, "the image's index", &sub, err, errlen);
		d = r ? NULL
		      : pick(json_object_get(sub, "manifests"), NULL, "the image's index", err,
			     errlen);
		if (!r)
			r = d ? desc_of(d, "the image's manifest", &md, err, errlen) : -EINVAL;
	}
	if (!r)
		r = read_blob_json(dfd, &md, "the image's manifest", &man, err, errlen);
	if (!r)
		memcpy(p->key, md.hex, sizeof(p->key));
	struct desc cd;
	if (!r)
		r = desc_of(json_object_get(man, "config"), "the image's config", &cd, err, errlen);
	if (!r)
		r = read_blob_json(dfd, &cd, "the image's config", &p->config, err, errlen);
	json_t *layers = man ? json_object_get(man, "layers") : NULL;
	if (!r && !json_is_array(layers))
		r = errmsg(err, errlen, -EINVAL, "the image's manifest has no layers list");
	if (!r && json_array_size(layers) > PLAN_MAX_LAYERS)
		r = errmsg(err, errlen, -E2BIG, "the image has %zu layers, more than %d: refused",
			   json_array_size(layers), PLAN_MAX_LAYERS);
	for (size_t i = 0; !r && i < json_array_size(layers); i++) {
		struct desc ld;
		char what[32];
		snprintf(what, sizeof(what), "layer %zu", i + 1);
		r = desc_of(json_array_get(layers, i), what, &ld, err, errlen);
		if (!r && (strstr(ld.media, "foreign") || strstr(ld.media, "nondistributable")) &&
		    faccessat(dfd, "blobs/sha256", F_OK, 0) != 0)
			r = errmsg(err, errlen, -ENOENT, "%s is a foreign layer, not here", what);
		if (r)
			break;
		struct plan_layer *l = &p->layers[p->nr_layers++];
		snprintf(l->path, sizeof(l->path), "blobs/sha256/%s", ld.hex);
		l->size = ld.size;
		memcpy(l->hex, ld.hex, sizeof(l->hex));
	}
	json_decref(index);
	json_decref(sub);
	json_decref(man);
	return r;
}

/* A path a docker manifest.json names (untrusted): relative, plain components, no "..". */
static bool docker_path_ok(const char *s)
{
	size_t n = strlen(s);
	if (n == 0 || n >= sizeof(((struct plan_layer *)0)->path) || s[0] == '/')
		return false;
	for (const char *c = s; *c; c++)
		if (!((*c >= 'a' && *c <= 'z') || (*c >= 'A' && *c <= 'Z') ||
		      (*c >= '0' && *c <= '9') || *c == '.' || *c == '_' || *c == '-' || *c == '/'))
			return false;
	return strstr(s, "..") == NULL && strstr(s, "//") == NULL;
}

static int plan_docker(int dfd, const char *want, struct image_plan *p, char *err, size_t errlen)
{
	char *buf;
	size_t len;
	json_t *mj = NULL;
	int r = read_small(dfd, "manifest.json", PLAN_MAX_JSON, &buf, &len, err, errlen);
	if (r)
		return r;
	r = parse_json("manifest.json", buf, len, &mj, err, errlen);
	free(buf);
	if (r)
		return r;
	json_t *img = NULL;
	size_t n = json_array_size(mj);
	for (size_t i = 0; i < n && !img; i++) {
		json_t *tags = json_object_get(json_array_get(mj, i), "RepoTags");
		for (size_t t = 0; want && *want && t < json_array_size(tags); t++) {
			const char *tag = json_string_value(json_array_get(tags, t));
			if (tag && !strcmp(tag, want))
				img = json_array_get(mj, i);
		}
	}
	if (!img && (!want || !*want) && n == 1)
		img = json_array_get(mj, 0);
	if (!img) {
		r = errmsg(err, errlen, -ENOENT,
			   n ? "manifest.json holds %zu images: name one of their RepoTags"
			     : "manifest.json holds no image",
			   n);
		if (want && *want && n)
			r = errmsg(err, errlen, -ENOENT,
				   "manifest.json has no image tagged '%.100s'", want);
		json_decref(mj);
		return r;
	}
	const char *tag = json_string_value(json_array_get(json_object_get(img, "RepoTags"), 0));
	if (tag)
		snprintf(p->ref, sizeof(p->ref), "%s", tag);
	const char *cpath = json_string_value(json_object_get(img, "Config"));
	json_t *layers = json_object_get(img, "Layers");
	if (!cpath || !docker_path_ok(cpath))
		r = errmsg(err, errlen, -EINVAL, "manifest.json: no usable Config path");
	else if (!json_is_array(layers) || json_array_size(layers) > PLAN_MAX_LAYERS)
		r = errmsg(err, errlen, -EINVAL,
			   "manifest.json: no Layers list, or more than %d layers",
			   PLAN_MAX_LAYERS);
	if (!r)
		r = read_small(dfd, cpath, PLAN_MAX_JSON, &buf, &len, err, errlen);
	if (!r) {
		r = sha256_hex(buf, len, p->key) ? -EIO : 0;
		if (!r)
			r = parse_json("the image's config", buf, len, &p->config, err, errlen);
		free(buf);
	}
	/* The layers' digests: the config's diff_ids (their uncompressed SHA-256). */
	json_t *ids =
	    p->config ? json_object_get(json_object_get(p->config, "rootfs"), "diff_ids") : NULL;
	if (!r && json_array_size(ids) != json_array_size(layers))
		r = errmsg(err, errlen, -EINVAL,
			   "the config lists %zu diff_ids for %zu layers: refused",
			   json_array_size(ids), json_array_size(layers));
	for (size_t i = 0; !r && i < json_array_size(layers); i++) {
		const char *lp = json_string_value(json_array_get(layers, i));
		struct plan_layer *l = &p->layers[p->nr_layers];
		if (!lp || !docker_path_ok(lp))
			r = errmsg(err, errlen, -EINVAL,
				   "manifest.json: layer %zu has no usable path", i + 1);
		else if (digest_parse(json_string_value(json_array_get(ids, i)), l->hex))
			r = errmsg(err, errlen, -EINVAL, "the config's diff_id %zu is not sha256",
				   i + 1);
		if (r)
			break;
		int fd = plan_open_beneath(dfd, lp);
		struct stat s;
		if (fd < 0 || fstat(fd, &s) < 0)
			r = errmsg(err, errlen, fd < 0 ? fd : -EIO, "layer %zu (%s): %s", i + 1, lp,
				   fd == -EINVAL ? "not a regular file"
						 : strerror(fd < 0 ? -fd : EIO));
		if (fd >= 0)
			close(fd);
		if (r)
			break;
		snprintf(l->path, sizeof(l->path), "%s", lp);
		l->size = (uint64_t)s.st_size;
		p->nr_layers++;
	}
	json_decref(mj);
	return r;
}

int plan_read(int dfd, const char *want, struct image_plan *p, char *err, size_t errlen)
{
	memset(p, 0, sizeof(*p));
	int r;
	if (faccessat(dfd, "index.json", F_OK, AT_SYMLINK_NOFOLLOW) == 0) {
		snprintf(p->kind, sizeof(p->kind), "oci");
		r = plan_oci(dfd, want, p, err, errlen);
	} else if (faccessat(dfd, "manifest.json", F_OK, AT_SYMLINK_NOFOLLOW) == 0) {
		snprintf(p->kind, sizeof(p->kind), "docker");
		r = plan_docker(dfd, want, p, err, errlen);
	} else {
		r = errmsg(err, errlen, -EINVAL,
			   "neither an OCI image layout (index.json) nor a docker-archive "
			   "(manifest.json)");
	}
	if (r)
		plan_free(p);
	return r;
}

void plan_free(struct image_plan *p)
{
	json_decref(p->config);
	p->config = NULL;
}
