/* Unit tests of snapshot/restore.c: open and validate refuse bad chains without a VM. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cmocka.h>

#include "chain_fixture.h"
#include <dirent.h>
#include <fcntl.h>

#include "snapshot/digest.h"
#include "snapshot/keyfile.h"
#include "snapshot/restore.h"
#include "vmm/vm.h"

static int setup(void **state)
{
	return fx_setup(state, "restore");
}

static int teardown(void **state)
{
	return fx_teardown(state);
}

/* Open then validate, as restore does; the error (if any) is one line naming `needle`. */
static int open_validate(const struct snap_restore_args *a, struct snap_restore *sr, char *err,
			 size_t errlen)
{
	memset(sr, 0, sizeof(*sr));
	err[0] = 0;
	int r = snap_restore_open(sr, a, err, errlen);
	if (!r)
		r = snap_restore_validate(sr, a, err, errlen);
	return r;
}

static void expect_refused(const struct snap_restore_args *a, int want, const char *needle)
{
	struct snap_restore sr;
	char err[512];
	int r = open_validate(a, &sr, err, sizeof(err));
	if (r != want || !strstr(err, needle))
		fail_msg("r=%d (want %d), err '%s' (want '%s')", r, want, err, needle);
	assert_null(strchr(err, '\n'));
	snap_restore_close(&sr);
}

static void test_good_chain(void **state)
{
	struct chain_fx *f = *state;
	struct snap_restore_args a = {.dir = f->dir};
	struct snap_restore sr;
	char err[512];
	assert_int_equal(open_validate(&a, &sr, err, sizeof(err)), 0);
	assert_int_equal(sr.idx, 2);
	assert_true(snap_restore_is_latest(&sr));
	assert_false(sr.encrypted);
	assert_non_null(sr.config);
	assert_memory_equal(sr.config->payload, "{\"fixture\":true}", 16);
	assert_int_equal(sr.ls->nr, 3);
	int fd;
	uint64_t off;
	snap_restore_ram_backing(&sr, &fd, &off);
	assert_int_equal(fd, sr.ls->layers[0].fd);
	assert_int_equal(off, sr.ls->layers[0].info.data_off);

	/* RAM as restore builds it: the base (here read, not mapped), then the increments. */
	uint8_t *ram = malloc(FX_PAGES * MEM_LAYER_PAGE);
	assert_non_null(ram);
	assert_int_equal(pread(fd, ram, FX_PAGES * MEM_LAYER_PAGE, (off_t)off),
			 FX_PAGES * MEM_LAYER_PAGE);
	struct vm vm;
	memset(&vm, 0, sizeof(vm));
	vm.mem.host = ram;
	vm.mem.size = FX_PAGES * MEM_LAYER_PAGE;
	uint64_t copied = 99;
	assert_int_equal(snap_restore_apply_ram(&sr, &vm, NULL, &copied, err, sizeof(err)), 0);
	assert_int_equal(copied, 4); /* two pages in each increment */
	for (uint64_t p = 0; p < FX_PAGES; p++) {
		assert_int_equal(ram[p * MEM_LAYER_PAGE], fx_expect(2, p));
		assert_int_equal(ram[p * MEM_LAYER_PAGE + MEM_LAYER_PAGE - 1], fx_expect(2, p));
	}
	free(ram);
	snap_restore_close(&sr);
	snap_restore_close(&sr); /* closing twice is harmless */
}

static void test_pick_layer(void **state)
{
	struct chain_fx *f = *state;
	struct snap_restore_args a = {.dir = f->dir, .layer = 2};
	struct snap_restore sr;
	char err[512];
	assert_int_equal(open_validate(&a, &sr, err, sizeof(err)), 0);
	assert_int_equal(sr.idx, 1);
	assert_false(snap_restore_is_latest(&sr));
	assert_int_equal(sr.ls->nr, 2);
	snap_restore_close(&sr);
	a.layer = 9;
	expect_refused(&a, -ENOENT, "has no layer 9");
}

static void test_no_chain(void **state)
{
	struct chain_fx *f = *state;
	char empty[80];
	snprintf(empty, sizeof(empty), "%s/none", f->dir);
	assert_int_equal(mkdir(empty, 0700), 0);
	struct snap_restore_args a = {.dir = empty};
	expect_refused(&a, -ENOENT, "no chain.json");
	rmdir(empty);
}

/* A layer whose header names another parent than chain.json is refused by validate. */
static void test_bad_parent(void **state)
{
	struct chain_fx *f = *state;
	fx_write_layer(&f->c, 2, 1); /* chain.json says parent 2 */
	struct snap_restore_args a = {.dir = f->dir};
	expect_refused(&a, -EINVAL, "parent does not match chain.json");
	/* An older layer does not need the bad one. */
	a.layer = 2;
	struct snap_restore sr;
	char err[512];
	assert_int_equal(open_validate(&a, &sr, err, sizeof(err)), 0);
	snap_restore_close(&sr);
}

/* A layer of another chain (another chain id) is refused. */
static void test_foreign_layer(void **state)
{
	struct chain_fx *f = *state;
	struct chain other = f->c;
	other.chain_id[0] ^= 1;
	fx_write_layer(&other, 1, 1);
	struct snap_restore_args a = {.dir = f->dir};
	expect_refused(&a, -EINVAL, "mem-1");
}

static void test_missing_or_short_layer(void **state)
{
	struct chain_fx *f = *state;
	char path[200];
	snprintf(path, sizeof(path), "%s/mem-1", f->dir);
	assert_int_equal(truncate(path, 8192), 0);
	struct snap_restore_args a = {.dir = f->dir};
	expect_refused(&a, -EINVAL, "mem-1");
	assert_int_equal(unlink(path), 0);
	struct snap_restore sr;
	char err[512];
	assert_int_not_equal(open_validate(&a, &sr, err, sizeof(err)), 0);
	assert_non_null(strstr(err, "mem-1"));
	snap_restore_close(&sr);
}

/* A damaged state file, or one without a machine description, is refused by open. */
static void test_bad_state(void **state)
{
	struct chain_fx *f = *state;
	char path[200];
	snprintf(path, sizeof(path), "%s/state-2", f->dir);
	uint8_t b = 0xff;
	fx_write(path, &b, 1, 40, false);
	struct snap_restore_args a = {.dir = f->dir};
	struct snap_restore sr;
	char err[512];
	memset(&sr, 0, sizeof(sr));
	assert_int_not_equal(snap_restore_open(&sr, &a, err, sizeof(err)), 0);
	assert_non_null(strstr(err, "state-2"));
	assert_null(sr.ls); /* refused before any layer is opened */
	snap_restore_close(&sr);

	/* Committed again (new digests): the parser's own refusal shows. */
	fx_write_state(&f->c, 2, true);
	f->c.nr_digests = 0;
	assert_int_equal(chain_commit(&f->c, err, sizeof(err)), 0);
	expect_refused(&a, -EINVAL, "no machine description");
	assert_int_equal(unlink(path), 0);
	memset(&sr, 0, sizeof(sr));
	assert_int_not_equal(snap_restore_open(&sr, &a, err, sizeof(err)), 0);
	snap_restore_close(&sr);
}

/* The directory's entries and their sizes and mtimes, to show a refusal changed nothing. */
static void dir_snapshot(const char *dir, char *out, size_t cap)
{
	DIR *d = opendir(dir);
	assert_non_null(d);
	struct dirent *e;
	size_t used = 0;
	out[0] = 0;
	while ((e = readdir(d))) {
		struct stat st;
		char p[300];
		if (!strcmp(e->d_name, "..")) /* the shared temp dir: other tests change it */
			continue;
		snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
		assert_int_equal(lstat(p, &st), 0);
		used += (size_t)snprintf(out + used, cap - used, "%s:%lld:%lld.%ld;", e->d_name,
					 (long long)st.st_size, (long long)st.st_mtim.tv_sec,
					 st.st_mtim.tv_nsec);
		assert_true(used < cap);
	}
	closedir(d);
}

/* One byte flipped inside the page data of a committed memory layer: refused, naming it. */
static void test_digest_page_flip(void **state)
{
	struct chain_fx *f = *state;
	char path[200], before[4096], after[4096];
	/* Page 3 of the base: its header, bitmap and CRCs are untouched. */
	snprintf(path, sizeof(path), "%s/mem-0", f->dir);
	struct mem_layer l;
	char err[512];
	assert_int_equal(mem_layer_open(&l, path, err, sizeof(err)), 0);
	off_t off = (off_t)(l.info.data_off + 3 * MEM_LAYER_PAGE + 100);
	mem_layer_close(&l);
	uint8_t b;
	int fd = open(path, O_RDWR);
	assert_true(fd >= 0);
	assert_int_equal(pread(fd, &b, 1, off), 1);
	b ^= 0x01;
	assert_int_equal(pwrite(fd, &b, 1, off), 1);
	close(fd);
	dir_snapshot(f->dir, before, sizeof(before));
	struct snap_restore_args a = {.dir = f->dir};
	expect_refused(&a, -EBADMSG, "mem-0: SHA-256 does not match the chain");
	dir_snapshot(f->dir, after, sizeof(after));
	assert_string_equal(before, after); /* nothing in the directory changed */
	/* An increment's page too. */
	b ^= 0x01;
	fx_write(path, &b, 1, off, false);
	struct snap_restore sr;
	assert_int_equal(open_validate(&a, &sr, err, sizeof(err)), 0);
	snap_restore_close(&sr);
	snprintf(path, sizeof(path), "%s/mem-2", f->dir);
	b = 0x55;
	fx_write(path, &b, 1, (off_t)(MEM_LAYER_HDR * 2 + 2 * MEM_LAYER_PAGE + 9), false);
	expect_refused(&a, -EBADMSG, "mem-2: SHA-256 does not match the chain");
	/* Restoring layer 1 does not use mem-2: it restores. */
	a.layer = 2;
	assert_int_equal(open_validate(&a, &sr, err, sizeof(err)), 0);
	snap_restore_close(&sr);
}

/* A state file rewritten with one value changed and every CRC recomputed: refused. */
static void test_digest_state_rewritten(void **state)
{
	struct chain_fx *f = *state;
	struct state_buf b;
	state_buf_init(&b);
	static const char cfg[] = "{\"fixture\":true}";
	state_put(&b, SEC_CONFIG, 0, cfg, sizeof(cfg) - 1);
	uint64_t v = 77; /* fx_write_state writes 2 here */
	state_put(&b, SEC_CONFIG + 1, 0, &v, sizeof(v));
	assert_int_equal(state_finish(&b), 0);
	char path[200], err[512];
	snprintf(path, sizeof(path), "%s/state-2", f->dir);
	fx_write(path, b.p, b.len, 0, true);
	/* It parses: only the digest tells. */
	struct state_section_ref *secs = NULL;
	size_t n = 0;
	assert_int_equal(state_parse(b.p, b.len, &secs, &n, err, sizeof(err)), 0);
	free(secs);
	state_buf_free(&b);
	struct snap_restore_args a = {.dir = f->dir};
	expect_refused(&a, -EBADMSG, "state-2: SHA-256 does not match the chain");
}

/* A chain from before digests (version 1 chain.json): one warning; the next commit adds them. */
static void test_digest_old_chain(void **state)
{
	struct chain_fx *f = *state;
	char path[200], err[512];
	snprintf(path, sizeof(path), "%s/%s", f->dir, CHAIN_FILE);
	/* chain.json as cove wrote it before: version 1, no generation, no sha256. */
	char hex[33];
	chain_id_hex(f->c.chain_id, hex);
	char text[4096];
	int len = snprintf(
	    text, sizeof(text),
	    "{\"format\":\"cove-chain\",\"version\":1,\"chain_id\":\"%s\",\"ram_size\":%llu,"
	    "\"layers\":[",
	    hex, (unsigned long long)f->c.ram_size);
	for (int i = 0; i < f->c.nr_layers; i++) {
		const struct chain_layer *l = &f->c.layers[i];
		len += snprintf(
		    text + len, sizeof(text) - (size_t)len,
		    "%s{\"id\":%llu,\"parent\":%llu,\"full\":%s,\"mem\":\"%s\",\"state\":\"%s\","
		    "\"present\":%llu,\"stored\":%llu,\"created_ns\":1}",
		    i ? "," : "", (unsigned long long)l->id, (unsigned long long)l->parent,
		    l->full ? "true" : "false", l->mem, l->state, (unsigned long long)l->present,
		    (unsigned long long)l->stored);
	}
	len += snprintf(text + len, sizeof(text) - (size_t)len, "]}");
	assert_int_equal(unlink(path), 0);
	fx_write(path, text, (size_t)len, 0, true);
	struct snap_restore_args a = {.dir = f->dir};
	struct snap_restore sr;
	assert_int_equal(open_validate(&a, &sr, err, sizeof(err)), 0);
	assert_true(sr.unverified);
	assert_false(sr.chain.has_digests);
	struct chain *next = malloc(sizeof(*next));
	assert_non_null(next);
	*next = sr.chain;
	snap_restore_close(&sr);
	/* Its next commit (here the chain as it stands) records digests for every layer. */
	assert_int_equal(chain_commit(next, err, sizeof(err)), 0);
	assert_int_equal(next->gen, 1);
	assert_int_equal(open_validate(&a, &sr, err, sizeof(err)), 0);
	assert_false(sr.unverified);
	assert_true(sr.chain.has_digests);
	assert_string_equal(sr.chain.source, "chain.0000000001.json");
	assert_int_equal(sr.chain.nr_digests, 6);
	snap_restore_close(&sr);
	free(next);
}

/* Frozen disk layers the machine description names are checked too (data and map). */
static void test_digest_disk_layers(void **state)
{
	struct chain_fx *f = *state;
	char path[200], err[512];
	static const char cfg[] = "{\"disks\":[{\"size\":4096,\"ro\":false,\"overlay\":true,"
				  "\"layers\":[\"disk0-000002.ovl\"]}]}";
	struct state_buf b;
	state_buf_init(&b);
	state_put(&b, SEC_CONFIG, 0, cfg, sizeof(cfg) - 1);
	assert_int_equal(state_finish(&b), 0);
	snprintf(path, sizeof(path), "%s/state-2", f->dir);
	fx_write(path, b.p, b.len, 0, true);
	state_buf_free(&b);
	snprintf(path, sizeof(path), "%s/disk0-000002.ovl", f->dir);
	fx_write(path, "frozen data", 11, 0, true);
	snprintf(path, sizeof(path), "%s/disk0-000002.ovl.map", f->dir);
	fx_write(path, "frozen map", 10, 0, true);
	struct snap_restore_args a = {.dir = f->dir};
	/* Committed without the disk layers' digests: a file the restore uses has none. */
	f->c.nr_digests = 0;
	assert_int_equal(chain_commit(&f->c, err, sizeof(err)), 0);
	expect_refused(&a, -EBADMSG, "disk0-000002.ovl: no SHA-256 in the chain");
	uint8_t d[32];
	int dfd = open(f->dir, O_RDONLY | O_DIRECTORY);
	assert_true(dfd >= 0);
	assert_int_equal(digest_file_at(dfd, "disk0-000002.ovl", d), 0);
	assert_int_equal(chain_digest_set(&f->c, "disk0-000002.ovl", d), 0);
	assert_int_equal(digest_file_at(dfd, "disk0-000002.ovl.map", d), 0);
	assert_int_equal(chain_digest_set(&f->c, "disk0-000002.ovl.map", d), 0);
	close(dfd);
	assert_int_equal(chain_commit(&f->c, err, sizeof(err)), 0);
	struct snap_restore sr;
	if (open_validate(&a, &sr, err, sizeof(err)))
		fail_msg("%s", err);
	snap_restore_close(&sr);
	fx_write(path, "frozen maP", 10, 0, false);
	expect_refused(&a, -EBADMSG, "disk0-000002.ovl.map: SHA-256 does not match the chain");
}

static int count_lines(const char *path)
{
	FILE *f = fopen(path, "r");
	if (!f)
		return -1;
	int n = 0, ch;
	while ((ch = fgetc(f)) != EOF)
		n += ch == '\n';
	fclose(f);
	return n;
}

/* Host side: every recorded file checked, stamps kept outside the chain; a change is caught. */
static void test_verify_stamped(void **state)
{
	struct chain_fx *f = *state;
	char stamps[128], err[512], path[200];
	snprintf(stamps, sizeof(stamps), "%s-stamps", f->dir);
	unlink(stamps);
	usleep(150 * 1000);
	assert_int_equal(chain_verify_stamped(f->dir, stamps, err, sizeof(err)), 0);
	assert_int_equal(count_lines(stamps), 6); /* mem-0..2, state-0..2 */
	/* A file changed in the last 100 ms (here: the same byte written again) is checked but
	 * not stamped: a later write could keep its coarse ctime. */
	snprintf(path, sizeof(path), "%s/state-0", f->dir);
	uint8_t same;
	int fd = open(path, O_RDWR);
	assert_true(fd >= 0);
	assert_int_equal(pread(fd, &same, 1, 0), 1);
	assert_int_equal(pwrite(fd, &same, 1, 0), 1);
	close(fd);
	assert_int_equal(chain_verify_stamped(f->dir, stamps, err, sizeof(err)), 0);
	assert_int_equal(count_lines(stamps), 5);
	/* A byte changed after the stamp: its ctime moved, it is read again and refused. */
	snprintf(path, sizeof(path), "%s/mem-1", f->dir);
	uint8_t b = 0x42;
	fx_write(path, &b, 1, (off_t)(MEM_LAYER_HDR * 2 + MEM_LAYER_PAGE + 5), false);
	assert_int_equal(chain_verify_stamped(f->dir, stamps, err, sizeof(err)), -EBADMSG);
	assert_non_null(strstr(err, "mem-1: SHA-256 does not match the chain"));
	assert_null(strchr(err, '\n'));
	assert_int_equal(count_lines(stamps), 5); /* untouched by the refusal */
	/* A hostile stamp file is only a cache: garbage lines are ignored, files still read. */
	fx_write(stamps, "../x 1 2 3 4 5 6 7 zz\ngarbage\n", 29, 0, true);
	assert_int_equal(chain_verify_stamped(f->dir, stamps, err, sizeof(err)), -EBADMSG);
	/* The VMM started after such a check (digests_checked) does not read them again. */
	struct snap_restore_args a = {.dir = f->dir, .digests_checked = true};
	struct snap_restore sr;
	assert_int_equal(open_validate(&a, &sr, err, sizeof(err)), 0);
	snap_restore_close(&sr);
	a.digests_checked = false;
	expect_refused(&a, -EBADMSG, "mem-1: SHA-256 does not match the chain");
	/* A link in place of a recorded file is refused, never followed. */
	assert_int_equal(unlink(path), 0);
	assert_int_equal(symlink("/etc/passwd", path), 0);
	assert_int_equal(chain_verify_stamped(f->dir, NULL, err, sizeof(err)), -ELOOP);
	assert_non_null(strstr(err, "a link where a chain file should be"));
	unlink(stamps);
}

/* A template's frozen stamps: a hard link (which moves every link's ctime) keeps them valid, a
 * change of content (size or mtime) does not, and a clone's check keeps them frozen. */
static void test_stamps_frozen(void **state)
{
	struct chain_fx *f = *state;
	char stamps[128], err[512], path[200], lnk[220];
	struct stat st;
	uint8_t d[32];
	snprintf(stamps, sizeof(stamps), "%s-stamps", f->dir);
	unlink(stamps);
	usleep(150 * 1000);
	assert_int_equal(chain_verify_stamped(f->dir, stamps, err, sizeof(err)), 0);
	assert_int_equal(chain_stamps_freeze(stamps), 0);
	assert_int_equal(count_lines(stamps), 6);
	snprintf(path, sizeof(path), "%s/mem-1", f->dir);
	snprintf(lnk, sizeof(lnk), "%s-link", path);
	usleep(20 * 1000);
	assert_int_equal(link(path, lnk), 0); /* what a clone does: ctime moves */
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(chain_stamped_digest(stamps, "mem-1", &st, d), 0);
	/* A check passes unread and the stamps stay frozen (a later link still matches). */
	assert_int_equal(chain_verify_stamped(f->dir, stamps, err, sizeof(err)), 0);
	assert_int_equal(count_lines(stamps), 6);
	unlink(lnk);
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(chain_stamped_digest(stamps, "mem-1", &st, d), 0);
	/* Content changed (its mtime moves): read again and refused. */
	uint8_t b = 0x42;
	fx_write(path, &b, 1, (off_t)(MEM_LAYER_HDR * 2 + MEM_LAYER_PAGE + 5), false);
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(chain_stamped_digest(stamps, "mem-1", &st, d), -ENOENT);
	assert_int_equal(chain_verify_stamped(f->dir, stamps, err, sizeof(err)), -EBADMSG);
	assert_non_null(strstr(err, "mem-1: SHA-256 does not match the chain"));
	unlink(stamps);
}

/* A keys file makes the chain encrypted: the host must name the provider, never the chain. */
static void test_encrypted_needs_key(void **state)
{
	struct chain_fx *f = *state;
	char path[200];
	snprintf(path, sizeof(path), "%s/%s", f->dir, KEYFILE_NAME);
	fx_write(path, "{}", 2, 0, true);
	struct snap_restore_args a = {.dir = f->dir};
	expect_refused(&a, -EINVAL, "give its key provider with --key");
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_good_chain, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_pick_layer, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_no_chain, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_bad_parent, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_foreign_layer, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_missing_or_short_layer, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_bad_state, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_encrypted_needs_key, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_digest_page_flip, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_digest_state_rewritten, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_digest_old_chain, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_digest_disk_layers, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_stamps_frozen, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_verify_stamped, setup, teardown),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
