/*
 * A stand-in for the wall clock and the boot clock of one process, for the
 * retention tests: loaded with LD_PRELOAD, it adds offsets to what
 * clock_gettime(2) says for CLOCK_REALTIME (and its coarse variant) and for
 * CLOCK_BOOTTIME. The offsets are read from the file named by
 * $EVENTD_TEST_CLOCK_OFFSETS ("<realtime ns> <boottime ns>"), at most every
 * 10 ms, so a test steps a running daemon's clocks by rewriting the file
 * (atomically, with a rename). CLOCK_MONOTONIC is never touched: Rust's
 * Instant and every timed wait use it, and it runs on.
 *
 * Rust's std reads the wall clock through libc's clock_gettime, which this
 * symbol replaces; the real one (libc's, which takes the vDSO path) is
 * found with dlsym(RTLD_NEXT).
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

typedef int (*clock_gettime_fn)(clockid_t, struct timespec *);

static _Atomic(clock_gettime_fn) real_clock_gettime;
static _Atomic long long realtime_offset_ns;
static _Atomic long long boottime_offset_ns;
static _Atomic long long next_read_ns;

static clock_gettime_fn real(void) {
    clock_gettime_fn f = atomic_load(&real_clock_gettime);
    if (f == NULL) {
        f = (clock_gettime_fn)dlsym(RTLD_NEXT, "clock_gettime");
        atomic_store(&real_clock_gettime, f);
    }
    return f;
}

/* Reads the offsets file again if 10 ms have passed since the last read. */
static void refresh(void) {
    struct timespec mono;
    if (real()(CLOCK_MONOTONIC, &mono) != 0)
        return;
    long long now = (long long)mono.tv_sec * 1000000000LL + mono.tv_nsec;
    long long due = atomic_load(&next_read_ns);
    if (now < due || !atomic_compare_exchange_strong(&next_read_ns, &due, now + 10000000LL))
        return;
    const char *path = getenv("EVENTD_TEST_CLOCK_OFFSETS");
    if (path == NULL)
        return;
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return;
    char text[128];
    ssize_t n = read(fd, text, sizeof text - 1);
    close(fd);
    if (n <= 0)
        return;
    text[n] = '\0';
    long long rt, bt;
    if (sscanf(text, "%lld %lld", &rt, &bt) == 2) {
        atomic_store(&realtime_offset_ns, rt);
        atomic_store(&boottime_offset_ns, bt);
    }
}

static void add(struct timespec *ts, long long offset) {
    long long ns = (long long)ts->tv_nsec + offset % 1000000000LL;
    long long s = (long long)ts->tv_sec + offset / 1000000000LL;
    while (ns < 0) {
        ns += 1000000000LL;
        s -= 1;
    }
    while (ns >= 1000000000LL) {
        ns -= 1000000000LL;
        s += 1;
    }
    ts->tv_sec = (time_t)s;
    ts->tv_nsec = (long)ns;
}

int clock_gettime(clockid_t id, struct timespec *ts) {
    int rc = real()(id, ts);
    if (rc != 0)
        return rc;
    switch (id) {
    case CLOCK_REALTIME:
    case CLOCK_REALTIME_COARSE:
        refresh();
        add(ts, atomic_load(&realtime_offset_ns));
        break;
    case CLOCK_BOOTTIME:
        refresh();
        add(ts, atomic_load(&boottime_offset_ns));
        break;
    default:
        break;
    }
    return rc;
}
