/*
 * libFuzzer target: virtio-vsock packet handling (devices/virtio_vsock.c, vsock_conn.c) and the
 * host side's CONNECT handshake, on the unit tests' fake machine. The input is a script: guest
 * packets (raw, or built from a header with the right addresses so fields behind the address
 * checks get reached), host connects, host bytes (the "CONNECT <port>\n" line and data), host
 * closes, and the guest recycling its receive buffers. A fresh device serves each input.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include "devices/virtio_vsock.h"
#include "devices/vsock_conn.h"
#include "fuzz.h"
#include "host_fake.h"
#include "vmm/guest_mem.h"

#define CID	    7
#define QN	    16
#define DESC(q)	    (0x10000ULL + (q)*0x1000ULL)
#define AVAIL(q)    (0x20000ULL + (q)*0x1000ULL)
#define USED(q)	    (0x30000ULL + (q)*0x1000ULL)
#define RXBUF(i)    (0x100000ULL + (i)*0x2000ULL)
#define TXBUF	    0x180000ULL
#define RXLEN	    (VSOCK_HDR_SIZE + 4096)
#define MEM	    (2ULL << 20)
#define HOSTS	    4
#define LISTEN_PORT 5000

struct vs_world {
	struct guest_mem mem;
	char dir[64], path[108], listen_path[120];
	int listen_fd; /* the host service a guest may connect to (port LISTEN_PORT) */
};

struct vs_run {
	struct vs_world *w;
	struct host_fake hf;
	struct virtio_vsock *v;
	uint16_t avail_idx[3], used_seen;
	int host[HOSTS];
};

static void *gp(struct vs_run *s, uint64_t gpa, uint64_t len)
{
	void *p = guest_mem_ptr(&s->w->mem, gpa, len);
	if (!p)
		abort();
	return p;
}

static void put_desc(struct vs_run *s, int q, int i, uint64_t addr, uint32_t len, uint16_t flags,
		     uint16_t next)
{
	uint8_t *d = gp(s, DESC(q) + 16ULL * i, 16);
	memcpy(d, &addr, 8);
	memcpy(d + 8, &len, 4);
	memcpy(d + 12, &flags, 2);
	memcpy(d + 14, &next, 2);
}

static void make_avail(struct vs_run *s, int q, uint16_t head)
{
	uint16_t *ring = gp(s, AVAIL(q), 4 + 2 * QN);
	ring[2 + s->avail_idx[q] % QN] = head;
	s->avail_idx[q]++;
	ring[1] = s->avail_idx[q];
	virtio_fake_write(&s->v->mmio, 0x050, (uint32_t)q);
}

/* The guest takes what the device put on the rx used ring and gives the buffers back. */
static void recycle_rx(struct vs_run *s)
{
	uint16_t used = *(uint16_t *)gp(s, USED(0) + 2, 2);
	for (int n = 0; s->used_seen != used && n < QN; n++) {
		uint32_t *e = gp(s, USED(0) + 4 + 8ULL * (s->used_seen % QN), 8);
		s->used_seen++;
		if (e[0] >= QN || e[1] < VSOCK_HDR_SIZE || e[1] > RXLEN)
			abort(); /* the device answers within the buffer it was given */
		struct vsock_hdr h;
		vsock_hdr_decode(gp(s, RXBUF(e[0]), VSOCK_HDR_SIZE), &h);
		if (h.src_cid != VSOCK_HOST_CID || h.dst_cid != CID ||
		    e[1] != VSOCK_HDR_SIZE + h.len)
			abort();
		put_desc(s, 0, (int)e[0], RXBUF(e[0]), RXLEN, VIRTQ_DESC_F_WRITE, 0);
		make_avail(s, 0, (uint16_t)e[0]);
	}
}

static void send_bytes(struct vs_run *s, const uint8_t *p, uint32_t len, uint32_t split)
{
	if (len)
		memcpy(gp(s, TXBUF, len), p, len);
	if (split && split < len) {
		put_desc(s, 1, 0, TXBUF, split, VIRTQ_DESC_F_NEXT, 1);
		put_desc(s, 1, 1, TXBUF + split, len - split, 0, 0);
	} else {
		put_desc(s, 1, 0, TXBUF, len, 0, 0);
	}
	make_avail(s, 1, 0);
}

static void host_connect(struct vs_run *s, int k)
{
	if (s->host[k] >= 0)
		close(s->host[k]);
	s->host[k] = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", s->w->path);
	if (s->host[k] < 0 || connect(s->host[k], (struct sockaddr *)&sa, sizeof(sa)))
		abort();
}

static void drain_host(struct vs_run *s, int k)
{
	char buf[4096];
	while (s->host[k] >= 0 && read(s->host[k], buf, sizeof(buf)) > 0)
		;
}

static struct vs_world *world(void)
{
	static struct vs_world w;
	static bool ready;
	if (ready)
		return &w;
	snprintf(w.dir, sizeof(w.dir), "%s/cove-fuzz-vsock-XXXXXX",
		 access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp");
	if (!mkdtemp(w.dir) || guest_mem_create(&w.mem, MEM))
		abort();
	snprintf(w.path, sizeof(w.path), "%s/v.sock", w.dir);
	snprintf(w.listen_path, sizeof(w.listen_path), "%s_%u", w.path, LISTEN_PORT);
	w.listen_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	struct sockaddr_un sa = {.sun_family = AF_UNIX};
	snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", w.listen_path);
	if (w.listen_fd < 0 || bind(w.listen_fd, (struct sockaddr *)&sa, sizeof(sa)) ||
	    listen(w.listen_fd, 64))
		abort();
	ready = true;
	return &w;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	static struct vs_run s; /* the device's bounce buffer is 64 KiB: not on the stack */
	memset(&s, 0, sizeof(s));
	s.w = world();
	for (int k = 0; k < HOSTS; k++)
		s.host[k] = -1;
	memset(gp(&s, 0, 0x40000), 0, 0x40000);
	if (host_fake_init(&s.hf, &s.w->mem))
		abort();
	s.hf.log.level = LOG_ERROR;
	/* One device object reused (cleared) for every input: a fresh 100 KiB allocation faulted
	 * its pages in again each time. */
	static struct virtio_vsock dev;
	memset(&dev, 0, sizeof(dev));
	s.v = &dev;
	if (virtio_vsock_create(s.v, &s.hf.host, CID, s.w->path, VIRTIO_MMIO_BASE, 5))
		abort();
	virtio_fake_driver_ready(&s.v->mmio, 3, QN, DESC(0), AVAIL(0), USED(0), DESC(1) - DESC(0));
	for (int i = 0; i < QN; i++) {
		put_desc(&s, 0, i, RXBUF(i), RXLEN, VIRTQ_DESC_F_WRITE, 0);
		make_avail(&s, 0, (uint16_t)i);
	}
	struct fuzz_in in = {data, size};
	uint8_t pkt[VSOCK_HDR_SIZE + 4096];
	for (int step = 0; step < 64 && in.left; step++) {
		uint8_t op = fuzz_u8(&in);
		int k = (op >> 4) % HOSTS;
		size_t got;
		switch (op & 7) {
		case 0: { /* raw guest packet */
			uint16_t len = fuzz_u16(&in) % (sizeof(pkt) + 1);
			uint8_t split = fuzz_u8(&in);
			const uint8_t *p = fuzz_bytes(&in, len, &got);
			send_bytes(&s, p, (uint32_t)got, split);
			break;
		}
		case 1: { /* a guest packet with the right addresses */
			struct vsock_hdr h = {
			    .src_cid = CID, .dst_cid = VSOCK_HOST_CID, .type = VSOCK_TYPE_STREAM};
			h.op = fuzz_u8(&in) % 9;
			h.src_port = 1000 + fuzz_u8(&in) % 4;
			uint8_t dp = fuzz_u8(&in);
			h.dst_port = dp & 0x80 ? (1u << 30) + (dp & 7) : LISTEN_PORT + (dp & 1);
			h.flags = fuzz_u8(&in) % 5;
			h.buf_alloc = (uint32_t)fuzz_uint(&in, 3);
			h.fwd_cnt = (uint32_t)fuzz_uint(&in, 2);
			uint16_t len = fuzz_u16(&in) % 4097;
			const uint8_t *p = fuzz_bytes(&in, h.op == VSOCK_OP_RW ? len : 0, &got);
			h.len = (uint32_t)got;
			if (op & 8)
				h.len += fuzz_u8(&in); /* a length past the chain */
			vsock_hdr_encode(&h, pkt);
			memcpy(pkt + VSOCK_HDR_SIZE, p, got);
			send_bytes(&s, pkt, (uint32_t)(VSOCK_HDR_SIZE + got), VSOCK_HDR_SIZE);
			break;
		}
		case 2:
			host_connect(&s, k);
			virtio_vsock_service(s.v);
			break;
		case 3: { /* host bytes: the CONNECT line, then data */
			uint8_t len = fuzz_u8(&in);
			const uint8_t *p = fuzz_bytes(&in, len, &got);
			if (s.host[k] >= 0 && got)
				(void)!send(s.host[k], p, got, MSG_NOSIGNAL);
			virtio_vsock_service(s.v);
			break;
		}
		case 4: { /* a well-formed CONNECT line from host k */
			char line[32];
			int n =
			    snprintf(line, sizeof(line), "CONNECT %u\n", (unsigned)fuzz_u16(&in));
			if (s.host[k] >= 0)
				(void)!send(s.host[k], line, (size_t)n, MSG_NOSIGNAL);
			virtio_vsock_service(s.v);
			break;
		}
		case 5:
			if (s.host[k] >= 0)
				close(s.host[k]);
			s.host[k] = -1;
			virtio_vsock_service(s.v);
			break;
		case 6:
			drain_host(&s, k);
			virtio_vsock_service(s.v);
			break;
		default:
			recycle_rx(&s);
			break;
		}
		recycle_rx(&s);
	}
	virtio_vsock_service(s.v);
	virtio_vsock_destroy(s.v);
	for (int k = 0; k < HOSTS; k++)
		if (s.host[k] >= 0)
			close(s.host[k]);
	for (int fd; (fd = accept(s.w->listen_fd, NULL, NULL)) >= 0;)
		close(fd);
	host_fake_destroy(&s.hf);
	return 0;
}
