/* store.json: parsed with jansson, every field checked and capped; credentials from the
 * environment or a 0600 file owned by this uid. */
#include "lifecycle/store/store_config.h"

#include "common/errmsg.h"
#include "common/size_parse.h"
#include "lifecycle/cache.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void store_env_from_process(struct store_env *env)
{
	env->access_key_id = getenv("AWS_ACCESS_KEY_ID");
	env->secret_access_key = getenv("AWS_SECRET_ACCESS_KEY");
	env->session_token = getenv("AWS_SESSION_TOKEN");
}

void store_config_wipe(struct store_config *cfg)
{
	explicit_bzero(cfg->access_key_id, sizeof(cfg->access_key_id));
	explicit_bzero(cfg->secret_access_key, sizeof(cfg->secret_access_key));
	explicit_bzero(cfg->session_token, sizeof(cfg->session_token));
	explicit_bzero(cfg->fleet_key, sizeof(cfg->fleet_key));
	cfg->fleet_key_len = 0;
}

static bool printable(const char *s)
{
	for (; *s; s++)
		if ((unsigned char)*s < 0x21 || (unsigned char)*s > 0x7e)
			return false;
	return true;
}

/* Copies a string field of at most max bytes into dst. */
bool store_host_id_ok(const char *s)
{
	size_t n = strlen(s);
	if (n < 1 || n > STORE_HOST_ID_MAX)
		return false;
	for (size_t i = 0; i < n; i++)
		if (!((s[i] >= 'a' && s[i] <= 'z') || (s[i] >= 'A' && s[i] <= 'Z') ||
		      (s[i] >= '0' && s[i] <= '9') || s[i] == '.' || s[i] == '_' || s[i] == '-'))
			return false;
	return true;
}

static int copy_field(json_t *v, const char *name, char *dst, size_t max, char *err, size_t errlen)
{
	if (!json_is_string(v))
		return errmsg(err, errlen, -EINVAL, "store config: \"%s\" must be a string", name);
	size_t n = json_string_length(v);
	if (n > max)
		return errmsg(err, errlen, -ENAMETOOLONG,
			      "store config: \"%s\" is %zu bytes, at most %zu", name, n, max);
	if (strlen(json_string_value(v)) != n)
		return errmsg(err, errlen, -EINVAL, "store config: \"%s\" holds a NUL byte", name);
	memcpy(dst, json_string_value(v), n + 1);
	return 0;
}

/* S3 bucket names: 3-63 of [a-z0-9.-], starting and ending with a letter or digit. */
static bool bucket_ok(const char *b)
{
	size_t n = strlen(b);
	if (n < 3 || n > STORE_BUCKET_MAX)
		return false;
	for (size_t i = 0; i < n; i++) {
		char c = b[i];
		bool alnum = (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9');
		if (!alnum && c != '.' && c != '-')
			return false;
		if ((i == 0 || i == n - 1) && !alnum)
			return false;
	}
	return true;
}

static bool region_ok(const char *r)
{
	if (!*r)
		return false;
	for (; *r; r++)
		if (!((*r >= 'a' && *r <= 'z') || (*r >= '0' && *r <= '9') || *r == '-'))
			return false;
	return true;
}

/* scheme://host[:port][/]: no user info, path, query or fragment. */
static int endpoint_check(struct store_config *cfg, char *err, size_t errlen)
{
	char *e = cfg->endpoint;
	const char *host;
	if (!strncmp(e, "https://", 8)) {
		host = e + 8;
	} else if (!strncmp(e, "http://", 7)) {
		if (!cfg->insecure_http)
			return errmsg(err, errlen, -EPERM,
				      "store config: endpoint %s is plain http; TLS is required "
				      "(\"insecure_http\": true is for tests only)",
				      e);
		host = e + 7;
	} else {
		return errmsg(err, errlen, -EINVAL,
			      "store config: endpoint must start with https://");
	}
	size_t n = strlen(e);
	if (n && e[n - 1] == '/')
		e[--n] = '\0';
	if (!*host || !printable(host) || strpbrk(host, "/?#@\\"))
		return errmsg(err, errlen, -EINVAL,
			      "store config: endpoint %s must be scheme://host[:port] only", e);
	return 0;
}

static bool prefix_ok(const char *p)
{
	if (*p == '/')
		return false;
	for (; *p; p++)
		if ((unsigned char)*p < 0x20 || *p == 0x7f || *p == '\\')
			return false;
	return true;
}

static int creds_from_json(json_t *root, const char *what, struct store_config *cfg, char *err,
			   size_t errlen)
{
	const char *k;
	json_t *v;
	bool id = false, secret = false;
	json_object_foreach(root, k, v)
	{
		int r;
		if (!strcmp(k, "access_key_id")) {
			r = copy_field(v, k, cfg->access_key_id, STORE_KEY_ID_MAX, err, errlen);
			id = true;
		} else if (!strcmp(k, "secret_access_key")) {
			r = copy_field(v, k, cfg->secret_access_key, STORE_SECRET_MAX, err, errlen);
			secret = true;
		} else if (!strcmp(k, "session_token")) {
			r = copy_field(v, k, cfg->session_token, STORE_TOKEN_MAX, err, errlen);
		} else {
			return errmsg(err, errlen, -EINVAL, "%s: unknown key \"%.64s\"", what, k);
		}
		if (r)
			return r;
	}
	if (!id || !secret || !cfg->access_key_id[0] || !cfg->secret_access_key[0])
		return errmsg(err, errlen, -EINVAL, "%s: needs access_key_id and secret_access_key",
			      what);
	if (!printable(cfg->access_key_id) || !printable(cfg->secret_access_key) ||
	    !printable(cfg->session_token))
		return errmsg(err, errlen, -EINVAL, "%s: credentials hold non-printable bytes",
			      what);
	return 0;
}

int store_cred_file_read(const char *path, struct store_config *cfg, char *err, size_t errlen)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	if (fd < 0)
		return errmsg(err, errlen, -errno, "store credentials file %s: %s", path,
			      strerror(errno));
	struct stat st;
	char buf[STORE_CRED_FILE_MAX + 1];
	int r;
	if (fstat(fd, &st) < 0) {
		r = errmsg(err, errlen, -errno, "store credentials file %s: %s", path,
			   strerror(errno));
		goto out;
	}
	if (!S_ISREG(st.st_mode)) {
		r = errmsg(err, errlen, -EPERM, "store credentials file %s is not a regular file",
			   path);
		goto out;
	}
	if (st.st_uid != geteuid()) {
		r = errmsg(err, errlen, -EPERM,
			   "store credentials file %s is owned by uid %u, not this uid %u", path,
			   (unsigned)st.st_uid, (unsigned)geteuid());
		goto out;
	}
	if (st.st_mode & 077) {
		r = errmsg(err, errlen, -EPERM,
			   "store credentials file %s has mode %04o; it must be 0600 (no group or "
			   "other bits)",
			   path, (unsigned)(st.st_mode & 07777));
		goto out;
	}
	if (st.st_size > STORE_CRED_FILE_MAX) {
		r = errmsg(err, errlen, -EFBIG, "store credentials file %s is over %d bytes", path,
			   STORE_CRED_FILE_MAX);
		goto out;
	}
	ssize_t n = pread(fd, buf, sizeof(buf), 0);
	if (n < 0 || n > STORE_CRED_FILE_MAX) {
		r = errmsg(err, errlen, n < 0 ? -errno : -EFBIG,
			   "store credentials file %s: read failed or over %d bytes", path,
			   STORE_CRED_FILE_MAX);
		goto out;
	}
	json_error_t je;
	json_t *root = json_loadb(buf, (size_t)n, JSON_REJECT_DUPLICATES, &je);
	explicit_bzero(buf, sizeof(buf));
	if (!root || !json_is_object(root)) {
		/* je.text may quote a secret: say only where */
		r = errmsg(err, errlen, -EINVAL,
			   "store credentials file %s: not a JSON object (line %d)", path, je.line);
		json_decref(root);
		goto out;
	}
	r = creds_from_json(root, "store credentials file", cfg, err, errlen);
	json_decref(root);
out:
	close(fd);
	return r;
}

static int creds_from_env(const struct store_env *env, struct store_config *cfg, char *err,
			  size_t errlen)
{
	if (!env || !env->access_key_id || !env->secret_access_key || !*env->access_key_id ||
	    !*env->secret_access_key)
		return errmsg(err, errlen, -ENOKEY,
			      "store config: no credentials: set AWS_ACCESS_KEY_ID and "
			      "AWS_SECRET_ACCESS_KEY or name a \"credentials_file\"");
	const char *tok = env->session_token ? env->session_token : "";
	if (strlen(env->access_key_id) > STORE_KEY_ID_MAX ||
	    strlen(env->secret_access_key) > STORE_SECRET_MAX || strlen(tok) > STORE_TOKEN_MAX)
		return errmsg(err, errlen, -ENAMETOOLONG,
			      "store config: an AWS_* credential variable is too long");
	strcpy(cfg->access_key_id, env->access_key_id);
	strcpy(cfg->secret_access_key, env->secret_access_key);
	strcpy(cfg->session_token, tok);
	if (!printable(cfg->access_key_id) || !printable(cfg->secret_access_key) ||
	    !printable(cfg->session_token))
		return errmsg(err, errlen, -EINVAL,
			      "store config: AWS_* credentials hold non-printable bytes");
	return 0;
}

/* "key_providers": {"key-cmd": SPEC, "pkcs11": SPEC}; each spec must be of its type. */
static int parse_providers(json_t *v, struct store_config *cfg, char *err, size_t errlen)
{
	const char *k;
	json_t *s;
	if (!json_is_object(v))
		return errmsg(err, errlen, -EINVAL,
			      "store config: \"key_providers\" must be an object");
	json_object_foreach(v, k, s)
	{
		char *dst = !strcmp(k, "key-cmd")  ? cfg->key_cmd_spec
			    : !strcmp(k, "pkcs11") ? cfg->pkcs11_spec
						   : NULL;
		if (!dst)
			return errmsg(err, errlen, -EINVAL,
				      "store config: key_providers: unknown type \"%.32s\"", k);
		int r = copy_field(s, k, dst, STORE_KEYSPEC_MAX, err, errlen);
		if (r)
			return r;
		size_t tl = strlen(k);
		if (strncmp(dst, k, tl) || dst[tl] != ':')
			return errmsg(err, errlen, -EINVAL,
				      "store config: key_providers: the %s spec must start with "
				      "\"%s:\"",
				      k, k);
	}
	return 0;
}

/* "policies": {ID: "/absolute/policy.json"}. */
static int parse_policies(json_t *v, struct store_config *cfg, char *err, size_t errlen)
{
	const char *k;
	json_t *s;
	if (!json_is_object(v) || json_object_size(v) > STORE_POLICIES_MAX)
		return errmsg(err, errlen, -EINVAL,
			      "store config: \"policies\" must be an object of at most %d ids",
			      STORE_POLICIES_MAX);
	json_object_foreach(v, k, s)
	{
		struct store_policy *p = &cfg->policies[cfg->nr_policies];
		size_t n = strlen(k);
		bool ok = n && n <= STORE_POLICY_ID_LEN;
		for (size_t i = 0; ok && i < n; i++)
			ok = (k[i] >= 'a' && k[i] <= 'z') || (k[i] >= '0' && k[i] <= '9') ||
			     (i && (k[i] == '.' || k[i] == '_' || k[i] == '-'));
		if (!ok)
			return errmsg(
			    err, errlen, -EINVAL,
			    "store config: policy id \"%.64s\" is not [a-z0-9][a-z0-9._-]*", k);
		memcpy(p->id, k, n + 1);
		int r = copy_field(s, k, p->path, sizeof(p->path) - 1, err, errlen);
		if (r)
			return r;
		if (p->path[0] != '/')
			return errmsg(err, errlen, -EINVAL,
				      "store config: policy %s: the path must be absolute", k);
		cfg->nr_policies++;
	}
	return 0;
}

int store_fleet_key_read(const char *path, struct store_config *cfg, char *err, size_t errlen)
{
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK);
	if (fd < 0)
		return errmsg(err, errlen, -errno, "fleet key file %s: %s", path, strerror(errno));
	struct stat st;
	char buf[130];
	int r = 0;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode))
		r = errmsg(err, errlen, -EPERM, "fleet key file %s is not a regular file", path);
	else if (st.st_uid != geteuid() || (st.st_mode & 077))
		r = errmsg(err, errlen, -EPERM,
			   "fleet key file %s must be owned by this uid and mode 0600", path);
	ssize_t n = r ? 0 : pread(fd, buf, sizeof(buf), 0);
	close(fd);
	if (!r && n > 0 && buf[n - 1] == '\n')
		n--;
	if (!r && n != 2 * 32)
		r = errmsg(err, errlen, -EINVAL, "fleet key file %s: want 64 hex digits", path);
	for (ssize_t i = 0; !r && i < n; i += 2) {
		unsigned hi, lo;
		char h[3] = {buf[i], buf[i + 1], 0};
		if (!isxdigit((unsigned char)h[0]) || !isxdigit((unsigned char)h[1]) ||
		    sscanf(h, "%1x%1x", &hi, &lo) != 2)
			r = errmsg(err, errlen, -EINVAL, "fleet key file %s: want 64 hex digits",
				   path);
		else
			cfg->fleet_key[i / 2] = (unsigned char)(hi << 4 | lo);
	}
	explicit_bzero(buf, sizeof(buf));
	if (!r)
		cfg->fleet_key_len = 32;
	return r;
}

static int parse_fields(json_t *root, struct store_config *cfg, char *cred_path, char *err,
			size_t errlen)
{
	const char *k;
	json_t *v;
	char addressing[16] = "path";
	bool have_ep = false, have_bucket = false;
	json_object_foreach(root, k, v)
	{
		int r = 0;
		if (!strcmp(k, "endpoint")) {
			r = copy_field(v, k, cfg->endpoint, STORE_ENDPOINT_MAX, err, errlen);
			have_ep = true;
		} else if (!strcmp(k, "bucket")) {
			r = copy_field(v, k, cfg->bucket, STORE_BUCKET_MAX, err, errlen);
			have_bucket = true;
		} else if (!strcmp(k, "prefix")) {
			r = copy_field(v, k, cfg->prefix, STORE_PREFIX_MAX, err, errlen);
		} else if (!strcmp(k, "region")) {
			r = copy_field(v, k, cfg->region, STORE_REGION_MAX, err, errlen);
		} else if (!strcmp(k, "ca_file")) {
			r = copy_field(v, k, cfg->ca_file, STORE_PATH_MAX, err, errlen);
		} else if (!strcmp(k, "credentials_file")) {
			r = copy_field(v, k, cred_path, STORE_PATH_MAX, err, errlen);
		} else if (!strcmp(k, "addressing")) {
			r = copy_field(v, k, addressing, sizeof(addressing) - 1, err, errlen);
		} else if (!strcmp(k, "fleet_key_file")) {
			char kp[STORE_PATH_MAX + 1];
			r = copy_field(v, k, kp, STORE_PATH_MAX, err, errlen);
			if (!r && kp[0] != '/')
				r = errmsg(err, errlen, -EINVAL,
					   "store config: fleet_key_file must be an absolute path");
			if (!r)
				r = store_fleet_key_read(kp, cfg, err, errlen);
		} else if (!strcmp(k, "key_providers")) {
			r = parse_providers(v, cfg, err, errlen);
		} else if (!strcmp(k, "policies")) {
			r = parse_policies(v, cfg, err, errlen);
		} else if (!strcmp(k, "host_id")) {
			r = copy_field(v, k, cfg->host_id, STORE_HOST_ID_MAX, err, errlen);
			if (!r && !store_host_id_ok(cfg->host_id))
				r = errmsg(err, errlen, -EINVAL,
					   "store config: host_id must be 1-64 of [A-Za-z0-9._-]");
		} else if (!strcmp(k, "lease_ttl_s") || !strcmp(k, "clock_skew_s")) {
			bool ttl = k[0] == 'l';
			json_int_t n = json_integer_value(v);
			if (!json_is_integer(v) || n < (ttl ? 10 : 0) || n > (ttl ? 3600 : 60))
				return errmsg(err, errlen, -EINVAL,
					      "store config: \"%s\" must be an integer in %s", k,
					      ttl ? "10..3600" : "0..60");
			*(ttl ? &cfg->lease_ttl_s : &cfg->clock_skew_s) = (unsigned)n;
		} else if (!strcmp(k, "cache_max")) {
			char size[STORE_CACHE_MAX_TEXT + 1];
			r = copy_field(v, k, size, STORE_CACHE_MAX_TEXT, err, errlen);
			if (!r &&
			    (size_parse(size, &cfg->cache_max) || cfg->cache_max < CACHE_MAX_MIN ||
			     cfg->cache_max > CACHE_MAX_MAX))
				r = errmsg(err, errlen, -EINVAL,
					   "store config: \"cache_max\" must be a size of at least "
					   "1M, such as \"512M\" or \"2G\"");
		} else if (!strcmp(k, "insecure_http")) {
			if (!json_is_boolean(v))
				return errmsg(err, errlen, -EINVAL,
					      "store config: \"insecure_http\" must be true or "
					      "false");
			cfg->insecure_http = json_is_true(v);
		} else {
			return errmsg(err, errlen, -EINVAL, "store config: unknown key \"%.64s\"",
				      k);
		}
		if (r)
			return r;
	}
	if (!have_ep || !have_bucket)
		return errmsg(err, errlen, -EINVAL,
			      "store config: needs \"endpoint\" and \"bucket\"");
	if (!strcmp(addressing, "path"))
		cfg->addressing = STORE_ADDR_PATH;
	else if (!strcmp(addressing, "virtual"))
		cfg->addressing = STORE_ADDR_VIRTUAL;
	else
		return errmsg(err, errlen, -EINVAL,
			      "store config: \"addressing\" must be \"path\" or \"virtual\"");
	return 0;
}

int store_config_parse(const char *text, size_t len, const struct store_env *env,
		       struct store_config *cfg, char *err, size_t errlen)
{
	memset(cfg, 0, sizeof(*cfg));
	if (len > STORE_CONFIG_MAX)
		return errmsg(err, errlen, -EFBIG, "store config: %zu bytes, at most %d", len,
			      STORE_CONFIG_MAX);
	json_error_t je;
	json_t *root = json_loadb(text, len, JSON_REJECT_DUPLICATES, &je);
	if (!root)
		return errmsg(err, errlen, -EINVAL, "store config: line %d: %s", je.line, je.text);
	char cred_path[STORE_PATH_MAX + 1] = "";
	int r;
	if (!json_is_object(root)) {
		r = errmsg(err, errlen, -EINVAL, "store config: not a JSON object");
		goto out;
	}
	strcpy(cfg->region, "us-east-1");
	cfg->lease_ttl_s = 30;
	cfg->clock_skew_s = 2;
	r = parse_fields(root, cfg, cred_path, err, errlen);
	if (r)
		goto out;
	if (!cfg->host_id[0]) {
		/* The default: this host's name, when it is a valid id. */
		char hn[256] = "";
		if (gethostname(hn, sizeof(hn) - 1) == 0 && strlen(hn) <= STORE_HOST_ID_MAX &&
		    store_host_id_ok(hn))
			memcpy(cfg->host_id, hn, strlen(hn) + 1);
		else
			strcpy(cfg->host_id, "unnamed-host");
	}
	r = endpoint_check(cfg, err, errlen);
	if (r)
		goto out;
	if (!bucket_ok(cfg->bucket)) {
		r = errmsg(err, errlen, -EINVAL,
			   "store config: bucket \"%s\" is not a valid S3 bucket name",
			   cfg->bucket);
		goto out;
	}
	if (!region_ok(cfg->region)) {
		r = errmsg(err, errlen, -EINVAL, "store config: region \"%s\" is not [a-z0-9-]+",
			   cfg->region);
		goto out;
	}
	if (!prefix_ok(cfg->prefix)) {
		r = errmsg(err, errlen, -EINVAL,
			   "store config: prefix must not start with '/' or hold control bytes");
		goto out;
	}
	if (cfg->ca_file[0] && cfg->ca_file[0] != '/') {
		r = errmsg(err, errlen, -EINVAL, "store config: ca_file must be an absolute path");
		goto out;
	}
	if (cred_path[0] && cred_path[0] != '/') {
		r = errmsg(err, errlen, -EINVAL,
			   "store config: credentials_file must be an absolute path");
		goto out;
	}
	if (cfg->addressing == STORE_ADDR_VIRTUAL && strchr(cfg->bucket, '.') &&
	    !cfg->insecure_http) {
		r = errmsg(err, errlen, -EINVAL,
			   "store config: a bucket name with '.' cannot be virtual-hosted over TLS "
			   "(the certificate's wildcard does not cover it); use \"path\"");
		goto out;
	}
	if (cred_path[0])
		r = store_cred_file_read(cred_path, cfg, err, errlen);
	else
		r = creds_from_env(env, cfg, err, errlen);
out:
	json_decref(root);
	if (r)
		store_config_wipe(cfg);
	return r;
}

int store_config_load(const char *path, struct store_config *cfg, char *err, size_t errlen)
{
	if (!path)
		path = getenv("COVE_STORE");
	if (!path || !*path)
		path = STORE_CONFIG_DEFAULT;
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
	if (fd < 0)
		return errmsg(err, errlen, -errno, "store config %s: %s", path, strerror(errno));
	struct stat st;
	char *buf = NULL;
	int r;
	if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode)) {
		r = errmsg(err, errlen, -EINVAL, "store config %s is not a regular file", path);
		goto out;
	}
	if (st.st_size > STORE_CONFIG_MAX) {
		r = errmsg(err, errlen, -EFBIG, "store config %s is over %d bytes", path,
			   STORE_CONFIG_MAX);
		goto out;
	}
	buf = malloc(STORE_CONFIG_MAX + 1);
	if (!buf) {
		r = -ENOMEM;
		goto out;
	}
	ssize_t n = pread(fd, buf, STORE_CONFIG_MAX + 1, 0);
	if (n < 0 || n > STORE_CONFIG_MAX) {
		r = errmsg(err, errlen, n < 0 ? -errno : -EFBIG,
			   "store config %s: read failed or over %d bytes", path, STORE_CONFIG_MAX);
		goto out;
	}
	struct store_env env;
	store_env_from_process(&env);
	char sub[400];
	r = store_config_parse(buf, (size_t)n, &env, cfg, sub, sizeof(sub));
	if (r)
		errmsg(err, errlen, r, "%s (%s)", sub, path);
out:
	free(buf);
	close(fd);
	return r;
}
