/* agent_wire.c: the agent's framing (BE length + JSON; typed data frames), request checks. */
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

/* 0 once n bytes are read; -ENODATA at EOF before the first byte, -EPIPE at EOF after it. */
int wire_read_full(int fd, void *buf, size_t n)
{
	size_t got = 0;

	while (got < n) {
		ssize_t r = read(fd, (char *)buf + got, n - got);

		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -errno;
		if (r == 0)
			return got ? -EPIPE : -ENODATA;
		got += (size_t)r;
	}
	return 0;
}

int wire_write_full(int fd, const void *buf, size_t n)
{
	size_t done = 0;

	while (done < n) {
		ssize_t r = write(fd, (const char *)buf + done, n - done);

		if (r < 0 && errno == EINTR)
			continue;
		if (r < 0)
			return -errno;
		done += (size_t)r;
	}
	return 0;
}

int wire_len_parse(const uint8_t hdr[4], uint32_t max, uint32_t *len)
{
	uint32_t n =
	    (uint32_t)hdr[0] << 24 | (uint32_t)hdr[1] << 16 | (uint32_t)hdr[2] << 8 | hdr[3];

	if (n > max)
		return -EMSGSIZE;
	*len = n;
	return 0;
}

static void put_be32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 24);
	p[1] = (uint8_t)(v >> 16);
	p[2] = (uint8_t)(v >> 8);
	p[3] = (uint8_t)v;
}

/* A message body must be one JSON object of valid UTF-8 and nothing else. */
int wire_msg_parse(const char *buf, size_t len, json_t **out, char *err, size_t errlen)
{
	json_error_t jerr;
	json_t *j = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &jerr);

	if (!j) {
		snprintf(err, errlen, "bad JSON: %s", jerr.text);
		return -EINVAL;
	}
	if (!json_is_object(j)) {
		json_decref(j);
		snprintf(err, errlen, "bad message: not a JSON object");
		return -EINVAL;
	}
	*out = j;
	return 0;
}

int wire_msg_read(int fd, json_t **out, char *err, size_t errlen)
{
	uint8_t hdr[4];
	uint32_t len;
	char *buf;
	int ret = wire_read_full(fd, hdr, sizeof(hdr));

	if (ret < 0) {
		snprintf(err, errlen, "%s", ret == -ENODATA ? "connection closed" : strerror(-ret));
		return ret;
	}
	if (wire_len_parse(hdr, WIRE_MSG_MAX, &len) < 0) {
		snprintf(err, errlen, "message too large (limit %u bytes)", WIRE_MSG_MAX);
		return -EMSGSIZE;
	}
	buf = malloc(len ? len : 1);
	if (!buf) {
		snprintf(err, errlen, "out of memory");
		return -ENOMEM;
	}
	ret = wire_read_full(fd, buf, len);
	if (ret < 0) {
		snprintf(err, errlen, "truncated message");
		free(buf);
		return ret == -ENODATA ? -EPIPE : ret;
	}
	ret = wire_msg_parse(buf, len, out, err, errlen);
	free(buf);
	return ret;
}

int wire_msg_write(int fd, json_t *obj)
{
	char *s = json_dumps(obj, JSON_COMPACT);
	uint8_t hdr[4];
	size_t len;
	int ret;

	if (!s)
		return -ENOMEM;
	len = strlen(s);
	if (len > WIRE_MSG_MAX) {
		free(s);
		return -EMSGSIZE;
	}
	put_be32(hdr, (uint32_t)len);
	ret = wire_write_full(fd, hdr, sizeof(hdr));
	if (ret == 0)
		ret = wire_write_full(fd, s, len);
	free(s);
	return ret;
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

int wire_data_write(int fd, uint8_t type, const void *buf, size_t len)
{
	uint8_t hdr[5];
	int ret;

	if (len > WIRE_DATA_MAX)
		return -EMSGSIZE;
	hdr[0] = type;
	put_be32(hdr + 1, (uint32_t)len);
	ret = wire_write_full(fd, hdr, sizeof(hdr));
	if (ret == 0 && len)
		ret = wire_write_full(fd, buf, len);
	return ret;
}

/* Reads one typed frame whose payload fits cap; a larger one is an error (-EMSGSIZE). */
int wire_data_read(int fd, uint8_t *type, void *buf, size_t cap, size_t *len)
{
	uint8_t hdr[5];
	uint32_t n;
	int ret = wire_read_full(fd, hdr, sizeof(hdr));

	if (ret < 0)
		return ret;
	if (wire_len_parse(hdr + 1, cap > WIRE_DATA_MAX ? WIRE_DATA_MAX : (uint32_t)cap, &n) < 0)
		return -EMSGSIZE;
	ret = wire_read_full(fd, buf, n);
	if (ret < 0)
		return ret == -ENODATA ? -EPIPE : ret;
	*type = hdr[0];
	*len = n;
	return 0;
}

size_t b64_encoded_len(size_t n)
{
	return (n + 2) / 3 * 4;
}

/* Standard alphabet with padding; out holds b64_encoded_len(n) + 1 bytes. */
void b64_encode(const unsigned char *in, size_t n, char *out)
{
	static const char tab[] =
	    "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
	size_t i, o = 0;

	for (i = 0; i + 2 < n; i += 3) {
		uint32_t v = (uint32_t)in[i] << 16 | (uint32_t)in[i + 1] << 8 | in[i + 2];

		out[o++] = tab[v >> 18];
		out[o++] = tab[(v >> 12) & 63];
		out[o++] = tab[(v >> 6) & 63];
		out[o++] = tab[v & 63];
	}
	if (i < n) {
		uint32_t v = (uint32_t)in[i] << 16 | (i + 1 < n ? (uint32_t)in[i + 1] << 8 : 0);

		out[o++] = tab[v >> 18];
		out[o++] = tab[(v >> 12) & 63];
		out[o++] = i + 1 < n ? tab[(v >> 6) & 63] : '=';
		out[o++] = '=';
	}
	out[o] = '\0';
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
	return 0;
}
