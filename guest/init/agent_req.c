/* agent_req.c: the agent's replies and its checks of peers and exec requests (framing: proto/). */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <linux/vm_sockets.h>

#include "agent.h"

bool wire_peer_allowed(const struct sockaddr *sa, socklen_t len, bool unix_peer)
{
	const struct sockaddr_vm *vm = (const struct sockaddr_vm *)sa;

	if (!sa || len < (socklen_t)sizeof(sa->sa_family))
		return false;
	if (unix_peer)
		return sa->sa_family == AF_UNIX;
	return sa->sa_family == AF_VSOCK && len >= (socklen_t)sizeof(*vm) &&
	       vm->svm_cid == VMADDR_CID_HOST;
}

int wire_reply_ok(int fd)
{
	json_t *j = json_pack("{s:b}", "ok", 1);
	int ret = j ? wire_msg_write(fd, j) : -ENOMEM;

	json_decref(j);
	return ret;
}

int wire_reply_error(int fd, const char *fmt, ...)
{
	char msg[512];
	va_list ap;
	json_t *j;
	int ret;

	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	j = json_pack("{s:b,s:s}", "ok", 0, "error", msg);
	ret = j ? wire_msg_write(fd, j) : -ENOMEM;
	json_decref(j);
	return ret;
}

/* A JSON array of at most EXEC_ARGS_MAX strings into a NULL-terminated vector. */
static int str_array(json_t *a, const char **vec, const char *what, bool need_eq, char *err,
		     size_t errlen)
{
	size_t i;
	json_t *v;

	if (json_array_size(a) > EXEC_ARGS_MAX) {
		snprintf(err, errlen, "%s: more than %d entries", what, EXEC_ARGS_MAX);
		return -E2BIG;
	}
	json_array_foreach(a, i, v)
	{
		const char *s = json_string_value(v);

		if (!s || json_string_length(v) != strlen(s) || strlen(s) > EXEC_ARG_LEN_MAX) {
			snprintf(err, errlen, "%s[%zu]: not a string of at most %d bytes", what, i,
				 EXEC_ARG_LEN_MAX);
			return -EINVAL;
		}
		if (need_eq && (!strchr(s, '=') || s[0] == '=')) {
			snprintf(err, errlen, "%s[%zu]: not KEY=VALUE", what, i);
			return -EINVAL;
		}
		vec[i] = s;
	}
	vec[i] = NULL;
	return 0;
}

static int opt_string(json_t *msg, const char *key, const char **out, size_t max, char *err,
		      size_t errlen)
{
	json_t *v = json_object_get(msg, key);

	*out = NULL;
	if (!v || json_is_null(v))
		return 0;
	if (!json_is_string(v) || json_string_length(v) > max || json_string_length(v) == 0 ||
	    json_string_length(v) != strlen(json_string_value(v))) {
		snprintf(err, errlen, "%s: not a string of 1..%zu bytes", key, max);
		return -EINVAL;
	}
	*out = json_string_value(v);
	return 0;
}

static int opt_bool(json_t *msg, const char *key, bool *out, bool dflt, char *err, size_t errlen)
{
	json_t *v = json_object_get(msg, key);

	*out = dflt;
	if (!v)
		return 0;
	if (!json_is_boolean(v)) {
		snprintf(err, errlen, "%s: not a boolean", key);
		return -EINVAL;
	}
	*out = json_is_true(v);
	return 0;
}

static int opt_uint(json_t *msg, const char *key, unsigned *out, unsigned max, char *err,
		    size_t errlen)
{
	json_t *v = json_object_get(msg, key);

	*out = 0;
	if (!v)
		return 0;
	if (!json_is_integer(v) || json_integer_value(v) < 0 || json_integer_value(v) > max) {
		snprintf(err, errlen, "%s: not an integer 0..%u", key, max);
		return -EINVAL;
	}
	*out = (unsigned)json_integer_value(v);
	return 0;
}

/* A limit on the wire: 0..RLIMIT_VALUE_MAX, or -1 for unlimited. */
static int rlimit_value(json_t *e, const char *key, size_t i, uint64_t *out, char *err,
			size_t errlen)
{
	json_t *v = json_object_get(e, key);

	if (!json_is_integer(v) || json_integer_value(v) < -1) {
		snprintf(err, errlen, "rlimits[%zu].%s: not an integer >= 0 (or -1: unlimited)", i,
			 key);
		return -EINVAL;
	}
	*out = json_integer_value(v) == -1 ? RLIMIT_UNLIMITED : (uint64_t)json_integer_value(v);
	return 0;
}

/* "rlimits":[{"type":"RLIMIT_NOFILE","soft":N,"hard":N},..]: known types, each once. */
static int rlimits_parse(json_t *a, struct exec_req *r, char *err, size_t errlen)
{
	size_t i;
	json_t *e;

	if (!a || json_is_null(a))
		return 0;
	if (!json_is_array(a) || json_array_size(a) > RLIMITS_MAX) {
		snprintf(err, errlen, "rlimits: not an array of at most %d limits", RLIMITS_MAX);
		return -EINVAL;
	}
	json_array_foreach(a, i, e)
	{
		struct rlimit_val *v = &r->rlimits[i];
		const char *type = json_string_value(json_object_get(e, "type"));

		if (!type || (v->resource = rlimit_resource(type)) < 0) {
			snprintf(err, errlen, "rlimits[%zu].type: not a known RLIMIT_ name", i);
			return -EINVAL;
		}
		for (size_t k = 0; k < i; k++)
			if (r->rlimits[k].resource == v->resource) {
				snprintf(err, errlen, "rlimits[%zu]: %s is there twice", i, type);
				return -EINVAL;
			}
		if (rlimit_value(e, "soft", i, &v->soft, err, errlen) < 0 ||
		    rlimit_value(e, "hard", i, &v->hard, err, errlen) < 0)
			return -EINVAL;
		if (v->soft > v->hard) {
			snprintf(err, errlen, "rlimits[%zu]: %s soft limit over the hard one", i,
				 type);
			return -EINVAL;
		}
		r->nrlimits = (unsigned)i + 1;
	}
	return 0;
}

int exec_req_parse(json_t *msg, struct exec_req *r, char *err, size_t errlen)
{
	json_t *argv = json_object_get(msg, "argv"), *env = json_object_get(msg, "env");
	int ret;

	memset(r, 0, sizeof(*r));
	if (!json_is_array(argv) || json_array_size(argv) == 0) {
		snprintf(err, errlen, "argv: not a non-empty array of strings");
		return -EINVAL;
	}
	ret = str_array(argv, r->argv, "argv", false, err, errlen);
	if (ret < 0)
		return ret;
	if (r->argv[0][0] == '\0') {
		snprintf(err, errlen, "argv[0]: empty");
		return -EINVAL;
	}
	if (env && !json_is_null(env)) {
		if (!json_is_array(env)) {
			snprintf(err, errlen, "env: not an array of KEY=VALUE strings");
			return -EINVAL;
		}
		ret = str_array(env, r->env, "env", true, err, errlen);
		if (ret < 0)
			return ret;
	}
	if ((ret = opt_string(msg, "cwd", &r->cwd, EXEC_ARG_LEN_MAX, err, errlen)) < 0 ||
	    (ret = opt_string(msg, "user", &r->user, 63, err, errlen)) < 0 ||
	    (ret = opt_bool(msg, "tty", &r->tty, false, err, errlen)) < 0 ||
	    (ret = opt_bool(msg, "stdin", &r->stdin_open, true, err, errlen)) < 0 ||
	    (ret = opt_uint(msg, "rows", &r->rows, 65535, err, errlen)) < 0 ||
	    (ret = opt_uint(msg, "cols", &r->cols, 65535, err, errlen)) < 0)
		return ret;
	return rlimits_parse(json_object_get(msg, "rlimits"), r, err, errlen);
}
