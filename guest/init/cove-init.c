/* cove-init.c: the guest's PID 1: sets up the sandbox, runs its command, then ends the VM. */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/reboot.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "agent.h"
#include "common/fd_io.h"
#include "cove-init.h"

/* x86 COMMAND_LINE_SIZE is 2048; leave room for a larger one. */
#define CMDLINE_MAX 8192

/* The kernel opens /dev/console as fds 0-2 only if the root file system had the node. */
static void console_ensure_fds(void)
{
	int fd;

	if (fcntl(2, F_GETFD) >= 0)
		return;
	fd = open("/dev/console", O_RDWR | O_NOCTTY);
	if (fd < 0)
		return;
	for (int i = 0; i < 3; i++)
		if (fd != i)
			dup2(fd, i);
	if (fd > 2)
		close(fd);
}

static void env_setup(void)
{
	/* The kernel passes HOME=/ and TERM=linux, plus unknown key=value boot parameters. */
	setenv("PATH", "/usr/sbin:/usr/bin:/sbin:/bin", 1);
	setenv("HOME", "/root", 1);
	setenv("TERM", "linux", 1);
	/* The egress proxy the agent serves; http_proxy=... boot parameters take precedence. */
	egress_env_setdefault(EGRESS_LISTEN_PORT);
}

/* Reads /proc/cmdline into buf; an unreadable one counts as empty (interactive shell). */
static void cmdline_read(struct logger *log, char *buf, size_t size)
{
	int fd = open("/proc/cmdline", O_RDONLY | O_CLOEXEC);
	ssize_t len = 0;

	if (fd >= 0) {
		len = read_upto(fd, buf, size - 1);
		close(fd);
	} else {
		init_err(log, "/proc/cmdline: %s", strerror(errno));
	}
	buf[len > 0 ? len : 0] = '\0';
}

static void print_ready(struct logger *log)
{
	struct timespec ts;

	clock_gettime(CLOCK_BOOTTIME, &ts);
	init_info(log, "ready %lld.%03ld", (long long)ts.tv_sec, ts.tv_nsec / 1000000);
}

/* cove.cmd= first, then the words after "--", else an interactive shell on the console. */
static int run_command(struct sup *sup, const struct init_config *cfg)
{
	static char sh[] = "/bin/sh", dash_c[] = "-c";
	char *sh_cmd[] = {sh, dash_c, cfg->shell_cmd, NULL};
	char *sh_interactive[] = {sh, NULL};
	char *const *argv = sh_interactive;
	int err;

	if (cfg->shell_cmd)
		argv = sh_cmd;
	else if (cfg->argv)
		argv = cfg->argv;
	err = sup_spawn(sup, argv, argv == sh_interactive);
	if (err < 0) {
		init_err(sup->log, "fork: %s", strerror(-err));
		return 127;
	}
	return sup_wait(sup);
}

/* An image's sandbox: its main process (cove.main=), or none: the sandbox waits for exec. */
static int run_image(struct sup *sup, const struct init_config *cfg)
{
	struct main_spec m = {.restart = true};
	char err[160];
	int status;

	if (cfg->main_json && main_spec_parse(cfg->main_json, &m, err, sizeof(err)) < 0) {
		init_err(sup->log, "%s", err);
		return 127;
	}
	if (m.argv)
		init_info(sup->log, "main process %s (on exit: %s)", m.argv[0],
			  m.restart ? "restart" : "stop");
	status = main_run(sup, &m);
	main_spec_free(&m);
	return status;
}

/*
 * Without ACPI the kernel cannot power off: RB_POWER_OFF only halts the CPUs, and the VM stays
 * until the VMM kills it. RB_AUTOBOOT with reboot=k pulses the i8042 reset line, which cove
 * turns into a clean stop. PID 1 must never return: that would panic the kernel.
 */
static void __attribute__((noreturn)) vm_stop(struct logger *log, enum init_stop stop)
{
	sync();
	init_info(log, "%s", stop == INIT_STOP_HALT ? "power off" : "reboot");
	reboot(stop == INIT_STOP_HALT ? RB_POWER_OFF : RB_AUTOBOOT);
	init_err(log, "reboot: %s", strerror(errno));
	for (;;)
		pause();
}

int main(int argc, char **argv)
{
	static char cmdline[CMDLINE_MAX];
	struct init_config cfg;
	struct logger log = {.level = LOG_INFO, .out = stderr, .name = "cove-init"};
	struct sup sup;
	int err, status, ret;

	/* Only the agent, outside a VM, on a Unix socket: for tests of the host tools. */
	if (argc == 4 && strcmp(argv[1], "agent") == 0 && strcmp(argv[2], "--unix") == 0)
		return agent_run(argv[3], &log);
	if (getpid() != 1) {
		fprintf(stderr, "cove-init: must run as PID 1 (it is the guest's init); "
				"'cove-init agent --unix PATH' runs only the agent, for tests\n");
		return 1;
	}
	umask(022);
	mounts_setup(&log);
	console_ensure_fds();
	/* Ctrl-alt-del becomes SIGINT to us: an orderly stop instead of an instant reset. */
	if (reboot(RB_DISABLE_CAD) < 0)
		init_err(&log, "disable ctrl-alt-del: %s", strerror(errno));
	env_setup();
	cmdline_read(&log, cmdline, sizeof(cmdline));
	err = cmdline_parse(cmdline, &cfg);
	/* cove's init initramfs under an image's sandbox: into the image's root, and exec. */
	if (cfg.root_dev[0] && argc >= 1 && strcmp(argv[0], "/init") == 0) {
		stage1_switch(&log, cfg.root_dev);
		vm_stop(&log, cfg.stop);
	}
	if (sethostname(cfg.hostname, strlen(cfg.hostname)) < 0)
		init_err(&log, "sethostname %s: %s", cfg.hostname, strerror(errno));
	ret = sup_init(&sup, &log);
	if (ret < 0) {
		init_err(&log, "signal set-up: %s", strerror(-ret));
		vm_stop(&log, cfg.stop);
	}

	/* The guest agent (exec, files, ports, identity, broker proxy) on vsock port 1024. */
	sup.agent_pid = agent_start(&log);
	print_ready(&log);
	if (err == -EINVAL) {
		init_err(&log, "bad parameter %s", cfg.error);
		status = 127;
	} else if (err < 0) {
		init_err(&log, "kernel command line: %s", strerror(-err));
		status = 127;
	} else if (cfg.root_dev[0]) {
		status = run_image(&sup, &cfg);
	} else {
		status = run_command(&sup, &cfg);
	}
	init_info(&log, "exit %d", status);

	sup_stop_all(&sup);
	init_config_free(&cfg);
	vm_stop(&log, cfg.stop);
}
