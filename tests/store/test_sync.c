/* Generations through a real Ceph radosgw (tests/lib/s3server.py starts it): a chain uploaded
 * and fetched into an empty directory; shared blobs sent once; a flipped blob refused while the
 * previous generation still fetches; a forged manifest refused; a tombstone ends it. */
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
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cmocka.h>
#include <curl/curl.h>
#include <jansson.h>
#include <libxml/parser.h>

#include "../unit/chain_fixture.h"
#include "lifecycle/image_files.h"
#include "lifecycle/spec.h"
#include "lifecycle/state.h"
#include "lifecycle/launch.h"
#include "lifecycle/lock.h"
#include "lifecycle/store/cache_check.h"
#include "lifecycle/store/catalog.h"
#include "lifecycle/store/lease.h"
#include "lifecycle/store/gc.h"
#include "lifecycle/store/reconnect.h"
#include "lifecycle/store/store_config.h"
#include "lifecycle/store/sync.h"
#include "sandbox/event_log.h"
#include "snapshot/crypto.h"
#include "snapshot/snap_crypt.h"

struct fx {
	struct store_config cfg;
	struct s3_client *c;
	uint8_t key[32];
	struct store_keyring kr;
	char a[64], b[64], stage[64], kernel[96];
	struct sbx_spec spec;
	char err[512];
};

static int setup(void **state)
{
	struct fx *f = calloc(1, sizeof(*f));
	assert_non_null(f);
	if (store_config_load(NULL, &f->cfg, f->err, sizeof(f->err)) ||
	    s3_client_new(&f->cfg, &(struct s3_opts){0}, &f->c, f->err, sizeof(f->err)))
		fail_msg("store: %s", f->err);
	assert_int_equal(getrandom(f->key, sizeof(f->key), 0), (ssize_t)sizeof(f->key));
	f->kr = (struct store_keyring){f->key, sizeof(f->key)};
	fx_mkdtemp(f->a, sizeof(f->a), "sync-a");
	fx_mkdtemp(f->b, sizeof(f->b), "sync-b");
	fx_mkdtemp(f->stage, sizeof(f->stage), "sync-stage");
	/* The host's kernel: any file; the manifest carries its digest, never its path. */
	snprintf(f->kernel, sizeof(f->kernel), "%s/vmlinux", f->stage);
	fx_write(f->kernel, "kernel bytes\n", 13, 0, true);
	snprintf(f->spec.kernel, sizeof(f->spec.kernel), "%s", f->kernel);
	f->spec.mem_bytes = 64 << 20;
	f->spec.vcpus = 1;
	snprintf(f->spec.cmdline, sizeof(f->spec.cmdline), "console=ttyS0");
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fx *f = *state;
	s3_client_free(f->c);
	store_config_wipe(&f->cfg);
	fx_rmdir(f->a);
	fx_rmdir(f->b);
	fx_rmdir(f->stage);
	free(f);
	return 0;
}

static int upload(struct fx *f, const char *name, const char *dir, struct store_sync_stats *st)
{
	int sdfd = open(f->stage, O_RDONLY | O_DIRECTORY);
	struct store_upload_src src = {.name = name,
				       .chain_dir = dir,
				       .spec = &f->spec,
				       .policy_id = "default",
				       .key_type = "",
				       .stage_dfd = sdfd};
	int r = store_upload_generation(f->c, &src, &f->kr, st, f->err, sizeof(f->err));
	close(sdfd);
	return r;
}

static int fetch(struct fx *f, const char *name, uint64_t gen, const char *into,
		 struct store_sync_stats *st)
{
	int cdfd = open(into, O_RDONLY | O_DIRECTORY),
	    idfd = open(f->stage, O_RDONLY | O_DIRECTORY);
	struct store_manifest m;
	int r = store_fetch_generation(f->c, name, gen, &f->kr, cdfd, idfd, NULL, &m, st, f->err,
				       sizeof(f->err));
	if (!r)
		store_manifest_free(&m);
	close(cdfd);
	close(idfd);
	return r;
}

static void test_up_and_back(void **state)
{
	struct fx *f = *state;
	struct chain c;
	struct store_sync_stats st;
	fx_make_chain(&c, f->a, 2);
	if (upload(f, "sync-one", f->a, &st))
		fail_msg("upload: %s", f->err);
	assert_int_equal(st.generation, 1);
	assert_int_equal(st.files, 6); /* mem-0 mem-1 state-0 state-1, the chain file, kernel */
	assert_int_equal(st.blobs_sent + st.blobs_present, 6);
	/* The same chain again: generation 2, nothing sent twice. */
	if (upload(f, "sync-one", f->a, &st))
		fail_msg("upload 2: %s", f->err);
	assert_int_equal(st.generation, 2);
	assert_int_equal(st.blobs_sent, 0);
	assert_int_equal(st.blobs_present, 6);
	/* Another "host": an empty directory. */
	char into[64], err[512];
	fx_mkdtemp(into, sizeof(into), "sync-into");
	if (fetch(f, "sync-one", 0, into, &st))
		fail_msg("fetch: %s", f->err);
	assert_int_equal(st.generation, 2);
	struct chain got;
	assert_int_equal(chain_load(into, &got, err, sizeof(err)), 0);
	assert_int_equal(got.nr_layers, 2);
	assert_memory_equal(got.chain_id, c.chain_id, 16);
	assert_int_equal(chain_verify_stamped(into, NULL, err, sizeof(err)), 0);
	fx_rmdir(into);
	/* Another fleet's key: the manifest is refused before anything is fetched. */
	f->key[0] ^= 1;
	fx_mkdtemp(into, sizeof(into), "sync-into");
	assert_int_equal(fetch(f, "sync-one", 0, into, &st), -EBADMSG);
	assert_non_null(strstr(f->err, "bad MAC"));
	f->key[0] ^= 1;
	fx_rmdir(into);
	/* Removed: every host answers that it is gone. */
	assert_int_equal(store_put_tombstone(f->c, "sync-one", f->err, sizeof(f->err)), 0);
	uint64_t g;
	assert_int_equal(store_newest_generation(f->c, "sync-one", &g, f->err, sizeof(f->err)),
			 -EIDRM);
	assert_int_equal(upload(f, "sync-one", f->a, &st), -EIDRM);
}

/* A second sandbox sharing two layers sends only what differs; a flipped byte in the blob of
 * its newest layer is refused naming it, and the first generation still fetches. */
static void test_shared_and_flipped(void **state)
{
	struct fx *f = *state;
	struct chain c;
	struct store_sync_stats st;
	fx_make_chain(&c, f->a, 2);
	fx_make_chain(&c, f->b, 3);
	if (upload(f, "sync-two", f->a, &st))
		fail_msg("upload: %s", f->err);
	if (upload(f, "sync-two", f->b, &st))
		fail_msg("upload b: %s", f->err);
	assert_int_equal(st.generation, 2);
	/* mem-0, mem-1, state-0, state-1 and the kernel are shared: mem-2, state-2, chain file. */
	assert_int_equal(st.blobs_present, 5);
	assert_int_equal(st.blobs_sent, 3);
	/* Flip a byte of mem-2's blob in the store (a store is not trusted). */
	uint8_t d[DIGEST_LEN];
	char path[128], key[S3_KEY_MAX], hex[DIGEST_HEX_LEN];
	snprintf(path, sizeof(path), "%s/mem-2", f->b);
	int fd = open(path, O_RDONLY);
	assert_int_equal(digest_fd(fd, d), 0);
	close(fd);
	digest_hex(d, hex);
	snprintf(key, sizeof(key), STORE_BLOB_PREFIX "%s", hex);
	uint8_t *blob = malloc(1 << 20);
	size_t got = 0;
	assert_int_equal(s3_get(f->c, key, 0, 0, blob, 1 << 20, &got, f->err, sizeof(f->err)), 0);
	blob[got - 1] ^= 0x20;
	assert_int_equal(s3_put(f->c, key, blob, got, 0, f->err, sizeof(f->err)), 0);
	free(blob);
	char into[64];
	fx_mkdtemp(into, sizeof(into), "sync-into");
	int r = fetch(f, "sync-two", 0, into, &st);
	if (r != -EILSEQ || !strstr(f->err, "mem-2"))
		fail_msg("flipped blob: %d %s", r, f->err);
	assert_null(strchr(f->err, '\n'));
	/* Nothing of the refused blob was placed under its name. */
	char placed[128];
	snprintf(placed, sizeof(placed), "%s/mem-2", into);
	assert_int_equal(access(placed, F_OK), -1);
	fx_rmdir(into);
	fx_mkdtemp(into, sizeof(into), "sync-into");
	if (fetch(f, "sync-two", 1, into, &st))
		fail_msg("generation 1: %s", f->err);
	char err[512];
	assert_int_equal(chain_verify_stamped(into, NULL, err, sizeof(err)), 0);
	fx_rmdir(into);
}

/* Sandbox `name` on state root `root` (COVE_STATE_DIR now points at it, *r opened): its spec,
 * one event (creating -> `state`), a fixture chain of `layers` layers. Its directory fd. */
static int make_sandbox(const char *root, const char *name, const struct sbx_spec *sp,
			const char *state, int layers, struct sbx_root *r)
{
	char err[600], p[256];
	setenv("COVE_STATE_DIR", root, 1);
	assert_int_equal(sbx_root_open(r, true, err, sizeof(err)), 0);
	int dfd = sbx_dir_open(r, name, true, err, sizeof(err));
	assert_true(dfd >= 0);
	assert_int_equal(sbx_spec_write(dfd, sp), 0);
	assert_int_equal(sbx_event_append(dfd, "creating", state, "test"), 0);
	snprintf(p, sizeof(p), "%s/%s/chain", root, name);
	assert_int_equal(mkdir(p, 0700), 0);
	struct chain c;
	fx_make_chain(&c, p, layers);
	return dfd;
}

/* f->c becomes a client under `prefix` of its own; the shared client is returned, for
 * own_prefix_end to put back. */
static struct s3_client *own_prefix(struct fx *f, const char *prefix)
{
	struct s3_client *shared = f->c;
	struct store_config cfg = f->cfg;
	snprintf(cfg.prefix, sizeof(cfg.prefix), "%s", prefix);
	if (s3_client_new(&cfg, &(struct s3_opts){0}, &f->c, f->err, sizeof(f->err)))
		fail_msg("client: %s", f->err);
	return shared;
}

static void own_prefix_end(struct fx *f, struct s3_client *shared)
{
	s3_client_free(f->c);
	f->c = shared;
}

/* A stopped named sandbox on host A (its own state root), pushed; host B (another state root,
 * empty image cache) pulls it: the same chain, a spec of B's own paths, state stopped. */
static void test_push_pull(void **state)
{
	struct fx *f = *state;
	char root_a[64], root_b[64], p[256], err[600];
	fx_mkdtemp(root_a, sizeof(root_a), "host-a");
	fx_mkdtemp(root_b, sizeof(root_b), "host-b");
	struct store_config cfg = f->cfg;
	memcpy(cfg.fleet_key, f->key, 32);
	cfg.fleet_key_len = 32;
	snprintf(cfg.pkcs11_spec, sizeof(cfg.pkcs11_spec), "pkcs11:token=cove;object=kek");
	/* Host A: NAME/spec.json, NAME/events.jsonl (stopped), NAME/chain/. */
	struct sbx_root ra, rb;
	struct sbx_spec sp = f->spec;
	snprintf(sp.key, sizeof(sp.key), "pkcs11:token=hostA;object=kekA");
	int dfd = make_sandbox(root_a, "agent-a", &sp, "stopped", 2, &ra);
	struct store_sync_stats st;
	if (store_push_sandbox(f->c, &cfg, &ra, "agent-a", &st, err, sizeof(err)))
		fail_msg("push: %s", err);
	assert_int_equal(st.generation, 1);
	/* Host B. */
	setenv("COVE_STATE_DIR", root_b, 1);
	assert_int_equal(sbx_root_open(&rb, true, err, sizeof(err)), 0);
	if (store_pull_sandbox(f->c, &cfg, &rb, "agent-a", 0, &st, err, sizeof(err)))
		fail_msg("pull: %s", err);
	int bdfd = sbx_dir_open(&rb, "agent-a", false, err, sizeof(err));
	assert_true(bdfd >= 0);
	struct sbx_spec got;
	assert_int_equal(sbx_spec_read(bdfd, &got, err, sizeof(err)), 0);
	/* B's own kernel path (its cache, by digest), B's own key provider of that type. */
	snprintf(p, sizeof(p), "%s/" STORE_IMAGES_DIR "/", root_b);
	assert_memory_equal(got.kernel, p, strlen(p));
	assert_string_equal(got.key, "pkcs11:token=cove;object=kek");
	assert_int_equal(got.mem_bytes, sp.mem_bytes);
	enum sbx_state s;
	assert_int_equal(sbx_state_read(bdfd, &s, NULL), 0);
	assert_int_equal(s, SBX_STOPPED);
	snprintf(p, sizeof(p), "%s/agent-a/chain", root_b);
	assert_int_equal(chain_verify_stamped(p, NULL, err, sizeof(err)), 0);
	/* The kernel's bytes, from the cache. */
	char buf[64] = {0};
	int kfd = open(got.kernel, O_RDONLY);
	if (kfd < 0)
		fail_msg("%s: %s", got.kernel, strerror(errno));
	assert_true(kfd >= 0);
	assert_int_equal(read(kfd, buf, sizeof(buf)), 13);
	assert_string_equal(buf, "kernel bytes\n");
	close(kfd);
	/* A second pull: the sandbox is here already. */
	assert_int_equal(store_pull_sandbox(f->c, &cfg, &rb, "agent-a", 0, &st, err, sizeof(err)),
			 -EEXIST);
	/* A host without a provider of that type cannot start it: refused, nothing left. */
	cfg.pkcs11_spec[0] = 0;
	assert_int_equal(store_push_sandbox(f->c, &cfg, &ra, "agent-a", &st, err, sizeof(err)), 0);
	char root_c[64];
	fx_mkdtemp(root_c, sizeof(root_c), "host-c");
	setenv("COVE_STATE_DIR", root_c, 1);
	struct sbx_root rc;
	assert_int_equal(sbx_root_open(&rc, true, err, sizeof(err)), 0);
	assert_int_equal(store_pull_sandbox(f->c, &cfg, &rc, "agent-a", 0, &st, err, sizeof(err)),
			 -ENOKEY);
	assert_non_null(strstr(err, "pkcs11"));
	struct stat sb;
	assert_int_not_equal(fstatat(rc.dfd, "agent-a", &sb, 0), 0);
	close(dfd);
	close(bdfd);
	sbx_root_close(&ra);
	sbx_root_close(&rb);
	sbx_root_close(&rc);
	char cmd[256];
	snprintf(cmd, sizeof(cmd), "rm -rf %s %s %s", root_a, root_b, root_c);
	assert_int_equal(system(cmd), 0);
}

/*
 * A sandbox made from an OCI image (cove create --image) travels whole: host A pushes it, and
 * on host B, whose image cache was empty, its directory holds its own hard links of the image's
 * root (disk 0 names that link) and of its record, image.json, which gives cove exec its
 * defaults there too (so evicting B's cached copy never breaks it). A refresh to a newer
 * generation keeps both links and disk 0's path.
 */
static void test_push_pull_image(void **state)
{
	struct fx *f = *state;
	char root_a[64], root_b[64], p[300], err[600];
	fx_mkdtemp(root_a, sizeof(root_a), "img-a");
	fx_mkdtemp(root_b, sizeof(root_b), "img-b");
	struct store_config cfg = f->cfg;
	memcpy(cfg.fleet_key, f->key, 32);
	cfg.fleet_key_len = 32;
	struct sbx_root ra, rb;
	struct sbx_spec sp = f->spec;
	char initrd[96];
	snprintf(initrd, sizeof(initrd), "%s/init.cpio.gz", f->stage);
	fx_write(initrd, "init bytes\n", 11, 0, true);
	snprintf(sp.initrd, sizeof(sp.initrd), "%s", initrd);
	snprintf(sp.cmdline, sizeof(sp.cmdline),
		 "console=ttyS0 cove.hostname=web cove.root=/dev/vda cove.main=e30=");
	sp.nr_disks = 1;
	sp.disks[0].overlay = true;
	snprintf(sp.disks[0].path, sizeof(sp.disks[0].path), "%s/web/" SBX_IMAGE_EXT4, root_a);
	assert_true(sbx_spec_is_image(&sp));
	int dfd = make_sandbox(root_a, "web", &sp, "stopped", 2, &ra);
	static const char record[] = "{\"config\":{\"User\":\"app\",\"Env\":[\"A=1\"]}}";
	snprintf(p, sizeof(p), "%s/web/" SBX_IMAGE_EXT4, root_a);
	fx_write(p, "ext4 image bytes\n", 17, 0, true);
	snprintf(p, sizeof(p), "%s/web/" SBX_IMAGE_JSON, root_a);
	fx_write(p, record, strlen(record), 0, true);
	struct store_sync_stats st;
	if (store_push_sandbox(f->c, &cfg, &ra, "web", &st, err, sizeof(err)))
		fail_msg("push: %s", err);
	setenv("COVE_STATE_DIR", root_b, 1);
	assert_int_equal(sbx_root_open(&rb, true, err, sizeof(err)), 0);
	if (store_pull_sandbox(f->c, &cfg, &rb, "web", 0, &st, err, sizeof(err)))
		fail_msg("pull: %s", err);
	int bdfd = sbx_dir_open(&rb, "web", false, err, sizeof(err));
	assert_true(bdfd >= 0);
	struct sbx_spec got;
	assert_int_equal(sbx_spec_read(bdfd, &got, err, sizeof(err)), 0);
	snprintf(p, sizeof(p), "%s/web/" SBX_IMAGE_EXT4, root_b);
	assert_string_equal(got.disks[0].path, p);
	assert_true(sbx_spec_is_image(&got));
	char buf[64] = {0};
	int fd = open(p, O_RDONLY);
	assert_true(fd >= 0);
	assert_int_equal(read(fd, buf, sizeof(buf)), 17);
	assert_string_equal(buf, "ext4 image bytes\n");
	struct stat own;
	assert_int_equal(fstat(fd, &own), 0);
	assert_int_equal(own.st_nlink, 2); /* B's cache and B's sandbox */
	close(fd);
	snprintf(p, sizeof(p), "%s/web/" SBX_IMAGE_JSON, root_b);
	memset(buf, 0, sizeof(buf));
	fd = open(p, O_RDONLY);
	assert_true(fd >= 0);
	assert_int_equal(read(fd, buf, sizeof(buf)), (ssize_t)strlen(record));
	assert_string_equal(buf, record);
	close(fd);
	assert_int_equal(store_push_sandbox(f->c, &cfg, &ra, "web", &st, err, sizeof(err)), 0);
	if (store_refresh_sandbox(f->c, &cfg, &rb, "web", bdfd, 0, &st, err, sizeof(err)))
		fail_msg("refresh: %s", err);
	assert_int_equal(sbx_spec_read(bdfd, &got, err, sizeof(err)), 0);
	snprintf(p, sizeof(p), "%s/web/" SBX_IMAGE_EXT4, root_b);
	assert_string_equal(got.disks[0].path, p);
	assert_int_equal(faccessat(bdfd, SBX_IMAGE_JSON, R_OK, 0), 0);
	close(dfd);
	close(bdfd);
	sbx_root_close(&ra);
	sbx_root_close(&rb);
	char cmd[256];
	snprintf(cmd, sizeof(cmd), "rm -rf %s %s", root_a, root_b);
	assert_int_equal(system(cmd), 0);
}

/*
 * The cache's committed check (issue 29): a local copy may be evicted only when this host
 * recorded a generation, it is the store's newest, and its manifest's layer is the local chain's
 * newest; each way it fails, one reason, against the real store.
 */
static void test_cache_check(void **state)
{
	struct fx *f = *state;
	struct s3_client *shared = own_prefix(f, "cache-check/");
	char root[64], p[256], two[64], why[512];
	fx_mkdtemp(root, sizeof(root), "cache-host");
	struct store_config cfg = f->cfg;
	memcpy(cfg.fleet_key, f->key, 32);
	cfg.fleet_key_len = 32;
	struct sbx_root r;
	struct store_sync_stats st;
	int dfd = make_sandbox(root, "cached", &f->spec, "stopped", 2, &r);
	/* Never committed or pulled here. */
	assert_int_equal(store_check_cached(f->c, &cfg, &r, "cached", dfd, why, sizeof(why)), 1);
	assert_non_null(strstr(why, "no generation"));
	if (store_push_sandbox(f->c, &cfg, &r, "cached", &st, why, sizeof(why)))
		fail_msg("push: %s", why);
	assert_int_equal(st.generation, 1);
	assert_int_equal(store_base_save(dfd, 1), 0); /* as a fenced commit from here records */
	if (store_check_cached(f->c, &cfg, &r, "cached", dfd, why, sizeof(why)))
		fail_msg("committed, yet: %s", why);
	/* Another host committed generation 2 since. */
	snprintf(p, sizeof(p), "%s/cached/chain", root);
	if (upload(f, "cached", p, &st))
		fail_msg("upload: %s", f->err);
	assert_int_equal(store_check_cached(f->c, &cfg, &r, "cached", dfd, why, sizeof(why)), 1);
	assert_non_null(strstr(why, "the store's newest 2"));
	assert_int_equal(store_base_save(dfd, 2), 0);
	assert_int_equal(store_check_cached(f->c, &cfg, &r, "cached", dfd, why, sizeof(why)), 0);
	/* A local commit the store does not have: generation 1 holds a 2-layer chain, this host's
	 * copy ends with layer 3. */
	int ndfd = make_sandbox(root, "cached-new", &f->spec, "stopped", 3, &r);
	fx_mkdtemp(two, sizeof(two), "cache-two");
	struct chain c;
	fx_make_chain(&c, two, 2);
	if (upload(f, "cached-new", two, &st))
		fail_msg("upload: %s", f->err);
	assert_int_equal(store_base_save(ndfd, st.generation), 0);
	assert_int_equal(store_check_cached(f->c, &cfg, &r, "cached-new", ndfd, why, sizeof(why)),
			 1);
	assert_non_null(strstr(why, "ends with layer 3"));
	/* Removed from the store: never evicted (rm and gc own that). */
	assert_int_equal(store_put_tombstone(f->c, "cached", why, sizeof(why)), 0);
	assert_int_equal(store_check_cached(f->c, &cfg, &r, "cached", dfd, why, sizeof(why)), 1);
	assert_non_null(strstr(why, "tombstone"));
	close(dfd);
	close(ndfd);
	sbx_root_close(&r);
	fx_rmdir(two);
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", root);
	assert_int_equal(system(cmd), 0);
	own_prefix_end(f, shared);
}

/* Retention keeps the newest generation; gc frees blobs only expired generations named, once
 * past the grace period; a removed sandbox's generations all go; the newest still fetches. */
static void test_gc(void **state)
{
	struct fx *f = *state;
	struct chain c;
	struct store_sync_stats st;
	struct store_gc_stats g;
	time_t now = time(NULL);
	/* A prefix of its own: the other tests' manifests are MAC'ed under other fleet keys (one
	 * per test), which gc rightly refuses. */
	struct s3_client *shared = own_prefix(f, "gc-test/");
	fx_make_chain(&c, f->a, 2);
	fx_make_chain(&c, f->b, 3);
	/* gc-one: generation 1 (2 layers), then 2 (3 layers). gc-two: one generation (2 layers),
	 * then removed. */
	if (upload(f, "gc-one", f->a, &st) || upload(f, "gc-one", f->b, &st) ||
	    upload(f, "gc-two", f->a, &st))
		fail_msg("upload: %s", f->err);
	assert_int_equal(store_put_tombstone(f->c, "gc-two", f->err, sizeof(f->err)), 0);
	/* Inside the grace period nothing unnamed goes; expired manifests do. */
	if (store_gc(f->c, &f->kr, 1, 3600, now, &g, f->err, sizeof(f->err)))
		fail_msg("gc: %s", f->err);
	assert_int_equal(g.manifests_removed, 2); /* gc-one's 1, gc-two's 1 */
	assert_int_equal(g.manifests_kept, 1);
	assert_int_equal(g.blobs_removed, 0);
	assert_true(g.blobs_young >= 1);
	/* Past the grace period: the blob only gc-one's generation 1 and gc-two named (the
	 * 2-layer chain file) goes; every blob generation 2 names stays. */
	if (store_gc(f->c, &f->kr, 1, 3600, now + 7200, &g, f->err, sizeof(f->err)))
		fail_msg("gc 2: %s", f->err);
	assert_int_equal(g.blobs_removed, 1);
	assert_int_equal(g.blobs_young, 0);
	assert_int_equal(g.blobs, g.blobs_kept + 1);
	assert_true(g.blobs_kept >= 5);
	char into[64];
	fx_mkdtemp(into, sizeof(into), "sync-into");
	if (fetch(f, "gc-one", 0, into, &st))
		fail_msg("fetch after gc: %s", f->err);
	fx_rmdir(into);
	/* A manifest gc cannot authenticate stops it before any delete. */
	f->key[1] ^= 1;
	assert_int_equal(store_gc(f->c, &f->kr, 1, 0, now + 7200, &g, f->err, sizeof(f->err)),
			 -EBADMSG);
	assert_non_null(strstr(f->err, "nothing deleted"));
	assert_int_equal(g.blobs_removed, 0);
	f->key[1] ^= 1;
	own_prefix_end(f, shared);
}

/* store.json as s3server wrote it, plus this test's fleet key file and a pkcs11 provider. */
static void fleet_store_json(struct fx *f, const char *dir, char *out, size_t cap)
{
	char keyfile[128], hex[65];
	for (int i = 0; i < 32; i++)
		snprintf(hex + 2 * i, 3, "%02x", f->key[i]);
	snprintf(keyfile, sizeof(keyfile), "%s/fleet.key", dir);
	int fd = open(keyfile, O_WRONLY | O_CREAT | O_EXCL, 0600);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, hex, 64), 64);
	close(fd);
	json_t *o = json_load_file(getenv("COVE_STORE"), 0, NULL);
	assert_non_null(o);
	json_object_set_new(o, "fleet_key_file", json_string(keyfile));
	json_object_set_new(o, "prefix", json_string("pulls/"));
	snprintf(out, cap, "%s/store.json", dir);
	assert_int_equal(json_dump_file(o, out, 0), 0);
	json_decref(o);
}

/* 20 `cove-store pull` of one name at once on a host that never had it: one fetches, the 19
 * others wait for it and find the sandbox there; all of them see it. */
static void test_concurrent_pulls(void **state)
{
	struct fx *f = *state;
	char root_a[64], root_b[64], p[256], err[600], json[256];
	const char *bin = getenv("COVE_STORE_BIN");
	assert_non_null(bin);
	fx_mkdtemp(root_a, sizeof(root_a), "host-a");
	fx_mkdtemp(root_b, sizeof(root_b), "host-b");
	fleet_store_json(f, f->stage, json, sizeof(json));
	/* A prefix of its own: test_shared_and_flipped left a flipped blob in the shared one. */
	struct s3_client *shared = own_prefix(f, "pulls/");
	struct store_config cfg = f->cfg;
	snprintf(cfg.prefix, sizeof(cfg.prefix), "pulls/");
	memcpy(cfg.fleet_key, f->key, 32);
	cfg.fleet_key_len = 32;
	struct sbx_root ra;
	int dfd = make_sandbox(root_a, "many", &f->spec, "stopped", 3, &ra);
	struct store_sync_stats st;
	if (store_push_sandbox(f->c, &cfg, &ra, "many", &st, err, sizeof(err)))
		fail_msg("push: %s", err);
	enum { N = 20 };
	pid_t pids[N];
	int outs[N];
	for (int i = 0; i < N; i++) {
		char out[128];
		snprintf(out, sizeof(out), "%s/pull-%d.out", f->stage, i);
		outs[i] = open(out, O_RDWR | O_CREAT | O_TRUNC, 0600);
		pids[i] = fork();
		assert_true(pids[i] >= 0);
		if (pids[i] == 0) {
			dup2(outs[i], 1);
			dup2(outs[i], 2);
			setenv("COVE_STATE_DIR", root_b, 1);
			setenv("COVE_STORE", json, 1);
			execl(bin, bin, "pull", "many", (char *)NULL);
			_exit(127);
		}
	}
	int fetched = 0, already = 0;
	for (int i = 0; i < N; i++) {
		int status;
		assert_int_equal(waitpid(pids[i], &status, 0), pids[i]);
		char buf[1024] = {0};
		assert_true(pread(outs[i], buf, sizeof(buf) - 1, 0) >= 0);
		close(outs[i]);
		if (WIFEXITED(status) && WEXITSTATUS(status) == 0 && strstr(buf, "fetched"))
			fetched++;
		else if (WIFEXITED(status) && WEXITSTATUS(status) == 1 &&
			 strstr(buf, "already on this host"))
			already++;
		else
			fail_msg("pull %d: status %d: %s", i, status, buf);
	}
	assert_int_equal(fetched, 1);
	assert_int_equal(already, N - 1);
	snprintf(p, sizeof(p), "%s/many/chain", root_b);
	assert_int_equal(chain_verify_stamped(p, NULL, err, sizeof(err)), 0);
	/* Removed (cove rm writes this first): a third host's pull answers 66. */
	char cmd0[512];
	snprintf(cmd0, sizeof(cmd0), "COVE_STORE=%s %s tombstone many >/dev/null", json, bin);
	assert_int_equal(system(cmd0), 0);
	snprintf(cmd0, sizeof(cmd0), "COVE_STORE=%s COVE_STATE_DIR=%s/c %s pull many 2>/dev/null",
		 json, root_b, bin);
	int ws = system(cmd0);
	assert_true(WIFEXITED(ws));
	assert_int_equal(WEXITSTATUS(ws), 66);
	/* cove store ls: the sandbox, its newest generation, its lag, removed. */
	snprintf(cmd0, sizeof(cmd0), "COVE_STORE=%s %s ls", json, bin);
	FILE *ls = popen(cmd0, "r");
	char line[256], seen[256] = "";
	while (ls && fgets(line, sizeof(line), ls))
		if (!strncmp(line, "many ", 5))
			snprintf(seen, sizeof(seen), "%s", line);
	assert_int_equal(pclose(ls), 0);
	char lname[64], lag[32], lstate[32];
	unsigned long long newest, kept;
	if (sscanf(seen, "%63s %llu %llu %31s %31s", lname, &newest, &kept, lag, lstate) != 5 ||
	    newest != 1 || kept != 1 || lag[strlen(lag) - 1] != 's' || strcmp(lstate, "removed"))
		fail_msg("cove store ls: %s", seen);
	close(dfd);
	sbx_root_close(&ra);
	char cmd[256];
	snprintf(cmd, sizeof(cmd), "rm -rf %s %s", root_a, root_b);
	assert_int_equal(system(cmd), 0);
	own_prefix_end(f, shared);
}

/* The store's newest generation of `name` (0 none), waiting up to `secs` for it to reach `want`. */
static uint64_t wait_generation(struct fx *f, const char *name, uint64_t want, int secs)
{
	uint64_t g = 0;
	for (int i = 0; i < secs * 10; i++) {
		if (store_newest_generation(f->c, name, &g, f->err, sizeof(f->err)) == 0 &&
		    g >= want)
			break;
		usleep(100000);
	}
	return g;
}

/* cove-store follow while a sandbox runs: each new commit becomes a generation without a stop;
 * it returns once the VMM is gone. The VMM here is a process holding vmm.lock with its pid (what
 * the follower watches); the commits are the fixture chain's. */
static void test_follow(void **state)
{
	struct fx *f = *state;
	char root[64], p[256], json[256];
	const char *bin = getenv("COVE_STORE_BIN");
	fx_mkdtemp(root, sizeof(root), "host-f");
	fleet_store_json(f, f->stage, json, sizeof(json));
	struct s3_client *shared = own_prefix(f, "pulls/");
	struct sbx_root r;
	int dfd = make_sandbox(root, "live", &f->spec, "running", 2, &r);
	snprintf(p, sizeof(p), "%s/live/chain", root);
	struct chain c;
	int pp[2];
	assert_int_equal(pipe2(pp, O_CLOEXEC), 0); /* the follower must not hold it */
	pid_t vmm = fork();
	if (vmm == 0) {
		close(pp[1]);
		int lk = sbx_lock_take(dfd, SBX_LOCK_VMM, false, false);
		if (lk < 0 || sbx_lock_write_pid(dfd, SBX_LOCK_VMM, getpid()))
			_exit(1);
		char b;
		(void)!read(pp[0], &b, 1); /* until the test closes the pipe */
		_exit(0);
	}
	close(pp[0]);
	for (int i = 0; i < 100 && sbx_vmm_pid(dfd) <= 0; i++)
		usleep(50000);
	assert_true(sbx_vmm_pid(dfd) > 0);
	char log[160];
	snprintf(log, sizeof(log), "%s/follow.log", f->stage);
	pid_t fol = fork();
	if (fol == 0) {
		int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
		dup2(fd, 1);
		dup2(fd, 2);
		setenv("COVE_STORE", json, 1);
		execl(bin, bin, "follow", "live", (char *)NULL);
		_exit(127);
	}
	assert_int_equal(wait_generation(f, "live", 1, 60), 1);
	/* The running sandbox commits again: the follower uploads it as generation 2. */
	fx_make_chain(&c, p, 3);
	assert_int_equal(wait_generation(f, "live", 2, 60), 2);
	/* The VMM exits: so does the follower. */
	close(pp[1]);
	int status;
	assert_int_equal(waitpid(vmm, &status, 0), vmm);
	for (int i = 0; i < 100 && waitpid(fol, &status, WNOHANG) == 0; i++)
		usleep(100000);
	char text[4096] = {0};
	int lfd = open(log, O_RDONLY);
	assert_true(read(lfd, text, sizeof(text) - 1) >= 0);
	close(lfd);
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
		fail_msg("follow: status %d: %s", status, text);
	assert_non_null(strstr(text, "is generation 2"));
	close(dfd);
	sbx_root_close(&r);
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", root);
	assert_int_equal(system(cmd), 0);
	own_prefix_end(f, shared);
}

/* Objects under the client's prefix holding `marker` (a run of `len` bytes). */
static int scan_store(struct s3_client *c, const uint8_t *marker, size_t len)
{
	char token[S3_KEY_MAX + 1] = "", err[512];
	size_t cap = 64 << 20, got;
	uint8_t *buf = malloc(cap);
	int hits = 0, objects = 0;
	for (bool more = true; more;) {
		struct s3_list_page pg;
		assert_int_equal(s3_list(c, "", token, S3_LIST_MAX, &pg, err, sizeof(err)), 0);
		for (size_t i = 0; i < pg.n; i++, objects++) {
			assert_int_equal(
			    s3_get(c, pg.entries[i].key, 0, 0, buf, cap, &got, err, sizeof(err)),
			    0);
			hits += memmem(buf, got, marker, len) != NULL;
		}
		more = pg.truncated && pg.next_token[0];
		snprintf(token, sizeof(token), "%s", pg.next_token);
		s3_list_page_free(&pg);
	}
	free(buf);
	assert_true(objects > 0);
	return hits;
}

/* An encrypted chain puts only ciphertext pages in the store: a scan of every object finds no
 * page of the guest's memory, where the same chain in clear (the positive control) shows it. */
static void test_encrypted_ciphertext_only(void **state)
{
	struct fx *f = *state;
	struct s3_client *shared = f->c, *plain_c, *enc_c;
	struct store_config cfg = f->cfg;
	char err[512];
	snprintf(cfg.prefix, sizeof(cfg.prefix), "scan-plain/");
	assert_int_equal(s3_client_new(&cfg, &(struct s3_opts){0}, &plain_c, err, sizeof(err)), 0);
	snprintf(cfg.prefix, sizeof(cfg.prefix), "scan-sealed/");
	assert_int_equal(s3_client_new(&cfg, &(struct s3_opts){0}, &enc_c, err, sizeof(err)), 0);
	/* Layer 1's page 1 holds 4096 bytes of fx_page_byte(1, 1). */
	uint8_t marker[512];
	memset(marker, fx_page_byte(1, 1), sizeof(marker));
	struct chain c;
	struct store_sync_stats st;
	fx_make_chain(&c, f->a, 2);
	f->c = plain_c;
	if (upload(f, "scan-plain", f->a, &st))
		fail_msg("upload: %s", f->err);
	assert_true(scan_store(plain_c, marker, sizeof(marker)) >= 1);
	struct snap_crypt w = {0};
	assert_int_equal(crypto_key_generate(&w.key), 0);
	assert_int_equal(crypto_ctx_new(w.key, &w.cc), 0);
	assert_int_equal(crypto_random(w.chain_id, sizeof(w.chain_id)), 0);
	fx_make_chain_sealed(&c, f->b, 2, &w);
	snap_crypt_close(&w);
	f->c = enc_c;
	if (upload(f, "scan-sealed", f->b, &st))
		fail_msg("upload sealed: %s", f->err);
	assert_int_equal(scan_store(enc_c, marker, sizeof(marker)), 0);
	f->c = shared;
	s3_client_free(plain_c);
	s3_client_free(enc_c);
}

/* cove-store's own arguments, hostile or wrong: each refused with one line, nothing made. */
static void test_cli_refusals(void **state)
{
	struct fx *f = *state;
	char root[64], json[256], cmd[768], out[160];
	const char *bin = getenv("COVE_STORE_BIN");
	fx_mkdtemp(root, sizeof(root), "host-r");
	fleet_store_json(f, f->stage, json, sizeof(json));
	snprintf(out, sizeof(out), "%s/refused.out", f->stage);
	struct {
		const char *args;
		int status;
		const char *says;
	} cases[] = {
	    {"pull ../etc", 1, "cove store"},
	    {"pull Bad_Name", 1, "cove store"},
	    {"pull okname --gen 0", 2, "--gen wants a generation"},
	    {"pull okname --gen x", 2, "--gen wants a generation"},
	    {"push", 2, "which sandbox"},
	    {"gc --keep 0", 2, "--keep wants 1 or more"},
	    {"gc --grace 5x", 2, "--keep wants 1 or more, --grace seconds"},
	    {"frobnicate x", 2, "unknown command"},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		snprintf(cmd, sizeof(cmd), "COVE_STORE=%s COVE_STATE_DIR=%s %s %s >%s 2>&1", json,
			 root, bin, cases[i].args, out);
		int ws = system(cmd);
		char text[2048] = {0};
		int fd = open(out, O_RDONLY);
		assert_true(fd >= 0 && read(fd, text, sizeof(text) - 1) >= 0);
		close(fd);
		if (!WIFEXITED(ws) || WEXITSTATUS(ws) != cases[i].status ||
		    !strstr(text, cases[i].says))
			fail_msg("cove-store %s: status %d: %s", cases[i].args, ws, text);
		/* One line (usage lines aside): the refusal, not a trace. */
		if (cases[i].status == 1)
			assert_int_equal(strchr(text, '\n') - text + 1, (long)strlen(text));
	}
	/* Nothing was made in the state root but its own directories. */
	char ls[256];
	snprintf(ls, sizeof(ls), "ls -A %s | grep -v '^\\.' | wc -l", root);
	FILE *pf = popen(ls, "r");
	int n = -1;
	assert_true(pf && fscanf(pf, "%d", &n) == 1);
	pclose(pf);
	assert_int_equal(n, 0);
	fx_rmdir(root);
}

/* radosgw alone killed while `cove-store push` is sending a multipart blob (the sandbox's
 * 24 MiB kernel), started again 1.5 s later: the push completes after retries, exactly one
 * generation is committed, no multipart upload is left, and the generation fetches intact. */
static void test_push_rgw_killed(void **state)
{
	struct fx *f = *state;
	char root[64], err[600], json[256], log[160];
	const char *bin = getenv("COVE_STORE_BIN"), *bounce = getenv("COVE_TEST_RGW_BOUNCE");
	assert_non_null(bounce);
	fx_mkdtemp(root, sizeof(root), "host-k");
	fleet_store_json(f, f->stage, json, sizeof(json));
	struct s3_client *shared = own_prefix(f, "pulls/");
	/* A kernel big enough to go up in parts (over 16 MiB), of bytes no other test sent. */
	snprintf(f->spec.kernel, sizeof(f->spec.kernel), "%s/big-kernel", f->stage);
	int kfd = open(f->spec.kernel, O_WRONLY | O_CREAT | O_EXCL, 0600);
	uint8_t *buf = malloc(24 << 20);
	assert_int_equal(getrandom(buf, 24 << 20, 0), 24 << 20);
	assert_int_equal(write(kfd, buf, 24 << 20), 24 << 20);
	close(kfd);
	free(buf);
	struct sbx_root r;
	int dfd = make_sandbox(root, "killed", &f->spec, "stopped", 2, &r);
	snprintf(log, sizeof(log), "%s/push.log", f->stage);
	pid_t pid = fork();
	if (pid == 0) {
		int fd = open(log, O_WRONLY | O_CREAT | O_TRUNC, 0600);
		dup2(fd, 1);
		dup2(fd, 2);
		setenv("COVE_STORE", json, 1);
		execl(bin, bin, "push", "killed", (char *)NULL);
		_exit(127);
	}
	/* Once its multipart upload exists, radosgw goes down under it. */
	bool seen = false;
	for (int i = 0; i < 600 && !seen; i++) {
		struct s3_upload_entry *u = NULL;
		size_t n = 0;
		if (s3_list_uploads(f->c, STORE_BLOB_PREFIX, 10, &u, &n, err, sizeof(err)) == 0)
			seen = n > 0;
		free(u);
		if (!seen)
			usleep(20000);
	}
	assert_true(seen);
	char cmd[512];
	snprintf(cmd, sizeof(cmd), "sh %s 1.5", bounce);
	assert_int_equal(system(cmd), 0);
	int status;
	assert_int_equal(waitpid(pid, &status, 0), pid);
	static char text[1 << 16];
	memset(text, 0, sizeof(text));
	int lfd = open(log, O_RDONLY);
	assert_true(read(lfd, text, sizeof(text) - 1) >= 0);
	close(lfd);
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || !strstr(text, "retry"))
		fail_msg("push: status %d: %s", status, text);
	assert_non_null(strstr(text, "killed: generation 1 committed"));
	uint64_t g = 0;
	assert_int_equal(store_newest_generation(f->c, "killed", &g, err, sizeof(err)), 0);
	assert_int_equal(g, 1);
	struct s3_upload_entry *u = NULL;
	size_t n = 9;
	assert_int_equal(s3_list_uploads(f->c, "", 100, &u, &n, err, sizeof(err)), 0);
	free(u);
	assert_int_equal(n, 0);
	char into[64];
	fx_mkdtemp(into, sizeof(into), "sync-into");
	if (fetch(f, "killed", 0, into, &(struct store_sync_stats){0}))
		fail_msg("fetch: %s", f->err);
	fx_rmdir(into);
	close(dfd);
	sbx_root_close(&r);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", root);
	assert_int_equal(system(cmd), 0);
	own_prefix_end(f, shared);
}

int main(void)
{
	curl_global_init(CURL_GLOBAL_DEFAULT);
	xmlInitParser();
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_up_and_back, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_shared_and_flipped, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_push_pull, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_push_pull_image, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_gc, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_cache_check, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_concurrent_pulls, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_follow, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_encrypted_ciphertext_only, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_cli_refusals, setup, teardown),
	    /* last: it takes radosgw down for a moment */
	    cmocka_unit_test_setup_teardown(test_push_rgw_killed, setup, teardown),
	};
	int r = cmocka_run_group_tests(tests, NULL, NULL);
	xmlCleanupParser();
	curl_global_cleanup();
	return r;
}
