//! Byte-level BPE (`tokenizer.ggml.model = "gpt2"`) on top of the `tokenizers` crate.
//!
//! The vocabulary and merge list come straight from GGUF; the pre-tokenizer comes from
//! [`crate::pretokenize`]. Special tokens are *not* registered with `tokenizers`: its
//! added-token matcher is leftmost-longest, llama.cpp's is longest-token-first over the whole
//! text (see [`crate::special`]), and the two disagree on overlapping matches. So this module
//! only ever sees text fragments that lie between special tokens, and runs the pre-tokenizer and
//! the BPE model on them directly, bypassing `tokenizers::Tokenizer` and its added vocabulary.

use tokenizers::models::bpe::{BPE, Vocab as HfVocab};
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::{Model, OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};

use crate::pretokenize::PreConfig;
use crate::vocab::Vocab;
use crate::{Error, Result};

/// A byte-level BPE encoder for text without special tokens.
pub(crate) struct BpeEncoder {
    pre: Sequence,
    model: BPE,
}

impl std::fmt::Debug for BpeEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BpeEncoder").finish_non_exhaustive()
    }
}

impl BpeEncoder {
    /// Builds the encoder from the vocabulary and `tokenizer.ggml.merges`.
    ///
    /// Merges are `"left right"` split at the first space after the first byte, as llama.cpp
    /// does. Merges whose parts or result are not tokens are dropped (`tokenizers` cannot
    /// represent them, and the result could never be emitted anyway); a repeated pair keeps its
    /// first, best rank.
    pub(crate) fn new(vocab: &Vocab, merges: &[String], cfg: &PreConfig) -> Result<BpeEncoder> {
        let hf_vocab: HfVocab = vocab
            .by_text
            .iter()
            .map(|(t, &id)| (t.clone(), id))
            .collect();
        let mut seen = std::collections::HashSet::with_capacity(merges.len());
        let mut pairs = Vec::with_capacity(merges.len());
        for m in merges {
            // Byte-wise like llama.cpp's `find(' ', 1)`: the first byte may start a multi-byte
            // character (`Ġ`), and a space found after it is always a character boundary.
            let Some(pos) = m.bytes().skip(1).position(|b| b == b' ').map(|p| p + 1) else {
                continue;
            };
            let (a, b) = (&m[..pos], &m[pos + 1..]);
            if !(hf_vocab.contains_key(a)
                && hf_vocab.contains_key(b)
                && hf_vocab.contains_key(&format!("{a}{b}")))
            {
                continue;
            }
            if seen.insert((a, b)) {
                pairs.push((a.to_string(), b.to_string()));
            }
        }
        let model = BPE::builder()
            .vocab_and_merges(hf_vocab, pairs)
            .ignore_merges(cfg.ignore_merges)
            .build()
            .map_err(|e| Error::Bpe(format!("building the BPE model: {e}")))?;
        Ok(BpeEncoder {
            pre: crate::pretokenize::build(cfg)?,
            model,
        })
    }

    /// Appends the ids of `text` (which must contain no special tokens to be matched) to `out`.
    pub(crate) fn encode_into(&self, text: &str, out: &mut Vec<u32>) -> Result<()> {
        if text.is_empty() {
            return Ok(());
        }
        let mut pts = PreTokenizedString::from(text);
        self.pre
            .pre_tokenize(&mut pts)
            .map_err(|e| Error::Bpe(format!("pre-tokenizing: {e}")))?;
        for (word, _, _) in pts.get_splits(OffsetReferential::Original, OffsetType::Byte) {
            let tokens = self
                .model
                .tokenize(word)
                .map_err(|e| Error::Bpe(format!("merging {word:?}: {e}")))?;
            out.extend(tokens.iter().map(|t| t.id));
        }
        Ok(())
    }
}

/// GPT-2's byte → character table: printable Latin-1 bytes stand for themselves, the other 68
/// bytes are moved to U+0100.. in byte order so every byte has a visible, non-space character.
const fn byte_to_char_table() -> [u16; 256] {
    let mut table = [0u16; 256];
    let mut extra = 0u16;
    let mut b = 0usize;
    while b < 256 {
        let printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
        table[b] = if printable {
            b as u16
        } else {
            extra += 1;
            0xFF + extra
        };
        b += 1;
    }
    table
}

const BYTE_TO_CHAR: [u16; 256] = byte_to_char_table();

/// Inverse of [`BYTE_TO_CHAR`]: entry `c` is `byte + 1` for mapped characters, 0 otherwise.
const fn char_to_byte_table() -> [u16; 0x144] {
    let mut table = [0u16; 0x144];
    let mut b = 0usize;
    while b < 256 {
        table[BYTE_TO_CHAR[b] as usize] = b as u16 + 1;
        b += 1;
    }
    table
}

const CHAR_TO_BYTE: [u16; 0x144] = char_to_byte_table();

/// Maps a byte-level token text back to raw bytes. A character outside the byte alphabet is
/// written as `[UNK_BYTE_0x..<text>]`, as llama.cpp does, so that a malformed vocabulary is
/// visible in the output instead of silently dropping text.
pub(crate) fn byte_decode_into(text: &str, out: &mut Vec<u8>) {
    for c in text.chars() {
        match CHAR_TO_BYTE.get(c as usize) {
            Some(&b) if b != 0 => out.push((b - 1) as u8),
            _ => {
                out.extend_from_slice(b"[UNK_BYTE_0x");
                let mut buf = [0u8; 4];
                for byte in c.encode_utf8(&mut buf).bytes() {
                    out.extend_from_slice(format!("{byte:02x}").as_bytes());
                }
                out.extend_from_slice(text.as_bytes());
                out.push(b']');
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn byte_table_matches_gpt2() {
        assert_eq!(BYTE_TO_CHAR[b' ' as usize], 'Ġ' as u16);
        assert_eq!(BYTE_TO_CHAR[b'\n' as usize], 'Ċ' as u16);
        assert_eq!(BYTE_TO_CHAR[b'a' as usize], 'a' as u16);
        assert_eq!(BYTE_TO_CHAR[0xAD], 0x143);
        let mut out = Vec::new();
        byte_decode_into("ĠhelloĊ", &mut out);
        assert_eq!(out, b" hello\n");
    }

    #[test]
    fn every_byte_round_trips() {
        for b in 0..=255u8 {
            let c = char::from_u32(BYTE_TO_CHAR[b as usize] as u32).unwrap_or('?');
            let mut out = Vec::new();
            byte_decode_into(&c.to_string(), &mut out);
            assert_eq!(out, [b]);
        }
    }
}
