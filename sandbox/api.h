/* Control API: REST requests (Firecracker's shapes where they overlap) mapped onto VM operations.
 */
#ifndef COVE_API_H
#define COVE_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "devices/virtio_balloon.h"

/* Largest request body accepted; bigger bodies get 413 and are never buffered. */
#define API_MAX_BODY (16 * 1024)

struct api_vm_info {
	const char *state; /* "NotStarted" | "Running" | "Paused" | "Stopped" */
	int vcpus;
	uint64_t mem_bytes;
	const char *version;
};

/* One contiguous run of dirty guest pages. */
struct api_dirty_range {
	uint64_t first_pfn;
	uint64_t nr_pages;
};

/* What one snapshot did (PUT /snapshot/create). */
struct api_snapshot_result {
	uint64_t layer_id;
	bool full, compacted, staged;
	uint64_t pages, stored, bytes;
	uint64_t precopy_us, pause_us, write_us, total_us;
};

#define API_MAX_FORKS 16
/* One clone started by PUT /fork. */
struct api_clone {
	int pid;
	uint64_t cid;
	char api_sock[108];
	char vsock_uds[108];
	char snapshot_dir[4096];
	char console[4200];
	char identity[256]; /* "sent", or why the clone did not get a fresh identity */
};

/*
 * What the API can do to a VM.  Every hook returns 0 or -errno; the handler
 * maps errors to HTTP statuses.  The real VM and the unit tests' fakes both
 * implement it.
 */
struct api_backend {
	void *opaque;
	int (*get_info)(void *opaque, struct api_vm_info *out);
	int (*pause)(void *opaque);
	int (*resume)(void *opaque);
	int (*ctrl_alt_del)(void *opaque);
	/*
	 * Fetch-and-clear the dirty page set (KVM dirty log OR the VMM's own
	 * writes).  Fills at most `max` ranges into `out`, sets *nr; returns
	 * -E2BIG if more were needed (the set is still cleared), -ENODATA
	 * when the VM does not track dirty pages.
	 */
	int (*dirty_pages)(void *opaque, struct api_dirty_range *out, size_t max, size_t *nr);
	/* Full or incremental snapshot into `dir` (NULL: the sandbox's --snapshot-dir). */
	int (*snapshot)(void *opaque, bool full, const char *dir, struct api_snapshot_result *out,
			char *err, size_t errlen);
	/* Snapshot, then start `count` clones restored from it. */
	/* `identity`: each clone gets a fresh RNG seed and clock before this returns. */
	int (*fork)(void *opaque, int count, bool identity, struct api_clone *out, char *err,
		    size_t errlen);
	/* The balloon (NULL or -ENODEV: the VM has none): read it, or set its target in MiB. */
	int (*balloon_get)(void *opaque, struct balloon_info *out);
	int (*balloon_set)(void *opaque, uint64_t target_mib);
	/* Told of every request (an idle sandbox is one nobody asks anything); may be NULL. */
	void (*on_request)(void *opaque);
};

struct api_response {
	int status; /* HTTP status */
	char *body; /* malloc'd JSON text or NULL for an empty body (204) */
};

/*
 * Pure request handler: no sockets.  `body` need not be NUL-terminated.
 * Always fills `resp`; returns 0, or -ENOMEM if even the error body could not
 * be built.  Free resp->body with free().
 */
int api_handle(const struct api_backend *be, const char *method, const char *path, const char *body,
	       size_t body_len, struct api_response *resp);

struct evloop;
struct api_server;

/*
 * Binds a Unix socket at `sock_path` (removing a stale socket file first),
 * serves HTTP/1.1 on it from the event loop thread.  Returns 0 or -errno.
 */
int api_server_start(struct api_server **out, const char *sock_path, const struct api_backend *be,
		     struct evloop *loop);
void api_server_stop(struct api_server *srv);

#endif
