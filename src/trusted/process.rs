//! What `/proc/PID` says about a process: its start time (which tells one
//! process from a later one given the same pid), its command name, its
//! executable and its systemd units. Each read is a few small files, read
//! into a fixed buffer: bounded work, whatever the process is.

use super::unit;
use std::io::Read;
use std::path::PathBuf;

/// What eventd read about one process.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ProcessInfo {
    /// Field 22 of `/proc/PID/stat`: clock ticks after boot at which the
    /// process started. With the pid it names one process for the boot.
    pub start_time: u64,
    /// `/proc/PID/comm` (the process may set it itself: `prctl`).
    pub comm: Option<Box<str>>,
    /// `/proc/PID/exe` (none for a process that has exited: a zombie has no
    /// executable mapped any more, nor has a kernel thread).
    pub exe: Option<Box<str>>,
    /// The systemd unit of the process's cgroup (`nginx.service`).
    pub unit: Option<Box<str>>,
    /// Under a user manager (`user@1000.service`), the user's own unit.
    pub user_unit: Option<Box<str>>,
}

/// The fields of `/proc/PID/stat` eventd uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Stat {
    /// `R`, `S`, `Z` (exited, not yet waited for), ...
    pub state: u8,
    pub ppid: i32,
    pub start_time: u64,
    /// Field 52: the exit status in `waitpid` form, for a zombie (0 when
    /// the reader may not see it).
    pub exit_code: Option<i32>,
}

/// The longest a `/proc` file eventd reads may be (longer ones are cut,
/// which for the cgroup file means the units are not found).
const FILE_BYTES_MAX: usize = 8192;

fn proc_path(pid: i32, file: &str) -> PathBuf {
    PathBuf::from(format!("/proc/{pid}/{file}"))
}

/// Reads at most [`FILE_BYTES_MAX`] bytes of `/proc/PID/FILE`.
fn read_small(pid: i32, file: &str, buf: &mut Vec<u8>) -> std::io::Result<()> {
    buf.clear();
    let f = std::fs::File::open(proc_path(pid, file))?;
    f.take(FILE_BYTES_MAX as u64).read_to_end(buf)?;
    Ok(())
}

/// `/proc/PID/stat`, parsed.
pub fn stat(pid: i32) -> std::io::Result<Stat> {
    let mut buf = Vec::with_capacity(512);
    read_small(pid, "stat", &mut buf)?;
    parse_stat(&buf).ok_or_else(|| {
        std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("/proc/{pid}/stat is not in the expected form"),
        )
    })
}

/// The fields after the command name, which sits in parentheses and may
/// hold spaces and parentheses itself (so the last `)` ends it).
pub fn parse_stat(bytes: &[u8]) -> Option<Stat> {
    let close = bytes.iter().rposition(|&b| b == b')')?;
    let rest = std::str::from_utf8(&bytes[close + 1..]).ok()?;
    let fields: Vec<&str> = rest.split_ascii_whitespace().collect();
    // fields[0] is field 3 (state): field N is fields[N - 3].
    let field = |n: usize| fields.get(n - 3).copied();
    Some(Stat {
        state: *field(3)?.as_bytes().first()?,
        ppid: field(4)?.parse().ok()?,
        start_time: field(22)?.parse().ok()?,
        exit_code: field(52).and_then(|v| v.parse().ok()),
    })
}

impl ProcessInfo {
    /// Reads what `/proc/PID` says now. An error only when the process is
    /// not there (or its stat cannot be read): a file that cannot be read
    /// leaves its field empty.
    pub fn read(pid: i32) -> std::io::Result<ProcessInfo> {
        let stat = stat(pid)?;
        let mut buf = Vec::with_capacity(1024);
        let text = |buf: &Vec<u8>| String::from_utf8_lossy(buf).trim_end().into();
        let comm = read_small(pid, "comm", &mut buf).ok().map(|()| text(&buf));
        let exe = std::fs::read_link(proc_path(pid, "exe"))
            .ok()
            .map(|p| p.to_string_lossy().into());
        let (unit, user_unit) = match read_small(pid, "cgroup", &mut buf) {
            Ok(()) => unit::units(&String::from_utf8_lossy(&buf)),
            Err(_) => (None, None),
        };
        let info = ProcessInfo {
            start_time: stat.start_time,
            comm,
            exe,
            unit: unit.map(Into::into),
            user_unit: user_unit.map(Into::into),
        };
        // Read again: if the pid now names another process, what was read
        // may be a mix of both; nothing is better than that.
        match self::stat(pid) {
            Ok(again) if again.start_time == stat.start_time => Ok(info),
            Ok(_) => Err(std::io::Error::other(
                "the pid was reused while it was read",
            )),
            // Gone meanwhile: what was read is of the right process.
            Err(_) => Ok(info),
        }
    }

    /// `self`, read again for the same process: what could not be read
    /// again (a zombie's executable) is kept from `old`.
    pub fn refreshed_from(mut self, old: &ProcessInfo) -> ProcessInfo {
        if self.start_time != old.start_time {
            return self;
        }
        let keep = |new: &mut Option<Box<str>>, old: &Option<Box<str>>| {
            if new.is_none() {
                new.clone_from(old);
            }
        };
        keep(&mut self.comm, &old.comm);
        keep(&mut self.exe, &old.exe);
        keep(&mut self.unit, &old.unit);
        keep(&mut self.user_unit, &old.user_unit);
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_is_read_past_a_command_name_with_spaces_and_parentheses() {
        let line = b"4242 (my (odd) name) S 1 4242 4242 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 \
                     1 0 987654 1000000 100 18446744073709551615 1 1 0 0 0 0 0 0 0 0 0 0 17 \
                     1 0 0 0 0 0 0 0 0 0 0 0 0 256\n";
        let s = parse_stat(line).unwrap();
        assert_eq!((s.state, s.ppid, s.start_time), (b'S', 1, 987_654));
        assert_eq!(s.exit_code, Some(256));
        assert_eq!(parse_stat(b"12 (x) R"), None);
    }

    #[test]
    fn this_process_is_read_from_proc() {
        let me = std::process::id() as i32;
        let info = ProcessInfo::read(me).unwrap();
        let exe = std::env::current_exe().unwrap();
        assert_eq!(info.exe.as_deref(), Some(exe.to_str().unwrap()));
        let comm = std::fs::read_to_string(format!("/proc/{me}/comm")).unwrap();
        assert_eq!(info.comm.as_deref(), Some(comm.trim_end()));
        assert_eq!(info.start_time, stat(me).unwrap().start_time);
        assert!(ProcessInfo::read(i32::MAX).is_err(), "no such pid");
    }

    #[test]
    fn a_refresh_keeps_what_a_zombie_no_longer_shows() {
        let old = ProcessInfo {
            start_time: 7,
            comm: Some("app".into()),
            exe: Some("/usr/bin/app".into()),
            unit: Some("app.service".into()),
            user_unit: None,
        };
        let zombie = ProcessInfo {
            exe: None,
            ..old.clone()
        };
        assert_eq!(zombie.refreshed_from(&old), old);
        let other = ProcessInfo {
            start_time: 8,
            ..ProcessInfo::default()
        };
        assert_eq!(other.clone().refreshed_from(&old), other);
    }
}
