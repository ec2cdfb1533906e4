/* virtio-vsock header codec, guest packet checks, credit accounting and the connection state
 * machine. */
#include "devices/vsock_conn.h"

#include "common/byteorder.h"

#include <errno.h>
#include <string.h>

_Static_assert((uint64_t)VSOCK_MAX_CONNS *VSOCK_BUF_MIN + VSOCK_BUF_ALLOC <= VSOCK_DEV_BUF_CAP,
	       "the vsock pool must fit one full-size connection beside every minimum");

void vsock_hdr_decode(const uint8_t *b, struct vsock_hdr *h)
{
	h->src_cid = get_le64(b + 0);
	h->dst_cid = get_le64(b + 8);
	h->src_port = get_le32(b + 16);
	h->dst_port = get_le32(b + 20);
	h->len = get_le32(b + 24);
	h->type = get_le16(b + 28);
	h->op = get_le16(b + 30);
	h->flags = get_le32(b + 32);
	h->buf_alloc = get_le32(b + 36);
	h->fwd_cnt = get_le32(b + 40);
}

void vsock_hdr_encode(const struct vsock_hdr *h, uint8_t *b)
{
	put_le64(b + 0, h->src_cid);
	put_le64(b + 8, h->dst_cid);
	put_le32(b + 16, (uint32_t)h->src_port);
	put_le32(b + 20, (uint32_t)h->dst_port);
	put_le32(b + 24, (uint32_t)h->len);
	put_le16(b + 28, (uint16_t)h->type);
	put_le16(b + 30, (uint16_t)h->op);
	put_le32(b + 32, (uint32_t)h->flags);
	put_le32(b + 36, (uint32_t)h->buf_alloc);
	put_le32(b + 40, (uint32_t)h->fwd_cnt);
}

enum vsock_verdict vsock_hdr_check(const struct vsock_hdr *h, uint64_t guest_cid,
				   uint64_t payload_avail)
{
	/* A packet with a forged or foreign address gets no answer at all. */
	if (h->src_cid != guest_cid || h->dst_cid != VSOCK_HOST_CID)
		return VSOCK_DROP;
	/* Never answer an RST with an RST. */
	enum vsock_verdict bad = h->op == VSOCK_OP_RST ? VSOCK_DROP : VSOCK_REPLY_RST;
	if (h->type != VSOCK_TYPE_STREAM)
		return bad;
	if (h->op < VSOCK_OP_REQUEST || h->op > VSOCK_OP_CREDIT_REQUEST)
		return bad;
	if (h->len > VSOCK_MAX_PAYLOAD || h->len > payload_avail)
		return bad;
	if (h->op != VSOCK_OP_RW && h->len)
		return bad;
	if (h->op == VSOCK_OP_SHUTDOWN && (h->flags & ~(VSOCK_SHUTDOWN_RCV | VSOCK_SHUTDOWN_SEND)))
		return bad;
	return VSOCK_ACCEPT;
}

uint32_t vsock_credit_peer_avail(const struct vsock_credit *c)
{
	uint32_t in_flight = c->tx_cnt - c->peer_fwd_cnt;
	return in_flight >= c->peer_buf_alloc ? 0 : c->peer_buf_alloc - in_flight;
}

void vsock_credit_update_from(struct vsock_credit *c, const struct vsock_hdr *h)
{
	c->peer_buf_alloc = h->buf_alloc;
	c->peer_fwd_cnt = h->fwd_cnt;
}

bool vsock_credit_guest_sent(struct vsock_credit *c, uint32_t len)
{
	uint32_t buffered = c->rx_cnt - c->fwd_cnt;
	if (buffered > c->buf_alloc || len > c->buf_alloc - buffered)
		return false;
	c->rx_cnt += len;
	return true;
}

bool vsock_credit_update_due(const struct vsock_credit *c)
{
	return c->fwd_cnt - c->last_fwd_sent >= c->buf_alloc / 4;
}

/* Room for `extra` more credit, keeping VSOCK_BUF_MIN for every connection that may still come. */
static bool pool_room(const struct vsock_pool *p, uint32_t conns_after, uint64_t extra)
{
	uint64_t reserve = (uint64_t)(VSOCK_MAX_CONNS - conns_after) * VSOCK_BUF_MIN;
	return p->granted + extra + reserve <= VSOCK_DEV_BUF_CAP;
}

uint32_t vsock_pool_grant(struct vsock_pool *p)
{
	uint32_t a = pool_room(p, p->conns + 1, VSOCK_BUF_ALLOC) ? VSOCK_BUF_ALLOC : VSOCK_BUF_MIN;
	p->granted += a;
	p->conns++;
	return a;
}

bool vsock_pool_grow(struct vsock_pool *p, uint32_t *buf_alloc)
{
	if (*buf_alloc >= VSOCK_BUF_ALLOC || !pool_room(p, p->conns, VSOCK_BUF_ALLOC - *buf_alloc))
		return false;
	p->granted += VSOCK_BUF_ALLOC - *buf_alloc;
	*buf_alloc = VSOCK_BUF_ALLOC;
	return true;
}

void vsock_pool_release(struct vsock_pool *p, uint32_t buf_alloc)
{
	p->granted -= buf_alloc;
	p->conns--;
}

enum vsock_action vsock_conn_action(enum vsock_state st, uint16_t op)
{
	switch (st) {
	case VSOCK_ST_CONNECTING:
		if (op == VSOCK_OP_RESPONSE)
			return VSOCK_ACT_ESTABLISH;
		if (op == VSOCK_OP_RST)
			return VSOCK_ACT_CLOSE;
		if (op == VSOCK_OP_CREDIT_UPDATE)
			return VSOCK_ACT_NONE;
		return VSOCK_ACT_RST;
	case VSOCK_ST_ESTABLISHED:
		switch (op) {
		case VSOCK_OP_RW:
			return VSOCK_ACT_DATA;
		case VSOCK_OP_SHUTDOWN:
			return VSOCK_ACT_SHUTDOWN;
		case VSOCK_OP_CREDIT_UPDATE:
			return VSOCK_ACT_NONE;
		case VSOCK_OP_CREDIT_REQUEST:
			return VSOCK_ACT_SEND_CREDIT;
		case VSOCK_OP_RST:
			return VSOCK_ACT_CLOSE;
		default: /* REQUEST/RESPONSE on a live connection */
			return VSOCK_ACT_RST;
		}
	case VSOCK_ST_HOST_HANDSHAKE: /* the guest cannot know this one yet */
		return op == VSOCK_OP_RST ? VSOCK_ACT_NONE : VSOCK_ACT_RST;
	case VSOCK_ST_CLOSED:
	default:
		return VSOCK_ACT_NONE;
	}
}

int vsock_parse_connect(const char *buf, size_t len, uint32_t *port)
{
	static const char prefix[] = "CONNECT ";
	size_t plen = sizeof(prefix) - 1;
	size_t n = len < plen ? len : plen;
	if (memcmp(buf, prefix, n))
		return -EINVAL;
	if (len <= plen)
		return 0;
	uint64_t v = 0;
	size_t i = plen;
	for (; i < len && buf[i] >= '0' && buf[i] <= '9'; i++) {
		if (i - plen >= 10)
			return -EINVAL;
		v = v * 10 + (uint64_t)(buf[i] - '0');
	}
	if (i == len)
		return 0; /* digits so far, no newline yet */
	if (i == plen || buf[i] != '\n' || v > UINT32_MAX)
		return -EINVAL;
	*port = (uint32_t)v;
	return 1;
}
