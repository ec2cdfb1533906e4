/* virtio-balloon: free page reporting, inflate/deflate to a host target, guest memory stats. */
#ifndef COVE_VIRTIO_BALLOON_H
#define COVE_VIRTIO_BALLOON_H

#include <stdbool.h>
#include <stdint.h>

#define VIRTIO_ID_BALLOON 5

/* Feature bits (virtio 1.x, "Memory Balloon Device"). */
#define VIRTIO_BALLOON_F_MUST_TELL_HOST 0
#define VIRTIO_BALLOON_F_STATS_VQ	1
#define VIRTIO_BALLOON_F_DEFLATE_ON_OOM 2
#define VIRTIO_BALLOON_F_REPORTING	5

/* Statistics tags the driver sends (Linux 6.1 sends 0..9). */
#define BALLOON_STAT_SWAP_IN	  0
#define BALLOON_STAT_SWAP_OUT	  1
#define BALLOON_STAT_MAJFLT	  2
#define BALLOON_STAT_MINFLT	  3
#define BALLOON_STAT_MEMFREE	  4
#define BALLOON_STAT_MEMTOT	  5
#define BALLOON_STAT_AVAIL	  6
#define BALLOON_STAT_CACHES	  7
#define BALLOON_STAT_HTLB_PGALLOC 8
#define BALLOON_STAT_HTLB_PGFAIL  9
#define BALLOON_NR_STATS	  16

/* Stats chains longer than this many 10-byte entries are read only this far. */
#define BALLOON_MAX_STAT_ENTRIES 64
/* Inflate/deflate chains: PFNs read per chain at most (Linux sends at most 256). */
#define BALLOON_MAX_PFNS 4096

/* The device's configuration (device_spec.cfg): `--balloon[=TARGET_MIB][,nooom][,noreport]`. */
struct balloon_cfg {
	uint32_t target_mib; /* initial inflate target */
	bool deflate_on_oom; /* offer VIRTIO_BALLOON_F_DEFLATE_ON_OOM */
	bool reporting;	     /* offer VIRTIO_BALLOON_F_REPORTING */
	bool stats;	     /* offer VIRTIO_BALLOON_F_STATS_VQ */
};

/* What the host sees of the balloon (GET /balloon, /balloon/statistics). */
struct balloon_info {
	uint32_t target_pages; /* num_pages: what the host asks the guest to give */
	uint32_t actual_pages; /* what the driver says it holds */
	uint64_t features;     /* negotiated (driver) features */
	bool deflate_on_oom, reporting, stats_vq;
	uint64_t reported_bytes;  /* given back through free page reporting */
	uint64_t reported_ranges; /* ranges reported */
	uint64_t inflated_pages, deflated_pages;
	uint64_t invalid;	 /* PFNs or ranges refused (outside RAM, misaligned) */
	uint64_t discard_errors; /* host calls that failed */
	uint64_t stats_updates;	 /* stats buffers received */
	uint32_t stats_valid;	 /* bit t: stats[t] was sent */
	uint64_t stats[BALLOON_NR_STATS];
};

struct virtio_balloon;
struct device_type;
extern const struct device_type virtio_balloon_type;

/* Asks the guest to hold `pages` 4 KiB pages in its balloon (capped to RAM). */
void virtio_balloon_set_target(struct virtio_balloon *b, uint64_t pages);
/* Fills `out`; asks the driver for fresh statistics (answered asynchronously). */
void virtio_balloon_info(struct virtio_balloon *b, struct balloon_info *out);

#endif
