/* `cove fork API_SOCK -n N`: N clones of a running sandbox, each with its own sockets, CID, chain
 * and a fresh guest identity; `cove fork NAME NEW...`: named sandboxes cloned from a named one. */
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <jansson.h>

#include "cli/json_mode.h"
#include "cli/api_client.h"
#include "cli/commands.h"
#include "cli/sandbox_up.h"
#include "lifecycle/clone.h"
#include "lifecycle/lock.h"
#include "lifecycle/name.h"
#include "lifecycle/root.h"
#include "lifecycle/spec.h"
#include "lifecycle/state.h"
#include "lifecycle/tombstone.h"
#include "lifecycle/tree.h"

#define FORK_MAX 16

static const char usage[] =
    "usage: cove fork NAME NEW... [--stopped] [--json]\n"
    "       cove fork API_SOCK [-n N] [--no-identity]\n"
    "\n"
    "NAME NEW...: new named sandboxes (1..16) cloned from the named sandbox NAME, which may be\n"
    "running or paused (a snapshot is taken first, so the clones start from now), stopped,\n"
    "crashed (its newest committed snapshot) or archived (the clones are archived copies that\n"
    "unpack on start). Each clone gets NAME's spec, a chain of its own whose committed layers\n"
    "are hard links to NAME's (copies across filesystems; neither ever writes them), its own\n"
    "disk tops and event log; it is then started (restored, with a fresh identity: RNG seed,\n"
    "clock, void broker token) unless --stopped. Prints one line per clone (--json: one\n"
    "object, shape \"fork\" of docs/CLI.md). Exit status: 64 a bad name, 65 no sandbox\n"
    "NAME, 66 NAME was deleted, 67 a clone could not be started (it stays, stopped), 68 a\n"
    "NEW exists already, 2 a NEW named twice; a refused fork creates nothing.\n"
    "\n"
    "API_SOCK (a path with a '/', or a socket): snapshot a running sandbox (it needs\n"
    "--snapshot-dir) and start N clones (1..16, default 1) restored from it, as PUT /fork\n"
    "does. Unchanged memory is shared copy-on-write. Each clone gets its own API socket, vsock\n"
    "socket and CID, its own snapshot directory, and (unless --no-identity) a fresh identity\n"
    "through its guest agent before it is reported: a new RNG seed and the host's clock.\n"
    "Prints one JSON object with the clones; exits 1 when a clone's\n"
    "identity was not delivered (its \"identity\" says why).\n";

/* NAME's directory (with a spec: `cove create` made it); on failure one line and the status. */
static int open_source(struct sbx_root *r, const char *name, int *dfd)
{
	char err[512];

	*dfd = -1;
	if (sbx_name_check(name, err, sizeof(err))) {
		fprintf(stderr, "cove fork: %s (an API socket is given as a path)\n", err);
		return SBX_EXIT_BAD_NAME;
	}
	if (sbx_root_open(r, false, err, sizeof(err)) == 0)
		*dfd = sbx_dir_open(r, name, false, NULL, 0);
	if (*dfd >= 0 && faccessat(*dfd, SBX_SPEC, F_OK, AT_SYMLINK_NOFOLLOW) < 0) {
		close(*dfd);
		*dfd = -ENOENT;
	}
	if (*dfd >= 0)
		return 0;
	if (r->dfd >= 0 && !sbx_tombstone_describe(r, name, err, sizeof(err))) {
		fprintf(stderr, "cove fork: %s\n", err);
		return SBX_EXIT_DELETED;
	}
	fprintf(stderr, "cove fork: no sandbox named %s\n", name);
	return SBX_EXIT_UNKNOWN;
}

/*
 * Under NAME's start lock (no start, stop or archive meanwhile): a snapshot when it runs, then
 * every clone; if one fails the ones made before it are removed. 0, or the status after one
 * line on stderr.
 */
static int make_clones(struct sbx_root *r, const char *name, int dfd, const char **news, int n,
		       struct sbx_clone_stats *st)
{
	enum sbx_state state;
	char err[512], api[128], cause[128];
	int lk, ret, status = 0, made = 0;
	bool paused = false;

	lk = sbx_lock_take(dfd, SBX_LOCK_START, true, false);
	if (lk < 0) {
		fprintf(stderr, "cove fork: %s: start lock: %s\n", name, strerror(-lk));
		return 1;
	}
	ret = sbx_state_read(dfd, &state, NULL);
	if (ret) {
		fprintf(stderr, "cove fork: %s: cannot read its state: %s\n", name, strerror(-ret));
		status = 1;
		goto out;
	}
	/*
	 * A running NAME is paused while its files are linked: paused, it takes no periodic
	 * snapshot, so no layer (nor disk freeze) of its own can change or roll back under the
	 * clones. The snapshot the clones start from is taken in the pause.
	 */
	if ((state == SBX_RUNNING || state == SBX_PAUSED) &&
	    sbx_run_path(r, name, "api.sock", api, sizeof(api))) {
		fprintf(stderr, "cove fork: %s: socket path too long\n", name);
		status = 1;
		goto out;
	}
	if (state == SBX_RUNNING && sbx_api_state(api, "Paused", err, sizeof(err))) {
		fprintf(stderr, "cove fork: %s: cannot pause it: %s\n", name, err);
		status = 1;
		goto out;
	}
	paused = state == SBX_RUNNING;
	if ((state == SBX_RUNNING || state == SBX_PAUSED) &&
	    sbx_snapshot_now(api, err, sizeof(err))) {
		fprintf(stderr, "cove fork: %s: %s\n", name, err);
		status = 1;
		goto out;
	}
	snprintf(cause, sizeof(cause), "cove fork %s", name);
	for (; made < n; made++) {
		ret = sbx_clone(r, name, dfd, news[made], 0, cause, &st[made], err, sizeof(err));
		if (ret) {
			fprintf(stderr, "cove fork: %s: %s\n", ret == -EEXIST ? news[made] : name,
				err);
			status = ret == -EEXIST ? SBX_EXIT_EXISTS : 1;
			break;
		}
	}
	/* All or nothing: the clones made before a failure never ran. */
	for (int i = 0; status && i < made; i++)
		sbx_tree_remove(r->dfd, news[i]);
out:
	if (paused && sbx_api_state(api, "Resumed", err, sizeof(err))) {
		fprintf(stderr, "cove fork: %s: cannot resume it: %s\n", name, err);
		status = status ? status : 1;
	}
	close(lk);
	return status;
}

static int fork_named(int argc, char **argv)
{
	const char *name = NULL, *news[FORK_MAX];
	struct sbx_clone_stats st[FORK_MAX];
	const char *state[FORK_MAX];
	bool stopped = false, json = false;
	struct sbx_root r = {.dfd = -1};
	char err[512];
	int n = 0, dfd = -1, status;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "--stopped")) {
			stopped = true;
		} else if (!strcmp(argv[i], "--json")) {
			json = true;
		} else if (argv[i][0] == '-') {
			fprintf(stderr, "cove fork: unexpected argument '%s' (try --help)\n",
				argv[i]);
			return 2;
		} else if (!name) {
			name = argv[i];
		} else if (n == FORK_MAX) {
			fprintf(stderr, "cove fork: at most %d new sandboxes at once\n", FORK_MAX);
			return 2;
		} else {
			news[n++] = argv[i];
		}
	}
	if (!n) {
		fprintf(stderr, "cove fork: %s: name the new sandbox(es): cove fork NAME NEW...\n",
			name);
		return 2;
	}
	for (int i = 0; i < n; i++)
		if (sbx_name_check(news[i], err, sizeof(err))) {
			fprintf(stderr, "cove fork: %s\n", err);
			return SBX_EXIT_BAD_NAME;
		}
	status = open_source(&r, name, &dfd);
	if (status)
		goto out;
	status = sbx_clone_check(&r, name, news, n, err, sizeof(err));
	if (status) {
		fprintf(stderr, "cove fork: %s\n", err);
		status = status == -EINVAL   ? SBX_EXIT_BAD_NAME
			 : status == -EEXIST ? SBX_EXIT_EXISTS
					     : 2;
		goto out;
	}
	status = make_clones(&r, name, dfd, news, n, st);
	if (status)
		goto out;
	for (int i = 0; i < n; i++) {
		int cfd = sbx_dir_open(&r, news[i], false, err, sizeof(err));

		state[i] = st[i].archived ? "archived" : "stopped";
		if (stopped)
			continue;
		if (cfd < 0 || sbx_start(&r, news[i], cfd, "cove fork", err, sizeof(err))) {
			fprintf(stderr, "cove fork: %s: %s (it stays %s; cove rm %s removes it)\n",
				news[i], err, state[i], news[i]);
			status = SBX_EXIT_START;
		} else
			state[i] = "running";
		if (cfd >= 0)
			close(cfd);
	}
	if (json) {
		json_t *a = json_array();

		for (int i = 0; i < n; i++)
			json_array_append_new(a, json_pack("{s:s,s:s,s:I,s:I}", "name", news[i],
							   "state", state[i], "linked",
							   (json_int_t)st[i].linked, "copied",
							   (json_int_t)st[i].copied));
		json_mode_print("fork", json_pack("{s:s,s:o}", "from", name, "clones", a));
	} else
		for (int i = 0; i < n; i++)
			printf("%s: %s (fork of %s: %llu files shared, %llu copied)\n", news[i],
			       state[i], name, (unsigned long long)st[i].linked,
			       (unsigned long long)st[i].copied);
out:
	if (dfd >= 0)
		close(dfd);
	sbx_root_close(&r);
	return status;
}

/* The named form: the first argument has no '/' and is not a socket. */
static bool named_form(int argc, char **argv)
{
	struct stat st;

	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "-n")) {
			i++;
			continue;
		}
		if (argv[i][0] == '-')
			continue;
		return !strchr(argv[i], '/') && !(stat(argv[i], &st) == 0 && S_ISSOCK(st.st_mode));
	}
	return false;
}

int cmd_fork(int argc, char **argv)
{
	const char *sock = NULL;
	long n = 1;
	bool identity = true;

	for (int i = 1; i < argc; i++)
		if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
			fputs(usage, stdout);
			return 0;
		}
	if (named_form(argc, argv))
		return fork_named(argc, argv);
	for (int i = 1; i < argc; i++) {
		if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
			fputs(usage, stdout);
			return 0;
		} else if (!strcmp(argv[i], "-n") && i + 1 < argc) {
			char *end;
			n = strtol(argv[++i], &end, 10);
			if (*end || n < 1 || n > 16) {
				fprintf(stderr, "cove fork: -n must be 1..16\n");
				return 2;
			}
		} else if (!strcmp(argv[i], "--no-identity")) {
			identity = false;
		} else if (argv[i][0] != '-' && !sock) {
			sock = argv[i];
		} else {
			fprintf(stderr, "cove fork: unexpected argument '%s' (try --help)\n",
				argv[i]);
			return 2;
		}
	}
	if (!sock) {
		fprintf(stderr, "cove fork: the sandbox's API socket is required (try --help)\n");
		return 2;
	}
	char body[64], err[512];
	snprintf(body, sizeof(body), "{\"count\":%ld,\"identity\":%s}", n,
		 identity ? "true" : "false");
	long status;
	char *reply;
	if (api_call(sock, "PUT", "/fork", body, 600, &status, &reply, err, sizeof(err))) {
		fprintf(stderr, "cove fork: %s\n", err);
		return 1;
	}
	if (status != 200) {
		api_fault_text(reply, err, sizeof(err));
		fprintf(stderr, "cove fork: %s\n", err);
		free(reply);
		return 1;
	}
	/* The sandbox gave each clone its identity (PUT /fork): report what it says. */
	json_t *j = json_loads(reply, 0, NULL);
	json_t *clones = json_object_get(j, "clones");
	int rc = 0;
	size_t i;
	json_t *c;
	json_array_foreach(clones, i, c)
	{
		const char *id = json_string_value(json_object_get(c, "identity"));
		if (identity && (!id || strcmp(id, "sent"))) {
			fprintf(stderr, "cove fork: clone %lld: identity %s\n",
				(long long)json_integer_value(json_object_get(c, "pid")),
				id ? id : "unknown");
			rc = 1;
		}
	}
	char *out = json_dumps(j ? j : json_null(), JSON_COMPACT);
	printf("%s\n", out ? out : reply);
	free(out);
	json_decref(j);
	free(reply);
	return rc;
}
