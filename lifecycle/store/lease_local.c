/* This host's records of a sandbox's lease and base generation (lease.h). */
#include "lifecycle/store/lease.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include <jansson.h>

#define LOCAL_MAX 4096

/* Writes text as `name` beneath dfd: a temporary file, fsync, rename over. */
static int put_file(int dfd, const char *name, const char *text)
{
	char tmp[128];
	snprintf(tmp, sizeof(tmp), ".%s.tmp", name);
	int fd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
	if (fd < 0)
		return -errno;
	size_t n = strlen(text);
	int r = write(fd, text, n) == (ssize_t)n && fsync(fd) == 0 ? 0 : -EIO;
	close(fd);
	if (!r && renameat(dfd, tmp, dfd, name) < 0)
		r = -errno;
	if (r)
		unlinkat(dfd, tmp, 0);
	return r;
}

/* Reads `name` beneath dfd (at most LOCAL_MAX - 1 bytes) into buf, NUL-terminated. */
static int get_file(int dfd, const char *name, char *buf)
{
	int fd = openat(dfd, name, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
	if (fd < 0)
		return -errno;
	ssize_t n = read(fd, buf, LOCAL_MAX);
	close(fd);
	if (n < 0 || n >= LOCAL_MAX)
		return n < 0 ? -EIO : -EFBIG;
	buf[n] = '\0';
	return 0;
}

int store_lease_save(int dfd, const struct store_lease *l)
{
	json_t *o =
	    json_pack("{s:s,s:s,s:I,s:I,s:I,s:s}", "sandbox", l->sandbox, "host", l->host, "epoch",
		      (json_int_t)l->epoch, "generation", (json_int_t)l->generation, "expires_ms",
		      (json_int_t)l->expires_ms, "etag", l->etag);
	char *text = o ? json_dumps(o, JSON_COMPACT) : NULL;
	json_decref(o);
	int r = text ? put_file(dfd, STORE_LEASE_FILE, text) : -ENOMEM;
	free(text);
	return r;
}

int store_lease_load(int dfd, struct store_lease *l)
{
	char *buf = malloc(LOCAL_MAX);
	int r = buf ? get_file(dfd, STORE_LEASE_FILE, buf) : -ENOMEM;
	json_t *o = r ? NULL : json_loads(buf, JSON_REJECT_DUPLICATES, NULL);
	free(buf);
	if (r)
		return r;
	const char *sbx = json_string_value(json_object_get(o, "sandbox"));
	const char *host = json_string_value(json_object_get(o, "host"));
	const char *etag = json_string_value(json_object_get(o, "etag"));
	json_t *ep = json_object_get(o, "epoch"), *g = json_object_get(o, "generation"),
	       *ex = json_object_get(o, "expires_ms");
	memset(l, 0, sizeof(*l));
	if (!sbx || !host || !etag || strlen(sbx) > SBX_NAME_MAX ||
	    strlen(host) > STORE_HOST_ID_MAX || strlen(etag) > S3_ETAG_MAX ||
	    !json_is_integer(ep) || !json_is_integer(g) || !json_is_integer(ex)) {
		json_decref(o);
		return -EBADMSG;
	}
	memcpy(l->sandbox, sbx, strlen(sbx) + 1);
	memcpy(l->host, host, strlen(host) + 1);
	memcpy(l->etag, etag, strlen(etag) + 1);
	l->epoch = (uint64_t)json_integer_value(ep);
	l->generation = (uint64_t)json_integer_value(g);
	l->expires_ms = json_integer_value(ex);
	json_decref(o);
	return 0;
}

int store_base_save(int dfd, uint64_t gen)
{
	char text[32];
	snprintf(text, sizeof(text), "%llu\n", (unsigned long long)gen);
	return put_file(dfd, STORE_BASE_FILE, text);
}

int store_base_load(int dfd, uint64_t *gen)
{
	char buf[LOCAL_MAX];
	int r = get_file(dfd, STORE_BASE_FILE, buf);
	if (r)
		return r;
	char *end;
	errno = 0;
	unsigned long long v = strtoull(buf, &end, 10);
	if (errno || end == buf || (*end && *end != '\n') || v > INT64_MAX)
		return -EBADMSG;
	*gen = v;
	return 0;
}
