/* Audit log: each line is a compact JSON record ending in "hash" (SHA-256 of the line without
 * the hash field), then "mac" (HMAC-SHA256 under the broker's key of the line without the mac
 * field), and carrying "prev" (SHA-256 of the whole previous line). The hashes alone can be
 * recomputed by anyone who rewrites the file; the MAC cannot without the key, which lives
 * outside the log. Secrets never enter a record: only names, the method, the (sanitized) URL,
 * the decision and its reason. */
#include "audit.h"
#include "common/errmsg.h"
#include "common/fd_io.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#define ZERO_HASH "0000000000000000000000000000000000000000000000000000000000000000"
#define HASH_TAIL ",\"hash\":\""
#define MAC_TAIL  ",\"mac\":\""

static void hex64(const unsigned char md[32], char out[65])
{
	unsigned int i;

	for (i = 0; i < 32; i++)
		snprintf(out + 2 * i, 3, "%02x", md[i]);
	out[64] = '\0';
}

/* HMAC-SHA256 of data under key as 64 hex digits; -EIO if OpenSSL fails. */
static int mac_hex(const uint8_t *key, const void *data, size_t len, char out[65])
{
	unsigned char md[32];
	unsigned int mdlen = 0;

	if (!HMAC(EVP_sha256(), key, AUDIT_KEY_LEN, data, len, md, &mdlen) || mdlen != 32)
		return -EIO;
	hex64(md, out);
	return 0;
}

void audit_sha256_hex(const void *data, size_t len, char out[65])
{
	unsigned char md[32];
	unsigned int mdlen = 0;

	EVP_Digest(data, len, md, &mdlen, EVP_sha256(), NULL);
	hex64(md, out);
}

/* Printable ASCII only, capped, so any guest bytes become valid JSON strings. */
static json_t *clean_str(const char *s, size_t cap)
{
	size_t n = s ? strlen(s) : 0, i, o = 0;
	char *b;
	json_t *j;

	if (n > cap)
		n = cap;
	b = malloc(n + 4);
	if (!b)
		return NULL;
	for (i = 0; i < n; i++)
		b[o++] = (s[i] >= 0x20 && s[i] < 0x7f) ? s[i] : '?';
	if (s && strlen(s) > cap) {
		memcpy(b + o, "...", 3);
		o += 3;
	}
	j = json_stringn(b, o);
	free(b);
	return j;
}

/* Dumps o (which ends in "prev") and splices "hash" and, with a key, "mac" in at its end. */
static char *seal(json_t *o, const uint8_t *key)
{
	char *body, *line = NULL, hash[65], mac[65];
	size_t bl;

	body = json_dumps(o, JSON_COMPACT | JSON_PRESERVE_ORDER | JSON_ENSURE_ASCII);
	if (!body)
		return NULL;
	audit_sha256_hex(body, strlen(body), hash);
	bl = strlen(body);
	/* body ends in '}': splice the hash field in before it. */
	line = malloc(bl + sizeof(HASH_TAIL) + sizeof(MAC_TAIL) + 2 * 64 + 4);
	if (!line)
		goto out;
	sprintf(line, "%.*s" HASH_TAIL "%s\"}", (int)(bl - 1), body, hash);
	/* The MAC covers the line as it stands, hash included: splice it in the same way. */
	if (key) {
		bl = strlen(line);
		if (mac_hex(key, line, bl, mac)) {
			free(line);
			line = NULL;
			goto out;
		}
		sprintf(line + bl - 1, MAC_TAIL "%s\"}", mac);
	}
out:
	free(body);
	return line;
}

char *audit_format(const struct audit_rec *r, uint64_t seq, const char *prev, const char *ts,
		   const uint8_t *key)
{
	json_t *o = json_object();
	char *line = NULL;

	if (!o)
		return NULL;
	if (json_object_set_new(o, "ts", json_string(ts)) ||
	    json_object_set_new(o, "seq", json_integer((json_int_t)seq)) ||
	    json_object_set_new(o, "epoch", json_integer((json_int_t)r->epoch)) ||
	    json_object_set_new(o, "credential", clean_str(r->credential, 128)) ||
	    json_object_set_new(o, "method", clean_str(r->method, 32)) ||
	    json_object_set_new(o, "url", clean_str(r->url, AUDIT_URL_MAX)) ||
	    json_object_set_new(o, "decision", json_string(r->decision)) ||
	    json_object_set_new(o, "reason", clean_str(r->reason, 512)) ||
	    json_object_set_new(o, "status", json_integer(r->status)) ||
	    json_object_set_new(o, "prev", json_string(prev)))
		goto out;
	line = seal(o, key);
out:
	json_decref(o);
	return line;
}

static void now_iso(char *buf, size_t cap)
{
	struct timespec ts;
	struct tm tm;

	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	snprintf(buf, cap, "%04d-%02d-%02dT%02d:%02d:%02d.%03ldZ", tm.tm_year + 1900, tm.tm_mon + 1,
		 tm.tm_mday, tm.tm_hour, tm.tm_min, tm.tm_sec, (long)(ts.tv_nsec / 1000000) % 1000);
}

/* Writes one sealed line (under a->lock) and moves the chain on. */
static int write_line(struct audit *a, char *line)
{
	size_t len = strlen(line);
	int ret;

	line[len] = '\n'; /* one write() per record keeps O_APPEND lines whole */
	ret = write_full(a->fd, line, len + 1);
	if (!ret && fsync(a->fd))
		ret = -errno;
	if (!ret) {
		a->seq++;
		audit_sha256_hex(line, len, a->prev);
	}
	return ret;
}

static void audit_lock(struct audit *a)
{
	if (a->lock_ready)
		pthread_mutex_lock(&a->lock);
}

static void audit_unlock(struct audit *a)
{
	if (a->lock_ready)
		pthread_mutex_unlock(&a->lock);
}

int audit_append(struct audit *a, const struct audit_rec *r)
{
	char ts[80], *line;
	int ret = -ENOMEM;

	audit_lock(a);
	now_iso(ts, sizeof(ts));
	line = audit_format(r, a->seq + 1, a->prev, ts, a->keyed ? a->key : NULL);
	if (line)
		ret = write_line(a, line);
	audit_unlock(a);
	free(line);
	return ret;
}

int audit_append_fields(struct audit *a, json_t *fields)
{
	json_t *o = json_object(), *v;
	char ts[80], *line = NULL;
	const char *k;
	int ret = -ENOMEM;

	if (!o)
		return -ENOMEM;
	audit_lock(a);
	now_iso(ts, sizeof(ts));
	if (json_object_set_new(o, "ts", json_string(ts)) ||
	    json_object_set_new(o, "seq", json_integer((json_int_t)(a->seq + 1))))
		goto out;
	json_object_foreach(fields, k, v)
	{
		if (!strcmp(k, "ts") || !strcmp(k, "seq") || !strcmp(k, "prev") ||
		    !strcmp(k, "hash") || !strcmp(k, "mac")) {
			ret = -EINVAL;
			goto out;
		}
		if (json_object_set(o, k, v))
			goto out;
	}
	if (json_object_set_new(o, "prev", json_string(a->prev)))
		goto out;
	line = seal(o, a->keyed ? a->key : NULL);
	if (line)
		ret = write_line(a, line);
out:
	audit_unlock(a);
	free(line);
	json_decref(o);
	return ret;
}

/* True when line (len bytes) ends in TAIL, 64 characters and "}. */
static bool has_tail(const char *line, size_t len, const char *tail)
{
	size_t tl = strlen(tail);

	return len >= tl + 64 + 2 + 2 && !memcmp(line + len - 66 - tl, tail, tl) &&
	       !memcmp(line + len - 2, "\"}", 2);
}

/* Checks one line's MAC (with a key) and its own hash, and returns its parsed seq and prev
 * through the out params. */
static int check_line(const char *line, size_t len, const uint8_t *key, uint64_t *seq,
		      char prev[65], char *why, size_t whylen)
{
	const size_t tl = sizeof(HASH_TAIL) - 1, ml = sizeof(MAC_TAIL) - 1;
	char *body, hash[65], mac[65], *unmac = NULL;
	json_t *o, *jseq, *jprev;
	json_error_t jerr;
	int r = -EINVAL;

	if (has_tail(line, len, MAC_TAIL)) {
		/* The line the MAC covers: everything before the mac field, then '}'. */
		unmac = malloc(len);
		if (!unmac)
			return -ENOMEM;
		memcpy(unmac, line, len - 66 - ml);
		unmac[len - 66 - ml] = '}';
		if (key && (mac_hex(key, unmac, len - 65 - ml, mac) ||
			    CRYPTO_memcmp(mac, line + len - 66, 64))) {
			free(unmac);
			return errmsg(
			    why, whylen, -EINVAL,
			    "mac does not match (rewritten, or written under another key)");
		}
		line = unmac;
		len = len - 65 - ml;
	} else if (key) {
		return errmsg(why, whylen, -EINVAL, "no \"mac\" field (written without the key)");
	}
	if (!has_tail(line, len, HASH_TAIL)) {
		free(unmac);
		return errmsg(why, whylen, -EINVAL, "no trailing \"hash\" field");
	}
	body = malloc(len);
	if (!body) {
		free(unmac);
		return -ENOMEM;
	}
	memcpy(body, line, len - 66 - tl);
	body[len - 66 - tl] = '}';
	audit_sha256_hex(body, len - 65 - tl, hash);
	r = memcmp(hash, line + len - 66, 64);
	free(unmac);
	if (r) {
		free(body);
		return errmsg(why, whylen, -EINVAL, "hash does not match the record");
	}
	r = -EINVAL;
	o = json_loadb(body, len - 65 - tl, JSON_REJECT_DUPLICATES, &jerr);
	free(body);
	if (!o)
		return errmsg(why, whylen, -EINVAL, "not JSON: %s", jerr.text);
	jseq = json_object_get(o, "seq");
	jprev = json_object_get(o, "prev");
	if (!json_is_integer(jseq) || json_integer_value(jseq) < 1 || !json_is_string(jprev) ||
	    strlen(json_string_value(jprev)) != 64) {
		errmsg(why, whylen, -EINVAL, "missing seq or prev");
		goto out;
	}
	*seq = (uint64_t)json_integer_value(jseq);
	memcpy(prev, json_string_value(jprev), 65);
	r = 0;
out:
	json_decref(o);
	return r;
}

size_t audit_verify_buf(const char *buf, size_t len, const uint8_t *key, size_t *nrec, char *why,
			size_t whylen)
{
	char last[65] = ZERO_HASH, prev[65];
	size_t pos = 0, lineno = 0;
	uint64_t expect = 1, seq;

	*nrec = 0;
	while (pos < len) {
		const char *line = buf + pos, *nl = memchr(line, '\n', len - pos);
		size_t ll;

		lineno++;
		if (!nl) {
			errmsg(why, whylen, -EINVAL, "last line has no newline (torn write?)");
			return lineno;
		}
		ll = (size_t)(nl - line);
		pos += ll + 1;
		if (ll > AUDIT_LINE_MAX) {
			errmsg(why, whylen, -EINVAL, "line over %d bytes", AUDIT_LINE_MAX);
			return lineno;
		}
		if (check_line(line, ll, key, &seq, prev, why, whylen))
			return lineno;
		if (strcmp(prev, last)) {
			errmsg(why, whylen, -EINVAL,
			       "prev does not match the previous line (line missing or changed)");
			return lineno;
		}
		if (seq != expect) {
			errmsg(why, whylen, -EINVAL, "seq %llu, expected %llu",
			       (unsigned long long)seq, (unsigned long long)expect);
			return lineno;
		}
		expect++;
		audit_sha256_hex(line, ll, last);
		(*nrec)++;
	}
	return 0;
}

static int read_all(int fd, char **out, size_t *outlen)
{
	size_t cap = 65536, len = 0;
	char *buf = malloc(cap), *nb;

	if (!buf)
		return -ENOMEM;
	for (;;) {
		ssize_t n;

		if (len == cap) {
			nb = realloc(buf, cap * 2);
			if (!nb) {
				free(buf);
				return -ENOMEM;
			}
			buf = nb;
			cap *= 2;
		}
		n = read_upto(fd, buf + len, cap - len);
		if (n < 0) {
			free(buf);
			return (int)n;
		}
		len += (size_t)n;
		if (len < cap)
			break; /* end of file */
	}
	*out = buf;
	*outlen = len;
	return 0;
}

long audit_verify_file(const char *path, const uint8_t *key, size_t *nrec, char *why, size_t whylen)
{
	char *buf;
	size_t len;
	int fd = open(path, O_RDONLY | O_CLOEXEC), r;
	long bad;

	if (fd < 0)
		return errmsg(why, whylen, -errno, "%s: %s", path, strerror(errno));
	r = read_all(fd, &buf, &len);
	close(fd);
	if (r)
		return errmsg(why, whylen, r, "%s: read: %s", path, strerror(-r));
	bad = (long)audit_verify_buf(buf, len, key, nrec, why, whylen);
	free(buf);
	return bad;
}

int audit_open(struct audit *a, const char *path, const uint8_t *key, char *err, size_t errlen)
{
	char *buf = NULL, prev[65], why[256];
	size_t len = 0, end, start;
	uint64_t seq;
	int r;

	a->seq = 0;
	memcpy(a->prev, ZERO_HASH, 65);
	a->keyed = key != NULL;
	if (key)
		memcpy(a->key, key, AUDIT_KEY_LEN);
	a->lock_ready = pthread_mutex_init(&a->lock, NULL) == 0;
	a->fd = open(path, O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0600);
	if (a->fd < 0)
		return errmsg(err, errlen, -errno, "audit %s: %s", path, strerror(errno));
	{
		int rfd = open(path, O_RDONLY | O_CLOEXEC);

		if (rfd < 0) {
			r = errmsg(err, errlen, -errno, "audit %s: %s", path, strerror(errno));
			goto fail;
		}
		r = read_all(rfd, &buf, &len);
		close(rfd);
		if (r) {
			errmsg(err, errlen, r, "audit %s: read failed", path);
			goto fail;
		}
	}
	if (len == 0) {
		free(buf);
		return 0;
	}
	/* Continue the chain from the last complete line. */
	if (buf[len - 1] != '\n') {
		r = errmsg(err, errlen, -EINVAL,
			   "audit %s: last line is incomplete; run verify-audit and move it away",
			   path);
		goto fail;
	}
	end = len - 1;
	start = end;
	while (start > 0 && buf[start - 1] != '\n')
		start--;
	if (check_line(buf + start, end - start, key, &seq, prev, why, sizeof(why))) {
		r = errmsg(err, errlen, -EINVAL, "audit %s: last line: %s", path, why);
		goto fail;
	}
	a->seq = seq;
	audit_sha256_hex(buf + start, end - start, a->prev);
	free(buf);
	return 0;
fail:
	free(buf);
	audit_close(a);
	return r;
}

void audit_close(struct audit *a)
{
	if (a->fd >= 0)
		close(a->fd);
	a->fd = -1;
	OPENSSL_cleanse(a->key, sizeof(a->key));
	a->keyed = false;
	if (a->lock_ready)
		pthread_mutex_destroy(&a->lock);
	a->lock_ready = false;
}
