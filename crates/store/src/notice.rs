//! How the store tells its user something outside a call's result: a pull's progress lines, a
//! skipped import. A library must not decide where a process's output goes, so each is a
//! `tracing` event: a process that logs (a node, `strata serve`) files it with the rest of its
//! log, a one-shot command shows it to its user as a plain line.

use std::fmt::Display;

/// Reports a step of the store's work.
pub(crate) fn info(what: &dyn Display) {
    tracing::info!("{what}");
}

/// Reports something the store skipped or could not do, and carried on without.
pub(crate) fn warn(what: &dyn Display) {
    tracing::warn!("{what}");
}
