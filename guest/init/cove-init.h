/* cove-init.h: what the parts of cove-init (the guest's PID 1) share. */
#ifndef COVE_INIT_H
#define COVE_INIT_H

#include <signal.h>
#include <stdbool.h>
#include <stddef.h>
#include <sys/types.h>

#include "common/log.h"

#define INIT_HOSTNAME_MAX 64

/* What PID 1 does once the command has ended. */
enum init_stop {
	INIT_STOP_REBOOT, /* reboot(RB_AUTOBOOT): with reboot=k an i8042 reset, a clean stop for
			     cove */
	INIT_STOP_HALT,	  /* reboot(RB_POWER_OFF): cove.poweroff=halt */
};

/* Settings read from the kernel command line. */
struct init_config {
	char hostname[INIT_HOSTNAME_MAX + 1];
	char *shell_cmd; /* decoded cove.cmd=, run with /bin/sh -c; NULL if absent */
	char **argv;	 /* words after "--", NULL-terminated; NULL if none */
	enum init_stop stop;
	const char *error; /* first parameter that could not be used, for the log */
	/* An image's sandbox (issue 32): cove.root=/dev/vdX is the image's disk, which cove's
	 * init initramfs switches to (stage1.c); "" for cove's own roots. */
	char root_dev[16];
	char *main_json; /* decoded cove.main=: the image's main process (main_proc.c); or NULL */
};

/* cmdline.c: pure functions over a buffer, so they can be unit-tested and fuzzed. */
char *cmdline_next(char *args, char **param, char **val);
int cmdline_parse(char *buf, struct init_config *cfg);
void init_config_free(struct init_config *cfg);

/* mounts.c */
void mounts_setup(struct logger *log);

/* stage1.c: from cove's init initramfs into the image's root (cove.root=), then exec of the
 * copy of cove-init it leaves on /.cove. Returns only on failure, having logged why. */
void stage1_switch(struct logger *log, const char *dev);

/* supervise.c: runs the command and reaps every process that ends up as our child. */
struct sup {
	int sigfd;	   /* signalfd for SIGCHLD and the stop requests */
	sigset_t old_mask; /* restored in the command */
	pid_t main_pid;
	int main_status; /* shell-style status (code, or 128 + signal); -1 while running */
	pid_t agent_pid; /* the guest agent (agent.c); restarted if it dies, a few times */
	int agent_restarts;
	bool stopping; /* a stop request came (the main process is not restarted then) */
	struct logger *log;
};

/* How the image's main process starts (main_proc.c, from cove.main=). */
struct main_spec {
	char **argv;  /* NULL-terminated; NULL: no main process, the sandbox waits for exec */
	char **env;   /* NAME=VALUE, NULL-terminated */
	char *cwd;    /* "" for the user's home */
	char *user;   /* "" for root */
	bool restart; /* on_exit "restart" (the default), else "stop": the VM ends */
};
/* Pure: cove.main='s JSON (at most 16 KiB, checked) into m. 0, or -EINVAL with err set. */
int main_spec_parse(const char *json, struct main_spec *m, char *err, size_t errlen);
void main_spec_free(struct main_spec *m);
/* Runs it (or, without argv, waits) until a stop request, or until it exits with on_exit stop.
 * Returns the shell-style status for the log. */
int main_run(struct sup *sup, const struct main_spec *m);

int sup_init(struct sup *s, struct logger *log);
/* interactive: make the console the command's controlling tty (a shell on the console). */
int sup_spawn(struct sup *s, char *const argv[], bool interactive);
/* The same, as uid/gid in cwd with envp (NULL: cove-init's); not on the console's tty. */
int sup_spawn_as(struct sup *s, char *const argv[], char *const envp[], const char *cwd, uid_t uid,
		 gid_t gid);
/* A child that only sleeps (until a stop request's SIGTERM). */
int sup_spawn_idle(struct sup *s);
/* Sleeps ms unless a stop request comes first (then 1; the children are reaped meanwhile). */
int sup_pause(struct sup *s, int ms);
int sup_wait(struct sup *s);
void sup_stop_all(struct sup *s);

/* cove-init logs through common/log; its console lines keep saying "cove-init: ..." (tests and
 * the boot bench look for "cove-init: ready" and "cove-init: exit N"). */
#define init_err(l, fmt, ...)  log_err((l), fmt, ##__VA_ARGS__)
#define init_info(l, fmt, ...) log_info((l), fmt, ##__VA_ARGS__)

#endif
