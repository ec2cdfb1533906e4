/* Unit tests of lifecycle/store/manifest.c: MAC'ed round trip; forged, tampered and hostile
 * manifests refused with one line. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>
#include <jansson.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "lifecycle/store/manifest.h"
#include "lifecycle/store/sync.h"

static const uint8_t key[32] = "0123456789abcdef0123456789abcde";

static void sample(struct store_manifest *m, struct store_file *files)
{
	memset(m, 0, sizeof(*m));
	snprintf(m->sandbox, sizeof(m->sandbox), "agent-7");
	m->generation = 12;
	m->created_ms = 1796394783000;
	m->layer = 31;
	m->mem_bytes = 512ull << 20;
	m->vcpus = 2;
	snprintf(m->cmdline, sizeof(m->cmdline), "console=ttyS0 tsc=reliable");
	m->nr_disks = 2;
	m->disks[0].overlay = true;
	m->disks[1].read_only = true;
	m->snapshot_every_ms = 60000;
	snprintf(m->key_type, sizeof(m->key_type), "pkcs11");
	snprintf(m->policy_id, sizeof(m->policy_id), "default");
	snprintf(files[0].name, sizeof(files[0].name), "mem-31");
	files[0].size = 512ull << 20;
	memset(files[0].digest, 0xab, DIGEST_LEN);
	snprintf(files[1].name, sizeof(files[1].name), "kernel");
	files[1].size = 12345;
	memset(files[1].digest, 0x01, DIGEST_LEN);
	m->files = files;
	m->nr_files = 2;
}

static void test_round_trip(void **state)
{
	(void)state;
	struct store_manifest m, back;
	struct store_file files[2];
	char err[256];
	sample(&m, files);
	char *text = store_manifest_encode(&m, key, sizeof(key), err, sizeof(err));
	assert_non_null(text);
	assert_int_equal(
	    store_manifest_decode(text, strlen(text), key, sizeof(key), &back, err, sizeof(err)),
	    0);
	assert_string_equal(back.sandbox, "agent-7");
	assert_int_equal(back.generation, 12);
	assert_int_equal(back.layer, 31);
	assert_int_equal(back.mem_bytes, 512ull << 20);
	assert_int_equal(back.vcpus, 2);
	assert_int_equal(back.nr_disks, 2);
	assert_true(back.disks[0].overlay && !back.disks[0].read_only);
	assert_true(back.disks[1].read_only && !back.disks[1].overlay);
	assert_string_equal(back.key_type, "pkcs11");
	assert_string_equal(back.policy_id, "default");
	assert_int_equal(back.nr_files, 2);
	assert_string_equal(back.files[1].name, "kernel");
	assert_memory_equal(back.files[0].digest, files[0].digest, DIGEST_LEN);
	store_manifest_free(&back);
	/* Another fleet's key: refused before any field is read. */
	uint8_t other[32];
	memcpy(other, key, 32);
	other[5] ^= 1;
	assert_int_equal(store_manifest_decode(text, strlen(text), other, sizeof(other), &back, err,
					       sizeof(err)),
			 -EBADMSG);
	assert_non_null(strstr(err, "bad MAC"));
	free(text);
}

/* Edits the manifest's JSON (then MACs it again when `remac`) and expects a refusal. */
static void expect_refused(const char *path, json_t *value, bool remac, int want, const char *says)
{
	struct store_manifest m, back;
	struct store_file files[2];
	char err[256];
	sample(&m, files);
	char *text = store_manifest_encode(&m, key, sizeof(key), err, sizeof(err));
	json_t *o = json_loads(text, 0, NULL);
	free(text);
	json_t *at = o;
	char buf[128];
	snprintf(buf, sizeof(buf), "%s", path);
	char *last = buf, *slash;
	while ((slash = strchr(last, '/'))) {
		*slash = 0;
		at = json_object_get(at, last);
		last = slash + 1;
	}
	if (json_is_array(at))
		json_object_set_new(json_array_get(at, 0), last, value);
	else
		json_object_set_new(at, last, value);
	if (remac) {
		json_object_del(o, "mac");
		/* As a host of this fleet would (it holds the key), by the documented scheme:
		 * the fields are still checked. */
		char *body = json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS | JSON_ENSURE_ASCII);
		const char *label = "cove-manifest-v1\n";
		size_t bl = strlen(body), ll = strlen(label);
		unsigned char *msg = malloc(ll + bl), mac[32];
		unsigned ml = 0;
		memcpy(msg, label, ll);
		memcpy(msg + ll, body, bl);
		assert_non_null(HMAC(EVP_sha256(), key, sizeof(key), msg, ll + bl, mac, &ml));
		char hex[65];
		for (int i = 0; i < 32; i++)
			snprintf(hex + 2 * i, 3, "%02x", mac[i]);
		json_object_set_new(o, "mac", json_string(hex));
		free(msg);
		free(body);
	}
	text = json_dumps(o, JSON_COMPACT | JSON_SORT_KEYS);
	json_decref(o);
	int r =
	    store_manifest_decode(text, strlen(text), key, sizeof(key), &back, err, sizeof(err));
	free(text);
	if (r != want || !strstr(err, says))
		fail_msg("%s: %d %s", path, r, err);
	assert_null(strchr(err, '\n'));
}

static void test_tampered(void **state)
{
	(void)state;
	/* Any change to a MAC'ed manifest: the MAC no longer holds. */
	expect_refused("generation", json_integer(13), false, -EBADMSG, "bad MAC");
	expect_refused("machine/mem_bytes", json_integer(1 << 30), false, -EBADMSG, "bad MAC");
	expect_refused("files/name", json_string("mem-30"), false, -EBADMSG, "bad MAC");
}

static void test_hostile_fields(void **state)
{
	(void)state;
	/* Correctly MAC'ed, still refused: what no manifest may carry. */
	expect_refused("kernel", json_string("/boot/vmlinuz"), true, -EINVAL,
		       "unknown field \"kernel\"");
	expect_refused("machine/kernel_path", json_string("/srv/k"), true, -EINVAL,
		       "unknown field \"kernel_path\" in machine");
	expect_refused("key_provider", json_string("key-cmd:/bin/sh -c id"), true, -EINVAL,
		       "never a command");
	expect_refused("key_cmd", json_string("/bin/sh"), true, -EINVAL, "no command");
	expect_refused("policy", json_string("/etc/cove/policy.json"), true, -EINVAL,
		       "never a path");
	expect_refused("files/name", json_string("../../etc/passwd"), true, -EINVAL,
		       "not a plain name");
	expect_refused("files/name", json_string("/var/lib/x"), true, -EINVAL, "not a plain name");
	expect_refused("files/sha256", json_string("AB"), true, -EINVAL, "64 lower-case hex");
	expect_refused("files/size", json_integer(-1), true, -EINVAL, "\"size\"");
	expect_refused("files/path", json_string("/x"), true, -EINVAL, "unknown field \"path\"");
	expect_refused("sandbox", json_string("../other"), true, -EINVAL, "");
	expect_refused("machine/vcpus", json_integer(100000), true, -EINVAL, "\"vcpus\"");
	expect_refused("machine/disks", json_string("x"), true, -EINVAL, "\"disks\"");
	expect_refused("format", json_string("cove-generation-0"), true, -EINVAL, "format");
	expect_refused("generation", json_integer(0), true, -EINVAL, "\"generation\"");
	/* Not JSON, and oversized. */
	struct store_manifest back;
	char err[256];
	assert_int_equal(
	    store_manifest_decode("{\"a\":", 6, key, sizeof(key), &back, err, sizeof(err)),
	    -EBADMSG);
	char *big = calloc(1, STORE_MANIFEST_MAX + 2);
	memset(big, ' ', STORE_MANIFEST_MAX + 1);
	assert_int_equal(store_manifest_decode(big, STORE_MANIFEST_MAX + 1, key, sizeof(key), &back,
					       err, sizeof(err)),
			 -EFBIG);
	free(big);
	assert_true(store_file_name_ok("disk0-000007-0a1b2c3d-sealed.ovl.map"));
	assert_false(store_file_name_ok(".hidden"));
	assert_false(store_file_name_ok("a/b"));
	assert_false(store_file_name_ok(""));
}

/* Store names: a sandbox's keys under sandboxes/, a template's ("@T") under templates/, both
 * checked; a template's manifest round-trips with its name, a bad one is refused. */
static void test_template_names(void **state)
{
	(void)state;
	char dir[256], err[256];
	assert_int_equal(store_name_dir("agent-7", dir, sizeof(dir), err, sizeof(err)), 0);
	assert_string_equal(dir, "sandboxes/agent-7/");
	assert_int_equal(store_name_dir("@py", dir, sizeof(dir), err, sizeof(err)), 0);
	assert_string_equal(dir, "templates/py/");
	assert_int_equal(store_name_dir("@", dir, sizeof(dir), err, sizeof(err)), -EINVAL);
	assert_int_equal(store_name_dir("@../x", dir, sizeof(dir), err, sizeof(err)), -EINVAL);
	assert_int_equal(store_name_dir("@@py", dir, sizeof(dir), err, sizeof(err)), -EINVAL);
	assert_int_equal(store_name_dir("Py", dir, sizeof(dir), err, sizeof(err)), -EINVAL);
	/* Longer than a template may be (33 characters after the mark). */
	assert_int_equal(store_name_dir("@abcdefghijklmnopqrstuvwxyz0123456", dir, sizeof(dir), err,
					sizeof(err)),
			 -EINVAL);

	struct store_manifest m, back;
	struct store_file files[2];
	sample(&m, files);
	snprintf(m.sandbox, sizeof(m.sandbox), "@py");
	char *text = store_manifest_encode(&m, key, sizeof(key), err, sizeof(err));
	assert_non_null(text);
	assert_int_equal(
	    store_manifest_decode(text, strlen(text), key, sizeof(key), &back, err, sizeof(err)),
	    0);
	assert_string_equal(back.sandbox, "@py");
	store_manifest_free(&back);
	free(text);
	snprintf(m.sandbox, sizeof(m.sandbox), "@../py");
	text = store_manifest_encode(&m, key, sizeof(key), err, sizeof(err));
	assert_non_null(text);
	assert_int_equal(
	    store_manifest_decode(text, strlen(text), key, sizeof(key), &back, err, sizeof(err)),
	    -EINVAL);
	free(text);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_round_trip),
	    cmocka_unit_test(test_tampered),
	    cmocka_unit_test(test_hostile_fields),
	    cmocka_unit_test(test_template_names),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
