/* virtio-vsock device: guest streams to host Unix sockets, Firecracker's hybrid protocol. */
#ifndef COVE_VIRTIO_VSOCK_H
#define COVE_VIRTIO_VSOCK_H

#include <stdbool.h>
#include <stdint.h>
#include <sys/un.h>

#include "devices/device.h"
#include "devices/virtio_mmio.h"
#include "devices/vsock_conn.h"

#define VSOCK_RST_QUEUE 256
#define VSOCK_MIN_CID	3

struct vsock_conn;

struct virtio_vsock {
	struct virtio_mmio mmio;
	const struct vm_host *host;
	uint64_t guest_cid;
	char uds_path[sizeof(((struct sockaddr_un *)0)->sun_path)];
	int listen_fd;
	int epfd;     /* the Unix sockets, watched as one fd by the VM's event loop */
	int hold_tfd; /* fires when held host CONNECTs may go without the guest's say (in epfd) */
	/*
	 * --vsock-rate: bytes/s per connection, each way (0: none). A connection out of tokens
	 * keeps the guest's bytes in its buffer (the guest's credit stops it, nothing is dropped)
	 * and leaves the host's unread; rate_tfd (in epfd) fires at rate_deadline_ns. Tokens are
	 * not snapshotted (connections do not survive a restore).
	 */
	uint64_t rate;
	int rate_tfd;
	uint64_t rate_deadline_ns;	 /* 0: not armed */
	uint64_t (*clock_ns)(void *ctx); /* the limiter's clock (unit tests use a fake) */
	void *clock_ctx;
	uint64_t throttle_waits;
	bool watched;
	bool listen_paused; /* accept() failed for lack of fds */
	uint32_t next_local_port;
	struct vsock_conn *conns[VSOCK_MAX_CONNS];
	int nr_conns;
	int rr;			/* round-robin start for host->guest data */
	struct vsock_pool pool; /* credit given to the guest, capped device-wide */
	uint64_t buffered;	/* guest->host bytes held for slow host readers */
	/* RSTs that belong to no live connection, waiting for an rx buffer. */
	struct vsock_hdr rst_q[VSOCK_RST_QUEUE];
	int rst_head, rst_n;
	bool rx_held; /* rx_chain was popped and not used yet */
	/*
	 * After a restore: the guest was told its connections were reset and has not taken the
	 * event back yet. A host CONNECT's request waits till then (or VSOCK_RESET_HOLD_NS), since
	 * a request the guest sees before it handles the reset is lost with the reset.
	 */
	bool reset_pending;
	uint16_t reset_avail; /* the event queue's avail index when the reset event went out */
	uint64_t reset_at_ns;
	struct virtq_chain rx_chain;
	struct virtq_chain tx_chain;
	uint8_t bounce[VSOCK_MAX_PAYLOAD];
	uint64_t rx_bytes, tx_bytes, bad_packets;
};

/*
 * Serves `uds_path` (host side) and registers the device at base/irq for a guest with context
 * id `guest_cid` (>= 3); the host's loop watches the sockets. 0 or -errno after one log line.
 */
int virtio_vsock_create(struct virtio_vsock *v, const struct vm_host *host, uint64_t guest_cid,
			const char *uds_path, uint64_t base, uint32_t irq);
void virtio_vsock_destroy(struct virtio_vsock *v);
/* Serves ready host sockets (what the event loop calls when v->epfd is readable). */
void virtio_vsock_service(struct virtio_vsock *v);

/*
 * Snapshot state: the transport's. A held rx buffer is given back to the avail ring in the
 * saved copy, so the restored device pops it again.
 */
void virtio_vsock_save(struct virtio_vsock *v, struct virtio_mmio_state *st);
/*
 * After the transport state is restored in a new process: host connections do not survive, so
 * tell the guest driver with a TRANSPORT_RESET event (it drops its connections, keeps its
 * listeners and re-reads its CID).  0, or -ENOSPC if the driver left no event buffer.
 */
int virtio_vsock_restored(struct virtio_vsock *v);

/* Device table entry: board_add(b, host, &virtio_vsock_type, &(struct virtio_vsock_cfg){...}). */
extern const struct device_type virtio_vsock_type;
struct virtio_vsock_cfg {
	uint64_t cid;
	const char *uds_path;
	uint64_t rate; /* bytes/s per connection each way; 0: no limit */
};

/* Sets the per-connection rate for connections opened from now on. 0 or -EINVAL (over 2^50). */
int virtio_vsock_set_rate(struct virtio_vsock *v, uint64_t rate);
#endif
