//! SHA-256 helpers shared by pulling (hash while writing), verifying (re-hash a file) and
//! importing (hash while copying).

use std::fs::File;
use std::io::{ErrorKind, Read, Write};
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

/// Reads `src` to its end in [`CHUNK`]-sized pieces and hands each to `each`, retrying
/// interrupted reads. `action` and `origin` name the read in errors ("reading", the path).
///
/// Every loop over model bytes (pulling, verifying, importing) goes through here, so they all
/// treat short reads and interruptions alike.
pub(crate) fn for_each_chunk(
    src: &mut dyn Read,
    action: &'static str,
    origin: &Path,
    each: &mut dyn FnMut(&[u8]) -> Result<()>,
) -> Result<()> {
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = match src.read(&mut buf) {
            Ok(0) => return Ok(()),
            Ok(n) => n,
            Err(e) if e.kind() == ErrorKind::Interrupted => continue,
            Err(e) => return Err(e).at(action, origin),
        };
        each(&buf[..n])?;
    }
}

/// Size and lowercase hex SHA-256 of everything `src` yields, writing each piece to `copy_to`
/// (a file and its path, for errors) as well when given, so a copy is hashed in the same pass
/// that makes it.
pub(crate) fn hash_stream(
    src: &mut dyn Read,
    origin: &Path,
    mut copy_to: Option<(&mut File, &Path)>,
) -> Result<(u64, String)> {
    let mut hasher = Sha256::new();
    let mut size = 0u64;
    for_each_chunk(src, "reading", origin, &mut |piece| {
        hasher.update(piece);
        size += piece.len() as u64;
        if let Some((out, out_path)) = copy_to.as_mut() {
            out.write_all(piece).at("writing", out_path)?;
        }
        Ok(())
    })?;
    Ok((size, to_hex(&hasher.finalize())))
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
    let mut done = 0u64;
    for_each_chunk(&mut file, "reading", path, &mut |piece| {
        hasher.update(piece);
        done += piece.len() as u64;
        on_event(PullEvent::Progress {
            done,
            total: card.size,
        });
        Ok(())
    })?;
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
