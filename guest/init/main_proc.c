/*
 * main_proc.c: an image's Entrypoint + Cmd as the sandbox's main process: its Env, WorkingDir
 * and User, restarted when it exits (with a backoff), or the VM ends (on_exit "stop"). Without
 * one the sandbox simply waits for cove exec.
 */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "agent.h"
#include "cove-init.h"
#include "egress_proxy.h"

#define MAIN_ITEMS_MAX	256
#define MAIN_STRING_MAX 4096
#define BACKOFF_MAX_MS	30000
/* A main process that ran this long is healthy again: its next restart waits 1 s. */
#define HEALTHY_MS 60000

static char **string_list(json_t *a, bool env, int *bad)
{
	size_t n = json_array_size(a), i;
	char **out;
	json_t *v;

	if (a && !json_is_array(a)) {
		*bad = 1;
		return NULL;
	}
	if (n > MAIN_ITEMS_MAX) {
		*bad = 1;
		return NULL;
	}
	out = calloc(n + 1, sizeof(*out));
	if (!out) {
		*bad = 1;
		return NULL;
	}
	json_array_foreach(a, i, v)
	{
		const char *s = json_string_value(v);
		if (!s || json_string_length(v) != strlen(s) || strlen(s) > MAIN_STRING_MAX ||
		    (env && (!strchr(s, '=') || s[0] == '=')) || !(out[i] = strdup(s))) {
			*bad = 1;
			break;
		}
	}
	return out;
}

static void list_free(char **l)
{
	for (size_t i = 0; l && l[i]; i++)
		free(l[i]);
	free(l);
}

void main_spec_free(struct main_spec *m)
{
	list_free(m->argv);
	list_free(m->env);
	free(m->cwd);
	free(m->user);
	memset(m, 0, sizeof(*m));
}

int main_spec_parse(const char *text, struct main_spec *m, char *err, size_t errlen)
{
	json_error_t je;
	json_t *j = json_loads(text, JSON_REJECT_DUPLICATES, &je), *argv;
	const char *cwd, *user, *on_exit;
	int bad = 0;

	memset(m, 0, sizeof(*m));
	m->restart = true;
	if (!json_is_object(j)) {
		json_decref(j);
		snprintf(err, errlen, "cove.main: not a JSON object");
		return -EINVAL;
	}
	argv = json_object_get(j, "argv");
	if (json_array_size(argv) > 0)
		m->argv = string_list(argv, false, &bad);
	m->env = string_list(json_object_get(j, "env"), true, &bad);
	cwd = json_string_value(json_object_get(j, "cwd"));
	user = json_string_value(json_object_get(j, "user"));
	on_exit = json_string_value(json_object_get(j, "on_exit"));
	if (on_exit && !strcmp(on_exit, "stop"))
		m->restart = false;
	else if (on_exit && strcmp(on_exit, "restart"))
		bad = 1;
	if ((cwd && (strlen(cwd) > MAIN_STRING_MAX || (*cwd && *cwd != '/'))) ||
	    (user && strlen(user) > 64))
		bad = 1;
	m->cwd = strdup(cwd ? cwd : "");
	m->user = strdup(user ? user : "");
	json_decref(j);
	if (bad || !m->cwd || !m->user || !m->env) {
		main_spec_free(m);
		snprintf(err, errlen, "cove.main: argv, env, cwd, user or on_exit unusable");
		return -EINVAL;
	}
	return 0;
}

/* The image's Env, then what it lacks of PATH, HOME and the egress proxy's variables. */
static char **main_env(const struct main_spec *m, const struct pw_ent *pw)
{
	size_t n = 0;
	char var[128],
	    **env = calloc(MAIN_ITEMS_MAX + 8 + EGRESS_ENV_COUNT + CA_ENV_COUNT, sizeof(*env));
	const char *def[3] = {"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
			      NULL, NULL};
	char home[300];

	if (!env)
		return NULL;
	snprintf(home, sizeof(home), "HOME=%s", pw->home);
	def[1] = home;
	for (size_t i = 0; m->env[i]; i++)
		env[n++] = strdup(m->env[i]);
	for (unsigned i = 0; i < 2 + EGRESS_ENV_COUNT + CA_ENV_COUNT; i++) {
		const char *v = i < 2 ? def[i] : NULL;
		size_t k;
		if (!v) {
			if ((i < 2 + EGRESS_ENV_COUNT
				 ? egress_env_entry(i - 2, EGRESS_LISTEN_PORT, var, sizeof(var))
				 : ca_env_entry(i - 2 - EGRESS_ENV_COUNT, var, sizeof(var))) < 0)
				continue;
			v = var;
		}
		k = (size_t)(strchr(v, '=') - v) + 1;
		size_t j;
		for (j = 0; j < n; j++)
			if (env[j] && !strncmp(env[j], v, k))
				break;
		if (j == n)
			env[n++] = strdup(v);
	}
	return env;
}

static int spawn_main(struct sup *sup, const struct main_spec *m)
{
	struct pw_ent pw;
	char **env;
	int ret = passwd_lookup(m->user[0] ? m->user : "root", &pw);

	if (ret < 0) {
		init_err(sup->log, "main process: user %s: %s", m->user,
			 ret == -ENOENT ? "not in the image's /etc/passwd" : strerror(-ret));
		return ret;
	}
	env = main_env(m, &pw);
	if (!env)
		return -ENOMEM;
	ret = sup_spawn_as(sup, m->argv, env, m->cwd[0] ? m->cwd : pw.home, pw.uid, pw.gid);
	list_free(env);
	return ret;
}

static long long mono_ms(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int main_run(struct sup *sup, const struct main_spec *m)
{
	int backoff = 1000, status;

	for (;;) {
		long long t0 = mono_ms();
		int ret;
		if (m->argv) {
			ret = spawn_main(sup, m);
		} else {
			/* No main process: a child that sleeps stands in, so that a stop request
			 * ends the VM the same way. */
			ret = sup_spawn_idle(sup);
		}
		if (ret < 0 && (!m->argv || !m->restart))
			return 127;
		/* It could not start (its user, say): as if it exited 127, so that the sandbox
		 * stays up for cove exec and the console says why. */
		status = ret < 0 ? 127 : sup_wait(sup);
		if (!m->argv || sup->stopping || !m->restart)
			break;
		if (mono_ms() - t0 >= HEALTHY_MS)
			backoff = 1000;
		init_info(sup->log, "main process %s exited (%d): restarting it in %d s",
			  m->argv[0], status, backoff / 1000);
		if (sup_pause(sup, backoff))
			break;
		backoff = backoff * 2 > BACKOFF_MAX_MS ? BACKOFF_MAX_MS : backoff * 2;
	}
	return status;
}
