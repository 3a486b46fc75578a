//! eventd as a service, with real processes: what `--version` says, where
//! `eventctl` finds the daemon, one log line per configuration error, the
//! query count shrunk to a stock descriptor limit, the sd_notify protocol
//! (READY, STOPPING, a watchdog that stops while a writer is held) and
//! socket activation (LISTEN_FDS, with `systemd-socket-activate` and with a
//! socket held across a restart as systemd holds it).

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The abbreviated commit of this checkout, if git can say.
fn git_commit() -> Option<String> {
    let out = Command::new("git")
        .arg("-C")
        .arg(env!("CARGO_MANIFEST_DIR"))
        .args(["rev-parse", "--short=12", "HEAD"])
        .output()
        .ok()?;
    let text = String::from_utf8(out.stdout).ok()?;
    (out.status.success() && !text.trim().is_empty()).then(|| text.trim().to_string())
}

/// The profile directory these binaries were built in (`debug`,
/// `release`): target/<profile>/deps/service-… is this test.
fn profile_dir_name() -> String {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().and_then(Path::parent).unwrap();
    dir.file_name().unwrap().to_string_lossy().into_owned()
}

#[test]
fn version_names_the_commit_and_the_profile() {
    let commit = match std::env::var("EVENTD_GIT_COMMIT") {
        Ok(c) if !c.trim().is_empty() => c.trim().to_string(),
        _ => git_commit().unwrap_or_else(|| "unknown".to_string()),
    };
    for (exe, name) in [(EVENTD, "eventd"), (EVENTCTL, "eventctl")] {
        let out = Command::new(exe).arg("--version").output().unwrap();
        assert!(out.status.success());
        let text = String::from_utf8(out.stdout).unwrap();
        let expected = format!(
            "{name} {} (commit {commit}, profile {})\n",
            env!("CARGO_PKG_VERSION"),
            profile_dir_name()
        );
        assert_eq!(text, expected);
    }
}

/// `eventctl` run in `cwd` with `env`, no `--data-dir`.
fn eventctl_in(cwd: &Path, env: &[(&str, &Path)], args: &[&str]) -> std::process::Output {
    let mut cmd = Command::new(EVENTCTL);
    cmd.current_dir(cwd).args(args);
    cmd.env_remove("EVENTD_DATA_DIR")
        .env_remove("EVENTD_CONFIG");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

#[test]
fn eventctl_finds_the_data_dir_in_eventd_data_dir() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("somewhere");
    let elsewhere = dir.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let eventd = Eventd::start(&data, None);
    let emitted = eventctl_in(
        &elsewhere,
        &[("EVENTD_DATA_DIR", &data)],
        &["emit", "--provider", "env", "found through EVENTD_DATA_DIR"],
    );
    assert!(
        emitted.status.success(),
        "{}",
        String::from_utf8_lossy(&emitted.stderr)
    );
    wait_for_events(&data, 1);
    let out = eventctl_in(
        &elsewhere,
        &[("EVENTD_DATA_DIR", &data)],
        &["query", "--provider", "env"],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.contains("found through EVENTD_DATA_DIR"),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // --data-dir still wins over the environment.
    let wrong = dir.path().join("not-a-data-dir");
    let out = Command::new(EVENTCTL)
        .current_dir(&elsewhere)
        .env("EVENTD_DATA_DIR", &wrong)
        .arg("--data-dir")
        .arg(&data)
        .args(["query", "--provider", "env"])
        .output()
        .unwrap();
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("found through EVENTD_DATA_DIR"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Without either, the working directory's ./eventd-data is used; here
    // there is none (and no /var/lib/eventd is assumed): the error names it.
    if !Path::new("/var/lib/eventd").exists() {
        let out = eventctl_in(&elsewhere, &[], &["query"]);
        assert!(!out.status.success());
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("eventd-data"), "{err}");
    }
    eventd.stop();
}

/// eventd's stderr when it refuses `config_text` (it must exit 1).
fn refusal(config_text: &str) -> (PathBuf, String) {
    let dir = tempfile::tempdir().unwrap();
    let config = config(dir.path(), config_text);
    let (cmd, log) = command(&dir.path().join("data"), Some(&config), &[]);
    let (status, text) = exit_at_start(cmd, &log);
    assert_eq!(status.code(), Some(1), "{text}");
    // The directory goes with `dir`; the path is only compared as text.
    (config, text)
}

#[test]
fn a_configuration_error_is_one_log_line() {
    for (text, must_name) in [
        // A TOML syntax error: toml's own text spans several lines.
        ("StorageShards = 2\nMaxBatchSize = \n", "MaxBatchSize"),
        // A value of the wrong type: the key is only in the quoted line.
        ("MaxBatchSize = \"lots\"\n", "MaxBatchSize"),
        ("StorageShard = 4\n", "StorageShard"),
        ("MaxBatchSize = 0\n", "MaxBatchSize"),
    ] {
        let (config, log) = refusal(text);
        let lines: Vec<&str> = log.lines().filter(|l| !l.trim().is_empty()).collect();
        assert_eq!(lines.len(), 1, "one record for {text:?}, got:\n{log}");
        assert!(lines[0].contains("ERROR"), "{log}");
        assert!(lines[0].contains(must_name), "{log}");
        if !text.contains(" = 0") {
            // Parse errors say where: the file, its line and column.
            assert!(
                lines[0].contains(&config.display().to_string()) && lines[0].contains("line "),
                "{log}"
            );
        }
    }
}

/// eventd started by `sh` after `ulimit -n 1024`, as from a stock shell
/// (soft and hard limit 1024), logging JSON.
fn under_ulimit_1024(data: &Path, config: Option<&Path>) -> (Command, PathBuf) {
    let (plain, log) = command(data, config, &["--log-format", "json"]);
    let mut cmd = Command::new("sh");
    cmd.arg("-c")
        .arg("ulimit -n 1024 && exec \"$0\" \"$@\"")
        .arg(plain.get_program())
        .args(plain.get_args());
    cmd.stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    (cmd, log)
}

/// The JSON log records of `text` whose message contains `what`.
fn records<'a>(text: &'a str, what: &'a str) -> impl Iterator<Item = serde_json::Value> + 'a {
    text.lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter(move |r| {
            r["fields"]["message"]
                .as_str()
                .is_some_and(|m| m.contains(what))
        })
}

#[test]
fn under_ulimit_1024_the_default_query_count_shrinks_to_fit() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let (cmd, log) = under_ulimit_1024(&data, None);
    let eventd = Eventd::spawn(cmd, log.clone(), &data);
    let text = read(&log);
    let plan = records(&text, "shards planned")
        .next()
        .unwrap_or_else(|| panic!("no plan line:\n{text}"));
    let (e, c) = (
        plan["fields"]["databases"].as_u64().unwrap(),
        plan["fields"]["rings"].as_u64().unwrap()
            + u64::from(plan["fields"]["syslog_ring"].as_bool().unwrap()),
    );
    assert_eq!(plan["fields"]["descriptor_soft_limit"], 1024, "{text}");
    // One line says what was lowered, to what, and why.
    let lowered: Vec<_> = records(&text, "MaxConcurrentQueries").collect();
    assert_eq!(lowered.len(), 1, "{text}");
    let q = lowered[0]["fields"]["max_concurrent_queries"]
        .as_u64()
        .unwrap();
    assert_eq!(lowered[0]["level"], "WARN", "{text}");
    // The most queries that fit: q does, q + 1 would not, and the
    // default (128) would not either.
    use eventd::routing::descriptor_allowance;
    assert!(q >= 1 && q < 128, "{q}");
    assert!(descriptor_allowance(q, e, c) <= 1024, "{q} {e} {c}");
    assert!(descriptor_allowance(q + 1, e, c) > 1024, "{q} {e} {c}");
    assert_eq!(
        plan["fields"]["descriptor_allowance"],
        descriptor_allowance(q, e, c)
    );
    // The daemon serves with that count, and says so.
    let stats = eventctl_json(&data, "stats");
    assert_eq!(stats["stats"]["max_concurrent_queries"], q, "{stats}");
    emit_one(&data, "served under ulimit -n 1024");
    wait_for_events(&data, 1);
    let out = eventctl_text(&data, &["query", "--provider", "single"]);
    assert!(out.contains("served under ulimit -n 1024"), "{out}");
    eventd.stop();
}

#[test]
fn under_ulimit_1024_an_explicit_query_count_that_does_not_fit_still_refuses() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let config = config(dir.path(), "MaxConcurrentQueries = 128\n");
    let (cmd, log) = under_ulimit_1024(&data, Some(&config));
    let (status, text) = exit_at_start(cmd, &log);
    assert_eq!(status.code(), Some(1), "{text}");
    assert!(
        text.contains("1024") && text.contains("LimitNOFILE") && text.contains("128 concurrent"),
        "{text}"
    );
}
