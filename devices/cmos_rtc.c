/* MC146818 CMOS clock: without one, Linux spins up to a second waiting for the update flag to
 * clear. */
#include "devices/cmos_rtc.h"

#include <errno.h>
#include <string.h>
#include <time.h>

#include "common/errmsg.h"
#include "vmm/vm_host.h"

#define REG_SECONDS 0x00
#define REG_MINUTES 0x02
#define REG_HOURS   0x04
#define REG_WEEKDAY 0x06
#define REG_DAY	    0x07
#define REG_MONTH   0x08
#define REG_YEAR    0x09
#define REG_A	    0x0a
#define REG_B	    0x0b
#define REG_C	    0x0c
#define REG_D	    0x0d
#define REG_CENTURY 0x32

#define REG_A_DIVIDER 0x26 /* 32.768 kHz base, 1024 Hz rate; UIP (bit 7) never set */
#define REG_B_24H     0x02 /* 24-hour clock, BCD (DM clear), no interrupts */
#define REG_D_VRT     0x80 /* the battery is fine: time is valid */

static uint8_t bcd(int v)
{
	return (uint8_t)(((v / 10) << 4) | (v % 10));
}

static uint8_t read_reg(struct cmos_rtc *c, uint8_t reg)
{
	time_t now = time(NULL);
	struct tm tm;
	gmtime_r(&now, &tm);
	switch (reg) {
	case REG_SECONDS:
		return bcd(tm.tm_sec);
	case REG_MINUTES:
		return bcd(tm.tm_min);
	case REG_HOURS:
		return bcd(tm.tm_hour);
	case REG_WEEKDAY:
		return bcd(tm.tm_wday + 1);
	case REG_DAY:
		return bcd(tm.tm_mday);
	case REG_MONTH:
		return bcd(tm.tm_mon + 1);
	case REG_YEAR:
		return bcd(tm.tm_year % 100);
	case REG_CENTURY:
		return bcd((tm.tm_year + 1900) / 100);
	case REG_A:
		return REG_A_DIVIDER;
	case REG_B:
		return REG_B_24H;
	case REG_C:
		return 0;
	case REG_D:
		return REG_D_VRT;
	default:
		return c->ram[reg];
	}
}

void cmos_rtc_io_read(void *opaque, uint64_t off, uint8_t *data, uint32_t len)
{
	struct cmos_rtc *c = opaque;
	memset(data, 0, len);
	pthread_mutex_lock(&c->lock);
	data[0] = off == 1 ? read_reg(c, c->index) : 0xff;
	pthread_mutex_unlock(&c->lock);
}

void cmos_rtc_io_write(void *opaque, uint64_t off, const uint8_t *data, uint32_t len)
{
	struct cmos_rtc *c = opaque;
	(void)len;
	pthread_mutex_lock(&c->lock);
	if (off == 0) {
		c->index = data[0] & 0x7f; /* bit 7 is the NMI mask, not part of the index */
	} else if (c->index > REG_D && c->index != REG_CENTURY) {
		/* Clock registers stay the host's time; the rest is plain NVRAM. */
		c->ram[c->index] = data[0];
	}
	pthread_mutex_unlock(&c->lock);
}

static const struct io_ops cmos_ops = {
    .name = "cmos-rtc",
    .read = cmos_rtc_io_read,
    .write = cmos_rtc_io_write,
};

int cmos_rtc_create(struct cmos_rtc *c, const struct vm_host *host)
{
	memset(c, 0, sizeof(*c));
	pthread_mutex_init(&c->lock, NULL);
	return bus_register(host->pio, CMOS_BASE, 2, &cmos_ops, c);
}

void cmos_rtc_destroy(struct cmos_rtc *c)
{
	pthread_mutex_destroy(&c->lock);
}

void cmos_rtc_save(struct cmos_rtc *c, struct cmos_rtc_state *st)
{
	memset(st, 0, sizeof(*st));
	pthread_mutex_lock(&c->lock);
	st->version = 1;
	st->index = c->index;
	memcpy(st->ram, c->ram, sizeof(st->ram));
	pthread_mutex_unlock(&c->lock);
}

int cmos_rtc_restore(struct cmos_rtc *c, const struct cmos_rtc_state *st, char *err, size_t errlen)
{
	if (st->version != 1)
		return errmsg(err, errlen, -EINVAL, "CMOS RTC: state version %u unknown",
			      st->version);
	/* The same rule as a guest write to port 0x70: the index addresses the 128-byte RAM. */
	if (st->index >= CMOS_SIZE)
		return errmsg(err, errlen, -EINVAL, "CMOS RTC: index 0x%x is past the %d-byte RAM",
			      st->index, CMOS_SIZE);
	pthread_mutex_lock(&c->lock);
	c->index = st->index;
	memcpy(c->ram, st->ram, sizeof(c->ram));
	pthread_mutex_unlock(&c->lock);
	return 0;
}
