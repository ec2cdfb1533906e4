/* Unit tests for sandbox/options: cove run's flags, --disk specs, memory sizes. */
#include "helpers.h"
#include "sandbox/options.h"

static int parse(struct run_opts *o, char *err, size_t errlen, int argc, ...)
{
	char *argv[32];
	va_list ap;
	va_start(ap, argc);
	argv[0] = "run";
	for (int i = 1; i < argc; i++)
		argv[i] = va_arg(ap, char *);
	va_end(ap);
	argv[argc] = NULL;
	return run_opts_parse(argc, argv, o, err, errlen);
}

static void test_options_defaults(void **state)
{
	(void)state;
	struct run_opts o;
	char err[256] = "";
	assert_int_equal(parse(&o, err, sizeof(err), 3, "--kernel", "k"), 0);
	assert_string_equal(o.kernel, "k");
	assert_int_equal(o.mem_size, 256ULL << 20);
	assert_int_equal(o.vcpus, 1);
	assert_string_equal(o.cmdline, "");
	assert_null(o.api_sock);
	assert_null(o.console);
	assert_int_equal(o.log_level, LOG_WARN);
	assert_false(o.track_dirty);
	assert_int_equal(parse(&o, err, sizeof(err), 4, "--kernel", "k", "--track-dirty-pages"), 0);
	assert_true(o.track_dirty);
}

static void test_options_all(void **state)
{
	(void)state;
	struct run_opts o;
	char err[256] = "";
	assert_int_equal(parse(&o, err, sizeof(err), 17, "--kernel", "k", "--initrd", "i",
			       "--cmdline", "console=ttyS0", "--mem", "4G", "--vcpus", "4",
			       "--api-sock", "/tmp/s", "--console", "/tmp/c", "--log-level",
			       "debug"),
			 0);
	assert_string_equal(o.initrd, "i");
	assert_string_equal(o.cmdline, "console=ttyS0");
	assert_int_equal(o.mem_size, 4ULL << 30);
	assert_int_equal(o.vcpus, 4);
	assert_string_equal(o.api_sock, "/tmp/s");
	assert_string_equal(o.console, "/tmp/c");
	assert_int_equal(o.log_level, LOG_DEBUG);
	/* Parsing twice gives the same result: getopt state is reset. */
	assert_int_equal(parse(&o, err, sizeof(err), 5, "--kernel", "k2", "--vcpus", "2"), 0);
	assert_string_equal(o.kernel, "k2");
	assert_int_equal(o.vcpus, 2);
	assert_null(o.cpu_template);
	assert_int_equal(
	    parse(&o, err, sizeof(err), 5, "--kernel", "k", "--cpu-template", "baseline-v2"), 0);
	assert_string_equal(o.cpu_template, "baseline-v2");
}

static void test_options_errors(void **state)
{
	(void)state;
	struct run_opts o;
	char err[256];
	assert_int_equal(parse(&o, err, sizeof(err), 1), -EINVAL);
	assert_non_null(strstr(err, "--kernel"));
	assert_int_equal(parse(&o, err, sizeof(err), 4, "--kernel", "k", "--what"), -EINVAL);
	assert_non_null(strstr(err, "--what"));
	assert_int_equal(parse(&o, err, sizeof(err), 5, "--kernel", "k", "--mem", "12Q"), -EINVAL);
	assert_non_null(strstr(err, "12Q"));
	assert_int_equal(parse(&o, err, sizeof(err), 5, "--kernel", "k", "--mem", "1M"), -EINVAL);
	assert_int_equal(parse(&o, err, sizeof(err), 5, "--kernel", "k", "--vcpus", "65"), -EINVAL);
	assert_int_equal(parse(&o, err, sizeof(err), 5, "--kernel", "k", "--vcpus", "-1"), -EINVAL);
	assert_int_equal(parse(&o, err, sizeof(err), 5, "--kernel", "k", "--vcpus", "2x"), -EINVAL);
	assert_int_equal(parse(&o, err, sizeof(err), 5, "--kernel", "k", "--cpu-template", "T2"),
			 -EINVAL);
	assert_string_equal(err,
			    "--cpu-template: 'T2' is not a CPU template cove has (baseline-v2)");
	assert_int_equal(parse(&o, err, sizeof(err), 5, "--kernel", "k", "--log-level", "x"),
			 -EINVAL);
	assert_int_equal(parse(&o, err, sizeof(err), 2, "--kernel"), -EINVAL);
	assert_non_null(strstr(err, "needs a value"));
	assert_int_equal(parse(&o, err, sizeof(err), 4, "--kernel", "k", "extra"), -EINVAL);
	assert_non_null(strstr(err, "extra"));
	assert_int_equal(parse(&o, err, sizeof(err), 2, "--help"), 1);
	char *longline = malloc(5000);
	memset(longline, 'a', 4999);
	longline[4999] = 0;
	assert_int_equal(parse(&o, err, sizeof(err), 5, "--kernel", "k", "--cmdline", longline),
			 -EINVAL);
	free(longline);
}

static void test_options_disks(void **state)
{
	(void)state;
	struct run_opts o;
	char err[256];
	assert_int_equal(parse(&o, err, sizeof(err), 7, "--kernel", "k", "--disk", "/a/root.ext4",
			       "--disk", "b.img,ro"),
			 0);
	assert_int_equal(o.nr_disks, 2);
	assert_string_equal(o.disks[0].path, "/a/root.ext4");
	assert_false(o.disks[0].read_only);
	assert_string_equal(o.disks[1].path, "b.img");
	assert_true(o.disks[1].read_only);

	assert_int_equal(parse(&o, err, sizeof(err), 5, "--kernel", "k", "--disk", ",ro"), -EINVAL);
	assert_non_null(strstr(err, "no path"));
	assert_int_equal(parse(&o, err, sizeof(err), 5, "--kernel", "k", "--disk", ""), -EINVAL);
	assert_int_equal(parse(&o, err, sizeof(err), 5, "--kernel", "k", "--disk", "a,rw"),
			 -EINVAL);
	assert_non_null(strstr(err, "unknown option 'rw'"));
	assert_int_equal(parse(&o, err, sizeof(err), 5, "--kernel", "k", "--disk", "a,ro,"),
			 -EINVAL);
	assert_int_equal(parse(&o, err, sizeof(err), 5, "--kernel", "k", "--disk", "a,roo"),
			 -EINVAL);
	assert_int_equal(parse(&o, err, sizeof(err), 5, "--kernel", "k", "--disk", "a,overlay=b"),
			 0);
	assert_string_equal(o.disks[0].path, "a");
	assert_string_equal(o.disks[0].overlay, "b");
	assert_false(o.disks[0].read_only);
	assert_int_equal(parse(&o, err, sizeof(err), 5, "--kernel", "k", "--disk", "a,overlay="),
			 -EINVAL);
	assert_non_null(strstr(err, "needs a path"));
	assert_int_equal(
	    parse(&o, err, sizeof(err), 5, "--kernel", "k", "--disk", "a,ro,overlay=b"), -EINVAL);
	assert_non_null(strstr(err, "do not go together"));
	assert_null(strchr(err, '\n'));

	/* At most 8. */
	char *argv[32] = {"run", "--kernel", "k"};
	int argc = 3;
	for (int i = 0; i < 9; i++) {
		argv[argc++] = "--disk";
		argv[argc++] = "d.img";
	}
	argv[argc] = NULL;
	assert_int_equal(run_opts_parse(argc, argv, &o, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "at most 8"));
	assert_int_equal(run_opts_parse(argc - 2, argv, &o, err, sizeof(err)), 0);
	assert_int_equal(o.nr_disks, 8);

	struct disk_opt d;
	char *longpath = malloc(RUN_DISK_PATH_MAX + 10);
	memset(longpath, 'p', RUN_DISK_PATH_MAX + 9);
	longpath[RUN_DISK_PATH_MAX + 9] = 0;
	assert_int_equal(parse_disk_opt(longpath, &d, err, sizeof(err)), -EINVAL);
	free(longpath);
	assert_int_equal(parse_disk_opt("x,overlay=y", &d, err, sizeof(err)), 0);
	assert_string_equal(d.overlay, "y");
	assert_int_equal(parse_disk_opt("x", &d, err, sizeof(err)), 0);
	assert_string_equal(d.overlay, "");
}

static void test_mem_size(void **state)
{
	(void)state;
	uint64_t v;
	assert_int_equal(parse_mem_size("256", &v), 0);
	assert_int_equal(v, 256ULL << 20);
	assert_int_equal(parse_mem_size("256M", &v), 0);
	assert_int_equal(v, 256ULL << 20);
	assert_int_equal(parse_mem_size("2G", &v), 0);
	assert_int_equal(v, 2ULL << 30);
	assert_int_equal(parse_mem_size("2GiB", &v), 0);
	assert_int_equal(v, 2ULL << 30);
	assert_int_equal(parse_mem_size("4096K", &v), 0);
	assert_int_equal(v, 4ULL << 20);
	assert_int_equal(parse_mem_size("8192B", &v), 0);
	assert_int_equal(v, 8192);
	assert_int_equal(parse_mem_size("", &v), -EINVAL);
	assert_int_equal(parse_mem_size("-1G", &v), -EINVAL);
	assert_int_equal(parse_mem_size("G", &v), -EINVAL);
	assert_int_equal(parse_mem_size("1GG", &v), -EINVAL);
	assert_int_equal(parse_mem_size("99999999999999999999G", &v), -EINVAL);
	assert_int_equal(parse_mem_size("99999999999G", &v), -ERANGE);
}

/* --disk rate keys and --vsock-rate: good values, bad ones refused with one line, round trip. */
static void test_options_rates(void **state)
{
	(void)state;
	struct run_opts o;
	struct disk_opt d;
	char err[256];
	assert_int_equal(parse_disk_opt("a.img,ro,bw=50M,iops=1000,burst=1G,iops-burst=20", &d, err,
					sizeof(err)),
			 0);
	assert_true(d.read_only);
	assert_int_equal(d.rate.bw, 50ULL << 20);
	assert_int_equal(d.rate.iops, 1000);
	assert_int_equal(d.rate.bw_burst, 1ULL << 30);
	assert_int_equal(d.rate.iops_burst, 20);
	/* A bare rate is bytes; the format --disk takes back gives the same limits. */
	assert_int_equal(parse_disk_opt("b,overlay=o,bw=4096", &d, err, sizeof(err)), 0);
	assert_int_equal(d.rate.bw, 4096);
	assert_int_equal(d.rate.iops, 0);
	struct rate_limit rl = {.bw = 52428800, .bw_burst = 7, .iops = 3, .iops_burst = 9};
	char fmt[128], spec[160];
	assert_int_equal(disk_rate_format(&rl, fmt, sizeof(fmt)), 0);
	assert_string_equal(fmt, ",bw=52428800,burst=7,iops=3,iops-burst=9");
	snprintf(spec, sizeof(spec), "p%s", fmt);
	assert_int_equal(parse_disk_opt(spec, &d, err, sizeof(err)), 0);
	assert_memory_equal(&d.rate, &rl, sizeof(rl));
	struct rate_limit none = {0};
	assert_int_equal(disk_rate_format(&none, fmt, sizeof(fmt)), 0);
	assert_string_equal(fmt, "");
	assert_int_equal(disk_rate_format(&rl, fmt, 10), -E2BIG);

	static const char *const bad[] = {
	    "a,bw=",	  "a,bw=0",	    "a,bw=-5",	       "a,bw=5X",
	    "a,bw=2000T", "a,iops=1k",	    "a,iops=0",	       "a,iops=1000000001",
	    "a,burst=1M", "a,iops-burst=5", "a,bw=1M,burst=x", "a,bw=99999999999999999999",
	    "a,bwx=1M",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		err[0] = 0;
		if (parse_disk_opt(bad[i], &d, err, sizeof(err)) != -EINVAL)
			fail_msg("'%s' was accepted", bad[i]);
		assert_non_null(strstr(err, "--disk"));
		assert_null(strchr(err, '\n'));
	}
	assert_int_equal(parse_disk_opt("a,burst=1M", &d, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "burst= needs bw="));

	assert_int_equal(parse(&o, err, sizeof(err), 9, "--kernel", "k", "--vsock-cid", "5",
			       "--vsock-uds", "/tmp/v", "--vsock-rate", "10M"),
			 0);
	assert_int_equal(o.vsock_rate, 10ULL << 20);
	assert_int_equal(parse(&o, err, sizeof(err), 5, "--kernel", "k", "--vsock-rate", "10M"),
			 -EINVAL);
	assert_non_null(strstr(err, "--vsock-rate needs"));
	assert_int_equal(parse(&o, err, sizeof(err), 9, "--kernel", "k", "--vsock-cid", "5",
			       "--vsock-uds", "/tmp/v", "--vsock-rate", "fast"),
			 -EINVAL);
	assert_non_null(strstr(err, "--vsock-rate: 'fast' is not a rate"));
	uint64_t v;
	assert_int_equal(opt_vsock_rate("0", &v, err, sizeof(err)), -EINVAL);
	assert_int_equal(opt_vsock_rate("1", &v, err, sizeof(err)), 0);
	assert_int_equal(v, 1);
}

static void test_options_jail(void **state)
{
	(void)state;
	struct run_opts o;
	char err[256] = "";
	assert_int_equal(parse(&o, err, sizeof(err), 3, "--kernel", "k"), 0);
	assert_null(o.jail.dir);
	assert_int_equal(o.jail.uid, -1);
	assert_int_equal(parse(&o, err, sizeof(err), 17, "--kernel", "k", "--jail", "/srv/j",
			       "--uid", "1000", "--gid", "100", "--jail-mem-max", "1G",
			       "--jail-cpu-max", "150", "--jail-pids-max", "64", "--jail-nofile",
			       "512"),
			 0);
	assert_string_equal(o.jail.dir, "/srv/j");
	assert_int_equal(o.jail.uid, 1000);
	assert_int_equal(o.jail.gid, 100);
	assert_int_equal(o.jail.mem_max, 1ULL << 30);
	assert_int_equal(o.jail.cpu_max_pct, 150);
	assert_int_equal(o.jail.pids_max, 64);
	assert_int_equal(o.jail.nofile, 512);
	assert_int_equal(o.jail.fsize_max, 0);
	assert_int_equal(
	    parse(&o, err, sizeof(err), 7, "--kernel", "k", "--jail", "/j", "--uid", "1"), -EINVAL);
	assert_non_null(strstr(err, "--jail needs --uid N and --gid N"));
	assert_int_equal(parse(&o, err, sizeof(err), 9, "--kernel", "k", "--jail", "rel", "--uid",
			       "1", "--gid", "1"),
			 -EINVAL);
	assert_non_null(strstr(err, "not an absolute path"));
	assert_int_equal(parse(&o, err, sizeof(err), 5, "--kernel", "k", "--uid", "1"), -EINVAL);
	assert_non_null(strstr(err, "need --jail DIR"));
	assert_int_equal(parse(&o, err, sizeof(err), 9, "--kernel", "k", "--jail", "/j", "--uid",
			       "-1", "--gid", "1"),
			 -EINVAL);
	assert_non_null(strstr(err, "--uid: '-1' is not a number"));
	assert_int_equal(parse(&o, err, sizeof(err), 11, "--kernel", "k", "--jail", "/j", "--uid",
			       "1", "--gid", "1", "--jail-cpu-max", "0"),
			 -EINVAL);
	assert_non_null(strstr(err, "--jail-cpu-max"));
	assert_int_equal(parse(&o, err, sizeof(err), 11, "--kernel", "k", "--jail", "/j", "--uid",
			       "1", "--gid", "1", "--jail-mem-max", "12K"),
			 -EINVAL);
	assert_non_null(strstr(err, "--jail-mem-max: '12K'"));
	/* A key provider is fine: it runs in the key relay, outside the jail. */
	assert_int_equal(parse(&o, err, sizeof(err), 13, "--kernel", "k", "--jail", "/j", "--uid",
			       "1", "--gid", "1", "--snapshot-dir", "/s", "--snapshot-key",
			       "key-cmd:x"),
			 0);
	/* --jail-keep-fd: an open fd past stderr, at most four. */
	assert_int_equal(parse(&o, err, sizeof(err), 11, "--kernel", "k", "--jail", "/j", "--uid",
			       "1", "--gid", "1", "--jail-keep-fd", "2"),
			 -EINVAL);
	assert_non_null(strstr(err, "--jail-keep-fd"));
	assert_int_equal(parse(&o, err, sizeof(err), 11, "--kernel", "k", "--jail", "/j", "--uid",
			       "1", "--gid", "1", "--jail-keep-fd", "1000"),
			 -EINVAL);
	assert_string_equal(err, "--jail-keep-fd: 1000 is not an open fd");
	int fd = dup2(1, 100);
	assert_int_equal(fd, 100);
	assert_int_equal(parse(&o, err, sizeof(err), 11, "--kernel", "k", "--jail", "/j", "--uid",
			       "1", "--gid", "1", "--jail-keep-fd", "100"),
			 0);
	assert_int_equal(o.jail.nr_keep, 1);
	assert_int_equal(o.jail.keep[0], 100);
	assert_int_equal(parse(&o, err, sizeof(err), 19, "--kernel", "k", "--jail", "/j", "--uid",
			       "1", "--gid", "1", "--jail-keep-fd", "100", "--jail-keep-fd", "100",
			       "--jail-keep-fd", "100", "--jail-keep-fd", "100", "--jail-keep-fd",
			       "100"),
			 -EINVAL);
	assert_non_null(strstr(err, "at most 4"));
	close(fd);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_options_defaults), cmocka_unit_test(test_options_all),
	    cmocka_unit_test(test_options_errors),   cmocka_unit_test(test_options_disks),
	    cmocka_unit_test(test_mem_size),	     cmocka_unit_test(test_options_rates),
	    cmocka_unit_test(test_options_jail),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
