/*
 * The lease holder of a running sandbox: a thread of `cove-store follow` (outside the jail)
 * that renews the lease every third of its time to live, pauses the VM when it could not renew
 * in time (margin: the clock skew + 3 s before expiry) and resumes it once renewed, and ends
 * the VM when the lease has moved to another host.
 */
#ifndef COVE_STORE_LEASE_KEEPER_H
#define COVE_STORE_LEASE_KEEPER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>

#include "common/log.h"
#include "lifecycle/store/lease.h"

struct lease_keeper {
	/* in: a client of its own (one thread per client), the sandbox's directory, the lease */
	struct s3_client *c;
	const struct store_config *cfg;
	int dfd;
	struct store_lease held;
	struct logger *log;
	int (*set_paused)(void *arg, bool paused); /* over the VM's API: 0 done */
	void *arg;
	/* out, read by the uploader: no commit while paused; lost: the lease moved on */
	atomic_bool paused;
	atomic_bool lost;
	/* private */
	int64_t margin_ms;
	bool stop;
	pthread_t thread;
	pthread_mutex_t mu;
	pthread_cond_t cv;
};

int lease_keeper_start(struct lease_keeper *k);
void lease_keeper_stop(struct lease_keeper *k);

#endif
