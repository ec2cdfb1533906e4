/* Keeping a sandbox's disk overlay chains short: frozen layers merged between snapshots. */
#include "sandbox/disk_merge.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/random.h>

#include "common/clock.h"
#include "common/errmsg.h"
#include "devices/overlay_merge.h"
#include "devices/virtio_blk.h"
#include "sandbox/sandbox.h"

void sandbox_merge_disks(struct sandbox *sb, uint64_t layer_id)
{
	int nr = board_count(&sb->board, &virtio_blk_type);
	for (int i = 0; i < nr && i < RUN_MAX_DISKS; i++) {
		struct virtio_blk *disk = board_nth(&sb->board, &virtio_blk_type, i);
		struct overlay *ov = disk->ov;
		struct overlay_merged *m = &sb->disk_merges[i];
		/*
		 * Only this thread (the event loop) freezes or installs: the layers read here do
		 * not change while the vCPU threads go on reading them and writing the top.
		 */
		if (!ov || m->layer.data_fd >= 0 || ov->nr_layers < OVERLAY_MERGE_AT ||
		    sb->mc.chains[i].n != ov->nr_layers)
			continue;
		char path[4096], err[512];
		uint32_t tag = 0;
		if (getrandom(&tag, sizeof(tag), 0) != (ssize_t)sizeof(tag) ||
		    snprintf(path, sizeof(path), "%s/disk%d-%06llu-%08x%s.ovl", sb->snap.dir, i,
			     (unsigned long long)layer_id, tag,
			     ov->sealer ? "-sealed" : "") >= (int)sizeof(path)) {
			log_warn(&sb->log, "disk %d: no name for a merged layer", i);
			continue;
		}
		uint64_t t0 = mono_us();
		int r = overlay_merge_build(ov, path, ov->sealer, layer_id, m, err, sizeof(err));
		if (r) {
			log_warn(&sb->log,
				 "disk %d: merging its %d frozen layers failed (the chain is "
				 "intact): %s",
				 i, ov->nr_layers, err);
			continue;
		}
		log_info(&sb->log,
			 "disk %d: merged its %d frozen layers (%llu chunks) into %s in %llu us, "
			 "the guest running; the next snapshot puts it in place",
			 i, m->nr_src, (unsigned long long)m->chunks, path,
			 (unsigned long long)(mono_us() - t0));
	}
}

int sandbox_merge_install(struct sandbox *sb, int i, char *err, size_t errlen)
{
	struct overlay_merged *m = &sb->disk_merges[i];
	if (i >= RUN_MAX_DISKS || m->layer.data_fd < 0)
		return 0;
	struct virtio_blk *disk = board_nth(&sb->board, &virtio_blk_type, i);
	struct disk_chain *ch = &sb->mc.chains[i];
	int n = m->nr_src;
	if (!disk || ch->n != n) {
		log_warn(&sb->log,
			 "disk %d: its chain changed since its layers were merged: the "
			 "merge is dropped",
			 i);
		overlay_merged_free(m);
		return 0;
	}
	uint64_t t0 = mono_us();
	int r = virtio_blk_merge_install(disk, m, err, errlen);
	if (r == -ESTALE) {
		log_warn(&sb->log, "disk %d: %s: the merge is dropped", i, err);
		overlay_merged_free(m);
		return 0;
	}
	if (m->layer.data_fd >= 0)
		return r;
	/* In place in the device (even when writing the top's map failed): say so in the chain. */
	if (overlay_layer_path(disk->ov, 0, ch->paths[0], sizeof(ch->paths[0])))
		return errmsg(err, errlen, -ENAMETOOLONG, "disk %d: merged layer path too long", i);
	ch->n = 1;
	log_info(&sb->log,
		 "snapshot: disk %d: its %d frozen layers are now the merged layer %s "
		 "(%llu us in the pause)",
		 i, n, ch->paths[0], (unsigned long long)(mono_us() - t0));
	return r;
}

void sandbox_merges_free(struct sandbox *sb)
{
	for (int i = 0; i < RUN_MAX_DISKS; i++)
		overlay_merged_free(&sb->disk_merges[i]);
}
