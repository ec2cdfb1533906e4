/* Signal names (oci/signals.h). */
#include "oci/signals.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static const struct {
	const char *name;
	int sig;
} names[] = {
    {"HUP", SIGHUP},	   {"INT", SIGINT},   {"QUIT", SIGQUIT},   {"ILL", SIGILL},
    {"TRAP", SIGTRAP},	   {"ABRT", SIGABRT}, {"BUS", SIGBUS},	   {"FPE", SIGFPE},
    {"KILL", SIGKILL},	   {"USR1", SIGUSR1}, {"SEGV", SIGSEGV},   {"USR2", SIGUSR2},
    {"PIPE", SIGPIPE},	   {"ALRM", SIGALRM}, {"TERM", SIGTERM},   {"CHLD", SIGCHLD},
    {"CONT", SIGCONT},	   {"STOP", SIGSTOP}, {"TSTP", SIGTSTP},   {"TTIN", SIGTTIN},
    {"TTOU", SIGTTOU},	   {"URG", SIGURG},   {"XCPU", SIGXCPU},   {"XFSZ", SIGXFSZ},
    {"VTALRM", SIGVTALRM}, {"PROF", SIGPROF}, {"WINCH", SIGWINCH}, {"IO", SIGIO},
    {"PWR", SIGPWR},	   {"SYS", SIGSYS},
};

int oci_signal_parse(const char *s)
{
	if (!s || !*s)
		return -EINVAL;
	if (s[0] >= '0' && s[0] <= '9') {
		char *end;
		long n = strtol(s, &end, 10);
		return *end || n < 1 || n > 64 ? -EINVAL : (int)n;
	}
	if (!strncasecmp(s, "SIG", 3))
		s += 3;
	for (size_t i = 0; i < sizeof(names) / sizeof(*names); i++)
		if (!strcasecmp(s, names[i].name))
			return names[i].sig;
	return -EINVAL;
}
