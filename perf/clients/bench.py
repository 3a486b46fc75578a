"""Nanoseconds per record through each Python path into eventd, beside
logging.handlers.SysLogHandler to eventd's own socket, the same record (a
message with three fields: an int, a float and a bool) every time.

    python3 bench.py KMES_DIR SYSLOG_SOCKET RECORDS [BUSY_MS]

Prints one "NAME WALL CPU" line per path (nanoseconds per record over
RECORDS records, after RECORDS // 4 untimed ones through the same path;
CPU is this thread's own; first the program spins on the clock for BUSY_MS
milliseconds, 0 if not given, as bench.c does):

- ctypes_handler: logging + eventd_logging.EventdHandler (ctypes over
  libeventd, $EVENTD_LIB), the three fields as extra=
- syslog: logging + SysLogHandler, the fields formatted into the text
- floor: logging + a handler that does nothing (what logging alone costs)
- ctypes_call: one bare ctypes call into libeventd (eventd_version)
- emit, native_handler: eventd.emit(...) and logging + eventd.Handler, the
  native package; only when `import eventd` works in this interpreter
  (otherwise a "native unavailable: WHY" line)."""

import ctypes
import logging
import logging.handlers
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "../../clients/python"))
import eventd_logging  # noqa: E402

kmes, sock, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
busy_until = time.monotonic() + (int(sys.argv[4]) if len(sys.argv) > 4 else 0) / 1000
while time.monotonic() < busy_until:
    pass


def clock():
    return time.perf_counter_ns(), time.thread_time_ns()


def per_record(start):
    wall, cpu = clock()
    return (wall - start[0]) / n, (cpu - start[1]) / n


def run(handler, name):
    log = logging.getLogger(name)
    log.propagate = False
    log.setLevel(logging.INFO)
    log.addHandler(handler)
    for i in range(n // 4):
        log.info("order taken", extra={"order": i, "amount": i * 0.5, "paid": i % 2 == 1})
    start = clock()
    for i in range(n):
        log.info("order taken", extra={"order": i, "amount": i * 0.5, "paid": i % 2 == 1})
    took = per_record(start)
    log.removeHandler(handler)
    handler.close()
    return took


class Nothing(logging.Handler):
    def emit(self, record):
        pass


results = {}
results["ctypes_handler"] = run(eventd_logging.EventdHandler(provider="py-bench", kmes_dir=kmes), "bench.ctypes")
syslog = logging.handlers.SysLogHandler(address=sock)
syslog.setFormatter(logging.Formatter("py-bench: %(message)s order=%(order)s amount=%(amount)s paid=%(paid)s"))
results["syslog"] = run(syslog, "bench.syslog")
results["floor"] = run(Nothing(), "bench.floor")

version = ctypes.CDLL(os.environ["EVENTD_LIB"]).eventd_version
version.restype = ctypes.c_char_p
start = clock()
for _ in range(n):
    version()
results["ctypes_call"] = per_record(start)

try:
    import eventd
except ImportError as e:
    print(f"native unavailable: {e}")
else:
    eventd.configure(provider="py-bench", kmes_dir=kmes)
    emit, info = eventd.emit, eventd.INFO
    for i in range(n // 4):
        emit("order taken", level=info, order=i, amount=i * 0.5, paid=i % 2 == 1)
    start = clock()
    for i in range(n):
        emit("order taken", level=info, order=i, amount=i * 0.5, paid=i % 2 == 1)
    results["emit"] = per_record(start)
    results["native_handler"] = run(eventd.Handler(provider="py-bench", kmes_dir=kmes), "bench.native")

for name, (wall, cpu) in results.items():
    print(f"{name} {wall:.1f} {cpu:.1f}")
