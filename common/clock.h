/* Clock readings: monotonic for durations and deadlines, realtime for wall-clock stamps. One copy
 * for every layer (each caller keeps the clock it had: monotonic or realtime). */
#ifndef COVE_CLOCK_H
#define COVE_CLOCK_H

#include <stdint.h>

/* CLOCK_MONOTONIC in nanoseconds, microseconds (truncated) and seconds. */
uint64_t mono_ns(void);
uint64_t mono_us(void);
double mono_s(void);
/* CLOCK_REALTIME since the epoch, in milliseconds (truncated) and nanoseconds. */
int64_t realtime_ms(void);
int64_t realtime_ns(void);

#endif
