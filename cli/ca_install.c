/* The sandbox's CA certificate into the guest's trust store, through the agent's put and get. */
#include "cli/ca_install.h"
#include "proto/trust_paths.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdbool.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/dirfd_io.h"
#include "common/errmsg.h"
#include "common/fd_io.h"
#include "lifecycle/broker.h"
#include "proto/agent_wire.h"
#include "sandbox/agent_client.h"

#define PEM_BEGIN "-----BEGIN CERTIFICATE-----\n"
#define PEM_END	  "-----END CERTIFICATE-----\n"

static bool one_pem_cert(const char *pem, size_t len)
{
	size_t bl = strlen(PEM_BEGIN), el = strlen(PEM_END);

	return len > bl + el && len <= CA_PEM_MAX && !memcmp(pem, PEM_BEGIN, bl) &&
	       !memcmp(pem + len - el, PEM_END, el) && !memchr(pem, '\0', len) &&
	       memmem(pem + bl, len - bl, "-----", 5) == pem + len - el;
}

int ca_bundle_append(const char *old, size_t oldlen, const char *pem, size_t pemlen, char **out,
		     size_t *outlen)
{
	size_t nl, total;
	char *b;

	*out = NULL;
	*outlen = 0;
	if (!one_pem_cert(pem, pemlen))
		return -EINVAL;
	if (oldlen >= pemlen && memmem(old, oldlen, pem, pemlen))
		return 1;
	nl = oldlen && old[oldlen - 1] != '\n';
	total = oldlen + nl + pemlen;
	if (total > CA_BUNDLE_MAX)
		return -E2BIG;
	b = malloc(total);
	if (!b)
		return -ENOMEM;
	if (oldlen)
		memcpy(b, old, oldlen);
	if (nl)
		b[oldlen] = '\n';
	memcpy(b + oldlen + nl, pem, pemlen);
	*out = b;
	*outlen = total;
	return 0;
}

int ca_bundle_replace(const char *old, size_t oldlen, const char *stale, size_t stalelen,
		      const char *pem, size_t pemlen, char **out, size_t *outlen)
{
	char *kept = NULL;
	size_t klen = 0;
	const char *p = old, *end = old + oldlen, *hit;
	int ret, removed = 0;

	*out = NULL;
	*outlen = 0;
	if (!one_pem_cert(pem, pemlen))
		return -EINVAL;
	if (!stale || !one_pem_cert(stale, stalelen) ||
	    (stalelen == pemlen && !memcmp(stale, pem, pemlen)))
		return ca_bundle_append(old, oldlen, pem, pemlen, out, outlen);
	kept = malloc(oldlen + 1);
	if (!kept)
		return -ENOMEM;
	while (p < end && (hit = memmem(p, (size_t)(end - p), stale, stalelen))) {
		memcpy(kept + klen, p, (size_t)(hit - p));
		klen += (size_t)(hit - p);
		p = hit + stalelen;
		removed = 1;
	}
	memcpy(kept + klen, p, (size_t)(end - p));
	klen += (size_t)(end - p);
	ret = ca_bundle_append(kept, klen, pem, pemlen, out, outlen);
	if (ret == 1 && removed) {
		/* The new one was there already, the stale one is gone: the shorter bundle. */
		*out = kept;
		*outlen = klen;
		return 0;
	}
	free(kept);
	return ret;
}

/* The host's copy of the CA certificate: 0 with *pem (malloc'd), 1 when there is none. */
static int read_cert(int dfd, char **pem, size_t *len, char *err, size_t errlen)
{
	char *buf = malloc(CA_PEM_MAX + 1);
	int fd, cfd;
	ssize_t n;

	if (!buf)
		return errmsg(err, errlen, -ENOMEM, "out of memory");
	cfd = openat(dfd, SBX_BROKER_MITM_CA, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	fd = cfd < 0 ? -errno : dirfd_open(cfd, SBX_BROKER_MITM_CA_CERT, O_RDONLY | O_CLOEXEC);
	if (cfd >= 0)
		close(cfd);
	if (fd == -ENOENT) {
		free(buf);
		return 1;
	}
	if (fd < 0) {
		free(buf);
		return errmsg(err, errlen, fd, "%s/%s: %s", SBX_BROKER_MITM_CA,
			      SBX_BROKER_MITM_CA_CERT, strerror(-fd));
	}
	n = read_upto(fd, buf, CA_PEM_MAX + 1);
	close(fd);
	if (n < 0 || !one_pem_cert(buf, (size_t)n)) {
		free(buf);
		return errmsg(err, errlen, -EINVAL,
			      "%s/%s: not one PEM certificate of at most %d bytes",
			      SBX_BROKER_MITM_CA, SBX_BROKER_MITM_CA_CERT, CA_PEM_MAX);
	}
	*pem = buf;
	*len = (size_t)n;
	return 0;
}

/* {"op":"put"} path with data. 0 or -errno with err. */
static int guest_put(const char *uds, const char *path, int mode, const char *data, size_t len,
		     char *err, size_t errlen)
{
	json_t *req = json_pack("{s:s,s:s,s:i,s:I}", "op", "put", "path", path, "mode", mode,
				"size", (json_int_t)len),
	       *reply = NULL;
	int fd, ret;

	if (!req)
		return errmsg(err, errlen, -ENOMEM, "out of memory");
	fd = agent_call(uds, 0, req, &reply, err, errlen);
	json_decref(req);
	if (fd < 0)
		return fd;
	json_decref(reply);
	reply = NULL;
	ret = write_full(fd, data, len);
	if (ret < 0) {
		close(fd);
		return errmsg(err, errlen, ret, "agent: send: %s", strerror(-ret));
	}
	ret = wire_msg_read(fd, &reply, err, errlen);
	if (!ret && !json_is_true(json_object_get(reply, "ok"))) {
		const char *e = json_string_value(json_object_get(reply, "error"));

		ret = errmsg(err, errlen, -EREMOTEIO, "%s: %s", path, e ? e : "refused");
	}
	json_decref(reply);
	close(fd);
	return ret;
}

/* {"op":"get"}: 0 with *data (malloc'd, at most CA_BUNDLE_MAX) and *mode; 1 when the guest has
 * no such file (the agent refused: it does not exist, or is no regular file). */
static int guest_get(const char *uds, const char *path, char **data, size_t *len, int *mode,
		     char *err, size_t errlen)
{
	json_t *req = json_pack("{s:s,s:s}", "op", "get", "path", path), *reply = NULL, *js, *jm;
	json_int_t size;
	char *buf;
	int fd, ret;

	if (!req)
		return errmsg(err, errlen, -ENOMEM, "out of memory");
	fd = agent_call(uds, 0, req, &reply, err, errlen);
	json_decref(req);
	if (fd == -EREMOTEIO)
		return 1;
	if (fd < 0)
		return fd;
	js = json_object_get(reply, "size");
	jm = json_object_get(reply, "mode");
	size = json_integer_value(js);
	if (!json_is_integer(js) || size < 0 || size > CA_BUNDLE_MAX || !json_is_integer(jm) ||
	    json_integer_value(jm) < 0 || json_integer_value(jm) > 07777) {
		json_decref(reply);
		close(fd);
		return errmsg(err, errlen, -EPROTO, "%s: bad size or mode (or over %d MiB)", path,
			      CA_BUNDLE_MAX >> 20);
	}
	*mode = (int)json_integer_value(jm);
	json_decref(reply);
	buf = malloc((size_t)size + 1);
	if (!buf) {
		close(fd);
		return errmsg(err, errlen, -ENOMEM, "out of memory");
	}
	ret = size ? read_full(fd, buf, (size_t)size) : 0;
	close(fd);
	if (ret < 0) {
		free(buf);
		return errmsg(err, errlen, -EIO, "%s: connection lost", path);
	}
	*data = buf;
	*len = (size_t)size;
	return 0;
}

/* One bundle: the sandbox's CA in place of the stale one, the file's mode kept. 1 when the
 * guest has no such file. */
static int bundle_update(const char *uds, const char *path, const char *stale, size_t stalelen,
			 const char *pem, size_t pemlen, char *err, size_t errlen)
{
	char *old = NULL, *joined = NULL;
	size_t oldlen = 0, jlen = 0;
	int mode = 0644;
	int ret = guest_get(uds, path, &old, &oldlen, &mode, err, errlen);
	if (ret)
		return ret;
	ret = ca_bundle_replace(old, oldlen, stale, stalelen, pem, pemlen, &joined, &jlen);
	if (ret == 0)
		ret = guest_put(uds, path, mode, joined, jlen, err, errlen);
	else if (ret == 1)
		ret = 0;
	else
		errmsg(err, errlen, ret, "%s: %s", path, strerror(-ret));
	free(old);
	free(joined);
	return ret;
}

int sbx_ca_install(int dfd, const char *uds, char *err, size_t errlen)
{
	char *pem = NULL, *stale = NULL;
	size_t pemlen = 0, stalelen = 0;
	int smode, ret;

	ret = read_cert(dfd, &pem, &pemlen, err, errlen);
	if (ret)
		return ret > 0 ? 0 : ret;
	/* What the guest trusted before (the template's CA): the guest's bytes, only ever compared
	 * with its own bundles. */
	ret = guest_get(uds, CA_INSTALL_CERT, &stale, &stalelen, &smode, err, errlen);
	if (ret == 1)
		ret = guest_get(uds, TRUST_CA_FALLBACK, &stale, &stalelen, &smode, err, errlen);
	if (ret < 0)
		goto out;
	/* An image without update-ca-certificates' directory (a distroless one): cove-init's
	 * tmpfs, where its SSL_CERT_FILE and NODE_EXTRA_CA_CERTS then point. */
	ret = guest_put(uds, CA_INSTALL_CERT, 0644, pem, pemlen, err, errlen);
	if (ret)
		ret = guest_put(uds, TRUST_CA_FALLBACK, 0644, pem, pemlen, err, errlen);
	if (ret)
		goto out;
	/* The bundles TLS stacks read (curl, git, pip through certifi's fallback, OpenSSL's default
	 * file, each distribution's own): appended here so nothing in the guest needs to run
	 * update-ca-certificates first. */
	for (size_t i = 0; i < TRUST_BUNDLES; i++) {
		ret =
		    bundle_update(uds, trust_bundles[i], stale, stalelen, pem, pemlen, err, errlen);
		if (ret < 0)
			goto out;
	}
	ret = 0;
out:
	free(pem);
	free(stale);
	return ret;
}
