/* Fetching a secret through a git credential helper ("get", key=value lines on stdin/stdout). */
#ifndef COVE_BROKER_HELPER_H
#define COVE_BROKER_HELPER_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "policy.h"

#define HELPER_OUT_MAX	  (64 * 1024)
#define HELPER_SECRET_MAX 4096
#define HELPER_TIMEOUT_MS 10000
#define HELPER_IN_MAX	  8192

struct secret {
	char username[1024];
	char password[HELPER_SECRET_MAX];
};

/* Builds the helper's stdin ("key=value\n"... then "\n"). Returns bytes written or -E2BIG. */
int helper_input(const struct cred_policy *c, char *buf, size_t cap);

/* Parses helper output: key=value lines, an optional blank line ends it. Keeps username= and
 * password=; other keys are ignored. Needs a non-empty password or username.
 * Returns 0, -EINVAL (malformed) or -E2BIG (a value or the output over the cap). */
int helper_parse(const char *out, size_t len, struct secret *s, char *err, size_t errlen);

/* A running helper. */
struct helper_proc {
	pid_t pid;
	int out_fd; /* its stdout (nonblocking), -1 once closed */
	char *buf;  /* its output so far (wiped when freed) */
	size_t len;
	int eof;
	int64_t deadline_ns; /* CLOCK_MONOTONIC */
};

/* Starts c->helper with "get" appended (no shell), writes the input and closes its stdin.
 * Returns 0 (watch hp->out_fd for input) or -errno. */
int helper_spawn(const struct cred_policy *c, int timeout_ms, struct helper_proc *hp, char *err,
		 size_t errlen);
/* Reads what is there. Returns 0 (more to come), 1 (EOF) or -errno (over the cap: stop). */
int helper_read(struct helper_proc *hp, char *err, size_t errlen);
/* After EOF, an error, or the deadline: closes stdout, reaps the helper (killing it when it is
 * past the deadline or failed), requires exit status 0 and parses. Returns -EAGAIN when stdout
 * is closed but the helper has not exited yet and time is left (call again later). */
int helper_finish(struct helper_proc *hp, struct secret *s, char *err, size_t errlen);
/* Kills and reaps the helper, closes and wipes everything. Safe to call twice. */
void helper_abort(struct helper_proc *hp);

/* All of the above, blocking: reads at most HELPER_OUT_MAX bytes within timeout_ms, requires
 * exit status 0, and parses. The caller must secret_wipe() *s. */
int helper_run(const struct cred_policy *c, int timeout_ms, struct secret *s, char *err,
	       size_t errlen);

void secret_wipe(struct secret *s);

#endif
