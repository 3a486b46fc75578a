//! The Rust paths: the raw emitter, tracing through eventd's layer,
//! through the fmt layer to a file and through the fmt layer to syslog, and
//! a syslog datagram alone.

use super::cost::{busy_before, per_event, start, warm, Cost};
use eventd::rings::client::Producer;
use eventd::rings::{Emitter, Event, Field, Level, Value};
use std::os::unix::net::UnixDatagram;
use std::path::Path;

/// The event's three typed fields, as every Rust path but tracing's writes
/// them (tracing's macro names the same three).
fn fields(i: u64) -> [Field<'static>; 3] {
    [
        Field::new("order", Value::U64(i)),
        Field::new("amount", Value::F64(i as f64 * 0.5)),
        Field::new("paid", Value::Bool(i % 2 == 1)),
    ]
}

pub(super) fn rust_raw(kmes: &Path, n: u64) -> anyhow::Result<Cost> {
    let emitter = Emitter::open(kmes)?;
    let emit = |i: u64| {
        let fields = fields(i);
        let event = Event {
            ts_ns: eventd::rings::now_ns(),
            pid: 1,
            tid: 1,
            uid: 0,
            level: Level::Info,
            provider: "rust-bench",
            name: "bench",
            message: "order taken",
            fields: "",
        };
        let _ = emitter.emit_typed(&event, &fields);
    };
    (0..warm(n)).for_each(emit);
    let clock = start();
    (0..n).for_each(emit);
    Ok(per_event(clock, n))
}

/// One [`Producer`] shared by `threads` threads, each on its own CPU (of
/// those this process may use, while there are enough): the CPU each
/// thread pays per event, averaged over the threads. What a program's
/// threads pay for sharing one producer (its counts, its budget) beside
/// one thread alone. With `budget`, the producer judges every event
/// against a rate limit it never reaches (as under the daemon's default
/// limits; the harness's eventd has them off).
pub(super) fn rust_producer_threads(
    kmes: &Path,
    n: u64,
    threads: usize,
    budget: bool,
) -> anyhow::Result<Cost> {
    let producer = Producer::new(kmes, "rust-bench");
    let producer = if budget {
        producer.with_budget(30_000, u64::from(u32::MAX))
    } else {
        producer.with_budget(0, 0)
    };
    let cpus = allowed_cpus();
    let barrier = std::sync::Barrier::new(threads);
    let costs: Vec<Cost> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..threads)
            .map(|t| {
                let (producer, barrier) = (&producer, &barrier);
                let cpu = (!cpus.is_empty()).then(|| cpus[t % cpus.len()]);
                s.spawn(move || {
                    if let Some(cpu) = cpu {
                        pin_to(cpu);
                    }
                    busy_before();
                    let emit = |i: u64| {
                        let fields = fields(i);
                        let _ = producer.emit_items(Level::Info, "bench", "order taken", &fields);
                    };
                    (0..warm(n)).for_each(emit);
                    // Every thread timed over the same stretch.
                    barrier.wait();
                    let clock = start();
                    (0..n).for_each(emit);
                    per_event(clock, n)
                })
            })
            .collect();
        handles.into_iter().filter_map(|h| h.join().ok()).collect()
    });
    anyhow::ensure!(
        costs.len() == threads,
        "an emitting thread panicked ({} of {threads} finished)",
        costs.len()
    );
    let mean = |f: fn(&Cost) -> f64| costs.iter().map(f).sum::<f64>() / threads as f64;
    Ok(Cost {
        wall: mean(|c| c.wall),
        cpu: mean(|c| c.cpu),
    })
}

/// The CPUs this process may run on.
fn allowed_cpus() -> Vec<usize> {
    // SAFETY: an all-zero cpu_set_t is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid cpu_set_t of the size passed; pid 0 is this
    // thread.
    let got = unsafe { libc::sched_getaffinity(0, std::mem::size_of_val(&set), &mut set) };
    if got != 0 {
        return Vec::new();
    }
    (0..libc::CPU_SETSIZE as usize)
        // SAFETY: `cpu` is below CPU_SETSIZE, inside the set.
        .filter(|&cpu| unsafe { libc::CPU_ISSET(cpu, &set) })
        .collect()
}

/// Pins the calling thread to `cpu`; left unpinned if that is refused.
fn pin_to(cpu: usize) {
    // SAFETY: an all-zero cpu_set_t is a valid empty set.
    let mut set: libc::cpu_set_t = unsafe { std::mem::zeroed() };
    // SAFETY: `cpu` came from `allowed_cpus`, below CPU_SETSIZE; the call
    // reads a valid set of the size passed, for this thread (pid 0).
    unsafe {
        libc::CPU_SET(cpu, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of_val(&set), &set);
    }
}

/// Warms up, then times `n` events through the subscriber in force.
fn tracing_loop(n: u64) -> Cost {
    let events = |count: u64| {
        for i in 0..count {
            tracing::info!(
                order = i,
                amount = i as f64 * 0.5,
                paid = i % 2 == 1,
                "order taken"
            );
        }
    };
    events(warm(n));
    let clock = start();
    events(n);
    per_event(clock, n)
}

pub(super) fn rust_layer(kmes: &Path, n: u64) -> anyhow::Result<Cost> {
    use tracing_subscriber::prelude::*;
    let layer = eventd_tracing::EventdLayer::builder()
        .kmes_dir(kmes)
        .provider("rust-bench")
        .layer();
    let subscriber = tracing_subscriber::registry().with(layer);
    Ok(tracing::subscriber::with_default(subscriber, || {
        tracing_loop(n)
    }))
}

/// A layer that does nothing with an event: what `tracing` itself costs
/// per event (the macro, the dispatch, the registry) before any layer
/// looks at the fields, the floor under every layer.
struct NothingLayer;

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for NothingLayer {}

pub(super) fn rust_layer_floor(n: u64) -> anyhow::Result<Cost> {
    use tracing_subscriber::prelude::*;
    let subscriber = tracing_subscriber::registry().with(NothingLayer);
    Ok(tracing::subscriber::with_default(subscriber, || {
        tracing_loop(n)
    }))
}

pub(super) fn rust_fmt_file(dir: &Path, n: u64) -> anyhow::Result<Cost> {
    use tracing_subscriber::prelude::*;
    let file = std::fs::File::create(dir.join("fmt.log"))?;
    let layer = tracing_subscriber::fmt::layer()
        .with_ansi(false)
        .with_writer(std::sync::Mutex::new(file));
    let subscriber = tracing_subscriber::registry().with(layer);
    Ok(tracing::subscriber::with_default(subscriber, || {
        tracing_loop(n)
    }))
}

/// What a tracing-to-syslog layer does per event: format the message with
/// its fields in the RFC 3164 shape and send one datagram.
pub(super) fn rust_syslog(socket: &Path, n: u64) -> anyhow::Result<Cost> {
    let sock = UnixDatagram::unbound()?;
    sock.connect(socket)?;
    let pid = std::process::id();
    let mut line = String::with_capacity(256);
    let mut send = |i: u64| {
        use std::fmt::Write;
        line.clear();
        let _ = write!(
            line,
            "<14>{} rust-bench[{pid}]: order taken order={i} amount={:?} paid={}",
            eventd::rings::now_ns() / 1_000_000_000,
            i as f64 * 0.5,
            i % 2 == 1
        );
        sock.send(line.as_bytes()).map(drop)
    };
    (0..warm(n)).try_for_each(&mut send)?;
    let clock = start();
    (0..n).try_for_each(&mut send)?;
    Ok(per_event(clock, n))
}

/// Sends each line the fmt layer writes as one RFC 3164 datagram: the
/// writer a tracing-to-syslog setup plugs into `tracing-subscriber`'s fmt
/// layer.
struct SyslogLines {
    sock: UnixDatagram,
    pid: u32,
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for SyslogLines {
    type Writer = &'a SyslogLines;

    fn make_writer(&'a self) -> Self::Writer {
        self
    }
}

impl std::io::Write for &SyslogLines {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        thread_local! {
            static LINE: std::cell::RefCell<Vec<u8>> = const { std::cell::RefCell::new(Vec::new()) };
        }
        LINE.with_borrow_mut(|line| {
            line.clear();
            write!(
                line,
                "<14>{} rust-bench[{}]: ",
                eventd::rings::now_ns() / 1_000_000_000,
                self.pid
            )?;
            line.extend_from_slice(buf.strip_suffix(b"\n").unwrap_or(buf));
            self.sock.send(line)
        })?;
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

/// tracing to syslog as such setups do: the fmt layer without the time,
/// level, target and colours (the syslog header carries them), each event
/// one datagram to eventd's syslog socket.
pub(super) fn rust_tracing_syslog(socket: &Path, n: u64) -> anyhow::Result<Cost> {
    use tracing_subscriber::prelude::*;
    let sock = UnixDatagram::unbound()?;
    sock.connect(socket)?;
    let layer = tracing_subscriber::fmt::layer()
        .with_ansi(false)
        .without_time()
        .with_level(false)
        .with_target(false)
        .with_writer(SyslogLines {
            sock,
            pid: std::process::id(),
        });
    let subscriber = tracing_subscriber::registry().with(layer);
    Ok(tracing::subscriber::with_default(subscriber, || {
        tracing_loop(n)
    }))
}
