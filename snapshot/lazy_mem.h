/* Lazy restore of encrypted layers: a userfaultfd thread decrypts each page the first time anything touches it. */
#ifndef COVE_LAZY_MEM_H
#define COVE_LAZY_MEM_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "snapshot/layer_restore.h"
#include "snapshot/snap_crypt.h"

struct vm;

struct lazy_mem {
	struct vm *vm;
	struct layer_set *ls;	/* owned once started */
	struct crypto_ctx *cc;	/* the thread's own AES-GCM context */
	uint8_t chain_id[16];
	int uffd, stop_efd;
	pthread_t thread;
	bool started;
	uint8_t *cipher, *plain; /* one page each */
	uint64_t faults, zero_pages, bad_pages;
};

/*
 * Registers all of the VM's RAM (a fresh, empty memfd) with userfaultfd and starts the thread
 * that serves missing pages from the newest layer holding them: decrypted and authenticated
 * (AES-GCM tag) before UFFDIO_COPY, or zero.  A page that fails authentication is never given
 * to the guest: the VM is stopped with a message naming layer and page.  Takes ownership of
 * `ls`. 0 or -errno with a message in `err`.
 */
int lazy_mem_start(struct lazy_mem *lm, struct vm *vm, struct layer_set *ls,
		   const struct snap_crypt *sc, char *err, size_t errlen);
void lazy_mem_stop(struct lazy_mem *lm);
/*
 * Eager check (restore --verify): authenticates every stored page of every layer before the
 * guest runs.  0, or -EBADMSG naming the first bad page in `err`.
 */
int lazy_mem_verify_all(const struct layer_set *ls, const struct snap_crypt *sc, char *err,
			size_t errlen);

#endif
