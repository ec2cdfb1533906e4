/* The subcommands `cove` dispatches to; one file each. */
#ifndef COVE_COMMANDS_H
#define COVE_COMMANDS_H

/* Each returns the process exit status: 0 ok, 1 failure, 2 bad usage. */
/* cove-vmm's two commands (cmd_run.c, cmd_restore.c: linked into cove-vmm only). */
int cmd_run(int argc, char **argv);
int cmd_restore(int argc, char **argv);
/* cove's run/restore: execs cove-vmm with argv0 then argv (vmm_exec.c); returns 1 if it cannot. */
int cmd_vmm(const char *argv0, int argc, char **argv);
int cmd_snapshot(int argc, char **argv);
int cmd_balloon(int argc, char **argv);
int cmd_fork(int argc, char **argv);
int cmd_version(int argc, char **argv);
int cmd_doctor(int argc, char **argv);
int cmd_rekey(int argc, char **argv);
/* Sandboxes by name (issue 14): cmd_create.c, cmd_lifecycle.c, cmd_ls.c. */
int cmd_create(int argc, char **argv);
int cmd_start(int argc, char **argv);
int cmd_stop(int argc, char **argv);
int cmd_up(int argc, char **argv);
int cmd_archive(int argc, char **argv);
int cmd_pause(int argc, char **argv);
int cmd_resume(int argc, char **argv);
int cmd_rm(int argc, char **argv);
int cmd_gc(int argc, char **argv);
int cmd_ls(int argc, char **argv);
int cmd_metrics(int argc, char **argv);
/* Templates (issue 31): cmd_template.c; cmd_create.c's --from clones one. */
int cmd_template(int argc, char **argv);
/* The object store (issue 28): execs cove-store beside cove (cmd_store.c). */
int cmd_store(int argc, char **argv);
/* OCI images (issue 32): execs cove-image beside cove (cmd_image.c). */
int cmd_image(int argc, char **argv);

#endif
