/* What the S3 client retries (5xx, 429, connection errors; never other 4xx) and how long it
 * waits: exponential backoff with jitter, bounded. */
#include "lifecycle/store/s3_internal.h"

#include <errno.h>
#include <time.h>

bool s3_retryable(CURLcode cc, long status)
{
	switch (cc) {
	case CURLE_OK:
		return status >= 500 || status == 429;
	case CURLE_COULDNT_CONNECT:
	case CURLE_COULDNT_RESOLVE_HOST:
	case CURLE_OPERATION_TIMEDOUT:
	case CURLE_SEND_ERROR:
	case CURLE_RECV_ERROR:
	case CURLE_GOT_NOTHING:
	case CURLE_PARTIAL_FILE:
	case CURLE_SSL_CONNECT_ERROR: /* a peer that dies mid-handshake; not a bad certificate */
	case CURLE_HTTP2:
	case CURLE_HTTP2_STREAM:
		return true;
	default:
		return false;
	}
}

static uint64_t xorshift(uint64_t *s)
{
	uint64_t x = *s ? *s : 0x9e3779b97f4a7c15ull;
	x ^= x << 13;
	x ^= x >> 7;
	x ^= x << 17;
	*s = x;
	return x;
}

unsigned s3_backoff_ms(unsigned attempt, unsigned base_ms, unsigned max_ms, uint64_t *rng)
{
	if (attempt < 1)
		attempt = 1;
	uint64_t ceil = base_ms;
	for (unsigned i = 1; i < attempt && ceil < max_ms; i++)
		ceil *= 2;
	if (ceil > max_ms)
		ceil = max_ms;
	uint64_t floor = ceil / 2;
	return (unsigned)(floor + xorshift(rng) % (ceil - floor + 1));
}

void s3_sleep_ms(unsigned ms)
{
	struct timespec ts = {.tv_sec = ms / 1000, .tv_nsec = (long)(ms % 1000) * 1000000L};
	while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
		;
}
