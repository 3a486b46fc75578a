"""Microseconds per record: eventd_logging.EventdHandler against
logging.handlers.SysLogHandler to eventd's own socket, the same records
(a logger.info with three extra= fields) either way.

    python3 bench.py KMES_DIR SYSLOG_SOCKET RECORDS

Prints "handler WALL CPU" and "syslog WALL CPU" (nanoseconds per record;
CPU is this thread's own)."""

import logging
import logging.handlers
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../clients/python"))
import eventd_logging  # noqa: E402

kmes, sock, n = sys.argv[1], sys.argv[2], int(sys.argv[3])


def run(handler, name):
    log = logging.getLogger(name)
    log.propagate = False
    log.setLevel(logging.INFO)
    log.addHandler(handler)
    start, cpu = time.perf_counter_ns(), time.thread_time_ns()
    for i in range(n):
        log.info("order taken", extra={"order": i, "amount": i * 0.5, "paid": i % 2 == 1})
    took = ((time.perf_counter_ns() - start) / n, (time.thread_time_ns() - cpu) / n)
    log.removeHandler(handler)
    handler.close()
    return took


ring = run(eventd_logging.EventdHandler(provider="py-bench", kmes_dir=kmes), "bench.eventd")
syslog = logging.handlers.SysLogHandler(address=sock)
syslog.setFormatter(logging.Formatter("py-bench: %(message)s order=%(order)s amount=%(amount)s paid=%(paid)s"))
socket_ns = run(syslog, "bench.syslog")
print(f"handler {ring[0]:.1f} {ring[1]:.1f}\nsyslog {socket_ns[0]:.1f} {socket_ns[1]:.1f}")
