/* Fetching a secret through a git credential helper ("get", key=value lines on stdin/stdout). */
#ifndef COVE_BROKER_HELPER_H
#define COVE_BROKER_HELPER_H

#include <stddef.h>

#include "policy.h"

#define HELPER_OUT_MAX	  (64 * 1024)
#define HELPER_SECRET_MAX 4096
#define HELPER_TIMEOUT_MS 10000

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

/* Runs c->helper with "get" appended (no shell), feeds helper_input, reads at most
 * HELPER_OUT_MAX bytes within HELPER_TIMEOUT_MS, requires exit status 0, and parses.
 * The caller must secret_wipe() *s. */
int helper_run(const struct cred_policy *c, int timeout_ms, struct secret *s, char *err,
	       size_t errlen);

void secret_wipe(struct secret *s);

#endif
