/*
 * The lease holder of a running sandbox: two threads of `cove-store follow` (outside the jail).
 * The renewer renews the lease every third of its time to live, resumes the VM once renewed,
 * and ends the VM when the lease has moved to another host. The guard pauses the VM when the
 * lease was not renewed in time (margin: the clock skew + 3 s before expiry), however long a
 * renewal attempt blocks.
 */
#ifndef COVE_STORE_LEASE_KEEPER_H
#define COVE_STORE_LEASE_KEEPER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <sys/types.h>

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
	/* the VMM this keeper answers for, once it runs (0 before): the only one it may end */
	_Atomic pid_t vmm;
	/* out, read by the uploader: no commit while paused; lost: the lease moved on */
	atomic_bool paused;
	atomic_bool lost;
	/* private */
	int64_t margin_ms;
	bool stop;
	pthread_t thread;
	pthread_t guard;
	pthread_mutex_t mu; /* guards held against the guard thread, stop, and set_paused calls */
	pthread_cond_t cv;
};

int lease_keeper_start(struct lease_keeper *k);
/*
 * True while this host's record of the lease (STORE_LEASE_FILE) is still the one this keeper
 * holds: same epoch, held. A later start here (a new epoch) or a release makes it false, and a
 * keeper that is no longer current ends without touching the sandbox's newer VMM.
 */
bool lease_keeper_current(const struct lease_keeper *k);
void lease_keeper_stop(struct lease_keeper *k);

#endif
