/* MC146818 CMOS real-time clock at ports 0x70/0x71: the host's UTC time, read-only. */
#ifndef COVE_CMOS_RTC_H
#define COVE_CMOS_RTC_H

#include <pthread.h>
#include <stddef.h>
#include <stdint.h>

#define CMOS_BASE 0x70
#define CMOS_SIZE 128

struct vm_host;

struct cmos_rtc {
	pthread_mutex_t lock;
	uint8_t index;
	uint8_t ram[CMOS_SIZE]; /* non-clock bytes the guest may store */
};

int cmos_rtc_create(struct cmos_rtc *c, const struct vm_host *host);
void cmos_rtc_destroy(struct cmos_rtc *c);

/* Exposed for unit tests. Offsets: 0 = index port 0x70, 1 = data port 0x71. */
void cmos_rtc_io_read(void *opaque, uint64_t off, uint8_t *data, uint32_t len);
void cmos_rtc_io_write(void *opaque, uint64_t off, const uint8_t *data, uint32_t len);

/* Snapshot state: the index register and the guest's CMOS bytes (the clock reads the host). */
struct cmos_rtc_state {
	uint32_t version;
	uint8_t index, pad[3];
	uint8_t ram[CMOS_SIZE];
};
void cmos_rtc_save(struct cmos_rtc *c, struct cmos_rtc_state *st);
/* Checks every field as a guest write would be checked; 0 or -EINVAL with a reason in err. */
int cmos_rtc_restore(struct cmos_rtc *c, const struct cmos_rtc_state *st, char *err, size_t errlen);

#endif
