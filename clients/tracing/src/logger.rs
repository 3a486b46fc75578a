//! The `log` backend: the same producer, level mapping and fields as the
//! layer, from `log`'s records and their key-values.

use crate::{clear, with_scratch, Builder, Producer};
use eventd::rings::client::Fields;
use eventd::rings::Level;
use log::kv::{Error, Key, Value, VisitSource, VisitValue};
use std::fmt::Write as _;
use std::sync::Arc;

/// A `log::Log` writing into eventd's rings (see the crate docs).
pub struct EventdLogger {
    producer: Arc<Producer>,
    max: log::LevelFilter,
}

impl EventdLogger {
    /// A logger with the defaults of [`Builder`], passing every level.
    pub fn new() -> Self {
        Builder::default().logger()
    }

    pub fn with_producer(producer: Arc<Producer>, max: log::LevelFilter) -> Self {
        EventdLogger { producer, max }
    }

    pub fn producer(&self) -> &Arc<Producer> {
        &self.producer
    }

    /// Makes this the program's logger with `max` as `log`'s level filter;
    /// returns the producer, for its counts.
    pub fn install(mut self, max: log::LevelFilter) -> Result<Arc<Producer>, log::SetLoggerError> {
        self.max = max;
        let producer = self.producer.clone();
        log::set_boxed_logger(Box::new(self))?;
        log::set_max_level(max);
        Ok(producer)
    }
}

impl Default for EventdLogger {
    fn default() -> Self {
        Self::new()
    }
}

fn level(l: log::Level) -> Level {
    match l {
        log::Level::Error => Level::Err,
        log::Level::Warn => Level::Warning,
        log::Level::Info => Level::Info,
        log::Level::Debug | log::Level::Trace => Level::Debug,
    }
}

impl log::Log for EventdLogger {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= self.max
    }

    fn log(&self, record: &log::Record<'_>) {
        if !self.enabled(record.metadata()) {
            return;
        }
        with_scratch(|fields, message| {
            clear(fields, message);
            let text = match record.args().as_str() {
                Some(s) => s,
                None => {
                    let _ = write!(message, "{}", record.args());
                    message.as_str()
                }
            };
            let _ = record.key_values().visit(&mut Pairs(fields));
            // Counted by the producer when it fails.
            let _ = self.producer.emit(
                level(record.level()),
                record.target(),
                text,
                fields.finish(),
            );
        });
    }

    fn flush(&self) {}
}

struct Pairs<'a>(&'a mut Fields);

impl<'kvs> VisitSource<'kvs> for Pairs<'_> {
    fn visit_pair(&mut self, key: Key<'kvs>, value: Value<'kvs>) -> Result<(), Error> {
        value.visit(Typed {
            fields: self.0,
            key: key.as_str(),
        })
    }
}

/// One value, written with its type.
struct Typed<'a, 'k> {
    fields: &'a mut Fields,
    key: &'k str,
}

impl<'v> VisitValue<'v> for Typed<'_, '_> {
    fn visit_any(&mut self, value: Value<'_>) -> Result<(), Error> {
        self.fields.fmt(self.key, format_args!("{value}"));
        Ok(())
    }

    fn visit_u64(&mut self, value: u64) -> Result<(), Error> {
        self.fields.u64(self.key, value);
        Ok(())
    }

    fn visit_i64(&mut self, value: i64) -> Result<(), Error> {
        self.fields.i64(self.key, value);
        Ok(())
    }

    fn visit_u128(&mut self, value: u128) -> Result<(), Error> {
        self.fields.u128(self.key, value);
        Ok(())
    }

    fn visit_i128(&mut self, value: i128) -> Result<(), Error> {
        self.fields.i128(self.key, value);
        Ok(())
    }

    fn visit_f64(&mut self, value: f64) -> Result<(), Error> {
        self.fields.f64(self.key, value);
        Ok(())
    }

    fn visit_bool(&mut self, value: bool) -> Result<(), Error> {
        self.fields.bool(self.key, value);
        Ok(())
    }

    fn visit_str(&mut self, value: &str) -> Result<(), Error> {
        self.fields.str(self.key, value);
        Ok(())
    }
}
