//! Queries: read every shard database in the store directory read-only
//! (R7), filter in SQL, merge in `(ts, cpu, seq)` order; the query server
//! that serves them on a Unix socket. Nothing here writes SQLite or knows
//! the writers.

pub mod boots;
pub mod fanout;
pub mod filter;
pub mod follow;
mod gate;
mod peer;
pub mod protocol;
pub mod server;
mod slots;
mod stats;

pub use crate::store::rows::{EventRow, GapRow};
pub use fanout::FanOut;
pub use filter::{Cursor, Filter, GapCursor, Order, PageCursor};
pub use protocol::Request;
pub use server::{Access, QueryServer, QueryStats};
pub mod client;
pub mod render;
pub mod when;
