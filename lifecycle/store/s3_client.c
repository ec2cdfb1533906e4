/* The S3 client's life: options with their defaults, the reused easy handle, the secrets. */
#include "lifecycle/store/s3_internal.h"

#include "common/errmsg.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

int s3_client_new(const struct store_config *cfg, const struct s3_opts *opts,
		  struct s3_client **out, char *err, size_t errlen)
{
	*out = NULL;
	struct s3_client *c = calloc(1, sizeof(*c));
	if (!c)
		return errmsg(err, errlen, -ENOMEM, "s3: out of memory");
	c->cfg = *cfg;
	if (opts)
		c->opts = *opts;
	struct s3_opts *o = &c->opts;
	if (!o->max_attempts)
		o->max_attempts = 6;
	if (!o->base_delay_ms)
		o->base_delay_ms = 100;
	if (!o->max_delay_ms)
		o->max_delay_ms = 5000;
	if (!o->connect_timeout_ms)
		o->connect_timeout_ms = 5000;
	if (!o->stall_timeout_s)
		o->stall_timeout_s = 30;
	if (!o->part_size)
		o->part_size = 8u << 20;
	if (!o->parallel)
		o->parallel = 4;
	int r = 0;
	if (o->max_attempts < 1 || o->max_attempts > 100 || o->parallel < 1 ||
	    o->parallel > S3_PARALLEL_MAX || o->part_size < S3_PART_MIN ||
	    o->part_size > S3_PART_MAX || o->base_delay_ms > o->max_delay_ms) {
		r = errmsg(err, errlen, -EINVAL,
			   "s3: options out of range (attempts 1-100, parallel 1-%d, part size "
			   "5 MiB-512 MiB, base delay <= max delay)",
			   S3_PARALLEL_MAX);
		goto fail;
	}
	for (const char *const *p = o->resolve; p && *p; p++) {
		struct curl_slist *l = curl_slist_append(c->resolve, *p);
		if (!l) {
			r = -ENOMEM;
			goto fail;
		}
		c->resolve = l;
	}
	if (getrandom(&c->rng, sizeof(c->rng), 0) != sizeof(c->rng))
		c->rng = (uint64_t)(uintptr_t)c;
	c->easy = curl_easy_init();
	if (!c->easy) {
		r = errmsg(err, errlen, -ENOMEM, "s3: curl_easy_init failed");
		goto fail;
	}
	*out = c;
	return 0;
fail:
	s3_client_free(c);
	return r;
}

void s3_client_free(struct s3_client *c)
{
	if (!c)
		return;
	if (c->easy)
		curl_easy_cleanup(c->easy);
	curl_slist_free_all(c->resolve);
	store_config_wipe(&c->cfg);
	free(c);
}

void s3_client_counts(const struct s3_client *c, uint64_t *requests, uint64_t *retries)
{
	*requests = c->requests;
	*retries = c->retries;
}
