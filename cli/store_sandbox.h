/* cove store push|pull: argv[0] is "push" or "pull". An exit status. */
#ifndef COVE_CLI_STORE_SANDBOX_H
#define COVE_CLI_STORE_SANDBOX_H

int store_sandbox_cmd(int argc, char **argv);
/* cove store gc [--keep K] [--grace SECONDS]: an exit status. */
int store_gc_cmd(int argc, char **argv);
/* cove store ls: the store's sandboxes, newest generation and its age. An exit status. */
int store_ls_cmd(int argc, char **argv);

#endif
