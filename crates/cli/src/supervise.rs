//! Keeps `strata serve` and `strata node` running through crashes that no panic handler sees.
//!
//! A stack overflow or a failed allocation aborts the process (SIGABRT) instead of panicking,
//! and the OOM killer sends SIGKILL: nothing inside the process can catch either. So the command
//! runs as a child of a thin parent (the same binary, re-executed with [`ENV`] set) that waits
//! for it and starts it again when it dies of a signal, after a pause that doubles with each
//! quick failure, giving up after [`QUICK_FAILURES`] in a row. A clean exit, an error exit (a
//! bad flag, a port in use) and a stop the parent forwarded (SIGTERM, SIGINT, SIGHUP) end the
//! parent too, with the child's code. A restarted node leaves the cluster and joins it again
//! through the usual membership. `--no-supervise` runs the command in this process instead.
//!
//! The child runs in its own process group, so a terminal's Ctrl-C reaches it once (through the
//! parent) rather than twice, and it is sent SIGTERM should the parent itself die.

use std::ffi::OsString;
use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
use std::process::{Child, Command, ExitCode, ExitStatus};
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

/// Set in the child's environment: the process that sees it is the one supervised.
const ENV: &str = "STRATA_SUPERVISED";
/// A child that dies sooner than this after starting counts as a quick failure.
const QUICK: Duration = Duration::from_secs(30);
/// Quick failures in a row after which the parent stops restarting.
const QUICK_FAILURES: u32 = 5;
/// The pause before the first restart; it doubles with each quick failure in a row.
const FIRST_PAUSE: Duration = Duration::from_millis(500);
/// How often the parent looks at its child and at the signals it was sent.
const POLL: Duration = Duration::from_millis(50);

/// The last stop signal the parent was sent and has not yet forwarded (0: none).
static PENDING: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_stop_signal(sig: libc::c_int) {
    // Only an atomic store: nothing else is safe in a signal handler.
    PENDING.store(sig, Ordering::SeqCst);
}

/// Whether this process is the supervised child (or runs unsupervised by request).
pub(crate) fn is_child() -> bool {
    std::env::var_os(ENV).is_some()
}

/// Runs this command line again as a supervised child until it ends for good; `what` names the
/// command in log lines (`strata serve`).
pub(crate) fn run(what: &str) -> ExitCode {
    for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe; the
        // function pointer has the signature signal(2) expects.
        unsafe {
            libc::signal(
                sig,
                on_stop_signal as extern "C" fn(libc::c_int) as libc::sighandler_t,
            );
        }
    }
    let exe = match std::env::current_exe() {
        Ok(e) => e,
        Err(e) => {
            tracing::error!("{what}: finding this program to supervise it: {e}");
            return ExitCode::FAILURE;
        }
    };
    let args: Vec<OsString> = std::env::args_os().skip(1).collect();
    let mut quick = 0u32;
    let mut restarts = 0u32;
    loop {
        let started = Instant::now();
        let mut child = match spawn(&exe, &args) {
            Ok(c) => c,
            Err(e) => {
                tracing::error!("{what}: starting {}: {e}", exe.display());
                return ExitCode::FAILURE;
            }
        };
        let (status, stopped) = wait(&mut child);
        // A stop, forwarded or sent to the child itself, is not a crash.
        let stop = |s: &i32| matches!(*s, libc::SIGTERM | libc::SIGINT | libc::SIGHUP);
        let Some(sig) = status.signal().filter(|s| !stopped && !stop(s)) else {
            return exit_code(status);
        };
        quick = if started.elapsed() < QUICK {
            quick + 1
        } else {
            1
        };
        let core = if status.core_dumped() {
            " (core dumped)"
        } else {
            ""
        };
        if quick >= QUICK_FAILURES {
            tracing::error!(
                "{what} (pid {}) died of {}{core}, {quick} times in a row within {} s of \
                 starting; not restarting it again",
                child.id(),
                signal_name(sig),
                QUICK.as_secs()
            );
            return exit_code(status);
        }
        restarts += 1;
        let pause = FIRST_PAUSE * 2u32.pow(quick.saturating_sub(1));
        tracing::error!(
            "{what} (pid {}) died of {}{core}; restarting it in {:.1} s (restart {restarts})",
            child.id(),
            signal_name(sig),
            pause.as_secs_f64()
        );
        if stop_during(pause) {
            return ExitCode::SUCCESS;
        }
    }
}

/// Starts the child: this program with these arguments, in its own process group, told to
/// stop (SIGTERM) when its parent dies.
fn spawn(exe: &std::path::Path, args: &[OsString]) -> std::io::Result<Child> {
    let mut cmd = Command::new(exe);
    cmd.args(args).env(ENV, "1").process_group(0);
    strata_node::process::stop_with_parent(&mut cmd);
    cmd.spawn()
}

/// Waits for the child, forwarding each stop signal the parent is sent; its status, and
/// whether a stop was forwarded.
fn wait(child: &mut Child) -> (ExitStatus, bool) {
    let mut stopped = false;
    loop {
        let sig = PENDING.swap(0, Ordering::SeqCst);
        if sig != 0 {
            stopped = true;
            // SAFETY: kill(2) on our own child's pid, which stays ours until it is reaped.
            unsafe { libc::kill(child.id() as libc::pid_t, sig) };
        }
        match child.try_wait() {
            Ok(Some(status)) => return (status, stopped),
            Ok(None) => std::thread::sleep(POLL),
            Err(e) => {
                tracing::error!("waiting for pid {}: {e}", child.id());
                return (ExitStatus::from_raw(1 << 8), true);
            }
        }
    }
}

/// Sleeps for `pause` unless a stop signal comes first; whether one came.
fn stop_during(pause: Duration) -> bool {
    let until = Instant::now() + pause;
    while Instant::now() < until {
        if PENDING.swap(0, Ordering::SeqCst) != 0 {
            return true;
        }
        std::thread::sleep(POLL);
    }
    false
}

/// The parent's exit code for a child's status: its code, or 128 + the signal, as a shell
/// reports it.
fn exit_code(status: ExitStatus) -> ExitCode {
    match (status.code(), status.signal()) {
        (Some(c), _) => ExitCode::from(u8::try_from(c).unwrap_or(1)),
        (None, Some(s)) => ExitCode::from(u8::try_from(128 + s).unwrap_or(1)),
        (None, None) => ExitCode::FAILURE,
    }
}

/// A signal's name (`SIGABRT`), or its number.
fn signal_name(sig: i32) -> String {
    let name = match sig {
        libc::SIGABRT => "SIGABRT",
        libc::SIGSEGV => "SIGSEGV",
        libc::SIGBUS => "SIGBUS",
        libc::SIGILL => "SIGILL",
        libc::SIGFPE => "SIGFPE",
        libc::SIGKILL => "SIGKILL",
        libc::SIGTERM => "SIGTERM",
        libc::SIGINT => "SIGINT",
        libc::SIGHUP => "SIGHUP",
        libc::SIGPIPE => "SIGPIPE",
        _ => return format!("signal {sig}"),
    };
    name.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_killed_by_a_signal_exits_the_parent_as_a_shell_would_say() {
        assert_eq!(exit_code(ExitStatus::from_raw(0)), ExitCode::SUCCESS);
        assert_eq!(exit_code(ExitStatus::from_raw(2 << 8)), ExitCode::from(2));
        assert_eq!(
            exit_code(ExitStatus::from_raw(libc::SIGABRT)),
            ExitCode::from(134)
        );
        assert_eq!(signal_name(libc::SIGABRT), "SIGABRT");
        assert_eq!(signal_name(64), "signal 64");
    }
}
