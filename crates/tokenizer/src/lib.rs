//! Tokenizer and chat template of a GGUF model, matching llama.cpp token for token.
//!
//! A model only answers well to the exact token ids it was trained on, and strata is checked
//! against llama.cpp, so this crate reproduces llama.cpp's tokenizer rather than a generic one:
//! the same pre-tokenizer per `tokenizer.ggml.pre`, the same special-token matching order, the
//! same end-of-generation set and the same detokenization. Golden ids produced by llama.cpp itself
//! (`scripts/make-tokenizer-vectors.py`) pin that down in the tests.
//!
//! Main types:
//! - [`Tokenizer`]: text ⇄ ids from GGUF metadata ([`Tokenizer::from_gguf`]).
//! - [`StreamDecoder`]: turns generated ids into text as soon as it is complete UTF-8.
//! - [`ChatTemplate`]: renders `tokenizer.chat_template` (Jinja) for a conversation.
//!
//! This crate sits next to `strata-gguf` at the bottom of the workspace: it reads metadata only,
//! and must never depend on the kernels, the engine or anything above them.
#![warn(missing_docs)]

mod bpe;
mod error;
mod jinja_compat;
mod pretokenize;
mod special;
mod spm;
mod stream;
mod template;
#[cfg(test)]
mod testutil;
mod vocab;

pub use error::{Error, Result};
pub use stream::StreamDecoder;
pub use template::{BUILTIN_TEMPLATES, ChatMessage, ChatTemplate, RenderOptions};

use strata_gguf::Metadata;

use bpe::BpeEncoder;
use special::Fragment;
use spm::SpmEncoder;
use vocab::{Kind, Vocab};

/// The algorithm that turns a text fragment into ids.
#[derive(Debug)]
enum Encoder {
    Bpe(Box<BpeEncoder>),
    Spm(SpmEncoder),
}

/// A model's tokenizer: encodes text to token ids and decodes ids back, as llama.cpp does.
///
/// Built once per model and shared (`&self` everywhere; it is `Send + Sync`).
pub struct Tokenizer {
    vocab: Vocab,
    encoder: Encoder,
    add_bos: bool,
    add_eos: bool,
    /// SentencePiece: prefix a space to text that starts the input or follows a special token;
    /// decoding then drops one leading space of the first token.
    add_space_prefix: bool,
    clean_spaces: bool,
}

impl std::fmt::Debug for Tokenizer {
    /// A summary: the vocabulary itself is far too large to print.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let kind = match self.encoder {
            Encoder::Bpe(_) => "bpe",
            Encoder::Spm(_) => "spm",
        };
        f.debug_struct("Tokenizer")
            .field("kind", &kind)
            .field("vocab_size", &self.vocab.len())
            .field("bos", &self.vocab.ids.bos)
            .field("eos", &self.vocab.ids.eos)
            .field("eog", &self.vocab.eog)
            .field("add_bos", &self.add_bos)
            .finish_non_exhaustive()
    }
}

/// An optional boolean metadata key: absent means `default`, present but not a bool is an error.
fn opt_bool(md: &Metadata, key: &str, default: bool) -> Result<bool> {
    match md.get(key) {
        None => Ok(default),
        Some(_) => Ok(md.get_bool(key)?),
    }
}

impl Tokenizer {
    /// Builds the tokenizer from `tokenizer.*` metadata.
    ///
    /// Supports byte-level BPE (`tokenizer.ggml.model = "gpt2"`) with the pre-tokenizers listed
    /// in [`Error::UnsupportedPre`], and SentencePiece (`"llama"`, e.g. Gemma 3). Anything else
    /// is a typed error naming the value, never a best-effort tokenizer.
    pub fn from_gguf(md: &Metadata) -> Result<Tokenizer> {
        let model = md.get_str("tokenizer.ggml.model")?;
        let tok = match model {
            "gpt2" => {
                let pre = match md.get("tokenizer.ggml.pre") {
                    None => "",
                    Some(_) => md.get_str("tokenizer.ggml.pre")?,
                };
                let cfg = pretokenize::config_for(pre)?;
                let vocab = Vocab::from_gguf(md, Kind::Bpe)?;
                let merges = md.get_str_array("tokenizer.ggml.merges")?;
                let encoder = Encoder::Bpe(Box::new(BpeEncoder::new(&vocab, merges, &cfg)?));
                Tokenizer {
                    vocab,
                    encoder,
                    add_bos: opt_bool(md, "tokenizer.ggml.add_bos_token", cfg.add_bos)?,
                    add_eos: opt_bool(md, "tokenizer.ggml.add_eos_token", false)?,
                    add_space_prefix: opt_bool(md, "tokenizer.ggml.add_space_prefix", false)?,
                    clean_spaces: cfg.clean_spaces,
                }
            }
            "llama" => {
                let vocab = Vocab::from_gguf(md, Kind::Spm)?;
                let encoder = Encoder::Spm(SpmEncoder::new(&vocab));
                Tokenizer {
                    vocab,
                    encoder,
                    add_bos: opt_bool(md, "tokenizer.ggml.add_bos_token", true)?,
                    add_eos: opt_bool(md, "tokenizer.ggml.add_eos_token", false)?,
                    add_space_prefix: opt_bool(md, "tokenizer.ggml.add_space_prefix", true)?,
                    clean_spaces: false,
                }
            }
            other => {
                return Err(Error::UnsupportedModel {
                    model: other.to_string(),
                });
            }
        };
        Ok(tok)
    }

    /// Encodes `text` without adding BOS or EOS.
    ///
    /// With `parse_special`, control tokens written in the text (`<|im_start|>`) become their
    /// ids — use it for rendered chat templates, never for raw user input, or a user could forge
    /// turn boundaries. User-defined tokens are matched either way, as in llama.cpp.
    pub fn encode(&self, text: &str, parse_special: bool) -> Result<Vec<u32>> {
        let mut out = Vec::with_capacity(text.len() / 3 + 1);
        self.encode_into(text, parse_special, true, &mut out)?;
        Ok(out)
    }

    /// Encodes `text` as a piece of a longer text, after its start: no control tokens, and no
    /// SentencePiece space prefix (which llama.cpp adds only where a text begins). A grammar
    /// engine turning forced bytes into tokens needs exactly these bytes back, not ` ` + them.
    pub fn encode_continuation(&self, text: &str) -> Result<Vec<u32>> {
        let mut out = Vec::with_capacity(text.len() / 3 + 1);
        self.encode_into(text, false, false, &mut out)?;
        Ok(out)
    }

    /// Encodes a prompt the way llama.cpp does with `add_special`: BOS first if the model adds
    /// it (`tokenizer.ggml.add_bos_token`, else llama.cpp's default for the tokenizer type), EOS
    /// last if it adds that (embedding models).
    pub fn encode_prompt(&self, text: &str, parse_special: bool) -> Result<Vec<u32>> {
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if self.add_bos {
            out.push(
                self.vocab
                    .ids
                    .bos
                    .ok_or(Error::MissingSpecial { which: "bos" })?,
            );
        }
        self.encode_into(text, parse_special, true, &mut out)?;
        if self.add_eos {
            out.push(
                self.vocab
                    .ids
                    .eos
                    .ok_or(Error::MissingSpecial { which: "eos" })?,
            );
        }
        Ok(out)
    }

    fn encode_into(
        &self,
        text: &str,
        parse_special: bool,
        at_start: bool,
        out: &mut Vec<u32>,
    ) -> Result<()> {
        let mut prev_special = at_start;
        for frag in special::partition(&self.vocab, text, parse_special) {
            match frag {
                Fragment::Token(id) => {
                    out.push(id);
                    prev_special = true;
                }
                Fragment::Text(range) => {
                    let part = &text[range];
                    match &self.encoder {
                        Encoder::Bpe(bpe) => bpe.encode_into(part, out)?,
                        Encoder::Spm(spm) => {
                            let prefix = self.add_space_prefix && prev_special;
                            spm.encode_into(&self.vocab, part, prefix, out);
                        }
                    }
                    prev_special = false;
                }
            }
        }
        Ok(())
    }

    /// Decodes ids to text like `llama_detokenize` (without removing BOS/EOS): with `special`
    /// false, control tokens such as `<|im_end|>` vanish; with it true they appear as text.
    /// Invalid UTF-8 (a cut multi-byte character) becomes U+FFFD; unknown ids are skipped.
    pub fn decode(&self, ids: &[u32], special: bool) -> String {
        let mut bytes = Vec::with_capacity(ids.len() * 4);
        let mut strip_space = self.add_space_prefix;
        for &id in ids {
            let mut piece = self.vocab.piece_for(id, special);
            if strip_space && let Some(rest) = piece.strip_prefix(b" ") {
                piece = rest;
            }
            strip_space = false;
            bytes.extend_from_slice(piece);
        }
        if self.clean_spaces {
            clean_up_spaces(&mut bytes);
        }
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Raw bytes of one token, control tokens included (`llama_token_to_piece` with `special`);
    /// a piece may be part of a multi-byte character, see [`StreamDecoder`]. Empty for an
    /// unknown id.
    pub fn token_bytes(&self, id: u32) -> &[u8] {
        self.vocab.piece(id)
    }

    /// The bytes [`Tokenizer::decode`] produces for `id` alone: with `special` false, control
    /// and unknown tokens give nothing.
    pub fn token_piece(&self, id: u32, special: bool) -> &[u8] {
        self.vocab.piece_for(id, special)
    }

    /// The token's text as stored in the vocabulary (`Ġuser` for a byte-level BPE token).
    pub fn token_text(&self, id: u32) -> Option<&str> {
        self.vocab.texts.get(id as usize).map(String::as_str)
    }

    /// The id of the token whose stored text is exactly `text` (`<|im_end|>`, `Ġuser`).
    pub fn token_id(&self, text: &str) -> Option<u32> {
        self.vocab.by_text.get(text).copied()
    }

    /// Number of tokens in the vocabulary.
    pub fn vocab_size(&self) -> usize {
        self.vocab.len()
    }

    /// Beginning-of-sequence token, if the model has one.
    pub fn bos_id(&self) -> Option<u32> {
        self.vocab.ids.bos
    }

    /// End-of-sequence token, if the model has one.
    pub fn eos_id(&self) -> Option<u32> {
        self.vocab.ids.eos
    }

    /// Whether [`Tokenizer::encode_prompt`] starts with BOS.
    pub fn adds_bos(&self) -> bool {
        self.add_bos
    }

    /// Whether generation must stop at `id`: EOS, EOT and every token llama.cpp recognises as
    /// ending a turn (`<|im_end|>`, `<|endoftext|>`, `<end_of_turn>`, `<|eot_id|>`, FIM markers).
    pub fn is_eog(&self, id: u32) -> bool {
        self.vocab.eog.binary_search(&id).is_ok()
    }

    /// All end-of-generation ids, sorted (for a sampler's or grammar's stop set).
    pub fn eog_ids(&self) -> &[u32] {
        &self.vocab.eog
    }

    /// Whether `id` is a control token (hidden by `decode(.., false)`, parsed only on request).
    pub fn is_control(&self, id: u32) -> bool {
        self.vocab.attr(id) & vocab::attr::CONTROL != 0
    }

    /// A decoder for a stream of generated ids; `special` as in [`Tokenizer::decode`].
    pub fn stream_decoder(&self, special: bool) -> StreamDecoder<&Tokenizer> {
        StreamDecoder::new(self, special)
    }
}

/// llama.cpp's `clean_up_tokenization_spaces` for BPE vocabularies that ask for it: drop the
/// space before `?`, `!`, `.`, `,`, around a lone `'`, and before `'s`, `'m`, `'re`, `'ve`.
///
/// A literal port of its three in-place passes (including how pass 2 blanks the space it drops),
/// so that corner cases such as `a ' ' b` come out byte-identical.
fn clean_up_spaces(text: &mut Vec<u8>) {
    // Pass 1: " ?", " !", " .", " ,".
    let n = text.len();
    let mut total = n.min(1);
    for i in 1..n {
        let x = text[i];
        if text[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
            total -= 1;
        }
        text[total] = x;
        total += 1;
    }
    // Pass 2: " ' " becomes "'".
    let n = total;
    total = n.min(1);
    let mut i = 1;
    while i < n {
        let x = text[i];
        if x == b'\'' && i + 1 < n && text[i - 1] == b' ' && text[i + 1] == b' ' {
            total -= 1;
            i += 1;
            text[i] = 0;
        }
        text[total] = x;
        total += 1;
        i += 1;
    }
    // Pass 3: " 's", " 'm", " 're", " 've" lose the space (" 't", " 'd", " 'll" keep it).
    let n = total;
    total = n.min(1);
    for i in 1..n {
        let x = text[i];
        if text[i - 1] == b' ' && x == b'\'' && i + 1 < n {
            let x1 = text[i + 1];
            let x2 = if i + 2 < n { Some(text[i + 2]) } else { None };
            let drop = match x1 {
                b't' | b'd' => false,
                b's' | b'm' => true,
                b'r' | b'v' => x2 == Some(b'e'),
                _ => false,
            };
            if drop {
                total -= 1;
            }
        }
        text[total] = x;
        total += 1;
    }
    text.truncate(total);
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::testutil::{BYTE, CONTROL, NORMAL, gguf, string, strings};
    use strata_gguf::{Array, Value};

    /// A tiny SentencePiece vocabulary: `▁a` outranks `ab`, `c` only exists as a byte.
    fn spm(extra: Vec<(&str, Value)>) -> Tokenizer {
        let tokens = [
            ("<unk>", 2),
            ("<s>", CONTROL),
            ("</s>", CONTROL),
            ("\u{2581}", NORMAL),
            ("a", NORMAL),
            ("b", NORMAL),
            ("\u{2581}a", NORMAL),
            ("ab", NORMAL),
            ("<0x63>", BYTE),
        ];
        let scores = vec![0.0, 0.0, 0.0, -5.0, -3.0, -3.0, -1.0, -2.0, 0.0];
        let mut kv = vec![("tokenizer.ggml.scores", Value::Array(Array::F32(scores)))];
        kv.extend(extra);
        Tokenizer::from_gguf(gguf("llama", &tokens, kv).metadata()).unwrap()
    }

    #[test]
    fn sentencepiece_merges_by_score_and_falls_back_to_bytes() {
        let tok = spm(vec![]);
        assert_eq!(tok.encode("ab", false).unwrap(), [6, 5]);
        assert_eq!(tok.encode_prompt("ab", false).unwrap(), [1, 6, 5]);
        assert_eq!(tok.encode("c", false).unwrap(), [3, 8]);
        // A space prefix follows special tokens too; decoding drops the first one.
        assert_eq!(tok.encode("<s>ab", true).unwrap(), [1, 6, 5]);
        assert_eq!(tok.decode(&[6, 5, 3, 8], false), "ab c");
        assert_eq!(tok.decode(&[1, 6, 5], true), "<s> ab");
    }

    #[test]
    fn sentencepiece_respects_add_space_prefix_false() {
        let tok = spm(vec![(
            "tokenizer.ggml.add_space_prefix",
            Value::Bool(false),
        )]);
        assert_eq!(tok.encode("ab", false).unwrap(), [7]);
    }

    #[test]
    fn a_continuation_has_no_space_prefix_and_no_control_tokens() {
        let tok = spm(vec![]);
        assert_eq!(tok.encode("ab", false).unwrap(), [6, 5]);
        assert_eq!(tok.encode_continuation("ab").unwrap(), [7]);
        assert_eq!(
            tok.decode(&tok.encode_continuation("c ab").unwrap(), false),
            "c ab"
        );
        assert_eq!(
            tok.encode_continuation("<s>").unwrap(),
            tok.encode("<s>", false).unwrap()[1..]
        );
    }

    #[test]
    fn unsupported_models_and_pre_tokenizers_are_named() {
        let md = gguf("bert", &[("a", NORMAL)], vec![]);
        let err = Tokenizer::from_gguf(md.metadata()).unwrap_err();
        assert!(matches!(err, Error::UnsupportedModel { .. }), "{err}");
        assert!(err.to_string().contains("\"bert\""), "{err}");

        let md = gguf(
            "gpt2",
            &[("a", NORMAL)],
            vec![
                ("tokenizer.ggml.pre", string("deepseek-coder")),
                ("tokenizer.ggml.merges", strings(&[])),
            ],
        );
        let err = Tokenizer::from_gguf(md.metadata()).unwrap_err();
        assert!(err.to_string().contains("\"deepseek-coder\""), "{err}");

        let md = gguf(
            "gpt2",
            &[("a", NORMAL)],
            vec![("tokenizer.ggml.merges", strings(&[]))],
        );
        let err = Tokenizer::from_gguf(md.metadata()).unwrap_err();
        assert!(
            err.to_string().contains("tokenizer.ggml.pre = \"\""),
            "{err}"
        );
    }

    #[test]
    fn bpe_without_bos_cannot_add_one() {
        let md = gguf(
            "gpt2",
            &[("a", NORMAL)],
            vec![
                ("tokenizer.ggml.pre", string("llama-bpe")),
                ("tokenizer.ggml.merges", strings(&[])),
            ],
        );
        let tok = Tokenizer::from_gguf(md.metadata()).unwrap();
        assert!(tok.adds_bos(), "llama-bpe adds BOS by default");
        let err = tok.encode_prompt("a", false).unwrap_err();
        assert!(
            matches!(err, Error::MissingSpecial { which: "bos" }),
            "{err}"
        );
    }

    fn clean(s: &str) -> String {
        let mut v = s.as_bytes().to_vec();
        clean_up_spaces(&mut v);
        String::from_utf8_lossy(&v).into_owned()
    }

    #[test]
    fn shared_types_are_send_and_sync() {
        fn check<T: Send + Sync>() {}
        check::<Tokenizer>();
        check::<ChatTemplate>();
    }

    #[test]
    fn clean_up_spaces_matches_llama_cpp_rules() {
        assert_eq!(clean("Hello , world !"), "Hello, world!");
        assert_eq!(clean("a ' b"), "a'b");
        assert_eq!(
            clean("it 's I 'm we 're they 've"),
            "it's I'm we're they've"
        );
        assert_eq!(clean("don 't I 'll he 'd"), "don 't I 'll he 'd");
        // Pass 2 blanks the space it removes, so a second quote right after is kept apart.
        assert_eq!(clean("a ' ' b"), "a'' b");
    }
}
