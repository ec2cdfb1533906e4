/*
 * libFuzzer target: the agent wire protocol on both ends. Guest side (cove-init): framed JSON
 * messages read from a stream (proto/agent_wire.c), exec requests (guest/init/agent_req.c) and
 * the passwd lookup they lead to. Host side (cove): typed data frames, the exit record and the
 * vsock handshake reply (sandbox/agent_client.c). The first input byte picks the side.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

#include "agent.h"
#include "fuzz.h"
#include "sandbox/agent_client.h"

#define PIPE_FILL 60000 /* under the 64 KiB pipe buffer: the write never blocks */

static const char passwd_text[] = "root:x:0:0:root:/root:/bin/sh\n"
				  "daemon:x:1:1:daemon:/usr/sbin:/usr/sbin/nologin\n"
				  "agent:x:1000:1000:Agent,,,:/home/agent:/bin/bash\n";

/* A pipe holding `len` bytes of the input, then EOF; returns the read end or -1. */
static int stream_of(const uint8_t *p, size_t len)
{
	int fds[2];
	if (pipe2(fds, O_CLOEXEC))
		return -1;
	if (len > PIPE_FILL)
		len = PIPE_FILL;
	if (len && write(fds[1], p, len) != (ssize_t)len)
		abort();
	close(fds[1]);
	return fds[0];
}

static void one_line_or_empty(const char *err)
{
	if (strchr(err, '\n'))
		abort();
}

/* cove-init: messages from the host, each a request it validates. */
static void guest_side(const uint8_t *p, size_t len)
{
	int fd = stream_of(p, len);
	if (fd < 0)
		return;
	for (int i = 0; i < 16; i++) {
		json_t *msg = NULL;
		char err[256] = "";
		if (wire_msg_read(fd, &msg, err, sizeof(err)) < 0) {
			one_line_or_empty(err);
			break;
		}
		if (!json_is_object(msg))
			abort(); /* a message is one JSON object */
		struct exec_req r;
		err[0] = '\0';
		if (exec_req_parse(msg, &r, err, sizeof(err)) == 0) {
			struct pw_ent pw;
			if (r.argv[0] == NULL)
				abort();
			if (r.user)
				(void)passwd_find(passwd_text, sizeof(passwd_text) - 1, r.user,
						  &pw);
		} else {
			one_line_or_empty(err);
		}
		json_decref(msg);
	}
	close(fd);
}

/* cove: data frames from the agent, ending in an exit record. */
static void host_side(const uint8_t *p, size_t len)
{
	int fd = stream_of(p, len);
	if (fd < 0)
		return;
	static uint8_t buf[WIRE_DATA_MAX];
	for (int i = 0; i < 64; i++) {
		uint8_t type;
		size_t n = 0;
		size_t cap = i & 1 ? 4096 : sizeof(buf);
		if (wire_data_read(fd, &type, buf, cap, &n) < 0)
			break;
		if (n > cap)
			abort();
		if (type == WIRE_EXIT) {
			int status = -1;
			if (agent_exit_parse((const char *)buf, n, &status) == 0 &&
			    (status < 0 || status > 255))
				abort();
			break;
		}
	}
	close(fd);
}

/* Both: the pure parsers over the bytes as they are. */
static void pure(const uint8_t *p, size_t len)
{
	uint32_t n;
	if (len >= 4 && wire_len_parse(p, WIRE_MSG_MAX, &n) == 0 && n > WIRE_MSG_MAX)
		abort();
	json_t *j = NULL;
	char err[256] = "";
	if (wire_msg_parse((const char *)p, len, &j, err, sizeof(err)) == 0)
		json_decref(j);
	else
		one_line_or_empty(err);
	char *line = fuzz_strdup(p, len);
	if (!line)
		return;
	err[0] = '\0';
	(void)agent_connect_reply_parse(line, err, sizeof(err));
	one_line_or_empty(err);
	/* A passwd file from the input, and a user named by its first line. */
	const char *nl = strchr(line, '\n');
	char user[64] = "";
	if (nl && nl - line < (long)sizeof(user))
		memcpy(user, line, (size_t)(nl - line));
	struct pw_ent pw;
	if (passwd_find(line, len, user[0] ? user : "root", &pw) == 0 &&
	    (!memchr(pw.name, 0, sizeof(pw.name)) || !memchr(pw.home, 0, sizeof(pw.home)) ||
	     !memchr(pw.shell, 0, sizeof(pw.shell))))
		abort();
	free(line);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return 0;
	switch (data[0] % 3) {
	case 0:
		guest_side(data + 1, size - 1);
		break;
	case 1:
		host_side(data + 1, size - 1);
		break;
	default:
		pure(data + 1, size - 1);
	}
	return 0;
}
