/* lifecycle/template.c and the spec's machine id: template names, template.json (round trip and
 * refusals), the templates' root beside the sandboxes', machine ids in spec.json, and the guest
 * part of a new spec (kernel, root, hostname in the command line). Real files. */
#include "helpers.h"

#include <fcntl.h>
#include <sys/stat.h>

#include "file_helpers.h"
#include "lifecycle/image_files.h"
#include "lifecycle/root.h"
#include "lifecycle/spec.h"
#include "lifecycle/template.h"
#include "lifecycle/warm.h"

static void test_names(void **state)
{
	static const char *const good[] = {"a", "0", "py-tools", "x-",
					   "abcdefghijklmnopqrstuvwxyz012345"};
	static const char *const bad[] = {
	    "",	   "-a", "A",	       "a_b", "a.b",
	    "a/b", "..", ".templates", "a b", "abcdefghijklmnopqrstuvwxyz0123456"}; /* 33 */
	char err[256];

	(void)state;
	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++)
		assert_int_equal(tpl_name_check(good[i], err, sizeof(err)), 0);
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		err[0] = '\0';
		assert_int_equal(tpl_name_check(bad[i], err, sizeof(err)), -EINVAL);
		assert_one_line_error(err, "template name");
	}
	assert_int_equal(tpl_name_check(NULL, err, sizeof(err)), -EINVAL);
}

static void test_meta_round_trip(void **state)
{
	struct tpl_meta a = {.created_ms = 1764547200000LL, .build_ms = 6123}, b;
	char err[256], *text;

	(void)state;
	strcpy(a.name, "py");
	strcpy(a.run, "pip install \"x y\" && echo 'ok'\n");
	text = tpl_meta_format(&a);
	assert_non_null(text);
	assert_int_equal(tpl_meta_parse(text, strlen(text), &b, err, sizeof(err)), 0);
	assert_memory_equal(&a, &b, sizeof(a));
	free(text);

	static const char *const bad[] = {
	    "",
	    "not json",
	    "[]",
	    "{\"version\":2,\"name\":\"py\",\"created_ms\":1,\"build_ms\":1,\"run\":\"\"}",
	    "{\"version\":1,\"name\":\"Py\",\"created_ms\":1,\"build_ms\":1,\"run\":\"\"}",
	    "{\"version\":1,\"name\":\"py\",\"created_ms\":-1,\"build_ms\":1,\"run\":\"\"}",
	    "{\"version\":1,\"name\":\"py\",\"created_ms\":1,\"build_ms\":\"1\",\"run\":\"\"}",
	    "{\"version\":1,\"name\":\"py\",\"created_ms\":1,\"build_ms\":1}",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		err[0] = '\0';
		assert_int_equal(tpl_meta_parse(bad[i], strlen(bad[i]), &b, err, sizeof(err)),
				 -EINVAL);
		assert_one_line_error(err, TPL_META);
	}
}

static void test_root_and_meta_files(void **state)
{
	struct sbx_root r, t;
	struct tpl_meta a = {.created_ms = 5, .build_ms = 7}, b;
	char dir[64] = "/tmp/cove-tpl-XXXXXX", err[256], cmd[128];
	int dfd;

	(void)state;
	assert_non_null(mkdtemp(dir));
	setenv("COVE_STATE_DIR", dir, 1);
	setenv("COVE_RUN_DIR", "/tmp/cove-tpl-run", 1);
	assert_int_equal(sbx_root_open(&r, false, err, sizeof(err)), 0);
	assert_false(r.templates);
	/* None yet: not made without `create`. */
	assert_int_equal(tpl_root_open(&r, &t, false, err, sizeof(err)), -ENOENT);
	assert_one_line_error(err, "no templates");
	assert_int_equal(tpl_root_open(&r, &t, true, err, sizeof(err)), 0);
	assert_true(t.templates);
	snprintf(cmd, sizeof(cmd), "%s/%s", dir, TPL_DIR);
	assert_string_equal(t.state, cmd);
	assert_string_equal(t.run, "/tmp/cove-tpl-run/" TPL_RUN_DIR);
	/* A template's sockets still fit a sun_path with the longest name. */
	char sock[128];
	assert_int_equal(sbx_run_path(&t, "abcdefghijklmnopqrstuvwxyz012345",
				      "vsock.sock_4294967295", sock, sizeof(sock)),
			 0);
	assert_true(strlen(sock) < 108);

	dfd = sbx_dir_open(&t, "py", true, err, sizeof(err));
	assert_true(dfd >= 0);
	/* Not saved until template.json is there. */
	assert_int_equal(tpl_meta_read(dfd, &b, err, sizeof(err)), -ENOENT);
	assert_one_line_error(err, "not saved");
	strcpy(a.name, "py");
	assert_int_equal(tpl_meta_write(dfd, &a), 0);
	assert_int_equal(tpl_meta_read(dfd, &b, err, sizeof(err)), 0);
	assert_memory_equal(&a, &b, sizeof(a));
	/* A link in its place is not followed. */
	assert_int_equal(unlinkat(dfd, TPL_META, 0), 0);
	assert_int_equal(symlinkat("/etc/passwd", dfd, TPL_META), 0);
	assert_true(tpl_meta_read(dfd, &b, err, sizeof(err)) < 0);
	close(dfd);
	sbx_root_close(&t);
	sbx_root_close(&r);
	snprintf(cmd, sizeof(cmd), "rm -rf %s", dir);
	assert_int_equal(system(cmd), 0);
}

static void test_machine_ids(void **state)
{
	struct sbx_spec *a = calloc(1, sizeof(*a)), *b = calloc(1, sizeof(*b));
	char dir[64] = "/tmp/cove-mid-XXXXXX", err[256], path[128];
	int dfd;

	(void)state;
	assert_true(sbx_machine_id_valid("0123456789abcdef0123456789abcdef"));
	assert_false(sbx_machine_id_valid("00000000000000000000000000000000"));
	assert_false(sbx_machine_id_valid("0123456789ABCDEF0123456789abcdef"));
	assert_false(sbx_machine_id_valid("0123456789abcdef0123456789abcde"));
	assert_false(sbx_machine_id_valid("0123456789abcdef0123456789abcdef0"));
	assert_false(sbx_machine_id_valid(""));
	assert_int_equal(sbx_spec_new_machine_id(a), 0);
	assert_true(sbx_machine_id_valid(a->machine_id));
	assert_int_equal(sbx_spec_new_machine_id(b), 0);
	assert_string_not_equal(a->machine_id, b->machine_id);

	assert_non_null(mkdtemp(dir));
	dfd = open(dir, O_RDONLY | O_DIRECTORY);
	assert_true(dfd >= 0);
	strcpy(a->kernel, "/k");
	a->mem_bytes = 1 << 20;
	a->vcpus = 1;
	assert_int_equal(sbx_spec_write(dfd, a), 0);
	assert_int_equal(sbx_spec_read(dfd, b, err, sizeof(err)), 0);
	assert_memory_equal(a, b, sizeof(*a));
	/* A spec from before machine ids has none: the guest keeps its own. */
	a->machine_id[0] = '\0';
	assert_int_equal(sbx_spec_write(dfd, a), 0);
	assert_int_equal(sbx_spec_read(dfd, b, err, sizeof(err)), 0);
	assert_string_equal(b->machine_id, "");
	/* One that is not 32 lowercase hex digits is refused. */
	static const char *const bad[] = {"\"ABCDEF0123456789abcdef0123456789\"", "\"x\"", "7",
					  "\"00000000000000000000000000000000\""};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		char text[512];

		snprintf(text, sizeof(text),
			 "{\"version\":1,\"kernel\":\"/k\",\"initrd\":\"\",\"cmdline\":\"\","
			 "\"key\":\"\",\"policy\":\"\",\"mem_bytes\":1,\"vcpus\":1,"
			 "\"snapshot_every_ms\":0,\"idle_stop_ms\":0,\"archive_after_ms\":0,"
			 "\"delete_after_ms\":0,\"created_ms\":0,\"disks\":[],\"machine_id\":%s}",
			 bad[i]);
		snprintf(path, sizeof(path), "%s/%s", dir, SBX_SPEC);
		write_file(path, text, strlen(text));
		err[0] = '\0';
		assert_int_equal(sbx_spec_read(dfd, b, err, sizeof(err)), -EINVAL);
		assert_one_line_error(err, SBX_SPEC);
	}
	close(dfd);
	snprintf(path, sizeof(path), "rm -rf %s", dir);
	assert_int_equal(system(path), 0);
	free(a);
	free(b);
}

static void test_spec_guest(void **state)
{
	struct sbx_spec *s = calloc(1, sizeof(*s));
	char err[256];

	(void)state;
	strcpy(s->kernel, "/k/bzImage");
	assert_int_equal(sbx_spec_guest(s, "py", "/img/rootfs.ext4", "", err, sizeof(err)), 0);
	assert_int_equal(s->nr_disks, 1);
	assert_string_equal(s->disks[0].path, "/img/rootfs.ext4");
	assert_true(s->disks[0].overlay);
	assert_non_null(strstr(s->cmdline, " cove.hostname=py root=/dev/vda rw "));
	memset(s, 0, sizeof(*s));
	strcpy(s->kernel, "/k/bzImage");
	assert_int_equal(sbx_spec_guest(s, "py", NULL, "/i.cpio.gz", err, sizeof(err)), 0);
	assert_int_equal(s->nr_disks, 0);
	assert_string_equal(s->initrd, "/i.cpio.gz");
	assert_null(strstr(s->cmdline, "root="));
	err[0] = '\0';
	assert_int_equal(sbx_spec_guest(s, "py", "/r", "/i", err, sizeof(err)), -EINVAL);
	assert_one_line_error(err, "one root");
	free(s);
}

/* Implicit templates: reserved names, which configurations get one, and a key that changes with
 * every input (a setting, or a rebuilt kernel / root image / VMM) and with nothing else. */
static void test_warm(void **state)
{
	char dir[] = "/tmp/cove-warm-XXXXXX", kernel[64], root[64], vmm[64], err[256];
	char *k1 = malloc(WARM_KEY_MAX), *k2 = malloc(WARM_KEY_MAX);
	char n1[WARM_NAME_LEN + 1], n2[WARM_NAME_LEN + 1];
	struct sbx_spec *s = calloc(1, sizeof(*s));
	struct timespec ts[2] = {{.tv_sec = 1000}, {.tv_sec = 2000}};

	(void)state;
	assert_non_null(k1);
	assert_non_null(k2);
	assert_non_null(s);
	assert_true(warm_name_is("warm-0123456789abcdef"));
	assert_false(warm_name_is("warm-0123456789abcde"));
	assert_false(warm_name_is("warm-0123456789abcdeF"));
	assert_false(warm_name_is("warm-0123456789abcdef0"));
	assert_false(warm_name_is("py"));
	assert_false(warm_name_is(NULL));

	assert_non_null(mkdtemp(dir));
	snprintf(kernel, sizeof(kernel), "%s/vmlinux", dir);
	snprintf(root, sizeof(root), "%s/rootfs.ext4", dir);
	snprintf(vmm, sizeof(vmm), "%s/cove-vmm", dir);
	write_file(kernel, "k", 1);
	write_file(root, "r", 1);
	write_file(vmm, "v", 1);
	snprintf(s->kernel, sizeof(s->kernel), "%s", kernel);
	snprintf(s->disks[0].path, sizeof(s->disks[0].path), "%s", root);
	s->disks[0].overlay = true;
	s->nr_disks = 1;
	s->mem_bytes = 256ULL << 20;
	s->vcpus = 1;
	assert_null(warm_ineligible(s));

	assert_int_equal(warm_key_text(s, vmm, k1, WARM_KEY_MAX, err, sizeof(err)), 0);
	assert_int_equal(warm_name_of(k1, n1, sizeof(n1)), 0);
	assert_true(warm_name_is(n1));
	/* Lifecycle settings and the name are no part of the machine. */
	s->snapshot_every_ms = 5000;
	s->idle_stop_ms = 1;
	snprintf(s->cmdline, sizeof(s->cmdline), "cove.hostname=other");
	assert_int_equal(warm_key_text(s, vmm, k2, WARM_KEY_MAX, err, sizeof(err)), 0);
	assert_string_equal(k1, k2);
	/* Each machine setting is. */
	s->mem_bytes = 512ULL << 20;
	assert_int_equal(warm_key_text(s, vmm, k2, WARM_KEY_MAX, err, sizeof(err)), 0);
	assert_string_not_equal(k1, k2);
	s->mem_bytes = 256ULL << 20;
	s->vcpus = 2;
	assert_int_equal(warm_key_text(s, vmm, k2, WARM_KEY_MAX, err, sizeof(err)), 0);
	assert_string_not_equal(k1, k2);
	s->vcpus = 1;
	/* A rebuilt root image (cove-init lives in it), kernel or VMM: a new template. */
	assert_int_equal(utimensat(AT_FDCWD, root, ts, 0), 0);
	assert_int_equal(warm_key_text(s, vmm, k2, WARM_KEY_MAX, err, sizeof(err)), 0);
	assert_string_not_equal(k1, k2);
	assert_int_equal(warm_name_of(k2, n2, sizeof(n2)), 0);
	assert_string_not_equal(n1, n2);
	strcpy(k1, k2);
	assert_int_equal(utimensat(AT_FDCWD, vmm, ts, 0), 0);
	assert_int_equal(warm_key_text(s, vmm, k2, WARM_KEY_MAX, err, sizeof(err)), 0);
	assert_string_not_equal(k1, k2);
	/* A missing input is one line, not a key. */
	unlink(kernel);
	err[0] = '\0';
	assert_int_equal(warm_key_text(s, vmm, k2, WARM_KEY_MAX, err, sizeof(err)), -ENOENT);
	assert_one_line_error(err, "kernel");

	/* Never warm: --key, --no-jail, an extra disk. */
	strcpy(s->key, "key-cmd:true");
	assert_non_null(strstr(warm_ineligible(s), "--key"));
	s->key[0] = '\0';
	s->no_jail = true;
	assert_non_null(strstr(warm_ineligible(s), "--no-jail"));
	s->no_jail = false;
	s->nr_disks = 2;
	assert_non_null(strstr(warm_ineligible(s), "--disk"));
	unlink(root);
	unlink(vmm);
	rmdir(dir);
	free(s);
	free(k1);
	free(k2);
}

/*
 * An image's sandbox (cove create --image) is warm-eligible, and its implicit template's key
 * names the image's ext4 by its identity, not its path: the create names the image cache's file
 * and the template's spec names its own hard link of it, and both must give one key (else every
 * build would prune its own template as stale). The main process's settings are in the key.
 * A clone links the image's files into its own directory and points disk 0 there.
 */
static void test_warm_image(void **state)
{
	char dir[] = "/tmp/cove-warm-img-XXXXXX", p[5][128], err[256];
	char *k1 = malloc(WARM_KEY_MAX), *k2 = malloc(WARM_KEY_MAX);
	struct sbx_spec *s = calloc(1, sizeof(*s));
	(void)state;
	assert_non_null(k1);
	assert_non_null(k2);
	assert_non_null(s);
	assert_non_null(mkdtemp(dir));
	const char *names[5] = {"vmlinux", "init.cpio.gz", "cove-vmm", "cache.ext4", "tpl"};
	for (int i = 0; i < 5; i++)
		snprintf(p[i], sizeof(p[i]), "%s/%s", dir, names[i]);
	write_file(p[0], "k", 1);
	write_file(p[1], "i", 1);
	write_file(p[2], "v", 1);
	write_file(p[3], "image", 5);
	assert_int_equal(mkdir(p[4], 0700), 0);
	snprintf(s->kernel, sizeof(s->kernel), "%s", p[0]);
	snprintf(s->initrd, sizeof(s->initrd), "%s", p[1]);
	snprintf(s->disks[0].path, sizeof(s->disks[0].path), "%s", p[3]);
	s->disks[0].overlay = true;
	s->nr_disks = 1;
	s->mem_bytes = 256ULL << 20;
	s->vcpus = 1;
	snprintf(s->cmdline, sizeof(s->cmdline),
		 "console=ttyS0 cove.hostname=a cove.root=/dev/vda cove.main=eyJhcmd2IjpbXX0=");
	assert_true(sbx_spec_is_image(s));
	assert_null(warm_ineligible(s));
	/* An initramfs with a disk of the user's own is no image: an extra disk. */
	struct sbx_spec *plain = calloc(1, sizeof(*plain));
	assert_non_null(plain);
	*plain = *s;
	snprintf(plain->cmdline, sizeof(plain->cmdline), "console=ttyS0 cove.hostname=a");
	assert_false(sbx_spec_is_image(plain));
	assert_non_null(strstr(warm_ineligible(plain), "--disk"));
	free(plain);

	assert_int_equal(warm_key_text(s, p[2], k1, WARM_KEY_MAX, err, sizeof(err)), 0);
	assert_null(strstr(k1, p[3])); /* no path for the image */
	/* The template's own hard link: the same key, and another hostname changes nothing. */
	char lnk[256];
	snprintf(lnk, sizeof(lnk), "%s/%s", p[4], SBX_IMAGE_EXT4);
	assert_int_equal(link(p[3], lnk), 0);
	snprintf(s->disks[0].path, sizeof(s->disks[0].path), "%s", lnk);
	snprintf(s->cmdline, sizeof(s->cmdline),
		 "console=ttyS0 cove.hostname=tpl cove.root=/dev/vda cove.main=eyJhcmd2IjpbXX0=");
	assert_int_equal(warm_key_text(s, p[2], k2, WARM_KEY_MAX, err, sizeof(err)), 0);
	assert_string_equal(k1, k2);
	/* Another main process (or --on-exit): another template. */
	snprintf(s->cmdline, sizeof(s->cmdline),
		 "console=ttyS0 cove.hostname=tpl cove.root=/dev/vda cove.main=eyJhcmd2IjpbMV19");
	assert_int_equal(warm_key_text(s, p[2], k2, WARM_KEY_MAX, err, sizeof(err)), 0);
	assert_string_not_equal(k1, k2);
	/* Another image (a re-import: a new file): another template. */
	snprintf(s->cmdline, sizeof(s->cmdline),
		 "console=ttyS0 cove.hostname=tpl cove.root=/dev/vda cove.main=eyJhcmd2IjpbXX0=");
	unlink(p[3]);
	write_file(p[3], "image", 5);
	snprintf(s->disks[0].path, sizeof(s->disks[0].path), "%s", p[3]);
	assert_int_equal(warm_key_text(s, p[2], k2, WARM_KEY_MAX, err, sizeof(err)), 0);
	assert_string_not_equal(k1, k2);

	/* A clone of the template (its disk 0: the template's link) into "c1": linked, repointed.
	 */
	char json[256], c1[256];
	snprintf(json, sizeof(json), "%s/%s", p[4], SBX_IMAGE_JSON);
	write_file(json, "{}", 2);
	snprintf(c1, sizeof(c1), "%s/c1", dir);
	assert_int_equal(mkdir(c1, 0700), 0);
	int sdfd = open(p[4], O_RDONLY | O_DIRECTORY), tdfd = open(c1, O_RDONLY | O_DIRECTORY);
	assert_true(sdfd >= 0 && tdfd >= 0);
	snprintf(s->disks[0].path, sizeof(s->disks[0].path), "%s", lnk);
	assert_int_equal(sbx_image_files_clone(dir, sdfd, tdfd, "c1", s, err, sizeof(err)), 0);
	char want[300];
	snprintf(want, sizeof(want), "%s/c1/%s", dir, SBX_IMAGE_EXT4);
	assert_string_equal(s->disks[0].path, want);
	struct stat a, b;
	assert_int_equal(stat(lnk, &a), 0);
	assert_int_equal(stat(want, &b), 0);
	assert_true(a.st_ino == b.st_ino && b.st_nlink == 2);
	assert_int_equal(faccessat(tdfd, SBX_IMAGE_JSON, F_OK, 0), 0);
	/* A disk that is not the source's own image.ext4 is left alone. */
	snprintf(s->disks[0].path, sizeof(s->disks[0].path), "%s", p[3]);
	assert_int_equal(sbx_image_files_clone(dir, sdfd, tdfd, "c2", s, err, sizeof(err)), 0);
	assert_string_equal(s->disks[0].path, p[3]);
	close(sdfd);
	close(tdfd);
	char cmd[400];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	assert_int_equal(system(cmd), 0);
	free(s);
	free(k1);
	free(k2);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_names),
	    cmocka_unit_test(test_meta_round_trip),
	    cmocka_unit_test(test_root_and_meta_files),
	    cmocka_unit_test(test_machine_ids),
	    cmocka_unit_test(test_spec_guest),
	    cmocka_unit_test(test_warm),
	    cmocka_unit_test(test_warm_image),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
