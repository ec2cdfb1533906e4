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
};

/* cmdline.c: pure functions over a buffer, so they can be unit-tested and fuzzed. */
char *cmdline_next(char *args, char **param, char **val);
int cmdline_parse(char *buf, struct init_config *cfg);
void init_config_free(struct init_config *cfg);

/* mounts.c */
void mounts_setup(struct logger *log);

/* supervise.c: runs the command and reaps every process that ends up as our child. */
struct sup {
	int sigfd;	   /* signalfd for SIGCHLD and the stop requests */
	sigset_t old_mask; /* restored in the command */
	pid_t main_pid;
	int main_status; /* shell-style status (code, or 128 + signal); -1 while running */
	pid_t agent_pid; /* the guest agent (agent.c); restarted if it dies, a few times */
	int agent_restarts;
	struct logger *log;
};

int sup_init(struct sup *s, struct logger *log);
/* interactive: make the console the command's controlling tty (a shell on the console). */
int sup_spawn(struct sup *s, char *const argv[], bool interactive);
int sup_wait(struct sup *s);
void sup_stop_all(struct sup *s);

/* cove-init logs through common/log; its console lines keep saying "cove-init: ..." (tests and
 * the boot bench look for "cove-init: ready" and "cove-init: exit N"). */
#define init_err(l, fmt, ...)  log_err((l), fmt, ##__VA_ARGS__)
#define init_info(l, fmt, ...) log_info((l), fmt, ##__VA_ARGS__)

#endif
