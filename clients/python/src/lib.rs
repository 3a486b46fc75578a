//! `eventd._native`: eventd's producer for Python, one native call per
//! event. `emit(message, level=6, **fields)` writes through the process's
//! producer (made at the first emit, or by `configure`); `Producer` is one
//! handle with its own provider and counts (what `eventd.Handler` uses).
//! Field values keep their type: bool, int and float stay JSON booleans
//! and numbers (written typed, not formatted: the record holds their
//! bytes), everything else becomes its `str()` (an int past 64 bits too). Nothing here raises
//! for an event that cannot be stored: it is counted as dropped.

use eventd_producer::rings::client::Producer as RingProducer;
use eventd_producer::rings::{Encoder, Level};
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyDict, PyFloat, PyInt, PyString};
use std::cell::RefCell;
use std::sync::{Arc, RwLock};

/// The process's producer for `emit`.
static DEFAULT: RwLock<Option<Arc<RingProducer>>> = RwLock::new(None);

thread_local! {
    /// The typed fields, reused by every emit on this thread.
    static FIELDS: RefCell<Encoder> = RefCell::new(Encoder::default());
}

/// A syslog severity from `level`: 0..=7 as it is, larger numbers as
/// `logging`'s levels (CRITICAL 50 → crit, ERROR 40 → err, WARNING 30 →
/// warning, INFO 20 → info, lower → debug), negative ones as emerg.
fn severity(level: i64) -> Level {
    let syslog = match level {
        i64::MIN..=-1 => 0,
        0..=7 => level,
        50.. => 2,
        40..=49 => 3,
        30..=39 => 4,
        20..=29 => 6,
        _ => 7,
    };
    // The match above gives 0..=7 only, every one a Level.
    Level::from_u8(syslog as u8).unwrap_or(Level::Debug)
}

/// Writes one Python value as the field `key`, typed: bool, int (that
/// fits 64 bits) and float keep their type, everything else (an int past
/// 64 bits too) is its `str()`.
fn field(out: &mut Encoder, key: &str, value: &Bound<'_, PyAny>) {
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

/// `str(value)`, or its repr-free stand-in if even that fails.
fn text_field(out: &mut Encoder, key: &str, value: &Bound<'_, PyAny>) {
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
        unicode: *mut pyo3::ffi::PyObject,
        size: *mut pyo3::ffi::Py_ssize_t,
    ) -> *const std::ffi::c_char;
}

/// The text of `s` without a copy (abi3 before 3.10 would make a bytes
/// object of it for each call); `None` for a str that has no UTF-8 form
/// (lone surrogates), with the error cleared.
fn utf8<'a>(s: &'a Bound<'_, PyString>) -> Option<&'a str> {
    let mut size: pyo3::ffi::Py_ssize_t = 0;
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

/// A str argument as text: no copy when it has a UTF-8 form, else with
/// the unencodable characters replaced.
fn text_of<'a>(s: &'a Bound<'_, PyString>) -> std::borrow::Cow<'a, str> {
    match utf8(s) {
        Some(t) => t.into(),
        None => s.to_string_lossy(),
    }
}

/// Emits through `producer`; returns whether the event was written.
fn emit_with(
    producer: &RingProducer,
    level: i64,
    name: &str,
    message: &str,
    fields: Option<&Bound<'_, PyDict>>,
) -> bool {
    FIELDS.with(|cell| {
        let Ok(mut out) = cell.try_borrow_mut() else {
            // Re-entered from a field's __str__: that event goes without
            // its fields rather than not at all.
            return producer.emit(severity(level), name, message, "").is_ok();
        };
        out.clear();
        for (key, value) in fields.into_iter().flat_map(|d| d.iter()) {
            match key.downcast::<PyString>() {
                Ok(k) => field(&mut out, &text_of(k), &value),
                Err(_) => text_field(&mut out, &key.to_string(), &value),
            }
        }
        producer
            .emit_typed(severity(level), name, message, &out.encoded())
            .is_ok()
    })
}

fn default_producer(py: Python<'_>) -> Arc<RingProducer> {
    if let Some(p) = DEFAULT.read().ok().and_then(|d| d.clone()) {
        return p;
    }
    let provider = program(py);
    let mut slot = DEFAULT.write().unwrap_or_else(|e| e.into_inner());
    slot.get_or_insert_with(|| Arc::new(RingProducer::new(RingProducer::default_dir(), &provider)))
        .clone()
}

/// The script's name (`sys.argv[0]`'s file name), else "python".
fn program(py: Python<'_>) -> String {
    py.import("sys")
        .and_then(|sys| sys.getattr("argv"))
        .and_then(|argv| argv.get_item(0))
        .and_then(|a| a.extract::<String>())
        .ok()
        .and_then(|a| a.rsplit('/').next().map(str::to_owned))
        .filter(|a| !a.is_empty())
        .unwrap_or_else(|| "python".to_owned())
}

/// emit(message, level=6, **fields) -> bool: one event through the
/// process's producer; True if it was written into a ring.
#[pyfunction]
#[pyo3(signature = (message, level = 6, **fields))]
fn emit(
    py: Python<'_>,
    message: &Bound<'_, PyString>,
    level: i64,
    fields: Option<&Bound<'_, PyDict>>,
) -> bool {
    emit_with(&default_producer(py), level, "", &text_of(message), fields)
}

/// configure(provider=None, kmes_dir=None): the process's producer from now
/// on (defaults: the script's name; $EVENTD_KMES_DIR, else
/// $EVENTD_DATA_DIR/kmes, else ./eventd-data/kmes).
#[pyfunction]
#[pyo3(signature = (provider = None, kmes_dir = None))]
fn configure(py: Python<'_>, provider: Option<String>, kmes_dir: Option<String>) {
    let provider = provider.unwrap_or_else(|| program(py));
    let dir = kmes_dir.map_or_else(RingProducer::default_dir, Into::into);
    let mut slot = DEFAULT.write().unwrap_or_else(|e| e.into_inner());
    *slot = Some(Arc::new(RingProducer::new(dir, &provider)));
}

/// (emitted, dropped) of the process's producer.
#[pyfunction]
fn counts(py: Python<'_>) -> (u64, u64) {
    let p = default_producer(py);
    (p.emitted(), p.dropped())
}

/// One producer with its own provider, ring directory and counts.
#[pyclass(frozen)]
struct Producer(RingProducer);

#[pymethods]
impl Producer {
    #[new]
    #[pyo3(signature = (provider = None, kmes_dir = None))]
    fn new(py: Python<'_>, provider: Option<String>, kmes_dir: Option<String>) -> Producer {
        let provider = provider.unwrap_or_else(|| program(py));
        let dir = kmes_dir.map_or_else(RingProducer::default_dir, Into::into);
        Producer(RingProducer::new(dir, &provider))
    }

    /// emit(level, name, message, fields=None) -> bool
    #[pyo3(signature = (level, name, message, fields = None))]
    fn emit(
        &self,
        level: i64,
        name: &Bound<'_, PyString>,
        message: &Bound<'_, PyString>,
        fields: Option<&Bound<'_, PyDict>>,
    ) -> bool {
        emit_with(&self.0, level, &text_of(name), &text_of(message), fields)
    }

    #[getter]
    fn emitted(&self) -> u64 {
        self.0.emitted()
    }

    #[getter]
    fn dropped(&self) -> u64 {
        self.0.dropped()
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_function(wrap_pyfunction!(emit, m)?)?;
    m.add_function(wrap_pyfunction!(configure, m)?)?;
    m.add_function(wrap_pyfunction!(counts, m)?)?;
    m.add_class::<Producer>()?;
    Ok(())
}
