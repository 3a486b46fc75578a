//! Export to one ClickHouse server as most people run it: no ZooKeeper,
//! no cluster, no macros (cluster/src/lib.rs `start_single`, Debian's
//! `clickhouse-server` 18.16), plain HTTP and HTTPS with certificates this
//! test makes with `openssl`.
//!
//! Skipped (with the `apt-get install` line) where ClickHouse is missing,
//! unless `EVENTD_REQUIRE_CLICKHOUSE=1` (scripts/test-all sets it).

use eventd_cluster as cluster;
mod common;
#[path = "common/export.rs"]
mod export_common;

use cluster::{wait_until as wait_for, Cluster, Https, Options};
use common::EVENTCTL;
use export_common::*;
use rand::Rng;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Mutex;
use std::time::Duration;

/// One server at a time: two cores hold one well beside eventd.
static SERIAL: Mutex<()> = Mutex::new(());

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// `eventctl [--config CFG] export init ARGS...`.
fn init(cfg: Option<&Path>, args: &[&str]) -> Output {
    let mut cmd = Command::new(EVENTCTL);
    if let Some(cfg) = cfg {
        cmd.arg("--config").arg(cfg);
    }
    cmd.args(["export", "init"]).args(args).output().unwrap()
}

/// The single-server schema is what `export init` picks on a server
/// without eventd's cluster, and says so.
fn init_single(c: &Cluster, db: &str) {
    let out = init(None, &["--url", &c.url(1, 1), "--database", db]);
    assert!(out.status.success(), "{}", text(&out));
    let said = text(&out);
    assert!(said.starts_with("schema: single server"), "{said}");
    let engine = c.query(
        &c.url(1, 1),
        &format!("SELECT engine FROM system.tables WHERE database = '{db}' AND name = 'events'"),
    );
    assert_eq!(engine.trim(), "MergeTree");
}

/// Exactly once on one server without ZooKeeper, through kill -9 of eventd
/// (twelve times, while it exports batches of 37 rows) and of the server
/// (twice, while eventd keeps sending), with no deduplication on the
/// server's side (18.16's MergeTree has none): only the settle check.
#[test]
fn single_server_exactly_once_through_kill9_of_eventd_and_of_the_server() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let Some(mut c) = single(Options::default()) else {
        return;
    };
    let db = "single";
    init_single(&c, db);
    let dir = tempfile::tempdir().unwrap();
    let mut host = Host::new(dir.path(), "single-0", &c.url(1, 1), db, 37);
    host.start();
    let mut rng = rand::rng();
    for k in 0..12 {
        let data = host.data.clone();
        let emitter = std::thread::spawn(move || emit(&data, k % 2, &format!("k{k}"), 2500));
        std::thread::sleep(Duration::from_millis(rng.random_range(100..1500)));
        host.kill9();
        emitter.join().unwrap();
        host.start();
    }
    for k in 0..2 {
        let data = host.data.clone();
        let emitter = std::thread::spawn(move || emit(&data, k % 2, &format!("s{k}"), 2500));
        std::thread::sleep(Duration::from_millis(rng.random_range(300..1200)));
        c.kill(1, 1);
        emitter.join().unwrap();
        std::thread::sleep(Duration::from_secs(3));
        c.restart(1, 1);
    }
    let status = wait_exported(&host, Duration::from_secs(180));
    assert_eq!(status["cluster"]["layout"], "single", "{status}");
    let (events, _) = assert_exactly_once(&c, db, &host);
    let (landed, resent) = (
        host.logged("is in the cluster: not resent"),
        host.logged("resending the rows the cluster does not hold"),
    );
    eprintln!("{events} events; {landed} batches found landed and {resent} sent again");
    assert!(events > 0, "{events} events");
    assert!(landed + resent > 0, "no kill interrupted a batch");

    // The counters count from the files' first export: a restart keeps them.
    let counters = |s: &serde_json::Value| {
        [
            "batches_sent",
            "rows_sent",
            "batches_deduplicated",
            "batches_resent",
        ]
        .map(|f| sum_status(s, f))
    };
    let before = counters(&status);
    assert!(before[0] > 0 && before[1] > 0, "{before:?}");
    host.stop();
    host.start();
    let mut after = [0; 4];
    assert!(
        wait_for(Duration::from_secs(60), || {
            after = host.status().map_or([0; 4], |s| counters(&s));
            after == before
        }),
        "before the restart {before:?}, after {after:?}"
    );
    host.stop();
}

/// A CA, a server certificate for `localhost` only (no IP address in it),
/// a client certificate, and a second CA that signed none of them.
struct Pki {
    ca: PathBuf,
    server: (PathBuf, PathBuf),
    client: (PathBuf, PathBuf),
    other_ca: PathBuf,
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("openssl (apt-get install openssl)");
    assert!(out.status.success(), "openssl {args:?}: {}", text(&out));
}

fn make_pki(dir: &Path) -> Pki {
    let days = ["-days", "2"];
    for ca in ["ca", "other-ca"] {
        let subject = format!("/CN=eventd test {ca}");
        let (key, pem) = (format!("{ca}.key"), format!("{ca}.pem"));
        openssl(
            dir,
            &[
                &[
                    "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", &key,
                ],
                &["-out", &pem, "-subj", &subject][..],
                &days[..],
            ]
            .concat(),
        );
    }
    std::fs::write(dir.join("server.ext"), "subjectAltName=DNS:localhost\n").unwrap();
    std::fs::write(dir.join("client.ext"), "extendedKeyUsage=clientAuth\n").unwrap();
    for (name, cn) in [("server", "localhost"), ("client", "eventd-client")] {
        let (key, csr, pem) = (
            format!("{name}.key"),
            format!("{name}.csr"),
            format!("{name}.pem"),
        );
        let subject = format!("/CN={cn}");
        openssl(
            dir,
            &[
                "req", "-newkey", "rsa:2048", "-nodes", "-keyout", &key, "-out", &csr, "-subj",
                &subject,
            ],
        );
        let ext = format!("{name}.ext");
        openssl(
            dir,
            &[
                &[
                    "x509", "-req", "-in", &csr, "-CA", "ca.pem", "-CAkey", "ca.key",
                ],
                &["-CAcreateserial", "-out", &pem, "-extfile", &ext][..],
                &days[..],
            ]
            .concat(),
        );
        let mode = std::fs::Permissions::from_mode(0o600);
        std::fs::set_permissions(dir.join(&key), mode).unwrap();
    }
    Pki {
        ca: dir.join("ca.pem"),
        server: (dir.join("server.pem"), dir.join("server.key")),
        client: (dir.join("client.pem"), dir.join("client.key")),
        other_ca: dir.join("other-ca.pem"),
    }
}

/// Configuration lines naming a CA file and, if given, a client
/// certificate and key.
fn tls_config(ca: &Path, client: Option<&(PathBuf, PathBuf)>) -> String {
    let mut text = format!("ExportCAFile = \"{}\"\n", ca.display());
    if let Some((cert, key)) = client {
        text.push_str(&format!(
            "ExportCertFile = \"{}\"\nExportKeyFile = \"{}\"\n",
            cert.display(),
            key.display()
        ));
    }
    text
}

/// HTTPS against the server's own `<https_port>`, which demands a client
/// certificate signed by the test CA: `eventctl export init` and eventd
/// verify the server by the CA file and present the client certificate,
/// and every row arrives once. A CA that did not sign the server's
/// certificate, a host name the certificate does not carry, and a missing
/// client certificate are each refused, saying why, and the URL is named
/// once.
#[test]
fn https_with_a_test_ca_and_a_client_certificate() {
    let _serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let pki = make_pki(dir.path());
    let opts = Options {
        https: Some(Https {
            cert: pki.server.0.clone(),
            key: pki.server.1.clone(),
            client_ca: Some(pki.ca.clone()),
        }),
        ..Options::default()
    };
    let Some(c) = single(opts) else {
        return;
    };
    let port = c.https_port(1, 1);
    let url = format!("https://localhost:{port}/");
    let db = "tls";
    let cfg = |name: &str, ca: &Path, client: bool| {
        let path = dir.path().join(name);
        let text = format!(
            "ExportUrl = \"{url}\"\n{}",
            tls_config(ca, client.then_some(&pki.client))
        );
        std::fs::write(&path, text).unwrap();
        path
    };

    let good = cfg("good.toml", &pki.ca, true);
    let out = init(Some(&good), &["--database", db]);
    assert!(out.status.success(), "{}", text(&out));
    assert!(text(&out).contains("single server"), "{}", text(&out));

    // Refusals, each saying why and naming the URL once.
    let refused = |out: &Output, url: &str, why: &str| {
        let said = text(out);
        assert!(!out.status.success(), "{said}");
        assert!(said.contains(why), "wanted {why:?} in: {said}");
        assert_eq!(said.matches(url).count(), 1, "{said}");
    };
    let wrong_ca = cfg("wrong-ca.toml", &pki.other_ca, true);
    refused(
        &init(Some(&wrong_ca), &["--database", db]),
        &url,
        "certificate is not signed by a CA eventd trusts",
    );
    // The same through the flag, over the configuration's CA.
    let other_ca = pki.other_ca.to_str().unwrap();
    refused(
        &init(Some(&good), &["--database", db, "--ca-file", other_ca]),
        &url,
        "not signed by",
    );
    let by_ip = format!("https://127.0.0.1:{port}/");
    refused(
        &init(Some(&good), &["--database", db, "--url", &by_ip]),
        &by_ip,
        "certificate does not name the host",
    );
    // Without a client certificate the server ends the connection (with
    // TLS 1.3, after the handshake: the client only sees it go).
    let no_client = cfg("no-client.toml", &pki.ca, false);
    let out = init(Some(&no_client), &["--database", db]);
    assert!(!out.status.success(), "{}", text(&out));
    assert_eq!(text(&out).matches(&url).count(), 1, "{}", text(&out));

    // eventd: with the wrong CA nothing goes, and the status says why.
    let mut bad = Host::with_config(
        dir.path(),
        "tls-bad",
        &url,
        db,
        500,
        &tls_config(&pki.other_ca, Some(&pki.client)),
    );
    bad.start();
    emit(&bad.data, 0, "bad", 200);
    let mut said = String::new();
    assert!(
        wait_for(Duration::from_secs(60), || {
            said = bad.status().map(|s| s.to_string()).unwrap_or_default();
            said.contains("not signed by a CA eventd trusts")
        }),
        "{said}"
    );
    bad.stop();

    // With the right files every row arrives once.
    let mut host = Host::with_config(
        dir.path(),
        "tls-0",
        &url,
        db,
        500,
        &tls_config(&pki.ca, Some(&pki.client)),
    );
    host.start();
    emit(&host.data, 0, "tls", 3000);
    emit(&host.data, 1, "tls", 1000);
    wait_exported(&host, Duration::from_secs(120));
    let (events, _) = assert_exactly_once(&c, db, &host);
    assert!(events > 0, "{events} events");
    let bad_rows = c.count(
        &c.url(1, 1),
        &format!("SELECT count() FROM {db}.events WHERE host = 'tls-bad'"),
    );
    assert_eq!(bad_rows, 0);
    host.stop();
}
