/* `cove exec SANDBOX [options] -- CMD...`: runs a command in a sandbox via cove-init's agent. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include "cli/create_image.h"
#include "cli/sandbox_up.h"
#include "common/errmsg.h"
#include "common/rlimit_name.h"
#include "sandbox/agent_client.h"

static const char exec_usage[] =
    "usage: cove exec SANDBOX [--tty] [--env K=V]... [--cwd DIR] [--user USER] [--no-stdin]\n"
    "                 [--rlimit NAME=SOFT:HARD]... [--detach] [--wait SECS] -- CMD [ARG]...\n"
    "Runs CMD in the sandbox (SANDBOX: its vsock socket path, or a name in the state dir) and\n"
    "exits with its status (128 + N if killed by signal N). stdin, stdout and stderr are\n"
    "streamed; SIGINT/TERM/HUP/QUIT/USR1/USR2 are passed on to the command's process group.\n"
    "  -t, --tty        run on a pseudo-terminal (the local terminal goes raw)\n"
    "  -e, --env K=V    add to the environment (repeatable)\n"
    "  -w, --cwd DIR    working directory (default: the user's home)\n"
    "  -u, --user USER  name or uid from the guest's /etc/passwd (default root)\n"
    "  -n, --no-stdin   the command's stdin is /dev/null\n"
    "      --rlimit NAME=SOFT:HARD  a resource limit set before the command starts, as root\n"
    "                   (so the hard limit may go up): NOFILE=1024:4096, CORE=0:unlimited;\n"
    "                   NAME is setrlimit(2)'s without RLIMIT_ (repeatable, each NAME once)\n"
    "  -d, --detach     start it, print the session id and return; see cove attach\n"
    "      --session-file FILE  write the session id to FILE once it runs (a monitor that\n"
    "                   may have to cove attach it again: cove-oci after a checkpoint)\n"
    "      --wait SECS  keep trying to reach the agent while the guest boots (default 0)\n";

enum { EXEC_OPT_RLIMIT = 256, EXEC_OPT_SESSION_FILE }; /* long options without a letter */

/* --rlimit NAME=SOFT:HARD onto the exec op's "rlimits" (-1 on the wire: unlimited). */
static int exec_rlimit_add(json_t *rlimits, const char *arg, char *err, size_t errlen)
{
	struct rlimit_val v;
	size_t i;
	json_t *e;
	int r = rlimit_arg_parse(arg, &v, err, errlen);

	if (r)
		return r;
	json_array_foreach(rlimits, i, e)
	{
		if (!strcmp(json_string_value(json_object_get(e, "type")), rlimit_name(v.resource)))
			return errmsg(err, errlen, -EINVAL, "--rlimit %s given twice",
				      rlimit_name(v.resource));
	}
	if (json_array_size(rlimits) >= RLIMITS_MAX)
		return errmsg(err, errlen, -E2BIG, "more than %d --rlimit", RLIMITS_MAX);
	json_int_t soft = v.soft == RLIMIT_UNLIMITED ? -1 : (json_int_t)v.soft,
		   hard = v.hard == RLIMIT_UNLIMITED ? -1 : (json_int_t)v.hard;
	e = json_pack("{s:s,s:I,s:I}", "type", rlimit_name(v.resource), "soft", soft, "hard", hard);
	return json_array_append_new(rlimits, e) ? -ENOMEM : 0;
}

/* The session id into path (a temporary file renamed: a reader sees it whole). 0 or -1. */
static int session_file_write(const char *path, const char *id)
{
	char tmp[4200];
	if (!id || snprintf(tmp, sizeof(tmp), "%s.tmp", path) >= (int)sizeof(tmp)) {
		errno = id ? ENAMETOOLONG : EPROTO;
		return -1;
	}
	FILE *f = fopen(tmp, "we");
	if (!f)
		return -1;
	int bad = fprintf(f, "%s\n", id) < 0;
	bad |= fclose(f) != 0;
	if (bad || rename(tmp, path)) {
		unlink(tmp);
		return -1;
	}
	return 0;
}

int cmd_exec(int argc, char **argv)
{
	static const struct option opts[] = {
	    {"tty", no_argument, NULL, 't'},
	    {"env", required_argument, NULL, 'e'},
	    {"cwd", required_argument, NULL, 'w'},
	    {"user", required_argument, NULL, 'u'},
	    {"no-stdin", no_argument, NULL, 'n'},
	    {"detach", no_argument, NULL, 'd'},
	    {"wait", required_argument, NULL, 'W'},
	    {"rlimit", required_argument, NULL, EXEC_OPT_RLIMIT},
	    {"session-file", required_argument, NULL, EXEC_OPT_SESSION_FILE},
	    {"help", no_argument, NULL, 'h'},
	    {NULL, 0, NULL, 0},
	};
	char uds[AGENT_PATH_MAX], err[512];
	const char *cwd = NULL, *user = NULL, *sandbox, *session_file = NULL;
	bool tty = false, no_stdin = false, detach = false;
	double wait_s = 0;
	json_t *env = json_array(), *args = json_array(), *req = NULL, *reply = NULL, *image = NULL,
	       *rlimits = json_array();
	int c, fd, ret = 2;

	optind = 1;
	while ((c = getopt_long(argc, argv, "te:w:u:ndh", opts, NULL)) != -1) {
		switch (c) {
		case 't':
			tty = true;
			break;
		case 'e':
			if (!strchr(optarg, '=') || optarg[0] == '=') {
				fprintf(stderr, "cove exec: --env '%s': want KEY=VALUE\n", optarg);
				ret = 2;
				goto out;
			}
			json_array_append_new(env, json_string(optarg));
			break;
		case 'w':
			cwd = optarg;
			break;
		case 'u':
			user = optarg;
			break;
		case 'n':
			no_stdin = true;
			break;
		case 'd':
			detach = true;
			break;
		case 'W': {
			char *end;

			wait_s = strtod(optarg, &end);
			if (*end || wait_s < 0 || wait_s > 3600) {
				fprintf(stderr, "cove exec: --wait '%s': want seconds 0..3600\n",
					optarg);
				ret = 2;
				goto out;
			}
			break;
		}
		case EXEC_OPT_SESSION_FILE:
			session_file = optarg;
			break;
		case EXEC_OPT_RLIMIT:
			if (exec_rlimit_add(rlimits, optarg, err, sizeof(err))) {
				fprintf(stderr, "cove exec: %s\n", err);
				ret = 2;
				goto out;
			}
			break;
		case 'h':
			fputs(exec_usage, stdout);
			ret = 0;
			goto out;
		default:
			fputs(exec_usage, stderr);
			ret = 2;
			goto out;
		}
	}
	/* getopt permutes: SANDBOX may come before or after the options; "--" ends them. */
	if (optind >= argc) {
		fprintf(stderr, "cove exec: missing SANDBOX (try 'cove exec --help')\n");
		ret = 2;
		goto out;
	}
	sandbox = argv[optind++];
	if (optind >= argc) {
		fprintf(stderr, "cove exec: missing command after '--' (try 'cove exec --help')\n");
		ret = 2;
		goto out;
	}
	for (int i = optind; i < argc; i++)
		json_array_append_new(args, json_string(argv[i]));
	if (tty && getenv("TERM"))
		json_array_append_new(env, json_pack("s++", "TERM", "=", getenv("TERM")));

	/* With --wait the socket itself may not exist yet: cove run creates it while starting. */
	for (double waited = 0;; waited += 0.2) {
		ret = sbx_resolve(sandbox, "cove exec", uds, sizeof(uds), err, sizeof(err));
		if (ret == 0 || ret != SBX_EXIT_UNKNOWN || waited >= wait_s)
			break;
		usleep(200 * 1000);
	}
	if (ret) {
		if (err[0]) /* empty: cove-store said it (a held lease: one JSON line) */
			fprintf(stderr, "cove exec: %s\n", err);
		goto out;
	}
	image = image_exec_defaults(sandbox, env, &cwd, &user);
	req = json_pack("{s:s,s:O,s:O,s:b,s:b}", "op", "exec", "argv", args, "env", env, "tty", tty,
			"stdin", !no_stdin && !detach);
	if (!req) {
		fprintf(stderr, "cove exec: bad argument (not UTF-8?)\n");
		ret = 2;
		goto out;
	}
	if (detach)
		json_object_set_new(req, "detach", json_true());
	if (json_array_size(rlimits))
		json_object_set(req, "rlimits", rlimits);
	if (cwd)
		json_object_set_new(req, "cwd", json_string(cwd));
	if (user)
		json_object_set_new(req, "user", json_string(user));
	if (tty) {
		struct winsize ws;

		if (ioctl(0, TIOCGWINSZ, &ws) == 0) {
			json_object_set_new(req, "rows", json_integer(ws.ws_row));
			json_object_set_new(req, "cols", json_integer(ws.ws_col));
		}
	}
	fd = agent_call(uds, wait_s, req, &reply, err, sizeof(err));
	/*
	 * A named sandbox whose VMM stopped itself (idle) between the lookup and the connect:
	 * nothing ran, so look it up again, which restores it, and ask once more.
	 */
	if ((fd == -ECONNREFUSED || fd == -ENOENT || fd == -ECONNRESET) && !strchr(sandbox, '/') &&
	    sbx_resolve(sandbox, "cove exec", uds, sizeof(uds), err, sizeof(err)) == 0)
		fd = agent_call(uds, wait_s, req, &reply, err, sizeof(err));
	if (fd < 0) {
		fprintf(stderr, "cove exec: %s\n", err);
		/* A command that could not start: 127 as a shell says, 1 for anything else. */
		ret = fd == -EREMOTEIO && strncmp(err, "exec ", 5) == 0 ? 127 : 1;
		goto out;
	}
	if (detach) {
		printf("%s\n", json_string_value(json_object_get(reply, "session")));
		close(fd);
		ret = 0;
		goto out;
	}
	if (session_file && session_file_write(session_file, json_string_value(json_object_get(
								 reply, "session")))) {
		fprintf(stderr, "cove exec: --session-file %s: %s (the command runs on)\n",
			session_file, strerror(errno));
	}
	ret = agent_session_stream(fd, tty, !no_stdin, err, sizeof(err));
	close(fd);
	if (ret < 0) {
		fprintf(stderr, "cove exec: %s\n", err);
		ret = 1;
	}
out:
	json_decref(reply);
	json_decref(req);
	json_decref(args);
	json_decref(env);
	json_decref(rlimits);
	json_decref(image);
	return ret;
}
