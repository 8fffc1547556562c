//! Pre-tokenizer rules for byte-level BPE, selected by `tokenizer.ggml.pre`.
//!
//! A BPE vocabulary only reproduces the model's training-time token ids if the text is first cut
//! into words exactly as the original tokenizer cut it. llama.cpp keys those rules on the
//! `tokenizer.ggml.pre` string and also ties a few behaviours to it (whether BOS is added by
//! default, whether whole words found in the vocabulary skip merging, whether decoding cleans up
//! spaces before punctuation). This module is that table for the families we support; anything
//! else is rejected with [`Error::UnsupportedPre`] rather than tokenized subtly wrong.
//!
//! The regexes are the upstream Hugging Face ones, run with `fancy-regex` (look-ahead needed).
//! Where llama.cpp rewrote a case-insensitive group `(?i:'s|...)` into explicit classes, we use
//! the rewrite: Unicode case folding would also let `'ſ` match `'s`, which llama.cpp does not.

use tokenizers::SplitDelimiterBehavior;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};

use crate::{Error, Result};

/// GPT-2's word pattern: contractions, letter runs, digit runs, symbol runs (each with an optional
/// leading space), and whitespace not followed by a word.
const GPT2: &str = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+";

/// StarCoder first isolates every digit, then applies GPT-2's pattern.
const DIGIT: &str = r"\p{N}";

/// Llama 3: digits in groups of up to three, a non-letter may lead a letter run, newlines
/// attach to preceding symbols.
const LLAMA3: &str = concat!(
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])",
    r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);

/// Qwen2: Llama 3's pattern with single digits.
const QWEN2: &str = concat!(
    r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])",
    r"|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
);

/// What `tokenizer.ggml.pre` implies, per llama.cpp.
#[derive(Clone, Copy, Debug)]
pub(crate) struct PreConfig {
    /// Regexes applied in turn; every match and every gap between matches becomes a piece.
    pub(crate) regexes: &'static [&'static str],
    /// A pre-tokenized word that is itself a token is emitted whole, without merging.
    pub(crate) ignore_merges: bool,
    /// Default for `tokenizer.ggml.add_bos_token` when the metadata does not say.
    pub(crate) add_bos: bool,
    /// Decoding removes the space in ` ?`, ` !`, ` .`, ` ,` and before some contractions
    /// (`clean_up_tokenization_spaces`).
    pub(crate) clean_spaces: bool,
}

const STARCODER_RULES: &[&str] = &[DIGIT, GPT2];
const GPT2_RULES: &[&str] = &[GPT2];
const LLAMA3_RULES: &[&str] = &[LLAMA3];
const QWEN2_RULES: &[&str] = &[QWEN2];

/// The `tokenizer.ggml.pre` values we accept, for error messages.
pub(crate) const SUPPORTED: &str = "smollm, starcoder, refact, command-r, codeshell, exaone, \
     minerva-7b, gpt-2, phi-2, mpt, olmo, jais, exaone4, llama3, llama-v3, llama-bpe, falcon3, \
     pixtral, qwen2, deepseek-r1-qwen, megrez";

/// Looks up the rules for a `tokenizer.ggml.pre` value.
pub(crate) fn config_for(pre: &str) -> Result<PreConfig> {
    let cfg = |regexes, ignore_merges, add_bos, clean_spaces| PreConfig {
        regexes,
        ignore_merges,
        add_bos,
        clean_spaces,
    };
    Ok(match pre {
        // Same split rules; only the decode-time space cleanup differs.
        "smollm" | "command-r" => cfg(STARCODER_RULES, false, false, false),
        "starcoder" | "refact" | "codeshell" | "exaone" | "minerva-7b" => {
            cfg(STARCODER_RULES, false, false, true)
        }
        // llama.cpp spells it "gpt-2"; "gpt2" is accepted as the obvious alias.
        "gpt-2" | "gpt2" | "phi-2" | "mpt" | "olmo" | "jais" | "exaone4" => {
            cfg(GPT2_RULES, false, false, true)
        }
        "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "pixtral" => {
            cfg(LLAMA3_RULES, true, true, true)
        }
        "qwen2" | "deepseek-r1-qwen" => cfg(QWEN2_RULES, false, false, false),
        "megrez" => cfg(QWEN2_RULES, false, false, true),
        other => {
            return Err(Error::UnsupportedPre {
                pre: other.to_string(),
                supported: SUPPORTED.to_string(),
            });
        }
    })
}

/// Builds the Hugging Face pre-tokenizer: the regex splits, then the GPT-2 byte-to-character
/// mapping. `ByteLevel` runs with its own regex and prefix space off: the splits above already
/// are the words, and llama.cpp never inserts a leading space for BPE models (the bug that
/// turned `<|im_start|>user` into `Ġuser`).
pub(crate) fn build(cfg: &PreConfig) -> Result<Sequence> {
    let mut steps = Vec::with_capacity(cfg.regexes.len() + 1);
    for re in cfg.regexes {
        let split = Split::new(
            SplitPattern::Regex((*re).to_string()),
            SplitDelimiterBehavior::Isolated,
            false,
        )
        .map_err(|e| Error::Bpe(format!("pre-tokenizer regex {re:?}: {e}")))?;
        steps.push(PreTokenizerWrapper::Split(split));
    }
    steps.push(PreTokenizerWrapper::ByteLevel(ByteLevel::new(
        false, false, false,
    )));
    Ok(Sequence::new(steps))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use tokenizers::{OffsetReferential, OffsetType, PreTokenizedString, PreTokenizer};

    fn words(pre: &str, text: &str) -> Vec<String> {
        let seq = build(&config_for(pre).unwrap()).unwrap();
        let mut pts = PreTokenizedString::from(text);
        seq.pre_tokenize(&mut pts).unwrap();
        pts.get_splits(OffsetReferential::Original, OffsetType::Byte)
            .into_iter()
            .map(|(s, _, _)| s.to_string())
            .collect()
    }

    #[test]
    fn starcoder_isolates_digits_and_keeps_words_with_their_space() {
        assert_eq!(
            words("smollm", "hi  there 123"),
            ["hi", "Ġ", "Ġthere", "Ġ", "1", "2", "3"]
        );
    }

    #[test]
    fn llama3_groups_digits_by_three() {
        assert_eq!(words("llama-bpe", "12345"), ["123", "45"]);
    }

    #[test]
    fn unknown_pre_is_a_typed_error_naming_it() {
        let err = config_for("falcon").unwrap_err();
        assert!(err.to_string().contains("\"falcon\""), "{err}");
    }
}
