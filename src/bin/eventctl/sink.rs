//! Where a query's rows go: straight to the renderer, or, for `-n N`
//! (asked for newest first), held until the listing is complete and then
//! printed oldest first, as journalctl prints its last N.

use eventd::query::render::Renderer;
use eventd::query::{EventRow, GapRow};
use std::io::Write;

/// Rows held to be turned around.
struct Held {
    /// At most this many events were asked for.
    limit: u64,
    events: Vec<(Option<String>, EventRow)>,
    gaps: Vec<(Option<String>, GapRow)>,
}

pub struct Sink<W: Write> {
    pub out: Renderer<W>,
    held: Option<Held>,
}

impl<W: Write> Sink<W> {
    /// Prints rows as they come.
    pub fn direct(out: Renderer<W>) -> Self {
        Sink { out, held: None }
    }

    /// Holds the newest `limit` events (and the gaps) until
    /// [`listing_done`](Self::listing_done), then prints them oldest first.
    pub fn turned_around(out: Renderer<W>, limit: u64) -> Self {
        let held = Held {
            limit,
            events: Vec::new(),
            gaps: Vec::new(),
        };
        Sink {
            out,
            held: Some(held),
        }
    }

    pub fn event(&mut self, host: Option<&str>, e: EventRow) -> std::io::Result<()> {
        match &mut self.held {
            Some(h) => {
                h.events.push((host.map(str::to_string), e));
                Ok(())
            }
            None => self.out.event_from(host, &e),
        }
    }

    pub fn gap(&mut self, host: Option<&str>, g: GapRow) -> std::io::Result<()> {
        match &mut self.held {
            Some(h) => {
                h.gaps.push((host.map(str::to_string), g));
                Ok(())
            }
            None => self.out.gap_from(host, &g),
        }
    }

    /// The listing is complete: held rows are printed, oldest first. When
    /// the events filled the limit, only the gaps found after the oldest
    /// of them are printed (those meet the span shown); rows that come
    /// later (a follow's) are printed as they come.
    pub fn listing_done(&mut self) -> std::io::Result<()> {
        let Some(h) = self.held.take() else {
            return Ok(());
        };
        let from = match h.events.last() {
            Some((_, oldest)) if h.events.len() as u64 >= h.limit => oldest.ts,
            _ => i64::MIN,
        };
        for (host, e) in h.events.iter().rev() {
            self.out.event_from(host.as_deref(), e)?;
        }
        for (host, g) in h.gaps.iter().rev().filter(|(_, g)| g.detected_at >= from) {
            self.out.gap_from(host.as_deref(), g)?;
        }
        Ok(())
    }

    pub fn flush(&mut self) -> std::io::Result<()> {
        self.out.flush()
    }
}
