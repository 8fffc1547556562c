//! Child processes that must not outlive the process that started them.
//!
//! Linux does this in the kernel: PR_SET_PDEATHSIG, set between fork and exec, signals the child
//! when its parent dies. macOS has no such flag, so there the child watches for itself: the
//! parent passes its pid (and the signal) in `PARENT_ENV`, and the child, first thing in
//! `main`, calls `watch_parent` (both macOS only), which asks kqueue for the parent's exit
//! (EVFILT_PROC with NOTE_EXIT) and sends itself the signal when it comes. Every child strata starts this way is
//! the `strata` binary itself, so the watcher is always there to start.

use std::process::Command;

/// Makes the child get SIGKILL when its parent dies, so a killed node or rank 0 never leaves
/// orphaned ranks holding memory and ports.
#[cfg(target_os = "linux")]
pub fn die_with_parent(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: prctl is async-signal-safe and touches no memory of the parent.
    unsafe {
        cmd.pre_exec(|| {
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// Makes the child get SIGTERM when its parent dies (a supervised `strata serve` or `strata
/// node` then stops cleanly), and exit at once if the parent is already gone by the time it
/// starts.
#[cfg(target_os = "linux")]
pub fn stop_with_parent(cmd: &mut Command) {
    use std::os::unix::process::CommandExt;
    // SAFETY: getpid(2) is always safe to call.
    let parent = unsafe { libc::getpid() };
    // SAFETY: the closure runs between fork and exec, and calls only prctl(2), getppid(2) and
    // _exit(2), which are async-signal-safe and allocate nothing.
    unsafe {
        cmd.pre_exec(move || {
            libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM);
            // The parent may have died before the line above: then nobody would stop us.
            if libc::getppid() != parent {
                libc::_exit(0);
            }
            Ok(())
        });
    }
}

/// Makes the child get SIGKILL when its parent dies (through [`watch_parent`] in the child),
/// so a killed node or rank 0 never leaves orphaned ranks holding memory and ports.
#[cfg(target_os = "macos")]
pub fn die_with_parent(cmd: &mut Command) {
    cmd.env(
        PARENT_ENV,
        format!("{}:{}", std::process::id(), libc::SIGKILL),
    );
}

/// Makes the child get SIGTERM when its parent dies (through [`watch_parent`] in the child),
/// so a supervised `strata serve` or `strata node` stops cleanly.
#[cfg(target_os = "macos")]
pub fn stop_with_parent(cmd: &mut Command) {
    cmd.env(
        PARENT_ENV,
        format!("{}:{}", std::process::id(), libc::SIGTERM),
    );
}

/// Elsewhere children are reaped by their owner's drop.
#[cfg(not(any(target_os = "linux", target_os = "macos")))]
pub fn die_with_parent(_cmd: &mut Command) {}

/// Elsewhere children are reaped by their owner's drop.
#[cfg(not(any(target_os = "linux", target_os = "macos")))]
pub fn stop_with_parent(_cmd: &mut Command) {}

/// Set by [`die_with_parent`] and [`stop_with_parent`] on macOS: `PID:SIGNAL`, the parent to
/// watch and the signal to take when it exits.
#[cfg(target_os = "macos")]
pub const PARENT_ENV: &str = "STRATA_PARENT_WATCH";

/// Starts watching the parent named in [`PARENT_ENV`] (if any) and takes the signal it names
/// when the parent exits; at once if the parent is already gone. The variable is removed, so
/// the children this process starts do not watch their grandparent.
///
/// # Safety
///
/// Call it before this process starts any thread: it changes the environment, which other
/// threads may be reading.
#[cfg(target_os = "macos")]
pub unsafe fn watch_parent() {
    let Some(value) = std::env::var_os(PARENT_ENV) else {
        return;
    };
    // SAFETY: the caller promises no other thread exists yet.
    unsafe { std::env::remove_var(PARENT_ENV) };
    let parsed = value.to_str().and_then(|v| {
        let (pid, sig) = v.split_once(':')?;
        Some((pid.parse::<libc::pid_t>().ok()?, sig.parse::<i32>().ok()?))
    });
    let Some((parent, sig)) = parsed else {
        tracing::warn!("{PARENT_ENV}={value:?} is not PID:SIGNAL; not watching the parent");
        return;
    };
    let watch = match ExitWatch::new(parent) {
        Ok(w) => Some(w),
        // No such process: the parent is already gone.
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => None,
        Err(e) => {
            tracing::warn!("watching parent {parent} for its exit: {e}");
            return;
        }
    };
    // Registered only now: had the parent died since fork, we were re-parented to launchd and
    // the pid watched above may be another process's. getppid tells either way.
    // SAFETY: getppid(2) has no preconditions.
    let Some(watch) = watch.filter(|_| unsafe { libc::getppid() } == parent) else {
        raise(sig);
        return;
    };
    let spawned = std::thread::Builder::new()
        .name("parent-watch".into())
        .spawn(move || match watch.wait() {
            Ok(()) => raise(sig),
            Err(e) => tracing::warn!("watching parent {parent} for its exit: {e}"),
        });
    if let Err(e) = spawned {
        tracing::warn!("starting the thread that watches parent {parent}: {e}");
    }
}

/// Sends `sig` to this process.
#[cfg(target_os = "macos")]
fn raise(sig: i32) {
    // SAFETY: kill(2) on our own pid with a plain signal number.
    unsafe { libc::kill(libc::getpid(), sig) };
}

/// A kqueue that reports one process's exit.
#[cfg(target_os = "macos")]
struct ExitWatch {
    kq: std::os::fd::OwnedFd,
}

#[cfg(target_os = "macos")]
impl ExitWatch {
    /// Registers for `pid`'s exit; ESRCH if there is no such process.
    fn new(pid: libc::pid_t) -> std::io::Result<ExitWatch> {
        use std::os::fd::{AsRawFd, FromRawFd};
        // SAFETY: kqueue(2) takes no arguments; a non-negative result is a new descriptor we own.
        let fd = unsafe { libc::kqueue() };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor nothing else owns.
        let kq = unsafe { std::os::fd::OwnedFd::from_raw_fd(fd) };
        let change = libc::kevent {
            ident: pid as libc::uintptr_t,
            filter: libc::EVFILT_PROC,
            flags: libc::EV_ADD | libc::EV_ONESHOT,
            fflags: libc::NOTE_EXIT,
            data: 0,
            udata: std::ptr::null_mut(),
        };
        // SAFETY: one change read from a local, no event list to write, no timeout.
        let rc = unsafe {
            libc::kevent(
                kq.as_raw_fd(),
                &change,
                1,
                std::ptr::null_mut(),
                0,
                std::ptr::null(),
            )
        };
        if rc < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(ExitWatch { kq })
    }

    /// Blocks until the process exits.
    fn wait(&self) -> std::io::Result<()> {
        use std::os::fd::AsRawFd;
        loop {
            // SAFETY: an all-zero kevent is a valid value to be overwritten.
            let mut event: libc::kevent = unsafe { std::mem::zeroed() };
            // SAFETY: no changes, room for one event in a local, no timeout.
            let n = unsafe {
                libc::kevent(
                    self.kq.as_raw_fd(),
                    std::ptr::null(),
                    0,
                    &mut event,
                    1,
                    std::ptr::null(),
                )
            };
            if n > 0 && event.fflags & libc::NOTE_EXIT != 0 {
                return Ok(());
            }
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() != std::io::ErrorKind::Interrupted {
                    return Err(e);
                }
            }
        }
    }
}

#[cfg(all(test, target_os = "macos"))]
mod tests {
    use super::*;

    #[test]
    fn the_exit_watch_wakes_when_the_process_exits() {
        let mut child = Command::new("/bin/sleep").arg("30").spawn().expect("sleep");
        let watch = ExitWatch::new(child.id() as libc::pid_t).expect("watch");
        child.kill().expect("kill");
        watch.wait().expect("wait");
        let _ = child.wait();
        // A process that is gone (and reaped) cannot be watched.
        let gone = ExitWatch::new(child.id() as libc::pid_t).err();
        assert_eq!(gone.and_then(|e| e.raw_os_error()), Some(libc::ESRCH));
    }
}
