/* chunk_queue.c: the bounded FIFO of typed chunks behind a session's output and its stdin feed. */
#include "chunk_queue.h"

#include <stdlib.h>
#include <string.h>

void chunkq_push(struct chunk_queue *q, pthread_mutex_t *lock, pthread_cond_t *cond, size_t max,
		 uint8_t type, const void *buf, size_t len)
{
	struct chunk *c = malloc(sizeof(*c) + len);

	if (!c)
		return;
	c->next = NULL;
	c->type = type;
	c->len = (uint32_t)len;
	memcpy(c->data, buf, len);
	pthread_mutex_lock(lock);
	while (q->bytes >= max)
		pthread_cond_wait(cond, lock);
	if (q->tail)
		q->tail->next = c;
	else
		q->head = c;
	q->tail = c;
	q->bytes += len;
	pthread_cond_broadcast(cond);
	pthread_mutex_unlock(lock);
}

struct chunk *chunkq_pop_locked(struct chunk_queue *q)
{
	struct chunk *c = q->head;

	if (!c)
		return NULL;
	q->head = c->next;
	if (!q->head)
		q->tail = NULL;
	q->bytes -= c->len;
	return c;
}

void chunkq_unpop_locked(struct chunk_queue *q, struct chunk *c)
{
	c->next = q->head;
	q->head = c;
	if (!q->tail)
		q->tail = c;
	q->bytes += c->len;
}

void chunkq_clear(struct chunk_queue *q)
{
	while (q->head) {
		struct chunk *c = q->head;

		q->head = c->next;
		free(c);
	}
	q->tail = NULL;
	q->bytes = 0;
}
