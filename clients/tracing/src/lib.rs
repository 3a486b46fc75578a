//! Emit into eventd's per-CPU rings from Rust: [`EventdLayer`], a
//! `tracing-subscriber` layer, and [`EventdLogger`], a `log` backend.
//!
//! ```no_run
//! use tracing_subscriber::prelude::*;
//!
//! let layer = eventd_tracing::EventdLayer::builder()
//!     .kmes_dir("/var/lib/eventd/kmes")
//!     .provider("billing")
//!     .layer();
//! tracing_subscriber::registry().with(layer).init();
//! tracing::info!(order = 42, amount = 9.5, paid = true, "order taken");
//! ```
//!
//! Each event is one record in the ring of the CPU the thread runs on: a
//! few hundred nanoseconds, no system call, no lock, never a wait for
//! eventd. What goes where (docs/guide/emitting.md):
//!
//! | eventd column | from `tracing` | from `log` |
//! |---|---|---|
//! | `level` | ERROR err (3), WARN warning (4), INFO info (6), DEBUG and TRACE debug (7) | the same |
//! | `provider` | the builder's, default the program's name | the same |
//! | `name` | the event's target (the module path unless `target:` says) | the record's target |
//! | `message` | the `message` field (the format string's text) | the formatted arguments |
//! | `fields` | every other field of the event, then those of its spans, innermost first (a name already there is not repeated), as a JSON object: integers and floats stay numbers, booleans booleans, the rest strings | the record's key-values, the same way |
//!
//! While the ring directory is missing (eventd never ran here, a wrong
//! path) events are dropped and counted ([`EventdLayer::dropped`]), the
//! first time is said on stderr, and the directory is tried again once a
//! second. With eventd stopped the rings still take events; eventd reads
//! them at its next start.

mod logger;

pub use eventd::rings::client::{Dropped, Producer};
pub use logger::EventdLogger;

use eventd::rings::client::Fields;
use eventd::rings::Level;
use std::cell::RefCell;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::Arc;
use tracing_core::field::{Field, Visit};
use tracing_core::span::{Attributes, Id, Record};
use tracing_core::{Event, Subscriber};
use tracing_subscriber::layer::Context;
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::Layer;

/// Where events go and under which provider.
#[derive(Debug, Clone, Default)]
pub struct Builder {
    dir: Option<PathBuf>,
    provider: Option<String>,
}

impl Builder {
    /// eventd's ring directory (`DATA_DIR/kmes`). Default:
    /// `$EVENTD_KMES_DIR`, else `$EVENTD_DATA_DIR/kmes`, else
    /// `./eventd-data/kmes`.
    pub fn kmes_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.dir = Some(dir.into());
        self
    }

    /// The `provider` of every event (at most 255 bytes). Default: the
    /// program's file name.
    pub fn provider(mut self, provider: impl Into<String>) -> Self {
        self.provider = Some(provider.into());
        self
    }

    /// The producer both backends write through; one per program is enough,
    /// and a layer and a logger may share it.
    pub fn producer(self) -> Arc<Producer> {
        let dir = self.dir.unwrap_or_else(Producer::default_dir);
        let provider = self.provider.unwrap_or_else(Producer::program_name);
        Arc::new(Producer::new(dir, &provider))
    }

    pub fn layer(self) -> EventdLayer {
        EventdLayer::with_producer(self.producer())
    }

    /// A logger passing every level (`log::set_max_level` filters first).
    pub fn logger(self) -> EventdLogger {
        EventdLogger::with_producer(self.producer(), log::LevelFilter::Trace)
    }
}

/// The `tracing-subscriber` layer (see the crate docs).
#[derive(Clone)]
pub struct EventdLayer {
    producer: Arc<Producer>,
}

impl Default for EventdLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl EventdLayer {
    /// A layer with the defaults of [`Builder`].
    pub fn new() -> Self {
        Builder::default().layer()
    }

    pub fn builder() -> Builder {
        Builder::default()
    }

    pub fn with_producer(producer: Arc<Producer>) -> Self {
        EventdLayer { producer }
    }

    pub fn producer(&self) -> &Arc<Producer> {
        &self.producer
    }

    /// Events written into a ring so far.
    pub fn emitted(&self) -> u64 {
        self.producer.emitted()
    }

    /// Events not written (no rings, too large, ...), counted.
    pub fn dropped(&self) -> u64 {
        self.producer.dropped()
    }
}

/// A span's fields, rendered when it is made (and when it records more).
struct SpanFields(Fields);

/// One thread's buffers, reused by every event.
#[derive(Default)]
struct Scratch {
    fields: Fields,
    message: String,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
}

/// Runs `f` on this thread's buffers, or on fresh ones when they are in
/// use (an event emitted while formatting another) or gone (thread exit).
pub(crate) fn with_scratch(f: impl FnOnce(&mut Fields, &mut String)) {
    let mut f = Some(f);
    let _ = SCRATCH.try_with(|s| {
        if let Ok(mut s) = s.try_borrow_mut() {
            let s = &mut *s;
            if let Some(f) = f.take() {
                f(&mut s.fields, &mut s.message);
            }
        }
    });
    if let Some(f) = f {
        f(&mut Fields::default(), &mut String::new());
    }
}

pub(crate) fn clear(fields: &mut Fields, message: &mut String) {
    fields.clear();
    message.clear();
}

fn level(l: &tracing_core::Level) -> Level {
    match *l {
        tracing_core::Level::ERROR => Level::Err,
        tracing_core::Level::WARN => Level::Warning,
        tracing_core::Level::INFO => Level::Info,
        _ => Level::Debug,
    }
}

impl<S> Layer<S> for EventdLayer
where
    S: Subscriber + for<'a> LookupSpan<'a>,
{
    fn on_new_span(&self, attrs: &Attributes<'_>, id: &Id, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else {
            return;
        };
        let mut fields = Fields::default();
        attrs.record(&mut Visitor {
            fields: &mut fields,
            message: None,
        });
        span.extensions_mut().insert(SpanFields(fields));
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else {
            return;
        };
        let mut extensions = span.extensions_mut();
        if let Some(SpanFields(fields)) = extensions.get_mut::<SpanFields>() {
            values.record(&mut Visitor {
                fields,
                message: None,
            });
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        with_scratch(|fields, message| {
            clear(fields, message);
            event.record(&mut Visitor {
                fields,
                message: Some(message),
            });
            if let Some(scope) = ctx.event_scope(event) {
                for span in scope {
                    if let Some(SpanFields(f)) = span.extensions().get::<SpanFields>() {
                        fields.merge(f);
                    }
                }
            }
            let meta = event.metadata();
            // Counted by the producer when it fails; nothing to do here.
            let _ =
                self.producer
                    .emit(level(meta.level()), meta.target(), message, fields.finish());
        });
    }
}

/// Writes a tracing event's or span's fields; the `message` field goes to
/// `message` when there is one.
struct Visitor<'a> {
    fields: &'a mut Fields,
    message: Option<&'a mut String>,
}

impl Visitor<'_> {
    fn message(&mut self, field: &Field) -> Option<&mut String> {
        if field.name() == "message" {
            self.message.as_deref_mut()
        } else {
            None
        }
    }
}

impl Visit for Visitor<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if let Some(m) = self.message(field) {
            let _ = write!(m, "{value:?}");
        } else {
            self.fields.fmt(field.name(), format_args!("{value:?}"));
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if let Some(m) = self.message(field) {
            m.push_str(value);
        } else {
            self.fields.str(field.name(), value);
        }
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.fields.i64(field.name(), value);
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.fields.u64(field.name(), value);
    }

    fn record_i128(&mut self, field: &Field, value: i128) {
        self.fields.i128(field.name(), value);
    }

    fn record_u128(&mut self, field: &Field, value: u128) {
        self.fields.u128(field.name(), value);
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.fields.f64(field.name(), value);
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.fields.bool(field.name(), value);
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.fields.fmt(field.name(), format_args!("{value}"));
    }
}
