/* `cove run`: create the VM, its board devices and control socket, then serve the event loop until it stops. */
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/signalfd.h>
#include <unistd.h>

#include "api.h"
#include "board.h"
#include "boot.h"
#include "commands.h"
#include "options.h"
#include "vm.h"
#include "vm_api.h"

struct run_ctx {
	struct vm vm;
	struct board board;
	struct logger log;
	struct api_backend be;
	struct api_server *api;
	int console_fd;
	int sig_fd;
};

static void on_stop(void *opaque, uint32_t events)
{
	struct run_ctx *c = opaque;
	(void)events;
	uint64_t v;
	if (read(c->vm.stop_efd, &v, sizeof(v)) < 0 && errno != EAGAIN)
		log_warn(&c->log, "reading stop eventfd: %s", strerror(errno));
	evloop_stop(&c->vm.loop);
}

static void on_signal(void *opaque, uint32_t events)
{
	struct run_ctx *c = opaque;
	(void)events;
	struct signalfd_siginfo si;
	if (read(c->sig_fd, &si, sizeof(si)) != sizeof(si))
		return;
	vm_request_stop(&c->vm, 0, "stopped by %s", strsignal((int)si.ssi_signo));
}

static void on_stdin(void *opaque, uint32_t events)
{
	struct run_ctx *c = opaque;
	uint8_t buf[256];
	ssize_t n = read(STDIN_FILENO, buf, sizeof(buf));
	if (n > 0) {
		size_t took = serial_push_input(&c->board.com1, buf, (size_t)n);
		if (took < (size_t)n)
			log_warn(&c->log, "console input: guest is not reading, dropped %zu bytes",
				 (size_t)n - took);
		return;
	}
	if (n < 0 && (errno == EAGAIN || errno == EINTR))
		return;
	(void)events;
	/* End of input (or an error): stop watching, the guest keeps running. */
	evloop_del(&c->vm.loop, STDIN_FILENO);
}

static int open_console(const struct run_opts *o, struct logger *log)
{
	if (!o->console)
		return dup(STDOUT_FILENO);
	int fd = open(o->console, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	if (fd < 0)
		log_err(log, "cannot open console file %s: %s", o->console, strerror(errno));
	return fd;
}

/* SIGINT/SIGTERM/SIGHUP arrive through a signalfd; vCPU threads inherit the blocked mask. */
static int setup_signals(struct run_ctx *c)
{
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGINT);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGHUP);
	if (pthread_sigmask(SIG_BLOCK, &set, NULL))
		return -EINVAL;
	signal(SIGPIPE, SIG_IGN);
	c->sig_fd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
	return c->sig_fd < 0 ? -errno : 0;
}

static int run_vm(struct run_ctx *c, const struct run_opts *o)
{
	struct vm_config cfg = {
		.mem_size = o->mem_size, .nr_vcpus = o->vcpus, .track_dirty = o->track_dirty
	};
	int r = vm_create(&c->vm, &cfg, &c->log);
	if (r)
		return 1;
	int status = 1;
	r = board_create(&c->board, &c->vm, c->console_fd);
	if (r)
		goto out_vm;
	if (board_add_disks(&c->board, &c->vm, o->disks, o->nr_disks))
		goto out_board;
	if (o->vsock_cid && board_add_vsock(&c->board, &c->vm, o->vsock_cid, o->vsock_uds))
		goto out_board;
	/* The guest finds virtio-mmio devices only through virtio_mmio.device= words. */
	char cmdline[4096];
	if (board_cmdline(&c->board, o->cmdline, cmdline, sizeof(cmdline))) {
		log_err(&c->log, "kernel command line with the virtio devices is longer than 4095 bytes");
		goto out_board;
	}
	struct boot_spec spec = { .kernel = o->kernel, .initrd = o->initrd, .cmdline = cmdline };
	if (boot_load(&c->vm, &spec))
		goto out_board;

	struct evloop *loop = &c->vm.loop;
	if (evloop_add(loop, c->vm.stop_efd, EPOLLIN, on_stop, c) ||
	    evloop_add(loop, c->sig_fd, EPOLLIN, on_signal, c)) {
		log_err(&c->log, "cannot set up the event loop");
		goto out_board;
	}
	/* stdin may be a file or /dev/null, which epoll refuses: then there is no console input. */
	if (evloop_add(loop, STDIN_FILENO, EPOLLIN, on_stdin, c))
		log_debug(&c->log, "console input disabled (stdin cannot be polled)");
	if (o->api_sock) {
		vm_api_backend(&c->vm, &c->be);
		r = api_server_start(&c->api, o->api_sock, &c->be, loop);
		if (r) {
			log_err(&c->log, "cannot serve the API on %s: %s", o->api_sock, strerror(-r));
			goto out_board;
		}
	}
	r = vm_start(&c->vm);
	if (!r)
		r = evloop_run(loop);
	if (r)
		vm_request_stop(&c->vm, 1, "event loop failed: %s", strerror(-r));
	vm_join(&c->vm);
	status = c->vm.exit.status;
	if (status)
		log_err(&c->log, "%s", c->vm.exit.reason);
	else
		log_info(&c->log, "%s", c->vm.exit.reason);
	if (c->api)
		api_server_stop(c->api);
out_board:
	board_destroy(&c->board);
out_vm:
	vm_destroy(&c->vm);
	return status;
}

int cmd_run(int argc, char **argv)
{
	struct run_opts o;
	char err[256];
	int r = run_opts_parse(argc, argv, &o, err, sizeof(err));
	if (r == 1) {
		fputs(run_usage, stdout);
		return 0;
	}
	if (r) {
		fprintf(stderr, "cove run: %s (try 'cove run --help')\n", err);
		return 2;
	}
	struct run_ctx *c = calloc(1, sizeof(*c));
	if (!c) {
		fprintf(stderr, "cove run: out of memory\n");
		return 1;
	}
	c->log = (struct logger){ .level = o.log_level, .out = stderr };
	c->console_fd = open_console(&o, &c->log);
	int status = 1;
	if (c->console_fd < 0)
		goto out;
	if (setup_signals(c)) {
		log_err(&c->log, "cannot set up signal handling");
		goto out_console;
	}
	status = run_vm(c, &o);
	close(c->sig_fd);
out_console:
	close(c->console_fd);
out:
	free(c);
	return status;
}
