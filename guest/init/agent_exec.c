/* agent_exec.c: exec sessions: spawn (pipes or a pty), output queue, attach/detach, exit. */
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <termios.h>
#include <unistd.h>

#include "agent.h"
#include "chunk_queue.h"

/* After the command exits, output still in flight gets this long of silence to arrive (a daemon
 * it left behind may hold the pipe open forever). */
#define DRAIN_IDLE_MS 200

/* Everything below is guarded by agent.lock. */
struct session {
	struct session *next;
	struct agent *ag;
	char id[16];
	char argv0[64];
	pid_t pid;
	bool tty;
	int in_fd;  /* stdin pipe or pty master (dup); -1 once closed */
	int out_fd; /* stdout pipe or pty master */
	int err_fd; /* stderr pipe; -1 for a tty */
	struct chunk_queue out; /* output waiting for a host to read it */
	bool exited, out_done, delivered;
	int wstatus;
	unsigned attach_gen; /* bumped at each attach and detach */
	int attached_fd;     /* the host connection reading this session, or -1 */
	int refs;
	pthread_cond_t cond;
};

struct writer_arg {
	struct session *s;
	int fd;
	unsigned gen;
};

static void session_put_locked(struct session *s)
{
	if (--s->refs > 0)
		return;
	chunkq_clear(&s->out);
	if (s->in_fd >= 0)
		close(s->in_fd);
	pthread_cond_destroy(&s->cond);
	free(s);
}

static void session_unlink_locked(struct session *s)
{
	struct agent *ag = s->ag;

	for (struct session **pp = &ag->sessions; *pp; pp = &(*pp)->next) {
		if (*pp == s) {
			*pp = s->next;
			ag->nsessions--;
			session_put_locked(s);
			return;
		}
	}
}

static struct session *session_find_locked(struct agent *ag, const char *id)
{
	for (struct session *s = ag->sessions; s; s = s->next)
		if (strcmp(s->id, id) == 0)
			return s;
	return NULL;
}

void exec_child_exited(struct agent *ag, pid_t pid, int wstatus)
{
	pthread_mutex_lock(&ag->lock);
	for (struct session *s = ag->sessions; s; s = s->next) {
		if (s->pid == pid && !s->exited) {
			s->exited = true;
			s->wstatus = wstatus;
			pthread_cond_broadcast(&s->cond);
			break;
		}
	}
	pthread_mutex_unlock(&ag->lock);
}

json_t *exec_sessions_json(struct agent *ag)
{
	json_t *a = json_array();

	pthread_mutex_lock(&ag->lock);
	for (struct session *s = ag->sessions; a && s; s = s->next)
		json_array_append_new(a, json_pack("{s:s,s:i,s:s,s:b,s:b,s:b}", "id", s->id, "pid",
						   (int)s->pid, "argv0", s->argv0, "running",
						   !s->exited, "tty", s->tty, "attached",
						   s->attached_fd >= 0));
	pthread_mutex_unlock(&ag->lock);
	return a;
}

/* --- output pump: child -> queue ------------------------------------------------------- */

/* Nobody reading and the buffer full: the command blocks on its next write, as with a stopped
 * terminal, rather than output being lost. */
static void enqueue(struct session *s, uint8_t type, const void *buf, size_t len)
{
	chunkq_push(&s->out, &s->ag->lock, &s->cond, AGENT_QUEUE_MAX, type, buf, len);
}

static void *pump_thread(void *arg)
{
	struct session *s = arg;
	struct agent *ag = s->ag;
	int fds[2] = {s->out_fd, s->err_fd};
	uint8_t types[2] = {WIRE_STDOUT, WIRE_STDERR};
	char *buf = malloc(AGENT_CHUNK);

	for (;;) {
		struct pollfd p[2];
		int n = 0, idx[2], r;
		bool exited;

		for (int i = 0; i < 2; i++) {
			if (fds[i] < 0)
				continue;
			p[n].fd = fds[i];
			p[n].events = POLLIN;
			idx[n++] = i;
		}
		pthread_mutex_lock(&ag->lock);
		exited = s->exited;
		if (n == 0) {
			/* Both streams ended: the exit status is all that remains. */
			while (!s->exited)
				pthread_cond_wait(&s->cond, &ag->lock);
			pthread_mutex_unlock(&ag->lock);
			break;
		}
		pthread_mutex_unlock(&ag->lock);
		r = poll(p, (nfds_t)n, exited ? DRAIN_IDLE_MS : DRAIN_IDLE_MS * 5);
		if (r < 0 && errno == EINTR)
			continue;
		if (r == 0 && exited)
			break;
		for (int k = 0; k < n && r > 0; k++) {
			int i = idx[k];
			ssize_t got;

			if (!p[k].revents)
				continue;
			got = buf ? read(fds[i], buf, AGENT_CHUNK) : -1;
			if (got < 0 && (errno == EINTR || errno == EAGAIN))
				continue;
			if (got <= 0) { /* EOF, or EIO from a pty whose last slave closed */
				close(fds[i]);
				fds[i] = -1;
				continue;
			}
			enqueue(s, types[i], buf, (size_t)got);
		}
	}
	for (int i = 0; i < 2; i++)
		if (fds[i] >= 0)
			close(fds[i]);
	free(buf);
	pthread_mutex_lock(&ag->lock);
	s->out_done = true;
	pthread_cond_broadcast(&s->cond);
	session_put_locked(s);
	pthread_mutex_unlock(&ag->lock);
	return NULL;
}

/* --- writer: queue -> the attached host ------------------------------------------------- */

static int send_exit(int fd, int wstatus)
{
	int code = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : -1;
	int sig = WIFSIGNALED(wstatus) ? WTERMSIG(wstatus) : 0;
	char buf[64];
	int n = snprintf(buf, sizeof(buf), "{\"exit_code\":%d,\"signal\":%d}", code, sig);

	return wire_data_write(fd, WIRE_EXIT, buf, (size_t)n);
}

static void *writer_thread(void *arg)
{
	struct writer_arg *w = arg;
	struct session *s = w->s;
	struct agent *ag = s->ag;

	pthread_mutex_lock(&ag->lock);
	for (;;) {
		struct chunk *c;
		int ret;

		while (s->attach_gen == w->gen && !s->out.head && !(s->out_done && s->exited))
			pthread_cond_wait(&s->cond, &ag->lock);
		if (s->attach_gen != w->gen)
			break;
		if (!s->out.head) {
			int wstatus = s->wstatus;

			pthread_mutex_unlock(&ag->lock);
			ret = send_exit(w->fd, wstatus);
			pthread_mutex_lock(&ag->lock);
			if (ret == 0 && !s->delivered) {
				s->delivered = true;
				session_unlink_locked(s);
			}
			break;
		}
		c = chunkq_pop_locked(&s->out);
		pthread_cond_broadcast(&s->cond); /* room for the pump */
		pthread_mutex_unlock(&ag->lock);
		ret = wire_data_write(w->fd, c->type, c->data, c->len);
		pthread_mutex_lock(&ag->lock);
		if (ret < 0) {
			/* The host went away: keep the chunk for whoever attaches next. */
			chunkq_unpop_locked(&s->out, c);
			if (s->attach_gen == w->gen) {
				s->attach_gen++;
				s->attached_fd = -1;
			}
			break;
		}
		free(c);
	}
	pthread_mutex_unlock(&ag->lock);
	return NULL;
}

/* --- host input: stdin, signals, window size -------------------------------------------- */

/*
 * stdin goes through a queue and its own thread, so a command that does not read its stdin
 * never holds up the connection's signal and window-size frames. The session's stdin fd is
 * non-blocking; a write waits with poll and gives up once the host has gone.
 */
struct stdin_feed {
	struct session *s;
	pthread_cond_t cond;
	struct chunk_queue q;
	bool stop; /* the host connection ended */
};

#define STDIN_QUEUE_MAX (1u << 20)

static void feed_write(struct stdin_feed *f, int fd, const uint8_t *buf, size_t len)
{
	struct agent *ag = f->s->ag;

	while (len > 0) {
		ssize_t n = write(fd, buf, len);
		struct pollfd p = {.fd = fd, .events = POLLOUT};
		bool stop;

		if (n > 0) {
			buf += n;
			len -= (size_t)n;
			continue;
		}
		if (n < 0 && errno == EINTR)
			continue;
		if (n < 0 && errno != EAGAIN)
			return; /* the command closed its stdin: the bytes are dropped */
		pthread_mutex_lock(&ag->lock);
		stop = f->stop;
		pthread_mutex_unlock(&ag->lock);
		if (stop)
			return;
		poll(&p, 1, 200);
	}
}

static void *stdin_thread(void *arg)
{
	struct stdin_feed *f = arg;
	struct session *s = f->s;
	struct agent *ag = s->ag;

	for (;;) {
		struct chunk *c;
		int fd;

		pthread_mutex_lock(&ag->lock);
		while (!f->q.head && !f->stop)
			pthread_cond_wait(&f->cond, &ag->lock);
		c = chunkq_pop_locked(&f->q);
		if (!c) {
			pthread_mutex_unlock(&ag->lock);
			break;
		}
		pthread_cond_broadcast(&f->cond);
		if (c->type == WIRE_CLOSE && !s->tty) {
			if (s->in_fd >= 0)
				close(s->in_fd);
			s->in_fd = -1;
			pthread_mutex_unlock(&ag->lock);
			free(c);
			continue;
		}
		fd = s->in_fd >= 0 ? dup(s->in_fd) : -1;
		pthread_mutex_unlock(&ag->lock);
		if (fd >= 0) {
			if (c->type == WIRE_CLOSE)
				feed_write(f, fd, (const uint8_t *)"\x04", 1); /* VEOF on a tty */
			else
				feed_write(f, fd, c->data, c->len);
			close(fd);
		}
		free(c);
	}
	return NULL;
}

static void feed_push(struct stdin_feed *f, uint8_t type, const uint8_t *buf, size_t len)
{
	chunkq_push(&f->q, &f->s->ag->lock, &f->cond, STDIN_QUEUE_MAX, type, buf, len);
}

static void handle_input(struct stdin_feed *f, uint8_t type, const uint8_t *buf, size_t len)
{
	struct session *s = f->s;
	struct agent *ag = s->ag;

	switch (type) {
	case WIRE_STDIN:
	case WIRE_CLOSE:
		feed_push(f, type, buf, type == WIRE_STDIN ? len : 0);
		break;
	case WIRE_SIGNAL:
		if (len == 4) {
			int sig = (int)((uint32_t)buf[0] << 24 | (uint32_t)buf[1] << 16 |
					(uint32_t)buf[2] << 8 | buf[3]);
			pthread_mutex_lock(&ag->lock);
			if (!s->exited && sig > 0 && sig < NSIG) {
				kill(-s->pid, sig); /* the command leads its own process group */
				kill(s->pid, sig);
			}
			pthread_mutex_unlock(&ag->lock);
		}
		break;
	case WIRE_WINSZ:
		pthread_mutex_lock(&ag->lock);
		if (len == 4 && s->tty && s->in_fd >= 0) {
			struct winsize ws = {.ws_row = (unsigned short)(buf[0] << 8 | buf[1]),
					     .ws_col = (unsigned short)(buf[2] << 8 | buf[3])};
			ioctl(s->in_fd, TIOCSWINSZ, &ws);
		}
		pthread_mutex_unlock(&ag->lock);
		break;
	default:
		break;
	}
}

/* Serves an attached host until it disconnects; the session goes on either way. */
static void session_serve(struct session *s, int fd, unsigned gen)
{
	struct agent *ag = s->ag;
	struct writer_arg w = {.s = s, .fd = fd, .gen = gen};
	struct stdin_feed f = {.s = s};
	uint8_t *buf = malloc(AGENT_CHUNK);
	pthread_t th, in_th;
	bool writer, feeder;

	pthread_cond_init(&f.cond, NULL);
	writer = buf && pthread_create(&th, NULL, writer_thread, &w) == 0;
	feeder = writer && pthread_create(&in_th, NULL, stdin_thread, &f) == 0;
	while (feeder) {
		uint8_t type;
		size_t len;

		if (wire_data_read(fd, &type, buf, AGENT_CHUNK, &len) < 0)
			break;
		handle_input(&f, type, buf, len);
	}
	pthread_mutex_lock(&ag->lock);
	if (s->attach_gen == gen) {
		s->attach_gen++;
		s->attached_fd = -1;
	}
	f.stop = true;
	pthread_cond_broadcast(&f.cond);
	pthread_cond_broadcast(&s->cond);
	pthread_mutex_unlock(&ag->lock);
	if (feeder)
		pthread_join(in_th, NULL);
	if (writer)
		pthread_join(th, NULL);
	chunkq_clear(&f.q);
	pthread_cond_destroy(&f.cond);
	free(buf);
	pthread_mutex_lock(&ag->lock);
	session_put_locked(s);
	pthread_mutex_unlock(&ag->lock);
}

/* Makes fd the session's reader; an earlier reader is cut off (its host has likely gone). */
static unsigned attach_locked(struct session *s, int fd)
{
	if (s->attached_fd >= 0)
		shutdown(s->attached_fd, SHUT_RDWR);
	s->attach_gen++;
	s->attached_fd = fd;
	s->refs++;
	pthread_cond_broadcast(&s->cond);
	return s->attach_gen;
}

/* --- spawning ---------------------------------------------------------------------------- */

struct child_plan {
	char *const *argv;
	char **envp;
	const char *cwd;
	struct pw_ent pw;
	bool tty;
	const char *pts;
	int in_r, out_w, err_w; /* pipe ends for the child (pipes mode) */
	int errpipe;	        /* CLOEXEC: the child writes a child_fail here if exec fails */
	const struct rlimit_val *rlimits;
	unsigned nrlimits;
};

/* Why the child could not exec: errno, and which rlimit it could not set (-1: none). */
struct child_fail {
	int err;
	int rlimit;
};

/* In the forked child: only async-signal-safe work, then exec. */
static void __attribute__((noreturn)) child_run(const struct child_plan *p)
{
	sigset_t none;
	struct child_fail f = {.rlimit = -1};
	int fd;

	sigemptyset(&none);
	sigprocmask(SIG_SETMASK, &none, NULL);
	signal(SIGPIPE, SIG_DFL);
	setsid();
	if (p->tty) {
		fd = open(p->pts, O_RDWR);
		if (fd < 0)
			goto fail;
		ioctl(fd, TIOCSCTTY, 0);
		dup2(fd, 0);
		dup2(fd, 1);
		dup2(fd, 2);
		if (fd > 2)
			close(fd);
	} else {
		dup2(p->in_r, 0);
		dup2(p->out_w, 1);
		dup2(p->err_w, 2);
	}
	/* As root still: a hard limit may go up only with CAP_SYS_RESOURCE. */
	for (unsigned i = 0; i < p->nrlimits; i++) {
		struct rlimit rl = {.rlim_cur = p->rlimits[i].soft, .rlim_max = p->rlimits[i].hard};
		if (setrlimit(p->rlimits[i].resource, &rl) < 0) {
			f.rlimit = p->rlimits[i].resource;
			goto fail;
		}
	}
	if (setgroups(0, NULL) < 0)
		goto fail;
	if (setgid(p->pw.gid) < 0 || setuid(p->pw.uid) < 0)
		goto fail;
	if (chdir(p->cwd ? p->cwd : p->pw.home) < 0 && (p->cwd || chdir("/") < 0))
		goto fail;
	execvpe(p->argv[0], p->argv, p->envp);
fail:
	f.err = errno;
	if (write(p->errpipe, &f, sizeof(f)) < 0) {
		/* the agent then sees only the exit */
	}
	_exit(127);
}

static int open_pty(int *master, char *name, size_t cap, unsigned rows, unsigned cols)
{
	int fd = open("/dev/ptmx", O_RDWR | O_NOCTTY | O_CLOEXEC);
	struct winsize ws = {.ws_row = (unsigned short)(rows ? rows : 24),
			     .ws_col = (unsigned short)(cols ? cols : 80)};

	if (fd < 0)
		return -errno;
	if (grantpt(fd) < 0 || unlockpt(fd) < 0 || ptsname_r(fd, name, cap) != 0) {
		int e = errno;

		close(fd);
		return -e;
	}
	ioctl(fd, TIOCSWINSZ, &ws);
	*master = fd;
	return 0;
}

/* Starts the command of r as a new session; on failure err says why. */
static int session_spawn(struct agent *ag, const struct exec_req *r, struct session **out,
			 char *err, size_t errlen)
{
	struct child_plan p = {.argv = (char *const *)r->argv, .cwd = r->cwd, .tty = r->tty,
			       .in_r = -1, .out_w = -1, .err_w = -1, .rlimits = r->rlimits,
			       .nrlimits = r->nrlimits};
	int in[2] = {-1, -1}, o[2] = {-1, -1}, e[2] = {-1, -1}, ep[2] = {-1, -1}, master = -1;
	char pts[64];
	struct session *s = NULL;
	pthread_t th;
	pid_t pid;
	struct child_fail child_fail;
	int ret;
	ssize_t n;

	ret = passwd_lookup(r->user ? r->user : "root", &p.pw);
	if (ret < 0) {
		snprintf(err, errlen, "user %s: %s", r->user ? r->user : "root",
			 ret == -ENOENT ? "no such user in /etc/passwd" : strerror(-ret));
		return ret;
	}
	p.envp = exec_env_build(r, &p.pw, ag->egress.port);
	s = calloc(1, sizeof(*s));
	if (!p.envp || !s) {
		ret = -ENOMEM;
		snprintf(err, errlen, "out of memory");
		goto fail;
	}
	if (r->tty) {
		ret = open_pty(&master, pts, sizeof(pts), r->rows, r->cols);
		if (ret < 0) {
			snprintf(err, errlen, "pty: %s", strerror(-ret));
			goto fail;
		}
		p.pts = pts;
	} else if ((r->stdin_open ? pipe2(in, O_CLOEXEC) : 0) < 0 || pipe2(o, O_CLOEXEC) < 0 ||
		   pipe2(e, O_CLOEXEC) < 0) {
		ret = -errno;
		snprintf(err, errlen, "pipe: %s", strerror(errno));
		goto fail;
	}
	if (!r->tty && !r->stdin_open) {
		in[0] = open("/dev/null", O_RDONLY | O_CLOEXEC);
		if (in[0] < 0) {
			ret = -errno;
			snprintf(err, errlen, "/dev/null: %s", strerror(errno));
			goto fail;
		}
	}
	p.in_r = in[0];
	p.out_w = o[1];
	p.err_w = e[1];
	if (pipe2(ep, O_CLOEXEC) < 0) {
		ret = -errno;
		snprintf(err, errlen, "pipe: %s", strerror(errno));
		goto fail;
	}
	p.errpipe = ep[1];

	pthread_mutex_lock(&ag->lock);
	if (ag->nsessions >= AGENT_SESSIONS_MAX) {
		/* Make room by forgetting the oldest finished session nobody came back for. */
		struct session *old = NULL;

		for (struct session *i = ag->sessions; i; i = i->next)
			if (i->exited && i->out_done && i->attached_fd < 0)
				old = i; /* the list is newest first: the last match is the oldest */
		if (old)
			session_unlink_locked(old);
	}
	if (ag->nsessions >= AGENT_SESSIONS_MAX) {
		pthread_mutex_unlock(&ag->lock);
		ret = -EAGAIN;
		snprintf(err, errlen, "too many sessions (%d)", AGENT_SESSIONS_MAX);
		goto fail;
	}
	/* Forked under the lock: the reaper cannot look the pid up before it is registered. */
	pid = fork();
	if (pid == 0)
		child_run(&p);
	if (pid < 0) {
		ret = -errno;
		pthread_mutex_unlock(&ag->lock);
		snprintf(err, errlen, "fork: %s", strerror(-ret));
		goto fail;
	}
	s->ag = ag;
	s->pid = pid;
	s->tty = r->tty;
	s->attached_fd = -1;
	s->refs = 1; /* the session list */
	pthread_cond_init(&s->cond, NULL);
	snprintf(s->id, sizeof(s->id), "s%u", ag->next_id++);
	snprintf(s->argv0, sizeof(s->argv0), "%s", r->argv[0]);
	s->next = ag->sessions;
	ag->sessions = s;
	ag->nsessions++;
	ag->spawns++;
	pthread_cond_broadcast(&ag->child_cond);
	pthread_mutex_unlock(&ag->lock);

	close(ep[1]);
	ep[1] = -1;
	do
		n = read(ep[0], &child_fail, sizeof(child_fail));
	while (n < 0 && errno == EINTR);
	close(ep[0]);
	ep[0] = -1;
	if (r->tty) {
		s->in_fd = master;
		s->out_fd = dup(master);
		s->err_fd = -1;
		fcntl(master, F_SETFL, fcntl(master, F_GETFL) | O_NONBLOCK);
	} else {
		close(in[0]);
		close(o[1]);
		close(e[1]);
		s->in_fd = r->stdin_open ? in[1] : -1;
		if (s->in_fd >= 0)
			fcntl(s->in_fd, F_SETFL, fcntl(s->in_fd, F_GETFL) | O_NONBLOCK);
		s->out_fd = o[0];
		s->err_fd = e[0];
	}
	exec_env_free(p.envp);
	if (n == (ssize_t)sizeof(child_fail)) {
		/* exec failed: the child exits 127; the session is dropped. */
		if (child_fail.rlimit >= 0)
			snprintf(err, errlen, "setrlimit %s: %s", rlimit_name(child_fail.rlimit),
				 strerror(child_fail.err));
		else
			snprintf(err, errlen, "exec %s: %s", r->argv[0], strerror(child_fail.err));
		close(s->out_fd);
		if (s->err_fd >= 0)
			close(s->err_fd);
		pthread_mutex_lock(&ag->lock);
		session_unlink_locked(s);
		pthread_mutex_unlock(&ag->lock);
		return -child_fail.err;
	}
	pthread_mutex_lock(&ag->lock);
	s->refs++; /* the pump */
	pthread_mutex_unlock(&ag->lock);
	if (pthread_create(&th, NULL, pump_thread, s) != 0) {
		pthread_mutex_lock(&ag->lock);
		s->refs--;
		pthread_mutex_unlock(&ag->lock);
		kill(-pid, SIGKILL);
		snprintf(err, errlen, "thread: out of resources");
		return -EAGAIN;
	}
	pthread_detach(th);
	*out = s;
	return 0;
fail:
	for (int i = 0; i < 2; i++) {
		if (in[i] >= 0)
			close(in[i]);
		if (o[i] >= 0)
			close(o[i]);
		if (e[i] >= 0)
			close(e[i]);
		if (ep[i] >= 0)
			close(ep[i]);
	}
	if (master >= 0)
		close(master);
	exec_env_free(p.envp);
	free(s);
	return ret;
}

int exec_handle(struct agent *ag, int fd, json_t *msg)
{
	struct exec_req r;
	struct session *s = NULL;
	char err[512];
	unsigned gen;
	json_t *reply;
	int ret = exec_req_parse(msg, &r, err, sizeof(err));

	if (ret == 0)
		ret = session_spawn(ag, &r, &s, err, sizeof(err));
	if (ret < 0)
		return wire_reply_error(fd, "%s", err);
	if (json_is_true(json_object_get(msg, "detach"))) {
		/* Nobody attached: all output waits for cove attach. */
		pthread_mutex_lock(&ag->lock);
		reply = json_pack("{s:b,s:s,s:i}", "ok", 1, "session", s->id, "pid", (int)s->pid);
		pthread_mutex_unlock(&ag->lock);
		ret = reply ? wire_msg_write(fd, reply) : -ENOMEM;
		json_decref(reply);
		return ret;
	}
	pthread_mutex_lock(&ag->lock);
	gen = attach_locked(s, fd);
	reply = json_pack("{s:b,s:s,s:i}", "ok", 1, "session", s->id, "pid", (int)s->pid);
	pthread_mutex_unlock(&ag->lock);
	/* The writer starts after the reply, so the reply is the first thing on the wire. */
	ret = reply ? wire_msg_write(fd, reply) : -ENOMEM;
	json_decref(reply);
	session_serve(s, fd, gen);
	return ret;
}

int attach_handle(struct agent *ag, int fd, json_t *msg)
{
	const char *id = json_string_value(json_object_get(msg, "session"));
	struct session *s;
	unsigned gen;
	json_t *reply;
	int ret;

	if (!id)
		return wire_reply_error(fd, "attach: no \"session\"");
	pthread_mutex_lock(&ag->lock);
	s = session_find_locked(ag, id);
	if (!s) {
		pthread_mutex_unlock(&ag->lock);
		return wire_reply_error(fd, "no session %.32s", id);
	}
	/* Hold the writer back until the reply is out: attach a generation that is not current. */
	s->refs++;
	reply = json_pack("{s:b,s:s,s:i,s:b,s:b}", "ok", 1, "session", s->id, "pid", (int)s->pid,
			  "tty", s->tty, "running", !s->exited);
	pthread_mutex_unlock(&ag->lock);
	ret = reply ? wire_msg_write(fd, reply) : -ENOMEM;
	json_decref(reply);
	pthread_mutex_lock(&ag->lock);
	s->refs--;
	gen = attach_locked(s, fd);
	pthread_mutex_unlock(&ag->lock);
	session_serve(s, fd, gen);
	return ret;
}
