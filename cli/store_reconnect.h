/* A sandbox this host does not have, taken from the object store when one is configured. */
#ifndef COVE_CLI_STORE_RECONNECT_H
#define COVE_CLI_STORE_RECONNECT_H

/*
 * With a store configured ($COVE_STORE, else /etc/cove/store.json), runs `cove-store pull NAME`
 * (beside this executable) and returns its exit status: 0 pulled (or another process pulled it
 * meanwhile: check again), 66 removed from the store, other failures as it says on stderr.
 * -1 when no store is configured.
 */
int store_try_pull(const char *name);
/* The same with `cove-store tombstone NAME`: 0 written (or there already). -1: no store. */
int store_try_tombstone(const char *name);
/* `cove-store push NAME` (a stopped sandbox's newest generation): 0 committed. -1: no store. */
int store_try_push(const char *name);

#endif
