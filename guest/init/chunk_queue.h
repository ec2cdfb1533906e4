/* chunk_queue.h: a bounded FIFO of typed byte chunks between agent threads (output, stdin). */
#ifndef COVE_CHUNK_QUEUE_H
#define COVE_CHUNK_QUEUE_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

struct chunk {
	struct chunk *next;
	uint8_t type;
	uint32_t len;
	uint8_t data[];
};

/* Guarded by a lock its owner holds; `bytes` counts the data queued. */
struct chunk_queue {
	struct chunk *head, *tail;
	size_t bytes;
};

/*
 * Copies buf into a new chunk and appends it, taking lock; while the queue holds max bytes or
 * more it waits on cond (the reader broadcasts it as it takes chunks), so a full queue holds the
 * writer up instead of dropping bytes. Broadcasts cond once the chunk is in. Out of memory: the
 * bytes are dropped.
 */
void chunkq_push(struct chunk_queue *q, pthread_mutex_t *lock, pthread_cond_t *cond, size_t max,
		 uint8_t type, const void *buf, size_t len);
/* With the lock held: the first chunk taken off (NULL if empty), and put back in front. */
struct chunk *chunkq_pop_locked(struct chunk_queue *q);
void chunkq_unpop_locked(struct chunk_queue *q, struct chunk *c);
/* Frees every chunk (no lock: the last user). */
void chunkq_clear(struct chunk_queue *q);

#endif
