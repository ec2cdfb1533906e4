/* Unit tests of key providers (real key-cmd processes, a real SoftHSM2 token), the keys file. */
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmocka.h>

#include "common/byteorder.h"
#include "common/crc32.h"
#include "snapshot/crypto.h"
#include "snapshot/keyfile.h"
#include "snapshot/keyprov.h"
#include "snapshot/keyprov_relay.h"
#include "devices/overlay.h"
#include "snapshot/snap_crypt.h"

#define SOFTHSM_MODULE "/usr/lib/softhsm/libsofthsm2.so"
#define PAGE	       4096

/* One temporary directory for the whole run: KEKs, token, chains. */
struct env {
	char dir[64];
	char script[1024]; /* tools/key-cmd-openssl */
	char kek_a[128], kek_b[128];
	char cmd_a[1400], cmd_b[1400];
	char p11_kek1[512], p11_kek2[512];
	int chains;
};

static struct env *E(void **state)
{
	return *state;
}

static void sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void sh(const char *fmt, ...)
{
	char cmd[4096];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(cmd, sizeof(cmd), fmt, ap);
	va_end(ap);
	int st = system(cmd);
	if (st != 0)
		fail_msg("command failed (%d): %s", st, cmd);
}

/* A fresh chain directory. */
static void new_chain(struct env *e, char *out, size_t cap)
{
	snprintf(out, cap, "%s/chain%d", e->dir, e->chains++);
	assert_int_equal(mkdir(out, 0700), 0);
}

static struct keyprov *prov(enum keyprov_type t, const char *config)
{
	struct keyprov *kp = NULL;
	char err[512];
	int r = keyprov_new(t, config, &kp, err, sizeof(err));
	if (r)
		fail_msg("keyprov_new(%s): %s", config, err);
	return kp;
}

static int env_setup(void **state, int pkcs11)
{
	struct env *e = calloc(1, sizeof(*e));
	assert_non_null(e);
	snprintf(e->dir, sizeof(e->dir), "/tmp/cove-keyprov-XXXXXX");
	assert_non_null(mkdtemp(e->dir));
	const char *src = getenv("COVE_SOURCE_ROOT");
	snprintf(e->script, sizeof(e->script), "%s/tools/key-cmd-openssl", src ? src : ".");
	if (access(e->script, X_OK) != 0)
		fail_msg("%s not found (set COVE_SOURCE_ROOT)", e->script);
	snprintf(e->kek_a, sizeof(e->kek_a), "%s/kek-a.pem", e->dir);
	snprintf(e->kek_b, sizeof(e->kek_b), "%s/kek-b.pem", e->dir);
	sh("'%s' --genkey '%s' && '%s' --genkey '%s'", e->script, e->kek_a, e->script, e->kek_b);
	snprintf(e->cmd_a, sizeof(e->cmd_a), "'%s' '%s'", e->script, e->kek_a);
	snprintf(e->cmd_b, sizeof(e->cmd_b), "'%s' '%s'", e->script, e->kek_b);
	if (pkcs11) {
		char conf[128];
		snprintf(conf, sizeof(conf), "%s/softhsm2.conf", e->dir);
		sh("mkdir '%s/tokens' && printf 'directories.tokendir = %s/tokens\\n"
		   "objectstore.backend = file\\nlog.level = ERROR\\n' > '%s'",
		   e->dir, e->dir, conf);
		setenv("SOFTHSM2_CONF", conf, 1);
		sh("softhsm2-util --init-token --free --label cove --pin 1234 --so-pin 5678 "
		   ">/dev/null");
		for (int k = 1; k <= 2; k++)
			sh("pkcs11-tool --module %s --login --pin 1234 --keygen --key-type AES:32 "
			   "--label kek%d --token-label cove >/dev/null 2>&1",
			   SOFTHSM_MODULE, k);
		setenv("COVE_PKCS11_PIN", "1234", 1);
		snprintf(e->p11_kek1, sizeof(e->p11_kek1),
			 "pkcs11:module=%s;token=cove;object=kek1", SOFTHSM_MODULE);
		snprintf(e->p11_kek2, sizeof(e->p11_kek2), "pkcs11:token=cove;object=kek2");
	}
	*state = e;
	return 0;
}

static int env_setup_cmd(void **state)
{
	return env_setup(state, 0);
}

static int env_setup_p11(void **state)
{
	return env_setup(state, 1);
}

static int env_teardown(void **state)
{
	struct env *e = *state;
	char cmd[128];
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", e->dir);
	if (system(cmd) != 0)
		fprintf(stderr, "could not remove %s\n", e->dir);
	free(e);
	return 0;
}

/* wrap then unwrap a fresh key through kp; returns the wrapped length. */
static size_t round_trip_id(struct keyprov *kp, int identity)
{
	struct snap_key *k, *back;
	uint8_t w[KEYPROV_WRAPPED_MAX];
	size_t wl = 0;
	char err[512] = "";
	assert_int_equal(crypto_key_generate(&k), 0);
	int r = keyprov_wrap(kp, k, w, sizeof(w), &wl, err, sizeof(err));
	if (r)
		fail_msg("wrap: %d %s", r, err);
	if (!identity)
		assert_null(memmem(w, wl, crypto_key_bytes(k), CRYPTO_KEY_LEN));
	r = keyprov_unwrap(kp, w, wl, &back, err, sizeof(err));
	if (r)
		fail_msg("unwrap: %d %s", r, err);
	assert_memory_equal(crypto_key_bytes(back), crypto_key_bytes(k), CRYPTO_KEY_LEN);
	crypto_key_free(back);
	crypto_key_free(k);
	return wl;
}

static size_t round_trip(struct keyprov *kp)
{
	return round_trip_id(kp, 0);
}

static void test_cmd_round_trip(void **state)
{
	struct keyprov *kp = prov(KEYPROV_CMD, E(state)->cmd_a);
	assert_int_equal(round_trip(kp), 384); /* RSA-3072 OAEP */
	keyprov_free(kp);
	/* the identity command: base64 in, the same base64 out */
	kp = prov(KEYPROV_CMD, "f() { cat; }; f");
	assert_int_equal(round_trip_id(kp, 1), CRYPTO_KEY_LEN);
	keyprov_free(kp);
}

/*
 * The key relay (a jailed VMM's provider): the same wraps and refusals as the provider run here,
 * only the host's provider, a malformed request answered and the relay still serving, and a
 * clear error once it is gone.
 */
static void test_cmd_relay(void **state)
{
	char spec[1500], err[512] = "";
	snprintf(spec, sizeof(spec), "key-cmd:%s", E(state)->cmd_a);
	struct keyrelay kr;
	assert_int_equal(keyrelay_start(&kr, spec, err, sizeof(err)), 0);
	assert_true(kr.sock > 2 && kr.pid > 0);
	struct keyprov *kp = prov(KEYPROV_CMD, E(state)->cmd_a);
	keyprov_set_relay(kp, kr.sock);
	assert_int_equal(round_trip(kp), 384);
	/* A wrapped key that is not one: the provider's refusal comes back whole. */
	struct snap_key *k = NULL;
	uint8_t junk[16] = {1, 2, 3};
	assert_int_equal(keyprov_unwrap(kp, junk, sizeof(junk), &k, err, sizeof(err)),
			 -EKEYREJECTED);
	assert_non_null(strstr(err, "key provider refused to unwrap the data key: key-cmd unwrap"));
	/* Another provider than the one it was started for: refused, not run. */
	struct keyprov *other = prov(KEYPROV_CMD, "f() { cat; }; f");
	keyprov_set_relay(other, kr.sock);
	uint8_t out[64];
	size_t n = 0;
	assert_int_equal(
	    keyprov_run(other, 1, junk, sizeof(junk), out, sizeof(out), &n, err, sizeof(err)),
	    -EPERM);
	assert_string_equal(err, "key relay: a provider other than the host's was asked for");
	keyprov_free(other);
	/* Garbage: answered with an error, and the relay goes on. */
	assert_int_equal(send(kr.sock, "xx", 2, 0), 2);
	uint8_t rep[600];
	int32_t rc;
	assert_true(recv(kr.sock, rep, sizeof(rep), 0) >= (ssize_t)sizeof(rc));
	memcpy(&rc, rep, sizeof(rc));
	assert_int_equal(rc, -EPROTO);
	assert_int_equal(round_trip(kp), 384);
	keyrelay_stop(&kr);
	assert_true(kr.sock == -1 && kr.pid == -1);
	keyrelay_stop(&kr); /* twice is fine */
	/* Its socket closed: a later call says so (here: on a socket whose peer is gone). */
	int sv[2];
	assert_int_equal(socketpair(AF_UNIX, SOCK_SEQPACKET, 0, sv), 0);
	close(sv[1]);
	keyprov_set_relay(kp, sv[0]);
	assert_int_not_equal(
	    keyprov_run(kp, 1, junk, sizeof(junk), out, sizeof(out), &n, err, sizeof(err)), 0);
	assert_non_null(strstr(err, "key relay: "));
	close(sv[0]);
	keyprov_free(kp);
	/* A bad spec fails before any process starts. */
	assert_int_equal(keyrelay_start(&kr, "nope", err, sizeof(err)), -EINVAL);
}

static int unwrap_err(struct keyprov *kp, const uint8_t *w, size_t wl, char *err, size_t errlen)
{
	struct snap_key *k = NULL;
	int r = keyprov_unwrap(kp, w, wl, &k, err, errlen);
	crypto_key_free(k);
	return r;
}

/* A key command that refuses: one clear line, with the command's first stderr line. */
static void test_cmd_refuses(void **state)
{
	(void)state;
	char err[512];
	uint8_t w[32] = {1};
	struct keyprov *kp =
	    prov(KEYPROV_CMD, "f() { echo; echo 'KEK disabled by admin' >&2; echo more >&2; "
			      "exit 3; }; f");
	assert_int_equal(unwrap_err(kp, w, sizeof(w), err, sizeof(err)), -EKEYREJECTED);
	assert_string_equal(err, "key provider refused to unwrap the data key: key-cmd unwrap "
				 "exited with status 3: KEK disabled by admin; the KEK may be "
				 "revoked");
	keyprov_free(kp);
	kp = prov(KEYPROV_CMD, "kill -9 $$; :");
	assert_int_equal(unwrap_err(kp, w, sizeof(w), err, sizeof(err)), -EKEYREJECTED);
	assert_non_null(strstr(err, "killed by signal 9"));
	keyprov_free(kp);
	kp = prov(KEYPROV_CMD, "/nonexistent/kms-cli");
	assert_int_equal(unwrap_err(kp, w, sizeof(w), err, sizeof(err)), -EKEYREJECTED);
	assert_non_null(strstr(err, "status 127"));
	assert_non_null(strstr(err, "not found"));
	keyprov_free(kp);
}

/* The sample script with its KEK file moved away: revoked. */
static void test_cmd_kek_file_revoked(void **state)
{
	struct env *e = E(state);
	struct keyprov *kp = prov(KEYPROV_CMD, e->cmd_a);
	struct snap_key *k;
	uint8_t w[KEYPROV_WRAPPED_MAX];
	size_t wl;
	char err[512], moved[160];
	assert_int_equal(crypto_key_generate(&k), 0);
	assert_int_equal(keyprov_wrap(kp, k, w, sizeof(w), &wl, err, sizeof(err)), 0);
	snprintf(moved, sizeof(moved), "%s.away", e->kek_a);
	assert_int_equal(rename(e->kek_a, moved), 0);
	assert_int_equal(unwrap_err(kp, w, wl, err, sizeof(err)), -EKEYREJECTED);
	print_message("%s\n", err);
	assert_non_null(strstr(err, "key provider refused to unwrap the data key: "));
	assert_non_null(
	    strstr(err, "is not readable (deleted or revoked?); the KEK may be revoked"));
	assert_int_equal(rename(moved, e->kek_a), 0);
	/* tampered wrapped key: OAEP rejects it */
	w[100] ^= 1;
	assert_int_equal(unwrap_err(kp, w, wl, err, sizeof(err)), -EKEYREJECTED);
	assert_non_null(strstr(err, "unwrap failed"));
	/* the wrong KEK */
	w[100] ^= 1;
	struct keyprov *kb = prov(KEYPROV_CMD, e->cmd_b);
	assert_int_equal(unwrap_err(kb, w, wl, err, sizeof(err)), -EKEYREJECTED);
	keyprov_free(kb);
	keyprov_free(kp);
	crypto_key_free(k);
}

static void test_cmd_bad_output(void **state)
{
	(void)state;
	char err[512];
	uint8_t w[32] = {1};
	struct keyprov *kp = prov(KEYPROV_CMD, "f() { echo 'not base64!'; }; f");
	assert_int_equal(unwrap_err(kp, w, sizeof(w), err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "did not print base64"));
	keyprov_free(kp);
	kp = prov(KEYPROV_CMD, "f() { head -c 31 /dev/zero | base64; }; f"); /* ignores stdin */
	assert_int_equal(unwrap_err(kp, w, sizeof(w), err, sizeof(err)), -EBADMSG);
	assert_string_equal(err, "key provider unwrapped 31 bytes, not a 32-byte data key");
	keyprov_free(kp);
	kp = prov(KEYPROV_CMD, "f() { head -c 100000 /dev/zero | base64; }; f");
	assert_int_equal(unwrap_err(kp, w, sizeof(w), err, sizeof(err)), -EMSGSIZE);
	keyprov_free(kp);
	kp = prov(KEYPROV_CMD, "f() { :; }; f"); /* nothing on stdout */
	assert_int_equal(unwrap_err(kp, w, sizeof(w), err, sizeof(err)), -EINVAL);
	keyprov_free(kp);
	/* cove's own descriptors (here fd 57, opened without O_CLOEXEC) do not leak into it */
	int fd = dup2(2, 57);
	assert_int_equal(fd, 57);
	kp = prov(KEYPROV_CMD, "f() { [ -e /proc/$$/fd/57 ] && exit 9; cat; }; f");
	assert_int_equal(unwrap_err(kp, w, sizeof(w), err, sizeof(err)), 0);
	keyprov_free(kp);
	close(fd);
	/* the op argument is appended after the command's own arguments */
	kp = prov(KEYPROV_CMD, "f() { [ \"$1\" = x ] && [ \"$2\" = unwrap ] && cat; }; f x");
	assert_int_equal(unwrap_err(kp, w, sizeof(w), err, sizeof(err)), 0);
	keyprov_free(kp);
}

static void test_spec_and_config(void **state)
{
	(void)state;
	struct keyprov *kp = NULL;
	char err[512];
	assert_int_equal(keyprov_new_spec("key-cmd:kms wrap-tool", &kp, err, sizeof(err)), 0);
	assert_int_equal(keyprov_get_type(kp), KEYPROV_CMD);
	assert_string_equal(keyprov_config(kp), "kms wrap-tool");
	keyprov_free(kp);
	assert_int_equal(keyprov_new_spec("pkcs11:token=a%3bb;object=k", &kp, err, sizeof(err)), 0);
	assert_int_equal(keyprov_get_type(kp), KEYPROV_PKCS11);
	keyprov_free(kp);
	assert_int_equal(keyprov_new_spec("vault:x", &kp, err, sizeof(err)), -EINVAL);
	assert_int_equal(keyprov_new(KEYPROV_CMD, "", &kp, err, sizeof(err)), -EINVAL);
	assert_int_equal(keyprov_new(KEYPROV_CMD, "a\nb", &kp, err, sizeof(err)), -EINVAL);
	static const char *bad[] = {
	    "pkcs11:object=k",
	    "pkcs11:token=t",
	    "pkcs11:token=t;object=k;pin-value=1234",
	    "pkcs11:token=t;object=k;colour=red",
	    "pkcs11:token=t;object=%zz",
	    "pkcs11:token=t;object=k%4",
	    "pkcs11:token=t;object",
	    "token=t;object=k",
	    "pkcs11:token=123456789012345678901234567890123;object=k",
	};
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		err[0] = 0;
		assert_int_equal(keyprov_new(KEYPROV_PKCS11, bad[i], &kp, err, sizeof(err)),
				 -EINVAL);
		assert_true(err[0] != 0);
	}
	keyprov_new(KEYPROV_PKCS11, bad[2], &kp, err, sizeof(err));
	assert_non_null(strstr(err, "pin-value is not accepted"));
	char big[KEYPROV_CONFIG_MAX + 2];
	memset(big, 'a', sizeof(big) - 1);
	big[sizeof(big) - 1] = 0;
	assert_int_equal(keyprov_new(KEYPROV_CMD, big, &kp, err, sizeof(err)), -EINVAL);
}

/* ---- keys file ---- */

static void read_all(const char *path, uint8_t *buf, size_t cap, size_t *len)
{
	int fd = open(path, O_RDONLY);
	assert_true(fd >= 0);
	ssize_t n = read(fd, buf, cap);
	assert_true(n >= 0);
	*len = (size_t)n;
	close(fd);
}

static void write_all(const char *path, const void *buf, size_t len)
{
	int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, buf, len), (ssize_t)len);
	close(fd);
}

static void test_keyfile_create_open(void **state)
{
	struct env *e = E(state);
	char dir[128], err[512];
	uint8_t id1[16], id2[16];
	struct snap_key *k1, *k2;
	new_chain(e, dir, sizeof(dir));
	struct keyprov *kp = prov(KEYPROV_CMD, e->cmd_a);
	int r = keyfile_create(dir, kp, &k1, id1, err, sizeof(err));
	if (r)
		fail_msg("%s", err);
	/* the host's provider, the one the file records */
	r = keyfile_open(dir, kp, &k2, id2, err, sizeof(err));
	if (r)
		fail_msg("%s", err);
	assert_memory_equal(crypto_key_bytes(k1), crypto_key_bytes(k2), CRYPTO_KEY_LEN);
	assert_memory_equal(id1, id2, 16);
	enum keyprov_type t;
	char config[KEYPROV_CONFIG_MAX + 1];
	assert_int_equal(keyfile_describe(dir, &t, config, sizeof(config), id2, err, sizeof(err)),
			 0);
	assert_int_equal(t, KEYPROV_CMD);
	assert_string_equal(config, e->cmd_a);
	crypto_key_free(k2);
	assert_int_equal(keyfile_create(dir, kp, &k2, id2, err, sizeof(err)), -EEXIST);
	char path[160];
	snprintf(path, sizeof(path), "%s/keys", dir);
	struct stat st;
	assert_int_equal(stat(path, &st), 0);
	assert_int_equal(st.st_mode & 0777, 0600);
	/* the keys file holds neither the data key nor the KEK */
	uint8_t buf[KEYFILE_MAX];
	size_t len;
	read_all(path, buf, sizeof(buf), &len);
	assert_null(memmem(buf, len, crypto_key_bytes(k1), CRYPTO_KEY_LEN));
	crypto_key_free(k1);
	keyprov_free(kp);
	struct keyprov *kp2 = prov(KEYPROV_CMD, e->cmd_a);
	snprintf(path, sizeof(path), "%s/nochain", e->dir);
	assert_int_equal(keyfile_open(path, kp2, &k2, id2, err, sizeof(err)), -ENOENT);
	keyprov_free(kp2);
}

/* Rewrite a keys file's CRC after editing it, so the checks behind the CRC are reached. */
static void fix_crc(uint8_t *buf, size_t len)
{
	put_le32(buf + len - 4, crc32_update(0, buf, len - 4));
}

static void expect_bad(const char *dir, struct keyprov *kp, const uint8_t *buf, size_t len,
		       int code, const char *needle)
{
	char path[160], err[512] = "";
	uint8_t id[16];
	struct snap_key *k = NULL;
	snprintf(path, sizeof(path), "%s/keys", dir);
	write_all(path, buf, len);
	int r = keyfile_open(dir, kp, &k, id, err, sizeof(err));
	if (r != code || !strstr(err, needle))
		fail_msg("want %d '%s', got %d '%s'", code, needle, r, err);
	assert_null(k);
}

static void test_keyfile_corrupt(void **state)
{
	struct env *e = E(state);
	char dir[128], path[160], err[512];
	uint8_t id[16], orig[KEYFILE_MAX], b[KEYFILE_MAX + 16];
	size_t len;
	struct snap_key *k;
	new_chain(e, dir, sizeof(dir));
	struct keyprov *kp = prov(KEYPROV_CMD, "f() { cat; }; f");
	assert_int_equal(keyfile_create(dir, kp, &k, id, err, sizeof(err)), 0);
	crypto_key_free(k);
	snprintf(path, sizeof(path), "%s/keys", dir);
	read_all(path, orig, sizeof(orig), &len);
	assert_int_equal(len, 56 + strlen("f() { cat; }; f") + 32 + 4);

	static const size_t cuts[] = {0, 7, 55, 59, 80};
	for (size_t i = 0; i < sizeof(cuts) / sizeof(cuts[0]); i++)
		expect_bad(dir, kp, orig, cuts[i], -EINVAL, "truncated");
	expect_bad(dir, kp, orig, len - 1, -EINVAL, "truncated");
	memcpy(b, orig, len);
	b[0] = 'X';
	expect_bad(dir, kp, b, len, -EINVAL, "not a cove keys file (bad magic)");
	memcpy(b, orig, len);
	put_le32(b + 8, 3);
	fix_crc(b, len);
	expect_bad(dir, kp, b, len, -EINVAL, "unsupported version 3 (this cove reads 2)");
	memcpy(b, orig, len);
	put_le32(b + 8, 1);
	fix_crc(b, len);
	expect_bad(dir, kp, b, len, -EINVAL,
		   "keys file version 1 is from a cove without per-layer salts");
	memcpy(b, orig, len);
	put_le32(b + 32, KEYPROV_CONFIG_MAX + 1);
	expect_bad(dir, kp, b, len, -EINVAL, "provider config length 4097 (1..4096)");
	memcpy(b, orig, len);
	put_le32(b + 36, 0xffffffffu);
	expect_bad(dir, kp, b, len, -EINVAL, "wrapped key length 4294967295 (1..4096)");
	memcpy(b, orig, len);
	put_le32(b + 36, 0);
	expect_bad(dir, kp, b, len, -EINVAL, "wrapped key length 0");
	memcpy(b, orig, len);
	put_le32(b + 28, 9);
	fix_crc(b, len);
	expect_bad(dir, kp, b, len, -EINVAL, "unknown key provider type 9");
	for (size_t at = 8; at < len; at += 7) { /* any flipped byte: the CRC or a field check */
		memcpy(b, orig, len);
		b[at] ^= 0x20;
		expect_bad(dir, kp, b, len, -EINVAL, "");
	}
	memcpy(b, orig, len);
	b[len - 10] ^= 1; /* inside the wrapped key */
	expect_bad(dir, kp, b, len, -EINVAL, "checksum mismatch (corrupt)");
	memcpy(b, orig, len);
	b[len] = 0;
	expect_bad(dir, kp, b, len + 1, -EINVAL, "1 trailing bytes");
	memset(b, 0, sizeof(b));
	memcpy(b, orig, len);
	expect_bad(dir, kp, b, KEYFILE_MAX + 1, -EINVAL, "larger than 65536 bytes");
	/* a wrapped key that unwraps (CRC fixed) but to another key: caught by the check value */
	memcpy(b, orig, len);
	b[len - 10] ^= 1;
	fix_crc(b, len);
	expect_bad(dir, kp, b, len, -EBADMSG, "does not belong to this chain");
	write_all(path, orig, len);
	assert_int_equal(keyfile_open(dir, kp, &k, id, err, sizeof(err)), 0);
	crypto_key_free(k);
	keyprov_free(kp);
}

/*
 * Issue 12 item 1: a keys file rewritten (valid CRC) to name a key command that touches a
 * canary must never run it: not without a host provider, not with the honest one, not on rekey.
 */
static void test_keyfile_provider_from_host(void **state)
{
	struct env *e = E(state);
	char dir[128], path[160], canary[160], evil[1800], err[512];
	uint8_t id[16], orig[KEYFILE_MAX], b[KEYFILE_MAX];
	size_t len;
	struct snap_key *k = NULL;
	new_chain(e, dir, sizeof(dir));
	struct keyprov *a = prov(KEYPROV_CMD, e->cmd_a), *bp = prov(KEYPROV_CMD, e->cmd_b);
	assert_int_equal(keyfile_create(dir, a, &k, id, err, sizeof(err)), 0);
	crypto_key_free(k);
	k = NULL;
	snprintf(path, sizeof(path), "%s/keys", dir);
	snprintf(canary, sizeof(canary), "%s/canary", dir);
	read_all(path, orig, sizeof(orig), &len);
	/* same wrapped key, the config replaced by a command that would leave a marker */
	snprintf(evil, sizeof(evil), "touch '%s'; %s", canary, e->cmd_a);
	uint32_t cl = get_le32(orig + 32), wl = get_le32(orig + 36);
	size_t el = strlen(evil);
	memcpy(b, orig, 56);
	put_le32(b + 32, (uint32_t)el);
	memcpy(b + 56, evil, el);
	memcpy(b + 56 + el, orig + 56 + cl, wl);
	size_t blen = 56 + el + wl + 4;
	fix_crc(b, blen);
	write_all(path, b, blen);
	enum keyprov_type t;
	char config[KEYPROV_CONFIG_MAX + 1];
	assert_int_equal(keyfile_describe(dir, &t, config, sizeof(config), id, err, sizeof(err)),
			 0);
	assert_string_equal(config, evil); /* the file is well-formed: only policy stops it */
	assert_int_equal(keyfile_open(dir, NULL, &k, id, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "needs its key provider from the host"));
	assert_int_equal(keyfile_open(dir, a, &k, id, err, sizeof(err)), -EKEYREJECTED);
	assert_non_null(strstr(err, "records another key-cmd key provider"));
	assert_null(k);
	assert_int_equal(keyfile_rekey(dir, NULL, bp, err, sizeof(err)), -EINVAL);
	assert_int_equal(keyfile_rekey(dir, a, bp, err, sizeof(err)), -EKEYREJECTED);
	struct snap_crypt sc;
	assert_int_equal(snap_crypt_open(&sc, dir, NULL, 1, err, sizeof(err)), -EINVAL);
	assert_int_equal(access(canary, F_OK), -1);
	/* the file is unchanged by the refusals; the honest file opens with the honest provider */
	uint8_t now[KEYFILE_MAX];
	size_t nlen;
	read_all(path, now, sizeof(now), &nlen);
	assert_int_equal(nlen, blen);
	assert_memory_equal(now, b, blen);
	write_all(path, orig, len);
	assert_int_equal(keyfile_open(dir, a, &k, id, err, sizeof(err)), 0);
	crypto_key_free(k);
	assert_int_equal(access(canary, F_OK), -1);
	keyprov_free(a);
	keyprov_free(bp);
}

static void test_layer_ids(void **state)
{
	struct env *e = E(state);
	char dir[128], path[160], err[512];
	uint64_t id;
	uint8_t cid[16];
	struct snap_key *k;
	new_chain(e, dir, sizeof(dir));
	/* no keys file, no counter: refused, never "start again at 0" */
	assert_int_equal(keyfile_next_layer_id(dir, &id, err, sizeof(err)), -ESTALE);
	assert_non_null(strstr(err, "layer-seq is missing"));
	struct keyprov *kp = prov(KEYPROV_CMD, "f() { cat; }; f");
	assert_int_equal(keyfile_create(dir, kp, &k, cid, err, sizeof(err)), 0);
	crypto_key_free(k);
	keyprov_free(kp);
	for (uint64_t want = 1; want < 5; want++) {
		assert_int_equal(keyfile_next_layer_id(dir, &id, err, sizeof(err)), 0);
		assert_int_equal(id, want);
	}
	snprintf(path, sizeof(path), "%s/layer-seq", dir);
	uint8_t b[12], saved[12];
	size_t len;
	read_all(path, saved, sizeof(saved), &len);
	assert_int_equal(len, 12);
	put_le64(b, CRYPTO_LAYER_MAX);
	put_le32(b + 8, crc32_update(0, b, 8));
	write_all(path, b, sizeof(b));
	assert_int_equal(keyfile_next_layer_id(dir, &id, err, sizeof(err)), 0);
	assert_int_equal(id, CRYPTO_LAYER_MAX);
	assert_int_equal(keyfile_next_layer_id(dir, &id, err, sizeof(err)), -ERANGE);
	b[0] ^= 1;
	write_all(path, b, sizeof(b));
	assert_int_equal(keyfile_next_layer_id(dir, &id, err, sizeof(err)), -EINVAL);
	assert_non_null(strstr(err, "corrupt layer id counter"));
	write_all(path, saved, sizeof(saved)); /* next = 5 */
	assert_int_equal(keyfile_next_layer_id(dir, &id, err, sizeof(err)), 0);
	assert_int_equal(id, 5);
	assert_int_equal(keyfile_next_layer_id(dir, &id, err, sizeof(err)), 0);
	assert_int_equal(id, 6);
}

/*
 * Issue 12 item 5: a counter rolled back below a layer the chain holds, or deleted, is refused
 * (ids, and with them nonces, would repeat), and the counter is not moved by the refusal.
 */
static void test_layer_ids_rollback(void **state)
{
	struct env *e = E(state);
	char dir[160], path[200], err[512];
	uint64_t id;
	uint8_t cid[16], saved[12], now[12];
	size_t len;
	struct snap_key *k;
	new_chain(e, dir, sizeof(dir));
	struct keyprov *kp = prov(KEYPROV_CMD, "f() { cat; }; f");
	assert_int_equal(keyfile_create(dir, kp, &k, cid, err, sizeof(err)), 0);
	crypto_key_free(k);
	keyprov_free(kp);
	snprintf(path, sizeof(path), "%s/layer-seq", dir);
	read_all(path, saved, sizeof(saved), &len); /* next = 1 */
	for (int i = 0; i < 3; i++)
		assert_int_equal(keyfile_next_layer_id(dir, &id, err, sizeof(err)), 0);
	assert_int_equal(id, 3);
	static const char *const names[] = {"mem-000003", "state-000003", ".mem-000003.tmp",
					    "disk0-000003.ovl", "disk1-000003.ovl.map"};
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++) {
		char f[260];
		snprintf(f, sizeof(f), "%s/%s", dir, names[i]);
		write_all(f, "x", 1);
		write_all(path, saved, sizeof(saved)); /* rolled back to next = 1 */
		assert_int_equal(keyfile_next_layer_id(dir, &id, err, sizeof(err)), -ESTALE);
		if (!strstr(err, "is not above layer 3"))
			fail_msg("%s: %s", names[i], err);
		read_all(path, now, sizeof(now), &len);
		assert_memory_equal(now, saved, sizeof(saved));
		unlink(f);
	}
	/* names that carry no layer id of this chain are ignored */
	uint64_t x;
	assert_int_equal(keyfile_name_layer_id("disk0-r000009-123.ovl", &x), 0);
	assert_int_equal(keyfile_name_layer_id("mem-", &x), 0);
	assert_int_equal(keyfile_name_layer_id("mem-12x", &x), 0);
	assert_int_equal(keyfile_name_layer_id("chain.json", &x), 0);
	/* the names a filtered VMM gives new disk tops and sealed layers (sandbox.c, overlay.c) */
	assert_int_equal(keyfile_name_layer_id("disk0-000007-0a1b2c3d.ovl", &x), 1);
	assert_int_equal(x, 7);
	assert_int_equal(keyfile_name_layer_id("disk1-000008-0a1b2c3d-sealed.ovl.map", &x), 1);
	assert_int_equal(x, 8);
	assert_int_equal(keyfile_name_layer_id("disk0-r000009-deadbeef.ovl", &x), 1);
	assert_int_equal(x, 9);
	assert_int_equal(keyfile_name_layer_id("disk0-000010-sealed.ovl", &x), 1);
	assert_int_equal(x, 10);
	assert_int_equal(keyfile_name_layer_id("disk0-000007-0a1b2c3.ovl", &x), 0);
	assert_int_equal(keyfile_name_layer_id("state-000042", &x), 1);
	assert_int_equal(x, 42);
	/* deleted counter: refused with one line */
	unlink(path);
	assert_int_equal(keyfile_next_layer_id(dir, &id, err, sizeof(err)), -ESTALE);
	assert_non_null(strstr(err, "layer-seq is missing"));
	assert_int_equal(access(path, F_OK), -1);
}

/* Seal one page with the chain's key into DIR/layer-0; returns its bytes for comparison. */
static void seal_data_file(const char *dir, const struct snap_key *k, const uint8_t *id,
			   uint8_t *file /* PAGE + 16 */)
{
	struct crypto_ctx *cc;
	uint8_t plain[PAGE];
	char path[160];
	for (int i = 0; i < PAGE; i++)
		plain[i] = (uint8_t)(i ^ 0x5a);
	static const uint8_t salt[CRYPTO_SALT_LEN] = {1, 2, 3};
	assert_int_equal(crypto_ctx_new(k, &cc), 0);
	assert_int_equal(crypto_ctx_add_layer(cc, 1, salt), 0);
	assert_int_equal(crypto_seal_page(cc, id, 1, 7, plain, PAGE, file, file + PAGE), 0);
	crypto_ctx_free(cc);
	snprintf(path, sizeof(path), "%s/layer-0", dir);
	write_all(path, file, PAGE + 16);
}

/* Open DIR with provider kp; the data file must still be byte-identical and open. */
static void check_chain(const char *dir, struct keyprov *kp, const uint8_t *file,
			const uint8_t *id_want)
{
	struct snap_key *k;
	struct crypto_ctx *cc;
	uint8_t id[16], now[PAGE + 16], out[PAGE];
	size_t len;
	char err[512], path[160];
	int r = keyfile_open(dir, kp, &k, id, err, sizeof(err));
	if (r)
		fail_msg("keyfile_open: %s", err);
	assert_memory_equal(id, id_want, 16);
	snprintf(path, sizeof(path), "%s/layer-0", dir);
	read_all(path, now, sizeof(now), &len);
	assert_int_equal(len, PAGE + 16);
	assert_memory_equal(now, file, PAGE + 16);
	static const uint8_t salt[CRYPTO_SALT_LEN] = {1, 2, 3};
	assert_int_equal(crypto_ctx_new(k, &cc), 0);
	assert_int_equal(crypto_ctx_add_layer(cc, 1, salt), 0);
	assert_int_equal(crypto_open_page(cc, id, 1, 7, now, PAGE, out, now + PAGE), 0);
	assert_int_equal(out[3], 3 ^ 0x5a);
	crypto_ctx_free(cc);
	crypto_key_free(k);
}

static void test_rekey_cmd(void **state)
{
	struct env *e = E(state);
	char dir[128], err[512];
	uint8_t id[16], file[PAGE + 16];
	struct snap_key *k;
	new_chain(e, dir, sizeof(dir));
	struct keyprov *a = prov(KEYPROV_CMD, e->cmd_a), *b = prov(KEYPROV_CMD, e->cmd_b);
	assert_int_equal(keyfile_create(dir, a, &k, id, err, sizeof(err)), 0);
	seal_data_file(dir, k, id, file);
	crypto_key_free(k);
	/* the old provider comes from the caller, never from the file */
	assert_int_equal(keyfile_rekey(dir, NULL, b, err, sizeof(err)), -EINVAL);
	int r = keyfile_rekey(dir, a, b, err, sizeof(err));
	if (r)
		fail_msg("rekey: %s", err);
	check_chain(dir, b, file, id);
	/* the old KEK can no longer open it: it holds the new wrapping */
	assert_int_equal(keyfile_open(dir, a, &k, id, err, sizeof(err)), -EKEYREJECTED);
	keyprov_free(a);
	keyprov_free(b);
}

/* ---- PKCS#11 (SoftHSM2) ---- */

static void test_p11_round_trip(void **state)
{
	struct env *e = E(state);
	struct keyprov *kp = prov(KEYPROV_PKCS11, e->p11_kek1);
	assert_int_equal(round_trip(kp), 1 + 12 + 32 + 16);
	keyprov_free(kp);
	kp = prov(KEYPROV_PKCS11, e->p11_kek2); /* default module */
	round_trip(kp);
	keyprov_free(kp);
}

static void test_p11_pin(void **state)
{
	struct env *e = E(state);
	char cfg[700], pinf[128], err[512];
	struct snap_key *k;
	uint8_t w[KEYPROV_WRAPPED_MAX];
	size_t wl;
	assert_int_equal(crypto_key_generate(&k), 0);
	setenv("COVE_PKCS11_PIN", "9999", 1);
	struct keyprov *kp = prov(KEYPROV_PKCS11, e->p11_kek1);
	assert_int_equal(keyprov_wrap(kp, k, w, sizeof(w), &wl, err, sizeof(err)), -EACCES);
	assert_string_equal(err, "PKCS#11 login to token 'cove' failed: CKR_PIN_INCORRECT (0xa0)");
	keyprov_free(kp);
	unsetenv("COVE_PKCS11_PIN");
	kp = prov(KEYPROV_PKCS11, e->p11_kek1);
	assert_int_equal(keyprov_wrap(kp, k, w, sizeof(w), &wl, err, sizeof(err)), -EACCES);
	assert_non_null(strstr(err, "no PKCS#11 PIN"));
	keyprov_free(kp);
	snprintf(pinf, sizeof(pinf), "%s/pin", e->dir);
	write_all(pinf, "1234\n", 5);
	snprintf(cfg, sizeof(cfg), "%s;pin-file=%s", e->p11_kek1, pinf);
	kp = prov(KEYPROV_PKCS11, cfg);
	round_trip(kp);
	keyprov_free(kp);
	setenv("COVE_PKCS11_PIN", "1234", 1);
	crypto_key_free(k);
}

static void test_p11_errors(void **state)
{
	struct env *e = E(state);
	char err[512];
	struct snap_key *k;
	uint8_t w[KEYPROV_WRAPPED_MAX];
	size_t wl;
	assert_int_equal(crypto_key_generate(&k), 0);
	struct keyprov *kp = prov(KEYPROV_PKCS11, e->p11_kek1);
	assert_int_equal(keyprov_wrap(kp, k, w, sizeof(w), &wl, err, sizeof(err)), 0);
	for (size_t at = 0; at < wl; at += 5) {
		w[at] ^= 1;
		int r = unwrap_err(kp, w, wl, err, sizeof(err));
		assert_true(r == -EKEYREJECTED || (at == 0 && r == -EINVAL));
		w[at] ^= 1;
	}
	assert_int_equal(unwrap_err(kp, w, wl - 1, err, sizeof(err)), -EKEYREJECTED);
	print_message("tampered: %s\n", err);
	keyprov_free(kp);
	kp = prov(KEYPROV_PKCS11, "pkcs11:token=nosuch;object=kek1");
	assert_int_equal(unwrap_err(kp, w, wl, err, sizeof(err)), -EKEYREJECTED);
	assert_string_equal(err, "key provider refused to unwrap the data key: no PKCS#11 token "
				 "labelled 'nosuch' in /usr/lib/softhsm/libsofthsm2.so; the KEK "
				 "may be revoked");
	keyprov_free(kp);
	kp = prov(KEYPROV_PKCS11, "pkcs11:module=/nonexistent/p11.so;token=cove;object=kek1");
	assert_int_equal(unwrap_err(kp, w, wl, err, sizeof(err)), -ENOENT);
	assert_non_null(strstr(err, "cannot load PKCS#11 module /nonexistent/p11.so"));
	keyprov_free(kp);
	/* kek2 cannot open kek1's wrapping */
	kp = prov(KEYPROV_PKCS11, e->p11_kek2);
	assert_int_equal(unwrap_err(kp, w, wl, err, sizeof(err)), -EKEYREJECTED);
	keyprov_free(kp);
	crypto_key_free(k);
}

/* key-cmd -> PKCS#11 -> key-cmd; the data file never changes and always opens. */
static void test_rekey_cmd_p11(void **state)
{
	struct env *e = E(state);
	char dir[128], err[512];
	uint8_t id[16], file[PAGE + 16];
	struct snap_key *k;
	enum keyprov_type t;
	char config[KEYPROV_CONFIG_MAX + 1];
	new_chain(e, dir, sizeof(dir));
	struct keyprov *a = prov(KEYPROV_CMD, e->cmd_a), *p = prov(KEYPROV_PKCS11, e->p11_kek2);
	assert_int_equal(keyfile_create(dir, a, &k, id, err, sizeof(err)), 0);
	seal_data_file(dir, k, id, file);
	crypto_key_free(k);
	int r = keyfile_rekey(dir, a, p, err, sizeof(err));
	if (r)
		fail_msg("rekey to pkcs11: %s", err);
	assert_int_equal(keyfile_describe(dir, &t, config, sizeof(config), id, err, sizeof(err)),
			 0);
	assert_int_equal(t, KEYPROV_PKCS11);
	assert_string_equal(config, e->p11_kek2);
	check_chain(dir, p, file, id);
	r = keyfile_rekey(dir, p, a, err, sizeof(err));
	if (r)
		fail_msg("rekey back: %s", err);
	assert_int_equal(keyfile_describe(dir, &t, config, sizeof(config), id, err, sizeof(err)),
			 0);
	assert_int_equal(t, KEYPROV_CMD);
	check_chain(dir, a, file, id);
	keyprov_free(a);
	keyprov_free(p);
}

/* Delete the KEK object from the token: opening the chain fails with the revocation line. */
static void test_p11_revoke(void **state)
{
	struct env *e = E(state);
	char dir[128], err[512], cfg[600];
	uint8_t id[16];
	struct snap_key *k;
	new_chain(e, dir, sizeof(dir));
	sh("pkcs11-tool --module %s --login --pin 1234 --keygen --key-type AES:32 --label kek3 "
	   "--token-label cove >/dev/null 2>&1",
	   SOFTHSM_MODULE);
	snprintf(cfg, sizeof(cfg), "pkcs11:token=cove;object=kek3");
	struct keyprov *p = prov(KEYPROV_PKCS11, cfg);
	assert_int_equal(keyfile_create(dir, p, &k, id, err, sizeof(err)), 0);
	crypto_key_free(k);
	assert_int_equal(keyfile_open(dir, p, &k, id, err, sizeof(err)), 0);
	crypto_key_free(k);
	sh("pkcs11-tool --module %s --login --pin 1234 --token-label cove --delete-object "
	   "--type secrkey --label kek3 >/dev/null 2>&1",
	   SOFTHSM_MODULE);
	k = NULL;
	assert_int_equal(keyfile_open(dir, p, &k, id, err, sizeof(err)), -EKEYREJECTED);
	assert_null(k);
	print_message("%s\n", err);
	assert_string_equal(err, "key provider refused to unwrap the data key: no AES key object "
				 "labelled 'kek3' on token 'cove'; the KEK may be revoked");
	assert_int_equal(keyfile_rekey(dir, p, p, err, sizeof(err)), -EKEYREJECTED);
	keyprov_free(p);
}

/* `cove rekey` from the command line: key-cmd -> pkcs11 -> revoked. */
static void test_cli_rekey(void **state)
{
	struct env *e = E(state);
	const char *cove = getenv("COVE_BIN");
	char dir[128], err[512];
	uint8_t id[16], file[PAGE + 16];
	struct snap_key *k;
	if (!cove || access(cove, X_OK) != 0)
		skip();
	new_chain(e, dir, sizeof(dir));
	struct keyprov *a = prov(KEYPROV_CMD, e->cmd_a);
	assert_int_equal(keyfile_create(dir, a, &k, id, err, sizeof(err)), 0);
	seal_data_file(dir, k, id, file);
	crypto_key_free(k);
	/* without --from: refused (exit 2), nothing runs, the file is unchanged */
	char cmd0[1024];
	snprintf(cmd0, sizeof(cmd0),
		 "'%s' rekey '%s' --to-pkcs11 'pkcs11:token=cove;object=kek2' "
		 "2>/dev/null",
		 cove, dir);
	int st0 = system(cmd0);
	assert_true(WIFEXITED(st0) && WEXITSTATUS(st0) == 2);
	check_chain(dir, a, file, id);
	sh("'%s' rekey '%s' --from-key-cmd \"%s\" --to-pkcs11 'pkcs11:token=cove;object=kek2' "
	   ">/dev/null",
	   cove, dir, e->cmd_a);
	struct keyprov *p2 = prov(KEYPROV_PKCS11, "pkcs11:token=cove;object=kek2");
	check_chain(dir, p2, file, id);
	sh("'%s' rekey '%s' --from-pkcs11 'pkcs11:token=cove;object=kek2' --to-key-cmd \"%s\" "
	   ">/dev/null",
	   cove, dir, e->cmd_a);
	check_chain(dir, a, file, id);
	/* a provider other than the recorded one: refused before it runs (it would print) */
	char out[256], cmd[2400];
	uint8_t msg[512];
	size_t len;
	snprintf(out, sizeof(out), "%s/rekey.err", e->dir);
	snprintf(cmd, sizeof(cmd),
		 "'%s' rekey '%s' --from-key-cmd 'f() { echo gone >&2; exit 1; }; f' "
		 "--to-pkcs11 'pkcs11:token=cove;object=kek2' 2>'%s'",
		 cove, dir, out);
	int st = system(cmd);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 1);
	read_all(out, msg, sizeof(msg) - 1, &len);
	msg[len] = 0;
	assert_string_equal(
	    (char *)msg,
	    "cove rekey: the chain's keys file records another key-cmd key provider "
	    "than the host's: give the provider that wrapped it, or rekey the chain\n");
	/* the recorded provider refusing (its KEK gone): exit 1 and the revocation line */
	char moved[160];
	snprintf(moved, sizeof(moved), "%s.gone", e->kek_a);
	assert_int_equal(rename(e->kek_a, moved), 0);
	snprintf(
	    cmd, sizeof(cmd),
	    "'%s' rekey '%s' --from-key-cmd \"%s\" --to-pkcs11 'pkcs11:token=cove;object=kek2' "
	    "2>'%s'",
	    cove, dir, e->cmd_a, out);
	st = system(cmd);
	assert_int_equal(rename(moved, e->kek_a), 0);
	assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 1);
	read_all(out, msg, sizeof(msg) - 1, &len);
	msg[len] = 0;
	assert_non_null(
	    strstr((char *)msg, "cove rekey: key provider refused to unwrap the data key"));
	assert_non_null(strstr((char *)msg, "; the KEK may be revoked\n"));
	check_chain(dir, a, file, id); /* untouched */
	keyprov_free(p2);
	keyprov_free(a);
}

static int have(const char *what)
{
	char cmd[256];
	snprintf(cmd, sizeof(cmd), "command -v %s >/dev/null 2>&1", what);
	return system(cmd) == 0;
}

int main(int argc, char **argv)
{
	const struct CMUnitTest cmd_tests[] = {
	    cmocka_unit_test(test_cmd_round_trip),
	    cmocka_unit_test(test_cmd_relay),
	    cmocka_unit_test(test_cmd_refuses),
	    cmocka_unit_test(test_cmd_kek_file_revoked),
	    cmocka_unit_test(test_cmd_bad_output),
	    cmocka_unit_test(test_spec_and_config),
	    cmocka_unit_test(test_keyfile_create_open),
	    cmocka_unit_test(test_keyfile_corrupt),
	    cmocka_unit_test(test_keyfile_provider_from_host),
	    cmocka_unit_test(test_layer_ids),
	    cmocka_unit_test(test_layer_ids_rollback),
	    cmocka_unit_test(test_rekey_cmd),
	};
	const struct CMUnitTest p11_tests[] = {
	    cmocka_unit_test(test_p11_round_trip), cmocka_unit_test(test_p11_pin),
	    cmocka_unit_test(test_p11_errors),	   cmocka_unit_test(test_rekey_cmd_p11),
	    cmocka_unit_test(test_p11_revoke),	   cmocka_unit_test(test_cli_rekey),
	};
	if (!have("openssl")) {
		fprintf(stderr, "skip: no openssl command for tools/key-cmd-openssl\n");
		return 77;
	}
	if (argc > 1 && strcmp(argv[1], "pkcs11") == 0) {
		if (!have("softhsm2-util") || !have("pkcs11-tool") ||
		    access(SOFTHSM_MODULE, R_OK) != 0) {
			fprintf(stderr, "skip: needs softhsm2-util, pkcs11-tool (opensc) and %s\n",
				SOFTHSM_MODULE);
			return 77;
		}
		return cmocka_run_group_tests_name("keyprov_pkcs11", p11_tests, env_setup_p11,
						   env_teardown);
	}
	return cmocka_run_group_tests_name("keyprov_cmd", cmd_tests, env_setup_cmd, env_teardown);
}
