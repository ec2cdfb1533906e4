/* Sealing a memory layer's staged pages: AES-256-GCM in place, on several threads, with the tags
 * gathered in whole 4 KiB blocks of the tag region so the layer can be written with O_DIRECT. */
#ifndef COVE_LAYER_SEAL_H
#define COVE_LAYER_SEAL_H

#include <stddef.h>
#include <stdint.h>

#include "snapshot/crypto.h"
#include "snapshot/layer_write.h"

/* Tags per 4 KiB block of the tag region (16 bytes per page). */
#define SEAL_TAGS_PER_BLOCK 256u
/* Below this many pages one thread seals (a thread costs more than it saves). */
#define SEAL_PAGES_PER_THREAD_MIN 512u
#define SEAL_THREADS_MAX	  4u

/* What to seal: the pages of `ext` (data extents of a layer: file_off = data_off + page * 4096),
 * in any order, no page twice. */
struct seal_job {
	struct crypto_ctx *cc;	    /* the caller's context, the layer registered */
	const struct snap_key *key; /* for the other threads' contexts */
	const uint8_t *chain_id;
	uint64_t layer_id;
	const uint8_t *salt;
	uint64_t data_off, tag_off; /* the layer's, both 4 KiB aligned */
	uint8_t *buf;		    /* the staging buffer the extents point into */
	const struct write_extent *ext;
	size_t n;
};

/* The tag blocks the pages touched: an aligned buffer and its extents (file offsets). */
struct seal_tags {
	uint8_t *buf;
	size_t len;
	struct write_extent *ext;
	size_t n;
};

/*
 * Seals every page of the job in place (page p of the layer under nonce (layer, p)), on up to
 * `threads` threads (each its own context keyed for this layer only), and fills `tags`: every
 * 4 KiB block of the tag region that holds a tag of these pages, whole (entries of other pages
 * zero, as the sparse file reads them), so the tag writes are block aligned. 0 or -errno (no
 * partial result is kept: tags freed).
 */
int layer_seal(const struct seal_job *j, unsigned threads, struct seal_tags *tags);
void seal_tags_free(struct seal_tags *t);

/*
 * The same job sealed batch by batch, so that each batch can be written while the next is
 * sealed (snapshot/seal_write.h): begin plans the tags (as layer_seal fills them) and gives the
 * job's extents ascending in the file and cut to at most max_len bytes each (*ext, *n: valid
 * until end), which the batches index; layer_seal_extents seals extents [e0, e1) of those on
 * the calling thread with cc (NULL: the job's context; another thread needs a context of its
 * own, keyed for the layer). 0 or -errno; after an error of begin's the tags are freed, else the
 * caller frees them.
 */
struct seal_plan;
int layer_seal_begin(const struct seal_job *j, uint64_t max_len, struct seal_tags *tags,
		     struct seal_plan **out, const struct write_extent **ext, size_t *n);
int layer_seal_extents(struct seal_plan *sp, struct crypto_ctx *cc, size_t e0, size_t e1);
void layer_seal_end(struct seal_plan *sp);

/* A context for another sealing thread, keyed for the job's layer only (no other layer's subkey
 * derived): 0, or -errno with *cc NULL. */
int layer_seal_ctx(const struct seal_job *j, struct crypto_ctx **cc);

/* The number of sealing threads for `pages` pages on this host (1..SEAL_THREADS_MAX). */
unsigned layer_seal_threads(uint64_t pages);

#endif
