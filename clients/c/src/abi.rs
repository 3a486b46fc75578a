//! The C header and this library agree: every `EVENTD_E_*` code and
//! `EVENTD_KIND_*` kind the header defines has the value of the Rust
//! constant of that name, `eventd_field_t` has the layout of the Rust
//! struct the library reads, and the header
//! compiles on its own (included first, with nothing before it) as C99 and
//! as C++, with every warning an error.

use super::*;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The codes the library returns, by the name the header gives them.
const CODES: [(&str, c_int); 9] = [
    ("EVENTD_OK", EVENTD_OK),
    ("EVENTD_E_INVALID", EVENTD_E_INVALID),
    ("EVENTD_E_NO_RINGS", EVENTD_E_NO_RINGS),
    ("EVENTD_E_PERMISSION", EVENTD_E_PERMISSION),
    ("EVENTD_E_TOO_LARGE", EVENTD_E_TOO_LARGE),
    ("EVENTD_E_BUSY", EVENTD_E_BUSY),
    ("EVENTD_E_FAILED", EVENTD_E_FAILED),
    ("EVENTD_E_INTERNAL", EVENTD_E_INTERNAL),
    ("EVENTD_E_LIMITED", EVENTD_E_LIMITED),
];

/// The kinds of a typed field, by the header's names.
const KINDS: [(&str, c_int); 5] = [
    ("EVENTD_KIND_I64", EVENTD_KIND_I64),
    ("EVENTD_KIND_U64", EVENTD_KIND_U64),
    ("EVENTD_KIND_F64", EVENTD_KIND_F64),
    ("EVENTD_KIND_BOOL", EVENTD_KIND_BOOL),
    ("EVENTD_KIND_STR", EVENTD_KIND_STR),
];

fn include_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("include")
}

/// Compiles `source` (written to `dir/name`) with `compiler` and the
/// header's directory, every warning an error; returns the executable.
fn compile(dir: &Path, compiler: &str, name: &str, source: &str, std: &str) -> PathBuf {
    let src = dir.join(name);
    std::fs::write(&src, source).unwrap();
    let exe = dir.join(format!("{name}.out"));
    let out = Command::new(compiler)
        .arg(format!("-std={std}"))
        .args(["-Wall", "-Wextra", "-Werror", "-pedantic", "-I"])
        .arg(include_dir())
        .arg(&src)
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap_or_else(|e| panic!("{compiler}: {e} (apt-get install -y gcc g++)"));
    assert!(
        out.status.success(),
        "{compiler} {name}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

#[test]
fn header_codes_are_the_library_codes() {
    let dir = tempfile::tempdir().unwrap();
    // eventd.h first: it must bring what it needs itself.
    let mut source = String::from(
        "#include <eventd.h>\n#include <stddef.h>\n#include <stdio.h>\nint main(void) {\n",
    );
    for (name, _) in CODES.iter().chain(&KINDS) {
        source.push_str(&format!("    printf(\"{name} %d\\n\", {name});\n"));
    }
    // The layout of eventd_field_t, as numbers the Rust side has too.
    for (name, expr) in LAYOUT {
        source.push_str(&format!("    printf(\"{name} %d\\n\", (int)({expr}));\n"));
    }
    source.push_str("    return 0;\n}\n");
    let exe = compile(dir.path(), "cc", "codes.c", &source, "c99");
    let out = Command::new(exe).output().unwrap();
    assert!(out.status.success());
    let printed = String::from_utf8(out.stdout).unwrap();
    let header: Vec<(String, c_int)> = printed
        .lines()
        .map(|line| {
            let (name, value) = line.split_once(' ').unwrap();
            (name.to_owned(), value.parse().unwrap())
        })
        .collect();
    let layout = [
        std::mem::size_of::<CField>(),
        std::mem::offset_of!(CField, key),
        std::mem::offset_of!(CField, kind),
        std::mem::offset_of!(CField, value),
        std::mem::size_of::<CValue>(),
    ];
    let library: Vec<(String, c_int)> = CODES
        .iter()
        .chain(&KINDS)
        .map(|&(n, v)| (n.to_owned(), v))
        .chain(
            LAYOUT
                .iter()
                .zip(layout)
                .map(|(&(n, _), v)| (n.to_owned(), v as c_int)),
        )
        .collect();
    assert_eq!(header, library);
}

/// C expressions of `eventd_field_t`'s layout, in the order the test
/// computes them in Rust.
const LAYOUT: [(&str, &str); 5] = [
    ("sizeof_field", "sizeof(eventd_field_t)"),
    ("offsetof_key", "offsetof(eventd_field_t, key)"),
    ("offsetof_kind", "offsetof(eventd_field_t, kind)"),
    ("offsetof_value", "offsetof(eventd_field_t, value)"),
    ("sizeof_value", "sizeof(((eventd_field_t *)0)->value)"),
];

#[test]
fn every_code_has_its_own_description() {
    let mut seen = Vec::new();
    for (name, code) in CODES {
        // SAFETY: eventd_strerror returns a static NUL-terminated string.
        let text = unsafe { CStr::from_ptr(eventd_strerror(code)) }
            .to_str()
            .unwrap();
        assert!(!text.starts_with("unknown"), "{name}: {text}");
        assert!(!seen.contains(&text), "{name} shares {text:?}");
        seen.push(text);
    }
}

#[test]
fn header_stands_alone_in_c_and_cpp() {
    let dir = tempfile::tempdir().unwrap();
    let source = "#include <eventd.h>\n\
                  int main(void) { eventd_t *ev = 0; (void)ev; return EVENTD_OK + EVENTD_DEBUG - 7; }\n";
    compile(dir.path(), "cc", "alone.c", source, "c99");
    compile(dir.path(), "c++", "alone.cpp", source, "c++11");
}

#[test]
fn version_is_the_crate_version() {
    // SAFETY: eventd_version returns a static NUL-terminated string.
    let version = unsafe { CStr::from_ptr(eventd_version()) };
    assert_eq!(version.to_str(), Ok(env!("CARGO_PKG_VERSION")));
}
