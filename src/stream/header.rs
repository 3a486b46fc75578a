//! The header a client sends first on the service-output socket: a few
//! lines, each ended by `\n` (journald's stdout stream header is the
//! model):
//!
//! ```text
//! stdout          the stream: stdout or stderr (or exit, below)
//! backup          the identifier: the provider of every line (1-255 bytes)
//! info            the level of a line without a prefix: 0-7 or a name
//! 1               1: a line may start with <N> (0-7), its level; 0: not
//! ```
//!
//! An exit report (`exit` as the stream) has a fifth line, `PID STATUS`:
//! the command's pid and how it ended as its parent saw it, `exit:N` or
//! `signal:N` (`signal:N:core` when it dumped core).
//!
//! eventd answers with one line, `ok`, or `error: ` and what is wrong (and
//! then closes the connection).

use crate::rings::Level;

/// The longest header line.
pub const LINE_MAX: usize = 512;

/// What a connection carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Stdout,
    Stderr,
    /// The report of how a command ended.
    Exit,
}

impl Stream {
    pub fn name(self) -> &'static str {
        match self {
            Stream::Stdout => "stdout",
            Stream::Stderr => "stderr",
            Stream::Exit => "exit",
        }
    }
}

/// How a command ended, as its parent saw it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ending {
    Exited(i32),
    Signaled { signal: i32, core: bool },
}

impl Ending {
    /// A `waitpid` status word.
    pub fn from_wait_status(status: i32) -> Option<Ending> {
        if libc::WIFEXITED(status) {
            Some(Ending::Exited(libc::WEXITSTATUS(status)))
        } else if libc::WIFSIGNALED(status) {
            Some(Ending::Signaled {
                signal: libc::WTERMSIG(status),
                core: libc::WCOREDUMP(status),
            })
        } else {
            None
        }
    }

    /// The exit code a shell gives: the status, or 128 + the signal.
    pub fn code(self) -> i32 {
        match self {
            Ending::Exited(code) => code,
            Ending::Signaled { signal, .. } => 128 + signal,
        }
    }

    /// As written in a header: `exit:N`, `signal:N` or `signal:N:core`.
    pub fn text(self) -> String {
        match self {
            Ending::Exited(code) => format!("exit:{code}"),
            Ending::Signaled {
                signal,
                core: false,
            } => format!("signal:{signal}"),
            Ending::Signaled { signal, core: true } => format!("signal:{signal}:core"),
        }
    }

    fn parse(text: &str) -> Option<Ending> {
        let mut parts = text.split(':');
        let ending = match (parts.next()?, parts.next()?.parse().ok()?) {
            ("exit", code) if (0..=255).contains(&code) => Ending::Exited(code),
            ("signal", signal) if (1..=64).contains(&signal) => Ending::Signaled {
                signal,
                core: match parts.next() {
                    None => false,
                    Some("core") => true,
                    Some(_) => return None,
                },
            },
            _ => return None,
        };
        parts.next().is_none().then_some(ending)
    }
}

/// A parsed header.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub stream: Stream,
    pub identifier: String,
    pub level: Level,
    pub level_prefix: bool,
    /// For an exit report: the command's pid and how it ended.
    pub exit: Option<(i32, Ending)>,
}

impl Header {
    /// How many lines a header that starts with `first` has.
    pub fn lines_after(first: &str) -> usize {
        if first == "exit" {
            4
        } else {
            3
        }
    }

    /// The header of `lines` (without their `\n`); what is wrong names the
    /// line.
    pub fn parse(lines: &[&str]) -> Result<Header, String> {
        let line = |i: usize, what: &str| {
            lines
                .get(i)
                .copied()
                .ok_or_else(|| format!("line {}: no {what}", i + 1))
        };
        let stream = match line(0, "stream")? {
            "stdout" => Stream::Stdout,
            "stderr" => Stream::Stderr,
            "exit" => Stream::Exit,
            other => {
                return Err(format!(
                    "line 1: stream {other:?}: expected stdout, stderr or exit"
                ))
            }
        };
        let identifier = line(1, "identifier")?;
        if identifier.is_empty()
            || identifier.len() > 255
            || identifier.chars().any(char::is_control)
        {
            return Err(format!(
                "line 2: identifier {identifier:?}: expected 1 to 255 bytes without control \
                 characters"
            ));
        }
        let level = line(2, "level")?
            .parse::<Level>()
            .map_err(|e| format!("line 3: {e}"))?;
        let level_prefix = match line(3, "level prefix setting")? {
            "1" => true,
            "0" => false,
            other => return Err(format!("line 4: level prefix {other:?}: expected 1 or 0")),
        };
        let exit = match stream {
            Stream::Exit => Some(parse_exit(line(4, "pid and status")?)?),
            _ => None,
        };
        Ok(Header {
            stream,
            identifier: identifier.to_string(),
            level,
            level_prefix,
            exit,
        })
    }

    /// The header as a client writes it.
    pub fn text(&self) -> String {
        let mut t = format!(
            "{}\n{}\n{}\n{}\n",
            self.stream.name(),
            self.identifier,
            self.level.name(),
            u8::from(self.level_prefix)
        );
        if let Some((pid, ending)) = self.exit {
            t.push_str(&format!("{pid} {}\n", ending.text()));
        }
        t
    }
}

fn parse_exit(line: &str) -> Result<(i32, Ending), String> {
    let bad = || format!("line 5: {line:?}: expected PID and exit:N or signal:N");
    let (pid, status) = line.split_once(' ').ok_or_else(bad)?;
    let pid: i32 = pid.parse().map_err(|_| bad())?;
    if pid <= 0 {
        return Err(bad());
    }
    Ok((pid, Ending::parse(status).ok_or_else(bad)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_read_back_as_written_and_errors_name_the_line() {
        let h = Header {
            stream: Stream::Stderr,
            identifier: "backup job".into(),
            level: Level::Warning,
            level_prefix: true,
            exit: None,
        };
        let text = h.text();
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(Header::parse(&lines), Ok(h));
        let exit = Header {
            stream: Stream::Exit,
            exit: Some((
                42,
                Ending::Signaled {
                    signal: 9,
                    core: true,
                },
            )),
            ..Header::parse(&lines).unwrap()
        };
        let text = exit.text();
        assert!(text.ends_with("42 signal:9:core\n"), "{text}");
        assert_eq!(Header::parse(&text.lines().collect::<Vec<_>>()), Ok(exit));
        for (lines, wrong) in [
            (vec!["stdin"], "line 1"),
            (vec!["stdout", ""], "line 2"),
            (vec!["stdout", "x", "loud"], "line 3"),
            (vec!["stdout", "x", "err", "yes"], "line 4"),
            (vec!["stdout", "x", "err"], "line 4"),
            (vec!["exit", "x", "err", "0", "12 exit:300"], "line 5"),
            (vec!["exit", "x", "err", "0", "0 exit:1"], "line 5"),
            (vec!["exit", "x", "err", "0", "7 signal:9:dump"], "line 5"),
        ] {
            let e = Header::parse(&lines).unwrap_err();
            assert!(e.starts_with(wrong), "{lines:?}: {e}");
        }
    }

    #[test]
    fn wait_statuses_become_endings_and_shell_codes() {
        assert_eq!(Ending::from_wait_status(3 << 8), Some(Ending::Exited(3)));
        assert_eq!(Ending::Exited(3).code(), 3);
        let killed = Ending::from_wait_status(libc::SIGKILL).unwrap();
        assert_eq!(
            killed,
            Ending::Signaled {
                signal: 9,
                core: false
            }
        );
        assert_eq!(killed.code(), 137);
    }
}
