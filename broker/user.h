/* Running the broker as its own user: looking up the accounts and dropping root. */
#ifndef COVE_BROKER_USER_H
#define COVE_BROKER_USER_H

#include <stddef.h>
#include <sys/types.h>

struct broker_user {
	uid_t uid;
	gid_t gid;
};

/* Looks up a user by name or number. Returns 0, or -ENOENT/-EINVAL with a line in err. */
int broker_user_lookup(const char *name, struct broker_user *u, char *err, size_t errlen);

/* Drops every group and becomes u for good (setgroups, setgid, setuid), then checks that root
 * cannot be regained, and stays non-dumpable. Needs root. Returns 0 or -errno with err set. */
int broker_user_drop(const struct broker_user *u, char *err, size_t errlen);

#endif
