/* Leveled logging: one line per message, prefixed with the program and (but at info) the level. */
#include "common/log.h"

#include <errno.h>
#include <stdarg.h>
#include <string.h>
#include <time.h>

static const char *const level_names[] = { "error", "warn", "info", "debug" };

int log_level_parse(const char *s, enum log_level *out)
{
	for (size_t i = 0; i < sizeof(level_names) / sizeof(level_names[0]); i++) {
		if (strcmp(s, level_names[i]) == 0) {
			*out = (enum log_level)i;
			return 0;
		}
	}
	return -EINVAL;
}

void log_msg(struct logger *log, enum log_level lvl, const char *fmt, ...)
{
	if (!log || lvl > log->level)
		return;
	FILE *out = log->out ? log->out : stderr;
	char line[512];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	/* One fprintf per line so lines from different threads do not interleave. */
	if (log->json) {
		char esc[sizeof(line) * 6 + 1], when[40];
		size_t o = 0;
		for (const unsigned char *c = (const unsigned char *)line; *c; c++) {
			if (*c == '"' || *c == '\\')
				o += (size_t)sprintf(esc + o, "\\%c", *c);
			else if (*c < 0x20)
				o += (size_t)sprintf(esc + o, "\\u%04x", *c);
			else
				esc[o++] = (char)*c;
		}
		esc[o] = '\0';
		struct timespec ts;
		struct tm tm;
		clock_gettime(CLOCK_REALTIME, &ts);
		gmtime_r(&ts.tv_sec, &tm);
		size_t n = strftime(when, sizeof(when), "%Y-%m-%dT%H:%M:%S", &tm);
		snprintf(when + n, sizeof(when) - n, ".%09ldZ", ts.tv_nsec);
		fprintf(out, "{\"level\":\"%s\",\"msg\":\"%s\",\"time\":\"%s\"}\n",
			level_names[lvl], esc, when);
	} else if (log->name && lvl == LOG_INFO)
		fprintf(out, "%s: %s\n", log->name, line);
	else
		fprintf(out, "%s: %s: %s\n", log->name ? log->name : "cove", level_names[lvl], line);
	fflush(out);
}
