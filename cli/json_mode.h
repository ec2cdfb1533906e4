/*
 * `--json` for the commands whose own output is text (create, start, stop, pause, resume, rm,
 * archive, gc, template create|rm, version): the command runs with its stdout and stderr
 * captured, then one JSON object goes to stdout on success, or one JSON line to stderr on
 * failure: {"v":1,"command":..,"error":..,"exit":N}. Shapes: docs/CLI.md, "JSON output".
 */
#ifndef COVE_CLI_JSON_MODE_H
#define COVE_CLI_JSON_MODE_H

#include <stdbool.h>

#include <jansson.h>

/* argv[0] is the subcommand: true when it is one of the above and --json comes before any --. */
bool json_mode_wanted(int argc, char **argv);
/* Runs fn without the --json argument in JSON mode; its exit status. */
int json_mode_run(int (*fn)(int argc, char **argv), int argc, char **argv);
/*
 * For the commands whose output is data (ls, ls --cache, template ls, fork): one line on stdout,
 * {"v":1,"command":COMMAND} followed by the members of fields (taken over; NULL: out of memory).
 */
void json_mode_print(const char *command, json_t *fields);

#endif
