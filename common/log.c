/* Leveled logging: one line per message, prefixed with the program and (but at info) the level. */
#include "common/log.h"

#include <errno.h>
#include <stdarg.h>
#include <string.h>

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
	if (log->name && lvl == LOG_INFO)
		fprintf(out, "%s: %s\n", log->name, line);
	else
		fprintf(out, "%s: %s: %s\n", log->name ? log->name : "cove", level_names[lvl], line);
	fflush(out);
}
