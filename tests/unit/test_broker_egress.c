/* cove-broker's egress proxy over real sockets: the server on a temp Unix socket, a real
 * upstream (a small TCP server thread on 127.0.0.1), policies that allow 127.0.0.1 through
 * allow_private. Tunnels, absolute-form GETs, refusals (policy, private addresses, bad heads,
 * limits), the audit lines and their chain; plus the head parser, rule matching and policy
 * errors on their own. */
#include "helpers.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>

#include "audit.h"
#include "broker.h"
#include "dest.h"
#include "egress.h"
#include "egress_head.h"
#include "egress_policy.h"
#include "loop.h"
#include "policy.h"

/* ---- upstream: echo (tunnels) or a tiny HTTP server that answers with the request head ---- */

struct upstream {
	int lfd, port;
	pthread_t t;
	volatile int stop;
};

static void upstream_serve(int fd)
{
	char buf[65536];
	size_t len = 0;
	ssize_t n;

	/* A head that starts with "GET " or "HEAD" is HTTP: answer it. Anything else: echo. */
	for (;;) {
		n = recv(fd, buf + len, sizeof(buf) - 1 - len, 0);
		if (n <= 0)
			return;
		len += (size_t)n;
		if (len >= 4 && memcmp(buf, "GET ", 4) && memcmp(buf, "HEAD", 4))
			break;
		buf[len] = '\0';
		if (strstr(buf, "\r\n\r\n")) {
			char hdr[128];
			int hl = snprintf(hdr, sizeof(hdr),
					  "HTTP/1.1 200 OK\r\nContent-Length: %zu\r\n\r\n", len);

			assert_int_equal(send(fd, hdr, (size_t)hl, MSG_NOSIGNAL), hl);
			assert_int_equal(send(fd, buf, len, MSG_NOSIGNAL), (ssize_t)len);
			return;
		}
		if (len >= sizeof(buf) - 1)
			return;
	}
	/* Echo until the client's end, then end ours (half-close both ways). */
	for (;;) {
		size_t off = 0;

		while (off < len) {
			n = send(fd, buf + off, len - off, MSG_NOSIGNAL);
			if (n <= 0)
				return;
			off += (size_t)n;
		}
		n = recv(fd, buf, sizeof(buf), 0);
		if (n <= 0)
			return;
		len = (size_t)n;
	}
}

static void *upstream_main(void *arg)
{
	struct upstream *u = arg;

	while (!u->stop) {
		struct pollfd p = {.fd = u->lfd, .events = POLLIN};
		int fd;

		if (poll(&p, 1, 100) <= 0)
			continue;
		fd = accept(u->lfd, NULL, NULL);
		if (fd < 0)
			continue;
		upstream_serve(fd);
		close(fd);
	}
	return NULL;
}

static void upstream_start(struct upstream *u)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t sl = sizeof(sa);

	u->stop = 0;
	u->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_true(u->lfd >= 0);
	assert_int_equal(bind(u->lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(listen(u->lfd, 16), 0);
	assert_int_equal(getsockname(u->lfd, (struct sockaddr *)&sa, &sl), 0);
	u->port = ntohs(sa.sin_port);
	assert_int_equal(pthread_create(&u->t, NULL, upstream_main, u), 0);
}

static void upstream_stop(struct upstream *u)
{
	u->stop = 1;
	pthread_join(u->t, NULL);
	close(u->lfd);
}

/* ---- the broker side ---- */

struct fx {
	char dir[32], sock[64], audit[64];
	uint8_t key[AUDIT_KEY_LEN];
	struct broker b;
	struct upstream up;
	struct egress_server *srv;
	int lfd;
};

/* Starts the egress server with the policy made from fmt (its %d is the upstream port). */
static void fx_start(struct fx *f, const char *fmt)
{
	char doc[4096], err[256] = "";

	memset(f, 0, sizeof(*f));
	strcpy(f->dir, "/tmp/cbe-XXXXXX");
	assert_non_null(mkdtemp(f->dir));
	snprintf(f->sock, sizeof(f->sock), "%s/vsock.sock_1026", f->dir);
	snprintf(f->audit, sizeof(f->audit), "%s/audit.jsonl", f->dir);
	upstream_start(&f->up);
	snprintf(doc, sizeof(doc), fmt, f->up.port, f->up.port, f->up.port);
	if (policy_parse(doc, strlen(doc), &f->b.pol, err, sizeof(err)))
		fail_msg("policy: %s", err);
	memset(f->key, 7, sizeof(f->key));
	f->b.audit.fd = -1;
	assert_int_equal(audit_open(&f->b.audit, f->audit, f->key, err, sizeof(err)), 0);
	f->lfd = loop_listen_unix(f->sock);
	assert_true(f->lfd >= 0);
	assert_int_equal(egress_start(&f->b, f->lfd, &f->srv), 0);
}

/* Stops everything; returns the number of audit records, after checking the chain and MACs. */
static size_t fx_stop(struct fx *f, char **log)
{
	char why[256] = "";
	size_t nrec = 0;
	FILE *fp;
	long bad;

	egress_stop(f->srv);
	close(f->lfd);
	unlink(f->sock);
	audit_close(&f->b.audit);
	policy_free(&f->b.pol);
	upstream_stop(&f->up);
	bad = audit_verify_file(f->audit, f->key, &nrec, why, sizeof(why));
	if (bad)
		fail_msg("audit line %ld: %s", bad, why);
	if (log) {
		struct stat st;

		assert_int_equal(stat(f->audit, &st), 0);
		*log = calloc(1, (size_t)st.st_size + 1);
		fp = fopen(f->audit, "r");
		assert_non_null(fp);
		assert_int_equal(fread(*log, 1, (size_t)st.st_size, fp), (size_t)st.st_size);
		fclose(fp);
	}
	unlink(f->audit);
	rmdir(f->dir);
	return nrec;
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

static void send_str(int fd, const char *s)
{
	assert_int_equal(send(fd, s, strlen(s), MSG_NOSIGNAL), (ssize_t)strlen(s));
}

/* Reads until EOF (or the 20 s receive timeout, which fails). */
static char *read_all(int fd, size_t *len)
{
	size_t cap = 1 << 20, n = 0;
	char *b = malloc(cap + 1);

	assert_non_null(b);
	for (;;) {
		ssize_t r = recv(fd, b + n, cap - n, 0);

		assert_true(r >= 0);
		if (r == 0)
			break;
		n += (size_t)r;
		assert_true(n < cap);
	}
	b[n] = '\0';
	if (len)
		*len = n;
	return b;
}

/* Reads the proxy's answer head (through the blank line) only. */
static void read_head(int fd, char *out, size_t cap)
{
	size_t n = 0;

	while (n + 1 < cap) {
		ssize_t r = recv(fd, out + n, 1, 0);

		assert_int_equal(r, 1);
		n++;
		out[n] = '\0';
		if (n >= 4 && !strcmp(out + n - 4, "\r\n\r\n"))
			return;
	}
	fail_msg("no head end");
}

/* One request, the whole answer. The guest half-closes after its request, so the relay has
 * ended (and audited) by the time the answer's EOF arrives. */
static char *ask(const struct fx *f, const char *req)
{
	int fd = guest_connect(f);
	char *r;

	send_str(fd, req);
	shutdown(fd, SHUT_WR);
	r = read_all(fd, NULL);
	close(fd);
	return r;
}

static const char allow_local[] =
    "{\"egress\":{\"rules\":["
    "{\"host\":\"127.0.0.1\",\"ports\":[%d],\"methods\":[\"CONNECT\",\"GET\"],"
    "\"allow_private\":true},"
    "{\"host\":\"localhost\",\"ports\":[%d],\"methods\":[\"CONNECT\"]},"
    "{\"host\":\"169.254.169.254\",\"ports\":[80,%d],\"methods\":[\"GET\"]},"
    "{\"host\":\"*.example.org\",\"ports\":[443],\"methods\":[\"CONNECT\"]},"
    "{\"host\":\"127.0.0.1\",\"ports\":[1],\"methods\":[\"CONNECT\"],\"allow_private\":true}],"
    "\"max_connections\":16,\"idle_timeout_s\":5}}";

/* A tunnel carries 300 KiB each way intact; the guest's half-close reaches the upstream, the
 * upstream's end reaches the guest. Bytes sent with the CONNECT head are not lost. */
static void test_connect_tunnel(void **state)
{
	struct fx f;
	char req[128], head[512], *back, *log;
	size_t n = 300 * 1024, got;
	uint8_t *data = malloc(n);
	int fd;

	(void)state;
	fx_start(&f, allow_local);
	for (size_t i = 0; i < n; i++)
		data[i] = (uint8_t)(i * 2654435761u >> 13);
	fd = guest_connect(&f);
	snprintf(req, sizeof(req), "CONNECT 127.0.0.1:%d HTTP/1.1\r\nHost: x\r\n\r\nearly",
		 f.up.port);
	send_str(fd, req);
	read_head(fd, head, sizeof(head));
	assert_string_equal(head, "HTTP/1.1 200 Connection established\r\n\r\n");
	/* Send from a thread-free loop: the upstream echoes as we go, so interleave. */
	{
		size_t off = 0;
		char *rb = malloc(n + 5);
		size_t rn = 0;

		while (off < n || rn < n + 5) {
			struct pollfd p = {.fd = fd, .events = POLLIN | (off < n ? POLLOUT : 0)};

			assert_true(poll(&p, 1, 10000) > 0);
			if ((p.revents & POLLOUT) && off < n) {
				ssize_t w = send(fd, data + off, n - off > 8192 ? 8192 : n - off,
						 MSG_NOSIGNAL | MSG_DONTWAIT);
				assert_true(w > 0);
				off += (size_t)w;
				if (off == n)
					shutdown(fd, SHUT_WR);
			}
			if (p.revents & POLLIN) {
				ssize_t r = recv(fd, rb + rn, n + 5 - rn, MSG_DONTWAIT);
				assert_true(r > 0);
				rn += (size_t)r;
			}
		}
		assert_memory_equal(rb, "early", 5);
		assert_memory_equal(rb + 5, data, n);
		free(rb);
	}
	back = read_all(fd, &got); /* the upstream's end arrives as EOF */
	assert_int_equal(got, 0);
	free(back);
	close(fd);
	assert_int_equal(fx_stop(&f, &log), 1);
	assert_non_null(
	    strstr(log, "\"kind\":\"egress\",\"method\":\"CONNECT\",\"host\":\"127.0.0.1\""));
	assert_non_null(strstr(log, "\"addr\":\"127.0.0.1\",\"decision\":\"allow\",\"rule\":0,"
				    "\"reason\":\"closed\",\"status\":200,\"bytes_up\":307205,"
				    "\"bytes_down\":307205,"));
	free(log);
	free(data);
}

/* An absolute-form GET reaches the upstream in origin form, with Host from the URL, the proxy
 * headers dropped and "Connection: close"; its answer comes back whole. */
static void test_get_absolute(void **state)
{
	struct fx f;
	char req[256], want[128], *r, *log;

	(void)state;
	fx_start(&f, allow_local);
	snprintf(req, sizeof(req),
		 "GET http://127.0.0.1:%d/hello?x=1 HTTP/1.1\r\nHost: evil.example\r\n"
		 "Proxy-Connection: keep-alive\r\nProxy-Authorization: Basic eA==\r\n"
		 "Accept: */*\r\n\r\n",
		 f.up.port);
	r = ask(&f, req);
	assert_non_null(strstr(r, "HTTP/1.1 200 OK\r\n"));
	assert_non_null(strstr(r, "\r\n\r\nGET /hello?x=1 HTTP/1.1\r\n"));
	snprintf(want, sizeof(want),
		 "\r\nHost: 127.0.0.1:%d\r\nAccept: */*\r\nConnection: close\r\n\r\n", f.up.port);
	assert_non_null(strstr(r, want));
	assert_null(strstr(r, "evil"));
	assert_null(strstr(r, "Proxy-"));
	free(r);
	assert_int_equal(fx_stop(&f, &log), 1);
	assert_non_null(strstr(log, "\"method\":\"GET\",\"host\":\"127.0.0.1\""));
	if (!strstr(log, "\"decision\":\"allow\",\"rule\":0,\"reason\":\"closed\",\"status\":0,"))
		fail_msg("%s", log);
	free(log);
}

static void expect_refusal(const struct fx *f, const char *req, const char *status,
			   const char *body)
{
	char *r = ask(f, req);

	if (strncmp(r, status, strlen(status)) || !strstr(r, body))
		fail_msg("got \"%s\", wanted %s ... %s", r, status, body);
	free(r);
}

/* Policy refusals name the host and port (or the rule); private addresses are refused unless
 * the rule allows them, a name resolving to loopback too; nothing reaches the upstream. */
static void test_refusals(void **state)
{
	struct fx f;
	char req[256], *log;

	(void)state;
	fx_start(&f, allow_local);
	expect_refusal(&f, "CONNECT evil.example:443 HTTP/1.1\r\n\r\n",
		       "HTTP/1.1 403 Forbidden\r\n",
		       "\r\n\r\ncove-egress: denied: no egress rule allows evil.example:443\n");
	expect_refusal(&f, "CONNECT example.org:443 HTTP/1.1\r\n\r\n", "HTTP/1.1 403 ",
		       "no egress rule allows example.org:443\n");
	expect_refusal(&f, "GET http://a.example.org:443/ HTTP/1.1\r\n\r\n", "HTTP/1.1 403 ",
		       "denied: egress rule 3 does not allow GET\n");
	snprintf(req, sizeof(req), "CONNECT 127.0.0.1:%d HTTP/1.1\r\n\r\n",
		 f.up.port + 1 > 65535 ? 1 : f.up.port + 1);
	expect_refusal(&f, req, "HTTP/1.1 403 ", "no egress rule allows 127.0.0.1:");
	/* localhost is in the policy, without allow_private. */
	snprintf(req, sizeof(req), "CONNECT localhost:%d HTTP/1.1\r\n\r\n", f.up.port);
	expect_refusal(&f, req, "HTTP/1.1 403 ",
		       "denied: localhost resolves to a private, loopback or link-local address "
		       "(egress rule 1 has no allow_private)\n");
	/* The cloud metadata address, though a rule names it. */
	expect_refusal(&f, "GET http://169.254.169.254/latest/meta-data/ HTTP/1.1\r\n\r\n",
		       "HTTP/1.1 403 ", "169.254.169.254 resolves to a private");
	/* Allowed, but nobody listens there: 502 naming the host and the error. */
	expect_refusal(&f, "CONNECT 127.0.0.1:1 HTTP/1.1\r\n\r\n", "HTTP/1.1 502 Bad Gateway\r\n",
		       "cove-egress: upstream: connect to 127.0.0.1 port 1 failed: Connection "
		       "refused\n");
	assert_int_equal(fx_stop(&f, &log), 7);
	assert_non_null(
	    strstr(log, "\"host\":\"evil.example\",\"port\":443,\"addr\":\"\","
			"\"decision\":\"deny\",\"rule\":null,"
			"\"reason\":\"no egress rule allows evil.example:443\",\"status\":403,"
			"\"bytes_up\":0,\"bytes_down\":0,"));
	assert_non_null(strstr(log, "\"decision\":\"deny\",\"rule\":1,"));
	free(log);
}

/* The destination checks on literal addresses (no DNS): all refused without allow_private. */
static void test_dest_literals(void **state)
{
	static const char *const priv[] = {"169.254.169.254",
					   "127.0.0.1",
					   "10.1.2.3",
					   "192.168.0.1",
					   "172.16.0.1",
					   "100.64.0.1",
					   "0.0.0.0",
					   "224.0.0.1",
					   "255.255.255.255",
					   "::1",
					   "::",
					   "fe80::1",
					   "fc00::1",
					   "ff02::1",
					   "::ffff:127.0.0.1",
					   "::ffff:169.254.169.254",
					   "64:ff9b::a9fe:a9fe",
					   NULL};
	struct dest_addrs d;

	(void)state;
	for (int i = 0; priv[i]; i++) {
		if (dest_lookup(priv[i], 443, false, &d) != -EACCES)
			fail_msg("%s was not refused", priv[i]);
		assert_int_equal(d.n, 0);
	}
	assert_int_equal(dest_lookup("169.254.169.254", 80, true, &d), 0);
	assert_int_equal(d.n, 1);
	assert_int_equal(ntohs(((struct sockaddr_in *)&d.a[0])->sin_port), 80);
	assert_int_equal(dest_lookup("93.184.215.14", 443, false, &d), 0);
	assert_int_equal(dest_lookup("2606:4700::1", 443, false, &d), 0);
	/* The connect re-checks the exact address too. */
	assert_int_equal(dest_lookup("127.0.0.1", 9, true, &d), 0);
	size_t used;
	assert_int_equal(dest_connect(&d, false, 1000, -1, &used), -EACCES);
}

/* Bad heads get a 400 and never reach a rule; a head over 16 KiB or 100 header lines too. */
static void test_bad_heads(void **state)
{
	struct fx f;
	char *big, *log;
	size_t n = 17 * 1024;
	int fd;

	(void)state;
	fx_start(&f, allow_local);
	expect_refusal(&f, "garbage\r\n\r\n", "HTTP/1.1 400 Bad Request\r\n",
		       "cove-egress: bad request head");
	expect_refusal(&f, "GET /relative HTTP/1.1\r\n\r\n", "HTTP/1.1 400 ", "request target");
	expect_refusal(&f, "GET https://127.0.0.1/ HTTP/1.1\r\n\r\n", "HTTP/1.1 400 ",
		       "CONNECT for https");
	expect_refusal(&f, "GET http://u:p@127.0.0.1/ HTTP/1.1\r\n\r\n", "HTTP/1.1 400 ",
		       "user info");
	expect_refusal(&f, "CONNECT 127.0.0.1 HTTP/1.1\r\n\r\n", "HTTP/1.1 400 ", "");
	expect_refusal(&f, "CONNECT 127.0.0.1:0 HTTP/1.1\r\n\r\n", "HTTP/1.1 400 ", "bad port");
	expect_refusal(&f, "CONNECT 127.0.0.1:99999 HTTP/1.1\r\n\r\n", "HTTP/1.1 400 ", "");
	/* Oversized: no end within 16 KiB. */
	big = malloc(n + 1);
	memcpy(big, "GET http://127.0.0.1/ HTTP/1.1\r\nX-Big: ", 39);
	memset(big + 39, 'a', n - 39);
	big[n] = '\0';
	fd = guest_connect(&f);
	assert_int_equal(send(fd, big, n, MSG_NOSIGNAL), (ssize_t)n);
	free(big);
	big = read_all(fd, NULL);
	close(fd);
	assert_non_null(strstr(big, "HTTP/1.1 400 "));
	assert_non_null(strstr(big, "request head over 16384 bytes"));
	free(big);
	/* 101 header lines. */
	big = malloc(4096);
	strcpy(big, "GET http://127.0.0.1/ HTTP/1.1\r\n");
	for (int i = 0; i < 101; i++)
		strcat(big, "A: b\r\n");
	strcat(big, "\r\n");
	expect_refusal(&f, big, "HTTP/1.1 400 ", "over 100 header lines");
	free(big);
	assert_int_equal(fx_stop(&f, &log), 9);
	assert_non_null(
	    strstr(log, "\"decision\":\"deny\",\"rule\":null,\"reason\":\"request head over"));
	free(log);
}

/* max_connections: with 2 open (waiting for their heads), a third gets 503 at once; once one
 * closes, a new one is served. */
static void test_max_connections(void **state)
{
	static const char pol[] =
	    "{\"egress\":{\"rules\":[{\"host\":\"127.0.0.1\",\"ports\":[%d],"
	    "\"methods\":[\"CONNECT\"],\"allow_private\":true}],\"max_connections\":2}}";
	struct fx f;
	char req[128], head[256], *r, *log;
	int a, b, c;

	(void)state;
	fx_start(&f, pol);
	a = guest_connect(&f);
	b = guest_connect(&f);
	c = guest_connect(&f);
	r = read_all(c, NULL);
	close(c);
	assert_non_null(strstr(r, "HTTP/1.1 503 Service Unavailable\r\n"));
	assert_non_null(strstr(r, "cove-egress: over max_connections (2 open)\n"));
	free(r);
	close(a);
	/* a's thread ends on EOF; then there is room again. */
	for (int tries = 0;; tries++) {
		c = guest_connect(&f);
		snprintf(req, sizeof(req), "CONNECT 127.0.0.1:%d HTTP/1.1\r\n\r\n", f.up.port);
		send_str(c, req);
		if (recv(c, head, 12, MSG_PEEK) == 12 && !memcmp(head, "HTTP/1.1 200", 12))
			break;
		close(c);
		assert_true(tries < 50);
		usleep(20000);
	}
	read_head(c, head, sizeof(head));
	send_str(c, "ping");
	assert_int_equal(recv(c, head, 4, MSG_WAITALL), 4);
	assert_memory_equal(head, "ping", 4);
	close(c);
	close(b);
	assert_true(fx_stop(&f, &log) >= 4);
	assert_non_null(strstr(log, "\"reason\":\"over max_connections (2 open)\",\"status\":503"));
	assert_non_null(strstr(log, "\"reason\":\"closed before a request\""));
	free(log);
}

/* max_bytes (each way) ends a tunnel that sends more; idle_timeout_s ends a quiet one. */
static void test_limits(void **state)
{
	static const char pol[] =
	    "{\"egress\":{\"rules\":[{\"host\":\"127.0.0.1\",\"ports\":[%d],"
	    "\"methods\":[\"CONNECT\"],\"allow_private\":true}],\"max_bytes\":1000,"
	    "\"idle_timeout_s\":1}}";
	struct fx f;
	char req[128], head[256], blob[4000], *r, *log;
	struct timespec t0, t1;
	size_t got;
	int fd;

	(void)state;
	fx_start(&f, pol);
	snprintf(req, sizeof(req), "CONNECT 127.0.0.1:%d HTTP/1.1\r\n\r\n", f.up.port);
	fd = guest_connect(&f);
	send_str(fd, req);
	read_head(fd, head, sizeof(head));
	memset(blob, 'z', sizeof(blob));
	send(fd, blob, sizeof(blob), MSG_NOSIGNAL);
	/* Cut off: at most the 1000 bytes echoed, then EOF, or a reset (a Unix socket closed
	 * with our unread bytes in it resets). */
	got = 0;
	for (;;) {
		ssize_t n = recv(fd, blob, sizeof(blob), 0);

		if (n < 0 && errno == ECONNRESET)
			break;
		assert_true(n >= 0);
		if (!n)
			break;
		got += (size_t)n;
	}
	assert_true(got <= 1000);
	close(fd);

	fd = guest_connect(&f);
	send_str(fd, req);
	read_head(fd, head, sizeof(head));
	clock_gettime(CLOCK_MONOTONIC, &t0);
	r = read_all(fd, &got);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	assert_int_equal(got, 0);
	assert_true(t1.tv_sec - t0.tv_sec >= 0 && t1.tv_sec - t0.tv_sec <= 3);
	free(r);
	close(fd);
	assert_int_equal(fx_stop(&f, &log), 2);
	assert_non_null(strstr(log, "\"reason\":\"over max_bytes\""));
	assert_non_null(strstr(log, "\"reason\":\"idle timeout\""));
	free(log);
}

/* Stopping the server ends a tunnel in the middle and audits it. */
static void test_stop_ends_tunnels(void **state)
{
	struct fx f;
	char req[128], head[256], *log;
	int fd;

	(void)state;
	fx_start(&f, allow_local);
	snprintf(req, sizeof(req), "CONNECT 127.0.0.1:%d HTTP/1.1\r\n\r\n", f.up.port);
	fd = guest_connect(&f);
	send_str(fd, req);
	read_head(fd, head, sizeof(head));
	assert_int_equal(fx_stop(&f, &log), 1);
	assert_non_null(strstr(log, "\"reason\":\"broker stopping\""));
	free(log);
	close(fd);
}

/* ---- pure parts ---- */

static void test_head_parse(void **state)
{
	struct egress_head h;
	char err[256];
	const char *c6 = "CONNECT [::1]:8443 HTTP/1.1\r\nHost: [::1]:8443\r\n\r\n";
	const char *g = "GET http://Example.COM/a/b?q#frag HTTP/1.0\nUser-Agent: t\n\n";

	(void)state;
	assert_int_equal(egress_head_end(c6, strlen(c6)), (long)strlen(c6));
	assert_int_equal(egress_head_end(c6, strlen(c6) - 1), 0);
	assert_int_equal(egress_head_parse(c6, strlen(c6), &h, err, sizeof(err)), 0);
	assert_true(h.is_connect);
	assert_string_equal(h.host, "::1");
	assert_int_equal(h.port, 8443);
	assert_null(h.fwd);
	egress_head_free(&h);
	assert_int_equal(egress_head_end(g, strlen(g)), (long)strlen(g));
	assert_int_equal(egress_head_parse(g, strlen(g), &h, err, sizeof(err)), 0);
	assert_false(h.is_connect);
	assert_string_equal(h.method, "GET");
	assert_string_equal(h.host, "example.com");
	assert_int_equal(h.port, 80);
	assert_string_equal(h.fwd, "GET /a/b?q HTTP/1.0\r\nHost: example.com\r\nUser-Agent: t\r\n"
				   "Connection: close\r\n\r\n");
	egress_head_free(&h);
	/* A bare CR inside a value is a bad head (http-parser), never forwarded. */
	g = "GET http://a/ HTTP/1.1\r\nX: a\rb\r\n\r\n";
	assert_int_equal(egress_head_parse(g, strlen(g), &h, err, sizeof(err)), -EINVAL);
	egress_head_free(&h);
	g = "GET http://a_b!/ HTTP/1.1\r\n\r\n";
	assert_int_not_equal(egress_head_parse(g, strlen(g), &h, err, sizeof(err)), 0);
	egress_head_free(&h);
}

/* Mutated heads (a fixed seed): never a crash or a read past the buffer (ASan), every accepted
 * one has a host, a port in range and, for plain http, an origin-form head that ends in the
 * blank line. */
static void test_head_random(void **state)
{
	static const char *const seeds[] = {
	    "CONNECT api.example.com:443 HTTP/1.1\r\nHost: api.example.com:443\r\n\r\n",
	    "GET http://[::1]:8080/a?b=c HTTP/1.1\r\nAccept: */*\r\nX: y\r\n\r\n",
	    "POST http://h/p HTTP/1.0\nContent-Length: 3\n\nabc",
	};
	unsigned seed = 12345;
	char buf[512], err[256];

	(void)state;
	for (int it = 0; it < 30000; it++) {
		const char *s0 = seeds[it % 3];
		size_t n = strlen(s0);
		struct egress_head h;
		long end;

		memcpy(buf, s0, n);
		for (int k = 0; k < 1 + it % 4; k++) {
			seed = seed * 1103515245 + 12345;
			buf[(seed >> 8) % n] = (char)(seed >> 20);
		}
		end = egress_head_end(buf, n);
		if (end <= 0)
			continue;
		if (!egress_head_parse(buf, (size_t)end, &h, err, sizeof(err))) {
			assert_true(h.host[0] != '\0');
			assert_true(h.port >= 1 && h.port <= 65535);
			if (!h.is_connect) {
				assert_int_equal(strlen(h.fwd), h.fwd_len);
				assert_string_equal(h.fwd + h.fwd_len - 4, "\r\n\r\n");
			}
		} else {
			assert_null(strchr(err, '\n'));
		}
		egress_head_free(&h);
	}
}

static void test_match(void **state)
{
	static const char doc[] =
	    "{\"egress\":{\"rules\":["
	    "{\"host\":\"api.example.com\",\"ports\":[443],\"methods\":[\"CONNECT\"]},"
	    "{\"host\":\"*.Debian.org\",\"ports\":[80,8080],\"methods\":[\"GET\",\"HEAD\"]}]}}";
	struct policy p;
	char err[256], why[128];

	(void)state;
	assert_int_equal(policy_parse(doc, strlen(doc), &p, err, sizeof(err)), 0);
	assert_int_equal(p.ncreds, 0);
	assert_int_equal(p.egress.nrules, 2);
	assert_int_equal(p.egress.max_connections, EGRESS_DEF_CONNS);
	assert_int_equal(p.egress.max_bytes, EGRESS_DEF_BYTES);
	assert_int_equal(
	    egress_match(&p.egress, "api.example.com", 443, "CONNECT", why, sizeof(why)), 0);
	assert_int_equal(egress_match(&p.egress, "deb.debian.org", 8080, "HEAD", why, sizeof(why)),
			 1);
	assert_int_equal(egress_match(&p.egress, "debian.org", 80, "GET", why, sizeof(why)), -1);
	assert_string_equal(why, "no egress rule allows debian.org:80");
	assert_int_equal(
	    egress_match(&p.egress, "api.example.com", 80, "CONNECT", why, sizeof(why)), -1);
	assert_int_equal(egress_match(&p.egress, "deb.debian.org", 80, "POST", why, sizeof(why)),
			 -1);
	assert_string_equal(why, "egress rule 1 does not allow POST");
	assert_int_equal(egress_match(&p.egress, "::1", 443, "CONNECT", why, sizeof(why)), -1);
	assert_string_equal(why, "no egress rule allows [::1]:443");
	policy_free(&p);
	/* No egress section: nothing is allowed. */
	static const char creds_only[] =
	    "{\"credentials\":{\"d\":{\"helper\":[\"h\"],\"inject\":{\"header\":\"X\","
	    "\"template\":\"{password}\"},\"allow\":{\"hosts\":[\"a\"]}}}}";
	assert_int_equal(policy_parse(creds_only, strlen(creds_only), &p, err, sizeof(err)), 0);
	assert_int_equal(egress_match(&p.egress, "a", 443, "CONNECT", why, sizeof(why)), -1);
	policy_free(&p);
}

static void expect_bad(const char *doc, const char *needle)
{
	struct policy p;
	char err[256] = "";

	assert_int_equal(policy_parse(doc, strlen(doc), &p, err, sizeof(err)), -EINVAL);
	if (!strstr(err, needle) || strchr(err, '\n'))
		fail_msg("error \"%s\" lacks \"%s\"", err, needle);
}

static void test_policy_errors(void **state)
{
	(void)state;
	expect_bad("{\"egress\":[]}", "\"egress\" must be an object");
	expect_bad("{\"egress\":{\"colour\":1}}", "egress: unknown key \"colour\"");
	expect_bad("{\"egress\":{\"rules\":[{\"host\":\"a\",\"ports\":[1],\"methods\":[\"GET\"],"
		   "\"x\":1}]}}",
		   "egress.rules[0]: unknown key \"x\"");
	expect_bad("{\"egress\":{\"rules\":[{\"host\":\"a\",\"methods\":[\"GET\"]}]}}",
		   "egress.rules[0] needs \"host\", \"ports\" and \"methods\"");
	expect_bad(
	    "{\"egress\":{\"rules\":[{\"host\":\"*\",\"ports\":[1],\"methods\":[\"GET\"]}]}}",
	    "egress.rules[0].host");
	expect_bad(
	    "{\"egress\":{\"rules\":[{\"host\":\"a/b\",\"ports\":[1],\"methods\":[\"GET\"]}]}}",
	    "egress.rules[0].host");
	expect_bad(
	    "{\"egress\":{\"rules\":[{\"host\":\"a\",\"ports\":[0],\"methods\":[\"GET\"]}]}}",
	    "egress.rules[0].ports[0] must be an integer 1..65535");
	expect_bad(
	    "{\"egress\":{\"rules\":[{\"host\":\"a\",\"ports\":[1],\"methods\":[\"get\"]}]}}",
	    "egress.rules[0].methods[0]");
	expect_bad("{\"egress\":{\"rules\":[{\"host\":\"a\",\"ports\":[1],\"methods\":[\"GET\"],"
		   "\"allow_private\":1}]}}",
		   "allow_private must be true or false");
	expect_bad("{\"egress\":{\"max_connections\":0}}",
		   "egress.max_connections must be an integer 1..256");
	expect_bad("{\"egress\":{\"max_connections\":257}}", "egress.max_connections");
	expect_bad("{\"egress\":{\"idle_timeout_s\":\"5\"}}", "egress.idle_timeout_s");
	expect_bad("{\"egress\":{\"max_bytes\":-1}}", "egress.max_bytes");
	expect_bad("{}", "\"credentials\" must be an object");
	expect_bad(
	    "{\"egress\":{\"rules\":[{\"host\":\"a\\nb\",\"ports\":[1],\"methods\":[\"GET\"]}]}}",
	    "egress.rules[0].host");
}

/* ---- pipelining: an upstream that ignores "Connection: close" and logs every request line ---- */

struct logup {
	int lfd, port;
	pthread_t t;
	volatile int stop;
	pthread_mutex_t mu;
	char log[8192]; /* request lines, one a line */
	size_t loglen;
	unsigned conns;
};

static void logup_note(struct logup *u, const char *line, size_t len)
{
	pthread_mutex_lock(&u->mu);
	if (u->loglen + len + 2 < sizeof(u->log)) {
		memcpy(u->log + u->loglen, line, len);
		u->loglen += len;
		u->log[u->loglen++] = '\n';
		u->log[u->loglen] = '\0';
	}
	pthread_mutex_unlock(&u->mu);
}

/* Answers every request head on the connection (body: its request line), skipping a
 * Content-Length body, and reads on whatever the request said about closing. */
static void logup_serve(struct logup *u, int fd)
{
	char buf[65536];
	size_t len = 0;

	for (;;) {
		char *e, *cl, resp[1024];
		size_t hl, ll, blen = 0;
		int rl;

		while (!(e = memmem(buf, len, "\r\n\r\n", 4))) {
			ssize_t n = recv(fd, buf + len, sizeof(buf) - 1 - len, 0);

			if (n <= 0 || len + (size_t)n >= sizeof(buf) - 1)
				return;
			len += (size_t)n;
		}
		buf[len] = '\0';
		hl = (size_t)(e + 4 - buf);
		ll = strcspn(buf, "\r\n");
		logup_note(u, buf, ll);
		cl = strcasestr(buf, "\r\nContent-Length: ");
		if (cl && cl < e)
			blen = strtoul(cl + 18, NULL, 10);
		while (len < hl + blen) {
			ssize_t n = recv(fd, buf + len, sizeof(buf) - 1 - len, 0);

			if (n <= 0)
				return;
			len += (size_t)n;
		}
		/* The body is the request line, '|' and the body length as 6 digits at most. */
		rl = snprintf(resp, sizeof(resp),
			      "HTTP/1.1 200 OK\r\nContent-Length: %zu\r\n\r\n%.*s|%06zu",
			      ll + 1 + 6, (int)ll, buf, blen % 1000000);
		if (send(fd, resp, (size_t)rl, MSG_NOSIGNAL) != rl)
			return;
		memmove(buf, buf + hl + blen, len - hl - blen);
		len -= hl + blen;
	}
}

static void *logup_main(void *arg)
{
	struct logup *u = arg;

	while (!u->stop) {
		struct pollfd p = {.fd = u->lfd, .events = POLLIN};
		int fd;

		if (poll(&p, 1, 100) <= 0)
			continue;
		fd = accept(u->lfd, NULL, NULL);
		if (fd < 0)
			continue;
		pthread_mutex_lock(&u->mu);
		u->conns++;
		pthread_mutex_unlock(&u->mu);
		logup_serve(u, fd);
		close(fd);
	}
	return NULL;
}

static void logup_start(struct logup *u)
{
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
	socklen_t sl = sizeof(sa);

	memset(u, 0, sizeof(*u));
	pthread_mutex_init(&u->mu, NULL);
	u->lfd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_true(u->lfd >= 0);
	assert_int_equal(bind(u->lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(listen(u->lfd, 16), 0);
	assert_int_equal(getsockname(u->lfd, (struct sockaddr *)&sa, &sl), 0);
	u->port = ntohs(sa.sin_port);
	assert_int_equal(pthread_create(&u->t, NULL, logup_main, u), 0);
}

static void logup_stop(struct logup *u)
{
	u->stop = 1;
	pthread_join(u->t, NULL);
	close(u->lfd);
	pthread_mutex_destroy(&u->mu);
}

/* The answer the upstream gives to a request line with a body of blen bytes. */
static void logup_answer(char *out, size_t cap, const char *line, size_t blen)
{
	snprintf(out, cap, "HTTP/1.1 200 OK\r\nContent-Length: %zu\r\n\r\n%s|%06zu",
		 strlen(line) + 7, line, blen);
}

/* The guest's pipelined requests in one write, then its half-close; everything back. */
static char *pipeline(const struct fx *f, const char *reqs)
{
	return ask(f, reqs);
}

static char *only_get(const struct logup *u, char *pol, size_t cap)
{
	snprintf(pol, cap,
		 "{\"egress\":{\"rules\":[{\"host\":\"127.0.0.1\",\"ports\":[%d],"
		 "\"methods\":[\"GET\",\"POST\"],\"allow_private\":true}],\"idle_timeout_s\":5}}",
		 u->port);
	return pol;
}

/* Every request on a plain-HTTP connection is checked: two allowed GETs pipelined in one write
 * are both served (each by its own upstream connection), the DELETE behind them is refused
 * with a 403 after their answers and never reaches the upstream, nor does anything after it. */
static void test_pipeline_method(void **state)
{
	struct fx f;
	struct logup u;
	char pol[512], req[1024], want[2048], a1[256], a2[256], *r, *log;

	(void)state;
	logup_start(&u);
	fx_start(&f, only_get(&u, pol, sizeof(pol)));
	snprintf(req, sizeof(req),
		 "GET http://127.0.0.1:%d/one HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
		 "GET http://127.0.0.1:%d/two HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
		 "DELETE http://127.0.0.1:%d/admin/users/1 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n"
		 "GET http://127.0.0.1:%d/three HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
		 u.port, u.port, u.port, u.port);
	r = pipeline(&f, req);
	logup_answer(a1, sizeof(a1), "GET /one HTTP/1.1", 0);
	logup_answer(a2, sizeof(a2), "GET /two HTTP/1.1", 0);
	snprintf(want, sizeof(want),
		 "%s%sHTTP/1.1 403 Forbidden\r\nContent-Type: text/plain\r\nContent-Length: 57\r\n"
		 "Connection: close\r\n\r\ncove-egress: denied: egress rule 0 does not allow "
		 "DELETE\n",
		 a1, a2);
	if (strcmp(r, want))
		fail_msg("got:\n%s\nwanted:\n%s", r, want);
	free(r);
	assert_int_equal(fx_stop(&f, &log), 3);
	logup_stop(&u);
	assert_string_equal(u.log, "GET /one HTTP/1.1\nGET /two HTTP/1.1\n");
	assert_int_equal(u.conns, 2);
	if (!strstr(log, "\"method\":\"DELETE\",\"host\":\"127.0.0.1\"") ||
	    !strstr(log, "\"decision\":\"deny\",\"rule\":null,\"reason\":\"egress rule 0 does not "
			 "allow DELETE\",\"status\":403,"))
		fail_msg("%s", log);
	assert_non_null(strstr(log, "\"decision\":\"allow\",\"rule\":0,\"reason\":\"closed\","
				    "\"status\":0,\"bytes_up\":0,\"bytes_down\":63,"));
	free(log);
}

/* A pipelined request to another host, or to another port of the same host (where a second
 * logging server listens), is refused after the allowed one's answer and reaches neither;
 * an origin-form request (the raw "DELETE /admin" an upstream would take) is a bad request. */
static void test_pipeline_host_port(void **state)
{
	static const char *const second[] = {
	    "DELETE http://other.example:%d/admin/users/1 HTTP/1.1\r\nHost: other.example\r\n\r\n",
	    "GET http://127.0.0.1:%d/admin/users/1 HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
	    "DELETE /admin/users/1 HTTP/1.1\r\nHost: other.example\r\n\r\n",
	};
	struct fx f;
	struct logup u, other;
	char pol[512], req[1024], tail[256], want[256], a1[256], *r, *log;

	(void)state;
	logup_start(&u);
	logup_start(&other);
	fx_start(&f, only_get(&u, pol, sizeof(pol)));
	logup_answer(a1, sizeof(a1), "GET /one HTTP/1.1", 0);
	for (size_t i = 0; i < 3; i++) {
		int n = snprintf(req, sizeof(req),
				 "GET http://127.0.0.1:%d/one HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n",
				 u.port);

		snprintf(req + n, sizeof(req) - (size_t)n, second[i], i ? other.port : u.port);
		r = pipeline(&f, req);
		if (strncmp(r, a1, strlen(a1)))
			fail_msg("case %zu: got \"%s\"", i, r);
		snprintf(tail, sizeof(tail), "%s", r + strlen(a1));
		if (i == 0)
			snprintf(
			    want, sizeof(want),
			    "HTTP/1.1 403 Forbidden\r\n%%s\r\n\r\ncove-egress: denied: no egress "
			    "rule allows other.example:%d\n",
			    u.port);
		else if (i == 1)
			snprintf(
			    want, sizeof(want),
			    "HTTP/1.1 403 Forbidden\r\n%%s\r\n\r\ncove-egress: denied: no egress "
			    "rule allows 127.0.0.1:%d\n",
			    other.port);
		else
			snprintf(
			    want, sizeof(want),
			    "HTTP/1.1 400 Bad Request\r\n%%s\r\n\r\ncove-egress: request target "
			    "must be http://host/... (CONNECT for https)\n");
		/* Status line first, the body last: the headers between are as for any refusal. */
		{
			char *mid = strstr(want, "%s"), *body = strstr(tail, "\r\n\r\n");

			assert_non_null(body);
			if (strncmp(tail, want, (size_t)(mid - want)) || strcmp(body, mid + 2))
				fail_msg("case %zu: got \"%s\"", i, tail);
		}
		free(r);
	}
	assert_int_equal(fx_stop(&f, &log), 6);
	logup_stop(&u);
	logup_stop(&other);
	assert_string_equal(u.log, "GET /one HTTP/1.1\nGET /one HTTP/1.1\nGET /one HTTP/1.1\n");
	assert_int_equal(other.loglen, 0);
	assert_int_equal(other.conns, 0);
	snprintf(want, sizeof(want),
		 "\"method\":\"DELETE\",\"host\":\"other.example\",\"port\":%d,\"addr\":\"\","
		 "\"decision\":\"deny\",\"rule\":null,\"reason\":\"no egress rule allows "
		 "other.example:%d\",\"status\":403,",
		 u.port, u.port);
	if (!strstr(log, want))
		fail_msg("%s", log);
	snprintf(want, sizeof(want),
		 "\"method\":\"GET\",\"host\":\"127.0.0.1\",\"port\":%d,\"addr\":\"\","
		 "\"decision\":\"deny\",\"rule\":null,\"reason\":\"no egress rule allows "
		 "127.0.0.1:%d\",\"status\":403,",
		 other.port, other.port);
	if (!strstr(log, want))
		fail_msg("%s", log);
	assert_non_null(strstr(log, "\"status\":400,"));
	free(log);
}

/* Bodies are the request's own bytes, never the next head: a Content-Length body that holds a
 * request line goes upstream as a body, a chunked one goes re-chunked (its extension dropped),
 * and the GET behind each is checked and served. */
static void test_pipeline_bodies(void **state)
{
	struct fx f;
	struct logup u;
	char pol[512], req[2048], want[1024], a[3][256], *r, *log;
	static const char smuggled[] = "DELETE /admin/users/1 HTTP/1.1\r\nHost: x\r\n\r\n";

	(void)state;
	logup_start(&u);
	fx_start(&f, only_get(&u, pol, sizeof(pol)));
	snprintf(req, sizeof(req),
		 "POST http://127.0.0.1:%d/p HTTP/1.1\r\nContent-Length: %zu\r\n\r\n%s"
		 "GET http://127.0.0.1:%d/two HTTP/1.1\r\n\r\n",
		 u.port, strlen(smuggled), smuggled, u.port);
	r = pipeline(&f, req);
	logup_answer(a[0], sizeof(a[0]), "POST /p HTTP/1.1", strlen(smuggled));
	logup_answer(a[1], sizeof(a[1]), "GET /two HTTP/1.1", 0);
	snprintf(want, sizeof(want), "%s%s", a[0], a[1]);
	if (strcmp(r, want))
		fail_msg("got \"%s\"", r);
	free(r);
	assert_int_equal(fx_stop(&f, &log), 2);
	logup_stop(&u);
	assert_string_equal(u.log, "POST /p HTTP/1.1\nGET /two HTTP/1.1\n");
	assert_non_null(strstr(log, "\"bytes_up\":43,"));
	free(log);
}

/* The body and answer framing on their own: chunked bodies re-chunked without extensions or
 * trailers and cut at their end, Content-Length bodies cut at theirs, answers after 1xx, HEAD
 * answers without a body, close-delimited answers. */
static void test_framing(void **state)
{
	static const char chunked_head[] =
	    "POST http://h/ HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n";
	static const char chunked_body[] = "5;ext=1\r\nhello\r\n0\r\nX-Trailer: y\r\n\r\nNEXT";
	static const char cl_head[] = "POST http://h/ HTTP/1.1\r\nContent-Length: 3\r\n\r\n";
	struct egress_body *b = malloc(sizeof(*b));
	struct egress_resp *rp = malloc(sizeof(*rp));
	char out[EGRESS_BODY_OUT(EGRESS_BODY_IN)];
	size_t olen, total = 0;
	long n;

	(void)state;
	assert_int_equal(egress_body_init(b, chunked_head, strlen(chunked_head)), 0);
	assert_false(b->done);
	/* One byte at a time: every split of the framing. */
	for (size_t i = 0; i < strlen(chunked_body) && !b->done; i++) {
		n = egress_body_feed(b, chunked_body + i, 1, out + total, sizeof(out) - total,
				     &olen);
		assert_int_equal(n, 1);
		total += olen;
	}
	assert_true(b->done);
	out[total] = '\0';
	assert_string_equal(out, "1\r\nh\r\n1\r\ne\r\n1\r\nl\r\n1\r\nl\r\n1\r\no\r\n0\r\n\r\n");
	assert_int_equal(egress_body_init(b, chunked_head, strlen(chunked_head)), 0);
	n = egress_body_feed(b, chunked_body, strlen(chunked_body), out, sizeof(out), &olen);
	assert_int_equal(n, (long)strlen(chunked_body) - 4);
	assert_true(b->done);
	assert_memory_equal(out, "5\r\nhello\r\n0\r\n\r\n", olen);
	assert_int_equal(olen, 15);
	/* A bad chunk size is refused. */
	assert_int_equal(egress_body_init(b, chunked_head, strlen(chunked_head)), 0);
	assert_int_equal(egress_body_feed(b, "zz\r\n", 4, out, sizeof(out), &olen), -EINVAL);
	assert_int_equal(egress_body_init(b, cl_head, strlen(cl_head)), 0);
	n = egress_body_feed(b, "abcGET", 6, out, sizeof(out), &olen);
	assert_int_equal(n, 3);
	assert_int_equal(olen, 3);
	assert_true(b->done);
	assert_int_equal(egress_body_init(b, "GET http://h/ HTTP/1.1\r\n\r\n", 26), 0);
	assert_true(b->done);

	/* Two framings at once (a smuggling classic) never get as far as a body. */
	{
		static const char both[] = "POST http://h/ HTTP/1.1\r\nContent-Length: 3\r\n"
					   "Transfer-Encoding: chunked\r\n\r\n";
		struct egress_head h;
		char err[128];

		assert_int_equal(egress_head_parse(both, strlen(both), &h, err, sizeof(err)),
				 -EINVAL);
		assert_string_equal(err, "bad request head (HPE_UNEXPECTED_CONTENT_LENGTH)");
		assert_int_equal(egress_body_init(b, both, strlen(both)), -EINVAL);
		egress_head_free(&h);
	}

	egress_resp_init(rp, false);
	{
		static const char a[] = "HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\n"
					"Content-Length: 2\r\n\r\nokEXTRA";

		assert_int_equal(egress_resp_feed(rp, a, strlen(a)), (long)strlen(a) - 5);
		assert_true(rp->final);
		assert_int_equal(rp->status, 200);
	}
	egress_resp_init(rp, true);
	assert_int_equal(egress_resp_feed(rp, "HTTP/1.1 200 OK\r\nContent-Length: 99\r\n\r\nX", 40),
			 39);
	assert_true(rp->final);
	egress_resp_init(rp, false);
	assert_int_equal(egress_resp_feed(rp, "HTTP/1.0 200 OK\r\n\r\nuntil the end", 32), 32);
	assert_false(rp->final);
	assert_int_equal(egress_resp_feed(rp, NULL, 0), 0);
	assert_true(rp->final && rp->at_eof);
	egress_resp_init(rp, false);
	assert_int_equal(egress_resp_feed(rp, "SSH-2.0-x\r\n", 11), -EINVAL);
	egress_resp_init(rp, false);
	assert_int_equal(egress_resp_feed(rp, "HTTP/1.1 200 OK\r\nContent-Length: 9\r\n\r\nab", 41),
			 41);
	assert_int_equal(egress_resp_feed(rp, NULL, 0), -EINVAL); /* cut short */
	free(b);
	free(rp);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_head_parse),	    cmocka_unit_test(test_head_random),
	    cmocka_unit_test(test_match),	    cmocka_unit_test(test_policy_errors),
	    cmocka_unit_test(test_dest_literals),   cmocka_unit_test(test_connect_tunnel),
	    cmocka_unit_test(test_get_absolute),    cmocka_unit_test(test_refusals),
	    cmocka_unit_test(test_bad_heads),	    cmocka_unit_test(test_max_connections),
	    cmocka_unit_test(test_limits),	    cmocka_unit_test(test_stop_ends_tunnels),
	    cmocka_unit_test(test_pipeline_method), cmocka_unit_test(test_pipeline_host_port),
	    cmocka_unit_test(test_pipeline_bodies), cmocka_unit_test(test_framing),
	};

	signal(SIGPIPE, SIG_IGN);
	return cmocka_run_group_tests(tests, NULL, NULL);
}
