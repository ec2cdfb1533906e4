/* Exit status of `cove-store take` (and cove exec...) when another host holds the lease. */
#define STORE_EXIT_HELD 75

/* cove store push|pull|follow|tombstone|take|release: argv[0] names it. An exit status. */
#ifndef COVE_CLI_STORE_SANDBOX_H
#define COVE_CLI_STORE_SANDBOX_H

int store_sandbox_cmd(int argc, char **argv);
/* cove store lazy NAME --fd N: fetches NAME's layers still arriving. An exit status. */
int store_lazy_cmd(int argc, char **argv);
/* cove store gc [--keep K] [--grace SECONDS]: an exit status. */
int store_gc_cmd(int argc, char **argv);
/* cove store ls: the store's sandboxes, newest generation and its age. An exit status. */
int store_ls_cmd(int argc, char **argv);

#endif
