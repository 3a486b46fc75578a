//! The client crates build without the daemon: `cargo tree` of the
//! producer crate, `eventd-tracing`, libeventd and the Python package's
//! extension (normal dependencies, as an application that uses them would
//! build them) holds the producer and none of the daemon crate, SQLite,
//! io-uring, an HTTP client or clap.

use std::process::Command;

/// The package names (without versions) in `cargo tree -p package`.
fn tree(package: &str) -> Vec<String> {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let out = Command::new(cargo)
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .args([
            "tree",
            "--locked",
            "--offline",
            "-e",
            "normal",
            "--prefix",
            "none",
        ])
        .args(["-p", package])
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "cargo tree -p {package}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .expect("cargo tree prints UTF-8")
        .lines()
        .filter_map(|line| line.split_whitespace().next().map(str::to_owned))
        .collect()
}

/// Crates of the daemon that no program that only emits should build.
const DAEMON_ONLY: [&str; 7] = [
    "eventd",
    "rusqlite",
    "libsqlite3-sys",
    "io-uring",
    "clap",
    "ureq",
    "rustls",
];

fn assert_light(package: &str) {
    let crates = tree(package);
    assert!(
        crates.iter().any(|c| c == "eventd-producer"),
        "{package} does not build on eventd-producer: {crates:?}"
    );
    let heavy: Vec<&String> = crates
        .iter()
        .filter(|c| DAEMON_ONLY.contains(&c.as_str()))
        .collect();
    assert!(
        heavy.is_empty(),
        "{package} pulls in the daemon's {heavy:?}"
    );
}

#[test]
fn producer_crate_has_nothing_of_the_daemon() {
    assert_light("eventd-producer");
}

#[test]
fn tracing_client_builds_without_the_daemon() {
    assert_light("eventd-tracing");
}

#[test]
fn c_library_builds_without_the_daemon() {
    assert_light("libeventd");
}

#[test]
fn python_extension_builds_without_the_daemon() {
    assert_light("eventd-python");
}
