/* The bounded cache of the store (issue 29): sizes, usage with hard links counted once, which
 * sandboxes may be evicted and in which order, the host's counters, and one eviction on disk. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/size_parse.h"
#include "lifecycle/cache.h"
#include "lifecycle/cache_evict.h"
#include "lifecycle/cache_scan.h"
#include "lifecycle/cache_stats.h"
#include "lifecycle/lock.h"
#include "lifecycle/tombstone.h"
#include "sandbox/event_log.h"

static void test_size_parse(void **state)
{
	(void)state;
	uint64_t v = 1;
	assert_int_equal(size_parse("0", &v), 0);
	assert_int_equal(v, 0);
	assert_int_equal(size_parse("1048576", &v), 0);
	assert_int_equal(v, 1048576);
	assert_int_equal(size_parse("512M", &v), 0);
	assert_int_equal(v, 512ULL << 20);
	assert_int_equal(size_parse("2G", &v), 0);
	assert_int_equal(v, 2ULL << 30);
	assert_int_equal(size_parse("3k", &v), 0);
	assert_int_equal(v, 3072);
	assert_int_equal(size_parse("1T", &v), 0);
	assert_int_equal(v, 1ULL << 40);
	assert_int_equal(size_parse("8388607T", &v), 0); /* 2^63 - 2^40 */
	const char *bad[] = {"",     "M",   "-1",   "+1", " 1",	  "1 ",
			     "1.5G", "1GB", "1MiB", "1P", "0x10", "1GG"};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		if (size_parse(bad[i], &v) != -EINVAL)
			fail_msg("size_parse(\"%s\") accepted", bad[i]);
	assert_int_equal(size_parse(NULL, &v), -EINVAL);
	assert_int_equal(size_parse("8388608T", &v), -ERANGE);
	assert_int_equal(size_parse("9223372036854775808", &v), -ERANGE);
	assert_int_equal(size_parse("99999999999999999999999", &v), -ERANGE);
	/* The bound: at least 1M, at most 2^60. */
	assert_int_equal(cache_max_parse("1M", &v), 0);
	assert_int_equal(cache_max_parse("1048575", &v), -ERANGE);
	assert_int_equal(cache_max_parse("0", &v), -ERANGE);
	assert_int_equal(cache_max_parse("1048576T", &v), 0);
	assert_int_equal(cache_max_parse("1048577T", &v), -ERANGE);
	assert_int_equal(cache_max_parse("2X", &v), -EINVAL);
}

static void test_account(void **state)
{
	(void)state;
	/* Sandbox 0 and its fork 1 share inode 10 (a layer linked by the fork); inode 11 is 0's
	 * alone with two names inside it; 12 has a name outside the root too; 13 lives in
	 * .images (owner -1); 14 is 1's own. */
	struct cache_file f[] = {
	    {1, 10, 2, 4096, 0}, {1, 11, 2, 8192, 0},	{1, 12, 2, 100, 1}, {1, 10, 2, 4096, 1},
	    {1, 11, 2, 8192, 0}, {1, 13, 1, 50000, -1}, {1, 14, 1, 300, 1}, {2, 10, 1, 7, 0},
	};
	uint64_t usage, freeable[2];
	cache_account(f, sizeof(f) / sizeof(f[0]), 2, &usage, freeable);
	assert_int_equal(usage, 4096 + 8192 + 100 + 50000 + 300 + 7);
	assert_int_equal(freeable[0], 8192 + 7); /* inode 11, and dev 2's inode 10 */
	assert_int_equal(freeable[1], 300);	 /* 12 is linked from elsewhere, 10 shared */
	cache_account(NULL, 0, 2, &usage, freeable);
	assert_int_equal(usage + freeable[0] + freeable[1], 0);
	/* An empty state root: no files, no sandboxes, no freeable array (UBSan: memset(NULL)). */
	usage = 1;
	cache_account(NULL, 0, 0, &usage, NULL);
	assert_int_equal(usage, 0);
}

static struct cache_cand cand(const char *name, enum sbx_state st, int64_t used, uint64_t bytes,
			      bool committed)
{
	struct cache_cand c = {
	    .state = st, .last_used_ms = used, .bytes = bytes, .committed = committed};
	snprintf(c.name, sizeof(c.name), "%s", name);
	return c;
}

static void test_keep_rules(void **state)
{
	(void)state;
	struct cache_cand c = cand("a", SBX_STOPPED, 1, 10, true);
	assert_null(cache_keep_reason(&c));
	c.state = SBX_CRASHED;
	assert_null(cache_keep_reason(&c));
	enum sbx_state never[] = {SBX_RUNNING, SBX_PAUSED, SBX_ARCHIVED, SBX_CREATING, SBX_DELETED};
	for (size_t i = 0; i < sizeof(never) / sizeof(never[0]); i++) {
		c.state = never[i];
		assert_non_null(cache_keep_reason(&c));
	}
	c = cand("a", SBX_STOPPED, 1, 10, false);
	assert_non_null(strstr(cache_keep_reason(&c), "not committed"));
	c = cand("a", SBX_STOPPED, 1, 10, true);
	c.busy = true;
	assert_non_null(strstr(cache_keep_reason(&c), "in use"));
	c = cand("a", SBX_STOPPED, 1, 10, true);
	c.audit = true;
	assert_non_null(strstr(cache_keep_reason(&c), "audit"));
	c = cand("a", SBX_STOPPED, 1, 0, true);
	assert_non_null(strstr(cache_keep_reason(&c), "frees nothing"));
}

static void test_plan(void **state)
{
	(void)state;
	struct cache_cand c[] = {
	    cand("new", SBX_STOPPED, 3000, 100, true),
	    cand("run", SBX_RUNNING, 1, 1000, true),	/* oldest of all: never */
	    cand("paused", SBX_PAUSED, 2, 1000, true),	/* never */
	    cand("dirty", SBX_STOPPED, 3, 1000, false), /* a commit not in the store */
	    cand("old", SBX_STOPPED, 1000, 100, true),
	    cand("mid", SBX_CRASHED, 2000, 100, true),
	    cand("mid2", SBX_STOPPED, 2000, 100, true), /* same time: by name, after mid */
	};
	size_t n = sizeof(c) / sizeof(c[0]), order[7];
	uint64_t after;
	/* Under the bound already: nothing. */
	assert_int_equal(cache_plan(c, n, 5000, 5000, order, &after), 0);
	assert_int_equal(after, 5000);
	/* 150 over: the least recently used frees 100, the next 100. */
	assert_int_equal(cache_plan(c, n, 5150, 5000, order, &after), 2);
	assert_string_equal(c[order[0]].name, "old");
	assert_string_equal(c[order[1]].name, "mid");
	assert_int_equal(after, 4950);
	/* Exactly 100 over: one is enough. */
	assert_int_equal(cache_plan(c, n, 5100, 5000, order, &after), 1);
	assert_string_equal(c[order[0]].name, "old");
	/* Far over: every evictable one, in order, and still over. */
	assert_int_equal(cache_plan(c, n, 10000, 10, order, &after), 4);
	const char *want[] = {"old", "mid", "mid2", "new"};
	for (int i = 0; i < 4; i++)
		assert_string_equal(c[order[i]].name, want[i]);
	assert_int_equal(after, 9600);
	/* Freeing more than the usage left never wraps. */
	assert_int_equal(cache_plan(c, n, 50, 10, order, &after), 1);
	assert_int_equal(after, 0);
	assert_int_equal(cache_plan(c, 0, 50, 10, order, &after), 0);
}

static int dir_new(char *path, size_t cap)
{
	snprintf(path, cap, "/tmp/cove-cache-XXXXXX");
	assert_non_null(mkdtemp(path));
	int dfd = open(path, O_RDONLY | O_DIRECTORY);
	assert_true(dfd >= 0);
	return dfd;
}

static void dir_rm(const char *path)
{
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf %s", path);
	assert_int_equal(system(cmd), 0);
}

static void test_stats(void **state)
{
	(void)state;
	char path[64];
	int dfd = dir_new(path, sizeof(path));
	struct cache_stats s;
	assert_int_equal(cache_stats_load(dfd, &s), 0);
	assert_int_equal(s.hits + s.misses + s.evictions + s.evicted_bytes, 0);
	/* 4 processes x 25 additions at once: none lost. */
	for (int p = 0; p < 4; p++)
		if (fork() == 0) {
			for (int i = 0; i < 25; i++)
				if (cache_stats_add(
					dfd, &(struct cache_stats){.hits = 1, .evicted_bytes = 10}))
					_exit(1);
			_exit(0);
		}
	for (int p = 0; p < 4; p++) {
		int st;
		assert_true(wait(&st) > 0);
		assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
	}
	assert_int_equal(cache_stats_add(dfd, &(struct cache_stats){.misses = 2, .evictions = 3}),
			 0);
	assert_int_equal(cache_stats_load(dfd, &s), 0);
	assert_int_equal(s.hits, 100);
	assert_int_equal(s.misses, 2);
	assert_int_equal(s.evictions, 3);
	assert_int_equal(s.evicted_bytes, 1000);
	/* Not ours: reads as zeros. */
	int fd = openat(dfd, CACHE_STATS_FILE, O_WRONLY | O_TRUNC);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, "[1,", 3), 3);
	close(fd);
	assert_int_equal(cache_stats_load(dfd, &s), 0);
	assert_int_equal(s.hits, 0);
	close(dfd);
	dir_rm(path);
}

/* A file of `kib` KiB of data (allocated blocks) beneath dfd. */
static void data_file(int dfd, const char *name, int kib)
{
	char buf[1024];
	memset(buf, 'x', sizeof(buf));
	int fd = openat(dfd, name, O_WRONLY | O_CREAT | O_EXCL, 0600);
	assert_true(fd >= 0);
	for (int i = 0; i < kib; i++)
		assert_int_equal(write(fd, buf, sizeof(buf)), sizeof(buf));
	assert_int_equal(fsync(fd), 0);
	close(fd);
}

/* Sandbox NAME beneath the root: its chain directory, a file of kib KiB, and one event. */
static int sandbox(int root, const char *name, const char *to, int kib)
{
	assert_int_equal(mkdirat(root, name, 0700), 0);
	int dfd = openat(root, name, O_RDONLY | O_DIRECTORY);
	assert_true(dfd >= 0);
	assert_int_equal(mkdirat(dfd, "chain", 0700), 0);
	int cfd = openat(dfd, "chain", O_RDONLY | O_DIRECTORY);
	data_file(cfd, "mem-1", kib);
	close(cfd);
	assert_int_equal(sbx_event_append(dfd, "running", to, "test"), 0);
	return dfd;
}

static int yes(void *arg, const char *name, int dfd, char *why, size_t whylen)
{
	(void)name, (void)dfd;
	snprintf(why, whylen, "test");
	return *(int *)arg;
}

static void test_scan_evict(void **state)
{
	(void)state;
	char path[64];
	int root = dir_new(path, sizeof(path));
	struct sbx_root r = {.dfd = root};
	snprintf(r.state, sizeof(r.state), "%s", path);
	snprintf(r.run, sizeof(r.run), "%s/.run", path);
	int a = sandbox(root, "a", "stopped", 64), b = sandbox(root, "b", "stopped", 32);
	/* b, a fork of a: a's layer hard-linked into it. */
	assert_int_equal(linkat(a, "chain/mem-1", b, "chain/mem-a", 0), 0);
	assert_int_equal(mkdirat(root, ".images", 0700), 0);
	int img = openat(root, ".images", O_RDONLY | O_DIRECTORY);
	data_file(img, "kernel", 16);
	close(img);
	struct cache_cand *c;
	size_t n;
	uint64_t usage;
	char err[300];
	assert_int_equal(cache_scan(&r, &c, &n, &usage, err, sizeof(err)), 0);
	assert_int_equal(n, 2);
	struct cache_cand *ca = !strcmp(c[0].name, "a") ? &c[0] : &c[1], *cb = ca == c ? &c[1] : c;
	assert_string_equal(cb->name, "b");
	/* The shared layer counts once in the usage, and for neither sandbox. */
	assert_true(usage >= (64 + 32 + 16) * 1024ULL && usage < (2 * 64 + 32 + 16) * 1024ULL);
	assert_true(ca->bytes < 64 * 1024ULL);
	assert_true(cb->bytes >= 32 * 1024ULL && cb->bytes < 64 * 1024ULL);
	assert_int_equal(ca->state, SBX_STOPPED);
	assert_false(ca->busy);
	assert_true(ca->last_used_ms > 0);
	free(c);
	/* A VMM holds b: busy, and never evicted. */
	int vmm = sbx_lock_take(b, SBX_LOCK_VMM, false, false);
	assert_true(vmm >= 0);
	assert_int_equal(cache_scan(&r, &c, &n, &usage, err, sizeof(err)), 0);
	assert_true(c[0].busy || c[1].busy);
	free(c);
	int ok = 0, not = 1;
	assert_int_equal(cache_evict(&r, "b", yes, &ok, err, sizeof(err)), -EBUSY);
	close(vmm);
	/* Not committed: left alone. */
	assert_int_equal(cache_evict(&r, "b", yes, &not, err, sizeof(err)), -ESTALE);
	assert_non_null(strstr(err, "test"));
	/* A broker audit log: left alone. */
	data_file(b, "audit.jsonl", 1);
	assert_int_equal(cache_evict(&r, "b", yes, &ok, err, sizeof(err)), -EBUSY);
	assert_int_equal(unlinkat(b, "audit.jsonl", 0), 0);
	/* Evicted: gone, and no tombstone; a's layer is still there. */
	assert_int_equal(cache_evict(&r, "b", yes, &ok, err, sizeof(err)), 0);
	struct stat sb;
	assert_int_equal(fstatat(root, "b", &sb, AT_SYMLINK_NOFOLLOW), -1);
	assert_int_equal(sbx_tombstone_describe(&r, "b", err, sizeof(err)), -ENOENT);
	assert_int_equal(fstatat(a, "chain/mem-1", &sb, 0), 0);
	assert_int_equal(sb.st_nlink, 1);
	/* Running (the log says so, a VMM holds it): never. */
	assert_int_equal(sbx_event_append(a, "stopped", "running", "test"), 0);
	vmm = sbx_lock_take(a, SBX_LOCK_VMM, false, false);
	assert_int_equal(cache_evict(&r, "a", yes, &ok, err, sizeof(err)), -EBUSY);
	close(vmm);
	/* Only the cache's own hidden names are left beside a and .images. */
	assert_int_equal(cache_scan(&r, &c, &n, &usage, err, sizeof(err)), 0);
	assert_int_equal(n, 1);
	free(c);
	close(a);
	close(b);
	close(root);
	dir_rm(path);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_size_parse), cmocka_unit_test(test_account),
	    cmocka_unit_test(test_keep_rules), cmocka_unit_test(test_plan),
	    cmocka_unit_test(test_stats),      cmocka_unit_test(test_scan_evict),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
