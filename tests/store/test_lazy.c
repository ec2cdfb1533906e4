/* Lazy restore from a real Ceph radosgw (issue 29): a memory layer's blob and chunk list in the
 * store; a pull that places only its header chunk; the fetcher that brings the rest while a
 * "VMM" (a child on the gate's socket) asks for a chunk first; the file equal byte for byte and
 * the record gone; a chunk list that does not give the blob's digest refused; a blob altered in
 * the store never written into the file (the fetch fails, the record stays). */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/file_io.h"
#include "common/log.h"
#include "lifecycle/lazy_files.h"
#include "lifecycle/store/blob.h"
#include "lifecycle/store/lazy_blob.h"
#include "lifecycle/store/lazy_fetch.h"
#include "lifecycle/store/manifest.h"
#include "lifecycle/store/store_config.h"
#include "lifecycle/store/sync.h"
#include "snapshot/lazy_gate.h"

#define MiB	  (1ull << 20)
#define FILE_SIZE (5 * MiB + 512 * 1024)

struct fx {
	struct store_config cfg;
	struct s3_client *c;
	char dir[64]; /* the sandbox directory: chain/ inside */
	int sdfd, cdfd;
	uint8_t *orig; /* FILE_SIZE bytes */
	struct store_file f;
	struct logger log;
	char err[512];
};

/* Data runs crossing chunk boundaries, a zero chunk, a short last chunk. */
static const struct {
	uint64_t off, len;
} runs[] = {{0, 8192}, {MiB + 100, 300 * 1024}, {3 * MiB - 4096, 8192}, {5 * MiB, 512 * 1024}};

static void make_file(struct fx *f, const char *path)
{
	f->orig = calloc(1, FILE_SIZE);
	assert_non_null(f->orig);
	int fd = open(path, O_CREAT | O_TRUNC | O_RDWR, 0600);
	assert_true(fd >= 0);
	assert_int_equal(ftruncate(fd, FILE_SIZE), 0);
	for (size_t i = 0; i < sizeof(runs) / sizeof(runs[0]); i++) {
		assert_int_equal(getrandom(f->orig + runs[i].off, runs[i].len, 0),
				 (ssize_t)runs[i].len);
		assert_int_equal(
		    pwrite_full(fd, f->orig + runs[i].off, runs[i].len, (off_t)runs[i].off), 0);
	}
	close(fd);
}

/* Packs path and stores blob + chunk list; `flip`: one byte of the blob's data altered. */
static void store_it(struct fx *f, const char *path, const char *name, bool bad_list, bool flip)
{
	int in = open(path, O_RDONLY), out = open("/tmp", O_TMPFILE | O_RDWR, 0600);
	assert_true(in >= 0 && out >= 0);
	uint64_t blen = 0;
	uint8_t *chunks = NULL;
	assert_int_equal(
	    store_blob_pack(in, out, f->f.digest, &blen, &chunks, f->err, sizeof(f->err)), 0);
	snprintf(f->f.name, sizeof(f->f.name), "%s", name);
	f->f.size = FILE_SIZE;
	if (flip) { /* a byte of run 2 (chunk 1): after the header, the map and run 1's bytes */
		uint8_t b;
		off_t at = STORE_BLOB_HDR + 16 * 4 + 8192 + 10;
		assert_int_equal(pread_full(out, &b, 1, at), 0);
		b ^= 0x40;
		assert_int_equal(pwrite_full(out, &b, 1, at), 0);
	}
	char key[S3_KEY_MAX];
	store_blob_key(f->f.digest, key, sizeof(key));
	if (s3_put_fd(f->c, key, out, 0, blen, 0, f->err, sizeof(f->err)))
		fail_msg("put blob: %s", f->err);
	if (bad_list)
		memset(chunks, 0x5a, DIGEST_LEN);
	store_chunks_key(f->f.digest, key, sizeof(key));
	if (s3_put(f->c, key, chunks, digest_chunks_of(FILE_SIZE) * DIGEST_LEN, 0, f->err,
		   sizeof(f->err)))
		fail_msg("put chunks: %s", f->err);
	free(chunks);
	close(in);
	close(out);
}

static int setup(void **state)
{
	struct fx *f = calloc(1, sizeof(*f));
	assert_non_null(f);
	f->log = (struct logger){.level = LOG_INFO, .out = stderr, .name = "test_lazy"};
	if (store_config_load(NULL, &f->cfg, f->err, sizeof(f->err)) ||
	    s3_client_new(&f->cfg, &(struct s3_opts){0}, &f->c, f->err, sizeof(f->err)))
		fail_msg("store: %s", f->err);
	snprintf(f->dir, sizeof(f->dir), "/tmp/cove-lazy-XXXXXX");
	assert_non_null(mkdtemp(f->dir));
	f->sdfd = open(f->dir, O_RDONLY | O_DIRECTORY);
	assert_int_equal(mkdirat(f->sdfd, "chain", 0700), 0);
	f->cdfd = openat(f->sdfd, "chain", O_RDONLY | O_DIRECTORY);
	assert_true(f->sdfd >= 0 && f->cdfd >= 0);
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fx *f = *state;
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", f->dir);
	assert_int_equal(system(cmd), 0);
	close(f->cdfd);
	close(f->sdfd);
	s3_client_free(f->c);
	store_config_wipe(&f->cfg);
	free(f->orig);
	free(f);
	return 0;
}

/* The pull's part: the header chunk placed, the record written. */
static struct sbx_lazy *place(struct fx *f)
{
	struct sbx_lazy *lz = calloc(1, sizeof(*lz));
	uint64_t got = 0;
	if (lazy_blob_place(f->c, &f->f, f->cdfd, lz, &got, f->err, sizeof(f->err)))
		fail_msg("place: %s", f->err);
	assert_int_equal(lz->n, 1);
	assert_int_equal(got, 8192); /* only chunk 0's data came */
	lz->generation = 1;
	assert_int_equal(sbx_lazy_save(f->sdfd, lz), 0);
	return lz;
}

/* The VMM's side, in a child: asks for the chunk across the 3 MiB boundary, checks it. */
static int child_vmm(struct fx *f, int sock)
{
	struct chain c = {0};
	memcpy(c.layers[0].mem, f->f.name, strlen(f->f.name) + 1);
	uint64_t size = FILE_SIZE;
	struct lazy_gate *g = lazy_gate_new(sock, &c, 1, &size);
	if (!g || lazy_gate_need(g, 0, 3 * MiB - 4096, 8192, true))
		return 1;
	if (lazy_gate_need(g, 0, 100 * MiB, 4096, true) != -ERANGE)
		return 2;
	/* Hostile requests straight on the socket: a misaligned offset, one past the file, a
	 * name without its NUL: each answered -EINVAL, and the fetcher goes on. */
	struct lazy_gate_req bad[3] = {{.off = 4096, .flags = LAZY_GATE_WAIT},
				       {.off = 64 * MiB, .flags = LAZY_GATE_WAIT},
				       {.off = 1, .flags = LAZY_GATE_WAIT}};
	memcpy(bad[0].name, f->f.name, strlen(f->f.name) + 1);
	memcpy(bad[1].name, f->f.name, strlen(f->f.name) + 1);
	memset(bad[2].name, 'm', sizeof(bad[2].name));
	for (int i = 0; i < 3; i++) {
		struct lazy_gate_rep rep;
		if (write(sock, &bad[i], sizeof(bad[i])) != (ssize_t)sizeof(bad[i]) ||
		    read(sock, &rep, sizeof(rep)) != (ssize_t)sizeof(rep) || rep.status != -EINVAL)
			return 10 + i;
	}
	int fd = openat(f->cdfd, f->f.name, O_RDONLY);
	uint8_t buf[8192];
	if (fd < 0 || pread_full(fd, buf, sizeof(buf), 3 * MiB - 4096) ||
	    memcmp(buf, f->orig + 3 * MiB - 4096, sizeof(buf)))
		return 3;
	lazy_gate_free(g);
	return 0;
}

static void test_lazy_fetch(void **state)
{
	struct fx *f = *state;
	char path[128];
	snprintf(path, sizeof(path), "%s/orig", f->dir);
	make_file(f, path);
	store_it(f, path, "mem-000041", false, false);
	free(place(f));
	/* Only the header chunk is here: the rest of the file is a hole. */
	int fd = openat(f->cdfd, f->f.name, O_RDONLY);
	assert_true(fd >= 0);
	assert_true(lseek(fd, MiB, SEEK_DATA) < 0);
	int sv[2];
	assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv), 0);
	pid_t pid = fork();
	if (pid == 0) {
		close(sv[0]);
		_exit(child_vmm(f, sv[1]));
	}
	close(sv[1]);
	struct lazy_fetch_opts o = {
	    .cfg = &f->cfg, .sbx_dfd = f->sdfd, .sock = sv[0], .log = &f->log, .workers = 2};
	struct lazy_fetch_stats st;
	if (store_lazy_fetch(&o, &st, f->err, sizeof(f->err)))
		fail_msg("fetch: %s", f->err);
	close(sv[0]);
	int ws = 0;
	assert_int_equal(waitpid(pid, &ws, 0), pid);
	assert_true(WIFEXITED(ws));
	assert_int_equal(WEXITSTATUS(ws), 0);
	assert_int_equal(st.chunks, 6);
	assert_true(st.present_at_start >= 2); /* chunk 0, and chunk 4 (all zero) */
	assert_true(st.demand >= 1);
	uint8_t *got = malloc(FILE_SIZE);
	assert_int_equal(pread_full(fd, got, FILE_SIZE, 0), 0);
	assert_memory_equal(got, f->orig, FILE_SIZE);
	free(got);
	close(fd);
	assert_false(sbx_lazy_pending(f->sdfd));
}

static void test_bad_chunk_list(void **state)
{
	struct fx *f = *state;
	char path[128];
	snprintf(path, sizeof(path), "%s/orig", f->dir);
	make_file(f, path);
	store_it(f, path, "mem-000042", true, false);
	struct sbx_lazy lz = {0};
	uint64_t got = 0;
	int r = lazy_blob_place(f->c, &f->f, f->cdfd, &lz, &got, f->err, sizeof(f->err));
	assert_int_equal(r, -EILSEQ);
	assert_non_null(strstr(f->err, "chunk list does not give the digest"));
	assert_int_equal(lz.n, 0);
	assert_int_equal(faccessat(f->cdfd, f->f.name, F_OK, 0), -1); /* nothing left placed */
}

static void test_altered_blob(void **state)
{
	struct fx *f = *state;
	char path[128];
	snprintf(path, sizeof(path), "%s/orig", f->dir);
	make_file(f, path);
	store_it(f, path, "mem-000043", false, true);
	free(place(f));
	struct lazy_fetch_opts o = {
	    .cfg = &f->cfg, .sbx_dfd = f->sdfd, .sock = -1, .log = &f->log, .workers = 1};
	struct lazy_fetch_stats st;
	int r = store_lazy_fetch(&o, &st, f->err, sizeof(f->err));
	assert_int_equal(r, -EILSEQ);
	assert_non_null(strstr(f->err, "does not match its SHA-256"));
	/* The altered chunk was never written: [1 MiB, 2 MiB) is still a hole. */
	int fd = openat(f->cdfd, f->f.name, O_RDONLY);
	off_t d = lseek(fd, MiB, SEEK_DATA);
	assert_true(d < 0 || d >= (off_t)(2 * MiB));
	close(fd);
	assert_true(sbx_lazy_pending(f->sdfd)); /* not whole: the record stays */
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_lazy_fetch, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_bad_chunk_list, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_altered_blob, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
