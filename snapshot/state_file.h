/* Snapshot state file: a checksummed header over typed sections (TLV); writer and bounds-checked
 * reader. */
#ifndef COVE_STATE_FILE_H
#define COVE_STATE_FILE_H

#include <stddef.h>
#include <stdint.h>

#define STATE_MAGIC "COVESTAT"
/* 2 added SEC_VCPU_CPUID; version 1 files (no CPUID recorded) still load. */
#define STATE_VERSION	  2
#define STATE_MIN_VERSION 1
#define STATE_HDR_SIZE	  32
/* A state file holds registers and device structs: a few hundred KiB even with 64 vCPUs. */
#define STATE_MAX_BODY	  (16u << 20)
#define STATE_MAX_SECTION (1u << 20)
/* CPUID entries per vCPU: KVM_GET_SUPPORTED_CPUID gives ~60; cove asks for at most 256. */
#define STATE_MAX_CPUID	       256
#define STATE_CPUID_ENTRY_SIZE 40 /* sizeof(struct kvm_cpuid_entry2), checked in kvm_state.c */

enum state_section {
	SEC_CONFIG = 1, /* JSON: how to rebuild the machine (memory, vCPUs, devices) */
	SEC_CLOCK,	/* struct kvm_clock_data */
	SEC_IRQCHIP,	/* struct kvm_irqchip; instance = chip id */
	SEC_PIT,	/* struct kvm_pit_state2 */
	SEC_VCPU_REGS,	/* instance = vCPU id, for every SEC_VCPU_* */
	SEC_VCPU_SREGS,
	SEC_VCPU_XSAVE,
	SEC_VCPU_XCRS,
	SEC_VCPU_MSRS, /* array of struct kvm_msr_entry */
	SEC_VCPU_LAPIC,
	SEC_VCPU_EVENTS,
	SEC_VCPU_MP_STATE,
	SEC_VCPU_DEBUGREGS,
	SEC_DEVICE,	/* instance = device slot; payload = that device's plain state struct */
	SEC_VCPU_CPUID, /* version 2: array of struct kvm_cpuid_entry2, what the guest saw */
	SEC_MAX,
};

/* Growable buffer the writer appends sections to; the first error sticks in `err`. */
struct state_buf {
	uint8_t *p;
	size_t len, cap;
	int err;
};

void state_buf_init(struct state_buf *b);
void state_buf_free(struct state_buf *b);
/* Appends one section; payload is padded to 8 bytes. */
void state_put(struct state_buf *b, uint32_t type, uint32_t instance, const void *payload,
	       size_t len);
/* Fills in the header (magic, version, length, CRC) of a finished buffer. 0 or b->err. */
int state_finish(struct state_buf *b);

struct state_section_ref {
	uint32_t type, instance;
	const uint8_t *payload;
	uint32_t len;
};

/*
 * Pure: validates a whole state file image (magic, version, size caps, CRC, every section's
 * bounds) and returns its sections in *out (malloc'd array, *n entries).  -EINVAL with a
 * one-line reason in `err` on anything wrong.
 */
int state_parse(const uint8_t *buf, size_t len, struct state_section_ref **out, size_t *n,
		char *err, size_t errlen);
/* The first section of `type`/`instance` or NULL. */
const struct state_section_ref *state_find(const struct state_section_ref *s, size_t n,
					   uint32_t type, uint32_t instance);

/* Reads a whole state file (capped at STATE_MAX_BODY) into a malloc'd buffer. 0 or -errno. */
int state_read_file(const char *path, uint8_t **buf, size_t *len, char *err, size_t errlen);

#endif
