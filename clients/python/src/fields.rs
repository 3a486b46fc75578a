//! Python values as typed fields: bool, int (that fits 64 bits) and float
//! keep their type, a str its text, everything else (an int past 64 bits
//! too) its `str()`. Exact built-in types are read straight from the
//! object (no Python code runs); subclasses and other objects go through
//! their own methods.

use eventd_producer::rings::{Encoder, Level};
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyFloat, PyInt, PyString};

/// A syslog severity from `level`, as `eventd.emit` takes it: 0..=7 as it
/// is (eventd.EMERG .. eventd.DEBUG), larger numbers as `logging`'s levels
/// ([`logging_severity`]), negative ones as emerg.
pub(crate) fn severity(level: i64) -> Level {
    match level {
        i64::MIN..=-1 => Level::Emerg,
        // 0..=7 is every Level.
        0..=7 => Level::from_u8(level as u8).unwrap_or(Level::Debug),
        _ => logging_severity(level),
    }
}

/// A syslog severity from a `logging` level (a record's `levelno`):
/// CRITICAL (50) and above → crit, ERROR (40) → err, WARNING (30) →
/// warning, INFO (20) → info, anything lower (DEBUG, a custom TRACE of 5,
/// NOTSET) → debug. A record's level is never read as a syslog number.
pub(crate) fn logging_severity(levelno: i64) -> Level {
    match levelno {
        50.. => Level::Crit,
        40..=49 => Level::Err,
        30..=39 => Level::Warning,
        20..=29 => Level::Info,
        _ => Level::Debug,
    }
}

/// Writes the object `value` as the field `key`.
///
/// # Safety
/// The GIL is held and `value` is a live object for the whole call.
pub(crate) unsafe fn field_of_ptr(
    py: Python<'_>,
    out: &mut Encoder,
    key: &str,
    value: *mut ffi::PyObject,
) {
    // SAFETY: the caller holds the GIL and keeps `value` alive; the type
    // objects are CPython's own statics, only their addresses are taken;
    // for an exact int or float the readers cannot fail (but for
    // overflow, which is asked for and answered).
    unsafe {
        let kind = ffi::Py_TYPE(value);
        if kind == &raw mut ffi::PyBool_Type {
            out.bool(key, value == ffi::Py_True());
            return;
        }
        if kind == &raw mut ffi::PyFloat_Type {
            out.f64(key, ffi::PyFloat_AsDouble(value));
            return;
        }
        if kind == &raw mut ffi::PyLong_Type {
            let mut overflow = 0;
            let n = ffi::PyLong_AsLongLongAndOverflow(value, &mut overflow);
            if overflow == 0 {
                out.i64(key, n);
                return;
            }
        }
        if kind == &raw mut ffi::PyUnicode_Type {
            let s = Bound::from_borrowed_ptr(py, value);
            if let Ok(s) = s.downcast::<PyString>() {
                out.str(key, &text_of(s));
                return;
            }
        }
        field(out, key, &Bound::from_borrowed_ptr(py, value));
    }
}

/// [`field_of_ptr`] for any object, through its own methods (a subclass
/// of bool, int or float keeps its type too).
pub(crate) fn field(out: &mut Encoder, key: &str, value: &Bound<'_, PyAny>) {
    if value.is_instance_of::<PyBool>() {
        out.bool(key, value.is_truthy().unwrap_or(false));
    } else if value.is_instance_of::<PyInt>() {
        match value.extract::<i64>() {
            Ok(n) => out.i64(key, n),
            Err(_) => match value.extract::<u64>() {
                Ok(n) => out.u64(key, n),
                Err(_) => text_field(out, key, value),
            },
        }
    } else if value.is_instance_of::<PyFloat>() {
        out.f64(key, value.extract::<f64>().unwrap_or(f64::NAN));
    } else if let Ok(s) = value.downcast::<PyString>() {
        out.str(key, &text_of(s));
    } else {
        text_field(out, key, value);
    }
}

/// `str(value)`, or a stand-in if even that fails.
pub(crate) fn text_field(out: &mut Encoder, key: &str, value: &Bound<'_, PyAny>) {
    match value.str() {
        Ok(s) => out.str(key, &s.to_string_lossy()),
        Err(_) => out.str(key, "<unprintable>"),
    }
}

extern "C" {
    /// CPython's UTF-8 view of a str: the text the str keeps (for an ASCII
    /// str, its own bytes), without a copy. In the stable ABI from 3.10 on,
    /// and exported with this signature by every CPython this package
    /// supports (3.3 and later); pyo3 declares it only for 3.10+ under
    /// abi3, so it is declared here.
    fn PyUnicode_AsUTF8AndSize(
        unicode: *mut ffi::PyObject,
        size: *mut ffi::Py_ssize_t,
    ) -> *const std::ffi::c_char;
}

/// The text of `s` without a copy (abi3 before 3.10 would make a bytes
/// object of it for each call); `None` for a str that has no UTF-8 form
/// (lone surrogates), with the error cleared.
pub(crate) fn utf8<'a>(s: &'a Bound<'_, PyString>) -> Option<&'a str> {
    let mut size: ffi::Py_ssize_t = 0;
    // SAFETY: `s` is a live str object (held by the borrow); `size` is a
    // valid place to write the length.
    let p = unsafe { PyUnicode_AsUTF8AndSize(s.as_ptr(), &mut size) };
    if p.is_null() {
        drop(PyErr::take(s.py()));
        return None;
    }
    let len = usize::try_from(size).ok()?;
    // SAFETY: CPython keeps this UTF-8 buffer with the str object until it
    // is freed, and `s` keeps the object alive for 'a; the buffer holds
    // `len` bytes of valid UTF-8 (CPython's own encoding of the str).
    Some(unsafe { std::str::from_utf8_unchecked(std::slice::from_raw_parts(p.cast(), len)) })
}

/// A str as text: no copy when it has a UTF-8 form, else with the
/// unencodable characters replaced.
pub(crate) fn text_of<'a>(s: &'a Bound<'_, PyString>) -> std::borrow::Cow<'a, str> {
    match utf8(s) {
        Some(t) => t.into(),
        None => s.to_string_lossy(),
    }
}
