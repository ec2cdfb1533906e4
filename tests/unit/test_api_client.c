/* Unit tests for cli/api_client: the request it sends and how it takes hostile or odd replies. */
#include "helpers.h"

#include <pthread.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "cli/api_client.h"

struct fake {
	int lfd;
	const char *reply; /* written after the request; NULL: a 2 MiB body */
	bool hold;	   /* keep the connection open without answering */
	char req[2048];
};

static void *serve_one(void *arg)
{
	struct fake *f = arg;
	int c = accept(f->lfd, NULL, NULL);
	size_t got = 0;
	if (c < 0)
		return NULL;
	/* The request: its head, then as many body bytes as Content-Length says. */
	for (;;) {
		ssize_t n = read(c, f->req + got, sizeof(f->req) - 1 - got);
		if (n <= 0)
			break;
		got += (size_t)n;
		f->req[got] = 0;
		char *end = strstr(f->req, "\r\n\r\n");
		char *cl = strcasestr(f->req, "Content-Length: ");
		if (end && cl && got >= (size_t)(end + 4 - f->req) + strtoul(cl + 16, NULL, 10))
			break;
	}
	if (f->hold) {
		char b;
		while (read(c, &b, 1) > 0)
			;
	} else if (f->reply) {
		(void)!send(c, f->reply, strlen(f->reply), MSG_NOSIGNAL);
	} else {
		const char *h = "HTTP/1.1 200 OK\r\nContent-Length: 2097152\r\n\r\n";
		static const char zeros[65536];
		(void)!send(c, h, strlen(h), MSG_NOSIGNAL);
		for (int i = 0; i < 32; i++)
			if (send(c, zeros, sizeof(zeros), MSG_NOSIGNAL) < 0)
				break;
	}
	close(c);
	return NULL;
}

static void with_server(struct fake *f, char *path, size_t len, pthread_t *th)
{
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	snprintf(path, len, "/tmp/cove-api-client-%d", (int)getpid());
	unlink(path);
	f->lfd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	assert_true(f->lfd >= 0);
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
	assert_int_equal(bind(f->lfd, (struct sockaddr *)&sa, sizeof(sa)), 0);
	assert_int_equal(listen(f->lfd, 1), 0);
	assert_int_equal(pthread_create(th, NULL, serve_one, f), 0);
}

static void done(struct fake *f, const char *path, pthread_t th)
{
	pthread_join(th, NULL);
	close(f->lfd);
	unlink(path);
}

static int call(struct fake *f, const char *method, const char *body, long timeout, long *status,
		char **reply, char *err)
{
	char path[64];
	pthread_t th;
	with_server(f, path, sizeof(path), &th);
	int r = api_call(path, method, "/vm", body, timeout, status, reply, err, 256);
	done(f, path, th);
	return r;
}

static void test_request_and_reply(void **state)
{
	(void)state;
	struct fake f = {.reply = "HTTP/1.1 400 Bad Request\r\nContent-Length: 27\r\n\r\n"
				  "{\"fault_message\":\"no such\"}"};
	long status = 0;
	char *reply = NULL, err[256] = "", text[64];
	assert_int_equal(call(&f, "PATCH", "{\"state\":\"Paused\"}", 120, &status, &reply, err), 0);
	assert_int_equal(status, 400);
	assert_string_equal(reply, "{\"fault_message\":\"no such\"}");
	api_fault_text(reply, text, sizeof(text));
	assert_string_equal(text, "no such");
	assert_non_null(strstr(f.req, "PATCH /vm HTTP/1.1\r\n"));
	assert_non_null(strstr(f.req, "Content-Length: 18\r\n"));
	assert_non_null(strstr(f.req, "\r\n\r\n{\"state\":\"Paused\"}"));
	free(reply);
}

static void test_chunked_and_close_delimited(void **state)
{
	(void)state;
	struct fake f = {.reply = "HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
				  "3\r\nabc\r\n2\r\nde\r\n0\r\n\r\n"};
	long status = 0;
	char *reply = NULL, err[256] = "";
	assert_int_equal(call(&f, "GET", NULL, 120, &status, &reply, err), 0);
	assert_int_equal(status, 200);
	assert_string_equal(reply, "abcde");
	assert_non_null(strstr(f.req, "GET /vm HTTP/1.1\r\n"));
	assert_non_null(strstr(f.req, "Content-Length: 0\r\n"));
	free(reply);
	/* No length: the body ends where the peer closes. */
	struct fake g = {.reply = "HTTP/1.1 204 No Content\r\n\r\n"};
	assert_int_equal(call(&g, "PUT", "{}", 120, &status, &reply, err), 0);
	assert_int_equal(status, 204);
	assert_string_equal(reply, "");
	free(reply);
}

static void test_hostile_replies(void **state)
{
	(void)state;
	long status = 7;
	char *reply = (char *)"x", err[256] = "";
	struct fake big = {.reply = NULL};
	assert_int_equal(call(&big, "GET", NULL, 120, &status, &reply, err), -ECONNREFUSED);
	assert_non_null(strstr(err, "reply too large"));
	assert_null(reply);
	assert_int_equal(status, 0);
	struct fake junk = {.reply = "SMTP ready\r\n\r\n"};
	assert_int_equal(call(&junk, "GET", NULL, 120, &status, &reply, err), -ECONNREFUSED);
	assert_non_null(strstr(err, "bad reply"));
	struct fake cut = {.reply = "HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nabc"};
	assert_int_equal(call(&cut, "GET", NULL, 120, &status, &reply, err), -ECONNREFUSED);
	assert_non_null(strstr(err, "GET /vm on /tmp/cove-api-client-"));
	struct fake silent = {.hold = true};
	assert_int_equal(call(&silent, "GET", NULL, 1, &status, &reply, err), -ETIMEDOUT);
	assert_non_null(strstr(err, "no reply in time"));
	assert_int_equal(api_call("/nonexistent/api.sock", "GET", "/vm", NULL, 1, &status, &reply,
				  err, sizeof(err)),
			 -ECONNREFUSED);
	assert_non_null(strstr(err, "/nonexistent/api.sock"));
}

int main(void)
{
	const struct CMUnitTest tests[] = {
	    cmocka_unit_test(test_request_and_reply),
	    cmocka_unit_test(test_chunked_and_close_delimited),
	    cmocka_unit_test(test_hostile_replies),
	};
	return cmocka_run_group_tests(tests, NULL, NULL);
}
