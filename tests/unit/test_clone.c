/* lifecycle/clone.c (`cove fork NAME NEW`): a sandbox directory with a two-layer chain, a frozen
 * and a live disk overlay layer, keys and layer-seq, cloned by hard links and by copies; the
 * source is never changed, a refused clone creates nothing, an archived source clones archived. */
#include "helpers.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>

#include "devices/overlay.h"
#include "file_helpers.h"
#include "lifecycle/archive.h"
#include "lifecycle/broker.h"
#include "lifecycle/clone.h"
#include "lifecycle/root.h"
#include "lifecycle/policy.h"
#include "lifecycle/spec.h"
#include "lifecycle/state.h"
#include "lifecycle/vmm_args.h"
#include "sandbox/event_log.h"
#include "snapshot/chain.h"

#define DISK_SIZE (1u << 20)
#define CHUNK	  (64u << 10)

struct fx {
	char dir[64];
	char base[128]; /* the disk's base image (outside the state root) */
	struct sbx_root root;
	int adfd; /* sandbox "a" */
};

/* The files a chain directory of sandbox "a" holds, and whether a clone carries each. */
static const struct {
	const char *name;
	bool shared; /* linked (or copied with SBX_CLONE_COPY); else absent or copied */
	bool carried;
} chain_files[] = {
    {"mem-1", true, true},
    {"state-1", true, true},
    {"mem-2", true, true},
    {"state-2", true, true},
    {"disk0-000001.ovl", true, true},
    {"disk0-000001.ovl.map", true, true},
    {"disk0-000002.ovl", false, false}, /* the live top: the running VMM's own */
    {"disk0-000002.ovl.map", false, false},
    {"keys", false, true},
    {"layer-seq", false, true},
    {"chain.json", false, true},
    {"junk", false, false},
};

static void put(const char *dir, const char *name, const char *text)
{
	char path[256];

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	write_file(path, text, strlen(text));
}

/* Sandbox "a": spec, a stopped event log, chain/ with two layers and a frozen disk layer. */
static void make_source(struct fx *f)
{
	struct sbx_spec s = {0};
	struct chain *c = calloc(1, sizeof(*c));
	struct overlay ov;
	char err[256], cdir[128], top[192], next[192];
	uint8_t buf[4096];
	struct iovec iov = {buf, sizeof(buf)};

	f->adfd = sbx_dir_open(&f->root, "a", true, err, sizeof(err));
	assert_true(f->adfd >= 0);
	strcpy(s.kernel, "/k/bzImage");
	strcpy(s.cmdline, "console=ttyS0 cove.hostname=a root=/dev/vda");
	s.mem_bytes = 64 << 20;
	s.vcpus = 1;
	s.nr_disks = 1;
	strcpy(s.disks[0].path, f->base);
	s.disks[0].overlay = true;
	s.created_ms = 1000;
	strcpy(s.key, "cmd:/bin/true");
	assert_int_equal(sbx_spec_write(f->adfd, &s), 0);
	assert_int_equal(sbx_event_append(f->adfd, "creating", "running", "cove create"), 0);
	assert_int_equal(sbx_event_append(f->adfd, "running", "stopped", "cove stop"), 0);

	snprintf(cdir, sizeof(cdir), "%s/a/%s", f->dir, SBX_CHAIN);
	assert_int_equal(mkdir(cdir, 0700), 0);
	put(cdir, "mem-1", "memory of layer one");
	put(cdir, "state-1", "state of layer one");
	put(cdir, "mem-2", "memory of layer two");
	put(cdir, "state-2", "state of layer two");
	put(cdir, "keys", "wrapped data key");
	put(cdir, "layer-seq", "3");
	put(cdir, "junk", "not the chain's");
	put(cdir, ".chain.json.tmp", "a temporary a crash left");
	/* A disk top written, then frozen by a snapshot: the new top is live. */
	snprintf(top, sizeof(top), "%s/disk0-000001.ovl", cdir);
	snprintf(next, sizeof(next), "%s/disk0-000002.ovl", cdir);
	assert_int_equal(overlay_open(&ov, f->base, top, CHUNK, err, sizeof(err)), 0);
	memset(buf, 0x5a, sizeof(buf));
	assert_int_equal(overlay_write(&ov, 3 * CHUNK, &iov, 1, sizeof(buf)), 0);
	assert_int_equal(overlay_freeze(&ov, next, err, sizeof(err)), 0);
	memset(buf, 0xa5, sizeof(buf));
	assert_int_equal(overlay_write(&ov, 5 * CHUNK, &iov, 1, sizeof(buf)), 0);
	assert_int_equal(overlay_close(&ov), 0);

	strcpy(c->dir, cdir);
	c->chain_id[0] = 0x42;
	c->ram_size = 64 << 20;
	c->nr_layers = 2;
	c->layers[0] = (struct chain_layer){
	    .id = 1, .full = true, .mem = "mem-1", .state = "state-1", .present = 1, .stored = 1};
	c->layers[1] = (struct chain_layer){
	    .id = 2, .parent = 1, .mem = "mem-2", .state = "state-2", .present = 1, .stored = 1};
	assert_int_equal(chain_commit(c, err, sizeof(err)), 0);
	free(c);
}

static int setup(void **state)
{
	struct fx *f = calloc(1, sizeof(*f));
	char err[256];

	strcpy(f->dir, "/tmp/cove-clone-XXXXXX");
	assert_non_null(mkdtemp(f->dir));
	assert_int_equal(chmod(f->dir, 0700), 0);
	strcpy(f->base, "/tmp/cove-clone-base-XXXXXX");
	tmp_file(f->base, DISK_SIZE);
	setenv("COVE_STATE_DIR", f->dir, 1);
	setenv("COVE_RUN_DIR", "/tmp/cove-clone-run", 1);
	assert_int_equal(sbx_root_open(&f->root, false, err, sizeof(err)), 0);
	make_source(f);
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fx *f = *state;
	char cmd[128];

	close(f->adfd);
	sbx_root_close(&f->root);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", f->dir);
	assert_int_equal(system(cmd), 0);
	unlink(f->base);
	free(f);
	return 0;
}

static void path_of(const struct fx *f, const char *sbx, const char *sub, const char *name,
		    char *out, size_t cap)
{
	snprintf(out, cap, "%s/%s/%s%s%s", f->dir, sbx, sub, sub[0] ? "/" : "", name);
}

static void assert_same_content(const char *a, const char *b)
{
	size_t la, lb;
	uint8_t *x = read_file(a, &la), *y = read_file(b, &lb);

	assert_non_null(x);
	assert_non_null(y);
	assert_int_equal(la, lb);
	assert_memory_equal(x, y, la);
	free(x);
	free(y);
}

/* A fingerprint of every file under dir (names, sizes, inodes, mtimes, contents' sums). */
static uint64_t tree_sum(const char *dir)
{
	DIR *d = opendir(dir);
	uint64_t sum = 0;
	struct dirent *e;

	assert_non_null(d);
	while ((e = readdir(d))) {
		char p[512];
		struct stat st;

		if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
			continue;
		snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
		assert_int_equal(lstat(p, &st), 0);
		for (const char *c = e->d_name; *c; c++)
			sum = sum * 131 + (uint8_t)*c;
		sum += (uint64_t)st.st_ino * 7 + (uint64_t)st.st_size * 13 +
		       (uint64_t)st.st_mtim.tv_nsec;
		if (S_ISDIR(st.st_mode)) {
			sum += tree_sum(p) * 3;
		} else {
			size_t len;
			uint8_t *b = read_file(p, &len);

			for (size_t i = 0; b && i < len; i++)
				sum = sum * 31 + b[i];
			free(b);
		}
	}
	closedir(d);
	return sum;
}

static uint64_t source_sum(const struct fx *f)
{
	char p[128];

	snprintf(p, sizeof(p), "%s/a", f->dir);
	return tree_sum(p);
}

/* b's chain as the table says: shared files linked (or copied), the rest its own or absent. */
static void check_clone(const struct fx *f, const char *b, bool copied)
{
	for (size_t i = 0; i < sizeof(chain_files) / sizeof(chain_files[0]); i++) {
		char pa[256], pb[256];
		struct stat sa, sb;

		path_of(f, "a", SBX_CHAIN, chain_files[i].name, pa, sizeof(pa));
		path_of(f, b, SBX_CHAIN, chain_files[i].name, pb, sizeof(pb));
		if (!chain_files[i].carried) {
			assert_int_equal(lstat(pb, &sb), -1);
			continue;
		}
		assert_int_equal(lstat(pa, &sa), 0);
		assert_int_equal(lstat(pb, &sb), 0);
		assert_true(S_ISREG(sb.st_mode));
		assert_same_content(pa, pb);
		if (chain_files[i].shared && !copied)
			assert_true(sa.st_ino == sb.st_ino);
		else
			assert_true(sa.st_ino != sb.st_ino);
	}
}

static void test_clone_links(void **state)
{
	struct fx *f = *state;
	struct sbx_clone_stats st;
	struct sbx_spec *s = calloc(1, sizeof(*s));
	enum sbx_state state_b;
	struct sbx_event ev;
	char err[256], p[256];
	uint64_t before = source_sum(f);
	int bfd;

	assert_int_equal(
	    sbx_clone(&f->root, "a", f->adfd, "b", 0, "cove fork a", &st, err, sizeof(err)), 0);
	assert_int_equal(st.linked, 6); /* mem, state x 2; the frozen disk layer and its map */
	assert_int_equal(st.copied, 2); /* keys, layer-seq */
	assert_false(st.archived);
	check_clone(f, "b", false);
	/* Nothing of a changed: same names, inodes, sizes, contents. */
	assert_true(source_sum(f) == before);

	bfd = sbx_dir_open(&f->root, "b", false, err, sizeof(err));
	assert_true(bfd >= 0);
	assert_int_equal(sbx_spec_read(bfd, s, err, sizeof(err)), 0);
	assert_string_equal(s->cmdline, "console=ttyS0 cove.hostname=b root=/dev/vda");
	/* A new machine: a machine id of its own (a's spec had none). */
	assert_true(sbx_machine_id_valid(s->machine_id));
	assert_string_equal(s->key, "cmd:/bin/true");
	assert_string_equal(s->disks[0].path, f->base);
	assert_true(s->created_ms > 1000);
	assert_int_equal(sbx_state_read(bfd, &state_b, &ev), 0);
	assert_int_equal(state_b, SBX_STOPPED);
	assert_string_equal(ev.cause, "cove fork a");
	/* b's own chain.json and event log: writing them leaves a's alone. */
	path_of(f, "b", SBX_CHAIN, CHAIN_FILE, p, sizeof(p));
	write_file(p, "{}", 2);
	assert_int_equal(sbx_event_append(bfd, "stopped", "running", "cove start"), 0);
	assert_true(source_sum(f) == before);
	close(bfd);
	/* No temporary directory is left beside the sandboxes. */
	snprintf(p, sizeof(p), "%s/.clone-b-%d", f->dir, (int)getpid());
	assert_int_equal(access(p, F_OK), -1);
	free(s);
}

static void test_clone_copies(void **state)
{
	struct fx *f = *state;
	struct sbx_clone_stats st;
	char err[256];
	uint64_t before = source_sum(f);

	assert_int_equal(sbx_clone(&f->root, "a", f->adfd, "c", SBX_CLONE_COPY, "cove fork a", &st,
				   err, sizeof(err)),
			 0);
	assert_int_equal(st.linked, 0);
	assert_int_equal(st.copied, 8);
	check_clone(f, "c", true);
	assert_true(source_sum(f) == before);
}

/* The parent's CA (issue 16) goes along: the clone's disk trusts it, so its broker signs with
 * it. A copy of its own (0600), never a link. */
static void test_clone_mitm_ca(void **state)
{
	struct fx *f = *state;
	struct sbx_clone_stats st;
	char err[256], dir[256], p[256], q[256];
	struct stat sa, sb;

	path_of(f, "a", "", SBX_BROKER_MITM_CA, dir, sizeof(dir));
	assert_int_equal(mkdir(dir, 0700), 0);
	path_of(f, "a", SBX_BROKER_MITM_CA, SBX_BROKER_MITM_CA_KEY, p, sizeof(p));
	write_file(p, "key\n", 4);
	assert_int_equal(chmod(p, 0600), 0);
	path_of(f, "a", SBX_BROKER_MITM_CA, SBX_BROKER_MITM_CA_CERT, p, sizeof(p));
	write_file(p, "cert\n", 5);
	assert_int_equal(
	    sbx_clone(&f->root, "a", f->adfd, "d", 0, "cove fork a", &st, err, sizeof(err)), 0);
	assert_int_equal(st.copied, 4); /* keys, layer-seq, the CA's key and certificate */
	for (int i = 0; i < 2; i++) {
		const char *n = i ? SBX_BROKER_MITM_CA_CERT : SBX_BROKER_MITM_CA_KEY;

		path_of(f, "a", SBX_BROKER_MITM_CA, n, p, sizeof(p));
		path_of(f, "d", SBX_BROKER_MITM_CA, n, q, sizeof(q));
		assert_same_content(p, q);
		assert_int_equal(stat(p, &sa), 0);
		assert_int_equal(stat(q, &sb), 0);
		assert_true(sa.st_ino != sb.st_ino);
		assert_int_equal(sb.st_mode & 0777, 0600);
	}
	path_of(f, "d", "", SBX_BROKER_MITM_CA, q, sizeof(q));
	assert_int_equal(stat(q, &sb), 0);
	assert_int_equal(sb.st_mode & 0777, 0700);
}

/* A parent with a policy: the clone keeps its own copy, and its spec names that copy, so the
 * clone's broker neither reads the parent's policy nor writes its audit key beside it. */
static void test_clone_policy(void **state)
{
	struct fx *f = *state;
	struct sbx_clone_stats st;
	struct sbx_spec *s = calloc(1, sizeof(*s));
	const char *pol = "{\"egress\":{\"rules\":[]}}";
	char err[256], p[256], q[256];
	struct stat sa, sb;

	assert_non_null(s);
	assert_int_equal(sbx_policy_write(f->adfd, pol, strlen(pol)), 0);
	assert_int_equal(sbx_spec_read(f->adfd, s, err, sizeof(err)), 0);
	path_of(f, "a", "", SBX_POLICY, s->policy, sizeof(s->policy));
	assert_int_equal(sbx_spec_write(f->adfd, s), 0);
	assert_int_equal(
	    sbx_clone(&f->root, "a", f->adfd, "d", 0, "cove fork a", &st, err, sizeof(err)), 0);
	int ddfd = sbx_dir_open(&f->root, "d", false, err, sizeof(err));
	assert_true(ddfd >= 0);
	memset(s, 0, sizeof(*s));
	assert_int_equal(sbx_spec_read(ddfd, s, err, sizeof(err)), 0);
	close(ddfd);
	path_of(f, "d", "", SBX_POLICY, q, sizeof(q));
	assert_string_equal(s->policy, q);
	path_of(f, "a", "", SBX_POLICY, p, sizeof(p));
	assert_same_content(p, q);
	assert_int_equal(stat(p, &sa), 0);
	assert_int_equal(stat(q, &sb), 0);
	assert_true(sa.st_ino != sb.st_ino);
	assert_int_equal(sb.st_mode & 0777, 0600);
	free(s);
}

static void test_clone_refused(void **state)
{
	struct fx *f = *state;
	const char *dup[] = {"x", "y", "x"}, *bad[] = {"ok", "Bad_Name"}, *self[] = {"a"};
	struct sbx_clone_stats st;
	char err[256], p[256];
	uint64_t before = source_sum(f), root_before, b_before;
	int efd;

	/* An existing NEW: refused, the existing one untouched. */
	path_of(f, "b", "", "", p, sizeof(p));
	assert_int_equal(mkdir(p, 0700), 0);
	put(p, "mine", "b's own file");
	b_before = tree_sum(p);
	root_before = tree_sum(f->dir);
	assert_int_equal(sbx_clone(&f->root, "a", f->adfd, "b", 0, "t", &st, err, sizeof(err)),
			 -EEXIST);
	assert_non_null(strstr(err, "already exists"));
	assert_true(tree_sum(p) == b_before);
	assert_int_equal(sbx_clone(&f->root, "a", f->adfd, "a", 0, "t", &st, err, sizeof(err)),
			 -EEXIST);
	assert_int_equal(
	    sbx_clone(&f->root, "a", f->adfd, "Bad_Name", 0, "t", &st, err, sizeof(err)), -EINVAL);
	assert_int_equal(sbx_clone(&f->root, "a", f->adfd, "../x", 0, "t", &st, err, sizeof(err)),
			 -EINVAL);
	assert_int_equal(sbx_clone_check(&f->root, "a", dup, 3, err, sizeof(err)), -EALREADY);
	assert_int_equal(sbx_clone_check(&f->root, "a", bad, 2, err, sizeof(err)), -EINVAL);
	assert_int_equal(sbx_clone_check(&f->root, "a", self, 1, err, sizeof(err)), -EEXIST);
	assert_int_equal(sbx_clone_check(&f->root, "a", dup, 2, err, sizeof(err)), 0);

	/* A source without a committed layer: nothing to fork from, nothing created. */
	efd = sbx_dir_open(&f->root, "empty", true, err, sizeof(err));
	assert_true(efd >= 0);
	{
		struct sbx_spec s = {0};

		strcpy(s.kernel, "/k");
		s.mem_bytes = 1 << 20;
		s.vcpus = 1;
		assert_int_equal(sbx_spec_write(efd, &s), 0);
	}
	assert_int_equal(sbx_event_append(efd, "creating", "stopped", "t"), 0);
	root_before = tree_sum(f->dir);
	assert_int_equal(sbx_clone(&f->root, "empty", efd, "n", 0, "t", &st, err, sizeof(err)),
			 -ENOENT);
	assert_non_null(strstr(err, "no committed snapshot"));
	assert_true(tree_sum(f->dir) == root_before);
	close(efd);
	assert_true(source_sum(f) == before);
}

static void test_clone_archived(void **state)
{
	struct fx *f = *state;
	struct sbx_archive_stats as;
	struct sbx_clone_stats st;
	enum sbx_state s;
	char err[256], pa[256], pb[256];
	uint64_t before;
	int bfd;

	assert_int_equal(sbx_archive_pack(f->adfd, &as, err, sizeof(err)), 0);
	assert_int_equal(sbx_event_append(f->adfd, "stopped", "archived", "cove archive"), 0);
	before = source_sum(f);
	assert_int_equal(
	    sbx_clone(&f->root, "a", f->adfd, "b", 0, "cove fork a", &st, err, sizeof(err)), 0);
	assert_true(st.archived);
	assert_true(st.linked == as.files + 1); /* every packed file and the manifest */
	bfd = sbx_dir_open(&f->root, "b", false, err, sizeof(err));
	assert_true(bfd >= 0);
	assert_int_equal(sbx_state_read(bfd, &s, NULL), 0);
	assert_int_equal(s, SBX_ARCHIVED);
	/* Unpacking the clone's archive (as its first start does) leaves a's archive whole. */
	assert_int_equal(sbx_archive_unpack(bfd, &as, err, sizeof(err)), 0);
	assert_true(source_sum(f) == before);
	path_of(f, "b", SBX_CHAIN, "mem-2", pb, sizeof(pb));
	snprintf(pa, sizeof(pa), "%s/a/%s", f->dir, SBX_ARCHIVE);
	assert_int_equal(access(pa, F_OK), 0);
	{
		size_t len;
		uint8_t *b = read_file(pb, &len);

		assert_non_null(b);
		assert_int_equal(len, strlen("memory of layer two"));
		assert_memory_equal(b, "memory of layer two", len);
		free(b);
	}
	close(bfd);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_clone_links, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_clone_copies, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_clone_mitm_ca, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_clone_policy, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_clone_refused, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_clone_archived, setup, teardown),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
