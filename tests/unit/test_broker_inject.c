/* cove-broker's egress proxy with interception wired in (issue 16), over real sockets, real
 * OpenSSL and a real credential helper process: the egress server on a temp Unix socket, a
 * TLS upstream on 127.0.0.1 whose certificate comes from a separate test CA (the credential's
 * ca_file), and a guest that trusts only the sandbox CA. Injection and scrubbing end to end,
 * refusals (path, method, header: 403 and no helper run), a host no credential names tunnelled
 * untouched or refused, and the audit log's chain and records. */
#include "helpers.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/ssl.h>
#include <openssl/x509v3.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include "audit.h"
#include "broker.h"
#include "common/dirfd_io.h"
#include "egress.h"
#include "loop.h"
#include "mitm_ca.h"
#include "policy.h"

#define SECRET "ghp_InjectedT0kenValue77"

/* ---- the TLS upstream: answers with the Authorization header it saw, in a header and the
 * body ---- */

struct upstream {
	int lfd, port;
	SSL_CTX *ctx;
	volatile int stop;
	int handshakes;
	char got[16384];
	size_t got_len;
	pthread_t th;
};

static int up_read_head(SSL *s, struct upstream *u, size_t *at)
{
	int n;

	*at = u->got_len;
	for (;;) {
		u->got[u->got_len] = '\0';
		if (strstr(u->got + *at, "\r\n\r\n"))
			return 0;
		n = SSL_read(s, u->got + u->got_len, (int)(sizeof(u->got) - 1 - u->got_len));
		if (n <= 0)
			return -1;
		u->got_len += (size_t)n;
	}
}

static void up_answer(SSL *s, const char *req)
{
	char auth[512] = "", body[600], head[1400];
	const char *a = strcasestr(req, "\r\nAuthorization: ");

	if (a) {
		a += 17;
		snprintf(auth, sizeof(auth), "%.*s", (int)strcspn(a, "\r"), a);
	}
	snprintf(body, sizeof(body), "you sent: %s\n", auth);
	snprintf(head, sizeof(head),
		 "HTTP/1.1 200 OK\r\nContent-Length: %zu\r\nX-Echo: %s\r\n\r\n%s", strlen(body),
		 auth, body);
	SSL_write(s, head, (int)strlen(head));
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
		s = SSL_new(u->ctx);
		SSL_set_fd(s, fd);
		if (SSL_accept(s) == 1) {
			u->handshakes++;
			if (up_read_head(s, u, &at) == 0)
				up_answer(s, u->got + at);
			SSL_shutdown(s);
		}
		ERR_clear_error();
		SSL_free(s);
		close(fd);
	}
	return NULL;
}

/* ---- the broker side ---- */

struct fx {
	char dir[64], cadir[96], sock[96], audit[96], helper[96], ran[96], up_pem[96],
	    sbx_pem[96];
	uint8_t key[AUDIT_KEY_LEN];
	struct broker b;
	struct mitm_ca ca, upca;
	struct upstream up;
	struct egress_server *srv;
	struct logger log;
	int lfd;
};

static void write_pem(const char *path, X509 *cert)
{
	FILE *f = fopen(path, "w");

	assert_non_null(f);
	assert_int_equal(PEM_write_X509(f, cert), 1);
	fclose(f);
}

static void write_file(const char *path, const char *text, mode_t mode)
{
	FILE *f = fopen(path, "w");

	assert_non_null(f);
	assert_int_equal(fputs(text, f) >= 0, 1);
	fclose(f);
	assert_int_equal(chmod(path, mode), 0);
}

/* The policy: credential "gh" for 127.0.0.1:PORT (GET under /v1/, its test CA, private
 * addresses allowed), an egress rule that lets CONNECT reach localhost:PORT (no credential
 * names that host). */
static const char policy_fmt[] =
    "{\"credentials\":{\"gh\":{\"helper\":[\"/bin/sh\",\"%s\"],"
    "\"inject\":{\"header\":\"Authorization\",\"template\":\"Bearer {password}\"},"
    "\"allow\":{\"hosts\":[\"127.0.0.1\"],\"ports\":[%d],\"path_prefixes\":[\"/v1/\"],"
    "\"methods\":[\"GET\"]},\"allow_private\":true,\"ca_file\":\"%s\"}},"
    "\"egress\":{\"rules\":[{\"host\":\"localhost\",\"ports\":[%d],\"methods\":[\"CONNECT\"],"
    "\"allow_private\":true}]}}";

static void fx_start(struct fx *f)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t sl = sizeof(sa);
	char doc[4096], err[256] = "", script[512];
	X509 *leaf;
	int dfd;

	memset(f, 0, sizeof(*f));
	strcpy(f->dir, "/tmp/cbi-XXXXXX");
	assert_non_null(mkdtemp(f->dir));
	snprintf(f->cadir, sizeof(f->cadir), "%s/mitm-ca", f->dir);
	snprintf(f->sock, sizeof(f->sock), "%s/vsock.sock_1026", f->dir);
	snprintf(f->audit, sizeof(f->audit), "%s/audit.jsonl", f->dir);
	snprintf(f->helper, sizeof(f->helper), "%s/helper.sh", f->dir);
	snprintf(f->ran, sizeof(f->ran), "%s/helper.ran", f->dir);
	snprintf(f->up_pem, sizeof(f->up_pem), "%s/upstream-ca.pem", f->dir);
	snprintf(f->sbx_pem, sizeof(f->sbx_pem), "%s/sandbox-ca.pem", f->dir);

	/* The sandbox CA as cove-broker opens it (--mitm-ca-dir), and the upstream's own CA. */
	dfd = dirfd_open_dir(f->cadir, true, err, sizeof(err));
	assert_true(dfd >= 0);
	assert_int_equal(mitm_ca_open(&f->ca, dfd, "inject-test", err, sizeof(err)), 0);
	close(dfd);
	dfd = dirfd_open_dir(f->dir, false, err, sizeof(err));
	assert_true(dfd >= 0);
	/* A second CA in another directory stands for a public CA. */
	{
		char updir[128];
		int ufd;

		snprintf(updir, sizeof(updir), "%s/upstream-ca", f->dir);
		ufd = dirfd_open_dir(updir, true, err, sizeof(err));
		assert_true(ufd >= 0);
		assert_int_equal(mitm_ca_open(&f->upca, ufd, "test-upstream", err, sizeof(err)), 0);
		close(ufd);
	}
	close(dfd);
	write_pem(f->up_pem, f->upca.cert);
	write_pem(f->sbx_pem, f->ca.cert);

	/* The helper: a real process that counts its runs and answers with the token. */
	snprintf(script, sizeof(script),
		 "cat >/dev/null\necho run >> '%s'\nprintf 'username=x-token\\npassword=%s\\n'\n",
		 f->ran, SECRET);
	write_file(f->helper, script, 0700);

	f->up.ctx = SSL_CTX_new(TLS_server_method());
	assert_int_equal(mitm_ca_leaf(&f->upca, "127.0.0.1", &leaf, err, sizeof(err)), 0);
	assert_int_equal(SSL_CTX_use_certificate(f->up.ctx, leaf), 1);
	assert_int_equal(SSL_CTX_use_PrivateKey(f->up.ctx, f->upca.leaf_key), 1);
	X509_free(leaf);
	f->up.lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_int_equal(bind(f->up.lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(listen(f->up.lfd, 16), 0);
	assert_int_equal(getsockname(f->up.lfd, (struct sockaddr *)&sa, &sl), 0);
	f->up.port = ntohs(sa.sin_port);
	assert_int_equal(pthread_create(&f->up.th, NULL, upstream_main, &f->up), 0);

	snprintf(doc, sizeof(doc), policy_fmt, f->helper, f->up.port, f->up_pem, f->up.port);
	if (policy_parse(doc, strlen(doc), &f->b.pol, err, sizeof(err)))
		fail_msg("policy: %s", err);
	f->b.helper_timeout_ms = 5000;
	f->b.have_token = true; /* as after cove's first grant */
	f->b.start_ns = broker_now_ns();
	f->b.mitm_ca = &f->ca;
	/* The broker's lines on stderr (shown when a test fails). */
	f->log = (struct logger){.level = LOG_DEBUG, .out = stderr, .name = "cove-broker"};
	f->b.log = &f->log;
	pthread_mutex_init(&f->b.lock, NULL);
	memset(f->key, 9, sizeof(f->key));
	f->b.audit.fd = -1;
	assert_int_equal(audit_open(&f->b.audit, f->audit, f->key, err, sizeof(err)), 0);
	f->lfd = loop_listen_unix(f->sock);
	assert_true(f->lfd >= 0);
	assert_int_equal(egress_start(&f->b, f->lfd, &f->srv), 0);
}

static char *slurp(const char *path)
{
	struct stat st;
	char *buf;
	FILE *fp;

	if (stat(path, &st))
		return calloc(1, 1);
	buf = calloc(1, (size_t)st.st_size + 1);
	fp = fopen(path, "r");
	assert_non_null(fp);
	assert_int_equal(fread(buf, 1, (size_t)st.st_size, fp), (size_t)st.st_size);
	fclose(fp);
	return buf;
}

/* Stops everything; checks the audit chain and MACs; returns the log and the helper's runs. */
static void fx_stop(struct fx *f, char **log, int *runs)
{
	char why[256] = "", cmd[128], *ran;
	size_t nrec = 0;
	long bad;

	egress_stop(f->srv);
	close(f->lfd);
	audit_close(&f->b.audit);
	policy_free(&f->b.pol);
	pthread_mutex_destroy(&f->b.lock);
	f->up.stop = 1;
	pthread_join(f->up.th, NULL);
	close(f->up.lfd);
	SSL_CTX_free(f->up.ctx);
	mitm_ca_free(&f->ca);
	mitm_ca_free(&f->upca);
	bad = audit_verify_file(f->audit, f->key, &nrec, why, sizeof(why));
	if (bad)
		fail_msg("audit line %ld: %s", bad, why);
	*log = slurp(f->audit);
	ran = slurp(f->ran);
	*runs = 0;
	for (char *p = ran; (p = strstr(p, "run\n")); p += 4)
		(*runs)++;
	free(ran);
	snprintf(cmd, sizeof(cmd), "rm -rf '%s'", f->dir);
	assert_int_equal(system(cmd), 0);
}

static int guest_connect(const struct fx *f)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	struct timeval tv = {.tv_sec = 20};
	int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);

	assert_true(fd >= 0);
	strcpy(sa.sun_path, f->sock);
	assert_int_equal(connect(fd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	return fd;
}

/* Sends CONNECT host:port and reads the proxy's answer head (and body, for refusals) into
 * buf. Returns the status. */
static int guest_connect_req(int fd, const char *host, int port, char *buf, size_t cap)
{
	char req[256];
	size_t len = 0;
	ssize_t n;

	snprintf(req, sizeof(req), "CONNECT %s:%d HTTP/1.1\r\nHost: %s:%d\r\n\r\n", host, port,
		 host, port);
	assert_int_equal(send(fd, req, strlen(req), MSG_NOSIGNAL), (ssize_t)strlen(req));
	/* One byte at a time up to the head's end: nothing of the TLS that follows is taken. */
	while (len < cap - 1) {
		n = recv(fd, buf + len, 1, 0);
		if (n <= 0)
			break;
		len += (size_t)n;
		buf[len] = '\0';
		if (len >= 4 && !memcmp(buf + len - 4, "\r\n\r\n", 4))
			break;
	}
	buf[len] = '\0';
	assert_true(!strncmp(buf, "HTTP/1.1 ", 9));
	if (atoi(buf + 9) != 200) {
		n = recv(fd, buf + len, cap - 1 - len, 0);
		if (n > 0)
			buf[len + (size_t)n] = '\0';
	}
	return atoi(buf + 9);
}

/* TLS over the tunnel trusting only ca_pem; ip: check the certificate names that address
 * (NULL: chain only). */
static SSL *guest_tls(int fd, const char *ca_pem, const char *ip, SSL_CTX **ctxp)
{
	SSL_CTX *ctx = SSL_CTX_new(TLS_client_method());
	SSL *s;

	assert_non_null(ctx);
	assert_int_equal(SSL_CTX_load_verify_locations(ctx, ca_pem, NULL), 1);
	SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
	s = SSL_new(ctx);
	SSL_set_fd(s, fd);
	if (ip)
		assert_int_equal(X509_VERIFY_PARAM_set1_ip_asc(SSL_get0_param(s), ip), 1);
	assert_int_equal(SSL_connect(s), 1);
	assert_int_equal(SSL_get_verify_result(s), X509_V_OK);
	*ctxp = ctx;
	return s;
}

/* Reads one response: the head, then a Content-Length or chunked body (decoded). */
static long guest_read(SSL *s, char *buf, size_t cap)
{
	size_t len = 0;
	int n;

	for (;;) {
		char *end;

		buf[len] = '\0';
		end = strstr(buf, "\r\n\r\n");
		if (end) {
			const char *cl = strcasestr(buf, "\r\nContent-Length: ");

			if (strcasestr(buf, "\r\nTransfer-Encoding: chunked") &&
			    len >= 5 && !memcmp(buf + len - 5, "0\r\n\r\n", 5)) {
				/* Decode in place. */
				char *in = end + 4, *out = end + 4;

				for (;;) {
					char *e;
					unsigned long k = strtoul(in, &e, 16);

					assert_true(e != in && !memcmp(e, "\r\n", 2));
					in = e + 2;
					if (!k)
						break;
					memmove(out, in, k);
					out += k;
					in += k + 2;
				}
				*out = '\0';
				return out - buf;
			}
			if (cl && cl < end && len >= (size_t)(end + 4 - buf) + strtoul(cl + 18, NULL, 10))
				return (long)len;
		}
		if (len >= cap - 1)
			return -1;
		n = SSL_read(s, buf + len, (int)(cap - 1 - len));
		if (n <= 0 && SSL_get_error(s, n) == SSL_ERROR_WANT_READ && errno == EINTR)
			continue; /* seen: EINTR here while the broker ran its helper */
		if (n <= 0) {
			if (!len)
				fprintf(stderr, "guest: SSL_read: %d %d errno %d\n", n,
					SSL_get_error(s, n), errno);
			return (long)len;
		}
		len += (size_t)n;
	}
}

static int count(const char *hay, const char *needle)
{
	int n = 0;

	for (const char *p = hay; (p = strstr(p, needle)); p += strlen(needle))
		n++;
	return n;
}

static void ssl_send(SSL *s, const char *t)
{
	assert_int_equal(SSL_write(s, t, (int)strlen(t)), (int)strlen(t));
}

static void test_inject_and_scrub(void **state)
{
	struct fx f;
	char buf[8192], hosthdr[64], req[512], *log;
	SSL_CTX *ctx;
	SSL *s;
	int fd, runs;

	(void)state;
	fx_start(&f);
	fd = guest_connect(&f);
	assert_int_equal(guest_connect_req(fd, "127.0.0.1", f.up.port, buf, sizeof(buf)), 200);
	s = guest_tls(fd, f.sbx_pem, "127.0.0.1", &ctx);
	snprintf(hosthdr, sizeof(hosthdr), "127.0.0.1:%d", f.up.port);
	/* A program that insists on a token gets the placeholder; the broker fills it. */
	snprintf(req, sizeof(req),
		 "GET /v1/user HTTP/1.1\r\nHost: %s\r\nAuthorization: Bearer cove-credential:gh\r\n"
		 "Accept: */*\r\nUser-Agent: test\r\n\r\n",
		 hosthdr);
	ssl_send(s, req);
	assert_true(guest_read(s, buf, sizeof(buf)) > 0);
	assert_true(!strncmp(buf, "HTTP/1.1 200 OK\r\n", 17));
	assert_null(strstr(buf, SECRET));
	assert_non_null(strstr(buf, "X-Echo: Bearer [REDACTED]\r\n"));
	assert_non_null(strstr(buf, "you sent: Bearer [REDACTED]\n"));
	assert_non_null(strstr(f.up.got, "\r\nAuthorization: Bearer " SECRET "\r\n"));
	assert_null(strstr(f.up.got, "cove-credential"));
	/* No header at all: the policy's template injects it. */
	snprintf(req, sizeof(req),
		 "GET /v1/repos?page=2 HTTP/1.1\r\nHost: %s\r\nConnection: close\r\n\r\n", hosthdr);
	ssl_send(s, req);
	assert_true(guest_read(s, buf, sizeof(buf)) > 0);
	assert_true(!strncmp(buf, "HTTP/1.1 200 OK\r\n", 17));
	assert_null(strstr(buf, SECRET));
	assert_non_null(strstr(buf, "you sent: Bearer [REDACTED]\n"));
	assert_int_equal(count(f.up.got, "\r\nAuthorization: Bearer " SECRET "\r\n"), 2);
	assert_non_null(strstr(f.up.got, "GET /v1/repos?page=2 HTTP/1.1\r\n"));
	SSL_free(s);
	SSL_CTX_free(ctx);
	close(fd);
	fx_stop(&f, &log, &runs);
	assert_int_equal(runs, 2);
	assert_null(strstr(log, SECRET));
	assert_int_equal(count(log, "\"kind\":\"egress-inject\""), 2);
	assert_int_equal(count(log, "\"credential\":\"gh\",\"decision\":\"allow\","
				    "\"reason\":\"credential injected\",\"status\":200"),
			 2);
	assert_non_null(strstr(log, "\"method\":\"GET\",\"path\":\"/v1/user\""));
	assert_non_null(strstr(log, "\"path\":\"/v1/repos?page=2\""));
	/* And the CONNECT itself, as an egress record. */
	assert_non_null(strstr(log, "\"kind\":\"egress\",\"method\":\"CONNECT\""));
	assert_non_null(strstr(log, "intercepted (credential gh)"));
	free(log);
}

/* One request through a fresh intercepted tunnel; returns the guest's answer. */
static void one_request(struct fx *f, const char *fmt, char *buf, size_t cap)
{
	char req[512], hosthdr[64];
	SSL_CTX *ctx;
	SSL *s;
	int fd = guest_connect(f);

	assert_int_equal(guest_connect_req(fd, "127.0.0.1", f->up.port, buf, cap), 200);
	s = guest_tls(fd, f->sbx_pem, "127.0.0.1", &ctx);
	snprintf(hosthdr, sizeof(hosthdr), "127.0.0.1:%d", f->up.port);
	snprintf(req, sizeof(req), fmt, hosthdr);
	ssl_send(s, req);
	assert_true(guest_read(s, buf, cap) > 0);
	SSL_free(s);
	SSL_CTX_free(ctx);
	close(fd);
}

static void test_denied_no_helper(void **state)
{
	struct fx f;
	char buf[8192], *log;
	int runs;

	(void)state;
	fx_start(&f);
	one_request(&f, "GET /admin HTTP/1.1\r\nHost: %s\r\n\r\n", buf, sizeof(buf));
	assert_true(!strncmp(buf, "HTTP/1.1 403 ", 13));
	assert_non_null(strstr(buf, "path not allowed"));
	one_request(&f, "DELETE /v1/user HTTP/1.1\r\nHost: %s\r\n\r\n", buf, sizeof(buf));
	assert_true(!strncmp(buf, "HTTP/1.1 403 ", 13));
	assert_non_null(strstr(buf, "method not allowed"));
	/* Dot segments: checked as "/v1/x" but sent as they are, a server could read them
	 * otherwise: refused. */
	one_request(&f, "GET /admin/../v1/x HTTP/1.1\r\nHost: %s\r\n\r\n", buf, sizeof(buf));
	assert_true(!strncmp(buf, "HTTP/1.1 403 ", 13));
	assert_non_null(strstr(buf, "not in normal form"));
	one_request(&f, "GET /v1/user HTTP/1.1\r\nHost: %s\r\nX-Sneaky: 1\r\n\r\n", buf,
		    sizeof(buf));
	assert_true(!strncmp(buf, "HTTP/1.1 403 ", 13));
	assert_non_null(strstr(buf, "header X-Sneaky not allowed"));
	fx_stop(&f, &log, &runs);
	assert_int_equal(runs, 0);
	assert_int_equal(f.up.handshakes, 0);
	assert_int_equal(count(log, "\"kind\":\"egress-inject\""), 4);
	assert_int_equal(count(log, "\"decision\":\"deny\""), 4);
	assert_non_null(strstr(log, "\"path\":\"/admin\",\"credential\":null,\"decision\":\"deny\","
				    "\"reason\":\"path not allowed\",\"status\":403"));
	free(log);
}

static void test_other_hosts(void **state)
{
	struct fx f;
	char buf[8192], req[256], *log;
	SSL_CTX *ctx;
	SSL *s;
	int fd, runs;

	(void)state;
	fx_start(&f);
	/* No credential names localhost; an egress rule allows it: a blind tunnel, the guest sees
	 * the upstream's own certificate (it verifies against the upstream's CA only) and the
	 * upstream sees the guest's bytes untouched (the placeholder not replaced). */
	fd = guest_connect(&f);
	assert_int_equal(guest_connect_req(fd, "localhost", f.up.port, buf, sizeof(buf)), 200);
	s = guest_tls(fd, f.up_pem, NULL, &ctx);
	snprintf(req, sizeof(req),
		 "GET /v1/user HTTP/1.1\r\nHost: localhost\r\n"
		 "Authorization: Bearer cove-credential:gh\r\n\r\n");
	ssl_send(s, req);
	assert_true(guest_read(s, buf, sizeof(buf)) > 0);
	assert_non_null(strstr(buf, "you sent: Bearer cove-credential:gh\n"));
	assert_non_null(strstr(f.up.got, "\r\nAuthorization: Bearer cove-credential:gh\r\n"));
	SSL_free(s);
	SSL_CTX_free(ctx);
	close(fd);
	/* Neither a credential nor a rule names it: refused. */
	fd = guest_connect(&f);
	assert_int_equal(guest_connect_req(fd, "example.invalid", 443, buf, sizeof(buf)), 403);
	assert_non_null(strstr(buf, "no egress rule allows example.invalid:443"));
	close(fd);
	fx_stop(&f, &log, &runs);
	assert_int_equal(runs, 0);
	assert_null(strstr(log, SECRET));
	assert_int_equal(count(log, "\"kind\":\"egress-inject\""), 0);
	assert_int_equal(count(log, "\"kind\":\"egress\""), 2);
	free(log);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_inject_and_scrub),
	    cmocka_unit_test(test_denied_no_helper),
	    cmocka_unit_test(test_other_hosts),
	};

	signal(SIGPIPE, SIG_IGN);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
