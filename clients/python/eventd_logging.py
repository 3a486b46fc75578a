"""Log from Python into eventd's per-CPU rings.

    import logging, eventd_logging
    logging.getLogger().addHandler(eventd_logging.EventdHandler(provider="billing"))
    logging.getLogger("billing.orders").warning("order %s late", 42,
                                                extra={"order": 42, "late_s": 3.5})

Each record becomes one event through libeventd (ctypes; nothing to
build but libeventd itself, which `cargo build --release -p libeventd`
makes): level from the record's level, `name` the logger's name,
`message` the formatted message, `fields` the record's `extra` keys as a
JSON object (numbers stay numbers; anything JSON cannot hold becomes its
`str()`), plus `exception` when the record has one. Where the library or
the rings are missing, records are dropped and counted (`handler.dropped`)
and the first time is said on stderr; logging never raises or blocks.
The counts stay readable after close(); records logged to a closed
handler are dropped and counted.

The library is looked for in $EVENTD_LIB, next to this file, then by
ctypes.util.find_library("eventd") and in /usr/local/lib and /usr/lib.
"""

import ctypes
import ctypes.util
import json
import logging
import os
import sys

__all__ = ["EventdHandler", "load_library", "LEVELS"]

# Python's levels to syslog severities (eventd's `level` column).
LEVELS = (
    (logging.CRITICAL, 2),  # crit
    (logging.ERROR, 3),  # err
    (logging.WARNING, 4),  # warning
    (logging.INFO, 6),  # info
)
DEBUG = 7

# What every LogRecord has; anything else in its __dict__ came from extra=.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {
    "message",
    "asctime",
    "taskName",
}

_library = None


def _candidates():
    env = os.environ.get("EVENTD_LIB")
    if env:
        yield env
    here = os.path.dirname(os.path.abspath(__file__))
    yield os.path.join(here, "libeventd.so")
    found = ctypes.util.find_library("eventd")
    if found:
        yield found
    for d in ("/usr/local/lib", "/usr/lib", "/usr/lib/x86_64-linux-gnu"):
        yield os.path.join(d, "libeventd.so")


def load_library():
    """libeventd as a ctypes CDLL with its prototypes, or raises OSError."""
    global _library
    if _library is not None:
        return _library
    errors = []
    for path in _candidates():
        try:
            lib = ctypes.CDLL(path)
        except OSError as e:
            errors.append(f"{path}: {e}")
            continue
        lib.eventd_open.argtypes = [
            ctypes.c_char_p,
            ctypes.c_char_p,
            ctypes.POINTER(ctypes.c_void_p),
        ]
        lib.eventd_open.restype = ctypes.c_int
        lib.eventd_emit.argtypes = [
            ctypes.c_void_p,
            ctypes.c_int,
            ctypes.c_char_p,
            ctypes.c_char_p,
            ctypes.c_char_p,
        ]
        lib.eventd_emit.restype = ctypes.c_int
        lib.eventd_emitted.argtypes = [ctypes.c_void_p]
        lib.eventd_emitted.restype = ctypes.c_uint64
        lib.eventd_dropped.argtypes = [ctypes.c_void_p]
        lib.eventd_dropped.restype = ctypes.c_uint64
        lib.eventd_close.argtypes = [ctypes.c_void_p]
        lib.eventd_close.restype = None
        lib.eventd_strerror.argtypes = [ctypes.c_int]
        lib.eventd_strerror.restype = ctypes.c_char_p
        _library = lib
        return lib
    raise OSError("libeventd not found: " + "; ".join(errors))


def _encode(text):
    # NUL would end the C string early; eventd keeps the rest of the text.
    if "\0" in text:
        text = text.replace("\0", "\\0")
    return text.encode("utf-8", "replace")


class EventdHandler(logging.Handler):
    """A logging.Handler writing each record into eventd's rings."""

    def __init__(self, provider=None, kmes_dir=None, level=logging.NOTSET):
        super().__init__(level)
        self._lib = None
        self._handle = ctypes.c_void_p()
        self._lost = 0  # dropped here, without the library
        # (emitted, dropped) as they were at close(). Not `_closed`:
        # logging.Handler owns that name and close() sets it to True.
        self._at_close = (0, 0)
        self._levels = {}  # levelno -> severity
        self._names = {}  # logger name -> its bytes
        self._said = False
        try:
            self._lib = load_library()
        except OSError as e:
            self._say(str(e))
            return
        if provider is None:
            provider = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
        rc = self._lib.eventd_open(
            _encode(kmes_dir) if kmes_dir is not None else None,
            _encode(provider),
            ctypes.byref(self._handle),
        )
        if rc != 0:
            self._say(self._lib.eventd_strerror(rc).decode())
            self._lib = None

    def _say(self, why):
        if not self._said:
            self._said = True
            sys.stderr.write(f"eventd_logging: {why}; records are dropped and counted\n")

    @property
    def emitted(self):
        """Records written into a ring."""
        if self._lib is None:
            return self._at_close[0]
        return self._lib.eventd_emitted(self._handle)

    @property
    def dropped(self):
        """Records not written (no library, no rings, too large, ...)."""
        if self._lib is None:
            return self._at_close[1] + self._lost
        return self._lost + self._lib.eventd_dropped(self._handle)

    @staticmethod
    def severity(levelno):
        for floor, severity in LEVELS:
            if levelno >= floor:
                return severity
        return DEBUG

    def fields(self, record):
        """The record's extra= keys (and its exception) as JSON text, or None."""
        d = record.__dict__
        keys = d.keys() - _STANDARD
        if not keys and not record.exc_info:
            return None
        extra = {k: d[k] for k in keys}
        if record.exc_info:
            formatter = self.formatter or logging.Formatter()
            extra["exception"] = formatter.formatException(record.exc_info)
        try:
            return json.dumps(extra, default=str, ensure_ascii=False, allow_nan=False)
        except ValueError:  # NaN or an infinity somewhere
            return json.dumps(_finite(extra), default=str, ensure_ascii=False)

    def emit(self, record):
        if self._lib is None:
            self._lost += 1
            return
        try:
            level = self._levels.get(record.levelno)
            if level is None:
                level = self._levels[record.levelno] = self.severity(record.levelno)
            name = self._names.get(record.name)
            if name is None:
                name = self._names[record.name] = _encode(record.name)
            fields = self.fields(record)
            self._lib.eventd_emit(
                self._handle,
                level,
                name,
                _encode(record.getMessage()),
                _encode(fields) if fields is not None else None,
            )
        except Exception:  # a record that cannot be formatted
            self._lost += 1
            self.handleError(record)

    def close(self):
        try:
            if self._lib is not None and self._handle:
                # The counts outlive the handle.
                self._at_close = (self.emitted, self._lib.eventd_dropped(self._handle))
                self._lib.eventd_close(self._handle)
                self._lib = None
        finally:
            super().close()


def _finite(value):
    """value with NaN and the infinities, which JSON has no number for, as
    the strings "NaN", "inf" and "-inf" (as eventd's other clients write)."""
    if isinstance(value, float) and value != value:
        return "NaN"
    if isinstance(value, float) and value in (float("inf"), float("-inf")):
        return "inf" if value > 0 else "-inf"
    if isinstance(value, dict):
        return {k: _finite(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_finite(v) for v in value]
    return value
