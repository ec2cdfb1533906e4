/* cove-fetch: asks cove-broker (through cove-init's /run/cove/broker.sock) to make an HTTP request
 * with a named credential; the secret stays on the host. Prints the body on stdout. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include "agent.h"
#include "common/base64.h"
#include "cove-init.h"

#define HEADERS_MAX 64
#define DATA_MAX (512u * 1024) /* the body travels base64'd inside a 1 MiB message */

static void usage(void)
{
	fprintf(stderr, "usage: cove-fetch [-v] [--credential NAME] [-X METHOD] [-H 'K: V']... "
			"[-d DATA|@FILE] URL\n");
}

/* -d @FILE reads the body from a file ("-" for stdin), like curl. */
static int read_data(const char *arg, char **out, size_t *len)
{
	FILE *f;
	size_t n = 0;
	char *buf;

	if (arg[0] != '@') {
		*len = strlen(arg);
		*out = strdup(arg);
		return *out ? 0 : -ENOMEM;
	}
	f = strcmp(arg + 1, "-") == 0 ? stdin : fopen(arg + 1, "rb");
	if (!f)
		return -errno;
	buf = malloc(DATA_MAX + 1);
	if (buf)
		n = fread(buf, 1, DATA_MAX + 1, f);
	if (f != stdin)
		fclose(f);
	if (!buf)
		return -ENOMEM;
	if (n > DATA_MAX) {
		free(buf);
		return -EFBIG;
	}
	*out = buf;
	*len = n;
	return 0;
}

static int broker_sock(void)
{
	struct sockaddr_un sun = {.sun_family = AF_UNIX};
	const char *path = getenv("COVE_BROKER_SOCK");
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (!path)
		path = BROKER_SOCK;
	if (fd < 0)
		return -errno;
	snprintf(sun.sun_path, sizeof(sun.sun_path), "%s", path);
	if (connect(fd, (struct sockaddr *)&sun, sizeof(sun)) < 0) {
		int e = errno;

		close(fd);
		return -e;
	}
	return fd;
}

int main(int argc, char **argv)
{
	const char *credential = NULL, *method = NULL, *url = NULL, *headers[HEADERS_MAX];
	char *data = NULL, *b64 = NULL, err[256];
	size_t nheaders = 0, data_len = 0;
	bool verbose = false;
	json_t *req, *jh, *reply = NULL;
	int fd, ret, status;

	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		bool has_val = i + 1 < argc;

		if (strcmp(a, "-v") == 0 || strcmp(a, "--verbose") == 0) {
			verbose = true;
		} else if ((strcmp(a, "--credential") == 0 || strcmp(a, "-c") == 0) && has_val) {
			credential = argv[++i];
		} else if (strncmp(a, "--credential=", 13) == 0) {
			credential = a + 13;
		} else if ((strcmp(a, "-X") == 0 || strcmp(a, "--request") == 0) && has_val) {
			method = argv[++i];
		} else if ((strcmp(a, "-H") == 0 || strcmp(a, "--header") == 0) && has_val) {
			if (nheaders == HEADERS_MAX) {
				fprintf(stderr, "cove-fetch: more than %d headers\n", HEADERS_MAX);
				return 2;
			}
			headers[nheaders++] = argv[++i];
		} else if ((strcmp(a, "-d") == 0 || strcmp(a, "--data") == 0) && has_val) {
			free(data);
			ret = read_data(argv[++i], &data, &data_len);
			if (ret < 0) {
				fprintf(stderr, "cove-fetch: -d %s: %s\n", argv[i], strerror(-ret));
				return 2;
			}
		} else if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) {
			usage();
			return 0;
		} else if (a[0] == '-' || url) {
			usage();
			return 2;
		} else {
			url = a;
		}
	}
	if (!url) {
		usage();
		return 2;
	}
	if (!method)
		method = data ? "POST" : "GET";

	req = json_pack("{s:i,s:s,s:s}", "v", 1, "method", method, "url", url);
	jh = json_array();
	if (!req || !jh) {
		fprintf(stderr, "cove-fetch: out of memory\n");
		return 1;
	}
	if (credential)
		json_object_set_new(req, "credential", json_string(credential));
	for (size_t i = 0; i < nheaders; i++)
		json_array_append_new(jh, json_string(headers[i]));
	json_object_set_new(req, "headers", jh);
	if (data) {
		b64 = malloc(b64_enc_len(data_len) + 1);
		if (!b64) {
			fprintf(stderr, "cove-fetch: out of memory\n");
			return 1;
		}
		b64_encode((unsigned char *)data, data_len, b64);
		json_object_set_new(req, "body_b64", json_string(b64));
	}

	fd = broker_sock();
	if (fd < 0) {
		fprintf(stderr, "cove-fetch: %s: %s\n", BROKER_SOCK, strerror(-fd));
		return 1;
	}
	ret = wire_msg_write(fd, req);
	if (ret < 0) {
		fprintf(stderr, "cove-fetch: send: %s\n", strerror(-ret));
		return 1;
	}
	ret = wire_msg_read(fd, &reply, err, sizeof(err));
	close(fd);
	if (ret < 0) {
		fprintf(stderr, "cove-fetch: reply: %s\n", err);
		return 1;
	}
	if (!json_is_true(json_object_get(reply, "ok"))) {
		const char *e = json_string_value(json_object_get(reply, "error"));

		fprintf(stderr, "cove-fetch: %s\n", e ? e : "request refused");
		return 1;
	}
	status = (int)json_integer_value(json_object_get(reply, "status"));
	if (verbose) {
		size_t i;
		json_t *h;

		fprintf(stderr, "< HTTP %d\n", status);
		json_array_foreach(json_object_get(reply, "headers"), i, h)
			if (json_is_string(h))
				fprintf(stderr, "< %s\n", json_string_value(h));
	}
	const char *body64 = json_string_value(json_object_get(reply, "body_b64"));

	if (body64) {
		size_t blen = strlen(body64), n = 0;
		unsigned char *body = malloc(blen / 4 * 3 + 3);

		if (!body || b64_decode_loose(body64, blen, body, blen / 4 * 3 + 3, &n) < 0) {
			fprintf(stderr, "cove-fetch: reply: bad body_b64\n");
			return 1;
		}
		if (n && fwrite(body, 1, n, stdout) != n) {
			fprintf(stderr, "cove-fetch: stdout: %s\n", strerror(errno));
			return 1;
		}
		free(body);
	}
	if (fflush(stdout) != 0)
		return 1;
	json_decref(reply);
	json_decref(req);
	free(b64);
	free(data);
	if (status >= 400) {
		if (!verbose)
			fprintf(stderr, "cove-fetch: HTTP %d\n", status);
		return 22;
	}
	return 0;
}
