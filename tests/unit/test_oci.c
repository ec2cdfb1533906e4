/* oci/ (issue 33): OCI bundles and process objects as engines write them, and hostile ones
 * refused with one line; cove-oci's records (state.json round trip and refusals, ids, sandbox
 * names, the status from a real monitor process); signal names. Real files and processes. */
#include "helpers.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>

#include "file_helpers.h"
#include "common/rlimit_name.h"
#include "oci/bundle.h"
#include "oci/checkpoint.h"
#include "oci/host_conf.h"
#include "oci/signals.h"
#include "oci/state.h"

static void assert_one_line(const char *err, const char *needle)
{
	if (!strstr(err, needle) || strchr(err, '\n'))
		fail_msg("want one line naming '%s', got '%s'", needle, err);
}

static void test_process(void **state)
{
	struct oci_process p;
	char err[256];
	(void)state;
	/* podman's exec process file (the testbed doc's shape). */
	const char *ok = "{\"user\":{\"uid\":1000,\"gid\":100},\"args\":[\"sh\",\"-c\",\"pwd; echo "
			 "$FOO\"],\"env\":[\"PATH=/bin\",\"FOO=bar\",\"HOME=\"],\"cwd\":\"/tmp\","
			 "\"terminal\":true,\"capabilities\":{},\"rlimits\":[]}";
	assert_int_equal(oci_process_parse_text(ok, strlen(ok), &p, err, sizeof(err)), 0);
	assert_int_equal(p.nargs, 3);
	assert_string_equal(p.args[2], "pwd; echo $FOO");
	assert_null(p.args[3]);
	assert_int_equal(p.nenv, 3);
	assert_string_equal(p.env[2], "HOME=");
	assert_string_equal(p.cwd, "/tmp");
	assert_int_equal(p.uid, 1000);
	assert_int_equal(p.gid, 100);
	assert_true(p.terminal);
	oci_process_free(&p);
	/* No cwd, no user: / as root. */
	const char *min = "{\"args\":[\"true\"]}";
	assert_int_equal(oci_process_parse_text(min, strlen(min), &p, err, sizeof(err)), 0);
	assert_string_equal(p.cwd, "/");
	assert_int_equal(p.uid, 0);
	oci_process_free(&p);

	static const struct {
		const char *json, *needle;
	} bad[] = {
	    {"[]", "not an object"},
	    {"{\"args\":[]}", "args is empty"},
	    {"{}", "args is empty"},
	    {"{\"args\":[\"\"]}", "args is empty"},
	    {"{\"args\":\"sh\"}", "not an array"},
	    {"{\"args\":[\"sh\",7]}", "args[1] is not a string"},
	    {"{\"args\":[\"a\\u0000b\"]}", "NUL"},
	    {"{\"args\":[\"sh\"],\"env\":[\"NOEQUALS\"]}", "env[0] is not K=V"},
	    {"{\"args\":[\"sh\"],\"env\":[\"=x\"]}", "env[0] is not K=V"},
	    {"{\"args\":[\"sh\"],\"cwd\":\"tmp\"}", "cwd"},
	    {"{\"args\":[\"sh\"],\"user\":{\"uid\":-1}}", "user.uid"},
	    {"{\"args\":[\"sh\"],\"user\":{\"gid\":4294967296}}", "user.gid"},
	    {"{\"args\":[\"sh\"],\"user\":{\"uid\":\"0\"}}", "user.uid"},
	    {"{\"args\":[\"sh\"],\"user\":7}", "user is not an object"},
	    {"{\"args\":[\"sh\"],\"terminal\":1}", "terminal"},
	    {"{\"args\":[\"sh\"],\"args\":[\"x\"]}", "not JSON"},
	    {"{\"args\":[\"sh\"", "not JSON"},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
		err[0] = '\0';
		assert_int_not_equal(
		    oci_process_parse_text(bad[i].json, strlen(bad[i].json), &p, err, sizeof(err)),
		    0);
		assert_one_line(err, bad[i].needle);
		assert_null(p.args);
	}
	/* Too many entries, and too many bytes. */
	size_t cap = 512 << 10;
	char *big = malloc(cap);
	assert_non_null(big);
	size_t o = (size_t)snprintf(big, cap, "{\"args\":[");
	for (int i = 0; i <= OCI_ARGS_MAX; i++)
		o += (size_t)snprintf(big + o, cap - o, "%s\"a\"", i ? "," : "");
	snprintf(big + o, cap - o, "]}");
	assert_int_equal(oci_process_parse_text(big, strlen(big), &p, err, sizeof(err)), -EINVAL);
	assert_one_line(err, "more than");
	o = (size_t)snprintf(big, cap, "{\"args\":[");
	for (int i = 0; i < 300; i++) {
		o += (size_t)snprintf(big + o, cap - o, "%s\"", i ? "," : "");
		memset(big + o, 'x', 1000);
		o += 1000;
		o += (size_t)snprintf(big + o, cap - o, "\"");
	}
	snprintf(big + o, cap - o, "]}");
	assert_int_equal(oci_process_parse_text(big, strlen(big), &p, err, sizeof(err)), -EINVAL);
	assert_one_line(err, "bytes");
	free(big);
}

/* A bundle as engines write it: config.json beside rootfs/ (relative, as containerd) or an
 * absolute root.path (as podman). */
static void write_config(const char *dir, const char *json)
{
	char p[256];
	snprintf(p, sizeof(p), "%s/config.json", dir);
	unlink(p);
	write_file(p, json, strlen(json));
}

static void test_bundle(void **state)
{
	char dir[] = "/tmp/cove-oci-bundle-XXXXXX", p[256], err[512], cfg[2048];
	struct oci_bundle b;
	(void)state;
	assert_non_null(mkdtemp(dir));
	snprintf(p, sizeof(p), "%s/rootfs", dir);
	assert_int_equal(mkdir(p, 0755), 0);
	write_config(dir, "{\"ociVersion\":\"1.0.2\",\"process\":{\"args\":[\"sh\"],\"cwd\":\"/\"},"
			  "\"root\":{\"path\":\"rootfs\",\"readonly\":true},\"hostname\":\"c1\","
			  "\"annotations\":{\"cove.dev/mem\":\"512M\",\"cove.dev/vcpus\":\"2\","
			  "\"io.kubernetes.cri.container-type\":\"container\"}}");
	assert_int_equal(oci_bundle_load(dir, &b, err, sizeof(err)), 0);
	assert_string_equal(b.rootfs, p);
	assert_true(b.readonly);
	assert_string_equal(b.hostname, "c1");
	assert_int_equal(b.mem_bytes, 512ULL << 20);
	assert_int_equal(b.vcpus, 2);
	assert_string_equal(b.image, "");
	assert_string_equal(
	    json_string_value(json_object_get(b.annotations, "io.kubernetes.cri.container-type")),
	    "container");
	assert_false(b.holder);
	oci_bundle_free(&b);
	/* CRI's pod sandbox ("pause"): a holder, no VM. */
	write_config(dir, "{\"process\":{\"args\":[\"/pause\"]},\"root\":{\"path\":\"rootfs\"},"
			  "\"annotations\":{\"io.kubernetes.cri.container-type\":\"sandbox\"}}");
	assert_int_equal(oci_bundle_load(dir, &b, err, sizeof(err)), 0);
	assert_true(b.holder);
	oci_bundle_free(&b);
	snprintf(cfg, sizeof(cfg),
		 "{\"process\":{\"args\":[\"sh\"]},\"root\":{\"path\":\"%s\"},\"annotations\":"
		 "{\"cove.dev/image\":\"musl:latest\"}}",
		 p);
	write_config(dir, cfg);
	assert_int_equal(oci_bundle_load(dir, &b, err, sizeof(err)), 0);
	assert_string_equal(b.rootfs, p);
	assert_string_equal(b.image, "musl:latest");
	oci_bundle_free(&b);

	static const struct {
		const char *json, *needle;
	} bad[] = {
	    {"{\"process\":{\"args\":[\"sh\"]}}", "root.path is missing"},
	    {"{\"process\":{\"args\":[\"sh\"]},\"root\":{\"path\":\"nowhere\"}}",
	     "not a directory"},
	    {"{\"process\":{\"args\":[\"sh\"]},\"root\":{\"path\":\"config.json\"}}",
	     "not a directory"},
	    {"{\"root\":{\"path\":\"rootfs\"}}", "process is not an object"},
	    {"{\"process\":{\"args\":[\"sh\"]},\"root\":{\"path\":\"rootfs\"},\"annotations\":[]}",
	     "annotations is not an object"},
	    {"{\"process\":{\"args\":[\"sh\"]},\"root\":{\"path\":\"rootfs\"},\"annotations\":"
	     "{\"cove.dev/mem\":\"1K\"}}",
	     "cove.dev/mem"},
	    {"{\"process\":{\"args\":[\"sh\"]},\"root\":{\"path\":\"rootfs\"},\"annotations\":"
	     "{\"cove.dev/vcpus\":\"0\"}}",
	     "cove.dev/vcpus"},
	    {"{\"process\":{\"args\":[\"sh\"]},\"root\":{\"path\":\"rootfs\"},\"hostname\":"
	     "\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\"}",
	     "hostname"},
	    {"not json", "not JSON"},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
		write_config(dir, bad[i].json);
		err[0] = '\0';
		assert_int_not_equal(oci_bundle_load(dir, &b, err, sizeof(err)), 0);
		assert_one_line(err, bad[i].needle);
	}
	/* Mounts as podman and ctr write them: the guest's own are left to it, tmpfs and the
	 * engine's small files kept; a host bind mount, a device or another file system refused. */
	char hosts[256], big[256], link[256];
	snprintf(hosts, sizeof(hosts), "%s/hosts", dir);
	write_file(hosts, "127.0.0.1 localhost\n", 20);
	snprintf(
	    cfg, sizeof(cfg),
	    "{\"ociVersion\":\"1.0.2-dev\",\"process\":{\"args\":[\"sh\"]},\"root\":{\"path\":"
	    "\"rootfs\"},\"mounts\":[{\"destination\":\"/proc\",\"type\":\"proc\",\"source\":"
	    "\"proc\"},{\"destination\":\"/dev\",\"type\":\"tmpfs\",\"source\":\"tmpfs\"},"
	    "{\"destination\":\"/sys/fs/cgroup\",\"type\":\"cgroup\"},{\"destination\":"
	    "\"/dev/shm\",\"type\":\"bind\",\"source\":\"/run/x/shm\",\"options\":[\"rbind\"]},"
	    "{\"destination\":\"/"
	    "run\",\"type\":\"tmpfs\",\"options\":[\"nosuid\",\"size=65536k\"]},"
	    "{\"destination\":\"/etc/hosts\",\"type\":\"bind\",\"source\":\"%s\",\"options\":"
	    "[\"rbind\",\"ro\"]}],\"linux\":{\"devices\":[]}}",
	    hosts);
	write_config(dir, cfg);
	assert_int_equal(oci_bundle_load(dir, &b, err, sizeof(err)), 0);
	assert_int_equal(b.nmounts, 2);
	assert_string_equal(b.mounts[0].dest, "/run");
	assert_false(b.mounts[0].copy);
	assert_string_equal(b.mounts[0].size, "65536k");
	assert_string_equal(b.mounts[1].dest, "/etc/hosts");
	assert_true(b.mounts[1].copy);
	assert_string_equal(b.mounts[1].source, hosts);
	oci_bundle_free(&b);
	snprintf(big, sizeof(big), "%s/big", dir);
	int bfd = open(big, O_CREAT | O_WRONLY, 0600);
	assert_int_equal(ftruncate(bfd, OCI_COPY_MAX + 1), 0);
	close(bfd);
	snprintf(link, sizeof(link), "%s/hosts-link", dir);
	assert_int_equal(symlink(hosts, link), 0);
	static const struct {
		const char *mounts, *needle;
	} hostile[] = {
	    {"[{\"destination\":\"/x\",\"type\":\"bind\",\"source\":\"/etc\"}]",
	     "mount /x: a bind mount of the host's /etc"},
	    {"[{\"destination\":\"/data\",\"type\":\"none\",\"source\":\"/srv\",\"options\":"
	     "[\"rbind\"]}]",
	     "mount /data: a bind mount"},
	    {"[{\"destination\":\"/mnt\",\"type\":\"nfs\",\"source\":\"h:/e\"}]", "type nfs"},
	    {"[{\"destination\":\"/a/../etc\",\"type\":\"tmpfs\"}]", "destination"},
	    {"[{\"destination\":\"rel\",\"type\":\"tmpfs\"}]", "destination"},
	    {"[{\"destination\":\"/etc/hosts\",\"type\":\"bind\",\"source\":\"BIG\"}]",
	     "not a regular file of at most"},
	    {"[{\"destination\":\"/etc/hosts\",\"type\":\"bind\",\"source\":\"LINK\"}]",
	     "not a regular file of at most"},
	    {"{}", "not an array"},
	};
	for (size_t i = 0; i < sizeof(hostile) / sizeof(*hostile); i++) {
		char m[512], *at;
		snprintf(m, sizeof(m), "%s", hostile[i].mounts);
		if ((at = strstr(m, "BIG"))) {
			char tail[256];
			snprintf(tail, sizeof(tail), "%s", at + 3);
			snprintf(at, sizeof(m) - (size_t)(at - m), "%s%s", big, tail);
		}
		if ((at = strstr(m, "LINK"))) {
			char tail[256];
			snprintf(tail, sizeof(tail), "%s", at + 4);
			snprintf(at, sizeof(m) - (size_t)(at - m), "%s%s", link, tail);
		}
		snprintf(cfg, sizeof(cfg),
			 "{\"process\":{\"args\":[\"sh\"]},\"root\":{\"path\":\"rootfs\"},"
			 "\"mounts\":%s}",
			 m);
		write_config(dir, cfg);
		err[0] = '\0';
		assert_int_equal(oci_bundle_load(dir, &b, err, sizeof(err)), -EINVAL);
		assert_one_line(err, hostile[i].needle);
	}
	write_config(dir, "{\"process\":{\"args\":[\"sh\"]},\"root\":{\"path\":\"rootfs\"},"
			  "\"linux\":{\"devices\":[{\"path\":\"/dev/kvm\",\"type\":\"c\"}]}}");
	assert_int_equal(oci_bundle_load(dir, &b, err, sizeof(err)), -EINVAL);
	assert_one_line(err, "device /dev/kvm");
	write_config(dir, "{\"ociVersion\":\"2.0.0\",\"process\":{\"args\":[\"sh\"]},\"root\":"
			  "{\"path\":\"rootfs\"}}");
	assert_int_equal(oci_bundle_load(dir, &b, err, sizeof(err)), -EINVAL);
	assert_one_line(err, "ociVersion 2.0.0");
	/* config.json through a symlink is not read. */
	snprintf(p, sizeof(p), "%s/config.json", dir);
	unlink(p);
	assert_int_equal(symlink("/etc/passwd", p), 0);
	assert_int_not_equal(oci_bundle_load(dir, &b, err, sizeof(err)), 0);
	assert_one_line(err, "config.json");
	char cmd[300];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	assert_int_equal(system(cmd), 0);
}

static void test_state(void **state)
{
	char root[] = "/tmp/cove-oci-root-XXXXXX", err[512], name[32], name2[32];
	(void)state;
	assert_non_null(mkdtemp(root));
	assert_true(oci_id_ok("a3df0123"));
	assert_true(oci_id_ok("ctr_1.x-2"));
	assert_false(oci_id_ok(""));
	assert_false(oci_id_ok(".hidden"));
	assert_false(oci_id_ok("../x"));
	assert_false(oci_id_ok("a/b"));
	char longid[OCI_ID_MAX + 2];
	memset(longid, 'a', sizeof(longid) - 1);
	longid[sizeof(longid) - 1] = '\0';
	assert_false(oci_id_ok(longid));
	assert_int_equal(oci_sandbox_name("/run/a", "c1", name, sizeof(name)), 0);
	assert_int_equal(strlen(name), strlen(OCI_SANDBOX_PREFIX) + 16);
	assert_int_equal(oci_sandbox_name("/run/b", "c1", name2, sizeof(name2)), 0);
	assert_string_not_equal(name, name2); /* one id in two engines' roots: two sandboxes */

	assert_int_equal(oci_state_dir(root, "../x", true, err, sizeof(err)), -EINVAL);
	assert_one_line(err, "container id");
	assert_int_equal(oci_state_dir(root, "c1", false, err, sizeof(err)), -ENOENT);
	assert_one_line(err, "does not exist");
	int dfd = oci_state_dir(root, "c1", true, err, sizeof(err));
	assert_true(dfd >= 0);
	assert_int_equal(oci_state_dir(root, "c1", true, err, sizeof(err)), -EEXIST);
	assert_one_line(err, "exists already");

	/* A real monitor: a child that waits. */
	pid_t kid = fork();
	if (kid == 0) {
		pause();
		_exit(0);
	}
	struct oci_state s = {.pid = kid, .pid_start = oci_proc_start(kid)};
	assert_true(s.pid_start > 0);
	strcpy(s.id, "c1");
	strcpy(s.sandbox, name);
	strcpy(s.bundle, "/b");
	strcpy(s.rootfs, "/b/rootfs");
	strcpy(s.created, "2026-12-07T08:00:00.000000000Z");
	s.annotations = json_pack("{s:s}", "k", "v");
	/* cove's settings at create travel with the record: later commands come with other
	 * environments (podman calls pause and kill directly, not through conmon). */
	setenv("COVE_STATE_DIR", "/srv/cove-state", 1);
	unsetenv("COVE_RUN_DIR");
	setenv("COVE_GUEST_DIR", "relative/not/taken", 1);
	oci_state_env_take(&s);
	assert_int_equal(oci_state_write(dfd, &s), 0);
	unsetenv("COVE_STATE_DIR");
	setenv("COVE_RUN_DIR", "/elsewhere", 1);
	struct oci_state got;
	assert_int_equal(oci_state_read(dfd, &got, err, sizeof(err)), 0);
	assert_string_equal(got.sandbox, name);
	assert_false(got.holder);
	s.holder = true;
	assert_int_equal(oci_state_write(dfd, &s), 0);
	oci_state_free(&got);
	assert_int_equal(oci_state_read(dfd, &got, err, sizeof(err)), 0);
	assert_true(got.holder);
	s.holder = false;
	assert_int_equal(oci_state_write(dfd, &s), 0);
	oci_state_free(&got);
	assert_int_equal(oci_state_read(dfd, &got, err, sizeof(err)), 0);
	oci_state_env_apply(&got);
	assert_string_equal(getenv("COVE_STATE_DIR"), "/srv/cove-state");
	assert_null(getenv("COVE_RUN_DIR"));
	assert_null(getenv("COVE_GUEST_DIR"));
	unsetenv("COVE_STATE_DIR");
	assert_int_equal(got.pid, kid);
	assert_true(oci_monitor_alive(&got));
	assert_string_equal(oci_status(dfd, &got), "created");
	int fd = openat(dfd, OCI_STARTED, O_CREAT | O_WRONLY, 0600);
	close(fd);
	assert_string_equal(oci_status(dfd, &got), "running");
	fd = openat(dfd, OCI_PAUSED, O_CREAT | O_WRONLY, 0600);
	close(fd);
	assert_string_equal(oci_status(dfd, &got), "paused");
	/* The monitor's cove exec, named with its start time: a stale pid is never taken. */
	char rec[64];
	snprintf(rec, sizeof(rec), "%d %llu\n", (int)kid, (unsigned long long)got.pid_start);
	fd = openat(dfd, OCI_EXEC_PID, O_CREAT | O_WRONLY | O_TRUNC, 0600);
	assert_int_equal(write(fd, rec, strlen(rec)), (ssize_t)strlen(rec));
	close(fd);
	assert_int_equal(oci_exec_child(dfd), kid);
	snprintf(rec, sizeof(rec), "%d %llu\n", (int)kid, (unsigned long long)got.pid_start + 1);
	fd = openat(dfd, OCI_EXEC_PID, O_CREAT | O_WRONLY | O_TRUNC, 0600);
	assert_int_equal(write(fd, rec, strlen(rec)), (ssize_t)strlen(rec));
	close(fd);
	assert_int_equal(oci_exec_child(dfd), 0);
	json_t *j = oci_state_json(dfd, &got);
	assert_string_equal(json_string_value(json_object_get(j, "status")), "paused");
	assert_int_equal(json_integer_value(json_object_get(j, "pid")), kid);
	assert_string_equal(json_string_value(json_object_get(j, "ociVersion")), "1.0.2");
	json_decref(j);
	/* The monitor ends (even as a zombie): stopped, pid 0. */
	kill(kid, SIGKILL);
	for (int i = 0; i < 200 && oci_monitor_alive(&got); i++)
		usleep(10000);
	assert_string_equal(oci_status(dfd, &got), "stopped");
	waitpid(kid, NULL, 0);
	j = oci_state_json(dfd, &got);
	assert_int_equal(json_integer_value(json_object_get(j, "pid")), 0);
	json_decref(j);
	/* Another process at the same pid would not pass: the start time differs. */
	got.pid = getpid();
	assert_false(oci_monitor_alive(&got));
	oci_state_free(&got);
	oci_state_free(&s);
	/* Garbage and tampering: refused with one line. */
	static const char *const bad[] = {
	    "[]",
	    "{\"id\":\"c1\"}",
	    "{\"id\":\"../x\",\"sandbox\":\"oci-0\",\"bundle\":\"/b\",\"rootfs\":\"/r\","
	    "\"created\":\"t\",\"pid\":1,\"pid_start\":1}",
	    "{\"id\":\"c1\",\"sandbox\":\"other\",\"bundle\":\"/b\",\"rootfs\":\"/r\","
	    "\"created\":\"t\",\"pid\":1,\"pid_start\":1}",
	    "{\"id\":\"c1\",\"sandbox\":\"oci-0\",\"bundle\":\"/b\",\"rootfs\":\"/r\","
	    "\"created\":\"t\",\"pid\":-5,\"pid_start\":1}",
	    "{\"id\":\"c1\",\"sandbox\":\"oci-0\",\"bundle\":\"/b\",\"rootfs\":\"/r\","
	    "\"created\":\"t\",\"pid\":1,\"pid_start\":1,\"cove_env\":{\"COVE_STATE_DIR\":"
	    "\"etc\"}}",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
		fd = openat(dfd, OCI_STATE_JSON, O_WRONLY | O_TRUNC);
		assert_true(fd >= 0);
		assert_int_equal(write(fd, bad[i], strlen(bad[i])), (ssize_t)strlen(bad[i]));
		close(fd);
		err[0] = '\0';
		assert_int_equal(oci_state_read(dfd, &got, err, sizeof(err)), -EBADMSG);
		assert_one_line(err, "state.json");
	}
	close(dfd);
	char cmd[300];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", root);
	assert_int_equal(system(cmd), 0);
}

/* process.rlimits as podman writes them (RLIMIT_NOFILE, RLIMIT_NPROC), and hostile ones. */
static void test_rlimits(void **state)
{
	struct oci_process p;
	char err[256];
	(void)state;
	const char *ok = "{\"args\":[\"sh\"],\"rlimits\":[{\"type\":\"RLIMIT_NOFILE\",\"hard\":"
			 "1048576,\"soft\":1048576},{\"type\":\"RLIMIT_NPROC\",\"hard\":4194304,"
			 "\"soft\":1024},{\"type\":\"RLIMIT_CORE\",\"hard\":9223372036854775807,"
			 "\"soft\":0}]}";
	assert_int_equal(oci_process_parse_text(ok, strlen(ok), &p, err, sizeof(err)), 0);
	assert_int_equal(p.nrlimits, 3);
	assert_int_equal(p.rlimits[0].resource, RLIMIT_NOFILE);
	assert_int_equal(p.rlimits[0].soft, 1048576);
	assert_int_equal(p.rlimits[1].resource, RLIMIT_NPROC);
	assert_int_equal(p.rlimits[1].soft, 1024);
	assert_int_equal(p.rlimits[1].hard, 4194304);
	assert_true(p.rlimits[2].hard == (uint64_t)INT64_MAX);
	oci_process_free(&p);
	const char *none = "{\"args\":[\"sh\"],\"rlimits\":[]}";
	assert_int_equal(oci_process_parse_text(none, strlen(none), &p, err, sizeof(err)), 0);
	assert_int_equal(p.nrlimits, 0);
	oci_process_free(&p);

	static const struct {
		const char *rlimits, *needle;
	} bad[] = {
	    {"{}", "process.rlimits is not an array"},
	    {"[7]", "process.rlimits[0] is not an object"},
	    {"[{\"type\":\"RLIMIT_BOGUS\",\"soft\":1,\"hard\":1}]",
	     "process.rlimits[0].type RLIMIT_BOGUS is not a known"},
	    {"[{\"type\":\"NOFILE\",\"soft\":1,\"hard\":1}]", "rlimits[0].type NOFILE"},
	    {"[{\"soft\":1,\"hard\":1}]", "rlimits[0].type (missing)"},
	    {"[{\"type\":\"RLIMIT_NOFILE\",\"soft\":9,\"hard\":8}]",
	     "rlimits[0]: RLIMIT_NOFILE soft limit 9 is over its hard limit 8"},
	    {"[{\"type\":\"RLIMIT_NOFILE\",\"soft\":-1,\"hard\":8}]", "rlimits[0].soft"},
	    {"[{\"type\":\"RLIMIT_NOFILE\",\"soft\":1,\"hard\":\"8\"}]", "rlimits[0].hard"},
	    {"[{\"type\":\"RLIMIT_NOFILE\",\"soft\":1}]", "rlimits[0].hard"},
	    {"[{\"type\":\"RLIMIT_NOFILE\",\"soft\":1,\"hard\":1},{\"type\":\"RLIMIT_NOFILE\","
	     "\"soft\":1,\"hard\":1}]",
	     "rlimits[1]: RLIMIT_NOFILE is there twice"},
	    {"[{\"type\":\"RLIMIT_NOFILE\",\"soft\":1,\"hard\":18446744073709551615}]", "not JSON"},
	};
	char text[1024];
	for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
		snprintf(text, sizeof(text), "{\"args\":[\"sh\"],\"rlimits\":%s}", bad[i].rlimits);
		err[0] = '\0';
		assert_int_not_equal(
		    oci_process_parse_text(text, strlen(text), &p, err, sizeof(err)), 0);
		assert_one_line(err, bad[i].needle);
		assert_null(p.args);
	}
	/* At most 32 (there are fewer types, so the 33rd is refused before any repeat is). */
	size_t o = (size_t)snprintf(text, sizeof(text), "{\"args\":[\"sh\"],\"rlimits\":[");
	for (int i = 0; i <= RLIMITS_MAX; i++)
		o += (size_t)snprintf(text + o, sizeof(text) - o, "%s{}", i ? "," : "");
	snprintf(text + o, sizeof(text) - o, "]}");
	assert_int_equal(oci_process_parse_text(text, strlen(text), &p, err, sizeof(err)), -EINVAL);
	assert_one_line(err, "process.rlimits has more than 32 entries");

	/* cove exec --rlimit: what oci_exec_argv writes reads back the same. */
	struct rlimit_val v, back;
	char arg[RLIMIT_ARG_MAX];
	assert_int_equal(rlimit_arg_parse("nofile=123:456", &v, err, sizeof(err)), 0);
	assert_int_equal(v.resource, RLIMIT_NOFILE);
	assert_int_equal(v.soft, 123);
	assert_int_equal(v.hard, 456);
	assert_int_equal(rlimit_arg_parse("RLIMIT_CORE=0:unlimited", &v, err, sizeof(err)), 0);
	assert_int_equal(v.resource, RLIMIT_CORE);
	assert_true(v.hard == RLIMIT_UNLIMITED);
	assert_int_equal(rlimit_arg_format(&v, arg, sizeof(arg)), 0);
	assert_string_equal(arg, "RLIMIT_CORE=0:unlimited");
	v = (struct rlimit_val){RLIMIT_SIGPENDING, (uint64_t)INT64_MAX, (uint64_t)INT64_MAX};
	assert_int_equal(rlimit_arg_format(&v, arg, sizeof(arg)), 0);
	assert_int_equal(rlimit_arg_parse(arg, &back, err, sizeof(err)), 0);
	assert_memory_equal(&v, &back, sizeof(v));
	static const struct {
		const char *arg, *needle;
	} badarg[] = {
	    {"NOFILE", "want NAME=SOFT:HARD"},
	    {"NOFILE=1", "want NAME=SOFT:HARD"},
	    {"BOGUS=1:2", "unknown resource 'BOGUS'"},
	    {"NOFILE=2:1", "soft limit over the hard one"},
	    {"NOFILE=unlimited:1", "soft limit over the hard one"},
	    {"NOFILE=-1:1", "each a number or unlimited"},
	    {"NOFILE=1:", "each a number or unlimited"},
	    {"NOFILE=1:2:3", "each a number or unlimited"},
	    {"NOFILE=1:99999999999999999999", "each a number or unlimited"},
	    {"RLIMIT_NOFILE_AND_A_VERY_LONG_TAIL=1:2", "unknown resource"},
	};
	for (size_t i = 0; i < sizeof(badarg) / sizeof(*badarg); i++) {
		err[0] = '\0';
		assert_int_equal(rlimit_arg_parse(badarg[i].arg, &v, err, sizeof(err)), -EINVAL);
		assert_one_line(err, badarg[i].needle);
	}
}

static void test_hostname(void **state)
{
	(void)state;
	assert_true(oci_hostname_valid(""));
	assert_true(oci_hostname_valid("c1"));
	assert_true(oci_hostname_valid("web-1.example.com"));
	assert_true(oci_hostname_valid("0123456789012345678901234567890123456789012345678901234567"
				       "890123"));
	assert_false(oci_hostname_valid("0123456789012345678901234567890123456789012345678901234567"
					"8901234"));
	assert_false(oci_hostname_valid("-x"));
	assert_false(oci_hostname_valid(".x"));
	assert_false(oci_hostname_valid("a b"));
	assert_false(oci_hostname_valid("a_b"));
	assert_false(oci_hostname_valid("a/b"));
	assert_false(oci_hostname_valid("a\nb"));
	assert_false(oci_hostname_valid("caf\xc3\xa9"));
	assert_true(oci_policy_name_valid("web"));
	assert_true(oci_policy_name_valid("0_a-b"));
	assert_false(oci_policy_name_valid(""));
	assert_false(oci_policy_name_valid("Web"));
	assert_false(oci_policy_name_valid("_web"));
	assert_false(oci_policy_name_valid("/etc/cove/p.json"));
	assert_false(oci_policy_name_valid("../web"));
	assert_false(oci_policy_name_valid("{\"allow\":[]}"));
	char long_name[80];
	memset(long_name, 'a', sizeof(long_name));
	long_name[OCI_POLICY_NAME_MAX] = '\0';
	assert_true(oci_policy_name_valid(long_name));
	long_name[OCI_POLICY_NAME_MAX] = 'a';
	long_name[OCI_POLICY_NAME_MAX + 1] = '\0';
	assert_false(oci_policy_name_valid(long_name));
}

static void conf_write(const char *path, const char *json)
{
	unlink(path);
	write_file(path, json, strlen(json));
}

/* The host's oci.json: the caps and the policies annotations may name. */
static void test_host_conf(void **state)
{
	char dir[] = "/tmp/cove-oci-conf-XXXXXX", path[256], err[512], cmd[300];
	struct oci_host_conf c;
	(void)state;
	assert_non_null(mkdtemp(dir));
	snprintf(path, sizeof(path), "%s/oci.json", dir);

	/* Missing: the defaults. COVE_OCI_CONFIG names the file when no path is given. */
	setenv(OCI_HOST_CONF_ENV, path, 1);
	assert_int_equal(oci_host_conf_load(NULL, &c, err, sizeof(err)), 0);
	assert_string_equal(c.path, path);
	assert_int_equal(c.max_mem, 2ULL << 30);
	assert_int_equal(c.max_vcpus, 2);
	assert_int_equal(c.npolicies, 0);
	assert_int_equal(c.max_root_disks, OCI_HOST_ROOT_DISKS_DEFAULT);
	oci_host_conf_free(&c);
	unsetenv(OCI_HOST_CONF_ENV);

	conf_write(path, "{\"max_mem\":\"4G\",\"max_vcpus\":4,\"policies\":{\"web\":"
			 "\"/etc/cove/policies/web.json\",\"db-2\":\"/srv/db.json\"}}");
	assert_int_equal(oci_host_conf_load(path, &c, err, sizeof(err)), 0);
	assert_int_equal(c.max_mem, 4ULL << 30);
	assert_int_equal(c.max_vcpus, 4);
	assert_int_equal(c.npolicies, 2);
	assert_string_equal(c.policies[0].name, "web");
	assert_string_equal(c.policies[0].path, "/etc/cove/policies/web.json");
	oci_host_conf_free(&c);
	conf_write(path, "{\"max_root_disks\":5}");
	assert_int_equal(oci_host_conf_load(path, &c, err, sizeof(err)), 0);
	assert_int_equal(c.max_root_disks, 5);
	oci_host_conf_free(&c);
	conf_write(path, "{\"max_mem\":536870912}");
	assert_int_equal(oci_host_conf_load(path, &c, err, sizeof(err)), 0);
	assert_int_equal(c.max_mem, 512ULL << 20);
	assert_int_equal(c.max_vcpus, 2);
	oci_host_conf_free(&c);

	static const struct {
		const char *json, *needle;
	} bad[] = {
	    {"{\"max_mem\":4}", "max_mem: want a size of 64M to 64G"},
	    {"{\"max_mem\":\"65G\"}", "max_mem"},
	    {"{\"max_mem\":\"4 G\"}", "max_mem"},
	    {"{\"max_mem\":true}", "max_mem"},
	    {"{\"max_vcpus\":0}", "max_vcpus: want an integer 1 to 64"},
	    {"{\"max_vcpus\":65}", "max_vcpus"},
	    {"{\"max_vcpus\":\"4\"}", "max_vcpus"},
	    {"{\"max_root_disks\":0}", "max_root_disks: want an integer 1 to 4096"},
	    {"{\"max_root_disks\":4097}", "max_root_disks"},
	    {"{\"policies\":[]}", "policies is not an object"},
	    {"{\"policies\":{\"web\":\"policies/web.json\"}}",
	     "policies.web is not an absolute path"},
	    {"{\"policies\":{\"web\":7}}", "policies.web is not an absolute path"},
	    {"{\"policies\":{\"../x\":\"/p.json\"}}", "policy name '../x'"},
	    {"{\"max_memory\":\"4G\"}", "unknown key 'max_memory'"},
	    {"[]", "not a JSON object"},
	    {"{\"max_vcpus\":2,\"max_vcpus\":3}", "not JSON"},
	    {"{", "not JSON"},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
		conf_write(path, bad[i].json);
		err[0] = '\0';
		assert_int_not_equal(oci_host_conf_load(path, &c, err, sizeof(err)), 0);
		assert_one_line(err, bad[i].needle);
		assert_one_line(err, path);
		assert_null(c.policies);
	}
	/* Over 64 KiB, and not a regular file. */
	size_t big = OCI_HOST_CONF_MAX + 1;
	char *text = malloc(big + 1);
	assert_non_null(text);
	memset(text, ' ', big);
	text[0] = '{';
	text[big - 1] = '}';
	text[big] = '\0';
	conf_write(path, text);
	free(text);
	assert_int_equal(oci_host_conf_load(path, &c, err, sizeof(err)), -EFBIG);
	assert_one_line(err, "not a regular file of at most 65536 bytes");
	assert_int_equal(oci_host_conf_load(dir, &c, err, sizeof(err)), -EFBIG);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	assert_int_equal(system(cmd), 0);
}

/* A bundle's annotations against the host's caps: over a cap or an unknown policy refused with
 * one line; a known policy resolved to the host's file. */
static void test_annotation_caps(void **state)
{
	char dir[] = "/tmp/cove-oci-caps-XXXXXX", p[256], err[512], cfg[1024], cmd[300];
	struct oci_bundle b;
	struct oci_host_policy pol = {"web", "/etc/cove/policies/web.json"};
	struct oci_host_conf c = {.path = "/etc/cove/oci.json",
				  .max_mem = 2ULL << 30,
				  .max_vcpus = 2,
				  .policies = &pol,
				  .npolicies = 1};
	(void)state;
	assert_non_null(mkdtemp(dir));
	snprintf(p, sizeof(p), "%s/rootfs", dir);
	assert_int_equal(mkdir(p, 0755), 0);
	static const struct {
		const char *annotations, *needle; /* needle NULL: accepted */
	} cases[] = {
	    {"{\"cove.dev/mem\":\"8G\"}",
	     "cove.dev/mem 8G is over this host's cap 2G (max_mem in /etc/cove/oci.json)"},
	    {"{\"cove.dev/vcpus\":\"4\"}",
	     "cove.dev/vcpus 4 is over this host's cap 2 (max_vcpus in /etc/cove/oci.json)"},
	    {"{\"cove.dev/policy\":\"db\"}", "cove.dev/policy db: this host has no such policy"},
	    {"{\"cove.dev/mem\":\"2G\",\"cove.dev/vcpus\":\"2\",\"cove.dev/policy\":\"web\"}",
	     NULL},
	    {"{}", NULL},
	};
	for (size_t i = 0; i < sizeof(cases) / sizeof(*cases); i++) {
		snprintf(cfg, sizeof(cfg),
			 "{\"process\":{\"args\":[\"sh\"]},\"root\":{\"path\":\"rootfs\"},"
			 "\"annotations\":%s}",
			 cases[i].annotations);
		write_config(dir, cfg);
		assert_int_equal(oci_bundle_load(dir, &b, err, sizeof(err)), 0);
		err[0] = '\0';
		int r = oci_host_conf_apply(&c, &b, err, sizeof(err));
		if (cases[i].needle) {
			assert_int_equal(r, -EINVAL);
			assert_one_line(err, cases[i].needle);
		} else {
			assert_int_equal(r, 0);
		}
		if (i == 3) {
			assert_string_equal(b.policy, "web");
			assert_string_equal(b.policy_file, "/etc/cove/policies/web.json");
			assert_int_equal(b.mem_bytes, 2ULL << 30);
		}
		if (i == 4) {
			assert_string_equal(b.policy_file, "");
			assert_int_equal(b.mem_bytes, 0); /* cove create's default */
		}
		oci_bundle_free(&b);
	}
	/* A cap below cove create's default RAM: a bundle that names none gets the cap. */
	c.max_mem = 128ULL << 20;
	write_config(dir, "{\"process\":{\"args\":[\"sh\"]},\"root\":{\"path\":\"rootfs\"}}");
	assert_int_equal(oci_bundle_load(dir, &b, err, sizeof(err)), 0);
	assert_int_equal(oci_host_conf_apply(&c, &b, err, sizeof(err)), 0);
	assert_int_equal(b.mem_bytes, 128ULL << 20);
	oci_bundle_free(&b);
	/* A policy annotation is a name, never a path or JSON: refused when the bundle is read. */
	static const char *const hostile[] = {"/etc/cove/policies/web.json", "{\"allow\":[\"*\"]}",
					      "../web", "Web", ""};
	for (size_t i = 0; i < sizeof(hostile) / sizeof(*hostile); i++) {
		json_t *j =
		    json_pack("{s:{s:[s]},s:{s:s},s:{s:s}}", "process", "args", "sh", "root",
			      "path", "rootfs", "annotations", "cove.dev/policy", hostile[i]);
		char *text = json_dumps(j, 0);
		write_config(dir, text);
		free(text);
		json_decref(j);
		err[0] = '\0';
		assert_int_equal(oci_bundle_load(dir, &b, err, sizeof(err)), -EINVAL);
		assert_one_line(err,
				"annotation cove.dev/policy: want the name of one of this host's");
	}
	/* The hostname: config.json's, checked. */
	static const struct {
		const char *hostname;
		int ok;
	} hosts[] = {{"web-1.local", 1}, {"", 1}, {"a b", 0}, {"-x", 0}, {"x;reboot", 0}};
	for (size_t i = 0; i < sizeof(hosts) / sizeof(*hosts); i++) {
		json_t *j = json_pack("{s:{s:[s]},s:{s:s},s:s}", "process", "args", "sh", "root",
				      "path", "rootfs", "hostname", hosts[i].hostname);
		char *text = json_dumps(j, 0);
		write_config(dir, text);
		free(text);
		json_decref(j);
		err[0] = '\0';
		int r = oci_bundle_load(dir, &b, err, sizeof(err));
		if (hosts[i].ok) {
			assert_int_equal(r, 0);
			assert_string_equal(b.hostname, hosts[i].hostname);
			oci_bundle_free(&b);
		} else {
			assert_int_equal(r, -EINVAL);
			assert_one_line(err, "config.json: hostname is not a host name");
		}
	}
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	assert_int_equal(system(cmd), 0);
}

static void test_signals(void **state)
{
	(void)state;
	assert_int_equal(oci_signal_parse("9"), SIGKILL);
	assert_int_equal(oci_signal_parse("KILL"), SIGKILL);
	assert_int_equal(oci_signal_parse("SIGTERM"), SIGTERM);
	assert_int_equal(oci_signal_parse("sigterm"), SIGTERM);
	assert_int_equal(oci_signal_parse("15"), SIGTERM);
	assert_int_equal(oci_signal_parse("WINCH"), SIGWINCH);
	assert_int_equal(oci_signal_parse("0"), -EINVAL);
	assert_int_equal(oci_signal_parse("65"), -EINVAL);
	assert_int_equal(oci_signal_parse("9x"), -EINVAL);
	assert_int_equal(oci_signal_parse("SIGNOPE"), -EINVAL);
	assert_int_equal(oci_signal_parse(""), -EINVAL);
}

/* checkpoint.json: what cove-oci writes reads back; a hostile record is refused with one line. */
static void test_checkpoint_record(void **state)
{
	(void)state;
	struct oci_ckpt c = {.mem_bytes = 256ULL << 20, .vcpus = 2, .created_ms = 5}, back;
	char err[256];
	strcpy(c.root, "oci-root/0123abcd");
	strcpy(c.session, "s12");
	json_t *j = oci_ckpt_json(&c);
	char *text = json_dumps(j, JSON_COMPACT);
	assert_int_equal(oci_ckpt_parse(text, strlen(text), &back, err, sizeof(err)), 0);
	assert_memory_equal(&c, &back, sizeof(c));
	free(text);
	json_decref(j);
	static const struct {
		const char *text, *needle;
	} bad[] = {
	    {"[]", "not a cove checkpoint"},
	    {"{\"cove_checkpoint\":2}", "not a cove checkpoint of version 1"},
	    {"{\"cove_checkpoint\":1,\"cove_checkpoint\":1}", "not JSON"},
	    {"{\"cove_checkpoint\":1,\"root\":\"../../etc/shadow\",\"session\":\"s1\","
	     "\"mem_bytes\":268435456,\"vcpus\":1}",
	     "root is not a cove image name"},
	    {"{\"cove_checkpoint\":1,\"root\":\"/var/lib/cove/x\",\"session\":\"s1\","
	     "\"mem_bytes\":268435456,\"vcpus\":1}",
	     "root is not a cove image name"},
	    {"{\"cove_checkpoint\":1,\"root\":\"oci-root/a/./b\",\"session\":\"s1\","
	     "\"mem_bytes\":268435456,\"vcpus\":1}",
	     "root is not a cove image name"},
	    {"{\"cove_checkpoint\":1,\"root\":\"a b\",\"session\":\"s1\","
	     "\"mem_bytes\":268435456,\"vcpus\":1}",
	     "root is not a cove image name"},
	    {"{\"cove_checkpoint\":1,\"root\":\"oci-root/ab\",\"session\":\"s1; rm -rf /\","
	     "\"mem_bytes\":268435456,\"vcpus\":1}",
	     "session is not an exec session id"},
	    {"{\"cove_checkpoint\":1,\"root\":\"oci-root/ab\",\"session\":\"s1\","
	     "\"mem_bytes\":4096,\"vcpus\":1}",
	     "mem_bytes is not 16 MiB..1 TiB"},
	    {"{\"cove_checkpoint\":1,\"root\":\"oci-root/ab\",\"session\":\"s1\","
	     "\"mem_bytes\":268435457,\"vcpus\":1}",
	     "mem_bytes is not 16 MiB..1 TiB"},
	    {"{\"cove_checkpoint\":1,\"root\":\"oci-root/ab\",\"session\":\"s1\","
	     "\"mem_bytes\":268435456,\"vcpus\":65}",
	     "vcpus is not 1..64"},
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(*bad); i++) {
		err[0] = 0;
		assert_true(
		    oci_ckpt_parse(bad[i].text, strlen(bad[i].text), &back, err, sizeof(err)) < 0);
		assert_one_line(err, bad[i].needle);
	}
	char *big = calloc(1, OCI_CKPT_MAX + 2);
	memset(big, ' ', OCI_CKPT_MAX + 1);
	assert_int_equal(oci_ckpt_parse(big, OCI_CKPT_MAX + 1, &back, err, sizeof(err)), -E2BIG);
	assert_one_line(err, "larger than");
	free(big);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_process),
	    cmocka_unit_test(test_bundle),
	    cmocka_unit_test(test_state),
	    cmocka_unit_test(test_signals),
	    cmocka_unit_test(test_rlimits),
	    cmocka_unit_test(test_hostname),
	    cmocka_unit_test(test_host_conf),
	    cmocka_unit_test(test_annotation_caps),
	    cmocka_unit_test(test_checkpoint_record),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
