/* Leveled logging to a stream; the logger is a value passed around, never a global. */
#ifndef COVE_LOG_H
#define COVE_LOG_H

#include <stdio.h>

enum log_level { LOG_ERROR = 0, LOG_WARN, LOG_INFO, LOG_DEBUG };

struct logger {
	enum log_level level;
	FILE *out;
	/* The program's name on each line: "NAME: msg" at info, "NAME: LEVEL: msg" otherwise.
	 * NULL: "cove: LEVEL: msg" (the VMM's form). */
	const char *name;
	/* One JSON object per line instead: {"level","msg","time"} (RFC 3339, UTC), the form
	 * OCI runtimes write to --log with --log-format json for container engines to read. */
	int json;
};

/* Parses "error|warn|info|debug"; returns 0 or -EINVAL. */
int log_level_parse(const char *s, enum log_level *out);
void log_msg(struct logger *log, enum log_level lvl, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

#define log_err(l, ...) log_msg((l), LOG_ERROR, __VA_ARGS__)
#define log_warn(l, ...) log_msg((l), LOG_WARN, __VA_ARGS__)
#define log_info(l, ...) log_msg((l), LOG_INFO, __VA_ARGS__)
#define log_debug(l, ...) log_msg((l), LOG_DEBUG, __VA_ARGS__)

#endif
