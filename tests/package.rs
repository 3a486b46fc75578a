//! The Debian packages, end to end, on this machine: built by
//! `scripts/package`, inspected (`dpkg-deb -c/-I/-f`), the units checked by
//! `systemd-analyze verify` and `systemd-analyze security --offline=yes`
//! (exposure at most 2.0), installed with `dpkg -i` (systemd not running:
//! its start steps must be skipped or fail harmlessly), the installed
//! eventd run as eventd.service runs it (its user, capabilities,
//! ExecStart, the sockets of its socket units, a NOTIFY_SOCKET this test
//! listens on), used through the installed eventctl and libeventd.so.0 (a C
//! program built with `pkg-config --cflags --libs eventd`), and purged;
//! then the host is put back as it was and checked to be so.
//!
//! Root only (dpkg, a system user); skipped with the reason printed
//! otherwise, and on a host that already has eventd, its user, a log daemon
//! (rsyslog, syslog-ng) or a running systemd, which the test would change.
//! `scripts/test-all` installs what it needs (systemd's tools, dpkg-dev,
//! pkg-config, man-db, strace).
//!
//! What cannot be checked without systemd as PID 1 is checked another way:
//! the sandboxing options by `systemd-analyze verify` and `security`, the
//! system call filter by tracing every call the installed eventd makes
//! (strace) and finding each in the unit's SystemCallFilter=.

mod common;

use common::{as_user, wait_until};
use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

const PACKAGES: [&str; 3] = ["eventd", "libeventd0", "libeventd-dev"];
/// Highest exposure `systemd-analyze security` may give eventd.service
/// (systemd-journald.service: 4.3 on Debian 12).
const EXPOSURE_MAX: f64 = 2.0;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Runs `cmd`; it must succeed. Its standard output.
fn run(cmd: &mut Command) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?}: {}\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap()
}

fn cmd(program: &str, args: &[&str]) -> Command {
    let mut c = Command::new(program);
    c.args(args);
    c
}

fn succeeds(program: &str, args: &[&str]) -> bool {
    Command::new(program)
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success())
}

/// Why this host cannot run the test, if it cannot.
fn unsuitable() -> Option<String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Some("not root (dpkg -i and a system user need root)".into());
    }
    for tool in [
        "dpkg-deb",
        "dpkg-architecture",
        "systemd-analyze",
        "setpriv",
        "pkg-config",
        "cc",
        "readelf",
        "dpkg-shlibdeps",
        "strace",
    ] {
        if !succeeds("sh", &["-c", &format!("command -v {tool}")]) {
            return Some(format!(
                "{tool} is missing (scripts/test-all installs it: systemd, dpkg-dev, \
                 pkg-config, gcc, binutils)"
            ));
        }
    }
    if Path::new("/run/systemd/system").exists() {
        return Some("systemd runs here: installing would start eventd.service for real".into());
    }
    for p in PACKAGES {
        if succeeds("dpkg", &["-s", p]) {
            return Some(format!("package {p} is installed already"));
        }
    }
    let providers = Command::new("dpkg-query")
        .args(["-W", "-f", "${Status} ${Provides}\n"])
        .output()
        .unwrap();
    if String::from_utf8_lossy(&providers.stdout)
        .lines()
        .any(|l| l.starts_with("install ok installed") && l.contains("system-log-daemon"))
    {
        return Some(
            "a system log daemon (rsyslog, syslog-ng) is installed: eventd replaces it".into(),
        );
    }
    if succeeds("getent", &["passwd", "eventd"]) || succeeds("getent", &["group", "eventd"]) {
        return Some("a user or group named eventd exists already".into());
    }
    for p in ["/var/lib/eventd", "/etc/eventd", "/run/eventd"] {
        if Path::new(p).exists() {
            return Some(format!("{p} exists already"));
        }
    }
    None
}

// ------------------------------------------------------------ the host

/// Every path under the directories a package of ours may touch, so that
/// the purged host can be compared with the host before.
fn host_paths() -> BTreeSet<PathBuf> {
    let multiarch = run(&mut cmd("dpkg-architecture", &["-qDEB_HOST_MULTIARCH"]));
    let roots = [
        "/etc".to_string(),
        "/lib/systemd/system".to_string(),
        "/usr/lib/systemd/system".to_string(),
        "/usr/lib/sysusers.d".to_string(),
        "/usr/lib/tmpfiles.d".to_string(),
        format!("/usr/lib/{}", multiarch.trim()),
        "/usr/bin".to_string(),
        "/usr/include".to_string(),
        "/usr/share/man".to_string(),
        "/usr/share/doc".to_string(),
        "/usr/share/bash-completion".to_string(),
        "/usr/share/zsh".to_string(),
        "/usr/share/fish".to_string(),
        "/var/lib".to_string(),
        "/run".to_string(),
    ];
    let mut paths = BTreeSet::new();
    for root in roots {
        walk(Path::new(&root), &mut paths);
    }
    paths
}

fn walk(dir: &Path, out: &mut BTreeSet<PathBuf>) {
    // dpkg's and apt's own records change with every install; /run holds
    // other programs' live files.
    let skip = ["/var/lib/dpkg", "/var/lib/apt", "/run/user", "/proc"];
    if skip.iter().any(|s| dir.starts_with(s)) {
        return;
    }
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        out.insert(path.clone());
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            walk(&path, out);
        }
    }
}

/// The user and group databases (and their backups), byte for byte.
const ACCOUNT_FILES: [&str; 8] = [
    "/etc/passwd",
    "/etc/group",
    "/etc/shadow",
    "/etc/gshadow",
    "/etc/passwd-",
    "/etc/group-",
    "/etc/shadow-",
    "/etc/gshadow-",
];

/// Puts the host back when dropped, also after a failed assertion: the
/// packages purged, the daemon killed, the user and group databases as
/// they were, the fake "systemd runs" marker gone.
struct Restore {
    accounts: Vec<(PathBuf, Option<Vec<u8>>)>,
    daemon: Option<std::process::Child>,
    made_run_systemd: Vec<PathBuf>,
    done: bool,
}

impl Restore {
    fn new() -> Restore {
        Restore {
            accounts: ACCOUNT_FILES
                .iter()
                .map(|p| (PathBuf::from(p), std::fs::read(p).ok()))
                .collect(),
            daemon: None,
            made_run_systemd: Vec::new(),
            done: false,
        }
    }

    fn put_back(&mut self) {
        if std::mem::replace(&mut self.done, true) {
            return;
        }
        if let Some(mut d) = self.daemon.take() {
            let _ = d.kill();
            let _ = d.wait();
        }
        for p in self.made_run_systemd.drain(..).rev() {
            let _ = std::fs::remove_dir(p);
        }
        // Nothing to do after the test's own purge; after a failure, what
        // it installed goes.
        let installed: Vec<&str> = PACKAGES
            .into_iter()
            .filter(|p| succeeds("dpkg", &["-s", p]))
            .collect();
        if !installed.is_empty() {
            let _ = Command::new("dpkg")
                .arg("--purge")
                .args(installed)
                .stdout(Stdio::null())
                .status();
        }
        for (path, bytes) in &self.accounts {
            match bytes {
                Some(b) => {
                    let mode = std::fs::metadata(path).map(|m| m.permissions());
                    let _ = std::fs::write(path, b);
                    if let Ok(mode) = mode {
                        let _ = std::fs::set_permissions(path, mode);
                    }
                }
                None => {
                    let _ = std::fs::remove_file(path);
                }
            }
        }
    }
}

impl Drop for Restore {
    fn drop(&mut self) {
        self.put_back();
    }
}

// ------------------------------------------------------------ the debs

/// The three .deb files scripts/package made, by package name.
fn build_packages() -> BTreeMap<String, PathBuf> {
    let started = Instant::now();
    run(Command::new(repo().join("scripts/package")).current_dir(repo()));
    eprintln!(
        "scripts/package took {:.0} s",
        started.elapsed().as_secs_f64()
    );
    let target = std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo().join("target"));
    let dir = target.join("debian");
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let metadata = run(Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--no-deps", "--locked"])
        .current_dir(repo()));
    let meta: serde_json::Value = serde_json::from_str(&metadata).unwrap();
    let mut debs = BTreeMap::new();
    for p in PACKAGES {
        let crate_name = if p == "eventd" { "eventd" } else { "libeventd" };
        let v = meta["packages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|c| c["name"] == crate_name)
            .unwrap()["version"]
            .as_str()
            .unwrap()
            .to_string();
        let arch = run(&mut cmd("dpkg", &["--print-architecture"]));
        let deb = dir.join(format!("{p}_{v}-1_{}.deb", arch.trim()));
        assert!(deb.is_file(), "{} is missing", deb.display());
        debs.insert(p.to_string(), deb);
    }
    debs
}

/// `dpkg-deb -c`: path → (mode string, link target).
fn contents(deb: &Path) -> BTreeMap<String, (String, Option<String>)> {
    run(Command::new("dpkg-deb").arg("-c").arg(deb))
        .lines()
        .map(|l| {
            let cols: Vec<&str> = l.split_whitespace().collect();
            let path = cols[5].trim_start_matches('.').to_string();
            let link = (cols.get(6) == Some(&"->")).then(|| cols[7].to_string());
            (path, (cols[0].to_string(), link))
        })
        .collect()
}

fn field(deb: &Path, name: &str) -> String {
    run(Command::new("dpkg-deb").arg("-f").arg(deb).arg(name))
        .trim()
        .to_string()
}

fn control_member(deb: &Path, name: &str) -> String {
    run(Command::new("dpkg-deb").arg("-I").arg(deb).arg(name))
}

/// What dpkg-shlibdeps says `files` need, one dependency a line.
fn shlibdeps(files: &[PathBuf], work: &Path) -> Vec<String> {
    // It wants a source package's debian/control to stand in.
    let dir = work.join("shlibdeps");
    std::fs::create_dir_all(dir.join("debian")).unwrap();
    std::fs::write(
        dir.join("debian/control"),
        "Source: eventd\n\nPackage: eventd\nArchitecture: any\n",
    )
    .unwrap();
    let out = run(cmd("dpkg-shlibdeps", &["-O"]).args(files).current_dir(&dir));
    out.trim()
        .strip_prefix("shlibs:Depends=")
        .unwrap_or_else(|| panic!("{out}"))
        .split(", ")
        .map(str::to_string)
        .collect()
}

/// Every shared-library dependency of `files` is declared by `deb`.
fn declares_what_it_links(deb: &Path, files: &[PathBuf], work: &Path) {
    let depends = field(deb, "Depends");
    let declared: Vec<&str> = depends.split(", ").collect();
    for dep in shlibdeps(files, work) {
        assert!(
            declared.contains(&dep.as_str()),
            "{} does not declare {dep}: Depends: {depends}",
            deb.display()
        );
    }
}

/// The packages' files and control data, as built.
fn inspect(debs: &BTreeMap<String, PathBuf>, multiarch: &str, unpacked: &Path) {
    let eventd = &debs["eventd"];
    let files = contents(eventd);
    for want in [
        "/usr/bin/eventd",
        "/usr/bin/eventctl",
        "/lib/systemd/system/eventd.service",
        "/lib/systemd/system/eventd.socket",
        "/lib/systemd/system/eventd-query.socket",
        "/lib/systemd/system/eventd-devlog.socket",
        "/usr/lib/sysusers.d/eventd.conf",
        "/usr/lib/tmpfiles.d/eventd.conf",
        "/etc/eventd/eventd.toml",
        "/usr/share/man/man8/eventd.8.gz",
        "/usr/share/man/man1/eventctl.1.gz",
        "/usr/share/man/man1/eventctl-query.1.gz",
        "/usr/share/man/man1/eventctl-emit.1.gz",
        "/usr/share/bash-completion/completions/eventd",
        "/usr/share/bash-completion/completions/eventctl",
        "/usr/share/zsh/vendor-completions/_eventctl",
        "/usr/share/fish/vendor_completions.d/eventctl.fish",
        "/usr/share/doc/eventd/README.md",
        "/usr/share/doc/eventd/docs/README.md",
        "/usr/share/doc/eventd/docs/guide/install.md",
        "/usr/share/doc/eventd/docs/reference/config.md",
        "/usr/share/doc/eventd/docs/design/security.md",
        "/usr/share/doc/eventd/copyright",
    ] {
        assert!(
            files.contains_key(want),
            "eventd.deb lacks {want}: {files:#?}"
        );
    }
    assert!(files["/usr/bin/eventd"].0.starts_with("-rwxr-xr-x"));
    assert_eq!(
        control_member(eventd, "conffiles").trim(),
        "/etc/eventd/eventd.toml"
    );
    assert_eq!(field(eventd, "Provides"), "system-log-daemon");
    assert_eq!(field(eventd, "Conflicts"), "system-log-daemon");
    let depends = field(eventd, "Depends");
    assert!(
        depends.contains("libc6") && depends.contains("adduser"),
        "{depends}"
    );
    for script in ["postinst", "prerm", "postrm"] {
        let text = control_member(eventd, script);
        let ours = std::fs::read_to_string(repo().join("packaging/debian").join(script)).unwrap();
        assert_eq!(text, ours, "{script} is not packaging/debian/{script}");
    }

    // The files themselves: the binaries stripped, the conffile as in the
    // repository, the man pages gzipped roff.
    run(Command::new("dpkg-deb").arg("-x").arg(eventd).arg(unpacked));
    for bin in ["usr/bin/eventd", "usr/bin/eventctl"] {
        let sections = run(cmd("readelf", &["-S", "-W"]).arg(unpacked.join(bin)));
        assert!(
            !sections.contains(".symtab") && !sections.contains(".debug_"),
            "{bin} is not stripped:\n{sections}"
        );
    }
    declares_what_it_links(
        eventd,
        &[
            unpacked.join("usr/bin/eventd"),
            unpacked.join("usr/bin/eventctl"),
        ],
        unpacked,
    );
    installed_docs_lead_somewhere(unpacked);
    let version = run(Command::new(unpacked.join("usr/bin/eventd")).arg("--version"));
    assert!(version.contains("profile dist"), "{version}");
    assert_eq!(
        std::fs::read(unpacked.join("etc/eventd/eventd.toml")).unwrap(),
        std::fs::read(repo().join("packaging/eventd.toml")).unwrap()
    );
    let man = run(cmd("zcat", &[]).arg(unpacked.join("usr/share/man/man8/eventd.8.gz")));
    assert!(
        man.contains(".TH eventd 8"),
        "{}",
        &man[..man.len().min(300)]
    );
    assert!(
        man.contains("EVENTD_DATA_DIR") && man.contains("data\\-dir"),
        "{man}"
    );

    // libeventd0: the library under its soname, for ldconfig.
    let lib = &debs["libeventd0"];
    let files = contents(lib);
    let dir = format!("/usr/lib/{multiarch}");
    let real = format!("{dir}/libeventd.so.0.1.0");
    assert!(files.contains_key(&real), "{files:#?}");
    assert_eq!(
        files[&format!("{dir}/libeventd.so.0")].1.as_deref(),
        Some("libeventd.so.0.1.0")
    );
    assert_eq!(field(lib, "Multi-Arch"), "same");
    assert!(control_member(lib, "triggers").contains("activate-noawait ldconfig"));
    let lib_dir = unpacked.join("lib0");
    run(Command::new("dpkg-deb").arg("-x").arg(lib).arg(&lib_dir));
    let dynamic = run(cmd("readelf", &["-d"]).arg(lib_dir.join(&real[1..])));
    assert!(
        dynamic.contains("Library soname: [libeventd.so.0]"),
        "{dynamic}"
    );
    let sections = run(cmd("readelf", &["-S", "-W"]).arg(lib_dir.join(&real[1..])));
    assert!(
        !sections.contains(".debug_"),
        "libeventd.so.0 is not stripped"
    );
    declares_what_it_links(lib, &[lib_dir.join(&real[1..])], unpacked);

    // libeventd-dev: header, pkg-config, the link; it depends on exactly
    // the libeventd0 beside it.
    let dev = &debs["libeventd-dev"];
    let files = contents(dev);
    for want in [
        "/usr/include/eventd.h".to_string(),
        format!("{dir}/pkgconfig/eventd.pc"),
    ] {
        assert!(
            files.contains_key(&want),
            "libeventd-dev lacks {want}: {files:#?}"
        );
    }
    assert_eq!(
        files[&format!("{dir}/libeventd.so")].1.as_deref(),
        Some("libeventd.so.0")
    );
    assert_eq!(
        field(dev, "Depends"),
        format!("libeventd0 (= {})", field(lib, "Version"))
    );
}

/// Every page under `/usr/share/doc/eventd` in the unpacked package: its
/// relative links (outside code blocks) lead to a file the package holds,
/// and so do the units' `file://` documentation links.
fn installed_docs_lead_somewhere(unpacked: &Path) {
    let root = unpacked.join("usr/share/doc/eventd");
    let mut pages = Vec::new();
    let mut dirs = vec![root.clone()];
    while let Some(dir) = dirs.pop() {
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            if e.file_type().unwrap().is_dir() {
                dirs.push(e.path());
            } else if e.path().extension().is_some_and(|x| x == "md") {
                pages.push(e.path());
            }
        }
    }
    assert!(pages.len() > 20, "{} pages installed", pages.len());
    let mut broken = Vec::new();
    let mut checked = 0;
    for page in &pages {
        let mut fenced = false;
        for line in std::fs::read_to_string(page).unwrap().lines() {
            if line.trim_start().starts_with("```") {
                fenced = !fenced;
            }
            if fenced {
                continue;
            }
            for target in line.split("](").skip(1).filter_map(|p| p.split(')').next()) {
                let file = target.split('#').next().unwrap_or("");
                if file.is_empty() || target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                checked += 1;
                if !page.parent().unwrap().join(file).exists() {
                    broken.push(format!("{}: {target}", page.display()));
                }
            }
        }
    }
    assert!(checked > 100, "{checked} links");
    assert!(
        broken.is_empty(),
        "installed docs link nowhere: {broken:#?}"
    );
    for unit in ["eventd.service", "eventd.socket", "eventd-query.socket"] {
        let text = std::fs::read_to_string(repo().join("packaging").join(unit)).unwrap();
        for url in text
            .split_whitespace()
            .filter_map(|w| w.strip_prefix("file:///"))
        {
            assert!(unpacked.join(url).exists(), "{unit}: /{url} is not shipped");
        }
    }
}

/// `systemd-analyze verify` on the installed units, and the exposure
/// `systemd-analyze security --offline=yes` gives eventd.service.
fn check_units() -> f64 {
    let units: Vec<String> = [
        "eventd.service",
        "eventd.socket",
        "eventd-query.socket",
        "eventd-devlog.socket",
    ]
    .iter()
    .map(|u| format!("/lib/systemd/system/{u}"))
    .collect();
    // systemd-analyze loads units with PID 1's own code, which stamps
    // /run/systemd/systemd-units-load; that stamp is the tool's, not the
    // package's, and goes when the checks are done.
    let stamp = Path::new("/run/systemd/systemd-units-load");
    let stamped_before = stamp.exists();
    // The Documentation= man pages are checked when man is installed.
    let man = if succeeds("sh", &["-c", "command -v man"]) {
        "--man=yes"
    } else {
        eprintln!("systemd-analyze verify --man=no: man is not installed");
        "--man=no"
    };
    let out = Command::new("systemd-analyze")
        .args(["verify", man])
        .args(&units)
        .output()
        .unwrap();
    let text =
        String::from_utf8_lossy(&out.stderr).to_string() + &String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success() && text.trim().is_empty(),
        "verify:\n{text}"
    );
    let out = Command::new("systemd-analyze")
        .args(["security", "--offline=yes", "--no-pager"])
        .arg(&units[0])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let line = text
        .lines()
        .find(|l| l.contains("Overall exposure level"))
        .unwrap_or_else(|| panic!("no exposure level:\n{text}"));
    let level: f64 = line
        .split(':')
        .nth(1)
        .and_then(|r| r.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{line}"));
    println!("systemd-analyze security --offline=yes eventd.service: {line}");
    eprintln!("{line}");
    if !stamped_before {
        let _ = std::fs::remove_file(stamp);
    }
    level
}

// ------------------------------------------------------------ the unit

/// The `Key=` values of a unit file, in order.
fn unit_values(path: &Path, key: &str) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap();
    text.lines()
        .filter_map(|l| l.strip_prefix(&format!("{key}=")))
        .map(|v| v.trim().to_string())
        .collect()
}

fn unit_value(path: &Path, key: &str) -> String {
    unit_values(path, key)
        .pop()
        .unwrap_or_else(|| panic!("{} has no {key}=", path.display()))
}

/// The sockets a socket unit lists, made as systemd makes them: bound,
/// with its SocketMode, SocketUser and SocketGroup; named by its
/// FileDescriptorName (default: the unit's file name).
fn sockets_of(unit: &Path) -> Vec<(std::os::fd::OwnedFd, String, PathBuf)> {
    use std::os::unix::net::{UnixDatagram, UnixListener};
    let name = unit_values(unit, "FileDescriptorName")
        .pop()
        .unwrap_or_else(|| unit.file_name().unwrap().to_string_lossy().into_owned());
    let mode = u32::from_str_radix(&unit_value(unit, "SocketMode"), 8).unwrap();
    let owner = |key: &str| -> Option<u32> {
        let who = unit_values(unit, key).pop()?;
        let db = if key == "SocketUser" {
            "passwd"
        } else {
            "group"
        };
        let line = run(&mut cmd("getent", &[db, &who]));
        line.split(':').nth(2)?.parse().ok()
    };
    let (uid, gid) = (owner("SocketUser"), owner("SocketGroup"));
    let mut out = Vec::new();
    for (key, datagram) in [("ListenDatagram", true), ("ListenStream", false)] {
        for path in unit_values(unit, key).into_iter().map(PathBuf::from) {
            let _ = std::fs::remove_file(&path);
            let fd: std::os::fd::OwnedFd = if datagram {
                UnixDatagram::bind(&path).unwrap().into()
            } else {
                UnixListener::bind(&path).unwrap().into()
            };
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            std::os::unix::fs::chown(&path, uid, gid).unwrap();
            out.push((fd, name.clone(), path));
        }
    }
    out
}

/// The sd_notify messages eventd sends (the test's NOTIFY_SOCKET).
struct Notify {
    socket: std::os::unix::net::UnixDatagram,
}

impl Notify {
    fn wait_for(&self, line: &str, daemon: &mut std::process::Child, log: &Path) -> String {
        let deadline = Instant::now() + Duration::from_secs(120);
        self.socket
            .set_read_timeout(Some(Duration::from_millis(200)))
            .unwrap();
        let mut buf = vec![0u8; 4096];
        loop {
            if let Ok(n) = self.socket.recv(&mut buf) {
                let m = String::from_utf8_lossy(&buf[..n]).into_owned();
                if m.lines().any(|l| l == line) {
                    return m;
                }
            }
            if let Ok(Some(status)) = daemon.try_wait() {
                panic!("eventd exited ({status}):\n{}", common::read(log));
            }
            assert!(
                Instant::now() < deadline,
                "no {line}:\n{}",
                common::read(log)
            );
        }
    }
}

/// A process's capability sets (`/proc/PID/status`): name → mask.
fn capabilities(pid: u32) -> BTreeMap<String, u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap()
        .lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            let v = v.trim();
            if k.starts_with("Cap") {
                Some((k.to_string(), u64::from_str_radix(v, 16).ok()?))
            } else if k == "NoNewPrivs" || k == "Uid" {
                Some((k.to_string(), v.split_whitespace().next()?.parse().ok()?))
            } else {
                None
            }
        })
        .collect()
}

const CAP_SYSLOG: u64 = 1 << 34;

/// Starts /usr/bin/eventd as the installed eventd.service would: its
/// ExecStart, User= and Group= (with the user's groups), the capabilities
/// of AmbientCapabilities= and CapabilityBoundingSet=, NoNewPrivileges=,
/// UMask=, LimitNOFILE= (at most this host's hard limit), WatchdogSec=, the
/// sockets of eventd.socket and eventd-query.socket, and a NOTIFY_SOCKET.
fn start_as_the_unit(work: &Path, restore: &mut Restore) -> (Notify, PathBuf, Vec<PathBuf>) {
    use std::os::unix::process::CommandExt;
    let unit = Path::new("/lib/systemd/system/eventd.service");
    let exec = unit_value(unit, "ExecStart");
    let user = unit_value(unit, "User");
    assert_eq!(unit_value(unit, "Group"), user);
    assert_eq!(unit_value(unit, "AmbientCapabilities"), "CAP_SYSLOG");
    assert_eq!(unit_value(unit, "CapabilityBoundingSet"), "CAP_SYSLOG");
    assert_eq!(unit_value(unit, "NoNewPrivileges"), "yes");
    assert_eq!(unit_value(unit, "Type"), "notify");
    let umask = u32::from_str_radix(&unit_value(unit, "UMask"), 8).unwrap();
    let watchdog: u64 = unit_value(unit, "WatchdogSec")
        .trim_end_matches('s')
        .parse()
        .unwrap();
    let nofile: u64 = unit_value(unit, "LimitNOFILE").parse().unwrap();
    let mut hard = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit fills the struct we own.
    let rc = unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut hard) };
    assert_eq!(rc, 0);
    let nofile = nofile.min(hard.rlim_max);
    if nofile < 262_144 {
        eprintln!("LimitNOFILE lowered to this host's hard limit, {nofile}");
    }

    // The notify socket, where eventd's user can reach it.
    std::fs::set_permissions(work, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = work.join("notify.sock");
    let socket = std::os::unix::net::UnixDatagram::bind(&path).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o666)).unwrap();

    // The sockets systemd would hold (not eventd-devlog.socket: its
    // /dev/log is this host's).
    let mut sockets = sockets_of(Path::new("/lib/systemd/system/eventd.socket"));
    sockets.extend(sockets_of(Path::new(
        "/lib/systemd/system/eventd-query.socket",
    )));
    let names: Vec<String> = sockets.iter().map(|(_, n, _)| n.clone()).collect();
    let paths: Vec<PathBuf> = sockets.iter().map(|(_, _, p)| p.clone()).collect();
    let fds: Vec<i32> = sockets
        .iter()
        // SAFETY: F_DUPFD_CLOEXEC on descriptors we hold; copies far above
        // 3, so moving them into place cannot overwrite one another.
        .map(|(fd, _, _)| unsafe {
            libc::fcntl(
                std::os::fd::AsRawFd::as_raw_fd(fd),
                libc::F_DUPFD_CLOEXEC,
                100,
            )
        })
        .collect();

    let log = work.join("eventd.log");
    let mut argv: Vec<String> = exec.split_whitespace().map(str::to_string).collect();
    let program = argv.remove(0);
    // Traced (strace -f) from the start, to hold every system call eventd
    // makes against the unit's SystemCallFilter=; sh's pid, which LISTEN_PID
    // names, becomes eventd's through exec.
    let mut c = Command::new("strace");
    c.args(["-f", "-qq", "-o"])
        .arg(work.join("eventd.strace"))
        .args(["--", "sh", "-c", "LISTEN_PID=$$ exec \"$0\" \"$@\""])
        .arg("setpriv")
        .args([
            &format!("--reuid={user}"),
            &format!("--regid={user}"),
            "--init-groups",
            "--no-new-privs",
            "--inh-caps=-all,+syslog",
            "--ambient-caps=-all,+syslog",
            "--bounding-set=-all,+syslog",
            "--",
            &program,
        ])
        .args(&argv)
        .current_dir("/")
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("NOTIFY_SOCKET", &path)
        .env("WATCHDOG_USEC", (watchdog * 1_000_000).to_string())
        .env("LISTEN_FDS", fds.len().to_string())
        .env("LISTEN_FDNAMES", names.join(":"))
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap());
    let moves = fds.clone();
    // SAFETY: between fork and exec: umask, setrlimit and dup2 only; the
    // vector was allocated before the fork.
    unsafe {
        c.pre_exec(move || {
            libc::umask(umask as libc::mode_t);
            let limit = libc::rlimit {
                rlim_cur: nofile,
                rlim_max: nofile,
            };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &limit) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            for (i, &fd) in moves.iter().enumerate() {
                if libc::dup2(fd, 3 + i as i32) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
            }
            Ok(())
        });
    }
    restore.daemon = Some(c.spawn().unwrap());
    for fd in fds {
        // SAFETY: our own copies, not used again.
        unsafe { libc::close(fd) };
    }
    drop(sockets);
    (Notify { socket }, log, paths)
}

/// The system calls made in `trace` (strace -f) from the exec of
/// `program` on: by eventd and its threads (it starts no other process).
fn syscalls_after_exec(trace: &str, program: &str) -> BTreeSet<String> {
    let exec = format!("execve(\"{program}\"");
    let start = trace
        .lines()
        .position(|l| l.contains(&exec) && l.trim_end().ends_with("= 0"))
        .unwrap_or_else(|| panic!("no {exec} in the trace"));
    trace
        .lines()
        .skip(start + 1)
        .filter_map(|l| {
            // "PID  name(args) = ret", "PID  name(args <unfinished ...>"
            let call = l.split_once(char::is_whitespace)?.1.trim_start();
            let name: String = call
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            (!name.is_empty() && call[name.len()..].starts_with('(')).then_some(name)
        })
        .collect()
}

/// The system calls a unit's SystemCallFilter= lines allow, in order: the
/// first names the allowed set, `~` lines take away, others add; groups
/// expanded as `systemd-analyze syscall-filter` lists them.
fn allowed_syscalls(unit: &Path) -> BTreeSet<String> {
    let listing = run(&mut cmd(
        "systemd-analyze",
        &["syscall-filter", "--no-pager"],
    ));
    let mut groups: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut current = None;
    for line in listing.lines() {
        if let Some(group) = line.strip_prefix('@') {
            current = Some(format!("@{}", group.trim()));
            groups.insert(current.clone().unwrap(), Vec::new());
        } else if let (Some(g), item) = (&current, line.trim()) {
            if !item.is_empty() && !item.starts_with('#') {
                groups.get_mut(g).unwrap().push(item.to_string());
            }
        }
    }
    fn expand(item: &str, groups: &BTreeMap<String, Vec<String>>, out: &mut BTreeSet<String>) {
        match groups.get(item) {
            Some(items) => items.iter().for_each(|i| expand(i, groups, out)),
            None => {
                out.insert(item.to_string());
            }
        }
    }
    let mut allowed = BTreeSet::new();
    for value in unit_values(unit, "SystemCallFilter") {
        let (deny, list) = match value.strip_prefix('~') {
            Some(rest) => (true, rest),
            None => (false, value.as_str()),
        };
        let mut set = BTreeSet::new();
        list.split_whitespace()
            .for_each(|i| expand(i, &groups, &mut set));
        if deny {
            allowed.retain(|c| !set.contains(c));
        } else {
            allowed.extend(set);
        }
    }
    assert!(allowed.len() > 100, "{allowed:?}");
    allowed
}

// ------------------------------------------------------------ the test

#[test]
fn the_debian_packages_build_install_run_and_purge() {
    if let Some(why) = unsuitable() {
        eprintln!("skipped: {why}");
        return;
    }
    let before = host_paths();
    let mut restore = Restore::new();
    let work = tempfile::tempdir().unwrap();
    let multiarch = run(&mut cmd("dpkg-architecture", &["-qDEB_HOST_MULTIARCH"]))
        .trim()
        .to_string();

    let debs = build_packages();
    for (name, deb) in &debs {
        let size = std::fs::metadata(deb).unwrap().len();
        eprintln!("{name}: {} ({size} bytes)", deb.display());
    }
    inspect(&debs, &multiarch, &work.path().join("unpacked"));

    // Installed where systemd's marker directory exists but no systemd
    // answers: postinst's daemon-reload and deb-systemd-invoke fail, and
    // dpkg -i must not.
    for dir in ["/run/systemd", "/run/systemd/system"] {
        if std::fs::create_dir(dir).is_ok() {
            restore.made_run_systemd.push(PathBuf::from(dir));
        }
    }
    run(Command::new("dpkg").arg("-i").args(debs.values()));
    for dir in restore.made_run_systemd.drain(..).rev() {
        std::fs::remove_dir(dir).unwrap();
    }

    // What installing made: the user and group, the directories with
    // docs/design/security.md's modes, the units enabled, the library known.
    let passwd = run(&mut cmd("getent", &["passwd", "eventd"]));
    let fields: Vec<&str> = passwd.trim().split(':').collect();
    let (uid, gid): (u32, u32) = (fields[2].parse().unwrap(), fields[3].parse().unwrap());
    assert!(uid < 1000, "not a system user: {passwd}");
    assert_eq!(fields[5], "/var/lib/eventd", "{passwd}");
    assert!(fields[6].ends_with("nologin"), "{passwd}");
    let group = run(&mut cmd("getent", &["group", "eventd"]));
    assert_eq!(
        group.split(':').nth(2).unwrap().parse::<u32>().unwrap(),
        gid
    );
    for dir in ["/var/lib/eventd", "/var/lib/eventd/run"] {
        let m = std::fs::metadata(dir).unwrap();
        assert_eq!(
            (m.mode() & 0o7777, m.uid(), m.gid()),
            (0o755, uid, gid),
            "{dir}"
        );
    }
    for (link, target) in [
        ("multi-user.target.wants/eventd.service", "eventd.service"),
        ("sockets.target.wants/eventd.socket", "eventd.socket"),
        (
            "sockets.target.wants/eventd-query.socket",
            "eventd-query.socket",
        ),
        (
            "sockets.target.wants/eventd-devlog.socket",
            "eventd-devlog.socket",
        ),
        ("syslog.service", "eventd.service"),
    ] {
        let path = Path::new("/etc/systemd/system").join(link);
        let to = std::fs::read_link(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert!(
            to.ends_with(target),
            "{} -> {}",
            path.display(),
            to.display()
        );
    }
    let cache = run(&mut cmd("ldconfig", &["-p"]));
    assert!(cache.contains("libeventd.so.0 "), "ldconfig -p:\n{cache}");
    let level = check_units();
    assert!(level <= EXPOSURE_MAX, "exposure {level} > {EXPOSURE_MAX}");

    // The installed eventd, as the unit runs it.
    let (notify, log, socket_paths) = start_as_the_unit(work.path(), &mut restore);
    let daemon = restore.daemon.as_mut().unwrap();
    let ready = notify.wait_for("READY=1", daemon, &log);
    // eventd's own pid (the child is strace).
    let pid: u32 = std::fs::read_to_string("/var/lib/eventd/run/eventd.pid")
        .unwrap()
        .split_whitespace()
        .next()
        .unwrap()
        .parse()
        .unwrap();
    assert!(ready.contains("STATUS=running"), "{ready}");
    let caps = capabilities(pid);
    assert_eq!(caps["Uid"], u64::from(uid), "{caps:?}");
    for set in ["CapEff", "CapPrm", "CapAmb", "CapBnd"] {
        assert_eq!(caps[set], CAP_SYSLOG, "{set}: {caps:?}");
    }
    assert_eq!(caps["NoNewPrivs"], 1, "{caps:?}");
    let text = common::read(&log);
    assert!(
        text.contains("query socket passed by the service manager")
            && text.contains("syslog datagram socket passed by the service manager"),
        "{text}"
    );
    notify.wait_for("WATCHDOG=1", daemon, &log);

    // In: the installed eventctl, libeventd.so.0 through pkg-config, and
    // syslog through the unit's socket. Out: eventctl with no --data-dir.
    run(cmd(
        "/usr/bin/eventctl",
        &[
            "emit",
            "--provider",
            "pkgtest",
            "--level",
            "warning",
            "from eventctl",
        ],
    )
    .current_dir("/"));
    let c_src = work.path().join("emit.c");
    std::fs::write(
        &c_src,
        "#include <eventd.h>\n#include <stdio.h>\n\
         int main(void) {\n  eventd_t *ev;\n\
           int rc = eventd_open(\"/var/lib/eventd/kmes\", \"pkgtest\", &ev);\n\
           if (rc != EVENTD_OK) { fprintf(stderr, \"%s\\n\", eventd_strerror(rc)); return 1; }\n\
           rc = eventd_emit(ev, EVENTD_ERR, \"c\", \"from libeventd.so.0\", NULL);\n\
           eventd_close(ev);\n  return rc == EVENTD_OK ? 0 : 1;\n}\n",
    )
    .unwrap();
    let flags = run(&mut cmd("pkg-config", &["--cflags", "--libs", "eventd"]));
    assert!(flags.contains("-leventd"), "{flags}");
    let exe = work.path().join("emit");
    run(cmd("sh", &["-c"]).arg(format!(
        "cc -Wall -Werror -o {} {} {}",
        exe.display(),
        c_src.display(),
        flags.trim()
    )));
    let ldd = run(&mut cmd("ldd", &[exe.to_str().unwrap()]));
    assert!(
        ldd.contains(&format!(
            "libeventd.so.0 => /lib/{multiarch}/libeventd.so.0"
        )) || ldd.contains(&format!(
            "libeventd.so.0 => /usr/lib/{multiarch}/libeventd.so.0"
        )),
        "{ldd}"
    );
    // Run as a member of the eventd group (the default ProducerGroup).
    run(as_user(&mut Command::new(&exe), 65534, &[gid]));
    let syslog = socket_paths
        .iter()
        .find(|p| p.ends_with("syslog.sock"))
        .unwrap();
    std::os::unix::net::UnixDatagram::unbound()
        .unwrap()
        .send_to(b"<12>pkgtest: through eventd.socket", syslog)
        .unwrap();
    let elsewhere = work.path().join("elsewhere");
    std::fs::create_dir(&elsewhere).unwrap();
    let query = || {
        let mut c = cmd("/usr/bin/eventctl", &["query", "--provider", "pkgtest"]);
        c.current_dir(&elsewhere)
            .env_remove("EVENTD_DATA_DIR")
            .env_remove("EVENTD_CONFIG");
        c
    };
    // Each of the three by its text: the listing also holds a gap row of
    // the kernel log (records the kernel overwrote before this boot's
    // first eventd), so its line count says nothing.
    let mut out = String::new();
    let sent = [
        "from eventctl",
        "from libeventd.so.0",
        "through eventd.socket",
    ];
    wait_until("three events stored", || {
        out = run(&mut query());
        sent.iter().all(|m| out.contains(m))
    });
    // A member of the group may query too; anyone else is refused.
    let member = run(as_user(&mut query(), 65534, &[gid]));
    assert_eq!(member, out);
    let refused = as_user(&mut query(), 65534, &[]).output().unwrap();
    assert!(!refused.status.success());
    assert!(String::from_utf8_lossy(&refused.stderr).contains("denied"));

    // Stop as systemd does: SIGTERM, STOPPING=1, a clean exit.
    // SAFETY: kill on our own child's pid.
    assert_eq!(unsafe { libc::kill(pid as i32, libc::SIGTERM) }, 0);
    notify.wait_for("STOPPING=1", daemon, &log);
    // strace exits as eventd did.
    let status = daemon.wait().unwrap();
    assert!(status.success(), "{status}:\n{}", common::read(&log));
    restore.daemon = None;
    let trace = std::fs::read_to_string(work.path().join("eventd.strace")).unwrap();
    let made = syscalls_after_exec(&trace, "/usr/bin/eventd");
    let allowed = allowed_syscalls(Path::new("/lib/systemd/system/eventd.service"));
    let denied: Vec<&String> = made.iter().filter(|c| !allowed.contains(*c)).collect();
    eprintln!(
        "eventd made {} distinct system calls, all checked against SystemCallFilter=",
        made.len()
    );
    assert!(
        made.contains("io_uring_setup") || made.contains("recvmmsg"),
        "{made:?}"
    );
    assert!(
        denied.is_empty(),
        "eventd.service's SystemCallFilter= would deny {denied:?}"
    );
    for p in &socket_paths {
        let _ = std::fs::remove_file(p);
    }

    // Purge: nothing of ours is left.
    run(Command::new("dpkg").arg("--purge").args(PACKAGES));
    for p in PACKAGES {
        assert!(!succeeds("dpkg", &["-s", p]), "{p} still installed");
    }
    restore.put_back();
    assert!(!succeeds("getent", &["passwd", "eventd"]));
    let after = host_paths();
    let left: Vec<_> = after.difference(&before).collect();
    let gone: Vec<_> = before.difference(&after).collect();
    assert!(left.is_empty(), "left on the host: {left:#?}");
    assert!(gone.is_empty(), "removed from the host: {gone:#?}");
}
