/* Clock readings shared by every layer (one copy instead of a static helper per file). */
#include "common/clock.h"

#include <time.h>

static struct timespec now(clockid_t c)
{
	struct timespec ts;

	clock_gettime(c, &ts);
	return ts;
}

uint64_t mono_ns(void)
{
	struct timespec ts = now(CLOCK_MONOTONIC);

	return (uint64_t)ts.tv_sec * 1000000000ULL + (uint64_t)ts.tv_nsec;
}

uint64_t mono_us(void)
{
	struct timespec ts = now(CLOCK_MONOTONIC);

	return (uint64_t)ts.tv_sec * 1000000 + (uint64_t)ts.tv_nsec / 1000;
}

double mono_s(void)
{
	struct timespec ts = now(CLOCK_MONOTONIC);

	return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

int64_t realtime_ms(void)
{
	struct timespec ts = now(CLOCK_REALTIME);

	return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int64_t realtime_ns(void)
{
	struct timespec ts = now(CLOCK_REALTIME);

	return (int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec;
}
