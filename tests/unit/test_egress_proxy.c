/* Unit tests: cove-init's egress proxy in test mode (127.0.0.1:free port -> PATH_1026 Unix
 * socket): bytes both ways, half-closes, the relay cap, a refused upstream; exec env defaults. */
#include <errno.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include "agent.h"
#include "egress_proxy.h"

#define BIG (8u << 20)

/* The host side of port 1026, as cove-broker would listen on it. */
enum up_mode {
	UP_ECHO,  /* every byte back until EOF, then EOF */
	UP_FIRST, /* sends `first` and EOF first, then counts what arrives until EOF */
};

struct upstream {
	char path[108];
	enum up_mode mode;
	const char *first; /* UP_FIRST: what it sends before it reads anything */
	size_t first_len;
	int lfd;
	pthread_t th;
	pthread_mutex_t lock;
	pthread_cond_t cond;
	unsigned conns; /* connection threads still running */
	size_t counted; /* UP_FIRST: bytes received by the last connection that ended */
	bool counted_done;
};

struct up_conn {
	struct upstream *u;
	int fd;
};

struct fixture {
	char dir[64];
	char uds[96]; /* the "vsock uds" path; the upstream listens at uds_1026 */
	struct logger log;
	struct egress_proxy p;
	struct upstream up;
	bool up_running, p_running;
};

static int write_all(int fd, const void *buf, size_t len)
{
	const char *b = buf;

	while (len > 0) {
		ssize_t n = send(fd, b, len, MSG_NOSIGNAL);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		b += n;
		len -= (size_t)n;
	}
	return 0;
}

/* Reads until EOF or cap; returns the byte count, or -errno. */
static ssize_t read_until_eof(int fd, char *buf, size_t cap)
{
	size_t got = 0;

	for (;;) {
		ssize_t n = read(fd, buf + got, cap - got);

		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0)
			return -errno;
		if (n == 0 || (got += (size_t)n) == cap)
			return (ssize_t)got;
	}
}

static void *up_conn_thread(void *arg)
{
	struct up_conn c = *(struct up_conn *)arg;
	struct upstream *u = c.u;
	char *buf = malloc(65536);
	size_t total = 0;

	free(arg);
	if (u->mode == UP_FIRST) {
		write_all(c.fd, u->first, u->first_len);
		shutdown(c.fd, SHUT_WR);
	}
	for (;;) {
		ssize_t n = buf ? read(c.fd, buf, 65536) : -1;

		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0)
			break;
		total += (size_t)n;
		if (u->mode == UP_ECHO && write_all(c.fd, buf, (size_t)n) < 0)
			break;
	}
	free(buf);
	close(c.fd);
	pthread_mutex_lock(&u->lock);
	if (u->mode == UP_FIRST) {
		u->counted = total;
		u->counted_done = true;
	}
	u->conns--;
	pthread_cond_broadcast(&u->cond);
	pthread_mutex_unlock(&u->lock);
	return NULL;
}

static void *up_accept_thread(void *arg)
{
	struct upstream *u = arg;

	for (;;) {
		int fd = accept4(u->lfd, NULL, NULL, SOCK_CLOEXEC);
		struct up_conn *c;
		pthread_t th;

		if (fd < 0)
			break; /* shut down by up_stop */
		c = malloc(sizeof(*c));
		assert_non_null(c);
		*c = (struct up_conn){.u = u, .fd = fd};
		pthread_mutex_lock(&u->lock);
		u->conns++;
		pthread_mutex_unlock(&u->lock);
		assert_int_equal(pthread_create(&th, NULL, up_conn_thread, c), 0);
		pthread_detach(th);
	}
	return NULL;
}

static void up_start(struct fixture *f, enum up_mode mode)
{
	struct upstream *u = &f->up;
	struct sockaddr_un sun = {.sun_family = AF_UNIX};

	snprintf(u->path, sizeof(u->path), "%s_1026", f->uds);
	u->mode = mode;
	pthread_mutex_init(&u->lock, NULL);
	pthread_cond_init(&u->cond, NULL);
	strcpy(sun.sun_path, u->path);
	u->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_true(u->lfd >= 0);
	assert_int_equal(bind(u->lfd, (struct sockaddr *)&sun, sizeof(sun)), 0);
	assert_int_equal(listen(u->lfd, 64), 0);
	assert_int_equal(pthread_create(&u->th, NULL, up_accept_thread, u), 0);
	f->up_running = true;
}

static void up_stop(struct fixture *f)
{
	struct upstream *u = &f->up;

	shutdown(u->lfd, SHUT_RDWR);
	pthread_join(u->th, NULL);
	close(u->lfd);
	unlink(u->path);
	pthread_mutex_lock(&u->lock);
	while (u->conns > 0)
		pthread_cond_wait(&u->cond, &u->lock);
	pthread_mutex_unlock(&u->lock);
	pthread_cond_destroy(&u->cond);
	pthread_mutex_destroy(&u->lock);
	f->up_running = false;
}

static void proxy_start(struct fixture *f, unsigned max_relays)
{
	f->p.test_uds = f->uds;
	f->p.port = 0;
	f->p.max_relays = max_relays;
	f->p.log = &f->log;
	assert_int_equal(egress_proxy_start(&f->p), 0);
	assert_true(f->p.port != 0);
	f->p_running = true;
}

static int setup(void **state)
{
	struct fixture *f = calloc(1, sizeof(*f));

	if (!f)
		return -1;
	f->log = (struct logger){.level = LOG_INFO, .out = stderr, .name = "test"};
	snprintf(f->dir, sizeof(f->dir), "/tmp/cove-egress-XXXXXX");
	if (!mkdtemp(f->dir))
		return -1;
	snprintf(f->uds, sizeof(f->uds), "%s/v.sock", f->dir);
	*state = f;
	return 0;
}

static int teardown(void **state)
{
	struct fixture *f = *state;

	if (f->p_running)
		egress_proxy_stop(&f->p);
	if (f->up_running)
		up_stop(f);
	rmdir(f->dir);
	free(f);
	return 0;
}

/* A program's connection to the proxy; reads time out rather than hang the suite. */
static int client_connect(const struct fixture *f)
{
	struct sockaddr_in sin = {.sin_family = AF_INET,
				  .sin_addr.s_addr = htonl(INADDR_LOOPBACK),
				  .sin_port = htons(f->p.port)};
	struct timeval tv = {.tv_sec = 20};
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	assert_true(fd >= 0);
	assert_int_equal(setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv)), 0);
	assert_int_equal(connect(fd, (struct sockaddr *)&sin, sizeof(sin)), 0);
	return fd;
}

/* Waits up to 10 s for a proxy counter to reach want (they change on the proxy's threads). */
static void wait_counter(struct egress_proxy *p, const unsigned long *ctr, unsigned long want)
{
	for (int i = 0; i < 1000; i++) {
		unsigned long v;

		pthread_mutex_lock(&p->lock);
		v = *ctr;
		pthread_mutex_unlock(&p->lock);
		if (v == want)
			return;
		usleep(10000);
	}
	fail_msg("counter stuck, want %lu", want);
}

static void wait_active(struct egress_proxy *p, unsigned want)
{
	for (int i = 0; i < 1000; i++) {
		unsigned v;

		pthread_mutex_lock(&p->lock);
		v = p->active;
		pthread_mutex_unlock(&p->lock);
		if (v == want)
			return;
		usleep(10000);
	}
	fail_msg("active relays stuck, want %u", want);
}

static void fill_pattern(char *buf, size_t len)
{
	uint32_t x = 2463534242u;

	for (size_t i = 0; i < len; i++) {
		x ^= x << 13;
		x ^= x >> 17;
		x ^= x << 5;
		buf[i] = (char)x;
	}
}

struct sender {
	int fd;
	const char *buf;
	size_t len;
	int ret;
};

static void *sender_thread(void *arg)
{
	struct sender *s = arg;

	s->ret = write_all(s->fd, s->buf, s->len);
	if (s->ret == 0)
		s->ret = shutdown(s->fd, SHUT_WR) < 0 ? -errno : 0;
	return NULL;
}

/* 8 MiB through the proxy to an echo upstream and back, written and read at once: every byte
 * intact and in order, and the client's EOF comes back as EOF once the echo has drained. */
static void test_big_echo(void **state)
{
	struct fixture *f = *state;
	char *out = malloc(BIG), *in = malloc(BIG + 1);
	struct sender s;
	pthread_t th;
	int fd;

	assert_non_null(out);
	assert_non_null(in);
	up_start(f, UP_ECHO);
	proxy_start(f, 0);
	fill_pattern(out, BIG);
	fd = client_connect(f);
	s = (struct sender){.fd = fd, .buf = out, .len = BIG};
	assert_int_equal(pthread_create(&th, NULL, sender_thread, &s), 0);
	assert_int_equal(read_until_eof(fd, in, BIG + 1), (ssize_t)BIG);
	pthread_join(th, NULL);
	assert_int_equal(s.ret, 0);
	assert_memory_equal(in, out, BIG);
	close(fd);
	wait_active(&f->p, 0);
	free(out);
	free(in);
}

/* Both half-closes: the upstream speaks and closes its side first; the client then still
 * sends 1 MiB, which arrives whole, and its EOF reaches the upstream. */
static void test_half_close(void **state)
{
	struct fixture *f = *state;
	size_t len = 1u << 20;
	char *out = malloc(len), buf[16];
	int fd;

	assert_non_null(out);
	f->up.first = "hello";
	f->up.first_len = 5;
	up_start(f, UP_FIRST);
	proxy_start(f, 0);
	fd = client_connect(f);
	/* The upstream's EOF arrives while the client's direction stays open. */
	assert_int_equal(read_until_eof(fd, buf, sizeof(buf)), 5);
	assert_memory_equal(buf, "hello", 5);
	fill_pattern(out, len);
	assert_int_equal(write_all(fd, out, len), 0);
	assert_int_equal(shutdown(fd, SHUT_WR), 0);
	pthread_mutex_lock(&f->up.lock);
	while (!f->up.counted_done)
		pthread_cond_wait(&f->up.cond, &f->up.lock);
	assert_int_equal(f->up.counted, len);
	pthread_mutex_unlock(&f->up.lock);
	close(fd);
	wait_active(&f->p, 0);
	free(out);
}

/* The upstream writes 4 MiB before it reads a byte, while the client writes 4 MiB (and reads
 * at the same time). A relay that blocks on one direction would stall here: the upstream
 * finishes only if the relay keeps moving its bytes while the client's wait. */
static void test_directions_independent(void **state)
{
	struct fixture *f = *state;
	size_t len = 4u << 20;
	char *down = malloc(len), *up = malloc(len), *in = malloc(len + 1);
	struct sender s;
	pthread_t th;
	int fd;

	assert_non_null(down);
	assert_non_null(up);
	assert_non_null(in);
	fill_pattern(down, len);
	for (size_t i = 0; i < len; i++)
		up[i] = (char)(down[len - 1 - i] ^ 0x5a);
	f->up.first = down;
	f->up.first_len = len;
	up_start(f, UP_FIRST);
	proxy_start(f, 0);
	fd = client_connect(f);
	s = (struct sender){.fd = fd, .buf = up, .len = len};
	assert_int_equal(pthread_create(&th, NULL, sender_thread, &s), 0);
	assert_int_equal(read_until_eof(fd, in, len + 1), (ssize_t)len);
	assert_memory_equal(in, down, len);
	pthread_join(th, NULL);
	assert_int_equal(s.ret, 0);
	pthread_mutex_lock(&f->up.lock);
	while (!f->up.counted_done)
		pthread_cond_wait(&f->up.cond, &f->up.lock);
	assert_int_equal(f->up.counted, len);
	pthread_mutex_unlock(&f->up.lock);
	close(fd);
	wait_active(&f->p, 0);
	free(down);
	free(up);
	free(in);
}

static void echo_once(int fd, char c)
{
	char got = 0;

	assert_int_equal(write_all(fd, &c, 1), 0);
	assert_int_equal(read(fd, &got, 1), 1);
	assert_int_equal(got, c);
}

/* At most max_relays at once: one more is closed at once; a freed slot serves the next. */
static void test_relay_cap(void **state)
{
	struct fixture *f = *state;
	int fds[4], extra, late;
	char c;

	up_start(f, UP_ECHO);
	proxy_start(f, 4);
	for (int i = 0; i < 4; i++) {
		fds[i] = client_connect(f);
		echo_once(fds[i], (char)('a' + i));
	}
	extra = client_connect(f);
	/* Closed by the proxy without a byte: EOF (or a reset, had we written first). */
	assert_true(read(extra, &c, 1) <= 0);
	close(extra);
	wait_counter(&f->p, &f->p.refused, 1);
	for (int i = 0; i < 4; i++)
		echo_once(fds[i], 'z'); /* the four are unharmed */
	close(fds[0]);
	wait_active(&f->p, 3);
	late = client_connect(f);
	echo_once(late, 'L');
	close(late);
	for (int i = 1; i < 4; i++)
		close(fds[i]);
	wait_active(&f->p, 0);
	pthread_mutex_lock(&f->p.lock);
	assert_int_equal(f->p.accepted, 6);
	assert_int_equal(f->p.refused, 1);
	pthread_mutex_unlock(&f->p.lock);
}

/* Nothing listens on the host port: the program's connection is closed, nothing is left open. */
static void test_upstream_refused(void **state)
{
	struct fixture *f = *state;
	char c;
	int fd;

	proxy_start(f, 0);
	fd = client_connect(f);
	assert_true(read(fd, &c, 1) <= 0);
	close(fd);
	wait_counter(&f->p, &f->p.upstream_failed, 1);
	wait_active(&f->p, 0);
}

/* Many short connections at once, each with its own payload: no cross-talk between relays. */
static void test_many_parallel(void **state)
{
	struct fixture *f = *state;
	enum { N = 32 };
	int fds[N];

	up_start(f, UP_ECHO);
	proxy_start(f, 0);
	for (int i = 0; i < N; i++)
		fds[i] = client_connect(f);
	for (int i = 0; i < N; i++) {
		char msg[32];

		snprintf(msg, sizeof(msg), "conn %02d", i);
		assert_int_equal(write_all(fds[i], msg, strlen(msg)), 0);
		assert_int_equal(shutdown(fds[i], SHUT_WR), 0);
	}
	for (int i = N - 1; i >= 0; i--) {
		char want[32], got[64];

		snprintf(want, sizeof(want), "conn %02d", i);
		assert_int_equal(read_until_eof(fds[i], got, sizeof(got)), (ssize_t)strlen(want));
		assert_memory_equal(got, want, strlen(want));
		close(fds[i]);
	}
	wait_active(&f->p, 0);
}

static const char *env_get(char **env, const char *name)
{
	size_t n = strlen(name);

	for (size_t i = 0; env[i]; i++)
		if (strncmp(env[i], name, n) == 0 && env[i][n] == '=')
			return env[i] + n + 1;
	return NULL;
}

static size_t env_count(char **env, const char *name)
{
	size_t n = strlen(name), c = 0;

	for (size_t i = 0; env[i]; i++)
		c += strncmp(env[i], name, n) == 0 && env[i][n] == '=';
	return c;
}

/* Exec sessions: the proxy variables by default; an explicit request entry wins, per name. */
static void test_exec_env(void **state)
{
	struct pw_ent pw = {
	    .uid = 1000, .gid = 1000, .name = "u", .home = "/home/u", .shell = "/bin/sh"};
	struct exec_req r = {.argv = {"true", NULL}, .env = {NULL}};
	static const char *const proxies[] = {"http_proxy", "https_proxy", "HTTP_PROXY",
					      "HTTPS_PROXY"};
	char **env;

	(void)state;
	env = exec_env_build(&r, &pw, 3128);
	assert_non_null(env);
	for (size_t i = 0; i < 4; i++)
		assert_string_equal(env_get(env, proxies[i]), "http://127.0.0.1:3128");
	assert_string_equal(env_get(env, "no_proxy"), "localhost,127.0.0.1,::1");
	assert_string_equal(env_get(env, "NO_PROXY"), "localhost,127.0.0.1,::1");
	assert_string_equal(env_get(env, "HOME"), "/home/u");
	exec_env_free(env);

	r.env[0] = "http_proxy=http://10.0.0.1:8080";
	r.env[1] = "NO_PROXY=";
	r.env[2] = "FOO=bar";
	r.env[3] = NULL;
	env = exec_env_build(&r, &pw, 40000);
	assert_non_null(env);
	assert_string_equal(env_get(env, "http_proxy"), "http://10.0.0.1:8080");
	assert_int_equal(env_count(env, "http_proxy"), 1);
	assert_string_equal(env_get(env, "NO_PROXY"), "");
	assert_int_equal(env_count(env, "NO_PROXY"), 1);
	assert_string_equal(env_get(env, "https_proxy"), "http://127.0.0.1:40000");
	assert_string_equal(env_get(env, "no_proxy"), "localhost,127.0.0.1,::1");
	assert_string_equal(env_get(env, "FOO"), "bar");
	exec_env_free(env);
}

/* A full request env (256 entries, none of them defaults) still fits beside every default. */
static void test_exec_env_full(void **state)
{
	struct pw_ent pw = {.name = "root", .home = "/root", .shell = "/bin/sh"};
	static char vars[EXEC_ARGS_MAX][16];
	struct exec_req r = {.argv = {"true", NULL}};
	char **env;
	size_t n = 0;

	(void)state;
	for (int i = 0; i < EXEC_ARGS_MAX; i++) {
		snprintf(vars[i], sizeof(vars[i]), "V%d=%d", i, i);
		r.env[i] = vars[i];
	}
	r.env[EXEC_ARGS_MAX] = NULL;
	env = exec_env_build(&r, &pw, 3128);
	assert_non_null(env);
	while (env[n])
		n++;
	/* The trust variables name files this machine may or may not have (ca_env.c). */
	size_t ca = 0;
	char var[128];
	for (unsigned i = 0; i < CA_ENV_COUNT; i++)
		ca += ca_env_entry(i, var, sizeof(var)) == 0;
	assert_int_equal(n, 6 + EGRESS_ENV_COUNT + ca + EXEC_ARGS_MAX);
	if (access("/etc/ssl/certs/ca-certificates.crt", R_OK) == 0)
		assert_string_equal(env_get(env, "SSL_CERT_FILE"),
				    "/etc/ssl/certs/ca-certificates.crt");
	assert_string_equal(env_get(env, "V255"), "255");
	assert_string_equal(env_get(env, "HTTPS_PROXY"), "http://127.0.0.1:3128");
	exec_env_free(env);
}

/* PID 1's own environment (the sandbox command's): defaults only where a boot parameter did
 * not set the variable already. */
static void test_setdefault(void **state)
{
	char buf[8];

	(void)state;
	assert_int_equal(setenv("https_proxy", "http://boot:1", 1), 0);
	unsetenv("http_proxy");
	unsetenv("NO_PROXY");
	assert_int_equal(egress_env_setdefault(3128), 0);
	assert_string_equal(getenv("https_proxy"), "http://boot:1");
	assert_string_equal(getenv("http_proxy"), "http://127.0.0.1:3128");
	assert_string_equal(getenv("NO_PROXY"), "localhost,127.0.0.1,::1");
	assert_int_equal(egress_env_entry(EGRESS_ENV_COUNT, 3128, buf, sizeof(buf)), -ENOENT);
	assert_int_equal(egress_env_entry(0, 3128, buf, sizeof(buf)), -ENOSPC);
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test_setup_teardown(test_big_echo, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_half_close, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_directions_independent, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_relay_cap, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_upstream_refused, setup, teardown),
	    cmocka_unit_test_setup_teardown(test_many_parallel, setup, teardown),
	    cmocka_unit_test(test_exec_env),
	    cmocka_unit_test(test_exec_env_full),
	    cmocka_unit_test(test_setdefault),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
