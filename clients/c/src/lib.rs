//! libeventd: eventd's producer for C and C++ (`include/eventd.h`).
//!
//! ABI rules (also in the header): the handle is opaque and only ever
//! behind a pointer; every argument and result is a C type (pointers to
//! NUL-terminated UTF-8, `int`, `size_t`, `uint64_t`); no Rust panic
//! crosses the boundary (each entry point catches it and returns
//! `EVENTD_E_INTERNAL`); nothing is allocated for the caller to free
//! except the handle, which `eventd_close` frees. Every function may be
//! called from any thread at once, except `eventd_close`, which must be the
//! last call on its handle.

mod text;

use eventd_core::rings::client::{Dropped, Producer};
use eventd_core::rings::{typed, Field, Level, Value};
use std::ffi::{c_char, c_int, CStr};
use std::mem::MaybeUninit;
use std::panic::{catch_unwind, AssertUnwindSafe};
use text::text;

pub const EVENTD_OK: c_int = 0;
pub const EVENTD_E_INVALID: c_int = -1;
pub const EVENTD_E_NO_RINGS: c_int = -2;
pub const EVENTD_E_PERMISSION: c_int = -3;
pub const EVENTD_E_TOO_LARGE: c_int = -4;
pub const EVENTD_E_BUSY: c_int = -5;
pub const EVENTD_E_FAILED: c_int = -6;
pub const EVENTD_E_INTERNAL: c_int = -7;
pub const EVENTD_E_LIMITED: c_int = -8;

/// The opaque handle (`eventd_t` in C).
pub struct Handle {
    producer: Producer,
}

fn code(d: Dropped) -> c_int {
    match d {
        Dropped::NoRings => EVENTD_E_NO_RINGS,
        Dropped::Permission => EVENTD_E_PERMISSION,
        Dropped::TooLarge => EVENTD_E_TOO_LARGE,
        Dropped::Busy => EVENTD_E_BUSY,
        Dropped::Failed => EVENTD_E_FAILED,
        Dropped::Limited => EVENTD_E_LIMITED,
    }
}

/// Runs `f`, turning a panic into `EVENTD_E_INTERNAL`.
fn guarded(f: impl FnOnce() -> c_int) -> c_int {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or(EVENTD_E_INTERNAL)
}

/// Opens a producer. `kmes_dir` NULL: `$EVENTD_KMES_DIR`, else
/// `$EVENTD_DATA_DIR/kmes`, else `./eventd-data/kmes`; `provider` NULL: the
/// program's name. Succeeds whether or not the rings exist yet.
///
/// # Safety
/// `kmes_dir` and `provider` are NULL or NUL-terminated strings; `out`
/// points to writable storage for one pointer.
#[no_mangle]
pub unsafe extern "C" fn eventd_open(
    kmes_dir: *const c_char,
    provider: *const c_char,
    out: *mut *mut Handle,
) -> c_int {
    guarded(|| {
        if out.is_null() {
            return EVENTD_E_INVALID;
        }
        // SAFETY: the caller's promise on both strings.
        let (dir, provider) = match unsafe { (text(kmes_dir), text(provider)) } {
            (Ok(d), Ok(p)) => (d, p),
            _ => return EVENTD_E_INVALID,
        };
        let dir = dir.map_or_else(Producer::default_dir, Into::into);
        let provider = provider.map_or_else(Producer::program_name, str::to_string);
        let handle = Box::new(Handle {
            producer: Producer::new(dir, &provider),
        });
        // SAFETY: `out` is non-null and writable by the caller's promise.
        unsafe { *out = Box::into_raw(handle) };
        EVENTD_OK
    })
}

/// Emits one event; `fields_json` is NULL, "" or a JSON object's text.
///
/// # Safety
/// `handle` comes from `eventd_open` and is not closed; the strings are
/// NULL (name, fields_json) or NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn eventd_emit(
    handle: *const Handle,
    level: c_int,
    name: *const c_char,
    message: *const c_char,
    fields_json: *const c_char,
) -> c_int {
    guarded(|| {
        // SAFETY: NULL or NUL-terminated by the caller's promise.
        match unsafe { text(fields_json) } {
            // SAFETY: the caller's promise on handle, name and message.
            Ok(fields) => unsafe { emit_str(handle, level, name, message, fields.unwrap_or("")) },
            Err(code) => code,
        }
    })
}

/// Kinds of an `eventd_field_t`'s value (`EVENTD_KIND_*`), the kind tags
/// of the ring's typed entries.
pub const EVENTD_KIND_I64: c_int = typed::KIND_I64 as c_int;
pub const EVENTD_KIND_U64: c_int = typed::KIND_U64 as c_int;
pub const EVENTD_KIND_F64: c_int = typed::KIND_F64 as c_int;
pub const EVENTD_KIND_BOOL: c_int = typed::KIND_BOOL as c_int;
pub const EVENTD_KIND_STR: c_int = typed::KIND_STR as c_int;

/// `eventd_field_t`: a key and a typed value.
#[repr(C)]
pub struct CField {
    pub key: *const c_char,
    pub kind: c_int,
    pub value: CValue,
}

/// The value of an `eventd_field_t`, read as its `kind` says.
#[repr(C)]
#[derive(Clone, Copy)]
pub union CValue {
    pub i64: i64,
    pub u64: u64,
    pub f64: f64,
    pub boolean: c_int,
    pub str: *const c_char,
}

/// Fields an emit converts on the stack; more take one allocation.
const STACK_FIELDS: usize = 32;

/// Calls `emit` with the `n` fields `field(i)` makes, converted into a
/// buffer on the stack (on the heap past [`STACK_FIELDS`]); the first
/// error `field` returns is returned instead.
fn with_fields<'a>(
    n: usize,
    field: impl Fn(usize) -> Result<Field<'a>, c_int>,
    emit: impl FnOnce(&[Field<'a>]) -> c_int,
) -> c_int {
    if n > STACK_FIELDS {
        return match (0..n).map(field).collect::<Result<Vec<_>, _>>() {
            Ok(all) => emit(&all),
            Err(code) => code,
        };
    }
    let mut stack = [MaybeUninit::<Field<'a>>::uninit(); STACK_FIELDS];
    for (i, slot) in stack.iter_mut().enumerate().take(n) {
        match field(i) {
            Ok(f) => {
                slot.write(f);
            }
            Err(code) => return code,
        }
    }
    // SAFETY: the loop wrote each of the first `n` slots (n <= STACK_FIELDS)
    // or returned; Field is Copy, so nothing needs dropping.
    let fields = unsafe { std::slice::from_raw_parts(stack.as_ptr().cast::<Field<'a>>(), n) };
    emit(fields)
}

/// One field of a C array as a typed field.
///
/// # Safety
/// `f.key` is NULL or NUL-terminated, and `f.value.str` too when `f.kind`
/// is `EVENTD_KIND_STR`, valid for `'a`.
#[inline(always)]
unsafe fn field<'a>(f: &CField) -> Result<Field<'a>, c_int> {
    // SAFETY: the caller's promise on the key.
    let key = unsafe { text(f.key) }?.ok_or(EVENTD_E_INVALID)?;
    // SAFETY: every member of the union is plain data of the union's
    // size or less, read as the kind the caller set says; a string is
    // read only under the caller's promise for EVENTD_KIND_STR.
    let value = unsafe {
        match f.kind {
            EVENTD_KIND_I64 => Value::I64(f.value.i64),
            EVENTD_KIND_U64 => Value::U64(f.value.u64),
            EVENTD_KIND_F64 => Value::F64(f.value.f64),
            EVENTD_KIND_BOOL => Value::Bool(f.value.boolean != 0),
            EVENTD_KIND_STR => Value::Str(text(f.value.str)?.ok_or(EVENTD_E_INVALID)?),
            _ => return Err(EVENTD_E_INVALID),
        }
    };
    Ok(Field::new(key, value))
}

/// Emits one event with `n` typed fields: numbers and booleans stay JSON
/// numbers and booleans in the stored `fields`, written without
/// formatting.
///
/// # Safety
/// As `eventd_emit`; `fields` points to `n` fields (it may be NULL when `n`
/// is 0) whose keys, and whose values of kind `EVENTD_KIND_STR`, are
/// NUL-terminated.
#[no_mangle]
pub unsafe extern "C" fn eventd_emit_fields(
    handle: *const Handle,
    level: c_int,
    name: *const c_char,
    message: *const c_char,
    fields: *const CField,
    n: usize,
) -> c_int {
    guarded(|| {
        if n > 0 && fields.is_null() {
            return EVENTD_E_INVALID;
        }
        with_fields(
            n,
            // SAFETY: i < n and the array holds n fields; their strings
            // are NUL-terminated by the caller's promise.
            |i| unsafe { field(&*fields.add(i)) },
            // SAFETY: the caller's promise on handle, name and message.
            |fields| unsafe { emit_typed(handle, level, name, message, fields) },
        )
    })
}

/// Emits one event with `n` string fields `keys[i]` = `values[i]`.
///
/// # Safety
/// As `eventd_emit`; `keys` and `values` point to `n` NUL-terminated
/// strings each (they may be NULL when `n` is 0).
#[no_mangle]
pub unsafe extern "C" fn eventd_emit_kv(
    handle: *const Handle,
    level: c_int,
    name: *const c_char,
    message: *const c_char,
    n: usize,
    keys: *const *const c_char,
    values: *const *const c_char,
) -> c_int {
    guarded(|| {
        if n > 0 && (keys.is_null() || values.is_null()) {
            return EVENTD_E_INVALID;
        }
        let pair = |i: usize| -> Result<Field<'_>, c_int> {
            // SAFETY: i < n, and both arrays hold n pointers.
            let (k, v) = unsafe { (*keys.add(i), *values.add(i)) };
            // SAFETY: each is NUL-terminated by the caller's promise.
            match unsafe { (text(k)?, text(v)?) } {
                (Some(k), Some(v)) => Ok(Field::new(k, Value::Str(v))),
                _ => Err(EVENTD_E_INVALID),
            }
        };
        with_fields(
            n,
            pair,
            // SAFETY: the caller's promise on handle, name and message.
            |fields| unsafe { emit_typed(handle, level, name, message, fields) },
        )
    })
}

/// The handle, level, name and message of an emit, checked.
///
/// # Safety
/// As `eventd_emit` for `handle`, `name` and `message`.
unsafe fn event_args<'a>(
    handle: *const Handle,
    level: c_int,
    name: *const c_char,
    message: *const c_char,
) -> Result<(&'a Handle, Level, &'a str, &'a str), c_int> {
    // SAFETY: a live handle by the caller's promise.
    let handle = unsafe { handle.as_ref() }.ok_or(EVENTD_E_INVALID)?;
    // SAFETY: the caller's promise on the strings.
    let (name, message) = match unsafe { (text(name), text(message)) } {
        (Ok(n), Ok(Some(m))) => (n.unwrap_or(""), m),
        _ => return Err(EVENTD_E_INVALID),
    };
    let level = u8::try_from(level)
        .ok()
        .and_then(Level::from_u8)
        .ok_or(EVENTD_E_INVALID)?;
    Ok((handle, level, name, message))
}

/// An emit with typed fields.
///
/// # Safety
/// As `eventd_emit` for `handle`, `name` and `message`.
unsafe fn emit_typed(
    handle: *const Handle,
    level: c_int,
    name: *const c_char,
    message: *const c_char,
    fields: &[Field<'_>],
) -> c_int {
    // SAFETY: the caller's promise.
    match unsafe { event_args(handle, level, name, message) } {
        Ok((h, level, name, message)) => {
            match h.producer.emit_items(level, name, message, fields) {
                Ok(()) => EVENTD_OK,
                Err(d) => code(d),
            }
        }
        Err(code) => code,
    }
}

/// `eventd_emit` with the fields as a Rust string.
///
/// # Safety
/// As `eventd_emit` for `handle`, `name` and `message`.
unsafe fn emit_str(
    handle: *const Handle,
    level: c_int,
    name: *const c_char,
    message: *const c_char,
    fields: &str,
) -> c_int {
    // SAFETY: the caller's promise.
    match unsafe { event_args(handle, level, name, message) } {
        Ok((h, level, name, message)) => match h.producer.emit(level, name, message, fields) {
            Ok(()) => EVENTD_OK,
            Err(d) => code(d),
        },
        Err(code) => code,
    }
}

/// Events written into a ring through `handle`.
///
/// # Safety
/// `handle` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn eventd_emitted(handle: *const Handle) -> u64 {
    // SAFETY: NULL or live by the caller's promise.
    unsafe { handle.as_ref() }.map_or(0, |h| h.producer.emitted())
}

/// Events dropped through `handle` (any error code other than
/// `EVENTD_E_INVALID`).
///
/// # Safety
/// `handle` is NULL or live.
#[no_mangle]
pub unsafe extern "C" fn eventd_dropped(handle: *const Handle) -> u64 {
    // SAFETY: NULL or live by the caller's promise.
    unsafe { handle.as_ref() }.map_or(0, |h| h.producer.dropped())
}

/// Frees `handle` (NULL is ignored). No other call may use it after, nor
/// run on it at the same time.
///
/// # Safety
/// `handle` is NULL or from `eventd_open` and not closed yet.
#[no_mangle]
pub unsafe extern "C" fn eventd_close(handle: *mut Handle) {
    if handle.is_null() {
        return;
    }
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: made by Box::into_raw in eventd_open and not freed yet.
        drop(unsafe { Box::from_raw(handle) });
    }));
}

/// A static, NUL-terminated description of an error code.
#[no_mangle]
pub extern "C" fn eventd_strerror(code: c_int) -> *const c_char {
    let s: &'static CStr = match code {
        EVENTD_OK => c"success",
        EVENTD_E_INVALID => c"invalid argument (NULL, not UTF-8, or a level outside 0..7)",
        EVENTD_E_NO_RINGS => {
            c"eventd's ring directory or this CPU's ring does not exist; event dropped"
        }
        EVENTD_E_PERMISSION => {
            c"this user may not open eventd's rings (ProducerGroup); event dropped"
        }
        EVENTD_E_TOO_LARGE => c"the event is larger than a ring record holds; event dropped",
        EVENTD_E_BUSY => c"the ring was contended or replaced under the event; event dropped",
        EVENTD_E_FAILED => c"the ring could not be written; event dropped",
        EVENTD_E_INTERNAL => c"internal error in libeventd; event dropped",
        EVENTD_E_LIMITED => {
            c"past this provider's rate limit in this process (EVENTD_RATE_LIMIT); event dropped and counted"
        }
        _ => c"unknown eventd error code",
    };
    s.as_ptr()
}

/// The library's version, a static NUL-terminated string ("0.1.0").
#[no_mangle]
pub extern "C" fn eventd_version() -> *const c_char {
    const VERSION: &str = concat!(env!("CARGO_PKG_VERSION"), "\0");
    VERSION.as_ptr().cast()
}

#[cfg(test)]
mod abi;
