use super::*;

fn resolve(text: &str) -> Result<Settings, ConfigError> {
    ConfigFile::parse(text, Path::new("test.toml"))?.resolve(Path::new("/data"))
}

#[test]
fn embedded_defaults_place_everything_under_the_data_dir() {
    let s = Settings::defaults(Path::new("/data"));
    assert_eq!(s.storage_shards, 0);
    assert_eq!(s.max_batch_size, MAX_BATCH_SIZE_DEFAULT);
    assert_eq!(s.max_concurrent_queries, 128);
    assert_eq!(s.store_dir, Path::new("/data/store"));
    assert_eq!(s.kmes_dir, Path::new("/data/kmes"));
    assert_eq!(s.run_dir, Path::new("/data/run"));
    assert_eq!(s.retention_max_age, None);
}

#[test]
fn seed_key_names_are_read() {
    let s = resolve(
        "StorageShards = 16\nMaxBatchSize = 1000\nMaxConcurrentQueries = 8\n\
         StoreDir = \"shards\"\nKmesDir = \"/dev/shm/kmes\"\nRingBytes = 1048576\n\
         RetentionMaxAge = \"30d\"\nRetentionMaxBytes = 10737418240\n",
    )
    .unwrap();
    assert_eq!(s.storage_shards, 16);
    assert_eq!(s.max_batch_size, 1000);
    assert_eq!(s.max_concurrent_queries, 8);
    assert_eq!(s.store_dir, Path::new("/data/shards"));
    assert_eq!(s.kmes_dir, Path::new("/dev/shm/kmes"));
    assert_eq!(s.ring_bytes, 1 << 20);
    assert_eq!(s.retention_max_age, Some(Duration::from_secs(30 * 86400)));
    assert_eq!(s.retention_max_bytes, Some(10 << 30));
}

#[test]
fn r1_storage_shards_out_of_range_names_key_value_and_range() {
    for bad in ["-1", "257", "100000"] {
        let e = resolve(&format!("StorageShards = {bad}"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("StorageShards"), "{e}");
        assert!(e.contains(bad), "{e}");
        assert!(e.contains("1..=256"), "{e}");
    }
    assert_eq!(resolve("StorageShards = 256").unwrap().storage_shards, 256);
}

#[test]
fn other_ranges_are_checked() {
    let e = resolve("MaxBatchSize = 0").unwrap_err().to_string();
    assert!(
        e.contains("MaxBatchSize = 0") && e.contains("1..=1000000"),
        "{e}"
    );
    let e = resolve("MaxConcurrentQueries = -5")
        .unwrap_err()
        .to_string();
    assert!(e.contains("MaxConcurrentQueries = -5"), "{e}");
    let e = resolve("RingBytes = 10").unwrap_err().to_string();
    assert!(e.contains("RingBytes = 10"), "{e}");
    let e = resolve("RetentionMaxAge = \"soon\"")
        .unwrap_err()
        .to_string();
    assert!(e.contains("RetentionMaxAge") && e.contains("soon"), "{e}");
    for bad in ["0.0.0.0:9464", "192.168.1.5:80", "localhost"] {
        let e = resolve(&format!("MetricsListen = \"{bad}\""))
            .unwrap_err()
            .to_string();
        assert!(e.contains("MetricsListen") && e.contains(bad), "{e}");
        assert!(e.contains("loopback"), "{e}");
    }
    let ok = resolve("MetricsListen = \"[::1]:9464\"").unwrap();
    assert_eq!(ok.metrics_listen, Some("[::1]:9464".parse().unwrap()));
}

#[test]
fn query_indexes_are_columns_or_plain_fields_each_once() {
    use crate::store::indexes::QueryIndex;
    let d = resolve("").unwrap();
    assert_eq!(d.query_indexes, crate::config::query_indexes_default());
    assert_eq!(d.query_indexes, vec![QueryIndex::Column("provider")]);
    let s = resolve("QueryIndexes = [\"pid\", \"fields.unit\", \"pid\"]").unwrap();
    assert_eq!(
        s.query_indexes,
        vec![QueryIndex::Column("pid"), QueryIndex::Field("unit".into())]
    );
    assert!(resolve("QueryIndexes = []")
        .unwrap()
        .query_indexes
        .is_empty());
    for bad in ["message", "level", "fields.a b", "fields."] {
        let e = resolve(&format!("QueryIndexes = [\"{bad}\"]"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("QueryIndexes") && e.contains(bad), "{e}");
    }
}

#[test]
fn unknown_keys_and_wrong_types_name_the_key() {
    let e = resolve("StorageShard = 4").unwrap_err().to_string();
    assert!(e.contains("StorageShard") && e.contains("test.toml"), "{e}");
    let e = resolve("MaxBatchSize = \"lots\"").unwrap_err().to_string();
    assert!(e.contains("MaxBatchSize"), "{e}");
}

#[test]
fn the_shipped_sample_file_is_the_embedded_defaults() {
    let text = include_str!("../../packaging/eventd.toml");
    let path = Path::new("packaging/eventd.toml");
    let s = ConfigFile::parse(text, path)
        .unwrap()
        .resolve(Path::new("/data"))
        .unwrap();
    // The one difference: the package reads the kernel log, the embedded
    // defaults (a test daemon, a developer's) do not.
    assert!(s.kernel_log && !Settings::defaults(Path::new("/data")).kernel_log);
    let s = Settings {
        kernel_log: false,
        ..s
    };
    assert_eq!(s, Settings::defaults(Path::new("/data")));
    // Every key is written commented out at its default ("#Key = value"):
    // uncommenting them all changes nothing.
    let uncommented: String = text
        .lines()
        .map(|l| match l.strip_prefix('#') {
            Some(rest) if rest.starts_with(|c: char| c.is_ascii_uppercase()) => rest,
            _ => l,
        })
        .map(|l| format!("{l}\n"))
        .collect();
    let file = ConfigFile::parse(&uncommented, path).unwrap();
    let mut s = file.resolve(Path::new("/data")).unwrap();
    assert!(s.max_concurrent_queries_explicit);
    s.max_concurrent_queries_explicit = false;
    s.kernel_log = false;
    assert_eq!(s, Settings::defaults(Path::new("/data")));
    // Every key the file format knows is there: at its default, or (a key
    // unset by default) as an example, "# e.g. Key = value". The keys are
    // the ones serde lists when it refuses an unknown one.
    let refusal = resolve("NoSuchKey = 1").unwrap_err().to_string();
    let known: Vec<&str> = refusal.split('`').skip(3).step_by(2).collect();
    assert!(known.len() > 20, "{refusal}");
    for key in known {
        let at_default = text.contains(&format!("\n#{key} = "));
        let example = text.contains(&format!("\n# e.g. {key} = "));
        // The one key set on purpose (see above).
        let set = key == "KernelLog" && text.contains("\nKernelLog = true\n");
        assert!(
            at_default || example || set,
            "{key} is not in packaging/eventd.toml"
        );
    }
}

#[test]
fn paths_that_collide_are_refused_naming_both_keys() {
    assert!(resolve("").unwrap().check_paths().is_ok());
    for (text, keys) in [
        ("StoreDir = \"x\"\nKmesDir = \"x\"", ["StoreDir", "KmesDir"]),
        ("KmesDir = \"store/kmes\"", ["StoreDir", "KmesDir"]),
        ("RunDir = \"./store\"", ["StoreDir", "RunDir"]),
        (
            "SyslogSocket = \"query.sock\"",
            ["SyslogSocket", "the query socket"],
        ),
        (
            "SyslogSocket = \"a.sock\"\nSyslogStreamSocket = \"a.sock\"",
            ["SyslogSocket", "SyslogStreamSocket"],
        ),
        (
            "SyslogSocket = \"/data/store/log.sock\"",
            ["SyslogSocket", "StoreDir"],
        ),
        (
            "StdoutSocket = \"syslog.sock\"",
            ["SyslogSocket", "StdoutSocket"],
        ),
    ] {
        let e = resolve(text)
            .unwrap()
            .check_paths()
            .unwrap_err()
            .to_string();
        for k in keys {
            assert!(e.contains(k), "{text}: {e}");
        }
    }
}

#[test]
fn the_producer_group_follows_the_query_group_unless_set() {
    assert_eq!(resolve("").unwrap().producer_group, "eventd");
    assert_eq!(
        resolve("QueryGroup = \"ops\"").unwrap().producer_group,
        "ops"
    );
    let s = resolve("QueryGroup = \"ops\"\nProducerGroup = \"\"").unwrap();
    assert_eq!(
        (s.query_group.as_str(), s.producer_group.as_str()),
        ("ops", "")
    );
}

#[test]
fn credentials_in_export_url_are_refused_without_being_repeated() {
    for url in [
        "http://eventd:hunter2@10.0.0.5:8123/",
        "http://10.0.0.5:8123/?user=eventd&password=hunter2",
        "http://10.0.0.5:8123/?Password=hunter2",
    ] {
        let e = resolve(&format!("ExportUrl = \"{url}\""))
            .unwrap_err()
            .to_string();
        assert!(e.contains("ExportUrl"), "{e}");
        assert!(
            e.contains("ExportPasswordFile") && e.contains("ExportUser"),
            "{e}"
        );
        assert!(!e.contains("hunter2"), "{e}");
    }
    // A user name alone is refused too: it belongs in ExportUser.
    let e = resolve("ExportUrl = \"http://eventd@10.0.0.5:8123/\"")
        .unwrap_err()
        .to_string();
    assert!(e.contains("ExportUser"), "{e}");
    // Another mistake in a URL with credentials does not show them either.
    let e = resolve("ExportUrl = \"https://eventd:hunter2@10.0.0.5/\"")
        .unwrap_err()
        .to_string();
    assert!(!e.contains("hunter2"), "{e}");
    let e = ConfigFile::parse("ExportUrl = http://u:hunter2@h/", Path::new("t.toml"))
        .unwrap_err()
        .to_string();
    assert!(!e.contains("hunter2"), "{e}");
    let s = resolve("ExportUrl = \"http://10.0.0.5:8123/?database=x\"").unwrap();
    assert_eq!(s.export.unwrap().url, "http://10.0.0.5:8123/?database=x");
}

#[test]
fn https_export_urls_and_tls_files_are_taken_and_a_lone_client_half_is_refused() {
    let s = resolve(
        "ExportUrl = \"https://ch.example:8443/\"\nExportCAFile = \"ca.pem\"\n\
         ExportCertFile = \"/etc/eventd/client.pem\"\nExportKeyFile = \"client.key\"\n",
    )
    .unwrap();
    let export = s.export.unwrap();
    assert_eq!(export.url, "https://ch.example:8443/");
    // Relative paths are under the data directory, as the password file's.
    assert!(export.tls.ca_file.unwrap().ends_with("ca.pem"));
    assert_eq!(
        export.tls.cert_file.unwrap(),
        Path::new("/etc/eventd/client.pem")
    );
    let e = resolve("ExportUrl = \"https://h/\"\nExportKeyFile = \"k\"\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("ExportKeyFile") && e.contains("ExportCertFile"),
        "{e}"
    );
    let e = resolve("ExportUrl = \"ftp://h/\"").unwrap_err().to_string();
    assert!(e.contains("https://"), "{e}");
    // A password with no user would never be sent.
    let e = resolve("ExportUrl = \"https://h/\"\nExportPasswordFile = \"pw\"\n")
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("ExportPasswordFile") && e.contains("only together with ExportUser"),
        "{e}"
    );
}

/// `eventctl config` shows durations as the file writes them, not as
/// serde's `{"secs":..,"nanos":..}`.
#[test]
fn durations_are_reported_as_the_file_writes_them() {
    for (written, shown) in [
        ("7d", "7d"),
        ("1w", "7d"),
        ("36h", "36h"),
        ("90m", "90m"),
        ("1h 30s", "3630s"),
    ] {
        let s = resolve(&format!("RetentionMaxAge = \"{written}\"")).unwrap();
        let v = serde_json::to_value(&s).unwrap();
        assert_eq!(v["retention_max_age"], shown, "{written}");
    }
    let v = serde_json::to_value(resolve("").unwrap()).unwrap();
    assert!(v["retention_max_age"].is_null());
}

#[test]
fn the_config_reference_lists_every_key() {
    let doc = include_str!("../../docs/reference/config.md");
    // Its table's rows: "| `Key` | type | default | range | applies |".
    let rows: Vec<(&str, &str)> = doc
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .map(|l| {
            let key = l.split('`').next().unwrap_or("");
            let applies = l.trim_end_matches('|').rsplit('|').next().unwrap_or("");
            (key, applies.trim())
        })
        .collect();
    let refusal = resolve("NoSuchKey = 1").unwrap_err().to_string();
    let mut known: Vec<&str> = refusal.split('`').skip(3).step_by(2).collect();
    assert!(known.len() > 20, "{refusal}");
    let mut documented: Vec<&str> = rows.iter().map(|(k, _)| *k).collect();
    known.sort_unstable();
    documented.sort_unstable();
    assert_eq!(documented, known, "docs/reference/config.md's keys");
    for (key, applies) in rows {
        let want = if super::live::LIVE_KEYS.contains(&key) {
            "live"
        } else {
            "restart"
        };
        assert_eq!(applies, want, "{key} in docs/reference/config.md");
    }
}

/// Every configuration snippet in the docs (a ```toml block that is not a
/// Cargo manifest) is a file eventd takes.
#[test]
fn the_docs_configuration_snippets_are_accepted() {
    // docs/ and its folders by kind (guide/, reference/, design/).
    let mut pages = Vec::new();
    let mut dirs = vec![Path::new(env!("CARGO_MANIFEST_DIR")).join("docs")];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                dirs.push(path);
            } else if path.extension().and_then(|e| e.to_str()) == Some("md") {
                pages.push(path);
            }
        }
    }
    let mut checked = 0;
    for path in pages {
        let page = std::fs::read_to_string(&path).unwrap();
        let mut block: Option<String> = None;
        for line in page.lines() {
            match (&mut block, line.trim_end()) {
                (None, "```toml") => block = Some(String::new()),
                (Some(text), "```") => {
                    if !text.trim_start().starts_with('[') {
                        let s = ConfigFile::parse(text, &path)
                            .and_then(|f| f.resolve(Path::new("/data")));
                        assert!(s.is_ok(), "{}: {text}: {s:?}", path.display());
                        checked += 1;
                    }
                    block = None;
                }
                (Some(text), l) => {
                    text.push_str(l);
                    text.push('\n');
                }
                (None, _) => {}
            }
        }
    }
    assert!(checked >= 3, "{checked} snippets");
}
