//! SHA-256 helpers shared by pulling (hash while writing) and verifying (re-hash a file).

use std::fs::File;
use std::io::{ErrorKind, Read};
use std::path::Path;

use sha2::{Digest, Sha256};

use crate::card::ModelCard;
use crate::error::{Error, IoContext, Result};
use crate::progress::PullEvent;

/// Read and write buffer size: large enough that syscalls are not the cost, small enough to
/// give a smooth progress bar.
pub(crate) const CHUNK: usize = 1 << 20;

/// Lowercase hex of a digest.
pub(crate) fn to_hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    let mut s = String::with_capacity(bytes.len() * 2);
    for b in bytes {
        // Writing to a String cannot fail.
        let _ = write!(s, "{b:02x}");
    }
    s
}

/// Checks `path` against `card`: size first (cheap, catches truncation), then the full SHA-256.
/// Reports hashing progress as [`PullEvent::Progress`].
pub(crate) fn check_file(
    card: &ModelCard,
    path: &Path,
    on_event: &mut dyn FnMut(PullEvent<'_>),
) -> Result<()> {
    let mut file = File::open(path).at("opening", path)?;
    let size = file.metadata().at("reading metadata of", path)?.len();
    if size != card.size {
        return Err(Error::SizeMismatch {
            id: card.id.clone(),
            expected: card.size,
            actual: size,
        });
    }
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; CHUNK];
    let mut done = 0u64;
    loop {
        let n = match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e).at("reading", path),
        };
        hasher.update(&buf[..n]);
        done += n as u64;
        on_event(PullEvent::Progress {
            done,
            total: card.size,
        });
    }
    // The file may have changed length under us; the hash covers what was read.
    let actual = to_hex(&hasher.finalize());
    if actual != card.sha256 {
        return Err(Error::HashMismatch {
            id: card.id.clone(),
            expected: card.sha256.clone(),
            actual,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hex_of_known_digest() {
        assert_eq!(
            to_hex(&Sha256::digest(b"abc")),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }
}
