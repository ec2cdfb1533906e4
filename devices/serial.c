/* 16550A UART on COM1: enough of the chip for Linux's 8250 driver and for polled test guests. */
#include "devices/serial.h"

#include <errno.h>
#include <string.h>
#include <unistd.h>

#include "common/errmsg.h"
#include "vmm/vm_host.h"

/* Register offsets (DLAB=0 unless noted). */
#define UART_RBR_THR 0
#define UART_IER     1
#define UART_IIR_FCR 2
#define UART_LCR     3
#define UART_MCR     4
#define UART_LSR     5
#define UART_MSR     6
#define UART_SCR     7

#define IER_RDI		 0x01
#define IER_THRI	 0x02
#define IIR_NONE	 0x01
#define IIR_THRI	 0x02
#define IIR_RDI		 0x04
#define IIR_FIFO_ENABLED 0xc0
#define LCR_DLAB	 0x80
#define LSR_DR		 0x01
#define LSR_THRE	 0x20
#define LSR_TEMT	 0x40
#define MCR_LOOP	 0x10
#define MSR_CTS		 0x10
#define MSR_DSR		 0x20
#define MSR_RI		 0x40
#define MSR_DCD		 0x80

/* Called with the lock held: raise or drop the line to match pending interrupts. */
static void update_irq(struct serial *s)
{
	int level =
	    ((s->r.ier & IER_RDI) && s->rx_len) || ((s->r.ier & IER_THRI) && s->r.iir_thre_pending);
	if (level != s->irq_level) {
		s->irq_level = level;
		s->host->ops->set_irq(s->host->ctx, s->irq, level);
	}
}

static void rx_push_locked(struct serial *s, uint8_t b)
{
	if (s->rx_len == SERIAL_RX_FIFO)
		return;
	s->rx[(s->rx_head + s->rx_len) % SERIAL_RX_FIFO] = b;
	s->rx_len++;
}

#define PANIC_PREFIX "Kernel panic - not syncing"

/*
 * Linux reboots after a panic (panic=-1) exactly as it does when asked to, so
 * the panic line on the console is the only sign that the stop was not clean.
 */
static void watch_line(struct serial *s, uint8_t b)
{
	if (b == '\r')
		return;
	if (b != '\n') {
		if (s->line_len < sizeof(s->line) - 1)
			s->line[s->line_len++] = (char)b;
		return;
	}
	s->line[s->line_len] = 0;
	char *p = strstr(s->line, PANIC_PREFIX);
	if (p)
		s->host->ops->note_panic(s->host->ctx, p);
	s->line_len = 0;
}

static void tx_byte(struct serial *s, uint8_t b)
{
	if (s->r.mcr & MCR_LOOP) {
		rx_push_locked(s, b);
		return;
	}
	s->tx_bytes++;
	watch_line(s, b);
	if (s->out_fd < 0)
		return;
	/* A guest must not fill the host's disk through its console: past the cap, drop. */
	if (s->out_max && s->out_bytes >= s->out_max) {
		if (s->out_bytes++ == s->out_max)
			log_warn(s->host->log,
				 "console: reached its cap of %llu bytes (--console-max); "
				 "further guest output is dropped",
				 (unsigned long long)s->out_max);
		return;
	}
	s->out_bytes++;
	/* A console that cannot keep up loses bytes rather than stalling the vCPU forever. */
	for (int tries = 0; tries < 100; tries++) {
		ssize_t n = write(s->out_fd, &b, 1);
		if (n == 1 || (n < 0 && errno != EINTR && errno != EAGAIN))
			return;
	}
}

static uint8_t read_reg(struct serial *s, uint64_t off)
{
	switch (off) {
	case UART_RBR_THR:
		if (s->r.lcr & LCR_DLAB)
			return s->r.dll;
		if (s->rx_len) {
			uint8_t b = s->rx[s->rx_head];
			s->rx_head = (s->rx_head + 1) % SERIAL_RX_FIFO;
			s->rx_len--;
			return b;
		}
		return 0;
	case UART_IER:
		return (s->r.lcr & LCR_DLAB) ? s->r.dlm : s->r.ier;
	case UART_IIR_FCR: {
		uint8_t fifo = (s->r.fcr & 1) ? IIR_FIFO_ENABLED : 0;
		if ((s->r.ier & IER_RDI) && s->rx_len)
			return IIR_RDI | fifo;
		if ((s->r.ier & IER_THRI) && s->r.iir_thre_pending) {
			/* Reading IIR while it reports THRE acknowledges that interrupt. */
			s->r.iir_thre_pending = 0;
			return IIR_THRI | fifo;
		}
		return IIR_NONE | fifo;
	}
	case UART_LCR:
		return s->r.lcr;
	case UART_MCR:
		return s->r.mcr;
	case UART_LSR:
		return LSR_THRE | LSR_TEMT | (s->rx_len ? LSR_DR : 0);
	case UART_MSR:
		if (s->r.mcr & MCR_LOOP) {
			/* Loopback wires DTR->DSR, RTS->CTS, OUT1->RI, OUT2->DCD. */
			return (uint8_t)(((s->r.mcr & 0x01) << 5) | ((s->r.mcr & 0x02) << 3) |
					 ((s->r.mcr & 0x04) << 4) | ((s->r.mcr & 0x08) << 4));
		}
		return MSR_DCD | MSR_DSR | MSR_CTS;
	case UART_SCR:
		return s->r.scr;
	}
	return 0;
}

static void write_reg(struct serial *s, uint64_t off, uint8_t v)
{
	switch (off) {
	case UART_RBR_THR:
		if (s->r.lcr & LCR_DLAB) {
			s->r.dll = v;
			return;
		}
		tx_byte(s, v);
		/* The byte leaves at once, so the holding register is empty again. */
		s->r.iir_thre_pending = 1;
		return;
	case UART_IER:
		if (s->r.lcr & LCR_DLAB) {
			s->r.dlm = v;
			return;
		}
		/* Enabling THRI with an empty holding register raises it immediately. */
		if (!(s->r.ier & IER_THRI) && (v & IER_THRI))
			s->r.iir_thre_pending = 1;
		s->r.ier = v & 0x0f;
		return;
	case UART_IIR_FCR:
		s->r.fcr = v;
		if (v & 0x02) { /* clear receive FIFO */
			s->rx_head = 0;
			s->rx_len = 0;
		}
		return;
	case UART_LCR:
		s->r.lcr = v;
		return;
	case UART_MCR:
		s->r.mcr = v & 0x1f;
		return;
	case UART_SCR:
		s->r.scr = v;
		return;
	default:
		return; /* LSR and MSR are read-only */
	}
}

void serial_io_read(void *opaque, uint64_t off, uint8_t *data, uint32_t len)
{
	struct serial *s = opaque;
	memset(data, 0, len);
	pthread_mutex_lock(&s->lock);
	data[0] = read_reg(s, off);
	update_irq(s);
	pthread_mutex_unlock(&s->lock);
}

void serial_io_write(void *opaque, uint64_t off, const uint8_t *data, uint32_t len)
{
	struct serial *s = opaque;
	(void)len;
	pthread_mutex_lock(&s->lock);
	write_reg(s, off, data[0]);
	/*
	 * A THR write clears the THRE interrupt and the byte leaves at once, so
	 * THRE is raised again: the IOAPIC pin is edge-triggered and needs a new
	 * edge each time, or a driver that writes THR without reading IIR first
	 * waits forever for an interrupt that never comes (seen with 2 vCPUs).
	 */
	if (off == UART_RBR_THR && !(s->r.lcr & LCR_DLAB) && s->irq_level) {
		s->host->ops->set_irq(s->host->ctx, s->irq, 0);
		s->irq_level = 0;
	}
	update_irq(s);
	pthread_mutex_unlock(&s->lock);
}

static const struct io_ops serial_ops = {
    .name = "serial",
    .read = serial_io_read,
    .write = serial_io_write,
};

int serial_create(struct serial *s, const struct vm_host *host, int out_fd)
{
	memset(s, 0, sizeof(*s));
	pthread_mutex_init(&s->lock, NULL);
	s->host = host;
	s->out_fd = out_fd;
	s->irq = SERIAL_COM1_IRQ;
	s->r.lcr = 0x03;
	s->r.mcr = 0x08;
	s->r.dll = 0x0c; /* 9600 baud, as firmware would leave it */
	return bus_register(host->pio, SERIAL_COM1_BASE, 8, &serial_ops, s);
}

void serial_destroy(struct serial *s)
{
	pthread_mutex_destroy(&s->lock);
}

size_t serial_rx_space(struct serial *s)
{
	pthread_mutex_lock(&s->lock);
	size_t n = SERIAL_RX_FIFO - s->rx_len;
	pthread_mutex_unlock(&s->lock);
	return n;
}

size_t serial_push_input(struct serial *s, const uint8_t *buf, size_t len)
{
	pthread_mutex_lock(&s->lock);
	size_t n = 0;
	while (n < len && s->rx_len < SERIAL_RX_FIFO)
		rx_push_locked(s, buf[n++]);
	update_irq(s);
	pthread_mutex_unlock(&s->lock);
	return n;
}

void serial_save(struct serial *s, struct serial_state *st)
{
	memset(st, 0, sizeof(*st));
	pthread_mutex_lock(&s->lock);
	st->version = 1;
	st->r = s->r;
	st->irq_level = s->irq_level;
	pthread_mutex_unlock(&s->lock);
}

int serial_restore(struct serial *s, const struct serial_state *st, char *err, size_t errlen)
{
	const struct serial_regs *r = &st->r;
	if (st->version != 1)
		return errmsg(err, errlen, -EINVAL, "serial: state version %u unknown",
			      st->version);
	/* Only values a guest write could have left (write_reg masks IER and MCR). */
	if (r->ier & ~0x0f)
		return errmsg(err, errlen, -EINVAL, "serial: IER 0x%x has reserved bits", r->ier);
	if (r->mcr & ~0x1f)
		return errmsg(err, errlen, -EINVAL, "serial: MCR 0x%x has reserved bits", r->mcr);
	if (r->iir_thre_pending > 1)
		return errmsg(err, errlen, -EINVAL, "serial: THRE pending flag %u is not 0 or 1",
			      r->iir_thre_pending);
	if (r->lsr_extra || r->msr)
		return errmsg(err, errlen, -EINVAL,
			      "serial: LSR/MSR extra bits 0x%x/0x%x are not 0", r->lsr_extra,
			      r->msr);
	if (st->irq_level < 0 || st->irq_level > 1)
		return errmsg(err, errlen, -EINVAL, "serial: IRQ level %d is not 0 or 1",
			      st->irq_level);
	pthread_mutex_lock(&s->lock);
	s->r = st->r;
	/* The line level itself lives in the restored irqchip; only our copy of it is set here. */
	s->irq_level = st->irq_level;
	pthread_mutex_unlock(&s->lock);
	return 0;
}
