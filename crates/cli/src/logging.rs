//! Where the long-running commands (`serve`, `node`, `worker`) log: `tracing` events to
//! standard error, one line each with the time, level and the spans they happened in (an
//! instance's id and epoch, a request's method and path). `STRATA_LOG` takes `tracing`'s
//! filter syntax (`debug`, `strata_node=debug,warn`); by default strata's own crates log at
//! `info` and the libraries under them (zenoh, hyper) only warnings. The HTTP surfaces' access
//! lines (`strata::access`) are among strata's own: `STRATA_LOG=info,strata::access=off` (or
//! `--quiet`) turns them off.

use std::io::IsTerminal;
use tracing_subscriber::EnvFilter;

/// The filter when `STRATA_LOG` is not set.
const DEFAULT: &str =
    "warn,strata=info,strata_node=info,strata_api=info,strata_parallel=info,strata_store=info";

/// How the long-running commands write their log lines.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum LogFormat {
    /// One line of text per event.
    Text,
    /// One JSON object per line (`timestamp`, `level`, `fields`, `target`, `spans`), for log
    /// shippers.
    Json,
}

/// Installs the subscriber (once; a second call changes nothing). A `STRATA_LOG` that does not
/// parse is reported and the default used.
pub(crate) fn init(format: LogFormat) {
    let filter = match std::env::var("STRATA_LOG") {
        Ok(spec) if !spec.trim().is_empty() => EnvFilter::try_new(&spec).unwrap_or_else(|e| {
            eprintln!("strata: STRATA_LOG={spec:?} is not a log filter ({e}); using {DEFAULT:?}");
            EnvFilter::new(DEFAULT)
        }),
        _ => EnvFilter::new(DEFAULT),
    };
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Text => fmt
            .with_ansi(std::io::stderr().is_terminal())
            .with_target(false)
            .try_init(),
        LogFormat::Json => fmt.json().with_ansi(false).try_init(),
    };
}

/// The filter of the one-shot commands when `STRATA_LOG` is not set: what the store reports
/// (a pull's progress, a skipped import) and every library's warnings.
const DEFAULT_PLAIN: &str = "warn,strata_store=info";

/// Installs the subscriber of a one-shot command (`run`, `models`, `load`...): events as plain
/// `strata: ...` lines on standard error, as the command's own messages are, with no time or
/// level beyond a `warning:` or `error:`. The libraries report through `tracing` alone; this is
/// where a command's user sees it.
pub(crate) fn init_plain() {
    let filter = std::env::var("STRATA_LOG")
        .ok()
        .filter(|s| !s.trim().is_empty())
        .and_then(|s| EnvFilter::try_new(s).ok())
        .unwrap_or_else(|| EnvFilter::new(DEFAULT_PLAIN));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .event_format(Plain)
        .try_init();
}

/// `strata: [warning: |error: ]MESSAGE [FIELDS]`.
struct Plain;

impl<S, N> tracing_subscriber::fmt::FormatEvent<S, N> for Plain
where
    S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    N: for<'a> tracing_subscriber::fmt::FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &tracing_subscriber::fmt::FmtContext<'_, S, N>,
        mut w: tracing_subscriber::fmt::format::Writer<'_>,
        event: &tracing::Event<'_>,
    ) -> std::fmt::Result {
        let level = *event.metadata().level();
        let tag = if level == tracing::Level::ERROR {
            "error: "
        } else if level == tracing::Level::WARN {
            "warning: "
        } else {
            ""
        };
        write!(w, "strata: {tag}")?;
        ctx.field_format().format_fields(w.by_ref(), event)?;
        writeln!(w)
    }
}
