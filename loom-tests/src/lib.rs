//! Model tests for eventd's lock-free structures live in `tests/`; they only
//! compile under `RUSTFLAGS="--cfg loom"`. See `tests/channel.rs` for how to run
//! them.
