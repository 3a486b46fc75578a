/* The LTTng-UST peer of the Rust raw emit: nanoseconds per recorded
 * tracepoint carrying the same event (a u64, a double, a flag and the
 * message "order taken"), from one thread.
 *
 *   lttng_bench EVENTS [BUSY_MS]
 *
 * Run it inside a recording session that has the eventd_bench:order event
 * enabled (eventd-perf starts a private lttng-sessiond for that); outside
 * one a tracepoint is one untaken branch. Like bench.c it times EVENTS
 * events after EVENTS / 4 untimed ones, and prints "lttng WALL CPU" (ns
 * per event; CPU is this thread's own). Before the untimed events it spins
 * on the clock for BUSY_MS milliseconds (0 if not given), as bench.c does. */
#define _GNU_SOURCE
#define LTTNG_UST_TRACEPOINT_DEFINE
#define LTTNG_UST_TRACEPOINT_CREATE_PROBES
#include "lttng_tp.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

static double clock_ns(clockid_t id) {
    struct timespec t;
    clock_gettime(id, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}

int main(int argc, char **argv) {
    if (argc != 2 && argc != 3) {
        fprintf(stderr, "usage: %s EVENTS [BUSY_MS]\n", argv[0]);
        return 2;
    }
    long n = atol(argv[1]);
    if (!lttng_ust_tracepoint_enabled(eventd_bench, order)) {
        fprintf(stderr, "lttng_bench: eventd_bench:order is not enabled in a session\n");
        return 1;
    }
    double until = clock_ns(CLOCK_MONOTONIC) + (argc == 3 ? (double)atol(argv[2]) * 1e6 : 0.0);
    while (clock_ns(CLOCK_MONOTONIC) < until)
        ;
    for (long i = 0; i < n / 4; i++)
        lttng_ust_tracepoint(eventd_bench, order, (uint64_t)i, (double)i * 0.5, (int)(i % 2),
                             "order taken");
    double t0 = clock_ns(CLOCK_MONOTONIC), c0 = clock_ns(CLOCK_THREAD_CPUTIME_ID);
    for (long i = 0; i < n; i++)
        lttng_ust_tracepoint(eventd_bench, order, (uint64_t)i, (double)i * 0.5, (int)(i % 2),
                             "order taken");
    double wall = (clock_ns(CLOCK_MONOTONIC) - t0) / (double)n;
    double cpu = (clock_ns(CLOCK_THREAD_CPUTIME_ID) - c0) / (double)n;
    printf("lttng %.1f %.1f\n", wall, cpu);
    return 0;
}
