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
//! Each event is one record in the ring of the CPU the thread runs on,
//! its fields written typed (binary, no number formatting): 138–156
//! nanoseconds of the emitting thread's CPU for `tracing::info!` with three
//! fields on the machine of docs/performance.md ("Clients"), 1.03–1.20
//! times an LTTng-UST tracepoint in the same run and 1.33 times its
//! instructions; no system call, no lock, never a wait for eventd. What
//! goes where (docs/guide/emitting.md):
//!
//! | eventd column | from `tracing` | from `log` |
//! |---|---|---|
//! | `level` | ERROR err (3), WARN warning (4), INFO info (6), DEBUG and TRACE debug (7) | the same |
//! | `provider` | the builder's, default the program's name | the same |
//! | `name` | the event's target (the module path unless `target:` says) | the record's target |
//! | `message` | the `message` field (the format string's text) | the formatted arguments |
//! | `fields` | every other field of the event, then those of its spans, innermost first (a name already there is not repeated), as a JSON object: integers and floats stay numbers (integers beyond 64 bits become their decimal text), booleans booleans, the rest strings | the record's key-values, the same way |
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
use eventd::rings::{Encoder, Level, Value};
use std::cell::RefCell;
use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
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
    /// Whether any span has had a field: until one has, an event skips the
    /// walk over its spans (most events of most programs).
    spans_have_fields: Arc<AtomicBool>,
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
        EventdLayer {
            producer,
            spans_have_fields: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Notes that a span now holds fields, before they are stored in it.
    fn span_has_fields(&self, fields: &Encoder) {
        // Relaxed: an event on another thread is inside this span only once
        // that thread entered it or named it as a parent, which it could do
        // only after learning the span's id from us (a happens-before edge
        // through whatever passed the id), so it loads this store. A field
        // recorded later, unordered with an event, may or may not reach
        // that event either way.
        if !fields.is_empty() && !self.spans_have_fields.load(Ordering::Relaxed) {
            self.spans_have_fields.store(true, Ordering::Relaxed);
        }
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

/// A span's fields, encoded typed when it is made (and when it records
/// more): an event inside the span appends them to its own.
struct SpanFields(Encoder);

/// One thread's buffers, reused by every event.
#[derive(Default)]
struct Scratch {
    fields: Fields,
    message: String,
}

/// One thread's buffers for the layer's events: the typed fields, the
/// message, and the text of a field shown with `Debug`.
#[derive(Default)]
struct TypedScratch {
    fields: Encoder,
    message: String,
    text: String,
}

thread_local! {
    static SCRATCH: RefCell<Scratch> = RefCell::new(Scratch::default());
    static TYPED: RefCell<TypedScratch> = RefCell::new(TypedScratch::default());
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

/// [`with_scratch`] for the typed buffers, cleared.
fn with_typed(f: impl FnOnce(&mut TypedScratch)) {
    let mut f = Some(f);
    let _ = TYPED.try_with(|s| {
        if let Ok(mut s) = s.try_borrow_mut() {
            if let Some(f) = f.take() {
                s.fields.clear();
                s.message.clear();
                f(&mut s);
            }
        }
    });
    if let Some(f) = f {
        f(&mut TypedScratch::default());
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
        // Another eventd layer of this subscriber (a second provider, say)
        // has stored the span's fields already, encoded the same way.
        if let Some(SpanFields(fields)) = span.extensions().get::<SpanFields>() {
            self.span_has_fields(fields);
            return;
        }
        // Recorded before the extensions are locked: a value's `Debug`
        // may emit an event, which reads them.
        let fields = span_fields(|v| attrs.record(v));
        self.span_has_fields(&fields);
        let mut extensions = span.extensions_mut();
        if extensions.get_mut::<SpanFields>().is_none() {
            extensions.insert(SpanFields(fields));
        }
    }

    fn on_record(&self, id: &Id, values: &Record<'_>, ctx: Context<'_, S>) {
        let Some(span) = ctx.span(id) else {
            return;
        };
        // Recorded before the extensions are locked, as in `on_new_span`:
        // a value's `Debug` may emit an event inside this very span, which
        // reads them (under the lock, that event would wait for it forever).
        let recorded = span_fields(|v| values.record(v));
        if recorded.is_empty() {
            return;
        }
        self.span_has_fields(&recorded);
        let mut extensions = span.extensions_mut();
        if let Some(SpanFields(fields)) = extensions.get_mut::<SpanFields>() {
            // A key the span has already keeps its first value.
            fields.extend_new(&recorded);
        }
    }

    fn on_event(&self, event: &Event<'_>, ctx: Context<'_, S>) {
        with_typed(|s| {
            event.record(&mut Visitor {
                fields: &mut s.fields,
                message: Some(&mut s.message),
                text: &mut s.text,
                once: false,
            });
            // The spans' entries after the event's, innermost first: the
            // reader keeps the first of a repeated key, so an event's field
            // wins over a span's, and an inner span's over an outer's.
            // Relaxed: see `span_has_fields`.
            let spans = self.spans_have_fields.load(Ordering::Relaxed);
            if let Some(scope) = spans.then(|| ctx.event_scope(event)).flatten() {
                for span in scope {
                    if let Some(SpanFields(f)) = span.extensions().get::<SpanFields>() {
                        s.fields.extend(f);
                    }
                }
            }
            let meta = event.metadata();
            // Counted by the producer when it fails; nothing to do here.
            let _ = self.producer.emit_typed(
                level(meta.level()),
                meta.target(),
                &s.message,
                &s.fields.encoded(),
            );
        });
    }
}

/// A span's fields as `record` visits them (at its creation, or recorded
/// later), encoded on their own: each key once, no message.
fn span_fields(record: impl FnOnce(&mut Visitor<'_>)) -> Encoder {
    let mut fields = Encoder::default();
    record(&mut Visitor {
        fields: &mut fields,
        message: None,
        text: &mut String::new(),
        once: true,
    });
    fields
}

/// Encodes a tracing event's or span's fields, typed; the `message` field
/// goes to `message` when there is one.
struct Visitor<'a> {
    fields: &'a mut Encoder,
    message: Option<&'a mut String>,
    /// Where a value shown with `Debug` or `Display` is written first.
    text: &'a mut String,
    /// Skip keys the fields have already (a span's, recorded again).
    once: bool,
}

impl Visitor<'_> {
    fn message(&mut self, field: &Field) -> Option<&mut String> {
        if field.name() == "message" {
            self.message.as_deref_mut()
        } else {
            None
        }
    }

    /// Inlined into each `record_*`, where the value's kind is known, so
    /// the entry is written without a match on it.
    #[inline(always)]
    fn put(&mut self, field: &Field, value: Value<'_>) {
        if self.once && self.has(field) {
            return;
        }
        self.fields.field(field.name(), value);
    }

    /// Whether the fields hold `field` already (spans only, off the
    /// events' path).
    #[inline(never)]
    fn has(&self, field: &Field) -> bool {
        self.fields.has_key(field.name())
    }

    fn text(&mut self, field: &Field, value: std::fmt::Arguments<'_>) {
        let mut text = std::mem::take(self.text);
        text.clear();
        let _ = text.write_fmt(value);
        self.put(field, Value::Str(&text));
        *self.text = text;
    }
}

impl Visit for Visitor<'_> {
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if let Some(m) = self.message(field) {
            let _ = write!(m, "{value:?}");
        } else {
            self.text(field, format_args!("{value:?}"));
        }
    }

    fn record_str(&mut self, field: &Field, value: &str) {
        if let Some(m) = self.message(field) {
            m.push_str(value);
        } else {
            self.put(field, Value::Str(value));
        }
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        self.put(field, Value::I64(value));
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        self.put(field, Value::U64(value));
    }

    /// A number when it fits 64 bits, else its decimal text (a typed entry
    /// holds 64 bits; JSON readers lose such numbers' digits anyway).
    fn record_i128(&mut self, field: &Field, value: i128) {
        match (i64::try_from(value), u64::try_from(value)) {
            (Ok(v), _) => self.put(field, Value::I64(v)),
            (_, Ok(v)) => self.put(field, Value::U64(v)),
            _ => self.text(field, format_args!("{value}")),
        }
    }

    fn record_u128(&mut self, field: &Field, value: u128) {
        match u64::try_from(value) {
            Ok(v) => self.put(field, Value::U64(v)),
            Err(_) => self.text(field, format_args!("{value}")),
        }
    }

    fn record_f64(&mut self, field: &Field, value: f64) {
        self.put(field, Value::F64(value));
    }

    fn record_bool(&mut self, field: &Field, value: bool) {
        self.put(field, Value::Bool(value));
    }

    fn record_error(&mut self, field: &Field, value: &(dyn std::error::Error + 'static)) {
        self.text(field, format_args!("{value}"));
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tracing_subscriber::prelude::*;

    /// Two eventd layers in one subscriber (two providers, say) share each
    /// span's extensions: the second does not panic on the fields the first
    /// stored, and an event reaches both.
    #[test]
    fn two_layers_share_a_span() {
        let dir = tempfile::tempdir().unwrap();
        let kmes = dir.path().join("no-rings-here");
        let a = EventdLayer::builder().kmes_dir(&kmes).provider("a").layer();
        let b = EventdLayer::builder().kmes_dir(&kmes).provider("b").layer();
        let (pa, pb) = (a.producer().clone(), b.producer().clone());
        let flags = [a.spans_have_fields.clone(), b.spans_have_fields.clone()];
        let subscriber = tracing_subscriber::registry().with(a).with(b);
        tracing::subscriber::with_default(subscriber, || {
            let span = tracing::info_span!("request", user = "ann", late = tracing::field::Empty);
            // Both look for span fields, the second layer too although the
            // first stored them.
            assert!(flags.iter().all(|f| f.load(Ordering::Relaxed)));
            span.record("late", 1);
            span.in_scope(|| tracing::info!(n = 1, "inside"));
        });
        // No rings: each layer's event is dropped and counted.
        assert_eq!((pa.dropped(), pb.dropped()), (1, 1));
    }

    /// A value whose `Debug` emits an event of its own.
    struct Chatty;

    impl std::fmt::Debug for Chatty {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            tracing::info!(from = "debug", "formatting a field");
            f.write_str("chatty")
        }
    }

    /// A field recorded into a span after its creation, whose `Debug`
    /// emits an event inside that span: the event reads the span's fields
    /// while they are being recorded, which must not wait on the recording
    /// (it did: `on_record` held the span's extensions locked).
    #[test]
    fn a_field_recorded_late_may_emit_inside_its_own_span() {
        let dir = tempfile::tempdir().unwrap();
        let layer = EventdLayer::builder()
            .kmes_dir(dir.path().join("no-rings-here"))
            .layer();
        let producer = layer.producer().clone();
        let (done, finished) = std::sync::mpsc::channel();
        // On a thread of its own, so that a hang fails the test rather than
        // stopping it.
        std::thread::spawn(move || {
            let subscriber = tracing_subscriber::registry().with(layer);
            tracing::subscriber::with_default(subscriber, || {
                // A field at creation, so events walk their spans' fields.
                let span =
                    tracing::info_span!("request", user = "ann", late = tracing::field::Empty);
                let _inside = span.enter();
                span.record("late", tracing::field::debug(Chatty));
                tracing::info!("after");
            });
            let _ = done.send(());
        });
        finished
            .recv_timeout(std::time::Duration::from_secs(30))
            .expect("recording a field whose Debug emits an event hung");
        // The event from inside Debug and the one after (no rings: counted
        // as dropped).
        assert_eq!(producer.dropped(), 2);
    }
}
