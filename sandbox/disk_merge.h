/* Keeping a sandbox's disk overlay chains short: frozen layers merged between snapshots. */
#ifndef COVE_DISK_MERGE_H
#define COVE_DISK_MERGE_H

#include <stddef.h>
#include <stdint.h>

struct sandbox;

/*
 * After snapshot `layer_id` committed, with the guest running: every overlay disk whose chain
 * holds OVERLAY_MERGE_AT frozen layers or more gets them merged into one new layer in the
 * snapshot directory (sealed in an encrypted chain), kept until the next snapshot's pause
 * puts it in place (sandbox_merge_install). Failures are logged; the chain is untouched.
 */
void sandbox_merge_disks(struct sandbox *sb, uint64_t layer_id);
/*
 * In a snapshot's pause, before disk `i` freezes its top: a merge built for it replaces the
 * frozen layers it stands for, in the device and in the machine description. 0 or -errno with
 * a message in `err` (a merge that no longer fits the chain is dropped and is not an error).
 */
int sandbox_merge_install(struct sandbox *sb, int i, char *err, size_t errlen);
/* Drops merges not installed (their files stay unreferenced; the host removes them). */
void sandbox_merges_free(struct sandbox *sb);

#endif
