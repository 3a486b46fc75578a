//! The version line `eventd --version` and `eventctl --version` print:
//! the package version, the git commit the binaries were built from and
//! the cargo profile (`build.rs` provides both).

/// `0.1.0 (commit 40f7a5612ab3, profile dist)`.
pub const VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    " (commit ",
    env!("EVENTD_GIT_COMMIT"),
    ", profile ",
    env!("EVENTD_BUILD_PROFILE"),
    ")"
);
