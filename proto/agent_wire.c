/* The agent wire protocol's framing (BE length + JSON; typed data frames), for both sides. */
#include "proto/agent_wire.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/errmsg.h"
#include "common/fd_io.h"
#include "common/term_safe.h"

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

int wire_msg_parse(const char *buf, size_t len, json_t **out, char *err, size_t errlen)
{
	json_error_t jerr;
	json_t *j = json_loadb(buf, len, JSON_REJECT_DUPLICATES, &jerr);
	char safe[4 * JSON_ERROR_TEXT_LENGTH];

	if (!j) /* jansson quotes the peer's bytes */
		return errmsg(err, errlen, -EINVAL, "bad JSON: %s",
			      term_safe(jerr.text, safe, sizeof(safe)));
	if (!json_is_object(j)) {
		json_decref(j);
		return errmsg(err, errlen, -EINVAL, "bad message: not a JSON object");
	}
	*out = j;
	return 0;
}

/* The stream loops are common/fd_io's; these names stay for the wire's callers. */
int wire_read_full(int fd, void *buf, size_t n)
{
	return read_full(fd, buf, n);
}

int wire_write_full(int fd, const void *buf, size_t n)
{
	return write_full(fd, buf, n);
}

int wire_msg_read(int fd, json_t **out, char *err, size_t errlen)
{
	uint8_t hdr[4];
	uint32_t len;
	char *buf;
	int ret = wire_read_full(fd, hdr, sizeof(hdr));

	if (ret < 0)
		return errmsg(err, errlen, ret, "%s",
			      ret == -ENODATA ? "connection closed" : strerror(-ret));
	if (wire_len_parse(hdr, WIRE_MSG_MAX, &len) < 0)
		return errmsg(err, errlen, -EMSGSIZE, "message too large (over %u bytes)",
			      WIRE_MSG_MAX);
	buf = malloc(len ? len : 1);
	if (!buf)
		return errmsg(err, errlen, -ENOMEM, "out of memory");
	ret = wire_read_full(fd, buf, len);
	if (ret < 0) {
		free(buf);
		return errmsg(err, errlen, ret == -ENODATA ? -EPIPE : ret, "truncated message");
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

int wire_data_read(int fd, uint8_t *type, void *buf, size_t cap, size_t *len)
{
	uint8_t hdr[5];
	uint32_t n;
	int ret = wire_read_full(fd, hdr, sizeof(hdr));

	if (ret < 0)
		return ret;
	if (wire_len_parse(hdr + 1, cap < WIRE_DATA_MAX ? (uint32_t)cap : WIRE_DATA_MAX, &n) < 0)
		return -EMSGSIZE;
	ret = wire_read_full(fd, buf, n);
	if (ret < 0)
		return ret == -ENODATA ? -EPIPE : ret;
	*type = hdr[0];
	*len = n;
	return 0;
}
