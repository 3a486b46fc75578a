"""Emit structured events into eventd's per-CPU rings.

    import eventd
    eventd.emit("order late", level=eventd.WARNING, order=42, amount=63.0, rush=True)

    import logging
    logging.getLogger().addHandler(eventd.Handler(provider="shop"))

`emit` is one native call: the event goes into the ring of the CPU the
thread runs on, with its fields typed (bool, int and float stay JSON
booleans and numbers; other values become their str()). Nothing raises
for an event that cannot be stored (no rings, too large, not allowed): it
is counted as dropped (`eventd.counts()`).
"""

import logging

from eventd._native import Producer, configure, counts, emit

__all__ = ["emit", "configure", "counts", "Handler", "Producer"]

# Syslog severities, as eventd stores them in `level`.
EMERG, ALERT, CRIT, ERR, WARNING, NOTICE, INFO, DEBUG = range(8)

# The attributes every LogRecord has; the others came with extra=.
_STANDARD = frozenset(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {
    "message",
    "asctime",
}


class Handler(logging.Handler):
    """A logging.Handler writing each record into eventd's rings.

    Fork-safe (the producer finds its process and ring again after a fork),
    never raises into the caller, and keeps its counts after close()."""

    def __init__(self, provider=None, kmes_dir=None, level=logging.NOTSET):
        super().__init__(level)
        self._producer = Producer(provider, kmes_dir)
        self._lost = 0  # records that could not even be formatted
        self._at_close = None  # (emitted, dropped) once closed

    @property
    def emitted(self):
        """Records written into a ring."""
        if self._producer is None:
            return self._at_close[0]
        return self._producer.emitted

    @property
    def dropped(self):
        """Records not written (no rings, too large, closed, unformattable)."""
        if self._producer is None:
            return self._at_close[1] + self._lost
        return self._producer.dropped + self._lost

    def emit(self, record):
        producer = self._producer
        if producer is None:
            self._lost += 1
            return
        try:
            trace = None
            if record.exc_info:
                formatter = self.formatter or logging.Formatter()
                trace = formatter.formatException(record.exc_info)
            # One native call reads the record.
            producer.emit_record(record, _STANDARD, trace)
        except Exception:  # a record that cannot be formatted
            self._lost += 1
            self.handleError(record)

    def close(self):
        try:
            producer = self._producer
            if producer is not None:
                # The counts outlive the producer.
                self._at_close = (producer.emitted, producer.dropped)
                self._producer = None
        finally:
            super().close()
