/* virtio-vsock packets and per-connection credit/state rules: pure functions, no I/O. */
#ifndef COVE_VSOCK_CONN_H
#define COVE_VSOCK_CONN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define VSOCK_HDR_SIZE	  44
#define VSOCK_HOST_CID	  2
#define VSOCK_MAX_PAYLOAD (64u * 1024)	/* Linux never sends more in one packet */
#define VSOCK_BUF_ALLOC	  (256u * 1024) /* the most one connection buffers for the guest */
#define VSOCK_BUF_MIN	  (4u * 1024)	/* the least: every connection can make progress */
#define VSOCK_MAX_CONNS	  1024
/* Guest->host bytes one device may hold for slow host readers, all connections together. */
#define VSOCK_DEV_BUF_CAP (16u << 20)

#define VSOCK_TYPE_STREAM 1

enum vsock_op {
	VSOCK_OP_INVALID = 0,
	VSOCK_OP_REQUEST = 1,
	VSOCK_OP_RESPONSE = 2,
	VSOCK_OP_RST = 3,
	VSOCK_OP_SHUTDOWN = 4,
	VSOCK_OP_RW = 5,
	VSOCK_OP_CREDIT_UPDATE = 6,
	VSOCK_OP_CREDIT_REQUEST = 7,
};

#define VSOCK_SHUTDOWN_RCV  1u
#define VSOCK_SHUTDOWN_SEND 2u

/* struct virtio_vsock_hdr, decoded to host order. */
struct vsock_hdr {
	uint64_t src_cid;
	uint64_t dst_cid;
	uint32_t src_port;
	uint32_t dst_port;
	uint32_t len;
	uint16_t type;
	uint16_t op;
	uint32_t flags;
	uint32_t buf_alloc;
	uint32_t fwd_cnt;
};

/* Decodes 44 little-endian bytes. */
void vsock_hdr_decode(const uint8_t *buf, struct vsock_hdr *h);
void vsock_hdr_encode(const struct vsock_hdr *h, uint8_t *buf);

/* What to do with a packet the guest sent. */
enum vsock_verdict {
	VSOCK_ACCEPT = 0,
	VSOCK_DROP,	 /* not answerable (bad addresses, or an RST): ignore it */
	VSOCK_REPLY_RST, /* answer with RST to the sender's address */
};

/*
 * Checks a guest header against the device's `guest_cid` and the `payload_avail`
 * bytes of the chain after the header.
 */
enum vsock_verdict vsock_hdr_check(const struct vsock_hdr *h, uint64_t guest_cid,
				   uint64_t payload_avail);

/* Flow-control counters of one connection (virtio spec 5.10.6.3). */
struct vsock_credit {
	uint32_t buf_alloc;	 /* what we let the guest have unconsumed (our buf_alloc) */
	uint32_t peer_buf_alloc; /* guest's receive buffer */
	uint32_t peer_fwd_cnt;	 /* bytes the guest has consumed of what we sent */
	uint32_t tx_cnt;	 /* bytes we sent to the guest */
	uint32_t rx_cnt;	 /* bytes the guest sent us */
	uint32_t fwd_cnt;	 /* of those, bytes handed to the host socket */
	uint32_t last_fwd_sent;	 /* fwd_cnt last told to the guest */
};

/* Bytes we may still send to the guest. */
uint32_t vsock_credit_peer_avail(const struct vsock_credit *c);
/* Takes buf_alloc/fwd_cnt from a guest header. */
void vsock_credit_update_from(struct vsock_credit *c, const struct vsock_hdr *h);
/*
 * Accounts `len` payload bytes the guest sent; false when that exceeds the
 * credit we gave (c->buf_alloc minus what is still buffered).
 */
bool vsock_credit_guest_sent(struct vsock_credit *c, uint32_t len);
/* Should we tell the guest fwd_cnt now (it may be waiting for credit)? */
bool vsock_credit_update_due(const struct vsock_credit *c);

/*
 * The device's credit pool. Credit once given cannot be taken back (the guest may already be
 * sending under it), so the pool bounds what is given: the sum of every live connection's
 * buf_alloc stays within VSOCK_DEV_BUF_CAP, with VSOCK_BUF_MIN kept for each connection that
 * could still open. A connection gets VSOCK_BUF_ALLOC while that allows, else VSOCK_BUF_MIN,
 * and may grow later (growing is always safe). Worst case: VSOCK_DEV_BUF_CAP buffered bytes.
 */
struct vsock_pool {
	uint64_t granted; /* sum of buf_alloc of the connections holding credit */
	uint32_t conns;	  /* how many */
};
/* Credit for a new connection (conns < VSOCK_MAX_CONNS): its buf_alloc. */
uint32_t vsock_pool_grant(struct vsock_pool *p);
/* Raises *buf_alloc to VSOCK_BUF_ALLOC if the pool has room; true when it did. */
bool vsock_pool_grow(struct vsock_pool *p, uint32_t *buf_alloc);
/* A connection holding `buf_alloc` is gone. */
void vsock_pool_release(struct vsock_pool *p, uint32_t buf_alloc);

/* Connection states. */
enum vsock_state {
	VSOCK_ST_HOST_HANDSHAKE = 0, /* host connected to the UDS, CONNECT line not read yet */
	VSOCK_ST_CONNECTING,	     /* REQUEST sent to the guest, waiting for RESPONSE */
	VSOCK_ST_ESTABLISHED,
	VSOCK_ST_CLOSED, /* to be freed (after pending output) */
};

/* What the device must do after a guest packet on a known connection. */
enum vsock_action {
	VSOCK_ACT_NONE = 0,
	VSOCK_ACT_ESTABLISH,   /* RESPONSE to our REQUEST: write "OK <port>\n" to the host */
	VSOCK_ACT_DATA,	       /* RW: forward payload to the host socket */
	VSOCK_ACT_SHUTDOWN,    /* apply new shutdown flags */
	VSOCK_ACT_SEND_CREDIT, /* CREDIT_REQUEST: answer with CREDIT_UPDATE */
	VSOCK_ACT_CLOSE,       /* guest RST: close the host socket, forget the connection */
	VSOCK_ACT_RST,	       /* protocol error: RST the guest and close */
};

/* The state machine: the action for op `op` in state `st`. */
enum vsock_action vsock_conn_action(enum vsock_state st, uint16_t op);

/*
 * Parses "CONNECT <port>\n" from the first `len` bytes of `buf` (no NUL needed).
 * Returns 1 with *port set, 0 when more bytes are needed, -EINVAL when it is not
 * such a line.
 */
int vsock_parse_connect(const char *buf, size_t len, uint32_t *port);

#endif
