/* image/ (issue 32): layers applied beneath the root (whiteouts, opaque directories, hard links,
 * symlinks kept and never followed, special files skipped) and every hostile layer refused with
 * one line: '..', absolute paths, writes through a symlink, a blob bigger than declared or with
 * another digest, a decompression bomb, too many entries. Then whole imports of an OCI layout
 * and a docker-archive directory into a real cache (mkfs.ext4), the second one a cache hit. */
#include "helpers.h"

#include <archive.h>
#include <archive_entry.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/sysmacros.h>
#include <time.h>

#include "image/cache.h"
#include "image/digest.h"
#include "image/image_config.h"
#include "image/import.h"
#include "image/plan.h"
#include "image/unpack.h"
#include "lifecycle/tree.h"

enum { F, D, L, H, C, P }; /* file, dir, symlink, hard link, char device, fifo */
struct ent {
	int type;
	const char *path;
	const char *data; /* file bytes, or the link's target */
	size_t zeros;	  /* F: this many zero bytes instead of data */
};

struct fx {
	char dir[64];
	int dfd, rootfd;
};

static int fx_setup(void **state)
{
	struct fx *f = calloc(1, sizeof(*f));
	snprintf(f->dir, sizeof(f->dir), "/tmp/cove-image-XXXXXX");
	assert_non_null(mkdtemp(f->dir));
	f->dfd = open(f->dir, O_RDONLY | O_DIRECTORY);
	assert_int_equal(mkdirat(f->dfd, "root", 0755), 0);
	assert_int_equal(mkdirat(f->dfd, "outside", 0755), 0);
	f->rootfd = openat(f->dfd, "root", O_RDONLY | O_DIRECTORY);
	assert_true(f->rootfd >= 0);
	*state = f;
	return 0;
}

static int fx_teardown(void **state)
{
	struct fx *f = *state;
	close(f->rootfd);
	close(f->dfd);
	int p = open("/tmp", O_RDONLY | O_DIRECTORY);
	sbx_tree_remove(p, f->dir + 5);
	close(p);
	free(f);
	return 0;
}

/* A tar (gzip when asked) of the entries, written to dfd/name; its size and digest. */
static void make_tar(int dfd, const char *name, const struct ent *e, size_t n, bool gzip,
		     uint64_t *size, char hex[DIGEST_HEX + 1])
{
	struct archive *a = archive_write_new();
	archive_write_set_format_pax_restricted(a);
	if (gzip)
		archive_write_add_filter_gzip(a);
	int fd = openat(dfd, name, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	assert_true(fd >= 0);
	assert_int_equal(archive_write_open_fd(a, fd), ARCHIVE_OK);
	for (size_t i = 0; i < n; i++) {
		struct archive_entry *ae = archive_entry_new();
		archive_entry_set_pathname(ae, e[i].path);
		archive_entry_set_uid(ae, 1000);
		archive_entry_set_gid(ae, 1000);
		size_t len = e[i].zeros ? e[i].zeros : e[i].data ? strlen(e[i].data) : 0;
		switch (e[i].type) {
		case F:
			archive_entry_set_filetype(ae, AE_IFREG);
			archive_entry_set_perm(ae, 0640);
			archive_entry_set_size(ae, (la_int64_t)len);
			break;
		case D:
			archive_entry_set_filetype(ae, AE_IFDIR);
			archive_entry_set_perm(ae, 0750);
			break;
		case L:
			archive_entry_set_filetype(ae, AE_IFLNK);
			archive_entry_set_perm(ae, 0777);
			archive_entry_set_symlink(ae, e[i].data);
			break;
		case H:
			archive_entry_set_filetype(ae, AE_IFREG);
			archive_entry_set_perm(ae, 0640);
			archive_entry_set_hardlink(ae, e[i].data);
			break;
		case C:
			archive_entry_set_filetype(ae, AE_IFCHR);
			archive_entry_set_perm(ae, 0600);
			archive_entry_set_rdev(ae, makedev(1, 3));
			break;
		case P:
			archive_entry_set_filetype(ae, AE_IFIFO);
			archive_entry_set_perm(ae, 0600);
			break;
		}
		assert_int_equal(archive_write_header(a, ae), ARCHIVE_OK);
		if (e[i].type == F && len) {
			char *buf = e[i].zeros ? calloc(1, len) : strdup(e[i].data);
			assert_int_equal(archive_write_data(a, buf, len), (la_ssize_t)len);
			free(buf);
		}
		archive_entry_free(ae);
	}
	archive_write_close(a);
	archive_write_free(a);
	close(fd);
	fd = openat(dfd, name, O_RDONLY);
	struct stat s;
	assert_int_equal(fstat(fd, &s), 0);
	char *buf = malloc((size_t)s.st_size + 1);
	assert_int_equal(pread(fd, buf, (size_t)s.st_size, 0), s.st_size);
	assert_int_equal(sha256_hex(buf, (size_t)s.st_size, hex), 0);
	free(buf);
	close(fd);
	*size = (uint64_t)s.st_size;
}

/* Applies the entries as one layer; the result of unpack_layer. */
static int apply(struct fx *f, const struct ent *e, size_t n, struct unpack_stats *st,
		 uint64_t max_bytes, char *err, size_t errlen)
{
	struct layer_src src = {.index = 1};
	make_tar(f->dfd, "layer.tar", e, n, false, &src.size, src.hex);
	src.fd = openat(f->dfd, "layer.tar", O_RDONLY);
	struct unpack_budget b = {.bytes_left = max_bytes, .entries_left = 1000};
	err[0] = '\0';
	int r = unpack_layer(f->rootfd, &src, &b, st, NULL, err, errlen);
	close(src.fd);
	return r;
}

#define N(a) (sizeof(a) / sizeof((a)[0]))

static void test_layer_plain(void **state)
{
	struct fx *f = *state;
	struct ent e[] = {
	    {D, "etc", NULL, 0},
	    {F, "./etc/passwd", "root:x:0:0::/root:/bin/sh\n", 0},
	    {L, "etc/evil", "/etc/shadow", 0},
	    {L, "up", "../../..", 0},
	    {H, "etc/pw2", "etc/passwd", 0},
	    {C, "dev/null", NULL, 0},
	    {P, "run/fifo", NULL, 0},
	    {F, "deep/a/b/c", "x", 0},
	};
	struct unpack_stats st = {0};
	char err[512], buf[64];
	assert_int_equal(apply(f, e, N(e), &st, 1 << 20, err, sizeof(err)), 0);
	struct stat a, b;
	assert_int_equal(fstatat(f->rootfd, "etc/passwd", &a, AT_SYMLINK_NOFOLLOW), 0);
	assert_int_equal(a.st_mode & 07777, 0640);
	assert_int_equal(a.st_uid, 1000);
	assert_int_equal(fstatat(f->rootfd, "etc/pw2", &b, AT_SYMLINK_NOFOLLOW), 0);
	assert_int_equal(a.st_ino, b.st_ino); /* a hard link */
	ssize_t n = readlinkat(f->rootfd, "etc/evil", buf, sizeof(buf));
	assert_int_equal(n, strlen("/etc/shadow")); /* kept as written, never followed */
	assert_memory_equal(buf, "/etc/shadow", (size_t)n);
	assert_int_equal(fstatat(f->rootfd, "dev/null", &a, AT_SYMLINK_NOFOLLOW), -1);
	assert_int_equal(fstatat(f->rootfd, "run/fifo", &a, AT_SYMLINK_NOFOLLOW), -1);
	assert_int_equal(st.special, 2);
	assert_int_equal(st.hardlinks, 1);
	assert_int_equal(st.symlinks, 2);
	assert_int_equal(fstatat(f->rootfd, "deep/a/b/c", &a, 0), 0);
}

static void test_whiteouts(void **state)
{
	struct fx *f = *state;
	struct ent l1[] = {{F, "a/x", "1", 0},
			   {F, "a/y", "2", 0},
			   {F, "b/z", "3", 0},
			   {F, "c", "4", 0},
			   {F, "d/k", "5", 0}};
	/* The opaque marker after the layer's own a/new: it hides only the layers below. */
	struct ent l2[] = {{F, "a/new", "6", 0}, {F, "a/.wh..wh..opq", "", 0},
			   {F, ".wh.c", "", 0},	 {F, "b/.wh.z", "", 0},
			   {F, ".wh.d", "", 0},	 {F, "d", "now a file", 0}};
	struct unpack_stats st = {0};
	char err[512];
	assert_int_equal(apply(f, l1, N(l1), &st, 1 << 20, err, sizeof(err)), 0);
	assert_int_equal(apply(f, l2, N(l2), &st, 1 << 20, err, sizeof(err)), 0);
	struct stat s;
	assert_int_equal(fstatat(f->rootfd, "a/new", &s, 0), 0);
	assert_int_equal(fstatat(f->rootfd, "a/x", &s, 0), -1);
	assert_int_equal(fstatat(f->rootfd, "a/y", &s, 0), -1);
	assert_int_equal(fstatat(f->rootfd, "a/.wh..wh..opq", &s, 0), -1);
	assert_int_equal(fstatat(f->rootfd, "b", &s, 0), 0);
	assert_int_equal(fstatat(f->rootfd, "b/z", &s, 0), -1);
	assert_int_equal(fstatat(f->rootfd, "c", &s, 0), -1);
	assert_int_equal(fstatat(f->rootfd, "d", &s, 0), 0);
	assert_true(S_ISREG(s.st_mode));
	assert_int_equal(st.opaque, 1);
	assert_int_equal(st.whiteouts, 3);
}

static void test_hostile_paths(void **state)
{
	struct fx *f = *state;
	struct unpack_stats st = {0};
	char err[512];
	struct ent up[] = {{F, "ok", "1", 0}, {F, "a/../../outside/pwned", "x", 0}};
	assert_int_equal(apply(f, up, N(up), &st, 1 << 20, err, sizeof(err)), -EINVAL);
	assert_one_line_error(err, "'..'");
	struct ent abs[] = {{F, "/outside/pwned", "x", 0}};
	assert_int_equal(apply(f, abs, N(abs), &st, 1 << 20, err, sizeof(err)), -EINVAL);
	assert_one_line_error(err, "absolute");
	/* A symlink, then an entry through it: relative out of the root, and absolute. */
	struct ent through[] = {{L, "lnk", "../outside", 0}, {F, "lnk/pwned", "x", 0}};
	assert_int_equal(apply(f, through, N(through), &st, 1 << 20, err, sizeof(err)), -ELOOP);
	assert_one_line_error(err, "symlink");
	char abs_out[128];
	snprintf(abs_out, sizeof(abs_out), "%s/outside", f->dir);
	struct ent through2[] = {{L, "lnk2", abs_out, 0}, {D, "lnk2/sub", NULL, 0}};
	assert_int_equal(apply(f, through2, N(through2), &st, 1 << 20, err, sizeof(err)), -ELOOP);
	/* A whiteout through a symlink, and a hard link out of the root. */
	struct ent wh[] = {{F, "lnk/.wh.keep", "", 0}};
	assert_int_equal(apply(f, wh, N(wh), &st, 1 << 20, err, sizeof(err)), -ELOOP);
	struct ent hl[] = {{H, "h", "../outside/keep", 0}};
	assert_int_equal(apply(f, hl, N(hl), &st, 1 << 20, err, sizeof(err)), -EINVAL);
	struct ent hl2[] = {{H, "h", "lnk/keep", 0}};
	assert_int_equal(apply(f, hl2, N(hl2), &st, 1 << 20, err, sizeof(err)), -ELOOP);
	/* Nothing was written outside the root. */
	struct stat s;
	assert_int_equal(fstatat(f->dfd, "outside/pwned", &s, 0), -1);
	assert_int_equal(fstatat(f->dfd, "outside/sub", &s, 0), -1);
	assert_int_equal(fstatat(f->dfd, "pwned", &s, 0), -1);
}

static void test_hostile_blobs(void **state)
{
	struct fx *f = *state;
	struct ent e[] = {{F, "a", "hello", 0}};
	struct layer_src src = {.index = 2};
	make_tar(f->dfd, "l.tar", e, N(e), false, &src.size, src.hex);
	src.fd = openat(f->dfd, "l.tar", O_RDONLY);
	struct unpack_budget b = {.bytes_left = 1 << 20, .entries_left = 100};
	struct unpack_stats st = {0};
	char err[512];
	/* The blob holds more bytes than its descriptor says. */
	src.size -= 1;
	assert_int_equal(unpack_layer(f->rootfd, &src, &b, &st, NULL, err, sizeof(err)), -EFBIG);
	assert_one_line_error(err, "bigger than its declared");
	src.size += 1;
	/* Another digest. */
	char good = src.hex[0];
	src.hex[0] = good == '0' ? '1' : '0';
	assert_int_equal(unpack_layer(f->rootfd, &src, &b, &st, NULL, err, sizeof(err)), -EBADMSG);
	assert_one_line_error(err, "digest");
	src.hex[0] = good;
	close(src.fd);
	/* A decompression bomb: 64 MiB of zeros in a small gzip layer, a 16 MiB cap. */
	struct ent bomb[] = {{F, "zeros", NULL, 64 << 20}};
	make_tar(f->dfd, "bomb.tgz", bomb, 1, true, &src.size, src.hex);
	assert_true(src.size < (1 << 20));
	src.fd = openat(f->dfd, "bomb.tgz", O_RDONLY);
	b.bytes_left = 16 << 20;
	assert_int_equal(unpack_layer(f->rootfd, &src, &b, &st, NULL, err, sizeof(err)), -EFBIG);
	assert_one_line_error(err, "decompression bomb");
	close(src.fd);
	/* Too many entries. */
	struct ent many[] = {{F, "1", "", 0}, {F, "2", "", 0}, {F, "3", "", 0}, {F, "4", "", 0}};
	make_tar(f->dfd, "many.tar", many, N(many), false, &src.size, src.hex);
	src.fd = openat(f->dfd, "many.tar", O_RDONLY);
	b = (struct unpack_budget){.bytes_left = 1 << 20, .entries_left = 3};
	assert_int_equal(unpack_layer(f->rootfd, &src, &b, &st, NULL, err, sizeof(err)), -E2BIG);
	assert_one_line_error(err, "entries");
	close(src.fd);
	/* Not a tar at all. */
	int fd = openat(f->dfd, "junk", O_RDWR | O_CREAT, 0600);
	assert_int_equal(write(fd, "\x1f\x8bjunkjunk", 10), 10);
	src = (struct layer_src){.fd = fd, .size = 10, .index = 3};
	assert_int_equal(sha256_hex("\x1f\x8bjunkjunk", 10, src.hex), 0);
	b = (struct unpack_budget){.bytes_left = 1 << 20, .entries_left = 3};
	assert_true(unpack_layer(f->rootfd, &src, &b, &st, NULL, err, sizeof(err)) < 0);
	assert_one_line_error(err, "layer 3");
	close(fd);
}

static void test_config_take(void **state)
{
	(void)state;
	char err[512];
	json_t *out = NULL;
	json_t *c = json_loads("{\"architecture\":\"amd64\",\"os\":\"linux\",\"config\":{"
			       "\"Env\":[\"PATH=/bin\",\"A=b=c\"],\"Cmd\":[\"/bin/sh\"],"
			       "\"WorkingDir\":\"/srv\",\"User\":\"app:app\"}}",
			       0, NULL);
	assert_int_equal(image_config_take(c, &out, err, sizeof(err)), 0);
	assert_string_equal(json_string_value(json_object_get(out, "User")), "app:app");
	assert_int_equal(json_array_size(json_object_get(out, "Entrypoint")), 0);
	assert_int_equal(json_array_size(json_object_get(out, "Env")), 2);
	json_decref(out);
	json_decref(c);
	static const char *const bad[] = {
	    "{\"architecture\":\"arm64\"}",
	    "{\"os\":\"windows\"}",
	    "{\"config\":{\"Env\":[\"NOEQUALS\"]}}",
	    "{\"config\":{\"Env\":\"PATH=/bin\"}}",
	    "{\"config\":{\"WorkingDir\":\"relative\"}}",
	    "{\"config\":{\"User\":\"a;rm -rf\"}}",
	    "{\"config\":{\"Cmd\":[1]}}",
	    "[]",
	};
	for (size_t i = 0; i < N(bad); i++) {
		c = json_loads(bad[i], 0, NULL);
		err[0] = '\0';
		assert_int_equal(image_config_take(c, &out, err, sizeof(err)), -EINVAL);
		assert_one_line_error(err, NULL);
		json_decref(c);
	}
}

static void put_blob(int dfd, const char *text, char hex[DIGEST_HEX + 1])
{
	assert_int_equal(sha256_hex(text, strlen(text), hex), 0);
	char path[128];
	snprintf(path, sizeof(path), "blobs/sha256/%s", hex);
	int fd = openat(dfd, path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	close(fd);
}

/* An OCI layout in dir/name with one gzip layer; `lie` shrinks the layer's declared size. */
static void make_layout(struct fx *f, const char *name, const struct ent *e, size_t n, int lie)
{
	int lfd;
	assert_int_equal(mkdirat(f->dfd, name, 0755), 0);
	lfd = openat(f->dfd, name, O_RDONLY | O_DIRECTORY);
	assert_int_equal(mkdirat(lfd, "blobs", 0755), 0);
	assert_int_equal(mkdirat(lfd, "blobs/sha256", 0755), 0);
	uint64_t lsize;
	char lhex[DIGEST_HEX + 1], chex[DIGEST_HEX + 1], mhex[DIGEST_HEX + 1], text[2048];
	make_tar(lfd, "layer.tgz", e, n, true, &lsize, lhex);
	char lpath[128];
	snprintf(lpath, sizeof(lpath), "blobs/sha256/%s", lhex);
	assert_int_equal(renameat(lfd, "layer.tgz", lfd, lpath), 0);
	const char *cfg = "{\"architecture\":\"amd64\",\"os\":\"linux\",\"config\":{\"Env\":"
			  "[\"PATH=/bin\"],\"Cmd\":[\"/bin/sh\"],\"WorkingDir\":\"/tmp\"},"
			  "\"rootfs\":{\"type\":\"layers\",\"diff_ids\":[]}}";
	put_blob(lfd, cfg, chex);
	snprintf(
	    text, sizeof(text),
	    "{\"schemaVersion\":2,\"mediaType\":\"application/vnd.oci.image.manifest.v1+json\","
	    "\"config\":{\"mediaType\":\"application/vnd.oci.image.config.v1+json\","
	    "\"digest\":\"sha256:%s\",\"size\":%zu},\"layers\":[{\"mediaType\":"
	    "\"application/vnd.oci.image.layer.v1.tar+gzip\",\"digest\":\"sha256:%s\","
	    "\"size\":%llu}]}",
	    chex, strlen(cfg), lhex, (unsigned long long)(lsize - (uint64_t)lie));
	put_blob(lfd, text, mhex);
	snprintf(text, sizeof(text),
		 "{\"schemaVersion\":2,\"manifests\":[{\"mediaType\":"
		 "\"application/vnd.oci.image.manifest.v1+json\",\"digest\":\"sha256:%s\",\"size\":"
		 "%zu,\"annotations\":{\"org.opencontainers.image.ref.name\":\"t1\"}}]}",
		 mhex, strlen(text));
	int fd = openat(lfd, "index.json", O_WRONLY | O_CREAT | O_TRUNC, 0644);
	assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	close(fd);
	close(lfd);
}

static void test_import_oci(void **state)
{
	struct fx *f = *state;
	if (geteuid() != 0) {
		skip(); /* an import writes files owned by the image's users: root only */
		return;
	}
	struct ent e[] = {{F, "bin/tool", "#!/bin/sh\necho hi\n", 0},
			  {L, "bin/sh", "/bin/busybox", 0}};
	make_layout(f, "lay", e, N(e), 0);
	make_layout(f, "liar", e, N(e), 7);
	assert_int_equal(mkdirat(f->dfd, "cache", 0700), 0);
	int cfd = openat(f->dfd, "cache", O_RDONLY | O_DIRECTORY);
	char src[128], err[768];
	snprintf(src, sizeof(src), "%s/lay", f->dir);
	struct import_opts o = {.source = src, .max_bytes = 1 << 30, .free_bytes = 0};
	struct import_result res;
	assert_int_equal(image_import(cfd, &o, &res, NULL, err, sizeof(err)), 0);
	assert_false(res.cached);
	assert_string_equal(res.name, "lay:t1"); /* a bare tag goes after the file name */
	assert_int_equal(res.layers, 1);
	char path[160], hex[DIGEST_HEX + 1];
	snprintf(path, sizeof(path), "%s/%s", res.hex, IMAGE_EXT4);
	struct stat s;
	assert_int_equal(fstatat(cfd, path, &s, 0), 0);
	assert_true(s.st_size >= (64 << 20));
	assert_true((uint64_t)s.st_blocks * 512 < (uint64_t)s.st_size / 4); /* sparse */
	/* The second import of the same image is a cache hit; names resolve. */
	o.name = "again";
	assert_int_equal(image_import(cfd, &o, &res, NULL, err, sizeof(err)), 0);
	assert_true(res.cached);
	assert_int_equal(image_resolve(cfd, "again", hex, err, sizeof(err)), 0);
	assert_string_equal(hex, res.hex);
	assert_int_equal(image_resolve(cfd, "lay:t1", hex, err, sizeof(err)), 0);
	char pre[16];
	snprintf(pre, sizeof(pre), "%.12s", res.hex);
	assert_int_equal(image_resolve(cfd, pre, hex, err, sizeof(err)), 0);
	assert_int_equal(image_resolve(cfd, "nope", hex, err, sizeof(err)), -ENOENT);
	json_t *m;
	assert_int_equal(image_meta_read(cfd, res.hex, &m, err, sizeof(err)), 0);
	assert_string_equal(
	    json_string_value(json_object_get(json_object_get(m, "config"), "WorkingDir")), "/tmp");
	json_decref(m);
	/* A work directory an import left an hour ago goes at the next import; a fresh one (an
	 * import still running) stays. */
	assert_int_equal(mkdirat(cfd, ".import-0000dead", 0700), 0);
	assert_int_equal(mkdirat(cfd, ".import-0000dead/root", 0700), 0);
	assert_int_equal(mkdirat(cfd, ".import-0000live", 0700), 0);
	struct timespec old[2] = {{.tv_sec = time(NULL) - 7200}, {.tv_sec = time(NULL) - 7200}};
	assert_int_equal(utimensat(cfd, ".import-0000dead", old, AT_SYMLINK_NOFOLLOW), 0);
	assert_int_equal(image_import(cfd, &o, &res, NULL, err, sizeof(err)), 0);
	assert_int_equal(fstatat(cfd, ".import-0000dead", &s, 0), -1);
	assert_int_equal(fstatat(cfd, ".import-0000live", &s, 0), 0);
	/* A layer that is bigger than its descriptor: refused, nothing kept. */
	snprintf(src, sizeof(src), "oci:%s/liar", f->dir);
	o.name = "liar";
	assert_int_equal(image_import(cfd, &o, &res, NULL, err, sizeof(err)), -EFBIG);
	assert_one_line_error(err, "bigger than its declared");
	assert_int_equal(image_resolve(cfd, "liar", hex, err, sizeof(err)), -ENOENT);
	close(cfd);
}

static void test_docker_dir(void **state)
{
	struct fx *f = *state;
	struct ent e[] = {{F, "hello", "world", 0}};
	assert_int_equal(mkdirat(f->dfd, "dk", 0755), 0);
	int dfd = openat(f->dfd, "dk", O_RDONLY | O_DIRECTORY);
	uint64_t size;
	char hex[DIGEST_HEX + 1], text[1024];
	make_tar(dfd, "layer.tar", e, N(e), false, &size, hex);
	for (int wrong = 0; wrong < 2; wrong++) {
		snprintf(text, sizeof(text),
			 "{\"architecture\":\"amd64\",\"os\":\"linux\",\"config\":{},\"rootfs\":{"
			 "\"type\":\"layers\",\"diff_ids\":[\"sha256:%s\"]}}",
			 hex);
		if (wrong)
			text[strlen(text) - 6] = text[strlen(text) - 6] == '0' ? '1' : '0';
		int fd = openat(dfd, "cfg.json", O_WRONLY | O_CREAT | O_TRUNC, 0644);
		assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
		close(fd);
		const char *man = "[{\"Config\":\"cfg.json\",\"RepoTags\":[\"localhost/dk:1\"],"
				  "\"Layers\":[\"layer.tar\"]}]";
		fd = openat(dfd, "manifest.json", O_WRONLY | O_CREAT | O_TRUNC, 0644);
		assert_int_equal(write(fd, man, strlen(man)), (ssize_t)strlen(man));
		close(fd);
		struct image_plan p;
		char err[512];
		assert_int_equal(plan_read(dfd, NULL, &p, err, sizeof(err)), 0);
		assert_string_equal(p.kind, "docker");
		assert_string_equal(p.ref, "localhost/dk:1");
		assert_int_equal(p.nr_layers, 1);
		assert_int_equal(p.layers[0].size, size);
		struct layer_src src = {.size = p.layers[0].size, .index = 1};
		memcpy(src.hex, p.layers[0].hex, sizeof(src.hex));
		src.fd = plan_open_beneath(dfd, p.layers[0].path);
		struct unpack_budget b = {.bytes_left = 1 << 20, .entries_left = 10};
		struct unpack_stats st = {0};
		int r = unpack_layer(f->rootfd, &src, &b, &st, NULL, err, sizeof(err));
		close(src.fd);
		assert_int_equal(r, wrong ? -EBADMSG : 0);
		plan_free(&p);
	}
	/* Paths in manifest.json that leave the directory, and a link as a layer. */
	static const char *const bad[] = {
	    "[{\"Config\":\"../cfg.json\",\"Layers\":[]}]",
	    "[{\"Config\":\"/etc/passwd\",\"Layers\":[]}]",
	    "[{\"Config\":\"cfg.json\",\"Layers\":[\"../x\"]}]",
	    "[{\"Config\":\"cfg.json\",\"Layers\":[\"lnk\"]}]",
	};
	assert_int_equal(symlinkat("layer.tar", dfd, "lnk"), 0);
	for (size_t i = 0; i < N(bad); i++) {
		int fd = openat(dfd, "manifest.json", O_WRONLY | O_CREAT | O_TRUNC, 0644);
		assert_int_equal(write(fd, bad[i], strlen(bad[i])), (ssize_t)strlen(bad[i]));
		close(fd);
		struct image_plan p;
		char err[512] = "";
		assert_true(plan_read(dfd, NULL, &p, err, sizeof(err)) < 0);
		assert_one_line_error(err, NULL);
	}
	close(dfd);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_layer_plain, fx_setup, fx_teardown),
	    cmocka_unit_test_setup_teardown(test_whiteouts, fx_setup, fx_teardown),
	    cmocka_unit_test_setup_teardown(test_hostile_paths, fx_setup, fx_teardown),
	    cmocka_unit_test_setup_teardown(test_hostile_blobs, fx_setup, fx_teardown),
	    cmocka_unit_test(test_config_take),
	    cmocka_unit_test_setup_teardown(test_import_oci, fx_setup, fx_teardown),
	    cmocka_unit_test_setup_teardown(test_docker_dir, fx_setup, fx_teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
