/* 16550A UART (COM1): guest output to a file descriptor, host input into the receive FIFO. */
#ifndef COVE_SERIAL_H
#define COVE_SERIAL_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define SERIAL_COM1_BASE 0x3f8
#define SERIAL_COM1_IRQ	 4
#define SERIAL_RX_FIFO	 4096

struct vm_host;

/* Plain register state: what a snapshot saves. */
struct serial_regs {
	uint8_t ier, iir_thre_pending, lcr, mcr, lsr_extra, msr, scr, dll, dlm, fcr;
};

struct serial {
	pthread_mutex_t lock;
	const struct vm_host *host;
	int out_fd;
	uint32_t irq;
	int irq_level;
	struct serial_regs r;
	uint8_t rx[SERIAL_RX_FIFO];
	size_t rx_head, rx_len;
	uint64_t tx_bytes;
	uint64_t out_max, out_bytes; /* console cap (0: none) and bytes written to out_fd */
	/* The console line being written, to notice a guest kernel panic. */
	char line[128];
	size_t line_len;
};

/* Registers the UART on the host's port bus; guest output goes to out_fd. */
int serial_create(struct serial *s, const struct vm_host *host, int out_fd);
void serial_destroy(struct serial *s);
/* Queues host input for the guest; returns how many bytes fit. */
size_t serial_push_input(struct serial *s, const uint8_t *buf, size_t len);
/* Free space in the receive FIFO. */
size_t serial_rx_space(struct serial *s);

/* Register access (what the bus calls); exposed for unit tests. */
void serial_io_read(void *opaque, uint64_t off, uint8_t *data, uint32_t len);
void serial_io_write(void *opaque, uint64_t off, const uint8_t *data, uint32_t len);

/* Snapshot state: the UART registers (console bytes in flight are not kept). */
struct serial_state {
	uint32_t version;
	struct serial_regs r;
	uint8_t pad[2];
	int32_t irq_level;
};
void serial_save(struct serial *s, struct serial_state *st);
/* Checks every field as a guest write would be checked; 0 or -EINVAL with a reason in err. */
int serial_restore(struct serial *s, const struct serial_state *st, char *err, size_t errlen);

#endif
