/* i8042 keyboard controller: reset line, controller commands, and a key buffer for Ctrl-Alt-Del. */
#include "devices/i8042.h"

#include <errno.h>
#include <string.h>

#include "common/errmsg.h"
#include "vmm/vm_host.h"

#define ST_OBF	    0x01 /* output buffer full */
#define ST_SYS	    0x04 /* system flag: self test passed */
#define ST_CMD	    0x08 /* last write was a command */
#define CTR_KBD_INT 0x01
#define CTR_SYS	    0x04
#define CTR_XLATE   0x40

#define CMD_READ_CTR	0x20
#define CMD_WRITE_CTR	0x60
#define CMD_DISABLE_AUX 0xa7
#define CMD_ENABLE_AUX	0xa8
#define CMD_TEST_AUX	0xa9
#define CMD_SELF_TEST	0xaa
#define CMD_TEST_KBD	0xab
#define CMD_DISABLE_KBD 0xad
#define CMD_ENABLE_KBD	0xae
#define CMD_READ_OUTP	0xd0
#define CMD_WRITE_OUTP	0xd1
#define CMD_PULSE_RESET 0xfe

static void push(struct i8042 *k, uint8_t b)
{
	if (k->len == I8042_BUF)
		return;
	k->buf[(k->head + k->len) % I8042_BUF] = b;
	k->len++;
}

/* Edge for the in-kernel PIC: pulse IRQ 1 when a byte becomes readable. */
static void raise_irq(struct i8042 *k)
{
	if (k->len && (k->ctr & CTR_KBD_INT)) {
		k->host->ops->set_irq(k->host->ctx, I8042_IRQ, 1);
		k->host->ops->set_irq(k->host->ctx, I8042_IRQ, 0);
	}
}

static void request_reset(struct i8042 *k)
{
	k->reset_requested = 1;
	k->host->ops->request_stop(k->host->ctx, 0, "guest requested reset via i8042");
}

void i8042_io_read(void *opaque, uint64_t off, uint8_t *data, uint32_t len)
{
	struct i8042 *k = opaque;
	memset(data, 0, len);
	pthread_mutex_lock(&k->lock);
	if (off == 0) {
		if (k->len) {
			data[0] = k->buf[k->head];
			k->head = (k->head + 1) % I8042_BUF;
			k->len--;
			raise_irq(k);
		}
	} else if (off == 4) {
		data[0] = ST_SYS | (k->len ? ST_OBF : 0) | (k->pending_cmd ? ST_CMD : 0);
	}
	pthread_mutex_unlock(&k->lock);
}

static void write_command(struct i8042 *k, uint8_t cmd)
{
	switch (cmd) {
	case CMD_READ_CTR:
		push(k, k->ctr);
		break;
	case CMD_WRITE_CTR:
	case CMD_WRITE_OUTP:
		k->pending_cmd = cmd;
		break;
	case CMD_READ_OUTP:
		push(k, k->outp);
		break;
	case CMD_SELF_TEST:
		push(k, 0x55);
		break;
	case CMD_TEST_KBD:
	case CMD_TEST_AUX:
		push(k, 0x00);
		break;
	case CMD_PULSE_RESET:
		request_reset(k);
		break;
	case CMD_DISABLE_KBD:
	case CMD_ENABLE_KBD:
	case CMD_DISABLE_AUX:
	case CMD_ENABLE_AUX:
	default:
		break;
	}
}

static void write_data(struct i8042 *k, uint8_t v)
{
	uint8_t cmd = k->pending_cmd;
	k->pending_cmd = 0;
	switch (cmd) {
	case CMD_WRITE_CTR:
		k->ctr = v;
		return;
	case CMD_WRITE_OUTP:
		k->outp = v;
		/* Bit 0 of the output port is the CPU reset line, active low. */
		if (!(v & 0x01))
			request_reset(k);
		return;
	default:
		break;
	}
	/* A byte for the keyboard itself: acknowledge, answering the few that expect data. */
	push(k, 0xfa);
	if (v == 0xff) /* reset: passes its basic assurance test */
		push(k, 0xaa);
	else if (v == 0xf2) { /* identify: an MF2 keyboard */
		push(k, 0xab);
		push(k, 0x83);
	}
}

void i8042_io_write(void *opaque, uint64_t off, const uint8_t *data, uint32_t len)
{
	struct i8042 *k = opaque;
	(void)len;
	pthread_mutex_lock(&k->lock);
	if (off == 4)
		write_command(k, data[0]);
	else if (off == 0)
		write_data(k, data[0]);
	raise_irq(k);
	pthread_mutex_unlock(&k->lock);
}

int i8042_send_ctrl_alt_del(void *opaque)
{
	struct i8042 *k = opaque;
	pthread_mutex_lock(&k->lock);
	if (I8042_BUF - k->len < 3) {
		pthread_mutex_unlock(&k->lock);
		return -ENOSPC;
	}
	/* Make codes for Ctrl, Alt and keypad Del, in the set the guest reads. */
	if (k->ctr & CTR_XLATE) {
		push(k, 0x1d);
		push(k, 0x38);
		push(k, 0x53);
	} else {
		push(k, 0x14);
		push(k, 0x11);
		push(k, 0x71);
	}
	raise_irq(k);
	pthread_mutex_unlock(&k->lock);
	return 0;
}

static const struct io_ops i8042_ops = {
    .name = "i8042",
    .read = i8042_io_read,
    .write = i8042_io_write,
};

int i8042_create(struct i8042 *k, const struct vm_host *host)
{
	memset(k, 0, sizeof(*k));
	pthread_mutex_init(&k->lock, NULL);
	k->host = host;
	k->ctr = CTR_KBD_INT | CTR_SYS | CTR_XLATE;
	k->outp = 0x01;
	/* 0x60..0x64 as one range, as Firecracker does; 0x61 (speaker) reads as zero. */
	return bus_register(host->pio, I8042_BASE, 5, &i8042_ops, k);
}

void i8042_destroy(struct i8042 *k)
{
	pthread_mutex_destroy(&k->lock);
}

void i8042_save(struct i8042 *k, struct i8042_state *st)
{
	memset(st, 0, sizeof(*st));
	pthread_mutex_lock(&k->lock);
	st->version = 1;
	st->ctr = k->ctr;
	st->pending_cmd = k->pending_cmd;
	st->outp = k->outp;
	memcpy(st->buf, k->buf, sizeof(st->buf));
	st->head = k->head;
	st->len = k->len;
	pthread_mutex_unlock(&k->lock);
}

int i8042_restore(struct i8042 *k, const struct i8042_state *st, char *err, size_t errlen)
{
	if (st->version != 1)
		return errmsg(err, errlen, -EINVAL, "i8042: state version %u unknown", st->version);
	if (st->head >= I8042_BUF)
		return errmsg(err, errlen, -EINVAL, "i8042: buffer head %u is past %d", st->head,
			      I8042_BUF);
	if (st->len > I8042_BUF)
		return errmsg(err, errlen, -EINVAL, "i8042: buffer count %u is over %d", st->len,
			      I8042_BUF);
	/* Only the commands that wait for a data byte are ever left pending. */
	if (st->pending_cmd && st->pending_cmd != CMD_WRITE_CTR &&
	    st->pending_cmd != CMD_WRITE_OUTP)
		return errmsg(err, errlen, -EINVAL, "i8042: pending command 0x%x takes no data",
			      st->pending_cmd);
	pthread_mutex_lock(&k->lock);
	k->ctr = st->ctr;
	k->pending_cmd = st->pending_cmd;
	k->outp = st->outp;
	memcpy(k->buf, st->buf, sizeof(k->buf));
	k->head = st->head;
	k->len = st->len;
	pthread_mutex_unlock(&k->lock);
	return 0;
}
