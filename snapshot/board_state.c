/* Snapshot state of every board device, as state-file sections (one plain struct per device). */
#include "snapshot/board_state.h"

#include <errno.h>
#include <string.h>

#include "common/errmsg.h"
#include "common/log.h"

/*
 * Section instance numbers: fixed for the legacy devices, 16 + slot for a virtio-mmio transport,
 * 48 + slot for a table device's own state (device_type.state_size).
 */
enum { DEV_SERIAL = 0, DEV_I8042 = 1, DEV_RTC = 2, DEV_VIRTIO = 16, DEV_OWN = 48 };

void board_quiesce(struct board *b)
{
	for (int i = 0; i < b->nr_virtio; i++)
		if (b->devs[i].type->quiesce)
			b->devs[i].type->quiesce(b->devs[i].dev);
}

void board_save(struct board *b, struct state_buf *buf)
{
	struct serial_state ss;
	struct i8042_state ks;
	struct cmos_rtc_state rs;
	serial_save(&b->com1, &ss);
	i8042_save(&b->kbd, &ks);
	cmos_rtc_save(&b->rtc, &rs);
	state_put(buf, SEC_DEVICE, DEV_SERIAL, &ss, sizeof(ss));
	state_put(buf, SEC_DEVICE, DEV_I8042, &ks, sizeof(ks));
	state_put(buf, SEC_DEVICE, DEV_RTC, &rs, sizeof(rs));
	for (int i = 0; i < b->nr_virtio; i++) {
		const struct device_type *t = b->devs[i].type;
		struct virtio_mmio_state ms;
		if (t->save_mmio)
			t->save_mmio(b->devs[i].dev, &ms);
		else
			virtio_mmio_save(b->virtio[i], &ms);
		state_put(buf, SEC_DEVICE, DEV_VIRTIO + (uint32_t)i, &ms, sizeof(ms));
		if (t->state_size) {
			_Alignas(8) unsigned char own[DEVICE_STATE_MAX];
			memset(own, 0, sizeof(own));
			t->save(b->devs[i].dev, own);
			state_put(buf, SEC_DEVICE, DEV_OWN + (uint32_t)i, own, t->state_size);
		}
	}
}

static const void *dev_section(const struct state_section_ref *s, size_t n, uint32_t inst,
			       size_t len, const char *what, char *err, size_t errlen)
{
	const struct state_section_ref *sec = state_find(s, n, SEC_DEVICE, inst);
	if (!sec || sec->len != len) {
		errmsg(err, errlen, -EINVAL, "%s state is %s", what,
		       sec ? "the wrong size" : "missing");
		return NULL;
	}
	return sec->payload;
}

static int board_restore_devices(struct board *b, const struct state_section_ref *s, size_t n,
				 char *err, size_t errlen)
{
	struct serial_state ss;
	struct i8042_state ks;
	struct cmos_rtc_state rs;
	const void *p;
	if (!(p = dev_section(s, n, DEV_SERIAL, sizeof(ss), "serial", err, errlen)))
		return -EINVAL;
	memcpy(&ss, p, sizeof(ss));
	if (!(p = dev_section(s, n, DEV_I8042, sizeof(ks), "i8042", err, errlen)))
		return -EINVAL;
	memcpy(&ks, p, sizeof(ks));
	if (!(p = dev_section(s, n, DEV_RTC, sizeof(rs), "CMOS RTC", err, errlen)))
		return -EINVAL;
	memcpy(&rs, p, sizeof(rs));
	/* Each names the device and field it refuses; nothing is applied before its check. */
	int r;
	if ((r = serial_restore(&b->com1, &ss, err, errlen)) ||
	    (r = i8042_restore(&b->kbd, &ks, err, errlen)) ||
	    (r = cmos_rtc_restore(&b->rtc, &rs, err, errlen)))
		return r;
	/* A device the snapshot had and this board lacks (or the reverse) is an error. */
	if (state_find(s, n, SEC_DEVICE, DEV_VIRTIO + (uint32_t)b->nr_virtio))
		return errmsg(err, errlen, -EINVAL,
			      "it has more virtio devices than this machine (%d)", b->nr_virtio);
	for (int i = 0; i < b->nr_virtio; i++) {
		struct virtio_mmio_state ms;
		if (!(p = dev_section(s, n, DEV_VIRTIO + (uint32_t)i, sizeof(ms), "virtio device",
				      err, errlen)))
			return -EINVAL;
		memcpy(&ms, p, sizeof(ms));
		r = virtio_mmio_restore(b->virtio[i], &ms, err, errlen);
		if (r)
			return r;
		const struct device_type *t = b->devs[i].type;
		if (!t->state_size)
			continue;
		if (!(p = dev_section(s, n, DEV_OWN + (uint32_t)i, t->state_size, t->name, err,
				      errlen)))
			return -EINVAL;
		_Alignas(8) unsigned char own[DEVICE_STATE_MAX];
		memcpy(own, p, t->state_size);
		r = t->restore(b->devs[i].dev, own, err, errlen);
		if (r)
			return r;
	}
	return 0;
}

int board_restore(struct board *b, const struct state_section_ref *s, size_t n, char *err,
		  size_t errlen)
{
	char why[256] = "";
	int r = board_restore_devices(b, s, n, why, sizeof(why));
	if (r)
		errmsg(err, errlen, r, "state file: %s", why);
	return r;
}

void board_resume_restored(struct board *b, struct logger *log)
{
	for (int i = 0; i < b->nr_virtio; i++)
		virtio_mmio_resume_restored(b->virtio[i]);
	for (int i = 0; i < b->nr_virtio; i++)
		if (b->devs[i].type->resumed)
			b->devs[i].type->resumed(b->devs[i].dev, log);
	for (int i = 0; i < b->nr_virtio; i++)
		virtio_mmio_kick_all(b->virtio[i]);
}
