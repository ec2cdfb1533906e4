/* cove-broker's jail profile: once its files and sockets are open, the sandbox is out of sight. */
#ifndef COVE_BROKER_CONFINE_H
#define COVE_BROKER_CONFINE_H

#include <stddef.h>

#define BROKER_CONFINE_MAX 4

/*
 * --confine DIR: a mount namespace of its own (a user namespace first when not root) where
 * each DIR (the sandbox's state and runtime directories: its chain, disks, console and the
 * VMM's sockets) is an empty read-only tmpfs. Call once the policy, audit key, audit log and
 * sockets are open: the broker keeps them by fd. Its network, the user's secret store and
 * helper exec (pass, gpg) stay. 0; 1 when namespaces cannot be had here (not root and no user
 * namespaces: unconfined, err says so); -errno with one line in err.
 */
int broker_confine(const char *const *dirs, int n, char *err, size_t errlen);
/* Every capability dropped (the uid stays, for the secret store), then no_new_privs: 0 or
 * -errno with one line in err. */
int broker_drop_caps(char *err, size_t errlen);

#endif
