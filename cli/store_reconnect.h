/* A sandbox this host does not have, taken from the object store when one is configured. */
#ifndef COVE_CLI_STORE_RECONNECT_H
#define COVE_CLI_STORE_RECONNECT_H

#include <stdbool.h>

/* A store is configured: $COVE_STORE is set, or /etc/cove/store.json is readable. */
bool store_is_configured(void);
/*
 * With a store configured ($COVE_STORE, else /etc/cove/store.json), runs `cove-store pull NAME`
 * (beside this executable) and returns its exit status: 0 pulled (or another process pulled it
 * meanwhile: check again), 66 removed from the store, other failures as it says on stderr.
 * -1 when no store is configured.
 */
int store_try_pull(const char *name);
/*
 * `cove-store evict [--cache-max MAX] [--dry-run]` (its lines on this process's stdout): local
 * copies of sandboxes committed in the store evicted down to MAX (NULL: store.json's
 * cache_max). Its exit status; -1 when no store is configured.
 */
int store_try_evict(const char *max, bool dry_run);
/* The same with `cove-store tombstone NAME`: 0 written (or there already). -1: no store. */
int store_try_tombstone(const char *name);
/* `cove-store take NAME`: 0 held (or no store: -1), 75 another host holds it (one JSON line on
 * stderr), other statuses a failure cove-store described. */
int store_try_take(const char *name);
/* Before a paused sandbox resumes: 0, 75 when this host's lease is in doubt, -1 without a store. */
int store_try_held(const char *name);
/* cove gc's hooks with a store (lifecycle/gc.h): only what this host owns; deletes leave the
 * store's tombstone. NULL without a store. */
struct sbx_gc_hooks;
const struct sbx_gc_hooks *store_gc_hooks(void);
/* `cove-store release NAME` after the final commit: 0 (or -1: no store). */
int store_try_release(const char *name);
/* `cove-store SUB NAME --template` (SUB "push" or "pull"): template NAME to or from the store.
 * Its exit status; -1: no store. */
int store_try_template(const char *sub, const char *name);
/* `cove-store push NAME` (a stopped sandbox's newest generation): 0 committed. -1: no store. */
int store_try_push(const char *name);
/*
 * `cove-store ls --json` (the store's catalog, its shape in cli/store_sandbox.c) into a malloc'ed
 * string *json_out: 0, or 1 on a failure (cove-store said why on stderr), -1: no store.
 */
int store_try_list(char **json_out);
/* With a store: `cove-store follow NAME` detached (its log NAME/store.log beneath dfd), which
 * uploads each commit while the sandbox runs. Nothing without a store; failures are silent
 * (cove stop's push still commits the final generation). */
void store_start_follower(int dfd, const char *name);
/*
 * Starts `cove-store lazy NAME --fd 3` detached (its log: NAME/store.log), with `sock` (the
 * fetcher's end of the VMM's socket) at fd 3. 0, or -ENOKEY without a store, or -errno.
 */
int store_start_lazy(int dfd, const char *name, int sock);

#endif
