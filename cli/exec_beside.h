/* The helpers that live beside cove (cove-store, cove-image): run with cove's own arguments. */
#ifndef COVE_CLI_EXEC_BESIDE_H
#define COVE_CLI_EXEC_BESIDE_H

/* Execs HELPER from this executable's directory with argv (argv[0] replaced); returns 1 with
 * one line on stderr ("cove WHAT: ...") only if it cannot. */
int exec_beside(const char *helper, const char *what, char **argv);
#endif
