/* One libeventd call in a loop, untimed, for eventd-perf to count its
 * instructions under callgrind: two runs of different EVENTS, and the
 * difference in instructions over the difference in events is what one
 * event costs, start-up and exit left out.
 *
 *   count KMES_DIR PATH EVENTS
 *
 * PATH is "kv" (eventd_emit_kv, the values text already, as in bench.c's
 * eventd_emit_kv loop) or "fields" (eventd_emit_fields, typed). The same
 * event as bench.c: "order taken" with an order number, an amount and a
 * flag. Exits 0 after EVENTS events, 1 if the rings cannot be opened or
 * an event is refused, 2 on a usage error. */
#include "eventd.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

int main(int argc, char **argv) {
    if (argc != 4 || (strcmp(argv[2], "kv") != 0 && strcmp(argv[2], "fields") != 0)) {
        fprintf(stderr, "usage: %s KMES_DIR kv|fields EVENTS\n", argv[0]);
        return 2;
    }
    int kv = strcmp(argv[2], "kv") == 0;
    long n = atol(argv[3]);
    eventd_t *ev;
    if (eventd_open(argv[1], "c-count", &ev) != EVENTD_OK)
        return 1;
    static const char *const keys[3] = {"order", "amount", "paid"};
    enum { TABLE = 1024 };
    static char orders[TABLE][24], amounts[TABLE][32];
    for (long i = 0; i < TABLE; i++) {
        snprintf(orders[i], sizeof orders[i], "%ld", i);
        snprintf(amounts[i], sizeof amounts[i], "%.2f", (double)i * 0.5);
    }
    eventd_field_t typed[3] = {{"order", EVENTD_KIND_I64, {0}},
                               {"amount", EVENTD_KIND_F64, {0}},
                               {"paid", EVENTD_KIND_BOOL, {0}}};
    int failed = 0;
    for (long i = 0; i < n; i++) {
        int rc;
        if (kv) {
            const char *held[3] = {orders[i % TABLE], amounts[i % TABLE], i % 2 ? "true" : "false"};
            rc = eventd_emit_kv(ev, EVENTD_INFO, "bench", "order taken", 3, keys, held);
        } else {
            typed[0].value.i64 = i;
            typed[1].value.f64 = (double)i * 0.5;
            typed[2].value.boolean = (int)(i % 2);
            rc = eventd_emit_fields(ev, EVENTD_INFO, "bench", "order taken", typed, 3);
        }
        failed |= rc != EVENTD_OK;
    }
    eventd_close(ev);
    return failed;
}
