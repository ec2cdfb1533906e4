/* The subcommands `cove` dispatches to; one file each. */
#ifndef COVE_COMMANDS_H
#define COVE_COMMANDS_H

/* Each returns the process exit status: 0 ok, 1 failure, 2 bad usage. */
int cmd_run(int argc, char **argv);
int cmd_restore(int argc, char **argv);
int cmd_snapshot(int argc, char **argv);
int cmd_fork(int argc, char **argv);
int cmd_version(int argc, char **argv);
int cmd_doctor(int argc, char **argv);
int cmd_rekey(int argc, char **argv);

#endif
