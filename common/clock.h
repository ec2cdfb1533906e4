/* Clock readings: monotonic for durations and deadlines, realtime for wall-clock stamps. */
#ifndef COVE_CLOCK_H
#define COVE_CLOCK_H

#include <stdint.h>

/* CLOCK_MONOTONIC in nanoseconds. */
int64_t mono_ns(void);
/* CLOCK_MONOTONIC in seconds. */
double mono_s(void);
/* CLOCK_REALTIME in milliseconds since the epoch. */
int64_t realtime_ms(void);

#endif
