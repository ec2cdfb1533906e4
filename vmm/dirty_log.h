/* Dirty page tracking: KVM's dirty log (manual-protect mode when available) OR the VMM's own writes. */
#ifndef COVE_DIRTY_LOG_H
#define COVE_DIRTY_LOG_H

#include <stddef.h>
#include <stdint.h>

struct vm;

/* Called before memory slots exist: turns on KVM_CAP_MANUAL_DIRTY_LOG_PROTECT2 where offered. */
int dirty_log_enable(struct vm *vm);
/* Words of a bitmap covering all guest RAM, one bit per page in memfd order. */
size_t dirty_log_bitmap_words(const struct vm *vm);
/*
 * Fetches and clears the dirty set since the last call into `bitmap` (which it
 * overwrites).  Bit i is the page at memfd offset i*4096.  Returns 0, -ENODATA
 * when the VM was created without dirty tracking, or -errno.
 */
int dirty_log_collect(struct vm *vm, uint64_t *bitmap);
/*
 * The same for KVM's log only, leaving the VMM's own bitmap in place: a snapshot's pre-copy
 * with the guest running reads this, and the pause then collects both (a device may mark a
 * page before it writes it, so the VMM's bits are taken only with the devices quiesced).
 */
int dirty_log_collect_kvm(struct vm *vm, uint64_t *bitmap);

/*
 * Turns on KVM dirty logging for every slot of a running VM (a full snapshot does this, so
 * the next one can be incremental).  No-op when it is on already.  0 or -errno.
 */
int dirty_log_start(struct vm *vm);
/* Puts collected bits back (a snapshot that failed): the next collection reports them again. */
void dirty_log_merge_back(struct vm *vm, const uint64_t *bitmap);

/*
 * How many pages are dirty now, without collecting them (an upper bound of KVM's and the
 * VMM's sets, which may overlap), to size a snapshot's staging buffer before the pause.
 * -ENOTSUP without manual dirty-log protection (there GET would clear the log).
 */
int64_t dirty_log_count(struct vm *vm);

/*
 * Gives guest pages [gpa, gpa+len) back to the host (guest_mem_discard) and, under the dirty
 * lock so a collection sees both or neither, marks them dirty (KVM's log does not see a punch)
 * and discarded: the next snapshot stores them as zero pages (holes), not their old bytes.
 * 0 or -errno (nothing marked).
 */
int dirty_log_discard(struct vm *vm, uint64_t gpa, uint64_t len);
/* Copies the discarded set into `out` (dirty_log_bitmap_words long); the set is unchanged. */
void dirty_log_peek_discarded(struct vm *vm, uint64_t *out);
/* Clears the discarded marks of the pages in `bitmap` (a committed layer holds them). */
void dirty_log_clear_discarded(struct vm *vm, const uint64_t *bitmap);

#endif
