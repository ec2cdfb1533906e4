/* Unit tests of snapshot/compact.c: a chain merged into one full layer holds the latest RAM. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <linux/audit.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "chain_fixture.h"
#include "common/byteorder.h"
#include "common/dirfd_io.h"
#include "snapshot/compact.h"
#include "snapshot/keyfile.h"
#include "snapshot/restore.h"

static int setup(void **state)
{
	return fx_setup(state, "compact");
}

static int teardown(void **state)
{
	return fx_teardown(state);
}

static bool exists(const char *dir, const char *name)
{
	char p[200];
	snprintf(p, sizeof(p), "%s/%s", dir, name);
	return access(p, F_OK) == 0;
}

/* Every page of the chain's latest memory, read through restore's open and validate. */
static void expect_ram(const char *dir, int upto)
{
	struct snap_restore_args a = {.dir = dir};
	struct snap_restore sr;
	memset(&sr, 0, sizeof(sr));
	char err[512] = "";
	if (snap_restore_open(&sr, &a, err, sizeof(err)) ||
	    snap_restore_validate(&sr, &a, err, sizeof(err)))
		fail_msg("%s", err);
	assert_int_equal(sr.ls->nr, 1);
	const struct mem_layer *l = &sr.ls->layers[0];
	assert_true(l->info.flags & MEM_LAYER_FULL);
	for (uint64_t p = 0; p < FX_PAGES; p++) {
		uint8_t b[2];
		off_t o = (off_t)(l->info.data_off + p * MEM_LAYER_PAGE);
		assert_int_equal(pread(l->fd, &b[0], 1, o), 1);
		assert_int_equal(pread(l->fd, &b[1], 1, o + MEM_LAYER_PAGE - 1), 1);
		assert_int_equal(b[0], fx_expect(upto, p));
		assert_int_equal(b[1], fx_expect(upto, p));
	}
	snap_restore_close(&sr);
}

static void test_compact_chain(void **state)
{
	struct chain_fx *f = *state;
	char err[512] = "";
	struct chain c = f->c;
	assert_int_equal(chain_compact(&c, err, sizeof(err)), 0);
	assert_int_equal(c.nr_layers, 1);
	assert_int_equal(c.layers[0].id, 3);
	assert_int_equal(c.layers[0].parent, 0);
	assert_true(c.layers[0].full);
	assert_string_equal(c.layers[0].mem, "mem-000003-c");
	assert_string_equal(c.layers[0].state, "state-2"); /* the latest state file is kept */
	assert_int_equal(c.layers[0].present, FX_PAGES);
	assert_int_equal(c.layers[0].stored, FX_PAGES);
	assert_memory_equal(c.chain_id, f->c.chain_id, 16);
	/* chain.json says the same; old files stay (clones may map them), no temporary left. */
	struct chain l;
	assert_int_equal(chain_load(f->dir, &l, err, sizeof(err)), 0);
	assert_int_equal(l.nr_layers, 1);
	assert_string_equal(l.layers[0].mem, "mem-000003-c");
	assert_true(exists(f->dir, "mem-0") && exists(f->dir, "mem-1") && exists(f->dir, "mem-2"));
	assert_false(exists(f->dir, ".mem-000003-c.tmp"));
	expect_ram(f->dir, 2);
}

static void test_compact_single_layer(void **state)
{
	struct chain_fx *f = *state;
	char err[512] = "";
	struct chain c = f->c;
	c.nr_layers = 1;
	assert_int_equal(chain_compact(&c, err, sizeof(err)), 0);
	assert_int_equal(c.nr_layers, 1);
	assert_string_equal(c.layers[0].mem, "mem-0");
}

/* A bad increment: compaction fails with one line, chain.json and *c stay as they were. */
static void test_compact_bad_layer(void **state)
{
	struct chain_fx *f = *state;
	fx_write_layer(&f->c, 2, 1); /* chain.json says parent 2 */
	char err[512] = "";
	struct chain c = f->c;
	assert_int_equal(chain_compact(&c, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "mem-2"));
	assert_null(strchr(err, '\n'));
	assert_int_equal(c.nr_layers, 3);
	struct chain l;
	assert_int_equal(chain_load(f->dir, &l, err, sizeof(err)), 0);
	assert_int_equal(l.nr_layers, 3);
	assert_false(exists(f->dir, "mem-000003-c"));
	assert_false(exists(f->dir, ".mem-000003-c.tmp"));
}

/*
 * The rules the jailed VMM's event loop gets after set-up (issue 27), as a seccomp filter of
 * our own: files are opened read-only, or created new (O_CREAT|O_EXCL) beneath a directory
 * fd; renameat2 only with RENAME_NOREPLACE; unlink, unlinkat, rename, renameat, link, linkat,
 * fchmod and fchmodat answer EPERM.
 */
static int install_commit_rules(void)
{
#define LD_NR	  BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, nr))
#define LD_ARG(i) BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, args[i]))
#define DENY	  BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | EPERM)
#define ALLOW	  BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW)
	struct sock_filter f[] = {
	    BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(struct seccomp_data, arch)),
	    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, AUDIT_ARCH_X86_64, 1, 0),
	    ALLOW,
	    LD_NR,
	    /* 4 */ BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_renameat2, 11, 0),
	    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_openat, 14, 0),
	    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_unlink, 8, 0),
	    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_unlinkat, 7, 0),
	    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_rename, 6, 0),
	    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_renameat, 5, 0),
	    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_link, 4, 0),
	    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_linkat, 3, 0),
	    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_fchmod, 2, 0),
	    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, __NR_fchmodat, 1, 0),
	    /* 14 */ ALLOW,
	    /* 15 */ DENY,
	    /* 16: renameat2 */ LD_ARG(4),
	    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, RENAME_NOREPLACE, 0, 1),
	    ALLOW,
	    DENY,
	    /* 20: openat */ LD_ARG(2),
	    BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, O_CREAT, 3, 0),
	    BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, O_ACCMODE, 1, 0),
	    ALLOW,
	    DENY,
	    /* 25: creating */ BPF_JUMP(BPF_JMP | BPF_JSET | BPF_K, O_EXCL, 1, 0),
	    DENY,
	    LD_ARG(0),
	    BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, (uint32_t)AT_FDCWD, 0, 1),
	    DENY,
	    ALLOW,
	};
	struct sock_fprog prog = {.len = sizeof(f) / sizeof(f[0]), .filter = f};
	if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0))
		return -errno;
	return syscall(__NR_seccomp, SECCOMP_SET_MODE_FILTER, 0, &prog) ? -errno : 0;
}

/* Runs fn in a child under the commit rules: its exit status (0: all went well). */
static int under_rules(int (*fn)(struct chain_fx *), struct chain_fx *f)
{
	fflush(NULL);
	pid_t pid = fork();
	assert_true(pid >= 0);
	if (pid == 0) {
		if (install_commit_rules())
			_exit(90);
		/* The rules hold: replacing and unlinking are refused. */
		char p[200];
		snprintf(p, sizeof(p), "%s/mem-0", f->dir);
		if (unlink(p) == 0 || errno != EPERM)
			_exit(91);
		if (open(p, O_WRONLY) >= 0 || errno != EPERM)
			_exit(92);
		_exit(fn(f));
	}
	int st = 0;
	assert_int_equal(waitpid(pid, &st, 0), pid);
	assert_true(WIFEXITED(st));
	return WEXITSTATUS(st);
}

static void put_seq(const char *dir, uint64_t next)
{
	uint8_t b[12];
	put_le64(b, next);
	put_le32(b + 8, crc32_update(0, b, 8));
	char p[200];
	snprintf(p, sizeof(p), "%s/layer-seq", dir);
	fx_write(p, b, sizeof(b), 0, true);
}

/* In the jail: a snapshot's files, three generations, a compaction and layer ids. */
static int jailed_commits(struct chain_fx *f)
{
	char err[512];
	struct chain *c = malloc(sizeof(*c));
	if (!c || chain_load(f->dir, c, err, sizeof(err))) {
		fprintf(stderr, "jailed: %s\n", err);
		return 1;
	}
	int dfd = dirfd_open_dir(f->dir, false, err, sizeof(err));
	if (dfd < 0)
		return 2;
	/* A layer file as take_commit makes it: fresh temporary, then no-replace rename. */
	char tmp[128];
	int fd = dirfd_create_tmp(dfd, "state-000004", tmp, sizeof(tmp), O_WRONLY, 0600);
	if (fd < 0 || write(fd, "s4", 2) != 2)
		return 3;
	close(fd);
	if (dirfd_rename_noreplace(dfd, tmp, "state-000004"))
		return 4;
	/* A name that exists cannot be replaced; the temporary stays (EPERM on unlink). */
	fd = dirfd_create_tmp(dfd, "state-000004", tmp, sizeof(tmp), O_WRONLY, 0600);
	if (fd < 0)
		return 5;
	close(fd);
	if (dirfd_rename_noreplace(dfd, tmp, "state-000004") != -EEXIST)
		return 6;
	if (dirfd_unlink(dfd, tmp) != -EPERM)
		return 7;
	close(dfd);
	c->layers[2].state[0] = 0;
	snprintf(c->layers[2].state, sizeof(c->layers[2].state), "state-2");
	for (int i = 0; i < 3; i++)
		if (chain_commit(c, err, sizeof(err)))
			return 10 + i;
	if (c->gen != 4)
		return 14;
	/* Compaction: a new layer, a new generation; the old files stay for chain_settle. */
	if (chain_compact(c, err, sizeof(err)) || c->nr_layers != 1 || c->gen != 5)
		return 20;
	/* Layer ids of an encrypted chain: create-only steps where layer-seq cannot be replaced. */
	uint64_t id = 0;
	for (uint64_t want = 5; want < 8; want++)
		if (keyfile_next_layer_id(f->dir, &id, err, sizeof(err)) || id != want)
			return 30;
	free(c);
	return 0;
}

static void test_commit_under_jail_rules(void **state)
{
	struct chain_fx *f = *state;
	char err[512];
	put_seq(f->dir, 5);
	int r = under_rules(jailed_commits, f);
	if (r)
		fail_msg("the jailed commits failed at step %d", r);
	/* The newest generation is the compacted chain; nothing was removed in the jail. */
	struct chain *c = malloc(sizeof(*c));
	assert_non_null(c);
	assert_int_equal(chain_load(f->dir, c, err, sizeof(err)), 0);
	assert_string_equal(c->source, "chain.0000000005.json");
	assert_int_equal(c->nr_layers, 1);
	assert_string_equal(c->layers[0].mem, "mem-000003-c");
	assert_true(exists(f->dir, "mem-0") && exists(f->dir, "mem-1") && exists(f->dir, "mem-2"));
	assert_true(exists(f->dir, "layer-seq.00000000000000000008"));
	expect_ram(f->dir, 2);
	/* Host side: settle folds it all into chain.json and removes what the jail could not. */
	assert_int_equal(chain_settle(f->dir, err, sizeof(err)), 0);
	assert_int_equal(chain_load(f->dir, c, err, sizeof(err)), 0);
	assert_string_equal(c->source, CHAIN_FILE);
	assert_int_equal(c->gen, 5);
	assert_false(exists(f->dir, "chain.0000000005.json"));
	assert_false(exists(f->dir, "mem-0") || exists(f->dir, "mem-1") || exists(f->dir, "mem-2"));
	assert_false(exists(f->dir, "state-0") || exists(f->dir, "state-1") ||
		     exists(f->dir, "state-000004"));
	assert_true(exists(f->dir, "mem-000003-c") && exists(f->dir, "state-2"));
	assert_false(exists(f->dir, "layer-seq.00000000000000000008"));
	DIR *d = opendir(f->dir);
	assert_non_null(d);
	struct dirent *e;
	while ((e = readdir(d)))
		if (e->d_name[0] == '.' && strcmp(e->d_name, ".") && strcmp(e->d_name, ".."))
			fail_msg("%s left after settle", e->d_name);
	closedir(d);
	uint64_t id;
	assert_int_equal(keyfile_next_layer_id(f->dir, &id, err, sizeof(err)), 0);
	assert_int_equal(id, 8);
	/* A temporary file of a later id (a write that died) still shows a rolled-back counter. */
	assert_int_equal(keyfile_name_layer_id(".mem-000012.4242-0a1b2c3d.tmp", &id), 1);
	assert_int_equal(id, 12);
	assert_int_equal(keyfile_name_layer_id(".state-000012.4242-0a1b2c3.tmp", &id), 0);
	char p[200];
	snprintf(p, sizeof(p), "%s/.mem-000012.4242-0a1b2c3d.tmp", f->dir);
	fx_write(p, "x", 1, 0, true);
	assert_int_equal(keyfile_next_layer_id(f->dir, &id, err, sizeof(err)), -ESTALE);
	expect_ram(f->dir, 2);
	free(c);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_compact_chain, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_compact_single_layer, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_compact_bad_layer, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_commit_under_jail_rules, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
