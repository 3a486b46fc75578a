//! `eventd.emit` as CPython calls it, without pyo3's argument handling:
//! pyo3 would copy the keyword arguments into a new dict (and, under the
//! stable ABI before 3.10, encode each keyword's name to compare it) for
//! every call; here the keywords are read where CPython put them. On 3.10
//! and later (where the vectorcall convention is in the stable ABI) they
//! arrive as an array with a tuple of names, and no dict is made at all;
//! on 3.8 and 3.9 CPython makes one dict, read as it is.
//!
//! The signature is what a Python `def emit(message, level=6, **fields)`
//! would have, with the same errors for wrong calls (TypeError); an
//! event that cannot be stored still only returns False.

use crate::fields::{field_of_ptr, text_of};
use eventd_producer::rings::Encoder;
use pyo3::exceptions::PyTypeError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyBool, PyInt, PyString};
use std::ffi::c_int;

/// How CPython passes `emit` its arguments.
#[derive(Clone, Copy, PartialEq, Eq)]
pub(crate) enum Convention {
    /// Vectorcall where the running CPython has it, else tuple and dict.
    Best,
    /// Always a tuple and a dict.
    TupleDict,
}

/// CPython's flag for the vectorcall convention (`METH_FASTCALL`), in
/// every CPython since 3.7 and in the stable ABI since 3.10 (pyo3 hides
/// it under abi3 before that, so it is named here).
const METH_FASTCALL: c_int = 0x0080;

/// The arguments of one call: positional ones, then keywords.
struct Call<'a> {
    positional: &'a [*mut ffi::PyObject],
    keywords: Keywords<'a>,
}

enum Keywords<'a> {
    None,
    /// Vectorcall: the names, and the values in the same order.
    Fast {
        names: *mut ffi::PyObject,
        values: &'a [*mut ffi::PyObject],
    },
    /// A dict of them (3.8 and 3.9).
    Dict(*mut ffi::PyObject),
}

impl Keywords<'_> {
    /// Calls `f` with each keyword's name and value (borrowed: the caller's
    /// frame or dict holds them for the call).
    ///
    /// # Safety
    /// The GIL is held; the names tuple or dict is live.
    unsafe fn for_each(&self, mut f: impl FnMut(*mut ffi::PyObject, *mut ffi::PyObject)) {
        match *self {
            Keywords::None => {}
            Keywords::Fast { names, values } => {
                for (i, &value) in values.iter().enumerate() {
                    // SAFETY: `names` is the call's tuple of as many names
                    // as there are keyword values (CPython's contract).
                    let name = unsafe { ffi::PyTuple_GetItem(names, i as ffi::Py_ssize_t) };
                    if !name.is_null() {
                        f(name, value);
                    }
                }
            }
            Keywords::Dict(dict) => {
                let mut pos: ffi::Py_ssize_t = 0;
                let (mut name, mut value) = (std::ptr::null_mut(), std::ptr::null_mut());
                // SAFETY: `dict` is the call's own dict of keywords, live
                // for the call; PyDict_Next checks `pos` against its size.
                while unsafe { ffi::PyDict_Next(dict, &mut pos, &mut name, &mut value) } != 0 {
                    f(name, value);
                }
            }
        }
    }
}

/// The text of a keyword's name (always a str in a call).
fn name_is(py: Python<'_>, name: *mut ffi::PyObject, want: &str) -> bool {
    // SAFETY: a live object the call holds; the GIL is held.
    let name = unsafe { Bound::from_borrowed_ptr(py, name) };
    name.downcast::<PyString>()
        .is_ok_and(|s| crate::fields::utf8(s) == Some(want))
}

/// Parses `emit(message, level=6, **fields)` and emits; Ok(written).
fn emit_call(py: Python<'_>, call: &Call<'_>) -> PyResult<bool> {
    if call.positional.len() > 2 {
        return Err(PyTypeError::new_err(format!(
            "emit() takes at most 2 positional arguments ({} given)",
            call.positional.len()
        )));
    }
    let mut message = call.positional.first().copied();
    let mut level = call.positional.get(1).copied();
    let mut fields = 0usize;
    let mut twice = None;
    // SAFETY: the GIL is held and the call's keywords are live.
    unsafe {
        call.keywords.for_each(|name, value| {
            if name_is(py, name, "message") {
                twice = twice.or(message.replace(value).map(|_| "message"));
            } else if name_is(py, name, "level") {
                twice = twice.or(level.replace(value).map(|_| "level"));
            } else {
                fields += 1;
            }
        });
    }
    if let Some(arg) = twice {
        return Err(PyTypeError::new_err(format!(
            "emit() got multiple values for argument '{arg}'"
        )));
    }
    let Some(message) = message else {
        return Err(PyTypeError::new_err(
            "emit() missing 1 required positional argument: 'message'",
        ));
    };
    // SAFETY: the call holds its arguments alive; the GIL is held.
    let message = unsafe { Bound::from_borrowed_ptr(py, message) };
    let message = message.downcast::<PyString>().map_err(|_| {
        PyTypeError::new_err(format!(
            "emit() argument 'message' must be str, not {}",
            type_name(&message)
        ))
    })?;
    let level = match level {
        None => 6,
        // SAFETY: as for `message`.
        Some(l) => level_of(&unsafe { Bound::from_borrowed_ptr(py, l) })?,
    };
    let write = |out: &mut Encoder| {
        if fields == 0 {
            return;
        }
        // SAFETY: the GIL is held and the call's keywords are live; a
        // field's __str__ may run Python code, which cannot reach the
        // call's own arguments.
        unsafe {
            call.keywords.for_each(|name, value| {
                if name_is(py, name, "message") || name_is(py, name, "level") {
                    return;
                }
                // SAFETY: as above.
                let name = Bound::from_borrowed_ptr(py, name);
                match name.downcast::<PyString>() {
                    Ok(k) => field_of_ptr(py, out, &text_of(k), value),
                    Err(_) => field_of_ptr(py, out, &name.to_string(), value),
                }
            });
        }
    };
    Ok(crate::emit_default(py, level, &text_of(message), write))
}

/// `level` as an int; past 64 bits, the nearest end (emerg or crit).
fn level_of(level: &Bound<'_, PyAny>) -> PyResult<i64> {
    let n = level.downcast::<PyInt>().map_err(|_| {
        PyTypeError::new_err(format!(
            "emit() argument 'level' must be int, not {}",
            type_name(level)
        ))
    })?;
    Ok(n.extract::<i64>().unwrap_or_else(|_| {
        if n.lt(0).unwrap_or(false) {
            i64::MIN
        } else {
            i64::MAX
        }
    }))
}

fn type_name(o: &Bound<'_, PyAny>) -> String {
    o.get_type()
        .name()
        .map_or_else(|_| "?".to_owned(), |n| n.to_string())
}

/// The result as CPython wants it: a new reference to True or False, or
/// NULL with the error set.
fn finish(py: Python<'_>, result: std::thread::Result<PyResult<bool>>) -> *mut ffi::PyObject {
    match result {
        Ok(Ok(written)) => PyBool::new(py, written).to_owned().into_ptr(),
        Ok(Err(e)) => {
            e.restore(py);
            std::ptr::null_mut()
        }
        // A panic is a bug of ours: the event is not written, and the
        // caller is not disturbed.
        Err(_) => PyBool::new(py, false).to_owned().into_ptr(),
    }
}

/// `emit` under the vectorcall convention (CPython 3.10 and later).
unsafe extern "C" fn emit_fast(
    _module: *mut ffi::PyObject,
    args: *const *mut ffi::PyObject,
    nargs: ffi::Py_ssize_t,
    names: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    // SAFETY: CPython calls this with the GIL held.
    let py = unsafe { Python::assume_gil_acquired() };
    let positional = usize::try_from(nargs).unwrap_or(0);
    let keywords = if names.is_null() {
        0
    } else {
        // SAFETY: `names` is the call's tuple of keyword names.
        usize::try_from(unsafe { ffi::PyTuple_Size(names) }).unwrap_or(0)
    };
    let all: &[*mut ffi::PyObject] = if args.is_null() {
        &[]
    } else {
        // SAFETY: CPython passes `nargs` positional values followed by one
        // value per keyword name, all live for the call.
        unsafe { std::slice::from_raw_parts(args, positional + keywords) }
    };
    let (positional, values) = all.split_at(positional.min(all.len()));
    let call = Call {
        positional,
        keywords: if keywords == 0 {
            Keywords::None
        } else {
            Keywords::Fast { names, values }
        },
    };
    finish(
        py,
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| emit_call(py, &call))),
    )
}

/// `emit` with a tuple and a dict (CPython 3.8 and 3.9).
unsafe extern "C" fn emit_dict(
    _module: *mut ffi::PyObject,
    args: *mut ffi::PyObject,
    kwargs: *mut ffi::PyObject,
) -> *mut ffi::PyObject {
    // SAFETY: CPython calls this with the GIL held.
    let py = unsafe { Python::assume_gil_acquired() };
    // SAFETY: `args` is the call's tuple (CPython passes one, maybe
    // empty); its items live as long as it does, past this call.
    let positional: Vec<*mut ffi::PyObject> = unsafe {
        (0..ffi::PyTuple_Size(args))
            .map(|i| ffi::PyTuple_GetItem(args, i))
            .collect()
    };
    let call = Call {
        positional: &positional,
        keywords: if kwargs.is_null() {
            Keywords::None
        } else {
            Keywords::Dict(kwargs)
        },
    };
    finish(
        py,
        std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| emit_call(py, &call))),
    )
}

const EMIT_DOC: &std::ffi::CStr =
    c"emit(message, level=6, **fields) -> bool: one event through the \
process's producer; True if it was written into a ring.";

/// The `emit` function object for module `m`: vectorcall where the
/// running CPython has it in its stable ABI (3.10+) and `convention` does
/// not ask for tuple and dict (the module's `_emit_tuple_dict`, which
/// lets the tests run the 3.8/3.9 path on any CPython).
pub(crate) fn emit_function<'py>(
    m: &Bound<'py, PyModule>,
    convention: Convention,
) -> PyResult<Bound<'py, PyAny>> {
    let py = m.py();
    let fast = convention == Convention::Best && py.version_info() >= (3, 10);
    let (meth, flags) = if fast {
        type Fast = unsafe extern "C" fn(
            *mut ffi::PyObject,
            *const *mut ffi::PyObject,
            ffi::Py_ssize_t,
            *mut ffi::PyObject,
        ) -> *mut ffi::PyObject;
        let f: Fast = emit_fast;
        // SAFETY: CPython calls the function with the signature its
        // flags name (METH_FASTCALL | METH_KEYWORDS: this one); the
        // union field only carries the pointer.
        let f: ffi::PyCFunctionWithKeywords = unsafe { std::mem::transmute(f) };
        (f, METH_FASTCALL | ffi::METH_KEYWORDS)
    } else {
        (
            emit_dict as ffi::PyCFunctionWithKeywords,
            ffi::METH_VARARGS | ffi::METH_KEYWORDS,
        )
    };
    // CPython keeps a pointer to the definition for as long as the
    // function lives: one per module made, for the life of the process.
    let def: &'static mut ffi::PyMethodDef = Box::leak(Box::new(ffi::PyMethodDef {
        ml_name: c"emit".as_ptr(),
        ml_meth: ffi::PyMethodDefPointer {
            PyCFunctionWithKeywords: meth,
        },
        ml_flags: flags,
        ml_doc: EMIT_DOC.as_ptr(),
    }));
    let name = m.name()?;
    // SAFETY: `def` lives for ever; the module's name is a live str; a
    // NULL result (with the error set) becomes an Err.
    unsafe {
        Bound::from_owned_ptr_or_err(py, ffi::PyCFunction_NewEx(def, m.as_ptr(), name.as_ptr()))
    }
}
