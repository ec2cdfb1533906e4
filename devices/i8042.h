/* i8042 keyboard controller: enough for a guest to reset the machine and for the host to send
 * Ctrl-Alt-Del. */
#ifndef COVE_I8042_H
#define COVE_I8042_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define I8042_BASE 0x60
#define I8042_IRQ  1
#define I8042_BUF  16

struct vm_host;

struct i8042 {
	pthread_mutex_t lock;
	const struct vm_host *host;
	uint8_t ctr;	     /* controller configuration byte */
	uint8_t pending_cmd; /* command whose data byte is expected on port 0x60 */
	uint8_t outp;	     /* output port */
	uint8_t buf[I8042_BUF];
	unsigned head, len;
	/* Set when the guest asked for a reset (0xFE command or output port bit 0 cleared). */
	int reset_requested;
};

/* Registers the controller on the host's port bus. */
int i8042_create(struct i8042 *k, const struct vm_host *host);
void i8042_destroy(struct i8042 *k);
/* Queues the Ctrl-Alt-Del key presses and raises IRQ 1. Returns 0 or -ENOSPC. */
int i8042_send_ctrl_alt_del(void *k);

/* Exposed for unit tests. Offsets: 0 = data port 0x60, 4 = command/status 0x64. */
void i8042_io_read(void *opaque, uint64_t off, uint8_t *data, uint32_t len);
void i8042_io_write(void *opaque, uint64_t off, const uint8_t *data, uint32_t len);

/* Snapshot state of the controller. */
struct i8042_state {
	uint32_t version;
	uint8_t ctr, pending_cmd, outp, pad;
	uint8_t buf[I8042_BUF];
	uint32_t head, len;
};
void i8042_save(struct i8042 *k, struct i8042_state *st);
/* Checks every field as a guest write would be checked; 0 or -EINVAL with a reason in err. */
int i8042_restore(struct i8042 *k, const struct i8042_state *st, char *err, size_t errlen);

#endif
