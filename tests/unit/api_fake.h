/* A fake VM behind the control API for the unit tests: counts calls, fails on demand. */
#ifndef COVE_TEST_API_FAKE_H
#define COVE_TEST_API_FAKE_H

#include "helpers.h"
#include "sandbox/api.h"

struct fake_vm {
	const char *state;
	int vcpus;
	uint64_t mem_bytes;
	int info_ret, pause_ret, resume_ret, cad_ret, dirty_ret;
	int pauses, resumes, cads, dirty_calls;
	const struct api_dirty_range *ranges;
	size_t nr_ranges;
	bool has_balloon;
	uint64_t balloon_mib; /* the target last set */
	int balloon_sets;
};

static inline int fake_get_info(void *opaque, struct api_vm_info *out)
{
	struct fake_vm *vm = opaque;

	if (vm->info_ret)
		return vm->info_ret;
	out->state = vm->state;
	out->vcpus = vm->vcpus;
	out->mem_bytes = vm->mem_bytes;
	out->version = "0.1.0";
	return 0;
}

static inline int fake_pause(void *opaque)
{
	struct fake_vm *vm = opaque;

	vm->pauses++;
	if (vm->pause_ret)
		return vm->pause_ret;
	vm->state = "Paused";
	return 0;
}

static inline int fake_resume(void *opaque)
{
	struct fake_vm *vm = opaque;

	vm->resumes++;
	if (vm->resume_ret)
		return vm->resume_ret;
	vm->state = "Running";
	return 0;
}

static inline int fake_ctrl_alt_del(void *opaque)
{
	struct fake_vm *vm = opaque;

	vm->cads++;
	return vm->cad_ret;
}

static inline int fake_dirty_pages(void *opaque, struct api_dirty_range *out, size_t max,
				   size_t *nr)
{
	struct fake_vm *vm = opaque;
	size_t n = vm->nr_ranges < max ? vm->nr_ranges : max;

	vm->dirty_calls++;
	if (vm->dirty_ret && vm->dirty_ret != -E2BIG)
		return vm->dirty_ret;
	if (n)
		memcpy(out, vm->ranges, n * sizeof(*out));
	*nr = n;
	return vm->nr_ranges > max ? -E2BIG : vm->dirty_ret;
}

static inline int fake_balloon_get(void *opaque, struct balloon_info *out)
{
	struct fake_vm *vm = opaque;

	if (!vm->has_balloon)
		return -ENODEV;
	memset(out, 0, sizeof(*out));
	out->target_pages = (uint32_t)(vm->balloon_mib * 256);
	out->actual_pages = 512;
	out->reporting = true;
	out->reported_bytes = 150ull << 20;
	out->stats_valid = 1u << BALLOON_STAT_MEMFREE;
	out->stats[BALLOON_STAT_MEMFREE] = 4242;
	out->stats[BALLOON_STAT_MEMTOT] = 99; /* not valid: left out */
	return 0;
}

static inline int fake_balloon_set(void *opaque, uint64_t mib)
{
	struct fake_vm *vm = opaque;

	if (!vm->has_balloon)
		return -ENODEV;
	vm->balloon_sets++;
	vm->balloon_mib = mib;
	return 0;
}

static inline struct fake_vm fake_running(void)
{
	return (struct fake_vm){.state = "Running", .vcpus = 2, .mem_bytes = 256ull << 20};
}

static inline struct api_backend fake_backend(struct fake_vm *vm)
{
	return (struct api_backend){
	    .opaque = vm,
	    .get_info = fake_get_info,
	    .pause = fake_pause,
	    .resume = fake_resume,
	    .ctrl_alt_del = fake_ctrl_alt_del,
	    .dirty_pages = fake_dirty_pages,
	    .balloon_get = fake_balloon_get,
	    .balloon_set = fake_balloon_set,
	};
}

#endif
