//! Where eventctl prints: standard output through [`Stdout`], lines on
//! standard error through [`say!`].
//!
//! A reader that goes away (`eventctl query | head -1`) ends eventctl at its
//! next write to standard output, quietly and with exit status 0, as it ends
//! journalctl and every Unix filter: the rest of the output is wanted by no
//! one, and nothing failed. Rust ignores SIGPIPE, so that write fails with
//! EPIPE; `Stdout` is the one place that turns EPIPE into the exit, and every
//! command prints through it. Any other write error (a full disk under
//! `> file`) stays an error.

use std::io::{self, Write};

/// Standard output, locked for the life of the command (line-buffered, as
/// `std::io::stdout` is).
pub struct Stdout(io::StdoutLock<'static>);

impl Stdout {
    pub fn lock() -> Self {
        Stdout(io::stdout().lock())
    }
}

impl Write for Stdout {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        unless_reader_gone(self.0.write(buf))
    }

    fn flush(&mut self) -> io::Result<()> {
        unless_reader_gone(self.0.flush())
    }
}

/// `result`, unless it says the reader of standard output is gone: then
/// eventctl ends here with exit status 0. Nothing is left to clean up: the
/// kernel closes the connection to eventd (which ends the query there, as
/// any client going away does) and whatever is still buffered for standard
/// output has no reader.
fn unless_reader_gone<T>(result: io::Result<T>) -> io::Result<T> {
    match result {
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => std::process::exit(0),
        other => other,
    }
}

/// A line on standard error, like `eprintln!` but without its panic when
/// standard error cannot be written (`2>&1 | head -1` once `head` is gone):
/// the line is lost, having no one to read it.
macro_rules! say {
    ($($arg:tt)*) => {{
        use std::io::Write as _;
        let _ = writeln!(std::io::stderr(), $($arg)*);
    }};
}
pub(crate) use say;
