/* oci/tree_digest (issue 33): a container root named by what it holds. Two trees made alike
 * (same names, bytes, modes, owners, mtimes, links) share a digest; changing any one thing a
 * disk made from the tree would show changes it. oci/root_cache: the least recently used root
 * disks beyond the bound removed. Real directories under /tmp. */
#include "helpers.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/xattr.h>
#include <time.h>

#include "file_helpers.h"
#include "image/cache.h"
#include "oci/root_cache.h"
#include "oci/tree_digest.h"

static const struct timespec FIXED[2] = {{1700000000, 5}, {1700000000, 5}};

/* DIR/rel: a file holding text, its mtime fixed. */
static void put(const char *dir, const char *rel, const char *text)
{
	char p[512];
	snprintf(p, sizeof(p), "%s/%s", dir, rel);
	write_file(p, text, strlen(text));
	assert_int_equal(utimensat(AT_FDCWD, p, FIXED, AT_SYMLINK_NOFOLLOW), 0);
}

static void fix_time(const char *dir, const char *rel)
{
	char p[512];
	snprintf(p, sizeof(p), "%s/%s", dir, rel);
	assert_int_equal(utimensat(AT_FDCWD, p, FIXED, AT_SYMLINK_NOFOLLOW), 0);
}

/* The same small root in a fresh directory: files, a subdirectory, a symlink, a hard link. */
static void make_tree(char *dir)
{
	char p[512], q[512];
	assert_non_null(mkdtemp(dir));
	snprintf(p, sizeof(p), "%s/etc", dir);
	assert_int_equal(mkdir(p, 0755), 0);
	put(dir, "etc/passwd", "root:x:0:0::/root:/bin/sh\n");
	put(dir, "big", "");
	snprintf(p, sizeof(p), "%s/big", dir);
	int fd = open(p, O_WRONLY);
	char buf[4096];
	memset(buf, 'b', sizeof(buf));
	for (int i = 0; i < 300; i++) /* 1.2 MB: more than one read */
		assert_int_equal(write(fd, buf, sizeof(buf)), (ssize_t)sizeof(buf));
	close(fd);
	fix_time(dir, "big");
	snprintf(p, sizeof(p), "%s/link", dir);
	assert_int_equal(symlink("/etc/passwd", p), 0);
	fix_time(dir, "link");
	snprintf(p, sizeof(p), "%s/etc/passwd", dir);
	snprintf(q, sizeof(q), "%s/etc/passwd-hard", dir);
	assert_int_equal(link(p, q), 0);
	fix_time(dir, "etc");
	fix_time(dir, ".");
}

static void digest(const char *dir, struct oci_tree_sum *s)
{
	char err[512] = "";
	int r = oci_tree_digest(dir, NULL, 0, s, err, sizeof(err));
	if (r)
		fail_msg("oci_tree_digest %s: %d %s", dir, r, err);
}

static void rm_tree(const char *dir)
{
	char cmd[600];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	assert_int_equal(system(cmd), 0);
}

static void test_alike(void **state)
{
	(void)state;
	char a[] = "/tmp/cove-tree-a-XXXXXX", b[] = "/tmp/cove-tree-b-XXXXXX";
	struct oci_tree_sum sa, sb;
	make_tree(a);
	make_tree(b);
	digest(a, &sa);
	digest(b, &sb);
	assert_string_equal(sa.hex, sb.hex);
	assert_int_equal(strlen(sa.hex), DIGEST_HEX);
	/* ".", etc, etc/passwd, etc/passwd-hard, big, link */
	assert_int_equal(sa.entries, 6);
	/* The hard link's bytes count once. */
	assert_int_equal(sa.file_bytes, 300 * 4096 + strlen("root:x:0:0::/root:/bin/sh\n"));
	digest(a, &sb);
	assert_string_equal(sa.hex, sb.hex);
	rm_tree(a);
	rm_tree(b);
}

/* Each change, made to a fresh copy, gives another digest. */
static void test_each_change(void **state)
{
	(void)state;
	char base[] = "/tmp/cove-tree-base-XXXXXX", p[512], q[512];
	struct oci_tree_sum s0, s;
	make_tree(base);
	digest(base, &s0);
	for (int c = 0; c < 9; c++) {
		char d[] = "/tmp/cove-tree-chg-XXXXXX";
		make_tree(d);
		const char *what = "";
		if ((c == 2 || c == 8) && geteuid() != 0) {
			print_message("not root: the owner and attribute cases are left out\n");
			rm_tree(d);
			continue;
		}
		switch (c) {
		case 0: /* one byte, same size and mtime */
			what = "a byte";
			snprintf(p, sizeof(p), "%s/big", d);
			int fd = open(p, O_WRONLY);
			assert_int_equal(pwrite(fd, "c", 1, 4097), 1);
			close(fd);
			fix_time(d, "big");
			break;
		case 1:
			what = "a mode";
			snprintf(p, sizeof(p), "%s/etc/passwd", d);
			assert_int_equal(chmod(p, 0640), 0);
			break;
		case 2:
			what = "an owner";
			snprintf(p, sizeof(p), "%s/etc/passwd", d);
			assert_int_equal(lchown(p, 1000, 1000), 0);
			break;
		case 3:
			what = "an mtime";
			snprintf(p, sizeof(p), "%s/big", d);
			assert_int_equal(utimensat(AT_FDCWD, p, NULL, 0), 0);
			break;
		case 4:
			what = "a link's target";
			snprintf(p, sizeof(p), "%s/link", d);
			assert_int_equal(unlink(p), 0);
			assert_int_equal(symlink("/etc/shadow", p), 0);
			fix_time(d, "link");
			fix_time(d, ".");
			break;
		case 5: /* a copy instead of a hard link: same bytes, another structure */
			what = "a hard link made a copy";
			snprintf(p, sizeof(p), "%s/etc/passwd-hard", d);
			assert_int_equal(unlink(p), 0);
			put(d, "etc/passwd-hard", "root:x:0:0::/root:/bin/sh\n");
			snprintf(q, sizeof(q), "%s/etc/passwd", d);
			assert_int_equal(utimensat(AT_FDCWD, q, FIXED, 0), 0);
			fix_time(d, "etc");
			break;
		case 6: /* a name moved: the same bytes elsewhere */
			what = "a rename";
			snprintf(p, sizeof(p), "%s/big", d);
			snprintf(q, sizeof(q), "%s/bih", d);
			assert_int_equal(rename(p, q), 0);
			fix_time(d, ".");
			break;
		case 7:
			what = "an empty directory added";
			snprintf(p, sizeof(p), "%s/etc/new", d);
			assert_int_equal(mkdir(p, 0755), 0);
			fix_time(d, "etc/new");
			fix_time(d, "etc");
			break;
		case 8:
			what = "an extended attribute";
			snprintf(p, sizeof(p), "%s/big", d);
			if (lsetxattr(p, "user.cove", "1", 1, 0) < 0) {
				/* this /tmp keeps no user attributes: a trusted one instead */
				assert_int_equal(lsetxattr(p, "trusted.cove", "1", 1, 0), 0);
			}
			break;
		}
		digest(d, &s);
		if (strcmp(s.hex, s0.hex) == 0)
			fail_msg("%s left the digest as it was", what);
		rm_tree(d);
	}
	rm_tree(base);
}

/* What engines change in every container's root: the mtime of a directory or a symlink, the
 * files their bind mounts replace. None changes the digest; a replaced path's type does. */
static void test_engine_changes(void **state)
{
	(void)state;
	char a[] = "/tmp/cove-tree-ea-XXXXXX", b[] = "/tmp/cove-tree-eb-XXXXXX", p[512];
	const char *replaced[] = {"/etc/hosts", "/run/.containerenv"};
	struct oci_tree_sum sa, sb;
	char err[512];
	make_tree(a);
	make_tree(b);
	put(a, "etc/hosts", "");
	put(b, "etc/hosts", "127.0.0.1 other\n");
	snprintf(p, sizeof(p), "%s/etc/hosts", b);
	assert_int_equal(chmod(p, 0600), 0);
	snprintf(p, sizeof(p), "%s/etc", b);
	assert_int_equal(utimensat(AT_FDCWD, p, NULL, 0), 0); /* now */
	snprintf(p, sizeof(p), "%s/link", b); /* podman makes /etc/mtab anew in each root */
	assert_int_equal(utimensat(AT_FDCWD, p, NULL, AT_SYMLINK_NOFOLLOW), 0);
	assert_int_equal(oci_tree_digest(a, replaced, 2, &sa, err, sizeof(err)), 0);
	assert_int_equal(oci_tree_digest(b, replaced, 2, &sb, err, sizeof(err)), 0);
	assert_string_equal(sa.hex, sb.hex);
	/* Not named as replaced: the file's bytes count. */
	assert_int_equal(oci_tree_digest(b, replaced + 1, 1, &sb, err, sizeof(err)), 0);
	assert_string_not_equal(sa.hex, sb.hex);
	/* A directory where the copied file goes: another root. */
	snprintf(p, sizeof(p), "%s/etc/hosts", b);
	assert_int_equal(unlink(p), 0);
	assert_int_equal(mkdir(p, 0755), 0);
	assert_int_equal(oci_tree_digest(b, replaced, 2, &sb, err, sizeof(err)), 0);
	assert_string_not_equal(sa.hex, sb.hex);
	rm_tree(a);
	rm_tree(b);
}

static void test_refused(void **state)
{
	(void)state;
	struct oci_tree_sum s;
	char err[512] = "";
	assert_int_equal(oci_tree_digest("/nonexistent/cove-root", NULL, 0, &s, err, sizeof(err)),
			 -ENOENT);
	assert_non_null(strstr(err, "/nonexistent/cove-root"));
	assert_null(strchr(err, '\n'));
	/* A directory it cannot read (as root: none such; skip the check there). */
	if (geteuid() != 0) {
		char d[] = "/tmp/cove-tree-nr-XXXXXX", p[512];
		make_tree(d);
		snprintf(p, sizeof(p), "%s/etc", d);
		assert_int_equal(chmod(p, 0), 0);
		assert_true(oci_tree_digest(d, NULL, 0, &s, err, sizeof(err)) < 0);
		assert_non_null(strstr(err, "etc"));
		chmod(p, 0755);
		rm_tree(d);
	}
}

/* An entry hex of the fake cache at dir, its use `age` seconds ago, named `name`. */
static void fake_entry(int cfd, const char *dir, const char *hex, const char *name, int age)
{
	char p[600], err[256];
	snprintf(p, sizeof(p), "%s/%s", dir, hex);
	assert_int_equal(mkdir(p, 0700), 0);
	snprintf(p, sizeof(p), "%s/%s/%s", dir, hex, IMAGE_EXT4);
	write_file(p, "ext4", 4);
	snprintf(p, sizeof(p), "%s/%s/%s", dir, hex, IMAGE_JSON);
	write_file(p, "{}", 2);
	struct timespec t[2] = {{time(NULL) - age, 0}, {time(NULL) - age, 0}};
	assert_int_equal(utimensat(cfd, hex, t, 0), 0);
	assert_int_equal(image_ref_set(cfd, name, hex, err, sizeof(err)), 0);
}

static bool has_ref(int cfd, const char *name)
{
	json_t *refs;
	char err[256];
	assert_int_equal(image_refs_read(cfd, &refs, err, sizeof(err)), 0);
	bool yes = json_object_get(refs, name) != NULL;
	json_decref(refs);
	return yes;
}

/* Beyond the bound the least recently used root disks go, never the spared one nor an
 * imported image. */
static void test_root_trim(void **state)
{
	(void)state;
	char dir[] = "/tmp/cove-roots-XXXXXX", hex[5][65], name[5][400], err[256];
	assert_non_null(mkdtemp(dir));
	int cfd = open(dir, O_RDONLY | O_DIRECTORY);
	assert_true(cfd >= 0);
	for (int i = 0; i < 5; i++) {
		memset(hex[i], 'a' + i, 64);
		hex[i][64] = '\0';
		if (i < 4)
			snprintf(name[i], sizeof(name[i]), "%s%s", OCI_ROOT_REF, hex[i]);
		else
			snprintf(name[i], sizeof(name[i]), "musl:latest");
		fake_entry(cfd, dir, hex[i], name[i], i == 4 ? 500 : 400 - 100 * i);
	}
	/* Oldest first: a (spared), b, c go; d stays; the imported image is no root disk. */
	assert_int_equal(oci_root_trim(cfd, 2, hex[0], err, sizeof(err)), 2);
	assert_true(has_ref(cfd, name[0]) && has_ref(cfd, name[3]) && has_ref(cfd, name[4]));
	assert_false(has_ref(cfd, name[1]) || has_ref(cfd, name[2]));
	struct stat st;
	assert_int_equal(fstatat(cfd, hex[1], &st, 0), -1);
	assert_int_equal(fstatat(cfd, hex[2], &st, 0), -1);
	assert_int_equal(fstatat(cfd, hex[3], &st, 0), 0);
	assert_int_equal(fstatat(cfd, hex[4], &st, 0), 0);
	/* Within the bound: nothing. A use makes the oldest the newest. */
	assert_int_equal(oci_root_trim(cfd, 2, NULL, err, sizeof(err)), 0);
	oci_root_touch(cfd, hex[0]);
	assert_int_equal(oci_root_trim(cfd, 1, NULL, err, sizeof(err)), 1);
	assert_true(has_ref(cfd, name[0]) && !has_ref(cfd, name[3]));
	close(cfd);
	rm_tree(dir);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_alike),	   cmocka_unit_test(test_each_change),
	    cmocka_unit_test(test_engine_changes), cmocka_unit_test(test_refused),
	    cmocka_unit_test(test_root_trim),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
