"""Logs through eventd_logging.EventdHandler and says what it did.

    python3 orders.py KMES_DIR COUNT

COUNT records from logger "shop.orders": every third a warning with an
order number, an amount and a flag as extra= fields, the others info, and
one error with an exception. Prints "emitted N dropped M", closes the
handler, logs one record more (dropped: the handler is closed) and prints
the counts again, read after close: "closed: emitted N dropped M"."""

import logging
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
import eventd_logging  # noqa: E402

kmes, count = sys.argv[1], int(sys.argv[2])
handler = eventd_logging.EventdHandler(provider="py-orders", kmes_dir=kmes)
log = logging.getLogger("shop.orders")
log.addHandler(handler)
log.setLevel(logging.DEBUG)
for i in range(count):
    if i % 3 == 0:
        log.warning("order %d is late", i, extra={"order": i, "amount": i * 1.5, "rush": i % 2 == 0})
    else:
        log.info("order %d taken", i, extra={"order": i, "customer": f"c{i % 7}"})
try:
    1 / 0
except ZeroDivisionError:
    log.exception("ledger failed", extra={"order": -1})
print(f"emitted {handler.emitted} dropped {handler.dropped}")
handler.close()
log.warning("after close", extra={"order": -2})
print(f"closed: emitted {handler.emitted} dropped {handler.dropped}")
