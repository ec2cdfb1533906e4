/* A snapshot chain's "keys" file (wrapped data key, chain id, provider) and layer id counter. */
#include "snapshot/keyfile.h"

#include <ctype.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>

#include "common/byteorder.h"
#include "common/crc32.h"
#include "common/errmsg.h"
#include "common/fd_io.h"
#include "common/file_io.h"

#define MAGIC	     "COVEKEYS"
#define HDR_LEN	     56
#define KCV_LEN	     16
#define KCV_LABEL    "cove-kcv-v1"
#define SEQ_NAME     "layer-seq"
#define SEQ_LEN	     12
#define PATH_MAX_LEN 4096

struct keys {
	uint8_t chain_id[CRYPTO_CHAIN_ID_LEN];
	enum keyprov_type type;
	char config[KEYPROV_CONFIG_MAX + 1];
	uint8_t kcv[KCV_LEN];
	uint8_t wrapped[KEYPROV_WRAPPED_MAX];
	size_t wrapped_len;
};

static int kcv_compute(const struct snap_key *key, const uint8_t *chain_id, uint8_t kcv[KCV_LEN])
{
	uint8_t msg[sizeof(KCV_LABEL) - 1 + CRYPTO_CHAIN_ID_LEN];
	uint8_t md[EVP_MAX_MD_SIZE];
	unsigned mdlen = 0;
	memcpy(msg, KCV_LABEL, sizeof(KCV_LABEL) - 1);
	memcpy(msg + sizeof(KCV_LABEL) - 1, chain_id, CRYPTO_CHAIN_ID_LEN);
	if (!HMAC(EVP_sha256(), crypto_key_bytes(key), CRYPTO_KEY_LEN, msg, sizeof(msg), md,
		  &mdlen))
		return -EIO;
	memcpy(kcv, md, KCV_LEN);
	OPENSSL_cleanse(md, sizeof(md));
	return 0;
}

static int path_in(char *buf, const char *dir, const char *name)
{
	int n = snprintf(buf, PATH_MAX_LEN, "%s/%s", dir, name);
	return n < 0 || n >= PATH_MAX_LEN ? -ENAMETOOLONG : 0;
}

/*
 * Write buf to DIR/name through DIR/name.tmp.*: fsync, rename (or no-replace), fsync DIR. The
 * files are made beneath DIR's fd: a VMM under seccomp may create files only that way.
 */
static int replace_file(const char *dir, const char *name, const void *buf, size_t len,
			int noreplace)
{
	char path[PATH_MAX_LEN], tmp[256];
	int r = path_in(path, dir, name);
	if (r)
		return r;
	int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return -errno;
	/* A unique temporary name: two writers never write into one file (mode 0600). */
	int fd = -1;
	for (int tries = 0; fd < 0 && tries < 16; tries++) {
		uint64_t rnd = 0;
		if (getrandom(&rnd, sizeof(rnd), 0) != sizeof(rnd)) {
			r = -EIO;
			break;
		}
		if (snprintf(tmp, sizeof(tmp), "%s.tmp.%016llx", name, (unsigned long long)rnd) >=
		    (int)sizeof(tmp)) {
			r = -ENAMETOOLONG;
			break;
		}
		fd = openat(dfd, tmp, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
		if (fd < 0 && errno != EEXIST) {
			r = -errno;
			break;
		}
	}
	if (fd < 0) {
		close(dfd);
		return r ? r : -EEXIST;
	}
	r = write_full(fd, buf, len);
	if (!r && fsync(fd))
		r = -errno;
	if (close(fd) && !r)
		r = -errno;
	if (!r && renameat2(dfd, tmp, dfd, name, noreplace ? RENAME_NOREPLACE : 0))
		r = -errno;
	if (r)
		unlinkat(dfd, tmp, 0);
	else if (fsync(dfd))
		r = -errno;
	close(dfd);
	return r;
}

static size_t encode(const struct keys *k, uint8_t *buf)
{
	size_t cl = strlen(k->config);
	memcpy(buf, MAGIC, 8);
	put_le32(buf + 8, KEYFILE_VERSION);
	memcpy(buf + 12, k->chain_id, CRYPTO_CHAIN_ID_LEN);
	put_le32(buf + 28, (uint32_t)k->type);
	put_le32(buf + 32, (uint32_t)cl);
	put_le32(buf + 36, (uint32_t)k->wrapped_len);
	memcpy(buf + 40, k->kcv, KCV_LEN);
	memcpy(buf + HDR_LEN, k->config, cl);
	memcpy(buf + HDR_LEN + cl, k->wrapped, k->wrapped_len);
	size_t len = HDR_LEN + cl + k->wrapped_len;
	put_le32(buf + len, crc32_update(0, buf, len));
	return len + 4;
}

static int decode(const uint8_t *buf, size_t len, struct keys *k, const char *path, char *err,
		  size_t errlen)
{
	if (len < HDR_LEN + 4)
		return errmsg(err, errlen, -EINVAL, "%s: truncated (%zu bytes)", path, len);
	if (memcmp(buf, MAGIC, 8) != 0)
		return errmsg(err, errlen, -EINVAL, "%s: not a cove keys file (bad magic)", path);
	uint32_t ver = get_le32(buf + 8);
	if (ver == 1)
		return errmsg(
		    err, errlen, -EINVAL,
		    "%s: keys file version 1 is from a cove without per-layer salts; this "
		    "cove reads version %d only (restore the chain with the cove that "
		    "wrote it)",
		    path, KEYFILE_VERSION);
	if (ver != KEYFILE_VERSION)
		return errmsg(err, errlen, -EINVAL,
			      "%s: unsupported version %u (this cove reads %d)", path, ver,
			      KEYFILE_VERSION);
	uint32_t cl = get_le32(buf + 32), wl = get_le32(buf + 36);
	if (cl == 0 || cl > KEYPROV_CONFIG_MAX)
		return errmsg(err, errlen, -EINVAL, "%s: provider config length %u (1..%u)", path,
			      cl, KEYPROV_CONFIG_MAX);
	if (wl == 0 || wl > KEYPROV_WRAPPED_MAX)
		return errmsg(err, errlen, -EINVAL, "%s: wrapped key length %u (1..%u)", path, wl,
			      KEYPROV_WRAPPED_MAX);
	size_t body = HDR_LEN + (size_t)cl + wl;
	if (len < body + 4)
		return errmsg(err, errlen, -EINVAL, "%s: truncated (%zu of %zu bytes)", path, len,
			      body + 4);
	if (len > body + 4)
		return errmsg(err, errlen, -EINVAL, "%s: %zu trailing bytes", path, len - body - 4);
	if (get_le32(buf + body) != crc32_update(0, buf, body))
		return errmsg(err, errlen, -EINVAL, "%s: checksum mismatch (corrupt)", path);
	uint32_t type = get_le32(buf + 28);
	if (type != KEYPROV_CMD && type != KEYPROV_PKCS11)
		return errmsg(err, errlen, -EINVAL, "%s: unknown key provider type %u", path, type);
	memcpy(k->chain_id, buf + 12, CRYPTO_CHAIN_ID_LEN);
	k->type = (enum keyprov_type)type;
	memcpy(k->kcv, buf + 40, KCV_LEN);
	memcpy(k->config, buf + HDR_LEN, cl);
	k->config[cl] = 0;
	if (strlen(k->config) != cl)
		return errmsg(err, errlen, -EINVAL, "%s: provider config holds a NUL byte", path);
	memcpy(k->wrapped, buf + HDR_LEN + cl, wl);
	k->wrapped_len = wl;
	return 0;
}

int keyfile_parse(const uint8_t *buf, size_t len, const char *name, enum keyprov_type *type,
		  char *config, size_t config_len, uint8_t chain_id[CRYPTO_CHAIN_ID_LEN], char *err,
		  size_t errlen)
{
	struct keys *k = calloc(1, sizeof(*k));
	if (!k)
		return -ENOMEM;
	int r = decode(buf, len, k, name, err, errlen);
	if (!r) {
		*type = k->type;
		snprintf(config, config_len, "%s", k->config);
		memcpy(chain_id, k->chain_id, CRYPTO_CHAIN_ID_LEN);
	}
	OPENSSL_cleanse(k, sizeof(*k));
	free(k);
	return r;
}

static int load(const char *dir, struct keys *k, char *err, size_t errlen)
{
	char path[PATH_MAX_LEN];
	int r = path_in(path, dir, KEYFILE_NAME);
	if (r)
		return errmsg(err, errlen, r, "%s/%s: path too long", dir, KEYFILE_NAME);
	int fd = open(path, O_RDONLY | O_CLOEXEC);
	if (fd < 0)
		return errmsg(err, errlen, -errno, "%s: %s", path, strerror(errno));
	uint8_t *buf = malloc(KEYFILE_MAX + 1);
	size_t len = 0;
	if (!buf) {
		close(fd);
		return -ENOMEM;
	}
	ssize_t got = read_upto(fd, buf, KEYFILE_MAX + 1);
	r = got < 0 ? (int)got : 0;
	len = got < 0 ? 0 : (size_t)got;
	if (r)
		r = errmsg(err, errlen, r, "%s: %s", path, strerror(-r));
	else if (len > KEYFILE_MAX)
		r = errmsg(err, errlen, -EINVAL, "%s: larger than %u bytes", path, KEYFILE_MAX);
	else
		r = decode(buf, len, k, path, err, errlen);
	free(buf);
	close(fd);
	return r;
}

static int store(const char *dir, const struct keys *k, int noreplace, char *err, size_t errlen)
{
	uint8_t *buf = malloc(KEYFILE_MAX);
	if (!buf)
		return -ENOMEM;
	size_t len = encode(k, buf);
	int r = replace_file(dir, KEYFILE_NAME, buf, len, noreplace);
	free(buf);
	if (r == -EEXIST)
		return errmsg(err, errlen, r, "%s/%s already exists", dir, KEYFILE_NAME);
	if (r)
		return errmsg(err, errlen, r, "cannot write %s/%s: %s", dir, KEYFILE_NAME,
			      strerror(-r));
	return 0;
}

static int wrap_into(struct keys *k, struct keyprov *prov, const struct snap_key *key, char *err,
		     size_t errlen)
{
	k->type = keyprov_get_type(prov);
	snprintf(k->config, sizeof(k->config), "%s", keyprov_config(prov));
	return keyprov_wrap(prov, key, k->wrapped, sizeof(k->wrapped), &k->wrapped_len, err,
			    errlen);
}

static int seq_init(const char *dir, char *err, size_t errlen);

int keyfile_create(const char *dir, struct keyprov *prov, struct snap_key **key_out,
		   uint8_t chain_id[CRYPTO_CHAIN_ID_LEN], char *err, size_t errlen)
{
	return keyfile_create_with_key(dir, prov, NULL, key_out, chain_id, err, errlen);
}

int keyfile_create_with_key(const char *dir, struct keyprov *prov, const struct snap_key *key_in,
			    struct snap_key **key_out, uint8_t chain_id[CRYPTO_CHAIN_ID_LEN],
			    char *err, size_t errlen)
{
	struct keys *k = calloc(1, sizeof(*k));
	struct snap_key *key = NULL;
	char path[PATH_MAX_LEN];
	int r;
	if (!k)
		return -ENOMEM;
	if (path_in(path, dir, KEYFILE_NAME) == 0 && access(path, F_OK) == 0) {
		r = errmsg(err, errlen, -EEXIST, "%s already exists", path);
		goto out;
	}
	r = key_in ? crypto_key_import(crypto_key_bytes(key_in), &key) : crypto_key_generate(&key);
	if (r) {
		r = errmsg(err, errlen, r, "cannot generate a data key: %s", strerror(-r));
		goto out;
	}
	if (crypto_random(k->chain_id, sizeof(k->chain_id))) {
		r = errmsg(err, errlen, -EIO, "no random bytes for the chain id");
		goto out;
	}
	r = kcv_compute(key, k->chain_id, k->kcv);
	if (r)
		goto out;
	r = wrap_into(k, prov, key, err, errlen);
	if (r)
		goto out;
	/* The counter first: a keys file never exists without one (a missing one is refused). */
	r = seq_init(dir, err, errlen);
	if (r)
		goto out;
	r = store(dir, k, 1, err, errlen);
	if (r)
		goto out;
	memcpy(chain_id, k->chain_id, CRYPTO_CHAIN_ID_LEN);
	*key_out = key;
	key = NULL;
out:
	crypto_key_free(key);
	free(k);
	return r;
}

/*
 * The provider always comes from the host; the keys file only records which one wrapped the
 * key. A record that differs from the host's provider is refused before anything runs: a
 * chain cannot pick the command or module that unwraps it (snapshot/CRYPTO.md).
 */
static int check_prov(const struct keys *k, const struct keyprov *prov, char *err, size_t errlen)
{
	if (!prov)
		return errmsg(err, errlen, -EINVAL,
			      "an encrypted chain needs its key provider from the host (--key); "
			      "the chain's keys file never chooses it");
	/* The recorded config is not printed: it is the chain's text, not the host's. */
	if (k->type != keyprov_get_type(prov))
		return errmsg(err, errlen, -EKEYREJECTED,
			      "the chain's keys file records a %s key provider, the host gave %s: "
			      "give the provider that wrapped it, or rekey the chain",
			      keyprov_type_name(k->type),
			      keyprov_type_name(keyprov_get_type(prov)));
	if (strcmp(k->config, keyprov_config(prov)) != 0)
		return errmsg(err, errlen, -EKEYREJECTED,
			      "the chain's keys file records another %s key provider than the "
			      "host's: give the provider that wrapped it, or rekey the chain",
			      keyprov_type_name(k->type));
	return 0;
}

/* Unwrap k's data key with the host's provider and check it is this chain's. */
static int unwrap_keys(const struct keys *k, struct keyprov *prov, struct snap_key **key_out,
		       char *err, size_t errlen)
{
	struct snap_key *key = NULL;
	uint8_t kcv[KCV_LEN];
	int r = check_prov(k, prov, err, errlen);
	if (r)
		return r;
	r = keyprov_unwrap(prov, k->wrapped, k->wrapped_len, &key, err, errlen);
	if (r)
		goto out;
	r = kcv_compute(key, k->chain_id, kcv);
	if (r)
		goto out;
	if (CRYPTO_memcmp(kcv, k->kcv, KCV_LEN) != 0) {
		r = errmsg(
		    err, errlen, -EBADMSG,
		    "the key provider returned a data key that does not belong to this chain");
		goto out;
	}
	*key_out = key;
	key = NULL;
out:
	crypto_key_free(key);
	return r;
}

int keyfile_open(const char *dir, struct keyprov *prov, struct snap_key **key_out,
		 uint8_t chain_id[CRYPTO_CHAIN_ID_LEN], char *err, size_t errlen)
{
	struct keys *k = calloc(1, sizeof(*k));
	if (!k)
		return -ENOMEM;
	int r = load(dir, k, err, errlen);
	if (!r)
		r = unwrap_keys(k, prov, key_out, err, errlen);
	if (!r)
		memcpy(chain_id, k->chain_id, CRYPTO_CHAIN_ID_LEN);
	free(k);
	return r;
}

int keyfile_rekey(const char *dir, struct keyprov *old_prov, struct keyprov *new_prov, char *err,
		  size_t errlen)
{
	struct keys *k = calloc(1, sizeof(*k));
	struct snap_key *key = NULL;
	if (!k)
		return -ENOMEM;
	int r = load(dir, k, err, errlen);
	if (r)
		goto out;
	r = unwrap_keys(k, old_prov, &key, err, errlen);
	if (r)
		goto out;
	r = wrap_into(k, new_prov, key, err, errlen);
	if (r)
		goto out;
	r = store(dir, k, 0, err, errlen);
out:
	crypto_key_free(key);
	free(k);
	return r;
}

int keyfile_describe(const char *dir, enum keyprov_type *type, char *config, size_t config_len,
		     uint8_t chain_id[CRYPTO_CHAIN_ID_LEN], char *err, size_t errlen)
{
	struct keys *k = calloc(1, sizeof(*k));
	if (!k)
		return -ENOMEM;
	int r = load(dir, k, err, errlen);
	if (!r) {
		*type = k->type;
		snprintf(config, config_len, "%s", k->config);
		memcpy(chain_id, k->chain_id, CRYPTO_CHAIN_ID_LEN);
	}
	free(k);
	return r;
}

/* "layer-seq.NNNNNNNNNNNNNNNNNNNN" (20 digits): a create-only counter step; 1 with its value. */
static int seq_marker_name(const char *n, uint64_t *v)
{
	size_t pl = strlen(SEQ_NAME) + 1;
	if (strlen(n) != pl + 20 || strncmp(n, SEQ_NAME ".", pl))
		return 0;
	uint64_t x = 0;
	for (size_t i = pl; i < pl + 20; i++) {
		if (!isdigit((unsigned char)n[i]) || x > (UINT64_MAX - 9) / 10)
			return 0;
		x = x * 10 + (uint64_t)(n[i] - '0');
	}
	*v = x;
	return 1;
}

/* The largest counter step in DIR (0: none), or -errno. */
static int seq_markers_max(const char *dir, uint64_t *max)
{
	*max = 0;
	DIR *d = opendir(dir);
	if (!d)
		return -errno;
	struct dirent *e;
	uint64_t v;
	while ((e = readdir(d)))
		if (seq_marker_name(e->d_name, &v) && v > *max)
			*max = v;
	closedir(d);
	return 0;
}

/*
 * Create-only step of the counter: DIR/layer-seq.NEXT, made with O_EXCL beneath DIR's fd. The
 * jailed VMM may create files but neither replace nor unlink one, so there the counter moves
 * by these; the counter is the larger of layer-seq and the largest step, and keyfile_settle_
 * layer_seq (host side) folds the steps back into layer-seq.
 */
static int seq_step(const char *dir, uint64_t next)
{
	char name[64];
	snprintf(name, sizeof(name), "%s.%020llu", SEQ_NAME, (unsigned long long)next);
	int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return -errno;
	int fd = openat(dfd, name, O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0600);
	int r = fd < 0 ? -errno : 0;
	if (fd >= 0)
		close(fd);
	if (!r && fsync(dfd))
		r = -errno;
	close(dfd);
	return r;
}

/* DIR/layer-seq: next id (u64 LE) | crc32 (u32 LE); replaced atomically under flock of DIR. */
static int seq_write(const char *dir, uint64_t next)
{
	uint8_t buf[SEQ_LEN];
	put_le64(buf, next);
	put_le32(buf + 8, crc32_update(0, buf, 8));
	int r = replace_file(dir, SEQ_NAME, buf, SEQ_LEN, 0);
	/* Replacing is not allowed here (the jail's filter): a create-only step instead. */
	if (r == -EPERM || r == -EACCES)
		r = seq_step(dir, next);
	return r;
}

/* 1 and the counter, 0 when DIR/layer-seq does not exist, -errno (err set) when unusable. */
static int seq_read(const char *dir, uint64_t *next, char *err, size_t errlen)
{
	char path[PATH_MAX_LEN];
	uint8_t buf[SEQ_LEN + 1];
	int r = path_in(path, dir, SEQ_NAME);
	if (r)
		return errmsg(err, errlen, r, "%s: path too long", dir);
	uint64_t step = 0;
	r = seq_markers_max(dir, &step);
	if (r)
		return errmsg(err, errlen, r, "%s: %s", dir, strerror(-r));
	int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
	if (fd < 0) {
		if (errno == ENOENT && step) {
			*next = step;
			return 1;
		}
		if (errno == ENOENT)
			return 0;
		return errmsg(err, errlen, -errno, "%s: %s", path, strerror(errno));
	}
	ssize_t n = read(fd, buf, sizeof(buf));
	close(fd);
	if (n != SEQ_LEN || get_le32(buf + 8) != crc32_update(0, buf, 8))
		return errmsg(err, errlen, -EINVAL, "%s: corrupt layer id counter", path);
	*next = get_le64(buf);
	if (step > *next)
		*next = step;
	return 1;
}

int keyfile_settle_layer_seq(const char *dir, char *err, size_t errlen)
{
	uint64_t step = 0, next = 0;
	int r = seq_markers_max(dir, &step);
	if (r == -ENOENT)
		return 0;
	if (r)
		return errmsg(err, errlen, r, "%s: %s", dir, strerror(-r));
	if (!step)
		return 0;
	int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return errmsg(err, errlen, -errno, "%s: %s", dir, strerror(errno));
	if (flock(dfd, LOCK_EX)) {
		r = errmsg(err, errlen, -errno, "flock %s: %s", dir, strerror(errno));
		goto out;
	}
	r = seq_read(dir, &next, err, errlen);
	if (r < 0)
		goto out;
	uint8_t buf[SEQ_LEN];
	put_le64(buf, next);
	put_le32(buf + 8, crc32_update(0, buf, 8));
	r = replace_file(dir, SEQ_NAME, buf, SEQ_LEN, 0);
	if (r) {
		r = errmsg(err, errlen, r, "cannot write %s/%s: %s", dir, SEQ_NAME, strerror(-r));
		goto out;
	}
	/* Only now that layer-seq says as much: the steps (regular files, never links) go. */
	DIR *d = fdopendir(dup(dfd));
	struct dirent *e;
	uint64_t v;
	while (d && (e = readdir(d))) {
		struct stat st;
		bool tmp = !strncmp(e->d_name, SEQ_NAME ".tmp.", strlen(SEQ_NAME) + 5);
		if ((seq_marker_name(e->d_name, &v) || tmp) &&
		    fstatat(dfd, e->d_name, &st, AT_SYMLINK_NOFOLLOW) == 0 && S_ISREG(st.st_mode))
			(void)unlinkat(dfd, e->d_name, 0);
	}
	if (d)
		closedir(d);
	(void)fsync(dfd);
out:
	close(dfd); /* drops the flock */
	return r;
}

/* A new chain's counter (ids start at 1: 0 means "no parent"); one left by a crash is kept. */
static int seq_init(const char *dir, char *err, size_t errlen)
{
	uint64_t next = 0;
	int r = seq_read(dir, &next, err, errlen);
	if (r < 0)
		return r;
	if (r == 1 && next >= 1)
		return 0;
	r = seq_write(dir, 1);
	return r ? errmsg(err, errlen, r, "cannot write %s/%s: %s", dir, SEQ_NAME, strerror(-r))
		 : 0;
}

/* Parses digits at *p (at least one) and advances; 0 or -1. */
static int take_id(const char **p, uint64_t *id)
{
	if (!isdigit((unsigned char)**p))
		return -1;
	char *end;
	errno = 0;
	unsigned long long v = strtoull(*p, &end, 10);
	if (errno)
		return -1;
	*id = v;
	*p = end;
	return 0;
}

/* ".PID-XXXXXXXX.tmp": what dirfd_create_tmp puts after a temporary file's final name. */
static bool tmp_suffix(const char *p)
{
	if (*p++ != '.' || !isdigit((unsigned char)*p))
		return false;
	while (isdigit((unsigned char)*p))
		p++;
	if (*p++ != '-')
		return false;
	for (int i = 0; i < 8; i++, p++)
		if (!isxdigit((unsigned char)*p))
			return false;
	return !strcmp(p, ".tmp");
}

/*
 * The layer id a chain file's name carries: mem-N, state-N (and their temporaries .NAME.tmp and
 * .NAME.PID-XXXXXXXX.tmp), diskK-N.ovl
 * (and .map, .map.tmp). 1 with *id, or 0 for other names.
 */
int keyfile_name_layer_id(const char *name, uint64_t *id)
{
	const char *p = name;
	uint64_t k;
	bool tmp = *p == '.';
	if (tmp)
		p++;
	if (!strncmp(p, "mem-", 4) || !strncmp(p, "state-", 6)) {
		p += *p == 'm' ? 4 : 6;
		if (take_id(&p, id))
			return 0;
		return tmp ? !strcmp(p, ".tmp") || tmp_suffix(p) : !*p;
	}
	if (tmp || strncmp(p, "disk", 4))
		return 0;
	p += 4;
	if (take_id(&p, &k) || *p++ != '-')
		return 0;
	if (*p == 'r') /* a restored run's top: diskK-rN-TAG.ovl */
		p++;
	if (take_id(&p, id))
		return 0;
	/* diskK-N[-TAG][-sealed].ovl, TAG 8 hex digits (sandbox.c names new tops so) */
	if (p[0] == '-' && strspn(p + 1, "0123456789abcdef") == 8 && p[9] != 0 &&
	    !isxdigit((unsigned char)p[9]))
		p += 9;
	if (!strncmp(p, "-sealed", 7))
		p += 7;
	return !strcmp(p, ".ovl") || !strcmp(p, ".ovl.map") || !strcmp(p, ".ovl.map.tmp");
}

/* The chain must not hold a layer whose id is at or above the counter: ids would repeat. */
static int seq_check_dir(const char *dir, uint64_t next, char *err, size_t errlen)
{
	DIR *d = opendir(dir);
	if (!d)
		return errmsg(err, errlen, -errno, "%s: %s", dir, strerror(errno));
	struct dirent *e;
	int r = 0;
	while (!r && (e = readdir(d))) {
		uint64_t id;
		if (keyfile_name_layer_id(e->d_name, &id) && id >= next)
			r = errmsg(
			    err, errlen, -ESTALE,
			    "%s/%s: the layer id counter (next %llu) is not above layer %llu "
			    "the chain holds (rolled back or copied): refusing to continue this "
			    "encrypted chain; restore it with --snapshot-dir into a new directory",
			    dir, SEQ_NAME, (unsigned long long)next, (unsigned long long)id);
	}
	closedir(d);
	return r;
}

/* Under the flock of DIR: the counter, checked (missing, corrupt, behind a layer: refused). */
static int seq_checked(const char *dir, uint64_t *next, char *err, size_t errlen)
{
	int r = seq_read(dir, next, err, errlen);
	if (r == 0)
		r = errmsg(err, errlen, -ESTALE,
			   "%s/%s is missing: refusing to continue this encrypted chain (its layer "
			   "ids could repeat); restore it with --snapshot-dir into a new directory",
			   dir, SEQ_NAME);
	if (r < 0)
		return r;
	return seq_check_dir(dir, *next, err, errlen);
}

int keyfile_check_layer_ids(const char *dir, char *err, size_t errlen)
{
	uint64_t next = 0;
	int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return errmsg(err, errlen, -errno, "%s: %s", dir, strerror(errno));
	int r = flock(dfd, LOCK_SH)
		    ? errmsg(err, errlen, -errno, "flock %s: %s", dir, strerror(errno))
		    : seq_checked(dir, &next, err, errlen);
	close(dfd);
	return r;
}

int keyfile_next_layer_id(const char *dir, uint64_t *id, char *err, size_t errlen)
{
	uint64_t next = 0;
	int dfd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (dfd < 0)
		return errmsg(err, errlen, -errno, "%s: %s", dir, strerror(errno));
	int r;
	if (flock(dfd, LOCK_EX)) {
		r = errmsg(err, errlen, -errno, "flock %s: %s", dir, strerror(errno));
		goto out;
	}
	r = seq_checked(dir, &next, err, errlen);
	if (r)
		goto out;
	if (next > CRYPTO_LAYER_MAX) {
		r = errmsg(err, errlen, -ERANGE, "%s: layer ids exhausted", dir);
		goto out;
	}
	/* Durable before the id is handed out: no file with this id exists before the counter. */
	r = seq_write(dir, next + 1);
	if (r) {
		r = errmsg(err, errlen, r, "cannot write %s/%s: %s", dir, SEQ_NAME, strerror(-r));
		goto out;
	}
	*id = next;
out:
	close(dfd); /* drops the flock */
	return r;
}
