/* exec_env.c: the environment of an exec session: defaults, proxy variables, the request's own. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "agent.h"
#include "egress_proxy.h"

/* PATH, HOME, USER, LOGNAME, SHELL, TERM, then the proxy variables. */
#define EXEC_ENV_DEFAULTS (6 + EGRESS_ENV_COUNT + CA_ENV_COUNT)

char **exec_env_build(const struct exec_req *r, const struct pw_ent *pw, uint16_t proxy_port)
{
	size_t n = 0, cap = EXEC_ENV_DEFAULTS + EXEC_ARGS_MAX;
	char **env = calloc(cap + 1, sizeof(*env));
	char var[128];

	if (!env)
		return NULL;
	if (asprintf(&env[n++], "PATH=/usr/sbin:/usr/bin:/sbin:/bin") < 0 ||
	    asprintf(&env[n++], "HOME=%s", pw->home) < 0 ||
	    asprintf(&env[n++], "USER=%s", pw->name) < 0 ||
	    asprintf(&env[n++], "LOGNAME=%s", pw->name) < 0 ||
	    asprintf(&env[n++], "SHELL=%s", pw->shell) < 0 ||
	    asprintf(&env[n++], "TERM=%s", r->tty ? "xterm" : "dumb") < 0) {
		env[n - 1] = NULL; /* asprintf leaves it undefined on failure */
		goto fail;
	}
	for (unsigned i = 0; i < EGRESS_ENV_COUNT; i++) {
		if (egress_env_entry(i, proxy_port, var, sizeof(var)) < 0 ||
		    !(env[n++] = strdup(var)))
			goto fail;
	}
	for (unsigned i = 0; i < CA_ENV_COUNT; i++) {
		int r = ca_env_entry(i, var, sizeof(var));
		if (r == -ENOENT)
			continue;
		if (r < 0 || !(env[n++] = strdup(var)))
			goto fail;
	}
	/* Request entries replace defaults of the same name: the caller's explicit env wins. */
	for (size_t i = 0; r->env[i] && i < EXEC_ARGS_MAX; i++) {
		const char *eq = strchr(r->env[i], '=');
		size_t klen, j;

		if (!eq)
			continue; /* exec_req_parse refuses these; never index past the name */
		klen = (size_t)(eq - r->env[i]) + 1;
		for (j = 0; j < n; j++)
			if (strncmp(env[j], r->env[i], klen) == 0)
				break;
		if (j == n)
			n++;
		free(env[j]);
		env[j] = strdup(r->env[i]);
		if (!env[j])
			goto fail;
	}
	return env;
fail:
	for (size_t i = 0; i < cap; i++)
		free(env[i]);
	free(env);
	return NULL;
}

void exec_env_free(char **env)
{
	for (size_t i = 0; env && env[i]; i++)
		free(env[i]);
	free(env);
}
