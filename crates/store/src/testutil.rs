//! Test helpers: wheels built on the spot and fetchers that count, stall or fail, so install
//! logic is tested without pip or a network.

#![allow(clippy::unwrap_used)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use sha2::{Digest, Sha256};
use zip::write::SimpleFileOptions;

use crate::card::{ModelCard, Source, WheelPart};
use crate::digest::to_hex;
use crate::error::{Error, Result};
use crate::fetch::{Fetcher, WheelDir, normalize_name};

/// Writes `{package}-{version}-py3-none-any.whl` into `dir` with the given members (deflated,
/// as real wheels are) plus a dist-info file, and returns its path.
pub(crate) fn build_wheel(
    dir: &Path,
    package: &str,
    version: &str,
    members: &[(&str, &[u8])],
) -> PathBuf {
    let name = normalize_name(package);
    let path = dir.join(format!("{name}-{version}-py3-none-any.whl"));
    let file = std::fs::File::create(&path).unwrap();
    let mut zip = zip::ZipWriter::new(file);
    let options = SimpleFileOptions::default().compression_method(zip::CompressionMethod::Deflated);
    for (member, bytes) in members {
        zip.start_file(*member, options).unwrap();
        zip.write_all(bytes).unwrap();
    }
    zip.start_file(format!("{name}-{version}.dist-info/WHEEL"), options)
        .unwrap();
    zip.write_all(b"Wheel-Version: 1.0\n").unwrap();
    zip.finish().unwrap();
    path
}

/// Deterministic, non-repeating-ish test bytes (so a swapped part changes the hash).
pub(crate) fn bytes(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed) ^ (i >> 8) as u8)
        .collect()
}

/// A card for `id` whose parts are `(package, member)` at version 1.0.0, and whose size and
/// hash are those of `content`.
pub(crate) fn card(id: &str, parts: &[(&str, &str)], content: &[u8]) -> ModelCard {
    ModelCard {
        id: id.to_string(),
        family: "test".to_string(),
        architecture: "llama".to_string(),
        params: "1K".to_string(),
        quant: "F32".to_string(),
        context_length: 64,
        file_name: format!("{id}.gguf"),
        sha256: to_hex(&Sha256::digest(content)),
        size: content.len() as u64,
        license: "MIT".to_string(),
        description: "test model".to_string(),
        source: Source {
            parts: parts
                .iter()
                .map(|(package, member)| WheelPart {
                    package: package.to_string(),
                    version: "1.0.0".to_string(),
                    member: member.to_string(),
                })
                .collect(),
            imported_from: None,
        },
        more_files: Vec::new(),
    }
}

/// A [`WheelDir`] that counts fetches, can stall (to widen race windows) and can fail on a
/// given 1-based call.
pub(crate) struct TestFetcher {
    pub(crate) inner: WheelDir,
    pub(crate) calls: Arc<AtomicUsize>,
    pub(crate) delay: Duration,
    pub(crate) fail_on_call: Option<usize>,
}

impl TestFetcher {
    pub(crate) fn new(dir: &Path) -> TestFetcher {
        TestFetcher {
            inner: WheelDir::new(dir),
            calls: Arc::new(AtomicUsize::new(0)),
            delay: Duration::ZERO,
            fail_on_call: None,
        }
    }
}

impl Fetcher for TestFetcher {
    fn fetch(&self, part: &WheelPart, scratch: &Path) -> Result<PathBuf> {
        let call = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        std::thread::sleep(self.delay);
        if self.fail_on_call == Some(call) {
            return Err(Error::PipFailed {
                package: part.package.clone(),
                version: part.version.clone(),
                status: "exit status: 1".to_string(),
                stderr_tail: "simulated network failure".to_string(),
            });
        }
        self.inner.fetch(part, scratch)
    }
}

/// Every entry under `dir` (recursively), as paths relative to it; empty if `dir` is missing.
pub(crate) fn entries(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(read) = std::fs::read_dir(dir) else {
        return out;
    };
    for entry in read {
        let path = entry.unwrap().path();
        out.push(path.strip_prefix(dir).unwrap().to_path_buf());
        if path.is_dir() {
            for sub in entries(&path) {
                out.push(path.strip_prefix(dir).unwrap().join(sub));
            }
        }
    }
    out.sort();
    out
}
