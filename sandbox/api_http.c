/* Control API transport: libmicrohttpd serving HTTP/1.1 on a Unix socket from the event loop thread. */
#include "sandbox/api.h"
#include "vmm/evloop.h"

#include <errno.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <unistd.h>

#include <jansson.h>
#include <microhttpd.h>

/* Same cap as api_handle's, enforced here before the body is read. */
#define API_HTTP_MAX_URL 256

#define API_HTTP_MAX_CONNECTIONS 16
#define API_HTTP_IDLE_TIMEOUT_S 10
#define API_HTTP_CONN_MEMORY ((size_t)64 * 1024)
/* An oversized chunked body is read and dropped up to here, then the connection is cut. */
#define API_HTTP_MAX_DISCARD ((size_t)1024 * 1024)

struct api_server {
	struct api_backend be; /* copied so callers may build it on the stack */
	struct evloop *loop;
	struct MHD_Daemon *mhd;
	int listen_fd; /* owned by MHD while mhd is running */
	int mhd_epfd;  /* owned by MHD */
	int timer_fd;
	dev_t sock_dev; /* identify our socket file so stop never unlinks a successor's */
	ino_t sock_ino;
	char *sock_path;
};

/* Per-request state, MHD's con_cls. */
struct api_conn {
	char *buf;
	size_t len;
	size_t cap;
	size_t discarded; /* bytes of an oversized chunked body, counted for the 413 message */
	bool oversized;   /* body exceeded API_MAX_BODY; the rest is counted, not kept */
	bool answered;    /* a response is already queued */
};

/* Takes ownership of resp->body. */
static enum MHD_Result queue_json(struct MHD_Connection *c, struct api_response *resp)
{
	struct MHD_Response *r;
	bool has_body = resp->body != NULL;

	if (has_body)
		r = MHD_create_response_from_buffer(strlen(resp->body), resp->body,
						    MHD_RESPMEM_MUST_FREE);
	else
		r = MHD_create_response_from_buffer(0, NULL, MHD_RESPMEM_PERSISTENT);
	if (!r) {
		free(resp->body);
		return MHD_NO;
	}
	resp->body = NULL; /* the response frees it now */
	if (has_body &&
	    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "application/json") != MHD_YES) {
		MHD_destroy_response(r);
		return MHD_NO;
	}
	enum MHD_Result ret = MHD_queue_response(c, (unsigned int)resp->status, r);
	MHD_destroy_response(r);
	return ret;
}

/*
 * Answers through api_handle even for transport-level refusals, so every
 * fault body has the same shape.  A NULL body with an oversized length makes
 * it reply 413 without looking at the body.
 */
static enum MHD_Result answer(struct api_server *srv, struct MHD_Connection *c,
			      struct api_conn *conn, const char *method, const char *url,
			      const char *body, size_t len)
{
	struct api_response resp;

	api_handle(&srv->be, method, url, body, len, &resp);
	conn->answered = true;
	return queue_json(c, &resp);
}

/* The announced body size, or 0 when there is none (chunked or no body). */
static size_t content_length(struct MHD_Connection *c)
{
	const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND,
						     MHD_HTTP_HEADER_CONTENT_LENGTH);
	if (!cl)
		return 0;
	/* MHD has already rejected a malformed Content-Length; only the size matters here. */
	unsigned long long v = strtoull(cl, NULL, 10);
	return v > SIZE_MAX ? SIZE_MAX : (size_t)v;
}

static int conn_append(struct api_conn *conn, const char *data, size_t size)
{
	if (conn->len + size > conn->cap) {
		size_t cap = conn->cap ? conn->cap : 1024;
		while (cap < conn->len + size)
			cap *= 2;
		if (cap > API_MAX_BODY)
			cap = API_MAX_BODY;
		char *nb = realloc(conn->buf, cap);
		if (!nb)
			return -ENOMEM;
		conn->buf = nb;
		conn->cap = cap;
	}
	memcpy(conn->buf + conn->len, data, size);
	conn->len += size;
	return 0;
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url,
				  const char *method, const char *version, const char *upload_data,
				  size_t *upload_data_size, void **con_cls)
{
	struct api_server *srv = cls;
	struct api_conn *conn = *con_cls;

	(void)version;
	if (!conn) {
		conn = calloc(1, sizeof(*conn));
		if (!conn)
			return MHD_NO;
		*con_cls = conn;
		/*
		 * Refuse before reading any body, so a client sending
		 * "Expect: 100-continue" never gets invited to upload it.
		 */
		if (strnlen(url, API_HTTP_MAX_URL + 1) > API_HTTP_MAX_URL)
			return answer(srv, c, conn, method, url, NULL, 0);
		size_t announced = content_length(c);
		if (announced > API_MAX_BODY)
			return answer(srv, c, conn, method, url, NULL, announced);
		return MHD_YES;
	}

	if (*upload_data_size) {
		size_t size = *upload_data_size;
		*upload_data_size = 0;
		if (conn->answered)
			return MHD_YES;
		if (!conn->oversized && size > API_MAX_BODY - conn->len) {
			/*
			 * Chunked uploads have no Content-Length to refuse up
			 * front, and MHD 0.9.75 refuses MHD_queue_response
			 * mid-upload; drop what we hold and count the rest.
			 */
			conn->oversized = true;
			conn->discarded = conn->len;
			free(conn->buf);
			conn->buf = NULL;
			conn->len = conn->cap = 0;
		}
		if (conn->oversized) {
			conn->discarded += size;
			return conn->discarded > API_HTTP_MAX_DISCARD ? MHD_NO : MHD_YES;
		}
		if (conn_append(conn, upload_data, size) < 0)
			return MHD_NO;
		return MHD_YES;
	}

	if (conn->answered)
		return MHD_YES;
	if (conn->oversized)
		return answer(srv, c, conn, method, url, NULL, conn->discarded);
	return answer(srv, c, conn, method, url, conn->buf, conn->len);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls,
			 enum MHD_RequestTerminationCode toe)
{
	struct api_conn *conn = *con_cls;

	(void)cls;
	(void)c;
	(void)toe;
	if (!conn)
		return;
	free(conn->buf);
	free(conn);
	*con_cls = NULL;
}

/*
 * MHD must also run when nothing is readable: idle timeouts, and requests
 * it has buffered but not yet processed.  A timerfd in the same loop keeps
 * the loop free of per-handler timeouts.
 */
static void rearm_timer(struct api_server *srv)
{
	MHD_UNSIGNED_LONG_LONG ms;
	struct itimerspec its = { 0 };

	if (MHD_get_timeout(srv->mhd, &ms) == MHD_YES) {
		if (ms == 0) {
			its.it_value.tv_nsec = 1; /* zero would disarm */
		} else {
			its.it_value.tv_sec = (time_t)(ms / 1000);
			its.it_value.tv_nsec = (long)(ms % 1000) * 1000000L;
		}
	}
	/* Only fails for bad arguments, which these are not. */
	(void)timerfd_settime(srv->timer_fd, 0, &its, NULL);
}

static void on_mhd_ready(void *opaque, uint32_t events)
{
	struct api_server *srv = opaque;

	(void)events;
	MHD_run(srv->mhd);
	rearm_timer(srv);
}

static void on_timer(void *opaque, uint32_t events)
{
	struct api_server *srv = opaque;
	uint64_t expirations;

	(void)events;
	/* EAGAIN: on_mhd_ready rearmed it earlier in this batch; running MHD is harmless anyway. */
	(void)!read(srv->timer_fd, &expirations, sizeof(expirations));
	MHD_run(srv->mhd);
	rearm_timer(srv);
}

/* Removes a leftover socket from a previous run; refuses to clobber anything else. */
static int remove_stale_socket(const char *path)
{
	struct stat st;

	if (lstat(path, &st) < 0)
		return errno == ENOENT ? 0 : -errno;
	if (!S_ISSOCK(st.st_mode))
		return -EEXIST;
	if (unlink(path) < 0 && errno != ENOENT)
		return -errno;
	return 0;
}

static int listen_unix(struct api_server *srv, const char *path)
{
	struct sockaddr_un addr = { .sun_family = AF_UNIX };
	struct stat st;
	int fd, ret;

	if (strlen(path) >= sizeof(addr.sun_path))
		return -ENAMETOOLONG;
	strcpy(addr.sun_path, path);

	ret = remove_stale_socket(path);
	if (ret < 0)
		return ret;

	fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd < 0)
		return -errno;
	if (bind(fd, (struct sockaddr *)&addr, sizeof(addr)) < 0) {
		ret = -errno;
		goto err_close;
	}
	/* Nobody can connect before listen(), so tightening the mode here leaves no window. */
	if (chmod(path, 0600) < 0 || lstat(path, &st) < 0) {
		ret = -errno;
		goto err_unlink;
	}
	if (listen(fd, API_HTTP_MAX_CONNECTIONS) < 0) {
		ret = -errno;
		goto err_unlink;
	}
	srv->listen_fd = fd;
	srv->sock_dev = st.st_dev;
	srv->sock_ino = st.st_ino;
	return 0;

err_unlink:
	unlink(path);
err_close:
	close(fd);
	return ret;
}

static void unlink_own_socket(struct api_server *srv)
{
	struct stat st;

	if (lstat(srv->sock_path, &st) == 0 && st.st_dev == srv->sock_dev &&
	    st.st_ino == srv->sock_ino)
		unlink(srv->sock_path);
}

/* Stops MHD but keeps the listen socket out of its hands, since MHD closes what it holds. */
static void stop_mhd(struct api_server *srv)
{
	MHD_socket fd = MHD_quiesce_daemon(srv->mhd);

	MHD_stop_daemon(srv->mhd);
	srv->mhd = NULL;
	if (fd != MHD_INVALID_SOCKET)
		close(fd);
	srv->listen_fd = -1;
}

int api_server_start(struct api_server **out, const char *sock_path, const struct api_backend *be,
		     struct evloop *loop)
{
	struct api_server *srv;
	int ret;

	/* We install no SIGPIPE handler; a peer hanging up mid-reply must not kill the VMM. */
	if (MHD_is_feature_supported(MHD_FEATURE_AUTOSUPPRESS_SIGPIPE) != MHD_YES)
		return -ENOTSUP;

	srv = calloc(1, sizeof(*srv));
	if (!srv)
		return -ENOMEM;
	srv->be = *be;
	srv->loop = loop;
	srv->listen_fd = srv->timer_fd = srv->mhd_epfd = -1;
	srv->sock_path = strdup(sock_path);
	if (!srv->sock_path) {
		ret = -ENOMEM;
		goto err_free;
	}

	ret = listen_unix(srv, sock_path);
	if (ret < 0)
		goto err_free;

	srv->timer_fd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
	if (srv->timer_fd < 0) {
		ret = -errno;
		goto err_listen;
	}

	/* No internal thread: everything runs from our loop, on the loop thread. */
	srv->mhd = MHD_start_daemon(MHD_USE_EPOLL, 0, NULL, NULL, on_request, srv,
				    MHD_OPTION_LISTEN_SOCKET, (MHD_socket)srv->listen_fd,
				    MHD_OPTION_NOTIFY_COMPLETED, on_completed, srv,
				    MHD_OPTION_CONNECTION_LIMIT, (unsigned int)API_HTTP_MAX_CONNECTIONS,
				    MHD_OPTION_CONNECTION_TIMEOUT, (unsigned int)API_HTTP_IDLE_TIMEOUT_S,
				    MHD_OPTION_CONNECTION_MEMORY_LIMIT, API_HTTP_CONN_MEMORY,
				    MHD_OPTION_END);
	if (!srv->mhd) {
		/* MHD 0.9.75 leaves a caller's listen socket open when it fails to start. */
		ret = -EIO; /* MHD reports no reason without an error log */
		goto err_timer;
	}

	const union MHD_DaemonInfo *info = MHD_get_daemon_info(srv->mhd, MHD_DAEMON_INFO_EPOLL_FD);
	if (!info) {
		ret = -EIO;
		goto err_mhd;
	}
	srv->mhd_epfd = info->epoll_fd;

	ret = evloop_add(loop, srv->mhd_epfd, EPOLLIN, on_mhd_ready, srv);
	if (ret < 0)
		goto err_mhd;
	ret = evloop_add(loop, srv->timer_fd, EPOLLIN, on_timer, srv);
	if (ret < 0)
		goto err_del_mhd;
	rearm_timer(srv);

	*out = srv;
	return 0;

err_del_mhd:
	evloop_del(loop, srv->mhd_epfd);
err_mhd:
	stop_mhd(srv);
err_timer:
	close(srv->timer_fd);
err_listen:
	if (srv->listen_fd >= 0)
		close(srv->listen_fd);
	unlink_own_socket(srv);
err_free:
	free(srv->sock_path);
	free(srv);
	return ret;
}

/* Call on the loop thread, or with the loop not running: it edits the loop's handler table. */
void api_server_stop(struct api_server *srv)
{
	if (!srv)
		return;
	evloop_del(srv->loop, srv->timer_fd);
	evloop_del(srv->loop, srv->mhd_epfd);
	stop_mhd(srv);
	close(srv->timer_fd);
	unlink_own_socket(srv);
	free(srv->sock_path);
	free(srv);
}
