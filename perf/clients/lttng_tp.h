/* The tracepoint the LTTng-UST peer of `eventd-perf clients` records: the
 * same event as the Rust raw emit (three typed fields and a message). */
#undef LTTNG_UST_TRACEPOINT_PROVIDER
#define LTTNG_UST_TRACEPOINT_PROVIDER eventd_bench

#undef LTTNG_UST_TRACEPOINT_INCLUDE
#define LTTNG_UST_TRACEPOINT_INCLUDE "./lttng_tp.h"

#if !defined(EVENTD_BENCH_LTTNG_TP_H) || defined(LTTNG_UST_TRACEPOINT_HEADER_MULTI_READ)
#define EVENTD_BENCH_LTTNG_TP_H

#include <lttng/tracepoint.h>

LTTNG_UST_TRACEPOINT_EVENT(
    eventd_bench, order,
    LTTNG_UST_TP_ARGS(uint64_t, order, double, amount, int, paid, const char *, message),
    LTTNG_UST_TP_FIELDS(
        lttng_ust_field_integer(uint64_t, order, order)
        lttng_ust_field_float(double, amount, amount)
        lttng_ust_field_integer(int, paid, paid)
        lttng_ust_field_string(message, message)))

#endif

#include <lttng/tracepoint-event.h>
