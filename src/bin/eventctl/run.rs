//! `eventctl run -- COMMAND ARGS...`: runs a command with its stdout and
//! stderr connected to eventd's service-output socket (systemd-cat's
//! role), records how it ended, and exits as it did.
//!
//! Nothing goes through eventctl: between fork and exec the child connects
//! to the socket twice (so the kernel's credentials of both connections
//! are the command's own process), sends each a header
//! (`eventd::stream::header`), waits for eventd's `ok`, and puts the
//! connections in place of its stdout and stderr. The command then writes
//! straight to eventd. eventctl waits for it, without reaping it, reports
//! its pid on a connection of its own (eventd checks with the kernel that
//! it is eventctl's exited child and reads its status), then reaps it and
//! exits with its status, or 128 + the signal that killed it.
//!
//! When the command does not run, eventctl exits as `env` and `timeout`
//! do: 127 if it is not found, 126 if it cannot be run, 125 if eventctl
//! itself failed (eventd's socket cannot be reached, or it refused).

use super::cli::RunArgs;
use anyhow::{bail, Context};
use eventd::config::Settings;
use eventd::rings::Level;
use eventd::stream::header::{Ending, Header, Stream};
use std::io::{Read, Write};
use std::os::unix::process::CommandExt;
use std::sync::atomic::{AtomicI32, Ordering};

/// How long eventctl waits for eventd's answer to a header.
const ANSWER_WAIT_SECS: libc::time_t = 10;

/// The command's pid, for the signal handler that passes SIGTERM and
/// SIGHUP on to it (0: none yet).
static CHILD: AtomicI32 = AtomicI32::new(0);

/// Runs the command and exits the process with its code (or 125-127, said
/// on stderr, when it could not run).
pub fn run(settings: &Settings, args: RunArgs) -> anyhow::Result<()> {
    let code = match start(settings, &args) {
        Ok(code) => code,
        Err((code, e)) => {
            eprintln!("eventctl: {}", eventd::errors::error_chain(e.as_ref()));
            code
        }
    };
    let _ = std::io::stderr().flush();
    std::process::exit(code);
}

/// eventctl's own failure (as `env`'s).
const FAILED: i32 = 125;

/// Runs the command: its exit code, or, when it did not run, the code to
/// exit with and why.
fn start(settings: &Settings, args: &RunArgs) -> Result<i32, (i32, anyhow::Error)> {
    let Some(path) = &settings.stdout_socket else {
        return Err((
            FAILED,
            anyhow::anyhow!(
                "StdoutSocket is off in eventd's configuration: there is no socket to run into"
            ),
        ));
    };
    let addr = SocketAddr::new(path).map_err(|e| (FAILED, e))?;
    find_command(&args.command[0])?;
    let provider = provider_of(args);
    let header = |stream, level| Header {
        stream,
        identifier: provider.clone(),
        level,
        level_prefix: args.level_prefix,
        exit: None,
    };
    let stdout = header(Stream::Stdout, args.level).text().into_bytes();
    let stderr = header(Stream::Stderr, args.stderr_level)
        .text()
        .into_bytes();
    let blocked = block_signals();
    let mut cmd = std::process::Command::new(&args.command[0]);
    cmd.args(&args.command[1..]);
    // SAFETY: the closure only makes system calls that are safe between
    // fork and exec (socket, connect, setsockopt, write, read, dup2, close,
    // sigprocmask) on memory allocated before the fork.
    unsafe {
        cmd.pre_exec(move || {
            connect_as(&addr, &stdout, libc::STDOUT_FILENO)?;
            connect_as(&addr, &stderr, libc::STDERR_FILENO)?;
            // The command gets the signal mask eventctl had.
            libc::pthread_sigmask(libc::SIG_SETMASK, &blocked, std::ptr::null_mut());
            Ok(())
        });
    }
    let child = cmd.spawn().with_context(|| {
        format!(
            "cannot run {:?} with its output into {}",
            args.command[0],
            path.display()
        )
    });
    let child = child
        .inspect_err(|_| restore_signals(&blocked))
        .map_err(|e| (FAILED, e))?;
    let pid = child.id() as i32;
    CHILD.store(pid, Ordering::SeqCst);
    pass_signals_on();
    restore_signals(&blocked);
    let ending = wait_without_reaping(pid).map_err(|e| (FAILED, e))?;
    let level = if ending == Ending::Exited(0) {
        args.level
    } else {
        Level::Err
    };
    let report = Header {
        exit: Some((pid, ending)),
        ..header(Stream::Exit, level)
    };
    record_ending(path, &report, &args.command[0]);
    reap(child);
    Ok(ending.code())
}

/// `--provider`, else the command's file name.
fn provider_of(args: &RunArgs) -> String {
    match &args.provider {
        Some(p) => p.clone(),
        None => std::path::Path::new(&args.command[0])
            .file_name()
            .map_or_else(|| "run".into(), |n| n.to_string_lossy().into_owned()),
    }
}

/// Tells eventd how the command ended; a failure is said, not fatal (the
/// command ran, and its code is still the one to exit with).
fn record_ending(path: &std::path::Path, report: &Header, command: &std::ffi::OsStr) {
    if let Err(e) = report_exit(path, report) {
        eprintln!("eventctl run: how {command:?} ended was not recorded: {e:#}");
    }
}

/// Looks for the command as `execvp` will: a name with a `/` as it is, any
/// other in the directories of PATH. 127 if it is not there, 126 if it is
/// and cannot be run (so that a spawn that fails afterwards is eventctl's
/// failure, not the command's).
fn find_command(command: &std::ffi::OsStr) -> Result<(), (i32, anyhow::Error)> {
    use std::os::unix::ffi::OsStrExt;
    use std::os::unix::fs::PermissionsExt;
    let path = std::path::Path::new(command);
    let candidates: Vec<std::path::PathBuf> = if command.as_bytes().contains(&b'/') {
        vec![path.to_path_buf()]
    } else {
        let dirs = std::env::var_os("PATH").unwrap_or_else(|| "/usr/bin:/bin".into());
        std::env::split_paths(&dirs).map(|d| d.join(path)).collect()
    };
    let mut found = None;
    for c in candidates {
        match std::fs::metadata(&c) {
            Ok(m) if m.is_file() && m.permissions().mode() & 0o111 != 0 => return Ok(()),
            Ok(_) => found = Some(c),
            Err(_) => {}
        }
    }
    Err(match found {
        Some(c) => (
            126,
            anyhow::anyhow!("{} is not an executable file", c.display()),
        ),
        None => (127, anyhow::anyhow!("{command:?}: command not found")),
    })
}

/// The socket's address, made before the fork.
#[derive(Clone, Copy)]
struct SocketAddr {
    addr: libc::sockaddr_un,
    len: libc::socklen_t,
}

impl SocketAddr {
    fn new(path: &std::path::Path) -> anyhow::Result<SocketAddr> {
        use std::os::unix::ffi::OsStrExt;
        let bytes = path.as_os_str().as_bytes();
        // SAFETY: sockaddr_un is plain data; all zeros is a valid value.
        let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
        if bytes.len() >= addr.sun_path.len() {
            bail!(
                "the socket path {} is longer than a Unix socket address holds ({} bytes)",
                path.display(),
                addr.sun_path.len() - 1
            );
        }
        addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
        for (d, s) in addr.sun_path.iter_mut().zip(bytes) {
            *d = *s as libc::c_char;
        }
        let len = std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1;
        Ok(SocketAddr {
            addr,
            len: len as libc::socklen_t,
        })
    }
}

/// In the child, before exec: connects to eventd, sends `header`, waits
/// for `ok`, and puts the connection at `fd`. eventd's refusal is written
/// to the child's stderr (still eventctl's then) before the error.
fn connect_as(addr: &SocketAddr, header: &[u8], fd: libc::c_int) -> std::io::Result<()> {
    let s = connect(addr)?;
    let ok = send_header(s, header);
    // SAFETY: `s` is the socket made above, open.
    if let Err(e) = ok.and_then(|()| match unsafe { libc::dup2(s, fd) } {
        -1 => Err(std::io::Error::last_os_error()),
        _ => Ok(()),
    }) {
        // SAFETY: as above.
        unsafe { libc::close(s) };
        return Err(e);
    }
    // SAFETY: as above; `fd` now holds the connection.
    unsafe { libc::close(s) };
    Ok(())
}

/// A connected socket (close-on-exec), with a deadline for reading.
fn connect(addr: &SocketAddr) -> std::io::Result<libc::c_int> {
    // SAFETY: socket has no memory preconditions.
    let s = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if s < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let wait = libc::timeval {
        tv_sec: ANSWER_WAIT_SECS,
        tv_usec: 0,
    };
    // SAFETY: a valid socket, an address of the length given, and a
    // timeval of its size.
    let ok = unsafe {
        libc::connect(s, (&addr.addr as *const libc::sockaddr_un).cast(), addr.len) == 0
            && libc::setsockopt(
                s,
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&wait as *const libc::timeval).cast(),
                std::mem::size_of::<libc::timeval>() as libc::socklen_t,
            ) == 0
    };
    if !ok {
        let e = std::io::Error::last_os_error();
        // SAFETY: the socket made above.
        unsafe { libc::close(s) };
        return Err(e);
    }
    Ok(s)
}

/// Writes `header` to `s` and reads eventd's one-line answer: `ok`, or
/// its refusal, copied to stderr, and EPROTO.
fn send_header(s: libc::c_int, header: &[u8]) -> std::io::Result<()> {
    let mut sent = 0;
    while sent < header.len() {
        // SAFETY: a valid socket and the unsent part of the header.
        let n = unsafe { libc::write(s, header[sent..].as_ptr().cast(), header.len() - sent) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        sent += n as usize;
    }
    let mut answer = [0u8; 512];
    let mut got = 0;
    while got < answer.len() && !answer[..got].contains(&b'\n') {
        // SAFETY: a valid socket and the free part of the buffer.
        let n = unsafe { libc::read(s, answer[got..].as_mut_ptr().cast(), answer.len() - got) };
        match n {
            0 => break,
            n if n < 0 => {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(e);
            }
            n => got += n as usize,
        }
    }
    if answer[..got] == *b"ok\n" {
        return Ok(());
    }
    let lead = b"eventctl run: eventd answered: ";
    // SAFETY: writes of buffers that live on the stack, to stderr.
    unsafe {
        libc::write(libc::STDERR_FILENO, lead.as_ptr().cast(), lead.len());
        if got == 0 {
            let none = b"nothing (the connection was closed)\n";
            libc::write(libc::STDERR_FILENO, none.as_ptr().cast(), none.len());
        } else {
            libc::write(libc::STDERR_FILENO, answer.as_ptr().cast(), got);
        }
    }
    Err(std::io::Error::from_raw_os_error(libc::EPROTO))
}

/// Blocks the signals whose handling changes once the command runs, so
/// none comes in between; returns the mask before.
fn block_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data, filled by sigemptyset/sigaddset; the
    // mask calls get valid pointers.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        let mut old: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in [libc::SIGINT, libc::SIGQUIT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, sig);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut old);
        old
    }
}

fn restore_signals(old: &libc::sigset_t) {
    // SAFETY: a mask returned by `block_signals`.
    unsafe { libc::pthread_sigmask(libc::SIG_SETMASK, old, std::ptr::null_mut()) };
}

/// While the command runs: Ctrl-C and Ctrl-\ reach it (the same process
/// group) and eventctl stays to record its end; SIGTERM and SIGHUP sent to
/// eventctl are passed on to it.
fn pass_signals_on() {
    extern "C" fn pass_on(sig: libc::c_int) {
        let child = CHILD.load(Ordering::SeqCst);
        if child > 0 {
            // SAFETY: kill is async-signal-safe; `child` is our unreaped
            // child.
            unsafe { libc::kill(child, sig) };
        }
    }
    // SAFETY: installing SIG_IGN and a handler that only calls kill (async-
    // signal-safe) and reads an atomic.
    unsafe {
        libc::signal(libc::SIGINT, libc::SIG_IGN);
        libc::signal(libc::SIGQUIT, libc::SIG_IGN);
        let handler = pass_on as extern "C" fn(libc::c_int) as libc::sighandler_t;
        libc::signal(libc::SIGTERM, handler);
        libc::signal(libc::SIGHUP, handler);
    }
}

/// Waits until the command has ended, leaving it unreaped (its pid stays
/// its own, and eventd can check it is our exited child).
fn wait_without_reaping(pid: i32) -> anyhow::Result<Ending> {
    loop {
        // SAFETY: siginfo_t is plain data, filled in by waitid.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        // SAFETY: a valid pid and a siginfo_t to write into.
        let rc = unsafe {
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOWAIT,
            )
        };
        if rc == 0 {
            // SAFETY: waitid filled in a SIGCHLD siginfo.
            let status = unsafe { info.si_status() };
            return Ok(match info.si_code {
                libc::CLD_EXITED => Ending::Exited(status),
                code => Ending::Signaled {
                    signal: status,
                    core: code == libc::CLD_DUMPED,
                },
            });
        }
        let e = std::io::Error::last_os_error();
        if e.kind() != std::io::ErrorKind::Interrupted {
            return Err(e).context("waiting for the command");
        }
    }
}

/// Sends the exit report and reads eventd's answer.
fn report_exit(path: &std::path::Path, report: &Header) -> anyhow::Result<()> {
    let mut s = std::os::unix::net::UnixStream::connect(path)
        .with_context(|| format!("cannot connect to {}", path.display()))?;
    s.set_read_timeout(Some(std::time::Duration::from_secs(30)))?;
    s.write_all(report.text().as_bytes())?;
    let mut answer = String::new();
    s.take(512).read_to_string(&mut answer)?;
    match answer.trim_end() {
        "ok" => Ok(()),
        other => bail!("eventd answered {other:?}"),
    }
}

fn reap(mut child: std::process::Child) {
    if let Err(e) = child.wait() {
        eprintln!("eventctl run: waiting for the command: {e}");
    }
}
