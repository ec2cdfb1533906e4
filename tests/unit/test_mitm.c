/* broker/mitm_ca.c and broker/mitm_tls.c with real OpenSSL and real sockets: the CA's files,
 * leaves checked by X509_verify_cert, and whole tunnels: a guest that trusts only the sandbox
 * CA, mitm_serve, and a TLS upstream whose certificate comes from a separate test CA. */
#include "helpers.h"

#include "broker/mitm_ca.h"
#include "broker/mitm_tls.h"
#include "common/dirfd_io.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <signal.h>
#include <pthread.h>
#include <sys/socket.h>
#include <sys/stat.h>

#define SECRET "ghp_S3cr3tT0kenValue42"

static const char policy_json[] =
    "{\"credentials\": {\"gh\": {\"helper\": [\"/bin/true\"],"
    "  \"inject\": {\"header\": \"Authorization\", \"template\": \"Bearer {password}\"},"
    "  \"allow\": {\"hosts\": [\"api.test\", \"*.example.net\"]}}}}";

static void rm_tree(const char *dir)
{
	char cmd[600];

	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", dir);
	assert_int_equal(system(cmd), 0);
}

static int tmp_dir(char *path)
{
	strcpy(path, "/tmp/cove-mitm-XXXXXX");
	assert_non_null(mkdtemp(path));
	return dirfd_open_dir(path, false, NULL, 0);
}

/* ---- the CA ---- */

static void test_ca_create_load(void **state)
{
	char dir[64], err[256], *pem, file[8192];
	struct mitm_ca ca, again;
	struct stat st;
	size_t len;
	ssize_t n;
	int dfd = tmp_dir(dir), fd, idx;
	X509_EXTENSION *ext;

	(void)state;
	assert_true(dfd >= 0);
	assert_int_equal(mitm_ca_open(&ca, dfd, "demo", err, sizeof(err)), 0);
	assert_int_equal(fstatat(dfd, MITM_CA_KEY_FILE, &st, AT_SYMLINK_NOFOLLOW), 0);
	assert_true(S_ISREG(st.st_mode));
	assert_int_equal(st.st_mode & 07777, 0600);
	assert_int_equal(fstatat(dfd, MITM_CA_CERT_FILE, &st, AT_SYMLINK_NOFOLLOW), 0);
	assert_int_equal(st.st_mode & 022, 0); /* 0644 less the umask */
	/* No temp file left behind. */
	assert_int_equal(faccessat(dfd, ".mitm-ca.key.tmp", F_OK, AT_SYMLINK_NOFOLLOW), -1);

	/* The certificate: a CA, basicConstraints critical, keyCertSign, our subject. */
	assert_true(X509_check_ca(ca.cert) >= 1);
	idx = X509_get_ext_by_NID(ca.cert, NID_basic_constraints, -1);
	assert_true(idx >= 0);
	ext = X509_get_ext(ca.cert, idx);
	assert_true(X509_EXTENSION_get_critical(ext));
	assert_true(X509_get_key_usage(ca.cert) & KU_KEY_CERT_SIGN);
	assert_true(X509_get_key_usage(ca.cert) & KU_CRL_SIGN);
	X509_NAME_oneline(X509_get_subject_name(ca.cert), file, sizeof(file));
	assert_non_null(strstr(file, "cove sandbox demo CA"));
	assert_int_equal(EVP_PKEY_get_bits(ca.key), 256);

	/* The exported PEM is the file's text. */
	assert_int_equal(mitm_ca_cert_pem(&ca, &pem, &len), 0);
	fd = openat(dfd, MITM_CA_CERT_FILE, O_RDONLY);
	assert_true(fd >= 0);
	n = read(fd, file, sizeof(file));
	close(fd);
	assert_int_equal(n, (ssize_t)len);
	assert_memory_equal(file, pem, len);
	assert_null(strstr(pem, "PRIVATE"));
	free(pem);

	/* Loaded again: the same certificate and key. */
	assert_int_equal(mitm_ca_open(&again, dfd, "other-name-ignored", err, sizeof(err)), 0);
	assert_int_equal(X509_cmp(ca.cert, again.cert), 0);
	assert_int_equal(EVP_PKEY_eq(ca.key, again.key), 1);
	mitm_ca_free(&again);
	mitm_ca_free(&ca);
	mitm_ca_free(&ca); /* twice is harmless */

	/* A key readable by others is refused; so is a link in its place. */
	assert_int_equal(fchmodat(dfd, MITM_CA_KEY_FILE, 0640, 0), 0);
	assert_int_equal(mitm_ca_open(&ca, dfd, "demo", err, sizeof(err)), -EPERM);
	assert_one_line_error(err, "group/other");
	assert_int_equal(fchmodat(dfd, MITM_CA_KEY_FILE, 0600, 0), 0);
	assert_int_equal(renameat(dfd, MITM_CA_KEY_FILE, dfd, "real.key"), 0);
	assert_int_equal(symlinkat("real.key", dfd, MITM_CA_KEY_FILE), 0);
	assert_int_equal(mitm_ca_open(&ca, dfd, "demo", err, sizeof(err)), -ELOOP);
	assert_one_line_error(err, MITM_CA_KEY_FILE);
	/* A certificate that does not belong to the key. */
	assert_int_equal(unlinkat(dfd, MITM_CA_KEY_FILE, 0), 0);
	assert_int_equal(unlinkat(dfd, "real.key", 0), 0);
	assert_int_equal(mitm_ca_open(&ca, dfd, "demo", err, sizeof(err)), 0); /* new pair */
	mitm_ca_free(&ca);
	{
		char dir2[64];
		int d2 = tmp_dir(dir2);

		assert_int_equal(mitm_ca_open(&ca, d2, "two", err, sizeof(err)), 0);
		mitm_ca_free(&ca);
		assert_int_equal(renameat(d2, MITM_CA_CERT_FILE, dfd, MITM_CA_CERT_FILE), 0);
		assert_int_equal(mitm_ca_open(&ca, dfd, "demo", err, sizeof(err)), -EINVAL);
		assert_one_line_error(err, "does not match");
		close(d2);
		rm_tree(dir2);
	}
	assert_int_equal(mitm_ca_open(&ca, dfd, "", err, sizeof(err)), -EINVAL);
	assert_int_equal(mitm_ca_open(&ca, dfd, "bad\nname", err, sizeof(err)), -EINVAL);
	close(dfd);
	rm_tree(dir);
}

/* X509_verify_cert of leaf against a store holding only ca, for host (or an IP). */
static int verify_leaf(X509 *ca, X509 *leaf, const char *host, int ip)
{
	X509_STORE *st = X509_STORE_new();
	X509_STORE_CTX *ctx = X509_STORE_CTX_new();
	X509_VERIFY_PARAM *vp;
	int ok, e;

	assert_non_null(st);
	assert_non_null(ctx);
	assert_int_equal(X509_STORE_add_cert(st, ca), 1);
	assert_int_equal(X509_STORE_CTX_init(ctx, st, leaf, NULL), 1);
	vp = X509_STORE_CTX_get0_param(ctx);
	X509_VERIFY_PARAM_set_purpose(vp, X509_PURPOSE_SSL_SERVER);
	if (ip)
		assert_int_equal(X509_VERIFY_PARAM_set1_ip_asc(vp, host), 1);
	else
		assert_int_equal(X509_VERIFY_PARAM_set1_host(vp, host, 0), 1);
	ok = X509_verify_cert(ctx);
	e = X509_STORE_CTX_get_error(ctx);
	X509_STORE_CTX_free(ctx);
	X509_STORE_free(st);
	ERR_clear_error();
	return ok == 1 ? 0 : e ? e : -1;
}

static void test_leaf(void **state)
{
	char dir[64], dir2[64], err[256], host[32];
	struct mitm_ca ca, other;
	X509 *leaf, *again, *ipleaf, *foreign;
	int dfd = tmp_dir(dir), d2 = tmp_dir(dir2), i, used;
	STACK_OF(GENERAL_NAME) * san;
	EXTENDED_KEY_USAGE *eku;

	(void)state;
	assert_int_equal(mitm_ca_open(&ca, dfd, "leafy", err, sizeof(err)), 0);
	assert_int_equal(mitm_ca_leaf(&ca, "API.Test", &leaf, err, sizeof(err)), 0);
	assert_int_equal(verify_leaf(ca.cert, leaf, "api.test", 0), 0);
	assert_int_equal(verify_leaf(ca.cert, leaf, "other.test", 0), X509_V_ERR_HOSTNAME_MISMATCH);
	assert_int_equal(verify_leaf(ca.cert, leaf, "sub.api.test", 0),
			 X509_V_ERR_HOSTNAME_MISMATCH);
	/* Exactly one SAN, EKU serverAuth, not a CA, signed by the CA key. */
	san = X509_get_ext_d2i(leaf, NID_subject_alt_name, NULL, NULL);
	assert_non_null(san);
	assert_int_equal(sk_GENERAL_NAME_num(san), 1);
	GENERAL_NAMES_free(san);
	eku = X509_get_ext_d2i(leaf, NID_ext_key_usage, NULL, NULL);
	assert_non_null(eku);
	assert_int_equal(sk_ASN1_OBJECT_num(eku), 1);
	assert_int_equal(OBJ_obj2nid(sk_ASN1_OBJECT_value(eku, 0)), NID_server_auth);
	EXTENDED_KEY_USAGE_free(eku);
	assert_int_equal(X509_check_ca(leaf), 0);
	assert_int_equal(X509_verify(leaf, ca.key), 1);
	assert_int_equal(X509_cmp_time(X509_get0_notAfter(leaf), NULL), 1);
	{
		time_t later = time(NULL) + MITM_LEAF_SECS + 60;

		assert_int_equal(X509_cmp_time(X509_get0_notAfter(leaf), &later), -1);
	}

	/* Cached: the same certificate for the same host in any case. */
	assert_int_equal(mitm_ca_leaf(&ca, "api.test", &again, err, sizeof(err)), 0);
	assert_ptr_equal(leaf, again);
	X509_free(again);

	/* An IP literal gets an iPAddress SAN. */
	assert_int_equal(mitm_ca_leaf(&ca, "127.0.0.1", &ipleaf, err, sizeof(err)), 0);
	assert_int_equal(verify_leaf(ca.cert, ipleaf, "127.0.0.1", 1), 0);
	assert_int_not_equal(verify_leaf(ca.cert, ipleaf, "127.0.0.2", 1), 0);
	X509_free(ipleaf);

	/* A leaf of another CA does not verify against this one. */
	assert_int_equal(mitm_ca_open(&other, d2, "other", err, sizeof(err)), 0);
	assert_int_equal(mitm_ca_leaf(&other, "api.test", &foreign, err, sizeof(err)), 0);
	assert_int_not_equal(verify_leaf(ca.cert, foreign, "api.test", 0), 0);
	X509_free(foreign);
	mitm_ca_free(&other);

	/* Bad names are refused. */
	assert_int_equal(mitm_ca_leaf(&ca, "a..b", &again, err, sizeof(err)), -EINVAL);
	assert_int_equal(mitm_ca_leaf(&ca, "-x.test", &again, err, sizeof(err)), -EINVAL);
	assert_int_equal(mitm_ca_leaf(&ca, "x y", &again, err, sizeof(err)), -EINVAL);
	assert_int_equal(mitm_ca_leaf(&ca, "a,DNS:evil.test", &again, err, sizeof(err)), -EINVAL);
	assert_int_equal(mitm_ca_leaf(&ca, "", &again, err, sizeof(err)), -EINVAL);

	/* The cache is bounded: 100 hosts later it holds MITM_LEAF_CACHE, the old leaf still
	 * valid for whoever holds a reference. */
	for (i = 0; i < 100; i++) {
		snprintf(host, sizeof(host), "h%d.test", i);
		assert_int_equal(mitm_ca_leaf(&ca, host, &again, err, sizeof(err)), 0);
		X509_free(again);
	}
	for (i = used = 0; i < MITM_LEAF_CACHE; i++)
		used += ca.cache[i].host[0] != 0;
	assert_int_equal(used, MITM_LEAF_CACHE);
	assert_int_equal(verify_leaf(ca.cert, leaf, "api.test", 0), 0);
	X509_free(leaf);
	mitm_ca_free(&ca);
	close(dfd);
	close(d2);
	rm_tree(dir);
	rm_tree(dir2);
}

/* ---- whole tunnels ---- */

struct upstream {
	int lfd;
	SSL_CTX *ctx;
	volatile int stop;
	int conns, handshakes;
	char got[16384]; /* every request's bytes, in order */
	size_t got_len;
	pthread_t th;
};

struct mitm_run {
	struct mitm_ca *ca;
	struct mitm_upstream up;
	int fd;
	int rc;
	char err[256];
	int decided;
	struct policy *pol;
	int deny;
	pthread_t th;
};

struct fixture {
	char dir[64], updir[64], ca_pem_path[128], up_pem_path[128];
	int dfd, updfd;
	struct mitm_ca ca, upca;
	struct policy pol;
	struct upstream us;
	struct sockaddr_in addr;
};

/* Reads one request (head, then a Content-Length body) from the test upstream's client. */
static int up_read_request(SSL *s, struct upstream *u, size_t *head_at)
{
	size_t start = u->got_len, cl = 0;
	char *end, *p;
	int n;

	*head_at = start;
	for (;;) {
		u->got[u->got_len] = '\0';
		end = strstr(u->got + start, "\r\n\r\n");
		if (end)
			break;
		n = SSL_read(s, u->got + u->got_len, (int)(sizeof(u->got) - 1 - u->got_len));
		if (n <= 0)
			return -1;
		u->got_len += (size_t)n;
	}
	p = strcasestr(u->got + start, "\r\nContent-Length: ");
	if (p && p < end)
		cl = strtoul(p + 18, NULL, 10);
	p = strcasestr(u->got + start, "\r\nTransfer-Encoding: chunked\r\n");
	if (p && p < end) {
		/* Until the last chunk (the test sends no trailers). */
		while (u->got_len < 5 || memcmp(u->got + u->got_len - 5, "0\r\n\r\n", 5)) {
			n = SSL_read(s, u->got + u->got_len,
				     (int)(sizeof(u->got) - 1 - u->got_len));
			if (n <= 0)
				return -1;
			u->got_len += (size_t)n;
		}
	}
	while (u->got_len < (size_t)(end + 4 - u->got) + cl) {
		n = SSL_read(s, u->got + u->got_len, (int)(sizeof(u->got) - 1 - u->got_len));
		if (n <= 0)
			return -1;
		u->got_len += (size_t)n;
	}
	u->got[u->got_len] = '\0';
	return 0;
}

#define BIG_MAX (4u << 20)

/* About 1.2 MiB of text with the secret in every fifth row and once inside a 200 KiB run of
 * letters (which holds back the tunnel's cut). Returns its length. */
static size_t big_body(char *out)
{
	size_t o = 0, i;

	for (i = 0; o < (1200u << 10); i++) {
		if (i == 2000) {
			memset(out + o, 'a', 100000);
			o += 100000;
			memcpy(out + o, SECRET, strlen(SECRET));
			o += strlen(SECRET);
			memset(out + o, 'b', 100000);
			o += 100000;
		}
		o += (size_t)snprintf(out + o, BIG_MAX - o, "row %06zu: %s, then more\n", i,
				      i % 5 ? "nothing here" : SECRET);
	}
	return o;
}

static int ssl_write_str(SSL *s, const char *t)
{
	return SSL_write(s, t, (int)strlen(t)) == (int)strlen(t) ? 0 : -1;
}

/* Answers GET with the Authorization header it saw, in the X-Echo header and in a chunked body
 * cut into 5-byte chunks (so the secret straddles chunk boundaries); POST with its body. */
static void up_answer(SSL *s, struct upstream *u, size_t at)
{
	const char *req = u->got + at;
	char auth[512] = "", body[1200], line[64], head[1200];
	const char *a = strcasestr(req, "\r\nAuthorization: ");
	size_t i, n;

	if (a) {
		a += 17;
		n = strcspn(a, "\r");
		snprintf(auth, sizeof(auth), "%.*s", (int)n, a);
	}
	if (!strncmp(req, "HEAD ", 5)) {
		snprintf(head, sizeof(head),
			 "HTTP/1.1 200 OK\r\nContent-Length: 1234\r\nX-Echo: %s\r\n\r\n", auth);
		ssl_write_str(s, head);
		return;
	}
	if (!strncmp(req, "GET /big ", 9) || !strncmp(req, "GET /run ", 9)) {
		char *big = malloc(BIG_MAX);
		size_t bl = req[5] == 'b' ? big_body(big) : 0, o;

		assert_non_null(big);
		if (!bl) { /* no byte the tunnel may cut after */
			bl = MITM_SCRUB_RUN_MAX + (128u << 10);
			memset(big, 'a', bl);
		}
		snprintf(head, sizeof(head), "HTTP/1.1 200 OK\r\nContent-Length: %zu\r\n\r\n", bl);
		ssl_write_str(s, head);
		/* Odd write sizes, so secrets straddle the tunnel's reads. */
		for (o = 0; o < bl; o += 7001)
			if (SSL_write(s, big + o, (int)(bl - o < 7001 ? bl - o : 7001)) <= 0)
				break;
		free(big);
		return;
	}
	if (!strncmp(req, "GET /gzip ", 10)) {
		ssl_write_str(s, "HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\n"
				 "Content-Length: 3\r\n\r\nabc");
		return;
	}
	if (!strncmp(req, "POST ", 5)) {
		const char *b = strstr(req, "\r\n\r\n") + 4;

		snprintf(head, sizeof(head),
			 "HTTP/1.1 201 Created\r\nContent-Length: %zu\r\nX-Up: yes\r\n\r\n",
			 strlen(b));
		ssl_write_str(s, head);
		ssl_write_str(s, b);
		return;
	}
	snprintf(body, sizeof(body), "you sent: %s; and again %s\n", auth, auth);
	snprintf(head, sizeof(head),
		 "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-Echo: %s\r\n"
		 "Connection: close\r\n\r\n",
		 auth);
	ssl_write_str(s, head);
	for (i = 0; i < strlen(body); i += 5) {
		n = strlen(body) - i < 5 ? strlen(body) - i : 5;
		snprintf(line, sizeof(line), "%zx\r\n", n);
		ssl_write_str(s, line);
		SSL_write(s, body + i, (int)n);
		ssl_write_str(s, "\r\n");
	}
	ssl_write_str(s, "0\r\n\r\n");
}

static void *upstream_main(void *arg)
{
	struct upstream *u = arg;
	struct pollfd pfd = {.fd = u->lfd, .events = POLLIN};
	size_t at;
	SSL *s;
	int fd;

	while (!u->stop) {
		if (poll(&pfd, 1, 50) <= 0)
			continue;
		fd = accept(u->lfd, NULL, NULL);
		if (fd < 0)
			continue;
		u->conns++;
		s = SSL_new(u->ctx);
		SSL_set_fd(s, fd);
		if (SSL_accept(s) == 1) {
			u->handshakes++;
			if (up_read_request(s, u, &at) == 0)
				up_answer(s, u, at);
			SSL_shutdown(s);
		}
		ERR_clear_error();
		SSL_free(s);
		close(fd);
	}
	return NULL;
}

static int decide(void *arg, const struct mitm_request *rq, const struct cred_policy **cred,
		  struct secret *sec, char *err, size_t errlen)
{
	struct mitm_run *m = arg;

	m->decided++;
	if (m->deny) {
		snprintf(err, errlen, "denied by policy");
		return -EACCES;
	}
	assert_non_null(rq->method);
	assert_true(rq->target[0] == '/');
	*cred = policy_find(m->pol, "gh");
	strcpy(sec->password, SECRET);
	return 0;
}

static void *mitm_main(void *arg)
{
	struct mitm_run *m = arg;

	m->rc = mitm_serve(m->ca, m->fd, &m->up, m->err, sizeof(m->err));
	shutdown(m->fd, SHUT_RDWR);
	return NULL;
}

static void write_pem(const char *path, X509 *cert)
{
	FILE *f = fopen(path, "w");

	assert_non_null(f);
	assert_int_equal(PEM_write_X509(f, cert), 1);
	fclose(f);
}

static int loop_setup(void **state)
{
	struct fixture *fx = calloc(1, sizeof(*fx));
	socklen_t al = sizeof(fx->addr);
	char err[256];
	X509 *leaf;

	assert_non_null(fx);
	fx->dfd = tmp_dir(fx->dir);
	fx->updfd = tmp_dir(fx->updir);
	assert_int_equal(mitm_ca_open(&fx->ca, fx->dfd, "loop", err, sizeof(err)), 0);
	/* The upstream's own CA, as a public CA would be: separate key, separate directory. */
	assert_int_equal(mitm_ca_open(&fx->upca, fx->updfd, "test-upstream", err, sizeof(err)), 0);
	snprintf(fx->up_pem_path, sizeof(fx->up_pem_path), "%s/upstream-ca.pem", fx->updir);
	snprintf(fx->ca_pem_path, sizeof(fx->ca_pem_path), "%s/sandbox-ca.pem", fx->updir);
	write_pem(fx->up_pem_path, fx->upca.cert);
	write_pem(fx->ca_pem_path, fx->ca.cert);
	assert_int_equal(policy_parse(policy_json, strlen(policy_json), &fx->pol, err, sizeof(err)),
			 0);

	fx->us.ctx = SSL_CTX_new(TLS_server_method());
	assert_int_equal(mitm_ca_leaf(&fx->upca, "api.test", &leaf, err, sizeof(err)), 0);
	assert_int_equal(SSL_CTX_use_certificate(fx->us.ctx, leaf), 1);
	assert_int_equal(SSL_CTX_use_PrivateKey(fx->us.ctx, fx->upca.leaf_key), 1);
	X509_free(leaf);
	fx->us.lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	fx->addr.sin_family = AF_INET;
	fx->addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	assert_int_equal(bind(fx->us.lfd, (struct sockaddr *)&fx->addr, sizeof(fx->addr)), 0);
	assert_int_equal(listen(fx->us.lfd, 8), 0);
	assert_int_equal(getsockname(fx->us.lfd, (struct sockaddr *)&fx->addr, &al), 0);
	assert_int_equal(pthread_create(&fx->us.th, NULL, upstream_main, &fx->us), 0);
	*state = fx;
	return 0;
}

static int loop_teardown(void **state)
{
	struct fixture *fx = *state;

	fx->us.stop = 1;
	pthread_join(fx->us.th, NULL);
	close(fx->us.lfd);
	SSL_CTX_free(fx->us.ctx);
	policy_free(&fx->pol);
	mitm_ca_free(&fx->ca);
	mitm_ca_free(&fx->upca);
	close(fx->dfd);
	close(fx->updfd);
	rm_tree(fx->dir);
	rm_tree(fx->updir);
	free(fx);
	return 0;
}

/* Starts mitm_serve in a thread for host; returns the guest's end of the tunnel. mode 1: the
 * decision callback denies; 2: a 700 ms socket timeout instead of 5 s. */
static int start_mitm(struct fixture *fx, struct mitm_run *m, const char *host, const char *ca_file,
		      int mode)
{
	int sv[2];

	memset(m, 0, sizeof(*m));
	assert_int_equal(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
	m->ca = &fx->ca;
	m->pol = &fx->pol;
	m->deny = mode == 1;
	m->fd = sv[1];
	m->up.host = host;
	m->up.port = 443;
	m->up.addr = (struct sockaddr *)&fx->addr;
	m->up.addrlen = sizeof(fx->addr);
	m->up.ca_file = ca_file;
	m->up.timeout_ms = mode == 2 ? 700 : 5000;
	m->up.decide = decide;
	m->up.arg = m;
	assert_int_equal(pthread_create(&m->th, NULL, mitm_main, m), 0);
	return sv[0];
}

static void finish_mitm(struct mitm_run *m)
{
	pthread_join(m->th, NULL);
	close(m->fd);
}

/* The guest: TLS to the tunnel trusting only the sandbox CA, checking host. */
static SSL *guest_connect(struct fixture *fx, int fd, const char *host, SSL_CTX **ctxp)
{
	SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
	SSL *s;

	assert_non_null(ctx);
	assert_int_equal(SSL_CTX_load_verify_locations(ctx, fx->ca_pem_path, NULL), 1);
	SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
	s = SSL_new(ctx);
	SSL_set_fd(s, fd);
	SSL_set_tlsext_host_name(s, host);
	assert_int_equal(SSL_set1_host(s, host), 1);
	assert_int_equal(SSL_connect(s), 1);
	assert_int_equal(SSL_get_verify_result(s), X509_V_OK);
	*ctxp = ctx;
	return s;
}

/* Decodes a chunked body in place (buf holds head and body, NUL-terminated); returns the new
 * length, or -1 when the framing is bad or incomplete. */
static long dechunk(char *buf, size_t len)
{
	char *body = strstr(buf, "\r\n\r\n"), *in, *out, *end = buf + len;
	unsigned long n;

	if (!body)
		return -1;
	in = out = body + 4;
	for (;;) {
		char *e;

		n = strtoul(in, &e, 16);
		if (e == in || e + 2 > end || memcmp(e, "\r\n", 2))
			return -1;
		in = e + 2;
		if (n == 0)
			break;
		if ((size_t)(end - in) < n + 2 || memcmp(in + n, "\r\n", 2))
			return -1;
		memmove(out, in, n);
		out += n;
		in += n + 2;
	}
	if (end - in != 2 || memcmp(in, "\r\n", 2))
		return -1;
	*out = '\0';
	return out - buf;
}

/* Reads one response into buf (cap bytes), a chunked body decoded. Returns its length. */
static long guest_read_response(SSL *s, char *buf, size_t cap)
{
	size_t len = 0, need = 0;
	char *end, *p;
	int n, chunked = 0;

	for (;;) {
		buf[len] = '\0';
		end = strstr(buf, "\r\n\r\n");
		if (end) {
			*end = '\0';
			chunked = strcasestr(buf, "\r\nTransfer-Encoding: chunked") != NULL;
			p = strcasestr(buf, "\r\nContent-Length: ");
			*end = '\r';
			need = (size_t)(end + 4 - buf) +
			       (p && !chunked ? strtoul(p + 18, NULL, 10) : 0);
			if (chunked && len >= 5 && !memcmp(buf + len - 5, "0\r\n\r\n", 5)) {
				/* Maybe the end: decode a copy, keep reading if it was not. */
				char *copy = malloc(len + 1);
				long dl;

				assert_non_null(copy);
				memcpy(copy, buf, len + 1);
				dl = dechunk(copy, len);
				if (dl >= 0)
					memcpy(buf, copy, (size_t)dl + 1);
				free(copy);
				if (dl >= 0)
					return dl;
			}
			if (!chunked && len >= need)
				return (long)len;
		}
		n = SSL_read(s, buf + len, (int)(cap - 1 - len));
		if (n <= 0)
			return chunked ? -1 : (long)len;
		len += (size_t)n;
	}
}

static void test_tunnel_injects_and_scrubs(void **state)
{
	struct fixture *fx = *state;
	struct mitm_run m;
	SSL_CTX *ctx;
	SSL *s;
	char resp[8192];
	const char *req1 = "GET /v1/user?x=1 HTTP/1.1\r\nHost: api.test\r\n"
			   "Authorization: Bearer cove-credential:gh\r\nAccept: */*\r\n\r\n";
	const char *req2 = "POST /v1/echo HTTP/1.1\r\nHost: api.test\r\n"
			   "Content-Type: text/plain\r\nContent-Length: 11\r\n"
			   "Connection: close\r\n\r\nhello world";
	int fd = start_mitm(fx, &m, "api.test", fx->up_pem_path, 0);

	s = guest_connect(fx, fd, "api.test", &ctx);
	assert_int_equal(ssl_write_str(s, req1), 0);
	assert_true(guest_read_response(s, resp, sizeof(resp)) > 0);
	/* The upstream saw the real secret, in the Authorization header only. */
	assert_non_null(strstr(fx->us.got, "\r\nAuthorization: Bearer " SECRET "\r\n"));
	assert_null(strstr(fx->us.got, "cove-credential"));
	assert_non_null(strstr(fx->us.got, "GET /v1/user?x=1 HTTP/1.1\r\nHost: api.test\r\n"));
	/* The guest got the answer with the secret scrubbed from header and chunked body. */
	assert_true(!strncmp(resp, "HTTP/1.1 200 OK\r\n", 17));
	assert_null(strstr(resp, SECRET));
	assert_non_null(strstr(resp, "\r\nX-Echo: Bearer [REDACTED]\r\n"));
	assert_non_null(strstr(resp, "you sent: Bearer [REDACTED]; and again Bearer [REDACTED]\n"));
	assert_non_null(strstr(resp, "\r\nTransfer-Encoding: chunked\r\n"));
	/* The same tunnel carries a second request, with a body. */
	assert_int_equal(ssl_write_str(s, req2), 0);
	assert_true(guest_read_response(s, resp, sizeof(resp)) > 0);
	assert_true(!strncmp(resp, "HTTP/1.1 201 Created\r\n", 22));
	assert_non_null(strstr(resp, "\r\n\r\nhello world"));
	assert_non_null(strstr(resp, "\r\nConnection: close\r\n"));
	assert_non_null(strstr(fx->us.got, "\r\n\r\nhello world"));
	SSL_free(s);
	SSL_CTX_free(ctx);
	close(fd);
	finish_mitm(&m);
	assert_int_equal(m.rc, 0);
	assert_int_equal(m.decided, 2);
	assert_int_equal(fx->us.handshakes, 2);
}

/* Runs one GET through a tunnel expected to fail; returns the guest's response. */
static void fail_one(struct fixture *fx, struct mitm_run *m, const char *host, const char *ca_file,
		     const char *req, char *resp, size_t cap)
{
	SSL_CTX *ctx;
	SSL *s;
	int fd = start_mitm(fx, m, host, ca_file, 0);

	s = guest_connect(fx, fd, host, &ctx);
	/* The tunnel may answer and close before an oversized head is fully written. */
	(void)ssl_write_str(s, req);
	assert_true(guest_read_response(s, resp, cap) > 0);
	SSL_free(s);
	SSL_CTX_free(ctx);
	close(fd);
	finish_mitm(m);
	assert_int_not_equal(m->rc, 0);
	assert_null(strstr(resp, SECRET));
	assert_null(strstr(m->err, SECRET));
}

static void test_chunked_upload_and_timeout(void **state)
{
	struct fixture *fx = *state;
	struct mitm_run m;
	SSL_CTX *ctx;
	SSL *s;
	char resp[4096];
	/* 2: no denial, a 700 ms timeout */
	int fd = start_mitm(fx, &m, "api.test", fx->up_pem_path, 2);

	s = guest_connect(fx, fd, "api.test", &ctx);
	/* Chunked upload: re-framed chunk by chunk (extensions and trailers dropped). */
	assert_int_equal(ssl_write_str(s, "POST /up HTTP/1.1\r\nHost: api.test\r\n"
					  "Transfer-Encoding: chunked\r\n\r\n"
					  "3;ext=1\r\nhel\r\n"),
			 0);
	assert_int_equal(ssl_write_str(s, "2\r\nlo\r\n0\r\nX-Trailer: t\r\n\r\n"), 0);
	assert_true(guest_read_response(s, resp, sizeof(resp)) > 0);
	assert_true(!strncmp(resp, "HTTP/1.1 201 ", 13));
	assert_non_null(strstr(fx->us.got, "\r\nTransfer-Encoding: chunked\r\n"));
	assert_null(strstr(fx->us.got, "ext=1"));
	assert_null(strstr(fx->us.got, "X-Trailer"));
	assert_non_null(strstr(resp, "hel"));
	assert_non_null(strstr(resp, "lo\r\n0\r\n\r\n"));
	/* Then a guest that stops mid-head: the tunnel gives up after its timeout. */
	assert_int_equal(ssl_write_str(s, "GET / HT"), 0);
	finish_mitm(&m);
	assert_int_equal(m.rc, -ETIMEDOUT);
	SSL_free(s);
	SSL_CTX_free(ctx);
	close(fd);
}

static void test_head_and_encoded(void **state)
{
	struct fixture *fx = *state;
	struct mitm_run m;
	SSL_CTX *ctx;
	SSL *s;
	char resp[4096];
	int fd = start_mitm(fx, &m, "api.test", fx->up_pem_path, 0), n;

	/* HEAD: the upstream's Content-Length kept, no body waited for, the echo scrubbed. */
	s = guest_connect(fx, fd, "api.test", &ctx);
	assert_int_equal(ssl_write_str(s, "HEAD /h HTTP/1.1\r\nHost: api.test\r\n"
					  "Authorization: Bearer cove-credential:gh\r\n"
					  "Connection: close\r\n\r\n"),
			 0);
	n = 0;
	for (int k; (k = SSL_read(s, resp + n, (int)sizeof(resp) - 1 - n)) > 0;)
		n += k;
	resp[n] = '\0';
	assert_true(!strncmp(resp, "HTTP/1.1 200 OK\r\n", 17));
	assert_non_null(strstr(resp, "\r\nContent-Length: 1234\r\n"));
	assert_non_null(strstr(resp, "\r\nX-Echo: Bearer [REDACTED]\r\n"));
	assert_non_null(strstr(resp, "\r\n\r\n"));
	assert_int_equal(strlen(strstr(resp, "\r\n\r\n")), 4);
	assert_null(strstr(resp, SECRET));
	SSL_free(s);
	SSL_CTX_free(ctx);
	close(fd);
	finish_mitm(&m);
	assert_int_equal(m.rc, 0);

	/* A compressed body could hide the secret from the scrubber: 502. */
	fail_one(fx, &m, "api.test", fx->up_pem_path,
		 "GET /gzip HTTP/1.1\r\nHost: api.test\r\n\r\n", resp, sizeof(resp));
	assert_true(!strncmp(resp, "HTTP/1.1 502 ", 13));
	assert_one_line_error(m.err, "encoded body");
	assert_null(strstr(resp, "abc"));
}

static void test_big_body_streamed(void **state)
{
	struct fixture *fx = *state;
	struct mitm_run m;
	SSL_CTX *ctx;
	SSL *s;
	char *resp = malloc(BIG_MAX + 4096), *want = malloc(BIG_MAX + 4096), *body, *in, *out;
	size_t wl;
	long n;
	int fd;

	assert_non_null(resp);
	assert_non_null(want);
	/* The expected body: big_body with every secret replaced. */
	wl = big_body(resp);
	resp[wl] = '\0';
	for (in = resp, out = want; (body = strstr(in, SECRET)); in = body + strlen(SECRET)) {
		memcpy(out, in, (size_t)(body - in));
		out += body - in;
		memcpy(out, "[REDACTED]", 10);
		out += 10;
	}
	strcpy(out, in);

	/* Started only now: the tunnel's 5 s timeout runs from here (slow under ASan). */
	fd = start_mitm(fx, &m, "api.test", fx->up_pem_path, 0);
	s = guest_connect(fx, fd, "api.test", &ctx);
	assert_int_equal(ssl_write_str(s, "GET /big HTTP/1.1\r\nHost: api.test\r\n\r\n"), 0);
	n = guest_read_response(s, resp, BIG_MAX + 4096);
	assert_true(n > 0);
	body = strstr(resp, "\r\n\r\n") + 4;
	assert_int_equal(strlen(body), strlen(want));
	assert_true(!strcmp(body, want));
	assert_null(strstr(resp, SECRET));

	/* A body with no place to cut: the tunnel closes after the head. */
	assert_int_equal(ssl_write_str(s, "GET /run HTTP/1.1\r\nHost: api.test\r\n\r\n"), 0);
	n = guest_read_response(s, resp, BIG_MAX + 4096);
	assert_true(n < 0);
	SSL_free(s);
	SSL_CTX_free(ctx);
	close(fd);
	finish_mitm(&m);
	assert_int_equal(m.rc, -EFBIG);
	assert_one_line_error(m.err, "no place to cut");
	free(resp);
	free(want);
}

static void test_untrusted_upstream(void **state)
{
	struct fixture *fx = *state;
	struct mitm_run m;
	char resp[4096];
	const char *req = "GET / HTTP/1.1\r\nHost: api.test\r\n"
			  "Authorization: Bearer cove-credential:gh\r\n\r\n";

	/* The upstream's chain does not lead to the CA bundle given (the system's would not
	 * know the test CA either; the sandbox CA file is used to keep the test hermetic). */
	fail_one(fx, &m, "api.test", fx->ca_pem_path, req, resp, sizeof(resp));
	assert_true(!strncmp(resp, "HTTP/1.1 502 ", 13));
	assert_int_equal(m.rc, -EPROTO);
	assert_one_line_error(m.err, "certificate not trusted");
	assert_int_equal(fx->us.handshakes, 0);
	assert_int_equal(fx->us.got_len, 0); /* not one byte of the request, let alone the secret */
}

static void test_upstream_name_mismatch(void **state)
{
	struct fixture *fx = *state;
	struct mitm_run m;
	char resp[4096];
	const char *req = "GET / HTTP/1.1\r\nHost: x.example.net\r\n\r\n";

	/* The policy allows x.example.net, the CA is trusted, but the certificate names api.test.
	 */
	fail_one(fx, &m, "x.example.net", fx->up_pem_path, req, resp, sizeof(resp));
	assert_true(!strncmp(resp, "HTTP/1.1 502 ", 13));
	assert_one_line_error(m.err, "certificate not trusted");
	assert_int_equal(fx->us.got_len, 0);
}

static void test_injection_refused(void **state)
{
	struct fixture *fx = *state;
	struct mitm_run m;
	char resp[4096];
	const char *evil = "GET / HTTP/1.1\r\nHost: evil.test\r\n"
			   "Authorization: Bearer cove-credential:gh\r\n\r\n";
	const char *in_url = "GET /?t=cove-credential:gh HTTP/1.1\r\nHost: api.test\r\n\r\n";
	const char *wrong_host = "GET / HTTP/1.1\r\nHost: api.test\r\n\r\n";

	/* A host the policy does not name: 403, and nobody upstream is even called. */
	fail_one(fx, &m, "evil.test", fx->up_pem_path, evil, resp, sizeof(resp));
	assert_true(!strncmp(resp, "HTTP/1.1 403 ", 13));
	assert_non_null(strstr(resp, "not for host evil.test"));
	assert_int_equal(m.rc, -EACCES);
	fail_one(fx, &m, "api.test", fx->up_pem_path, in_url, resp, sizeof(resp));
	assert_true(!strncmp(resp, "HTTP/1.1 403 ", 13));
	/* A Host header other than the tunnel's. */
	fail_one(fx, &m, "x.example.net", fx->up_pem_path, wrong_host, resp, sizeof(resp));
	assert_true(!strncmp(resp, "HTTP/1.1 403 ", 13));
	assert_int_equal(fx->us.conns, 0);
}

static void test_denied_and_malformed(void **state)
{
	struct fixture *fx = *state;
	struct mitm_run m;
	SSL_CTX *ctx;
	SSL *s;
	char resp[4096], big[MITM_HEAD_MAX + 64];
	int fd;

	/* The decision callback says no: 403 with its reason. */
	fd = start_mitm(fx, &m, "api.test", fx->up_pem_path, 1);
	s = guest_connect(fx, fd, "api.test", &ctx);
	assert_int_equal(ssl_write_str(s, "GET / HTTP/1.1\r\nHost: api.test\r\n\r\n"), 0);
	assert_true(guest_read_response(s, resp, sizeof(resp)) > 0);
	assert_true(!strncmp(resp, "HTTP/1.1 403 ", 13));
	assert_non_null(strstr(resp, "denied by policy"));
	SSL_free(s);
	SSL_CTX_free(ctx);
	close(fd);
	finish_mitm(&m);
	assert_int_equal(m.rc, -EACCES);

	/* Garbage, a smuggling attempt, an oversized head: 400/431, nothing upstream. */
	fail_one(fx, &m, "api.test", fx->up_pem_path, "NOT HTTP AT ALL\r\n\r\n", resp,
		 sizeof(resp));
	assert_true(!strncmp(resp, "HTTP/1.1 400 ", 13));
	fail_one(fx, &m, "api.test", fx->up_pem_path,
		 "POST / HTTP/1.1\r\nHost: api.test\r\nContent-Length: 5\r\n"
		 "Transfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
		 resp, sizeof(resp));
	assert_true(!strncmp(resp, "HTTP/1.1 400 ", 13));
	memset(big, 'a', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	memcpy(big, "GET / HTTP/1.1\r\nX: ", 19);
	fail_one(fx, &m, "api.test", fx->up_pem_path, big, resp, sizeof(resp));
	assert_true(!strncmp(resp, "HTTP/1.1 431 ", 13));
	assert_int_equal(fx->us.conns, 0);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_ca_create_load),
	    cmocka_unit_test(test_leaf),
	    cmocka_unit_test_setup_teardown(test_tunnel_injects_and_scrubs, loop_setup,
					    loop_teardown),
	    cmocka_unit_test_setup_teardown(test_chunked_upload_and_timeout, loop_setup,
					    loop_teardown),
	    cmocka_unit_test_setup_teardown(test_head_and_encoded, loop_setup, loop_teardown),
	    cmocka_unit_test_setup_teardown(test_big_body_streamed, loop_setup, loop_teardown),
	    cmocka_unit_test_setup_teardown(test_untrusted_upstream, loop_setup, loop_teardown),
	    cmocka_unit_test_setup_teardown(test_upstream_name_mismatch, loop_setup, loop_teardown),
	    cmocka_unit_test_setup_teardown(test_injection_refused, loop_setup, loop_teardown),
	    cmocka_unit_test_setup_teardown(test_denied_and_malformed, loop_setup, loop_teardown),
	};

	/* The test's own guest and upstream write to sockets their peer may have closed. */
	signal(SIGPIPE, SIG_IGN);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
