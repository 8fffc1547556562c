//! Where the long-running commands (`serve`, `node`, `worker`) log: `tracing` events to
//! standard error, one line each with the time, level and the spans they happened in (an
//! instance's id and epoch, a request's method and path). `STRATA_LOG` takes `tracing`'s
//! filter syntax (`debug`, `strata_node=debug,warn`); by default strata's own crates log at
//! `info` and the libraries under them (zenoh, hyper) only warnings.

use std::io::IsTerminal;
use tracing_subscriber::EnvFilter;

/// The filter when `STRATA_LOG` is not set.
const DEFAULT: &str =
    "warn,strata=info,strata_node=info,strata_api=info,strata_parallel=info,strata_store=info";

/// Installs the subscriber (once; a second call changes nothing). A `STRATA_LOG` that does not
/// parse is reported and the default used.
pub(crate) fn init() {
    let filter = match std::env::var("STRATA_LOG") {
        Ok(spec) if !spec.trim().is_empty() => EnvFilter::try_new(&spec).unwrap_or_else(|e| {
            eprintln!("strata: STRATA_LOG={spec:?} is not a log filter ({e}); using {DEFAULT:?}");
            EnvFilter::new(DEFAULT)
        }),
        _ => EnvFilter::new(DEFAULT),
    };
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(std::io::stderr().is_terminal())
        .with_target(false)
        .try_init();
}
