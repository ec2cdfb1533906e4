/* --json for the commands whose own output is text (json_mode.h). */
#include "cli/json_mode.h"

#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include <jansson.h>

#include "cli/sandbox_json.h"
#include "lifecycle/name.h"
#include "lifecycle/root.h"

#define JSON_MODE_VERSION 1
#define CAPTURE_MAX	  (256 * 1024) /* of each stream, its end kept */

static const char *const wrapped[] = {"create", "start",   "stop", "pause",   "resume",
				      "rm",	"archive", "gc",   "version", "template"};

bool json_mode_wanted(int argc, char **argv)
{
	bool known = false;
	for (size_t i = 0; i < sizeof(wrapped) / sizeof(wrapped[0]); i++)
		known |= !strcmp(argv[0], wrapped[i]);
	/* template ls has a --json of its own. */
	if (!known || (!strcmp(argv[0], "template") &&
		       (argc < 2 || (strcmp(argv[1], "create") && strcmp(argv[1], "rm")))))
		return false;
	for (int i = 1; i < argc && strcmp(argv[i], "--"); i++)
		if (!strcmp(argv[i], "--json"))
			return true;
	return false;
}

/* The captured text (its last CAPTURE_MAX bytes), NUL-terminated; NULL on failure. */
static char *capture_read(int fd)
{
	off_t end = lseek(fd, 0, SEEK_END), from = end > CAPTURE_MAX ? end - CAPTURE_MAX : 0;
	if (end < 0)
		return NULL;
	char *buf = malloc((size_t)(end - from) + 1);
	ssize_t n = buf ? pread(fd, buf, (size_t)(end - from), from) : -1;
	if (n < 0) {
		free(buf);
		return NULL;
	}
	buf[n] = '\0';
	return buf;
}

/* Its non-empty lines, as a JSON array of strings (invalid UTF-8 replaced by jansson's refusal:
 * such a line is left out). */
static json_t *lines_of(char *text)
{
	json_t *a = json_array();
	for (char *save = NULL, *l = text ? strtok_r(text, "\n", &save) : NULL; a && l;
	     l = strtok_r(NULL, "\n", &save))
		if (*l)
			json_array_append_new(a, json_string(l));
	return a;
}

/* The sandbox NAME (from the state root) as cove ls --json describes it, or null. */
static json_t *sandbox_of(const char *name)
{
	struct sbx_root r;
	json_t *j = NULL;
	if (!name || sbx_name_check(name, NULL, 0) || sbx_root_open(&r, false, NULL, 0))
		return json_null();
	int dfd = openat(r.dfd, name, O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
	if (dfd >= 0) {
		j = sbx_describe_json(dfd, name);
		close(dfd);
	}
	sbx_root_close(&r);
	return j ? j : json_null();
}

/*
 * The sandbox or template the command names: the argument after the subcommand (after
 * "template create|rm"), as every usage line puts it first. Taken before the command runs, since
 * getopt permutes the vector it is given.
 */
static const char *operand(int argc, char **argv, int at)
{
	return at < argc && argv[at][0] != '-' ? argv[at] : NULL;
}

static void emit(FILE *f, json_t *o)
{
	char *s = o ? json_dumps(o, JSON_COMPACT) : NULL;
	fprintf(f, "%s\n", s ? s : "{\"v\":1,\"error\":\"out of memory\",\"exit\":1}");
	free(s);
	json_decref(o);
}

void json_mode_print(const char *command, json_t *fields)
{
	json_t *o =
	    fields ? json_pack("{s:i,s:s}", "v", JSON_MODE_VERSION, "command", command) : NULL;
	if (o && json_object_update(o, fields)) {
		json_decref(o);
		o = NULL;
	}
	json_decref(fields);
	emit(stdout, o);
}

int json_mode_run(int (*fn)(int argc, char **argv), int argc, char **argv)
{
	char **av = calloc((size_t)argc + 1, sizeof(*av));
	int n = 0, ofd = memfd_create("cove-json-stdout", MFD_CLOEXEC),
	    efd = memfd_create("cove-json-stderr", MFD_CLOEXEC);
	int saved1 = fcntl(1, F_DUPFD_CLOEXEC, 3), saved2 = fcntl(2, F_DUPFD_CLOEXEC, 3);
	if (!av || ofd < 0 || efd < 0 || saved1 < 0 || saved2 < 0) {
		fprintf(stderr,
			"{\"v\":1,\"command\":\"%s\",\"error\":\"cannot set up --json "
			"capture\",\"exit\":1}\n",
			argv[0]);
		return 1;
	}
	bool past = false;
	for (int i = 0; i < argc; i++) {
		past |= !strcmp(argv[i], "--");
		if (past || strcmp(argv[i], "--json"))
			av[n++] = argv[i];
	}
	const char *cmd = av[0];
	bool tmpl = !strcmp(cmd, "template");
	const char *name = operand(n, av, tmpl ? 2 : 1);
	char full[32];
	snprintf(full, sizeof(full), "%s%s%s", cmd, tmpl ? " " : "", tmpl ? av[1] : "");
	fflush(stdout);
	fflush(stderr);
	dup2(ofd, 1);
	dup2(efd, 2);
	int st = fn(n, av);
	fflush(stdout);
	fflush(stderr);
	dup2(saved1, 1);
	dup2(saved2, 2);
	close(saved1);
	close(saved2);
	char *out = capture_read(ofd), *err = capture_read(efd);
	close(ofd);
	close(efd);

	if (st != 0) {
		/* The reason is the last line; a JSON line (cove-store's "held") is kept whole. */
		char *last = NULL;
		for (char *save = NULL, *l = err ? strtok_r(err, "\n", &save) : NULL; l;
		     l = strtok_r(NULL, "\n", &save))
			if (*l)
				last = l;
		json_t *o = last && last[0] == '{' ? json_loads(last, 0, NULL) : NULL;
		if (!json_is_object(o)) {
			json_decref(o);
			o = json_pack("{s:s}", "error", last ? last : "failed");
			/* jansson takes UTF-8 only: a reason that is not still fails as one line.
			 */
			if (!o)
				o = json_pack("{s:s}", "error",
					      "(its one-line reason was not valid UTF-8)");
		}
		if (o) {
			json_object_set_new(o, "v", json_integer(JSON_MODE_VERSION));
			json_object_set_new(o, "command", json_string(full));
			if (!json_object_get(o, "exit"))
				json_object_set_new(o, "exit", json_integer(st));
		}
		emit(stderr, o);
	} else {
		json_t *o = json_pack("{s:i,s:s}", "v", JSON_MODE_VERSION, "command", full);
		if (o && !strcmp(cmd, "version")) {
			json_object_set_new(o, "version", json_string(COVE_VERSION));
		} else if (o && tmpl) {
			json_object_set_new(o, "template", name ? json_string(name) : json_null());
		} else if (o && !strcmp(cmd, "rm")) {
			json_object_set_new(o, "name", name ? json_string(name) : json_null());
			json_object_set_new(o, "removed", json_true());
		} else if (o && strcmp(cmd, "gc")) {
			json_object_set_new(o, "name", name ? json_string(name) : json_null());
			json_object_set_new(o, "sandbox", sandbox_of(name));
		}
		if (o) {
			json_object_set_new(o, "messages", lines_of(out));
			json_object_set_new(o, "warnings", lines_of(err));
		}
		emit(stdout, o);
	}
	free(out);
	free(err);
	free(av);
	return st;
}
