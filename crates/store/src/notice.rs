//! How the store tells its user something outside a call's result: a pull's progress lines, a
//! skipped import. A library must not decide where a process's output goes, so each is a
//! `tracing` event, which a process that logs (a node, `strata serve`) formats, files and
//! filters with the rest of its log. A process that installed no subscriber (a one-shot
//! command) would lose them, and these lines are for its user: there, and only there, they go
//! to stderr as plain lines, as the command's own output would.

use std::fmt::Display;

/// Reports a step of the store's work.
pub(crate) fn info(what: &dyn Display) {
    if tracing::dispatcher::has_been_set() {
        tracing::info!("{what}");
    } else {
        eprintln!("strata: {what}");
    }
}

/// Reports something the store skipped or could not do, and carried on without.
pub(crate) fn warn(what: &dyn Display) {
    if tracing::dispatcher::has_been_set() {
        tracing::warn!("{what}");
    } else {
        eprintln!("strata: warning: {what}");
    }
}
