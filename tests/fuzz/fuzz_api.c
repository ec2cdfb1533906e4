/*
 * libFuzzer target: the control API's request handler (sandbox/api.c, api_handle: routing and
 * JSON bodies), without a socket, over a fake VM whose hooks fail when the input says so. The
 * input is "METHOD\nPATH\nBODY"; its first byte picks which hooks fail.
 */
#include <errno.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fuzz.h"
#include "sandbox/api.h"

struct fake {
	uint8_t fail; /* bit n: hook n returns an error */
	bool paused;
};

static int fail_if(const struct fake *f, int bit, int err)
{
	return (f->fail >> bit) & 1 ? err : 0;
}

static int get_info(void *o, struct api_vm_info *out)
{
	struct fake *f = o;
	*out = (struct api_vm_info){f->paused ? "Paused" : "Running", 2, 256ULL << 20, "fuzz"};
	return fail_if(f, 0, -EIO);
}

static int pause_vm(void *o)
{
	struct fake *f = o;
	int r = fail_if(f, 1, -EBUSY);
	f->paused = !r;
	return r;
}

static int resume_vm(void *o)
{
	struct fake *f = o;
	int r = fail_if(f, 2, -EINVAL);
	f->paused = r != 0;
	return r;
}

static int cad(void *o)
{
	return fail_if(o, 3, -ENOTSUP);
}

static int dirty(void *o, struct api_dirty_range *out, size_t max, size_t *nr)
{
	struct fake *f = o;
	size_t n = max < 3 ? max : 3;
	for (size_t i = 0; i < n; i++)
		out[i] = (struct api_dirty_range){i * 100, i + 1};
	*nr = n;
	return fail_if(f, 4, (f->fail & 0x80) ? -E2BIG : -ENODATA);
}

static int snapshot(void *o, bool full, const char *dir, struct api_snapshot_result *out, char *err,
		    size_t errlen)
{
	struct fake *f = o;
	if (dir && strlen(dir) >= 4096)
		abort(); /* the handler caps what it passes on */
	*out = (struct api_snapshot_result){.layer_id = 7, .full = full, .pages = 3};
	int r = fail_if(f, 5, -EIO);
	if (r)
		snprintf(err, errlen, "fake snapshot failed");
	return r;
}

static int fork_vm(void *o, int count, bool identity, struct api_clone *out, char *err,
		   size_t errlen)
{
	struct fake *f = o;
	(void)identity;
	if (count < 1 || count > API_MAX_FORKS)
		abort(); /* the handler checks the count before asking */
	for (int i = 0; i < count; i++) {
		memset(&out[i], 0, sizeof(out[i]));
		out[i].pid = 100 + i;
		out[i].cid = 3 + (uint64_t)i;
		snprintf(out[i].api_sock, sizeof(out[i].api_sock), "/tmp/api-%d.sock", i);
		snprintf(out[i].identity, sizeof(out[i].identity), "sent");
	}
	int r = fail_if(f, 6, -EAGAIN);
	if (r)
		snprintf(err, errlen, "fake fork failed");
	return r;
}

/* The balloon hooks: bit 7 of `fail` says "no balloon device". */
static int balloon_get(void *o, struct balloon_info *out)
{
	struct fake *f = o;
	if (f->fail & 0x80)
		return -ENODEV;
	memset(out, 0, sizeof(*out));
	out->target_pages = 4096;
	out->actual_pages = 1024;
	out->reporting = out->stats_vq = out->deflate_on_oom = true;
	out->stats_updates = 1;
	out->stats_valid = 0x30;
	out->stats[4] = 100ULL << 20;
	out->stats[5] = 256ULL << 20;
	return 0;
}

static int balloon_set(void *o, uint64_t target_mib)
{
	struct fake *f = o;
	if (f->fail & 0x80)
		return -ENODEV;
	return target_mib > (1ULL << 20) ? -EINVAL : 0;
}

static void on_request(void *o)
{
	(void)o;
}

/* Splits at the next '\n' (or the end): a NUL-terminated copy of the part before it. */
static char *take_line(struct fuzz_in *in)
{
	const uint8_t *nl = in->left ? memchr(in->p, '\n', in->left) : NULL;
	size_t n = nl ? (size_t)(nl - in->p) : in->left, got;
	const uint8_t *p = fuzz_bytes(in, n, &got);
	char *s = fuzz_strdup(p, got);
	if (nl)
		fuzz_bytes(in, 1, &got);
	return s;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	struct fuzz_in in = {data, size};
	struct fake f = {.fail = fuzz_u8(&in)};
	f.paused = f.fail & 0x40;
	const struct api_backend be = {.opaque = &f,
				       .get_info = get_info,
				       .pause = pause_vm,
				       .resume = resume_vm,
				       .ctrl_alt_del = cad,
				       .dirty_pages = dirty,
				       .snapshot = snapshot,
				       .fork = fork_vm,
				       .balloon_get = balloon_get,
				       .balloon_set = balloon_set,
				       .on_request = on_request};
	struct api_response resp = {0};
	char *method = take_line(&in), *path = take_line(&in);
	/* The body exactly as long as the rest of the input, not NUL-terminated. */
	size_t blen = in.left;
	char *body = blen ? malloc(blen) : NULL;
	if (!method || !path || (blen && !body))
		goto out;
	if (blen)
		memcpy(body, in.p, blen);
	int r = api_handle(&be, method, path, body, blen, &resp);
	if (r != 0 && r != -ENOMEM)
		abort();
	if (r == 0) {
		if (resp.status < 100 || resp.status > 599)
			abort();
		/* Every body the handler writes is JSON. */
		if (resp.body) {
			json_error_t je;
			json_t *j = json_loads(resp.body, 0, &je);
			if (!j)
				abort();
			json_decref(j);
		} else if (resp.status != 204) {
			abort();
		}
	}
	free(resp.body);
out:
	free(body);
	free(path);
	free(method);
	return 0;
}
