//! `eventd._native`: eventd's producer for Python, one native call per
//! event. `emit(message, level=6, **fields)` writes through the process's
//! producer (made at the first emit, or by `configure`); `Producer` is one
//! handle with its own provider and counts (what `eventd.Handler` uses).
//! Field values keep their type (see [`fields`]). Nothing here raises for
//! an event that cannot be stored: it is counted as dropped.

mod call;
mod fields;

use eventd_producer::rings::client::Producer as RingProducer;
use eventd_producer::rings::Encoder;
use fields::{field_of_ptr, logging_severity, severity, text_of};
use pyo3::ffi;
use pyo3::intern;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyString};
use std::cell::RefCell;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

/// The process's producer for `emit`.
static DEFAULT: RwLock<Option<Arc<RingProducer>>> = RwLock::new(None);
/// Bumped by `configure` once it has replaced [`DEFAULT`]: a thread's
/// copy of an older generation is taken again.
static GENERATION: AtomicU64 = AtomicU64::new(1);

/// What a thread keeps between emits.
#[derive(Default)]
struct Local {
    /// The typed fields, reused by every emit on this thread.
    fields: Encoder,
    /// The default producer as of a generation: an emit takes it with no
    /// lock and no reference count while the generation holds.
    default: Option<(u64, Arc<RingProducer>)>,
}

thread_local! {
    static LOCAL: RefCell<Local> = RefCell::new(Local::default());
}

fn shared_default(py: Python<'_>) -> Arc<RingProducer> {
    if let Some(p) = DEFAULT.read().ok().and_then(|d| d.clone()) {
        return p;
    }
    let provider = program(py);
    let mut slot = DEFAULT.write().unwrap_or_else(|e| e.into_inner());
    slot.get_or_insert_with(|| Arc::new(RingProducer::new(RingProducer::default_dir(), &provider)))
        .clone()
}

/// Emits through the process's producer, with the fields `write` puts
/// into the thread's encoder; returns whether the event was written.
pub(crate) fn emit_default(
    py: Python<'_>,
    level: i64,
    message: &str,
    write: impl FnOnce(&mut Encoder),
) -> bool {
    // Acquire: pairs with `configure`'s Release bump, so a thread that
    // sees the new generation finds the new producer in DEFAULT.
    let generation = GENERATION.load(Ordering::Acquire);
    LOCAL.with(|cell| {
        let Ok(mut local) = cell.try_borrow_mut() else {
            // Re-entered from a field's __str__: that event goes without
            // its fields rather than not at all.
            return shared_default(py)
                .emit(severity(level), "", message, "")
                .is_ok();
        };
        let local = &mut *local;
        if local.default.as_ref().map(|(g, _)| *g) != Some(generation) {
            local.default = Some((generation, shared_default(py)));
        }
        let out = &mut local.fields;
        out.clear();
        write(out);
        match &local.default {
            Some((_, producer)) => producer
                .emit_typed(severity(level), "", message, &out.encoded())
                .is_ok(),
            None => false,
        }
    })
}

/// Writes each item of `dict` as a field.
fn dict_fields(py: Python<'_>, out: &mut Encoder, dict: &Bound<'_, PyDict>) {
    let mut pos: ffi::Py_ssize_t = 0;
    let (mut key, mut value) = (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: `dict` is a live dict and the GIL is held. PyDict_Next
    // checks `pos` against the dict as it is now, so a value's __str__
    // that changes the dict cannot make it read past its entries; key and
    // value are held (new references) while they are used.
    while unsafe { ffi::PyDict_Next(dict.as_ptr(), &mut pos, &mut key, &mut value) } != 0 {
        // SAFETY: as above.
        let (key, value) = unsafe {
            (
                Bound::from_borrowed_ptr(py, key),
                Bound::from_borrowed_ptr(py, value),
            )
        };
        // SAFETY: `value` is held for the call.
        unsafe {
            match key.downcast::<PyString>() {
                Ok(k) => field_of_ptr(py, out, &text_of(k), value.as_ptr()),
                Err(_) => field_of_ptr(py, out, &key.to_string(), value.as_ptr()),
            }
        }
    }
}

/// What `record.getMessage()` gives: `msg` as it is when it is a str and
/// there are no `args` (the common call), else the method's own result.
fn record_message<'py>(
    record: &Bound<'py, PyAny>,
    attrs: &Bound<'py, PyDict>,
) -> PyResult<Bound<'py, PyString>> {
    let py = record.py();
    let msg = attrs.get_item(intern!(py, "msg"))?;
    let args = attrs.get_item(intern!(py, "args"))?;
    if let (Some(msg), Some(args)) = (&msg, &args) {
        if msg.is_exact_instance_of::<PyString>() && !args.is_truthy()? {
            return Ok(msg.downcast::<PyString>()?.clone());
        }
    }
    record.call_method0(intern!(py, "getMessage"))?.str()
}

/// Writes each attribute of a record (`attrs`, its `__dict__`) whose name
/// is not in `standard` as a field, but for one named `skip`.
fn record_fields(
    py: Python<'_>,
    out: &mut Encoder,
    attrs: &Bound<'_, PyDict>,
    standard: &Bound<'_, PyAny>,
    skip: Option<&str>,
) {
    let mut pos: ffi::Py_ssize_t = 0;
    let (mut key, mut value) = (std::ptr::null_mut(), std::ptr::null_mut());
    // SAFETY: as in `dict_fields`.
    while unsafe { ffi::PyDict_Next(attrs.as_ptr(), &mut pos, &mut key, &mut value) } != 0 {
        // SAFETY: `standard` is a live object and `key` one of the dict's
        // keys, held by it; a set's lookup of a str runs no Python code. A
        // lookup that fails (an unhashable key, a `standard` that is no
        // set) counts as "not standard", with the error cleared.
        let found = unsafe { ffi::PySequence_Contains(standard.as_ptr(), key) };
        if found == 1 {
            continue;
        }
        if found < 0 {
            drop(PyErr::take(py));
        }
        // SAFETY: as in `dict_fields`.
        let (key, value) = unsafe {
            (
                Bound::from_borrowed_ptr(py, key),
                Bound::from_borrowed_ptr(py, value),
            )
        };
        let key = match key.downcast::<PyString>() {
            Ok(k) => text_of(k),
            Err(_) => key.to_string().into(),
        };
        if skip == Some(&*key) {
            continue;
        }
        // SAFETY: `value` is held for the call.
        unsafe { field_of_ptr(py, out, &key, value.as_ptr()) }
    }
}

/// Emits through `producer`; returns whether the event was written.
fn emit_with(
    py: Python<'_>,
    producer: &RingProducer,
    level: i64,
    name: &str,
    message: &str,
    fields: Option<&Bound<'_, PyDict>>,
) -> bool {
    LOCAL.with(|cell| {
        let Ok(mut local) = cell.try_borrow_mut() else {
            // As in `emit_default`.
            return producer.emit(severity(level), name, message, "").is_ok();
        };
        let out = &mut local.fields;
        out.clear();
        if let Some(d) = fields {
            dict_fields(py, out, d);
        }
        producer
            .emit_typed(severity(level), name, message, &out.encoded())
            .is_ok()
    })
}

/// The script's name (`sys.argv[0]`'s file name), else "python" (an
/// interactive session, `python -c`, whose argv[0] is "" or "-c").
fn program(py: Python<'_>) -> String {
    py.import("sys")
        .and_then(|sys| sys.getattr("argv"))
        .and_then(|argv| argv.get_item(0))
        .and_then(|a| a.extract::<String>())
        .ok()
        .and_then(|a| a.rsplit('/').next().map(str::to_owned))
        .filter(|a| !a.is_empty() && !a.starts_with('-'))
        .unwrap_or_else(|| "python".to_owned())
}

/// configure(provider=None, kmes_dir=None): the process's producer from now
/// on (defaults: the script's name; $EVENTD_KMES_DIR, else
/// $EVENTD_DATA_DIR/kmes, else ./eventd-data/kmes).
#[pyfunction]
#[pyo3(signature = (provider = None, kmes_dir = None))]
fn configure(py: Python<'_>, provider: Option<String>, kmes_dir: Option<PathBuf>) {
    let provider = provider.unwrap_or_else(|| program(py));
    let dir = kmes_dir.unwrap_or_else(RingProducer::default_dir);
    let mut slot = DEFAULT.write().unwrap_or_else(|e| e.into_inner());
    *slot = Some(Arc::new(RingProducer::new(dir, &provider)));
    // Release: see `emit_default`.
    GENERATION.fetch_add(1, Ordering::Release);
}

/// (emitted, dropped) of the process's producer.
#[pyfunction]
fn counts(py: Python<'_>) -> (u64, u64) {
    let p = shared_default(py);
    (p.emitted(), p.dropped())
}

/// One producer with its own provider, ring directory and counts.
#[pyclass(frozen)]
struct Producer(RingProducer);

#[pymethods]
impl Producer {
    #[new]
    #[pyo3(signature = (provider = None, kmes_dir = None))]
    fn new(py: Python<'_>, provider: Option<String>, kmes_dir: Option<PathBuf>) -> Producer {
        let provider = provider.unwrap_or_else(|| program(py));
        let dir = kmes_dir.unwrap_or_else(RingProducer::default_dir);
        Producer(RingProducer::new(dir, &provider))
    }

    /// emit(level, name, message, fields=None) -> bool
    #[pyo3(signature = (level, name, message, fields = None))]
    fn emit(
        &self,
        py: Python<'_>,
        level: i64,
        name: &Bound<'_, PyString>,
        message: &Bound<'_, PyString>,
        fields: Option<&Bound<'_, PyDict>>,
    ) -> bool {
        emit_with(
            py,
            &self.0,
            level,
            &text_of(name),
            &text_of(message),
            fields,
        )
    }

    /// emit_record(record, standard, exception=None) -> bool: a
    /// `logging.LogRecord`: its level (as `logging`'s, see
    /// [`logging_severity`]), logger name and message, and as fields the
    /// attributes whose names are not in the set `standard` (those `extra=`
    /// gave it), in the order they were set, then `exception` (the
    /// formatted traceback) when given, in place of an attribute of that
    /// name. Raises what the record's getMessage() raises (a message that
    /// does not format).
    #[pyo3(signature = (record, standard, exception = None))]
    fn emit_record(
        &self,
        py: Python<'_>,
        record: &Bound<'_, PyAny>,
        standard: &Bound<'_, PyAny>,
        exception: Option<&Bound<'_, PyString>>,
    ) -> PyResult<bool> {
        let attrs = record.getattr(intern!(py, "__dict__"))?;
        let attrs = attrs.downcast::<PyDict>()?;
        let level = match attrs.get_item(intern!(py, "levelno"))? {
            Some(l) => l.extract::<i64>().unwrap_or(6),
            None => 6,
        };
        let name = match attrs.get_item(intern!(py, "name"))? {
            Some(n) => n.str()?,
            None => PyString::new(py, ""),
        };
        let message = record_message(record, attrs)?;
        Ok(LOCAL.with(|cell| {
            let Ok(mut local) = cell.try_borrow_mut() else {
                // As in `emit_default`.
                return self
                    .0
                    .emit(
                        logging_severity(level),
                        &text_of(&name),
                        &text_of(&message),
                        "",
                    )
                    .is_ok();
            };
            let out = &mut local.fields;
            out.clear();
            let skip = exception.map(|_| "exception");
            record_fields(py, out, attrs, standard, skip);
            if let Some(trace) = exception {
                out.str("exception", &text_of(trace));
            }
            self.0
                .emit_typed(
                    logging_severity(level),
                    &text_of(&name),
                    &text_of(&message),
                    &out.encoded(),
                )
                .is_ok()
        }))
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
    m.add("emit", call::emit_function(m, call::Convention::Best)?)?;
    m.add(
        "_emit_tuple_dict",
        call::emit_function(m, call::Convention::TupleDict)?,
    )?;
    m.add_function(wrap_pyfunction!(configure, m)?)?;
    m.add_function(wrap_pyfunction!(counts, m)?)?;
    m.add_class::<Producer>()?;
    Ok(())
}
