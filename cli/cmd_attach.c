/* `cove attach SANDBOX SESSION`: reconnects to a command started by cove exec, output included. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "cli/sandbox_up.h"
#include "sandbox/agent_client.h"

static const char attach_usage[] =
    "usage: cove attach SANDBOX SESSION [--no-stdin]\n"
    "Reconnects to a running exec session (ids: cove exec --detach, or cove ps SANDBOX): first\n"
    "the output buffered while nobody was attached, then live output; exits with the command's\n"
    "status. A previous attachment of the same session is cut off.\n";

int cmd_attach(int argc, char **argv)
{
	const char *pos[2] = {NULL, NULL};
	char uds[AGENT_PATH_MAX], err[512];
	bool no_stdin = false, tty;
	int npos = 0, fd, ret;
	json_t *req, *reply = NULL;

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "-h") == 0 || strcmp(argv[i], "--help") == 0) {
			fputs(attach_usage, stdout);
			return 0;
		}
		if (strcmp(argv[i], "-n") == 0 || strcmp(argv[i], "--no-stdin") == 0) {
			no_stdin = true;
		} else if (argv[i][0] == '-' || npos == 2) {
			fprintf(
			    stderr,
			    "cove attach: unexpected argument '%s' (try 'cove attach --help')\n",
			    argv[i]);
			return 2;
		} else {
			pos[npos++] = argv[i];
		}
	}
	if (npos != 2) {
		fprintf(stderr,
			"cove attach: want SANDBOX and SESSION (try 'cove attach --help')\n");
		return 2;
	}
	ret = sbx_resolve(pos[0], "cove attach", uds, sizeof(uds), err, sizeof(err));
	if (ret) {
		if (err[0]) /* empty: cove-store said it */
			fprintf(stderr, "cove attach: %s\n", err);
		return ret;
	}
	req = json_pack("{s:s,s:s}", "op", "attach", "session", pos[1]);
	if (!req) {
		fprintf(stderr, "cove attach: bad session id\n");
		return 2;
	}
	fd = agent_call(uds, 0, req, &reply, err, sizeof(err));
	json_decref(req);
	if (fd < 0) {
		fprintf(stderr, "cove attach: %s\n", err);
		return 1;
	}
	tty = json_is_true(json_object_get(reply, "tty"));
	json_decref(reply);
	/* Without stdin the command's own stdin stays open: it may be attached again later. */
	ret = agent_session_stream(fd, tty, !no_stdin, err, sizeof(err));
	close(fd);
	if (ret < 0) {
		fprintf(stderr, "cove attach: %s\n", err);
		return 1;
	}
	return ret;
}
