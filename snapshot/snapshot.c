/* Taking snapshots of a running VM into a chain directory: short pause, staged pages, io_uring
 * write, create-only commit. */
#include "snapshot/snapshot.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "common/clock.h"
#include "common/crc32.h"
#include "common/dirfd_io.h"
#include "common/file_io.h"
#include "snapshot/board_state.h"
#include "snapshot/compact.h"
#include "snapshot/digest.h"
#include "vmm/dirty_log.h"
#include "common/errmsg.h"
#include "snapshot/keyfile.h"
#include "snapshot/keyprov.h"
#include "snapshot/kvm_state.h"
#include "snapshot/seal_write.h"
#include "snapshot/mem_layer.h"
#include "snapshot/snap_crypt.h"
#include "snapshot/state_file.h"
#include "vmm/vm.h"

int snap_ctx_init(struct snap_ctx *s, struct vm *vm, struct board *board, const char *config_json,
		  const char *dir, char *err, size_t errlen)
{
	memset(s, 0, sizeof(*s));
	s->dfd = -1;
	s->vm = vm;
	s->board = board;
	s->method = WRITE_URING;
	s->stage_max = SNAP_DEFAULT_STAGE_MAX;
	/* Benchmark knobs (bench/snapshot compares writers side by side in one run). */
	const char *w = getenv("COVE_SNAP_WRITER");
	if (w && !strcmp(w, "pwrite"))
		s->method = WRITE_PWRITE;
	const char *smax = getenv("COVE_SNAP_STAGE_MAX_MIB");
	if (smax && atoll(smax) > 0)
		s->stage_max = (uint64_t)atoll(smax) << 20;
	/*
	 * O_DIRECT by default: bench/snapshot measured io_uring + O_DIRECT at 0.43-0.89x the
	 * write time of buffered io_uring from 1 MiB to 1 GiB on this project's machines.
	 */
	s->direct = true;
	const char *dio = getenv("COVE_SNAP_DIRECT");
	if (dio && !strcmp(dio, "0"))
		s->direct = false;
	/*
	 * Pre-copy: dirty pages are staged with the guest running and only those it writes
	 * again are copied in the pause (bench/pause: the copy was most of a box pause).
	 */
	s->precopy = true;
	const char *pc = getenv("COVE_SNAP_PRECOPY");
	if (pc && !strcmp(pc, "0"))
		s->precopy = false;
	s->keep = SNAP_DEFAULT_KEEP;
	if (snprintf(s->dir, sizeof(s->dir), "%s", dir) >= (int)sizeof(s->dir))
		return errmsg(err, errlen, -ENAMETOOLONG, "snapshot directory name is too long");
	s->dfd = dirfd_open_dir(dir, true, err, errlen);
	if (s->dfd < 0)
		return s->dfd;
	s->config_json = strdup(config_json);
	size_t words = (size_t)((vm->mem.size / PAGE_SIZE + 63) / 64);
	/* mmap: untouched, the bitmap costs no memory until a snapshot uses it. */
	void *bm = mmap(NULL, words * 8, PROT_READ | PROT_WRITE,
			MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (!s->config_json || bm == MAP_FAILED) {
		free(s->config_json);
		s->config_json = NULL;
		close(s->dfd);
		s->dfd = -1;
		return -ENOMEM;
	}
	s->bitmap = bm;
	bm = mmap(NULL, words * 8, PROT_READ | PROT_WRITE,
		  MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (bm == MAP_FAILED) {
		snap_ctx_free(s);
		return -ENOMEM;
	}
	s->stored_bm = bm;
	bm = mmap(NULL, words * 8, PROT_READ | PROT_WRITE,
		  MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
	if (bm == MAP_FAILED) {
		snap_ctx_free(s);
		return -ENOMEM;
	}
	s->redirty = bm;
	return 0;
}

int snap_ctx_encrypt(struct snap_ctx *s, struct keyprov *prov, char *err, size_t errlen)
{
	if (!prov)
		return errmsg(err, errlen, -EINVAL,
			      "encrypted snapshots need a key provider from the host");
	struct chain c;
	char e2[8];
	int r = chain_load(s->dir, &c, e2, sizeof(e2));
	char keys[4200];
	snprintf(keys, sizeof(keys), "%s/%s", s->dir, KEYFILE_NAME);
	if (r == 0 && c.nr_layers && access(keys, F_OK) != 0)
		return errmsg(err, errlen, -EINVAL,
			      "%s holds an unencrypted chain: use another directory for encrypted "
			      "snapshots",
			      s->dir);
	s->encrypted = true;
	s->prov = prov;
	return 0;
}

void snap_ctx_adopt_chain(struct snap_ctx *s, const struct chain *c)
{
	s->chain = *c;
	snprintf(s->chain.dir, sizeof(s->chain.dir), "%s", s->dir);
	s->have_base = true;
}

void snap_ctx_free(struct snap_ctx *s)
{
	size_t bytes = (size_t)((s->vm->mem.size / PAGE_SIZE + 63) / 64) * 8;
	if (s->bitmap)
		munmap(s->bitmap, bytes);
	if (s->stored_bm)
		munmap(s->stored_bm, bytes);
	s->stored_bm = NULL;
	if (s->redirty)
		munmap(s->redirty, bytes);
	s->redirty = NULL;
	snap_crypt_close(&s->crypt);
	if (s->prov)
		keyprov_free(s->prov);
	s->prov = NULL;
	free(s->config_json);
	s->bitmap = NULL;
	s->config_json = NULL;
	if (s->dfd >= 0)
		close(s->dfd);
	s->dfd = -1;
}

/* Full: every page the guest could have written.  A memfd tells which ranges exist at all. */
static void mark_all_pages(struct snap_ctx *s)
{
	struct guest_mem *m = &s->vm->mem;
	uint64_t pages = m->size / PAGE_SIZE;
	size_t words = (size_t)((pages + 63) / 64);
	if (m->fd < 0 || s->ram_lazy) {
		memset(s->bitmap, 0xff, words * 8);
	} else {
		memset(s->bitmap, 0, words * 8);
		off_t off = 0;
		for (;;) {
			off_t d = lseek(m->fd, off, SEEK_DATA);
			if (d < 0)
				break;
			off_t h = lseek(m->fd, d, SEEK_HOLE);
			if (h < 0)
				h = (off_t)m->size;
			for (uint64_t p = (uint64_t)d / PAGE_SIZE;
			     p < ((uint64_t)h + PAGE_SIZE - 1) / PAGE_SIZE && p < pages; p++)
				s->bitmap[p / 64] |= 1ULL << (p % 64);
			off = h;
		}
	}
	if (pages % 64)
		s->bitmap[words - 1] &= (1ULL << (pages % 64)) - 1;
}

struct stage {
	uint8_t *buf; /* staging copy, or guest RAM itself when not staged */
	size_t buf_len;
	bool staged;
	uint8_t *mapped; /* the staging mapping we own (buf when staged) */
	size_t mapped_len;
	struct write_extent *ext;
	size_t next, cap;
	size_t frozen; /* ext[0..frozen) are the pre-copy's, sorted: never merged into */
	uint64_t used; /* staging bytes filled */
	uint64_t present, stored;
};

/*
 * A staging buffer of at least `bytes`, in huge pages where the host allows, with every page
 * faulted in now (prefault) so the copy in the pause does not take a page fault per page.
 */
static int stage_reserve(struct stage *g, size_t bytes, bool prefault)
{
	size_t len = (bytes + HUGE_PAGE_SIZE - 1) & ~(size_t)(HUGE_PAGE_SIZE - 1);
	void *p = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	if (p == MAP_FAILED)
		return -ENOMEM;
	/* Huge pages only when faulted in ahead: a huge page fault in the pause costs more. */
	if (prefault)
		(void)madvise(p, len, MADV_HUGEPAGE);
	if (prefault && madvise(p, len, 23 /* MADV_POPULATE_WRITE, Linux 5.14 */) < 0)
		for (size_t off = 0; off < len; off += PAGE_SIZE)
			((volatile uint8_t *)p)[off] = 0;
	g->mapped = g->buf = p;
	g->mapped_len = g->buf_len = len;
	return 0;
}

static void stage_release(struct stage *g)
{
	if (g->mapped)
		munmap(g->mapped, g->mapped_len);
	g->mapped = NULL;
	g->mapped_len = 0;
	if (g->staged)
		g->buf = NULL;
}

static int add_extent(struct stage *g, uint64_t file_off, uint64_t buf_off)
{
	struct write_extent *last = g->next > g->frozen ? &g->ext[g->next - 1] : NULL;
	if (last && last->file_off + last->len == file_off &&
	    last->buf_off + last->len == buf_off) {
		g->ext[g->next - 1].len += PAGE_SIZE;
		return 0;
	}
	if (g->next == g->cap) {
		size_t cap = g->cap ? g->cap * 2 : 1024;
		struct write_extent *e = realloc(g->ext, cap * sizeof(*e));
		if (!e)
			return -ENOMEM;
		g->ext = e;
		g->cap = cap;
	}
	g->ext[g->next++] = (struct write_extent){file_off, buf_off, PAGE_SIZE};
	return 0;
}

/* A known run of memfd pages [lo, hi) (bytes), all holes or all data. */
struct hole_cursor {
	uint64_t lo, hi;
	bool hole;
};

/*
 * Memfd RAM: is the page at `off` a hole (given back by the balloon and not written since)?
 * Asked only for discarded pages, so a snapshot without them makes no call; a run found once
 * answers for the pages after it. An lseek error answers "data": the page is then read.
 */
static bool page_is_hole(int fd, uint64_t size, struct hole_cursor *c, uint64_t off)
{
	if (off >= c->lo && off < c->hi)
		return c->hole;
	off_t d = lseek(fd, (off_t)off, SEEK_DATA);
	if (d < 0) {
		*c = (struct hole_cursor){off, errno == ENXIO ? size : off, errno == ENXIO};
		return c->hole;
	}
	if ((uint64_t)d > off) {
		*c = (struct hole_cursor){off, (uint64_t)d, true};
		return true;
	}
	off_t h = lseek(fd, (off_t)off, SEEK_HOLE);
	*c = (struct hole_cursor){off, h > (off_t)off ? (uint64_t)h : off + PAGE_SIZE, false};
	return false;
}

/* Pages set in s->bitmap. */
static uint64_t bitmap_pages(const struct snap_ctx *s)
{
	uint64_t n = 0;
	for (size_t w = 0; w < dirty_log_bitmap_words(s->vm); w++)
		n += (uint64_t)__builtin_popcountll(s->bitmap[w]);
	return n;
}

/* Whether `pages` pages are copied to the staging buffer (else written from guest RAM). */
static bool stageable(const struct snap_ctx *s, uint64_t pages)
{
	/* Encryption seals the staged copy in place: guest RAM itself is never encrypted. */
	return pages * PAGE_SIZE <= s->stage_max || s->encrypted;
}

/*
 * Page `p` of memfd RAM is one the balloon gave back (in `discarded`) and still a hole: a zero
 * page, to be taken without reading it (a read through the mapping would allocate it again).
 */
static bool given_back_hole(const struct guest_mem *m, const uint64_t *discarded,
			    struct hole_cursor *hc, uint64_t p)
{
	return discarded && m->fd >= 0 && discarded[p / 64] & (1ULL << (p % 64)) &&
	       page_is_hole(m->fd, m->size, hc, p * PAGE_SIZE);
}

/*
 * With the VM paused: every page in the bitmap is either all zeros (held, written as a hole)
 * or copied to the staging buffer (or, past stage_max, written later straight from RAM while
 * the VM stays paused).
 */
static int stage_pages(struct snap_ctx *s, const struct mem_layer_info *li, struct stage *g)
{
	struct guest_mem *m = &s->vm->mem;
	uint64_t pages = m->size / PAGE_SIZE;
	size_t words = (size_t)((pages + 63) / 64);
	uint64_t candidates = bitmap_pages(s);
	g->staged = stageable(s, candidates);
	if (g->staged && candidates) {
		/* Usually reserved before the pause; growing here costs page faults in the pause.
		 */
		if (candidates * PAGE_SIZE > g->buf_len) {
			stage_release(g);
			if (stage_reserve(g, candidates * PAGE_SIZE, false))
				g->buf = NULL;
		}
		if (!g->buf) {
			g->staged = false;
			if (s->encrypted)
				return -ENOMEM;
		}
	}
	if (s->encrypted)
		memset(s->stored_bm, 0, words * 8);
	if (!g->staged) {
		g->buf = m->host;
		g->buf_len = m->size;
	}
	/*
	 * Pages the balloon gave back: in a memfd, reading a hole through the mapping would
	 * allocate it again, so a hole is taken as the zero page it reads as, unread. (A private
	 * mapping reads its anonymous zero pages without allocating.) Only a copy: the set is
	 * cleared when the snapshot commits (a pre-copy and the pause both need it).
	 */
	uint64_t *discarded = calloc(words ? words : 1, sizeof(uint64_t));
	if (discarded)
		dirty_log_peek_discarded(s->vm, discarded);
	struct hole_cursor hc = {0, 0, false};
	uint64_t used = g->used;
	for (size_t w = 0; w < words; w++) {
		uint64_t bits = s->bitmap[w];
		while (bits) {
			uint64_t p = (uint64_t)w * 64 + (uint64_t)__builtin_ctzll(bits);
			bits &= bits - 1;
			const uint8_t *src = m->host + p * PAGE_SIZE;
			g->present++;
			if (given_back_hole(m, discarded, &hc, p))
				continue;
			if (mem_page_is_zero(src))
				continue;
			g->stored++;
			if (s->encrypted)
				s->stored_bm[w] |= 1ULL << (p % 64);
			uint64_t buf_off = p * PAGE_SIZE;
			if (g->staged) {
				buf_off = used;
				memcpy(g->buf + used, src, PAGE_SIZE);
				used += PAGE_SIZE;
			}
			int r = add_extent(g, li->data_off + p * PAGE_SIZE, buf_off);
			if (r) {
				free(discarded);
				return r;
			}
		}
	}
	free(discarded);
	g->used = used;
	return 0;
}

/* Where the pre-copy staged page `p`: its staging offset, or -1 (not staged: it was zero). */
static int64_t staged_at(const struct stage *g, const struct mem_layer_info *li, uint64_t p)
{
	uint64_t off = li->data_off + p * PAGE_SIZE;
	size_t lo = 0, hi = g->frozen;
	while (lo < hi) {
		size_t mid = lo + (hi - lo) / 2;
		const struct write_extent *e = &g->ext[mid];
		if (off < e->file_off)
			hi = mid;
		else if (off >= e->file_off + e->len)
			lo = mid + 1;
		else
			return (int64_t)(e->buf_off + (off - e->file_off));
	}
	return -1;
}

/*
 * Paused, after a pre-copy: the pages in s->redirty were written (by the guest or a device)
 * since they were staged, or appeared since. Each is copied again into its staging slot or
 * added; s->bitmap becomes the union. -ENOSPC when the staging buffer is too small for the
 * additions (the caller then stages everything again).
 */
static int restage_run(struct snap_ctx *s, const struct mem_layer_info *li, struct stage *g,
		       const uint64_t *discarded)
{
	struct guest_mem *m = &s->vm->mem;
	size_t words = dirty_log_bitmap_words(s->vm);
	uint64_t pages = m->size / PAGE_SIZE;
	struct hole_cursor hc = {0, 0, false};
	for (size_t w = 0; w < words; w++) {
		uint64_t bits = s->redirty[w];
		while (bits) {
			uint64_t p = (uint64_t)w * 64 + (uint64_t)__builtin_ctzll(bits);
			bits &= bits - 1;
			if (p >= pages)
				break;
			const uint8_t *src = m->host + p * PAGE_SIZE;
			bool held = s->bitmap[w] & (1ULL << (p % 64));
			int64_t at = held ? staged_at(g, li, p) : -1;
			/* Given back by the balloon since the pre-copy: zero, unread. */
			if (given_back_hole(m, discarded, &hc, p)) {
				if (at >= 0) {
					memset(g->buf + at, 0, PAGE_SIZE);
				} else if (!held) { /* held and not staged: a zero page already */
					s->bitmap[w] |= 1ULL << (p % 64);
					g->present++;
				}
				continue;
			}
			if (at >= 0) {
				/* It may be all zeros now: stored as data, still right. */
				memcpy(g->buf + at, src, PAGE_SIZE);
				continue;
			}
			if (!held) {
				s->bitmap[w] |= 1ULL << (p % 64);
				g->present++;
			}
			if (mem_page_is_zero(src))
				continue;
			if (g->used + PAGE_SIZE > g->buf_len)
				return -ENOSPC;
			memcpy(g->buf + g->used, src, PAGE_SIZE);
			int r = add_extent(g, li->data_off + p * PAGE_SIZE, g->used);
			if (r)
				return r;
			g->used += PAGE_SIZE;
			g->stored++;
			if (s->encrypted)
				s->stored_bm[w] |= 1ULL << (p % 64);
		}
	}
	return 0;
}

static int restage_pages(struct snap_ctx *s, const struct mem_layer_info *li, struct stage *g)
{
	size_t words = dirty_log_bitmap_words(s->vm);
	uint64_t *discarded = calloc(words ? words : 1, sizeof(uint64_t));
	if (discarded)
		dirty_log_peek_discarded(s->vm, discarded);
	int r = restage_run(s, li, g, discarded);
	free(discarded);
	return r;
}

static void stage_free(struct stage *g)
{
	stage_release(g);
	free(g->ext);
}

struct progress {
	struct vm *vm;
	uint64_t next_report;
};

static void report_progress(void *opaque, uint64_t done, uint64_t total)
{
	struct progress *pr = opaque;
	if (total >= (256ULL << 20) && done >= pr->next_report) {
		log_info(pr->vm->log, "snapshot: %llu of %llu MiB written",
			 (unsigned long long)(done >> 20), (unsigned long long)(total >> 20));
		pr->next_report = done + (256ULL << 20);
	}
}

/*
 * Encrypts the staged pages in place (AES-256-GCM, nonce from layer id and page number, see
 * snapshot/CRYPTO.md) and writes them, batch by batch: the cipher seals one batch while io_uring
 * writes the ones before it (layer_seal_write); their tags follow in whole 4 KiB blocks of the
 * tag region (O_DIRECT as well).
 */
static int seal_and_write(struct snap_ctx *s, int fd, const struct mem_layer_info *li,
			  struct stage *g, struct progress *pr)
{
	struct seal_job j = {.cc = s->crypt.cc,
			     .key = s->crypt.key,
			     .chain_id = s->crypt.chain_id,
			     .layer_id = li->layer_id,
			     .salt = li->salt,
			     .data_off = li->data_off,
			     .tag_off = li->tag_off,
			     .buf = g->buf,
			     .ext = g->ext,
			     .n = g->next};
	/* A helper seals ahead where this host has a second core (and enough pages for it). */
	return layer_seal_write(s->ring, fd, s->method, &j, g->buf_len, SEAL_BATCH,
				layer_seal_threads(g->stored) > 1 ? 1 : 0, report_progress, pr);
}

/*
 * Writes the layer file under a fresh temporary name (into tmp[cap]); the caller renames it
 * once all is synced. Nothing is unlinked first: names are unique per process and attempt.
 */
static int write_mem_layer(struct snap_ctx *s, const char *final, char *tmp, size_t cap,
			   struct mem_layer_info *li, struct stage *g, char *err, size_t errlen)
{
	int fd = -EINVAL;
	tmp[0] = 0;
	fd = dirfd_create_tmp(s->dfd, final, tmp, cap, O_WRONLY, 0600);
	if (fd < 0)
		return errmsg(err, errlen, fd, "cannot create a temporary file for %s/%s: %s",
			      s->dir, final, strerror(-fd));
	/* O_DIRECT where the file system takes it (tmpfs and some others refuse it). */
	if (s->direct) {
		int fl = fcntl(fd, F_GETFL);
		if (fl >= 0)
			(void)fcntl(fd, F_SETFL, fl | O_DIRECT);
	}
	int r;
	/* Header and bitmap in one aligned buffer (O_DIRECT wants 4 KiB alignment). */
	size_t meta = (size_t)li->data_off;
	uint8_t *hb = aligned_alloc(4096, meta);
	if (!hb) {
		r = -ENOMEM;
		goto out;
	}
	memset(hb, 0, meta);
	memcpy(hb + li->bitmap_off, s->bitmap, li->bitmap_len);
	size_t bms = (size_t)li->bitmap_len;
	if (s->encrypted) {
		memcpy(hb + li->stored_off, s->stored_bm, li->bitmap_len);
		bms *= 2;
	}
	li->bitmap_crc = crc32_update(0, hb + li->bitmap_off, bms);
	/* A fresh salt per layer, in the header before the digest covers it (CRYPTO.md). */
	if (s->encrypted) {
		r = snap_crypt_new_layer(&s->crypt, li->layer_id, li->salt);
		if (r) {
			errmsg(err, errlen, r, "encrypting the layer: %s", strerror(-r));
			free(hb);
			goto out;
		}
	}
	mem_layer_header_build(li, hb);
	if (s->encrypted) {
		r = snap_crypt_seal_meta(&s->crypt, hb, hb + li->bitmap_off, bms, li->meta);
		if (r) {
			errmsg(err, errlen, r, "encrypting the layer: %s", strerror(-r));
			free(hb);
			goto out;
		}
		mem_layer_header_build(li, hb);
	}
	if (ftruncate(fd, (off_t)mem_layer_file_size(li)) < 0) {
		r = errmsg(err, errlen, -errno, "cannot size %s: %s", tmp, strerror(errno));
		free(hb);
		goto out;
	}
	r = pwrite_full(fd, hb, meta, 0);
	free(hb);
	if (r) {
		errmsg(err, errlen, r, "writing %s: %s", tmp, strerror(-r));
		goto out;
	}
	struct progress pr = {s->vm, 256ULL << 20};
	if (s->encrypted && g->stored)
		r = seal_and_write(s, fd, li, g, &pr);
	else
		r = layer_write_extents_ring(s->ring, fd, s->method, g->buf, g->buf_len, g->ext,
					     g->next, report_progress, &pr);
	if (r) {
		errmsg(err, errlen, r, "writing %s: %s", tmp, strerror(-r));
		goto out;
	}
	if (fdatasync(fd) < 0)
		r = errmsg(err, errlen, -errno, "syncing %s: %s", tmp, strerror(errno));
out:
	close(fd);
	return r;
}

/* Writes the state file under a fresh temporary name (into tmp[cap]) and digests its bytes. */
static int write_state(struct snap_ctx *s, uint64_t id, const char *final, char *tmp, size_t cap,
		       const struct state_buf *b, uint8_t sha[DIGEST_LEN], char *err, size_t errlen)
{
	tmp[0] = 0;
	const uint8_t *data = b->p;
	size_t len = b->len;
	uint8_t *sealed = NULL;
	if (s->encrypted) {
		int r = snap_crypt_seal_state(&s->crypt, id, b->p, b->len, &sealed, &len);
		if (r)
			return errmsg(err, errlen, r, "encrypting the state file: %s",
				      strerror(-r));
		data = sealed;
	}
	int r = digest_buf(data, len, sha);
	if (r) {
		free(sealed);
		return errmsg(err, errlen, r, "digest of the state file: %s", strerror(-r));
	}
	int fd = dirfd_create_tmp(s->dfd, final, tmp, cap, O_WRONLY, 0600);
	if (fd < 0) {
		free(sealed);
		return errmsg(err, errlen, fd, "cannot create a temporary file for %s/%s: %s",
			      s->dir, final, strerror(-fd));
	}
	r = pwrite_full(fd, data, len, 0);
	free(sealed);
	if (!r && fdatasync(fd) < 0)
		r = -errno;
	close(fd);
	if (r)
		errmsg(err, errlen, r, "writing %s: %s", tmp, strerror(-r));
	return r;
}

/*
 * Files of layers no longer in the chain (after a full snapshot or compaction), best effort:
 * in the jail unlink answers EPERM and chain_settle removes them on the host side.
 */
static void remove_unlisted(const struct chain *before, const struct chain *after, int dfd)
{
	for (int i = 0; i < before->nr_layers; i++) {
		const struct chain_layer *o = &before->layers[i];
		bool mem_used = false, state_used = false;
		for (int j = 0; j < after->nr_layers; j++) {
			mem_used |= !strcmp(after->layers[j].mem, o->mem);
			state_used |= !strcmp(after->layers[j].state, o->state);
		}
		/* Names from chain.json are plain names (chain_parse): only files beneath dfd go.
		 */
		if (!mem_used)
			(void)dirfd_unlink(dfd, o->mem);
		if (!state_used)
			(void)dirfd_unlink(dfd, o->state);
	}
}

/* One snapshot being taken: what the before-pause, paused and commit steps hand on. */
struct take {
	bool full;
	bool was_paused; /* paused by its owner before the snapshot: stays paused */
	bool paused;	 /* paused by us and not yet resumed */
	bool collected;	 /* the dirty log was read into s->bitmap: merge it back on failure */
	bool precopied;	 /* pages were staged before the pause; the pause adds s->redirty */
	uint64_t pre_pages;
	uint64_t id;
	const struct chain_layer *prev; /* the parent layer (Diff) */
	struct chain *next;		/* chain.json after this layer (heap: ~45 KiB) */
	struct chain *old;		/* Full: the chain it replaces, whose files go after */
	bool old_ok;
	struct state_buf sb;
	struct stage g;
	struct mem_layer_info li;
	uint64_t t_pre, t0, t_resumed;
	uint64_t t_paused, t_prepared, t_kvm; /* debug split of the pause */
};

/*
 * The layer id to write: one past the parent's, or (encrypted) from the keys file's durable
 * counter, opening the data key at the first snapshot.
 */
static int take_layer_id(struct snap_ctx *s, struct take *t, char *err, size_t errlen)
{
	t->id = s->have_base && t->prev ? t->prev->id + 1 : 1;
	if (!s->encrypted)
		return 0;
	/*
	 * Nonces come from (layer id, page): an id must never seal twice under this key, even if
	 * a write died half way, so ids come from the keys file's durable counter.
	 */
	int r;
	if (!s->crypt.key) {
		r = snap_crypt_open_key(&s->crypt, s->dir, s->prov, 1, s->inherit_key, err, errlen);
		if (r)
			return r;
	}
	r = keyfile_next_layer_id(s->dir, &t->id, err, errlen);
	if (!r && t->id == 0) /* 0 means "no parent" in a chain: skip it */
		r = keyfile_next_layer_id(s->dir, &t->id, err, errlen);
	if (r)
		return r;
	if (t->full)
		memcpy(t->next->chain_id, s->crypt.chain_id, 16);
	return 0;
}

/* A file of layer `id` exists (committed or left by a snapshot that died). */
static bool id_taken(int dfd, uint64_t id)
{
	char n[CHAIN_NAME_MAX];
	struct stat st;
	snprintf(n, sizeof(n), "mem-%06llu", (unsigned long long)id);
	if (fstatat(dfd, n, &st, AT_SYMLINK_NOFOLLOW) == 0)
		return true;
	snprintf(n, sizeof(n), "state-%06llu", (unsigned long long)id);
	return fstatat(dfd, n, &st, AT_SYMLINK_NOFOLLOW) == 0;
}

/*
 * Before the pause: the next chain, the layer id (key provider calls included) and a staging
 * buffer sized from what is dirty now (plus a margin for what the guest writes before the
 * pause), faulted in. The VM runs throughout.
 */
static int take_before_pause(struct snap_ctx *s, struct take *t, char *err, size_t errlen)
{
	struct vm *vm = s->vm;
	t->next = malloc(sizeof(*t->next));
	if (!t->next)
		return -ENOMEM;
	if (t->full) {
		memset(t->next, 0, sizeof(*t->next));
		snprintf(t->next->dir, sizeof(t->next->dir), "%s", s->dir);
		if (getrandom(t->next->chain_id, sizeof(t->next->chain_id), 0) !=
		    sizeof(t->next->chain_id))
			return errmsg(err, errlen, -EIO, "no randomness for a chain id");
		t->next->ram_size = vm->mem.size;
		t->next->no_replace = s->chain.no_replace; /* the jail refused it already */
	} else {
		*t->next = s->chain;
	}
	t->prev = chain_latest(&s->chain);
	int r = take_layer_id(s, t, err, errlen);
	if (r)
		return r;
	/*
	 * A full layer starts a new chain: ids keep growing past the old chain's so file names
	 * never clash, and the old chain's files go once the new chain.json is in place.
	 */
	if (t->full) {
		char e2[8];
		t->old = malloc(sizeof(*t->old));
		if (!t->old)
			return -ENOMEM;
		t->old_ok = chain_load(s->dir, t->old, e2, sizeof(e2)) == 0;
		if (!s->encrypted && t->old_ok && chain_latest(t->old) &&
		    chain_latest(t->old)->id >= t->id)
			t->id = chain_latest(t->old)->id + 1;
	}
	/*
	 * A plain chain's id is its parent's plus one; files of that id left by a snapshot that
	 * died before its commit cannot be replaced (RENAME_NOREPLACE), so the id moves past them.
	 */
	for (int i = 0; !s->encrypted && i < 1024 && id_taken(s->dfd, t->id); i++)
		t->id++;
	int64_t cnt = -1;
	if (t->full) {
		mark_all_pages(s);
		cnt = (int64_t)bitmap_pages(s);
	} else {
		cnt = dirty_log_count(vm);
	}
	if (cnt > 0 && (uint64_t)cnt * PAGE_SIZE <= s->stage_max)
		(void)stage_reserve(&t->g, (size_t)cnt * PAGE_SIZE * 5 / 4 + HUGE_PAGE_SIZE, true);
	return 0;
}

/* The layer's header fields known before its pages are. */
static void take_layer_info(struct snap_ctx *s, struct take *t)
{
	struct mem_layer_info *li = &t->li;
	li->flags = (t->full ? MEM_LAYER_FULL : 0) | (s->encrypted ? MEM_LAYER_ENCRYPTED : 0);
	mem_layer_layout(li, s->vm->mem.size);
	li->layer_id = t->id;
	li->parent_id = t->full ? 0 : t->prev->id;
	memcpy(li->chain_id, t->next->chain_id, 16);
}

/* Forgets what was staged, keeping the staging buffer. */
static void stage_reset(struct stage *g)
{
	g->buf = g->mapped;
	g->buf_len = g->mapped_len;
	g->staged = false;
	g->next = g->frozen = 0;
	g->used = g->present = g->stored = 0;
}

/*
 * Before the pause, the VM running: the dirty log is read and re-armed (Full: logging starts,
 * every page counts) and those pages are staged. A page the guest writes after this is logged
 * again and copied once more in the pause, so the layer still holds every page as it was at
 * the pause. The VMM's own bitmap is left for the pause. Nothing is staged here when the
 * pages do not fit the staging buffer reserved for them.
 */
static int take_precopy(struct snap_ctx *s, struct take *t, char *err, size_t errlen)
{
	struct vm *vm = s->vm;
	if (!s->precopy || !t->g.buf || t->was_paused || (!t->full && !vm->track_dirty))
		return 0;
	int r;
	if (t->full) {
		r = dirty_log_start(vm);
		if (!r) /* discarded: every page is copied after this */
			r = dirty_log_collect_kvm(vm, s->redirty);
		if (r)
			return errmsg(err, errlen, r, "cannot start dirty page tracking: %s",
				      strerror(-r));
		mark_all_pages(s);
	} else {
		r = dirty_log_collect_kvm(vm, s->bitmap);
		if (r)
			return errmsg(err, errlen, r, "cannot read the dirty page log: %s",
				      strerror(-r));
		t->collected = true;
	}
	/* Too many to stage: the pause writes them from guest RAM, so copying now would only
	 * read them twice. */
	if (!stageable(s, bitmap_pages(s)))
		return 0;
	take_layer_info(s, t);
	r = stage_pages(s, &t->li, &t->g);
	if (r || !t->g.staged) {
		stage_reset(&t->g); /* the pause stages them all */
		return r == -ENOMEM ? 0 : r;
	}
	t->g.frozen = t->g.next;
	t->pre_pages = t->g.present;
	t->precopied = true;
	return 0;
}

/* Paused: the state file (machine description, vCPUs, devices), after the owner's prepare. */
static int take_state(struct snap_ctx *s, struct take *t, char *err, size_t errlen)
{
	state_buf_init(&t->sb);
	t->t_paused = mono_us();
	board_quiesce(s->board);
	if (s->prepare) {
		char *cfg = NULL;
		int r = s->prepare(s->prepare_opaque, t->id, &cfg, err, errlen);
		if (r)
			return r;
		if (cfg) {
			free(s->config_json);
			s->config_json = cfg;
		}
	}
	state_put(&t->sb, SEC_CONFIG, 0, s->config_json, strlen(s->config_json));
	t->t_prepared = mono_us();
	int r = kvm_state_save(s->vm, &t->sb);
	if (r)
		return errmsg(err, errlen, r, "cannot read the vCPU state: %s", strerror(-r));
	t->t_kvm = mono_us();
	board_save(s->board, &t->sb);
	r = state_finish(&t->sb);
	if (r)
		return errmsg(err, errlen, r, "cannot build the state file: %s", strerror(-r));
	return 0;
}

/* Paused: which pages the layer holds (Full: all, and KVM logs writes from now on). */
static int take_dirty(struct snap_ctx *s, struct take *t, char *err, size_t errlen)
{
	int r;
	if (t->full) {
		/* From here on KVM logs writes, so the next snapshot can be a Diff of this one. */
		r = dirty_log_start(s->vm);
		if (!r)
			r = dirty_log_collect(s->vm,
					      s->bitmap); /* discarded: this layer has it all */
		if (r)
			return errmsg(err, errlen, r, "cannot start dirty page tracking: %s",
				      strerror(-r));
		mark_all_pages(s);
		return 0;
	}
	/* After a pre-copy that staged nothing, s->bitmap already holds what it collected. */
	r = dirty_log_collect(s->vm, t->collected ? s->redirty : s->bitmap);
	if (r)
		return errmsg(err, errlen, r, "cannot read the dirty page log: %s", strerror(-r));
	if (t->collected)
		for (size_t w = 0; w < dirty_log_bitmap_words(s->vm); w++)
			s->bitmap[w] |= s->redirty[w];
	t->collected = true;
	return 0;
}

/*
 * Paused, after a pre-copy: what was written since is copied again or added; s->bitmap ends
 * as the union (also on failure, so a failed snapshot gives every page back).
 */
static int take_restage(struct snap_ctx *s, struct take *t)
{
	int r = restage_pages(s, &t->li, &t->g);
	for (size_t w = 0; w < dirty_log_bitmap_words(s->vm); w++)
		s->bitmap[w] |= s->redirty[w];
	if (r == -ENOSPC) {
		/* More was written than the buffer has room for: stage it all again. */
		stage_reset(&t->g);
		r = stage_pages(s, &t->li, &t->g);
	}
	return r;
}

/*
 * Paused: state, dirty pages and their staging. The VM runs again on return when the pages
 * were staged; otherwise it stays paused until they are written from guest RAM.
 */
static int take_paused(struct snap_ctx *s, struct take *t, char *err, size_t errlen)
{
	struct vm *vm = s->vm;
	t->t0 = mono_us();
	int r = vm_pause(vm);
	if (r)
		return errmsg(err, errlen, r, "cannot pause the VM: it is not running");
	t->paused = !t->was_paused;
	r = take_state(s, t, err, errlen);
	if (r)
		return r;
	uint64_t t_q = mono_us();
	struct mem_layer_info *li = &t->li;
	if (t->precopied) {
		r = dirty_log_collect(vm, s->redirty);
		if (r)
			return errmsg(err, errlen, r, "cannot read the dirty page log: %s",
				      strerror(-r));
	} else {
		r = take_dirty(s, t, err, errlen);
		if (r)
			return r;
		take_layer_info(s, t);
	}
	uint64_t t_c = mono_us();
	r = t->precopied ? take_restage(s, t) : stage_pages(s, li, &t->g);
	uint64_t t_s = mono_us();
	if (r)
		return errmsg(err, errlen, r, "cannot stage pages: %s", strerror(-r));
	li->present = t->g.present;
	li->stored = t->g.stored;
	t->t_resumed = mono_us();
	if (t->g.staged && t->paused) {
		vm_resume(vm);
		t->paused = false;
		t->t_resumed = mono_us();
	}
	log_debug(vm->log,
		  "snapshot pause: stop %llu us, quiesce+prepare %llu us, kvm state %llu us, "
		  "devices %llu us, dirty log %llu us, %s %llu us (%llu pages pre-copied)",
		  (unsigned long long)(t->t_paused - t->t0),
		  (unsigned long long)(t->t_prepared - t->t_paused),
		  (unsigned long long)(t->t_kvm - t->t_prepared),
		  (unsigned long long)(t_q - t->t_kvm), (unsigned long long)(t_c - t_q),
		  t->precopied ? "re-staging" : "staging", (unsigned long long)(t_s - t_c),
		  (unsigned long long)t->pre_pages);
	return 0;
}

/* The digest of `name` (a committed file of the chain) from what is known, else read. */
static int known_or_read(struct snap_ctx *s, const struct take *t, const char *name,
			 uint8_t out[DIGEST_LEN])
{
	const uint8_t *d = chain_digest_get(&s->chain, name);
	if (!d && t->old_ok)
		d = chain_digest_get(t->old, name);
	if (d) {
		memcpy(out, d, DIGEST_LEN);
		return 0;
	}
	return digest_file_at(s->dfd, name, out);
}

/*
 * The digests the next generation records beside the new layer's own: the frozen disk layers
 * the saved machine description names, and (a chain from before digests) every older layer's
 * files, read once here. Known digests are copied, never recomputed.
 */
static int take_digests(struct snap_ctx *s, struct take *t, char *err, size_t errlen)
{
	struct chain *n = t->next;
	char(*names)[64] = malloc(CHAIN_MAX_DIGESTS * sizeof(*names));
	if (!names)
		return -ENOMEM;
	int nd = 0;
	int r = digest_config_files(s->config_json, strlen(s->config_json), names,
				    CHAIN_MAX_DIGESTS, &nd);
	if (r)
		errmsg(err, errlen, r, "the machine description names bad disk layers");
	for (int i = 0; !r && i < nd + 2 * n->nr_layers; i++) {
		const char *name = i < nd	  ? names[i]
				   : (i - nd) % 2 ? n->layers[(i - nd) / 2].state
						  : n->layers[(i - nd) / 2].mem;
		if (chain_digest_get(n, name))
			continue;
		uint8_t d[DIGEST_LEN];
		r = known_or_read(s, t, name, d);
		if (r) {
			errmsg(err, errlen, r, "cannot digest %s/%s: %s", s->dir, name,
			       strerror(-r));
			break;
		}
		r = chain_digest_set(n, name, d);
		if (r)
			errmsg(err, errlen, r, "cannot record the digest of %s/%s", s->dir, name);
	}
	free(names);
	return r;
}

/*
 * Commit: the layer and state files under fresh temporary names, synced, renamed into place
 * without replacing anything (RENAME_NOREPLACE), their digests recorded, then the next
 * chain generation created (the commit point). Nothing is replaced or unlinked, which the
 * jailed VMM may not do. Resumes a VM still paused once its pages are out. On failure the
 * temporary files go (best effort: the jail answers EPERM, chain_settle removes them later)
 * and nothing saved before changes.
 */
static int take_commit(struct snap_ctx *s, struct take *t, char *err, size_t errlen)
{
	char mem_name[CHAIN_NAME_MAX], state_name[CHAIN_NAME_MAX];
	char tmp_mem[CHAIN_NAME_MAX + 32], tmp_state[CHAIN_NAME_MAX + 32];
	uint8_t mem_sha[DIGEST_LEN], state_sha[DIGEST_LEN];
	snprintf(mem_name, sizeof(mem_name), "mem-%06llu", (unsigned long long)t->id);
	snprintf(state_name, sizeof(state_name), "state-%06llu", (unsigned long long)t->id);
	tmp_state[0] = 0;
	bool mem_placed = false, state_placed = false;

	int r = write_mem_layer(s, mem_name, tmp_mem, sizeof(tmp_mem), &t->li, &t->g, err, errlen);
	if (t->paused) {
		vm_resume(s->vm);
		t->paused = false;
		t->t_resumed = mono_us();
	}
	/* One read of what was just synced: the writer's extents are in no file order. */
	if (!r && (r = digest_file_at(s->dfd, tmp_mem, mem_sha)))
		errmsg(err, errlen, r, "cannot digest %s/%s: %s", s->dir, tmp_mem, strerror(-r));
	if (!r)
		r = write_state(s, t->id, state_name, tmp_state, sizeof(tmp_state), &t->sb,
				state_sha, err, errlen);
	if (!r) {
		r = dirfd_rename_noreplace(s->dfd, tmp_mem, mem_name);
		mem_placed = !r;
		if (!r) {
			r = dirfd_rename_noreplace(s->dfd, tmp_state, state_name);
			state_placed = !r;
		}
		if (r)
			errmsg(err, errlen, r, "cannot rename the new layer into place: %s",
			       strerror(-r));
	}
	if (!r) {
		struct chain_layer *l = &t->next->layers[t->next->nr_layers++];
		memset(l, 0, sizeof(*l));
		l->id = t->id;
		l->parent = t->li.parent_id;
		l->full = t->full;
		snprintf(l->mem, sizeof(l->mem), "%s", mem_name);
		snprintf(l->state, sizeof(l->state), "%s", state_name);
		l->present = t->g.present;
		l->stored = t->g.stored;
		l->created_ns = (uint64_t)realtime_ns();
		if ((r = chain_digest_set(t->next, mem_name, mem_sha)) ||
		    (r = chain_digest_set(t->next, state_name, state_sha)))
			errmsg(err, errlen, r, "cannot record the layer's digests");
		if (!r)
			r = take_digests(s, t, err, errlen);
		if (!r)
			r = chain_commit(t->next, err, errlen); /* the commit point */
	}
	if (r) {
		/* Best effort (EPERM in the jail): uncommitted files are settle's to remove. */
		(void)dirfd_unlink(s->dfd, mem_placed ? mem_name : tmp_mem);
		if (tmp_state[0])
			(void)dirfd_unlink(s->dfd, state_placed ? state_name : tmp_state);
		return r;
	}
	if (t->full && t->old_ok)
		remove_unlisted(t->old, t->next, s->dfd);
	s->chain = *t->next;
	s->have_base = true;
	return 0;
}

/* After the commit: past `keep` layers a plain chain is compacted; a failure keeps it intact. */
static void take_compact(struct snap_ctx *s, struct snap_stats *st, char *err, size_t errlen)
{
	/* Encrypted chains are not compacted yet (it means re-sealing every page): see README. */
	if (s->chain.nr_layers <= s->keep || s->encrypted || s->layers_arriving)
		return;
	struct chain *before = malloc(sizeof(*before));
	if (!before)
		return;
	*before = s->chain;
	int cr = chain_compact(&s->chain, err, errlen);
	if (cr) {
		log_warn(s->vm->log, "snapshot: compaction failed (the chain is intact): %s", err);
	} else {
		remove_unlisted(before, &s->chain, s->dfd);
		st->compacted = true;
	}
	free(before);
}

static void take_free(struct take *t)
{
	stage_free(&t->g);
	state_buf_free(&t->sb);
	free(t->old);
	free(t->next);
}

/* Undoes a failed snapshot: the VM runs again and the pages collected go back to the dirty set. */
static void take_unwind(struct snap_ctx *s, struct take *t)
{
	if (t->paused)
		vm_resume(s->vm);
	if (t->collected)
		dirty_log_merge_back(s->vm, s->bitmap);
	/* A failed full snapshot may have dropped the dirty log: only a new full one is safe now.
	 */
	if (t->full)
		s->have_base = false;
}

int snap_create(struct snap_ctx *s, bool full, struct snap_stats *st, char *err, size_t errlen)
{
	memset(st, 0, sizeof(*st));
	if (!full && !s->have_base)
		return errmsg(err, errlen, -ENOENT,
			      "no base layer to build on: take a Full snapshot first");
	/*
	 * Encrypted chains are not compacted (that would re-seal every page under new layer
	 * ids): past `keep` layers the next snapshot is a full one, which bounds the chain too.
	 */
	if (!full && s->encrypted && s->chain.nr_layers >= s->keep)
		full = true;
	if (!full && s->chain.nr_layers >= CHAIN_MAX_LAYERS)
		return errmsg(err, errlen, -E2BIG, "chain is full (%d layers)", CHAIN_MAX_LAYERS);
	struct take t = {.full = full, .was_paused = vm_get_state(s->vm) == VM_PAUSED};
	int r = take_before_pause(s, &t, err, errlen);
	t.t_pre = mono_us();
	if (!r)
		r = take_precopy(s, &t, err, errlen);
	if (!r)
		r = take_paused(s, &t, err, errlen);
	if (!r)
		r = take_commit(s, &t, err, errlen);
	if (!r) /* the given-back pages this layer holds as zeros need no more care */
		dirty_log_clear_discarded(s->vm, s->bitmap);
	if (r) {
		take_unwind(s, &t);
		take_free(&t);
		return r;
	}
	st->layer_id = t.id;
	st->full = full;
	st->pages = t.g.present;
	st->stored = t.g.stored;
	st->bytes = t.g.stored * PAGE_SIZE;
	st->staged = t.g.staged;
	st->precopy_us = t.t0 - t.t_pre;
	st->pause_us = t.t_resumed - t.t0;
	st->write_us = mono_us() - t.t_resumed;
	take_compact(s, st, err, errlen);
	st->total_us = mono_us() - t.t_pre;
	take_free(&t);
	return 0;
}
