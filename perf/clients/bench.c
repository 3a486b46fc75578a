/* Nanoseconds per event: libeventd's eventd_emit (fields as JSON),
 * eventd_emit_kv (fields as key/value text) and eventd_emit_fields (typed
 * fields, not formatted) against a syslog(3)-style send, the same event
 * every way, from one thread.
 *
 *   bench KMES_DIR SYSLOG_SOCKET EVENTS [BUSY_MS]
 *
 * The syslog path does what glibc's syslog(3) does for each message (the
 * time formatted with localtime_r and strftime, "<PRI>TIMESTAMP TAG[PID]:
 * MESSAGE" with vsnprintf, one send() on a connected datagram socket), but
 * to eventd's own socket rather than /dev/log, so both paths end in the
 * same daemon. Each message carries the same three fields (as JSON, as
 * text or typed for eventd, as text for syslog).
 *
 * eventd_emit_kv takes text: it is timed twice, once with the values
 * already text (a table of them made before the clock starts, as a
 * program that holds its values as strings has them), once formatting the
 * two numbers with snprintf in the loop, and the snprintf calls are timed
 * alone too, so the library's share and the caller's can be told apart.
 *
 * Every loop times EVENTS events, after EVENTS / 4 untimed ones at the
 * start (the rings opened, mapped and their pages touched once). Before
 * anything, the program spins on the clock for BUSY_MS milliseconds (0 if
 * not given): a CPU just back from idle runs slow for a while on the VM
 * the harness runs on, and eventd-perf gives every path the same start.
 *
 * Prints "NAME WALL CPU" lines (ns per event; CPU is this thread's own)
 * for eventd_emit, eventd_emit_kv, eventd_emit_kv_snprintf, snprintf,
 * eventd_emit_fields and syslog. */
#define _GNU_SOURCE
#include "eventd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

static double clock_ns(clockid_t id) {
    struct timespec t;
    clock_gettime(id, &t);
    return (double)t.tv_sec * 1e9 + (double)t.tv_nsec;
}
#define now() clock_ns(CLOCK_MONOTONIC)
#define cpu() clock_ns(CLOCK_THREAD_CPUTIME_ID)

/* Spins on the clock for `ms` milliseconds. */
static void busy_ms(long ms) {
    double until = now() + (double)ms * 1e6;
    while (now() < until)
        ;
}

int main(int argc, char **argv) {
    if (argc != 4 && argc != 5) {
        fprintf(stderr, "usage: %s KMES_DIR SYSLOG_SOCKET EVENTS [BUSY_MS]\n", argv[0]);
        return 2;
    }
    long n = atol(argv[3]);
    busy_ms(argc == 5 ? atol(argv[4]) : 0);
    eventd_t *ev;
    if (eventd_open(argv[1], "c-bench", &ev) != EVENTD_OK)
        return 1;
    char fields[128], message[256];
    /* A quarter as many events untimed first: the rings are opened, mapped
     * and their pages touched once per program, not per event. */
    eventd_field_t typed[3] = {{"order", EVENTD_KIND_I64, {0}},
                               {"amount", EVENTD_KIND_F64, {0}},
                               {"paid", EVENTD_KIND_BOOL, {0}}};
    for (long i = 0; i < n / 4; i++) {
        typed[0].value.i64 = i;
        typed[1].value.f64 = (double)i * 0.5;
        typed[2].value.boolean = (int)(i % 2);
        eventd_emit_fields(ev, EVENTD_INFO, "bench", "order taken", typed, 3);
    }
    double t0 = now(), c0 = cpu();
    for (long i = 0; i < n; i++) {
        snprintf(fields, sizeof fields, "{\"order\":%ld,\"amount\":%.2f,\"paid\":%s}", i,
                 (double)i * 0.5, i % 2 ? "true" : "false");
        eventd_emit(ev, EVENTD_INFO, "bench", "order taken", fields);
    }
    double ring = (now() - t0) / (double)n, ring_cpu = (cpu() - c0) / (double)n;

    static const char *const keys[3] = {"order", "amount", "paid"};
    char order[24], amount[32];
    const char *values[3] = {order, amount, NULL};
    t0 = now();
    c0 = cpu();
    for (long i = 0; i < n; i++) {
        snprintf(order, sizeof order, "%ld", i);
        snprintf(amount, sizeof amount, "%.2f", (double)i * 0.5);
        values[2] = i % 2 ? "true" : "false";
        eventd_emit_kv(ev, EVENTD_INFO, "bench", "order taken", 3, keys, values);
    }
    double kv_fmt = (now() - t0) / (double)n, kv_fmt_cpu = (cpu() - c0) / (double)n;

    /* The caller's formatting alone; the asm statement keeps the compiler
     * from dropping text nobody reads. */
    t0 = now();
    c0 = cpu();
    for (long i = 0; i < n; i++) {
        snprintf(order, sizeof order, "%ld", i);
        snprintf(amount, sizeof amount, "%.2f", (double)i * 0.5);
        __asm__ volatile("" : : "r"(order), "r"(amount) : "memory");
    }
    double fmt = (now() - t0) / (double)n, fmt_cpu = (cpu() - c0) / (double)n;

    /* Values the program holds as text already: TABLE distinct events,
     * made before the clock starts, emitted in turn. */
    enum { TABLE = 1024 };
    static char orders[TABLE][24], amounts[TABLE][32];
    for (long i = 0; i < TABLE; i++) {
        snprintf(orders[i], sizeof orders[i], "%ld", i);
        snprintf(amounts[i], sizeof amounts[i], "%.2f", (double)i * 0.5);
    }
    t0 = now();
    c0 = cpu();
    for (long i = 0; i < n; i++) {
        const char *held[3] = {orders[i % TABLE], amounts[i % TABLE], i % 2 ? "true" : "false"};
        eventd_emit_kv(ev, EVENTD_INFO, "bench", "order taken", 3, keys, held);
    }
    double kv = (now() - t0) / (double)n, kv_cpu = (cpu() - c0) / (double)n;

    t0 = now();
    c0 = cpu();
    for (long i = 0; i < n; i++) {
        typed[0].value.i64 = i;
        typed[1].value.f64 = (double)i * 0.5;
        typed[2].value.boolean = (int)(i % 2);
        eventd_emit_fields(ev, EVENTD_INFO, "bench", "order taken", typed, 3);
    }
    double fields_ns = (now() - t0) / (double)n, fields_cpu = (cpu() - c0) / (double)n;
    unsigned long long dropped = (unsigned long long)eventd_dropped(ev);
    eventd_close(ev);

    int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    strncpy(addr.sun_path, argv[2], sizeof addr.sun_path - 1);
    if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof addr) != 0) {
        perror("connect");
        return 1;
    }
    pid_t pid = getpid();
    t0 = now();
    c0 = cpu();
    for (long i = 0; i < n; i++) {
        char stamp[32];
        struct tm tm;
        time_t t = time(NULL);
        localtime_r(&t, &tm);
        strftime(stamp, sizeof stamp, "%h %e %T", &tm);
        int len = snprintf(message, sizeof message,
                           "<14>%s c-bench[%d]: order taken order=%ld amount=%.2f paid=%s", stamp,
                           (int)pid, i, (double)i * 0.5, i % 2 ? "true" : "false");
        if (send(fd, message, (size_t)len, MSG_NOSIGNAL) < 0) {
            perror("send");
            return 1;
        }
    }
    double sock = (now() - t0) / (double)n, sock_cpu = (cpu() - c0) / (double)n;
    close(fd);
    printf("eventd_emit %.1f %.1f\neventd_emit_kv %.1f %.1f\neventd_emit_kv_snprintf %.1f %.1f\n"
           "snprintf %.1f %.1f\neventd_emit_fields %.1f %.1f\nsyslog %.1f %.1f\ndropped %llu\n",
           ring, ring_cpu, kv, kv_cpu, kv_fmt, kv_fmt_cpu, fmt, fmt_cpu, fields_ns, fields_cpu, sock,
           sock_cpu, dropped);
    return 0;
}
