/* Unit tests for sandbox/machine_config: the machine config saved in every snapshot, round trip and
 * hostile input. */
#include <stdbool.h>

#include "helpers.h"
#include "sandbox/machine_config.h"

#define MUTATIONS 4000

static void sample_mc(struct machine_config *mc, bool vsock)
{
	memset(mc, 0, sizeof(*mc));
	mc->mem_size = 512ULL << 20;
	mc->vcpus = 4;
	mc->nr_disks = 3;
	snprintf(mc->disks[0].path, sizeof(mc->disks[0].path), "/var/lib/cove/root.img");
	snprintf(mc->disks[0].overlay, sizeof(mc->disks[0].overlay), "/run/cove/root.ovl");
	mc->disk_size[0] = 1ULL << 30;
	mc->chains[0].n = 2;
	snprintf(mc->chains[0].paths[0], sizeof(mc->chains[0].paths[0]),
		 "/srv/chain/disk0-000001-l0.ovl");
	snprintf(mc->chains[0].paths[1], sizeof(mc->chains[0].paths[1]),
		 "/srv/chain/disk0-000002.ovl");
	snprintf(mc->disks[1].path, sizeof(mc->disks[1].path), "data \"quoted\" \\ path é");
	mc->disk_size[1] = 4096;
	memset(mc->disks[2].path, 'p', RUN_DISK_PATH_MAX - 1);
	mc->disks[2].path[0] = '/';
	mc->disks[2].read_only = true;
	mc->disk_size[2] = 512;
	if (vsock) {
		mc->vsock_cid = 0xfffffffeu;
		snprintf(mc->vsock_uds, sizeof(mc->vsock_uds), "/tmp/cove-vsock.sock");
	}
}

/* The saved description names no host path: restore takes them all from its command line. */
static void test_machine_config_round_trip(void **st)
{
	(void)st;
	struct machine_config *in = malloc(sizeof(*in)), *mc = malloc(sizeof(*mc));
	assert_non_null(in);
	assert_non_null(mc);
	for (int v = 0; v < 2; v++) {
		sample_mc(in, v);
		char *j = machine_config_to_json(in);
		assert_non_null(j);
		assert_null(strstr(j, "/var/lib"));
		assert_null(strstr(j, "/run/cove"));
		assert_null(strstr(j, "/srv/chain"));
		assert_null(strstr(j, "quoted"));
		assert_null(strstr(j, "cove-vsock"));
		char err[256] = "";
		int r = machine_config_parse(j, strlen(j), mc, err, sizeof(err));
		if (r)
			fail_msg("%s", err);
		assert_int_equal(mc->mem_size, in->mem_size);
		assert_int_equal(mc->vcpus, 4);
		assert_int_equal(mc->nr_disks, 3);
		for (int i = 0; i < 3; i++) {
			assert_string_equal(mc->disks[i].path, "");
			assert_int_equal(!!mc->disks[i].overlay[0], !!in->disks[i].overlay[0]);
			assert_int_equal(mc->disks[i].read_only, in->disks[i].read_only);
			assert_int_equal(mc->disk_size[i], in->disk_size[i]);
		}
		assert_int_equal(mc->chains[0].n, 2);
		assert_string_equal(mc->chains[0].paths[0], "disk0-000001-l0.ovl");
		assert_string_equal(mc->chains[0].paths[1], "disk0-000002.ovl");
		assert_int_equal(mc->vsock_cid, in->vsock_cid);
		assert_string_equal(mc->vsock_uds, "");
		free(j);
	}
	free(mc);
	free(in);
}

/* A config with mem/vcpus and a disks array text, and an optional tail (",\"vsock\":..."). */
static char *mc_text(const char *mem, const char *vcpus, const char *disks, const char *tail)
{
	size_t n = strlen(mem) + strlen(vcpus) + strlen(disks) + strlen(tail) + 64;
	char *s = malloc(n);
	assert_non_null(s);
	snprintf(s, n, "{\"format\":2,\"mem_size\":%s,\"vcpus\":%s,\"disks\":%s%s}", mem, vcpus,
		 disks, tail);
	return s;
}

static int mc_parse(const char *text, char *err, size_t errlen)
{
	struct machine_config *mc = malloc(sizeof(*mc));
	assert_non_null(mc);
	size_t len = strlen(text);
	char *p = malloc(len ? len : 1); /* no terminating NUL: the length is all there is */
	assert_non_null(p);
	memcpy(p, text, len);
	err[0] = '\0';
	int r = machine_config_parse(p, len, mc, err, errlen);
	if (r == 0) {
		assert_true(mc->nr_disks >= 0 && mc->nr_disks <= RUN_MAX_DISKS);
		assert_true(mc->vcpus >= 1 && mc->vcpus <= 64);
		for (int i = 0; i < mc->nr_disks; i++) {
			assert_string_equal(mc->disks[i].path, "");
			assert_true(mc->disk_size[i] > 0);
			for (int k = 0; k < mc->chains[i].n; k++) {
				const char *l = mc->chains[i].paths[k];
				assert_null(strchr(l, '/'));
				assert_true(l[0] != '.' && l[0] != '\0');
			}
		}
		assert_string_equal(mc->vsock_uds, "");
	}
	free(p);
	free(mc);
	return r;
}

static void expect_mc(const char *text, int want, const char *needle)
{
	char err[256];
	int r = mc_parse(text, err, sizeof(err));
	if (r != want)
		fail_msg("%.200s: r=%d (want %d) %s", text, r, want, err);
	if (want) {
		assert_one_line_error(err, NULL);
		if (!strstr(err, needle))
			fail_msg("error \"%s\" does not mention \"%s\"", err, needle);
	}
}

static void expect_mc_free(char *text, int want, const char *needle)
{
	expect_mc(text, want, needle);
	free(text);
}

#define D1 "[{\"size\":4096,\"ro\":false,\"overlay\":false,\"layers\":[]}]"

static void test_machine_config_hostile(void **st)
{
	(void)st;
	/* Limits that hold. */
	expect_mc_free(mc_text("2097152", "1", "[]", ""), 0, NULL);
	expect_mc_free(mc_text("1099511627776", "64", D1, ""), 0, NULL);
	expect_mc_free(mc_text("268435456", "2", D1, ",\"vsock\":{\"cid\":3}"), 0, NULL);
	expect_mc_free(mc_text("268435456", "2", D1, ",\"vsock\":{\"cid\":4294967294}"), 0, NULL);

	/* Not a machine description, or one of the old format that named host paths. */
	expect_mc("", -EINVAL, "not JSON");
	expect_mc("[]", -EINVAL, "not JSON");
	expect_mc("\"x\"", -EINVAL, "not JSON");
	expect_mc("{\"format\":2,\"mem_size\":2097152,\"vcpus\":1,\"disks\":[]", -EINVAL,
		  "not JSON");
	expect_mc("{\"format\":2,\"mem_size\":2097152,\"vcpus\":1,\"disks\":[]} {}", -EINVAL,
		  "not JSON");
	expect_mc(
	    "{\"format\":2,\"mem_size\":2097152,\"mem_size\":2097152,\"vcpus\":1,\"disks\":[]}",
	    -EINVAL, "not JSON");
	expect_mc("{\"mem_size\":2097152,\"vcpus\":1,\"disks\":[{\"path\":\"/etc/shadow\",\"ro\":"
		  "false,\"overlay\":\"\"}]}",
		  -EINVAL, "format 1 is not supported");
	expect_mc("{\"format\":3,\"mem_size\":2097152,\"vcpus\":1,\"disks\":[]}", -EINVAL,
		  "format 3 is not supported");
	expect_mc("{\"format\":\"2\",\"mem_size\":2097152,\"vcpus\":1,\"disks\":[]}", -EINVAL,
		  "format");
	expect_mc("{\"format\":2}", -EINVAL, "lacks");
	expect_mc("{\"format\":2,\"vcpus\":1,\"disks\":[]}", -EINVAL, "lacks");
	expect_mc("{\"format\":2,\"mem_size\":2097152,\"disks\":[]}", -EINVAL, "lacks");
	expect_mc("{\"format\":2,\"mem_size\":2097152,\"vcpus\":1}", -EINVAL, "lacks");

	/* Wrong types. */
	expect_mc_free(mc_text("\"256M\"", "1", "[]", ""), -EINVAL, "lacks");
	expect_mc_free(mc_text("268435456.0", "1", "[]", ""), -EINVAL, "lacks");
	expect_mc_free(mc_text("268435456", "true", "[]", ""), -EINVAL, "lacks");
	expect_mc_free(mc_text("268435456", "2", "{}", ""), -EINVAL, "lacks");

	/* Out of range. */
	static const char *bad_mem[] = {"0",	   "-4096",	    "1048576",
					"2097153", "1099511631872", "9223372036854775807"};
	for (size_t i = 0; i < sizeof(bad_mem) / sizeof(bad_mem[0]); i++)
		expect_mc_free(mc_text(bad_mem[i], "1", "[]", ""), -EINVAL, "out of range");
	static const char *bad_vcpus[] = {"0", "-1", "65", "4294967297"};
	for (size_t i = 0; i < sizeof(bad_vcpus) / sizeof(bad_vcpus[0]); i++)
		expect_mc_free(mc_text("268435456", bad_vcpus[i], "[]", ""), -EINVAL,
			       "out of range");

	/* Disks: too many, malformed. */
	char disks[2048];
	size_t o = 0;
	o += (size_t)snprintf(disks + o, sizeof(disks) - o, "[");
	for (int i = 0; i < RUN_MAX_DISKS; i++)
		o +=
		    (size_t)snprintf(disks + o, sizeof(disks) - o,
				     "{\"size\":512,\"ro\":true,\"overlay\":false,\"layers\":[]},");
	char *eight = strdup(disks);
	assert_non_null(eight);
	eight[strlen(eight) - 1] = ']';
	expect_mc_free(mc_text("268435456", "1", eight, ""), 0, NULL);
	free(eight);
	snprintf(disks + o, sizeof(disks) - o,
		 "{\"size\":512,\"ro\":true,\"overlay\":false,\"layers\":[]}]");
	expect_mc_free(mc_text("268435456", "1", disks, ""), -EINVAL, "out of range");

	static const char *bad_disks[] = {
	    "[1]",
	    "[[]]",
	    "[{}]",
	    "[{\"size\":512,\"ro\":false,\"layers\":[]}]",
	    "[{\"size\":512,\"overlay\":false,\"layers\":[]}]",
	    "[{\"ro\":false,\"overlay\":false,\"layers\":[]}]",
	    "[{\"size\":0,\"ro\":false,\"overlay\":false,\"layers\":[]}]",
	    "[{\"size\":-5,\"ro\":false,\"overlay\":false,\"layers\":[]}]",
	    "[{\"size\":\"512\",\"ro\":false,\"overlay\":false,\"layers\":[]}]",
	    "[{\"size\":512,\"ro\":0,\"overlay\":false,\"layers\":[]}]",
	    "[{\"size\":512,\"ro\":true,\"overlay\":true,\"layers\":[]}]",
	    "[{\"size\":512,\"ro\":false,\"overlay\":\"/x\",\"layers\":[]}]",
	    "["
	    "{\"size\":512,\"ro\":false,\"overlay\":false,\"layers\":[]},"
	    "{\"path\":\"/e\"}]",
	};
	for (size_t i = 0; i < sizeof(bad_disks) / sizeof(bad_disks[0]); i++)
		expect_mc_free(mc_text("268435456", "1", bad_disks[i], ""), -EINVAL, "malformed");
	expect_mc_free(mc_text("268435456", "1", bad_disks[12], ""), -EINVAL,
		       "disk 1 is malformed");

	/* Frozen layers: plain names inside the chain only, and only under an overlay. */
	static const char *bad_layers[] = {
	    "\"/etc/shadow\"", "\"../x.ovl\"", "\"..\"", "\".\"",      "\".mem-000001.tmp\"",
	    "\"a/b\"",	       "\"\"",	       "5",	 "\"sp ace\"",
	};
	char dj[512];
	for (size_t i = 0; i < sizeof(bad_layers) / sizeof(bad_layers[0]); i++) {
		snprintf(dj, sizeof(dj),
			 "[{\"size\":512,\"ro\":false,\"overlay\":true,\"layers\":[%s]}]",
			 bad_layers[i]);
		expect_mc_free(mc_text("268435456", "1", dj, ""), -EINVAL, "layer");
	}
	expect_mc_free(
	    mc_text("268435456", "1",
		    "[{\"size\":512,\"ro\":false,\"overlay\":false,\"layers\":[\"a.ovl\"]}]", ""),
	    -EINVAL, "bad overlay layers");
	expect_mc_free(
	    mc_text("268435456", "1",
		    "[{\"size\":512,\"ro\":false,\"overlay\":true,\"layers\":[\"a.ovl\"]}]", ""),
	    0, NULL);

	/* vsock: a CID only; a socket path in the file is refused. */
	static const char *bad_vsock[] = {
	    ",\"vsock\":5",
	    ",\"vsock\":null",
	    ",\"vsock\":[]",
	    ",\"vsock\":{}",
	    ",\"vsock\":{\"uds\":\"/s\"}",
	    ",\"vsock\":{\"cid\":3,\"uds\":\"/other/sandbox.sock\"}",
	    ",\"vsock\":{\"cid\":0}",
	    ",\"vsock\":{\"cid\":2}",
	    ",\"vsock\":{\"cid\":-1}",
	    ",\"vsock\":{\"cid\":4294967295}",
	    ",\"vsock\":{\"cid\":\"3\"}",
	    ",\"vsock\":{\"cid\":3.0}",
	};
	for (size_t i = 0; i < sizeof(bad_vsock) / sizeof(bad_vsock[0]); i++)
		expect_mc_free(mc_text("268435456", "1", "[]", bad_vsock[i]), -EINVAL, "vsock");
}

/* A CPU template goes with the chain; one this cove does not ship is refused by name. */
static void test_machine_config_cpu_template(void **st)
{
	(void)st;
	struct machine_config *in = malloc(sizeof(*in)), *mc = malloc(sizeof(*mc));
	assert_non_null(in);
	assert_non_null(mc);
	sample_mc(in, false);
	char *j = machine_config_to_json(in);
	assert_non_null(j);
	assert_null(strstr(j, "cpu_template")); /* none: written as before */
	free(j);
	snprintf(in->cpu_template, sizeof(in->cpu_template), "baseline-v2");
	j = machine_config_to_json(in);
	assert_non_null(strstr(j, "\"cpu_template\":\"baseline-v2\""));
	char err[256] = "";
	if (machine_config_parse(j, strlen(j), mc, err, sizeof(err)))
		fail_msg("%s", err);
	assert_string_equal(mc->cpu_template, "baseline-v2");
	free(j);
	free(mc);
	free(in);
	expect_mc_free(mc_text("268435456", "1", "[]", ",\"cpu_template\":\"baseline-v2\""), 0,
		       NULL);
	static const char *const bad[] = {
	    ",\"cpu_template\":\"T2\"",
	    ",\"cpu_template\":\"\"",
	    ",\"cpu_template\":7",
	    ",\"cpu_template\":\"baseline-v2 \"",
	    ",\"cpu_template\":\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		expect_mc_free(mc_text("268435456", "1", "[]", bad[i]), -EINVAL, "CPU template");
	expect_mc_free(mc_text("268435456", "1", "[]", ",\"cpu_template\":\"T2\""), -EINVAL,
		       "\"T2\" is not one this cove has (baseline-v2)");
}

/* Random changes to a valid machine description never read past it. */
static void test_machine_config_mutations(void **st)
{
	(void)st;
	struct machine_config *in = malloc(sizeof(*in));
	assert_non_null(in);
	sample_mc(in, true);
	char *j = machine_config_to_json(in);
	assert_non_null(j);
	free(in);
	const size_t len = strlen(j);
	static const char alphabet[] = "{}[]\":,.-+0123456789e/\\u \x01truefalsnl";
	char *t = malloc(len + 1);
	assert_non_null(t);
	uint64_t seed = 0x3c;
	struct mutation_tally m = {0};
	for (int it = 0; it < MUTATIONS; it++) {
		mutate_text(t, j, len, alphabet, sizeof(alphabet) - 1, &seed);
		char err[256];
		mutation_tally_add(&m, mc_parse(t, err, sizeof(err)), err);
	}
	mutation_tally_report(&m, "machine config");
	free(t);
	free(j);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_machine_config_round_trip),
	    cmocka_unit_test(test_machine_config_hostile),
	    cmocka_unit_test(test_machine_config_cpu_template),
	    cmocka_unit_test(test_machine_config_mutations),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
