//! The token table as llama.cpp sees it: texts, attributes, special ids, the end-of-generation set
//! and each token's decoded bytes.
//!
//! GGUF stores only a coarse `token_type` per token; llama.cpp then *derives* more from token
//! texts (which token ends a turn, which are fill-in-the-middle markers, tokens that look like
//! control tokens but were not typed so). Stop conditions and special-token parsing depend on
//! those derivations, so they are replicated here rule for rule rather than guessed from the
//! types alone — e.g. SmolLM2 declares only `<|im_end|>` as EOS, yet llama.cpp also stops on
//! `<|endoftext|>` and `<reponame>` (its FIM "repo" marker).

use std::collections::HashMap;

use strata_gguf::{Metadata, Value};

use crate::bpe;
use crate::{Error, Result};

/// Token attribute bits, numbered as llama.cpp's `llama_token_attr`.
pub(crate) mod attr {
    pub(crate) const UNKNOWN: u16 = 1 << 0;
    pub(crate) const UNUSED: u16 = 1 << 1;
    pub(crate) const NORMAL: u16 = 1 << 2;
    pub(crate) const CONTROL: u16 = 1 << 3;
    pub(crate) const USER_DEFINED: u16 = 1 << 4;
    pub(crate) const BYTE: u16 = 1 << 5;
    pub(crate) const LSTRIP: u16 = 1 << 7;
    pub(crate) const RSTRIP: u16 = 1 << 8;
}

/// Which tokenizer algorithm the vocabulary belongs to; decides default special ids and how a
/// normal token's text maps back to bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Byte-level BPE (`tokenizer.ggml.model = "gpt2"`): token texts are GPT-2 byte-encoded.
    Bpe,
    /// SentencePiece (`"llama"`): `▁` stands for a space, bytes are `<0xNN>` tokens.
    Spm,
}

/// Ids of the tokens with a role, after metadata and llama.cpp's text-based detection.
#[derive(Clone, Debug, Default)]
pub(crate) struct SpecialIds {
    pub(crate) bos: Option<u32>,
    pub(crate) eos: Option<u32>,
    pub(crate) eot: Option<u32>,
    pub(crate) eom: Option<u32>,
    pub(crate) unk: Option<u32>,
    pub(crate) sep: Option<u32>,
    pub(crate) pad: Option<u32>,
    pub(crate) mask: Option<u32>,
    pub(crate) fim_pre: Option<u32>,
    pub(crate) fim_suf: Option<u32>,
    pub(crate) fim_mid: Option<u32>,
    pub(crate) fim_pad: Option<u32>,
    pub(crate) fim_rep: Option<u32>,
    pub(crate) fim_sep: Option<u32>,
}

/// The loaded vocabulary.
#[derive(Debug)]
pub(crate) struct Vocab {
    pub(crate) texts: Vec<String>,
    pub(crate) attrs: Vec<u16>,
    pub(crate) scores: Vec<f32>,
    pub(crate) by_text: HashMap<String, u32>,
    pub(crate) ids: SpecialIds,
    /// End-of-generation ids, sorted.
    pub(crate) eog: Vec<u32>,
    /// Tokens matched in raw text before pre-tokenization (control, user-defined, unknown),
    /// longest text first — the order llama.cpp tries them in.
    pub(crate) special_cache: Vec<u32>,
    /// Every token's bytes as `llama_token_to_piece(special = true)` gives them, concatenated.
    piece_bytes: Vec<u8>,
    /// `piece_offsets[i]..piece_offsets[i + 1]` is token `i`'s range in `piece_bytes`.
    piece_offsets: Vec<u32>,
}

const TOKENS: &str = "tokenizer.ggml.tokens";
const SCORES: &str = "tokenizer.ggml.scores";
const TOKEN_TYPE: &str = "tokenizer.ggml.token_type";

/// Texts llama.cpp treats as "end of turn" when no `eot_token_id` is given.
const EOT_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];
const EOM_TEXTS: &[&str] = &["<|eom_id|>"];
const FIM_PRE_TEXTS: &[&str] = &[
    "<|fim_prefix|>",
    "<fim-prefix>",
    "<fim_prefix>",
    "<｜fim▁begin｜>",
    "<PRE>",
    "▁<PRE>",
    "<|code_prefix|>",
    "<|prefix|>",
];
const FIM_SUF_TEXTS: &[&str] = &[
    "<|fim_suffix|>",
    "<fim-suffix>",
    "<fim_suffix>",
    "<｜fim▁hole｜>",
    "<SUF>",
    "▁<SUF>",
    "<|code_suffix|>",
    "<|suffix|>",
];
const FIM_MID_TEXTS: &[&str] = &[
    "<|fim_middle|>",
    "<fim-middle>",
    "<fim_middle>",
    "<｜fim▁end｜>",
    "<MID>",
    "▁<MID>",
    "<|code_middle|>",
    "<|middle|>",
];
const FIM_PAD_TEXTS: &[&str] = &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"];
const FIM_REP_TEXTS: &[&str] = &[
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
];
const FIM_SEP_TEXTS: &[&str] = &["<|file_sep|>"];

/// Texts that end generation wherever they appear in a vocabulary (llama.cpp's EOG list).
const EOG_TEXTS: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

impl Vocab {
    /// Reads tokens, types and scores and derives everything llama.cpp derives from them.
    pub(crate) fn from_gguf(md: &Metadata, kind: Kind) -> Result<Vocab> {
        let tokens = md.get_str_array(TOKENS)?;
        let n = tokens.len();
        if i32::try_from(n).is_err() {
            return Err(Error::VocabTooLarge(n));
        }

        let scores = read_scores(md, n)?;
        let types = match md.get(TOKEN_TYPE) {
            None => None,
            Some(_) => {
                let t = md.get_i32_array(TOKEN_TYPE)?;
                check_len(TOKEN_TYPE, t.len(), n)?;
                Some(t)
            }
        };

        let mut texts = Vec::with_capacity(n);
        let mut attrs = Vec::with_capacity(n);
        let mut by_text = HashMap::with_capacity(n);
        for (i, word) in tokens.iter().enumerate() {
            let id = i as u32;
            // llama.cpp renames empty tokens rather than rejecting the file.
            let text = if word.is_empty() {
                format!("[EMPTY_{i}]")
            } else {
                word.clone()
            };
            if let Some(&first) = by_text.get(&text) {
                return Err(Error::DuplicateToken {
                    text,
                    first,
                    second: id,
                });
            }
            by_text.insert(text.clone(), id);
            texts.push(text);
            attrs.push(match types.map(|t| t[i]) {
                None | Some(1) => attr::NORMAL,
                Some(2) => attr::UNKNOWN,
                Some(3) => attr::CONTROL,
                Some(4) => attr::USER_DEFINED,
                Some(5) => attr::UNUSED,
                Some(6) => attr::BYTE,
                Some(_) => 0,
            });
        }

        let mut vocab = Vocab {
            texts,
            attrs,
            scores,
            by_text,
            ids: SpecialIds::default(),
            eog: Vec::new(),
            special_cache: Vec::new(),
            piece_bytes: Vec::new(),
            piece_offsets: Vec::new(),
        };
        vocab.read_special_ids(md, kind)?;
        vocab.detect_special_by_text();
        vocab.build_eog();
        vocab.apply_model_attrs(md);
        vocab.build_special_cache();
        vocab.build_pieces(kind);
        Ok(vocab)
    }

    pub(crate) fn len(&self) -> usize {
        self.texts.len()
    }

    pub(crate) fn attr(&self, id: u32) -> u16 {
        self.attrs.get(id as usize).copied().unwrap_or(0)
    }

    /// Token bytes as `llama_token_to_piece(special = true)`: control tokens give their text.
    pub(crate) fn piece(&self, id: u32) -> &[u8] {
        let i = id as usize;
        match (self.piece_offsets.get(i), self.piece_offsets.get(i + 1)) {
            (Some(&a), Some(&b)) => &self.piece_bytes[a as usize..b as usize],
            _ => &[],
        }
    }

    /// Token bytes as `llama_token_to_piece(special)`: with `special` false, control and unknown
    /// tokens decode to nothing (user-defined ones still decode to their text).
    pub(crate) fn piece_for(&self, id: u32, special: bool) -> &[u8] {
        if !special && self.attr(id) & (attr::CONTROL | attr::UNKNOWN) != 0 {
            return &[];
        }
        self.piece(id)
    }

    fn read_special_ids(&mut self, md: &Metadata, kind: Kind) -> Result<()> {
        let n = self.len() as u32;
        let in_range = |id: u32| (id < n).then_some(id);
        let ids = &mut self.ids;
        match kind {
            Kind::Bpe => {
                ids.bos = in_range(11);
                ids.eos = in_range(11);
            }
            Kind::Spm => {
                ids.bos = in_range(1);
                ids.eos = in_range(2);
                ids.unk = in_range(0);
            }
        }
        type Slot = fn(&mut SpecialIds) -> &mut Option<u32>;
        // Same order as llama.cpp, so the deprecated prefix/suffix/middle keys win.
        let keys: [(&str, Slot); 17] = [
            ("tokenizer.ggml.bos_token_id", |s| &mut s.bos),
            ("tokenizer.ggml.eos_token_id", |s| &mut s.eos),
            ("tokenizer.ggml.eot_token_id", |s| &mut s.eot),
            ("tokenizer.ggml.eom_token_id", |s| &mut s.eom),
            ("tokenizer.ggml.unknown_token_id", |s| &mut s.unk),
            ("tokenizer.ggml.seperator_token_id", |s| &mut s.sep),
            ("tokenizer.ggml.padding_token_id", |s| &mut s.pad),
            ("tokenizer.ggml.mask_token_id", |s| &mut s.mask),
            ("tokenizer.ggml.fim_pre_token_id", |s| &mut s.fim_pre),
            ("tokenizer.ggml.fim_suf_token_id", |s| &mut s.fim_suf),
            ("tokenizer.ggml.fim_mid_token_id", |s| &mut s.fim_mid),
            ("tokenizer.ggml.fim_pad_token_id", |s| &mut s.fim_pad),
            ("tokenizer.ggml.fim_rep_token_id", |s| &mut s.fim_rep),
            ("tokenizer.ggml.fim_sep_token_id", |s| &mut s.fim_sep),
            ("tokenizer.ggml.prefix_token_id", |s| &mut s.fim_pre),
            ("tokenizer.ggml.suffix_token_id", |s| &mut s.fim_suf),
            ("tokenizer.ggml.middle_token_id", |s| &mut s.fim_mid),
        ];
        for (key, slot) in keys {
            if md.get(key).is_none() {
                continue;
            }
            // An out-of-range id keeps the default, as in llama.cpp (which only warns).
            if let Some(id) = in_range(md.get_u32(key)?) {
                *slot(ids) = Some(id);
            }
        }
        Ok(())
    }

    /// llama.cpp's text-based detection of EOT, EOM and FIM tokens when metadata does not name
    /// them. A detected token that was not typed as control becomes control, so that it is parsed
    /// as special and hidden when decoding.
    fn detect_special_by_text(&mut self) {
        type Slot = fn(&mut SpecialIds) -> &mut Option<u32>;
        let table: [(&[&str], Slot); 8] = [
            (EOT_TEXTS, |s| &mut s.eot),
            (EOM_TEXTS, |s| &mut s.eom),
            (FIM_PRE_TEXTS, |s| &mut s.fim_pre),
            (FIM_SUF_TEXTS, |s| &mut s.fim_suf),
            (FIM_MID_TEXTS, |s| &mut s.fim_mid),
            (FIM_PAD_TEXTS, |s| &mut s.fim_pad),
            (FIM_REP_TEXTS, |s| &mut s.fim_rep),
            (FIM_SEP_TEXTS, |s| &mut s.fim_sep),
        ];
        for (texts, slot) in table {
            if slot(&mut self.ids).is_some() {
                continue;
            }
            // llama.cpp walks a hash map, so with several candidates its pick is arbitrary;
            // the lowest id is a deterministic choice among the same candidates.
            let found = texts
                .iter()
                .filter_map(|t| self.by_text.get(*t).copied())
                .min();
            if let Some(id) = found {
                *slot(&mut self.ids) = Some(id);
                self.attrs[id as usize] |= attr::CONTROL;
            }
        }
    }

    fn build_eog(&mut self) {
        let mut eog: Vec<u32> = [self.ids.fim_pad, self.ids.fim_rep, self.ids.fim_sep]
            .into_iter()
            .flatten()
            .collect();
        for text in EOG_TEXTS {
            if let Some(&id) = self.by_text.get(*text) {
                eog.push(id);
                self.attrs[id as usize] |= attr::CONTROL;
            }
        }
        // gpt-oss: these structure tokens must always be rendered.
        for text in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
            if let Some(&id) = self.by_text.get(text) {
                self.attrs[id as usize] = attr::USER_DEFINED;
            }
        }
        eog.extend(
            [self.ids.eos, self.ids.eot, self.ids.eom]
                .into_iter()
                .flatten(),
        );
        eog.sort_unstable();
        eog.dedup();

        let in_eog =
            |t: &str| -> Option<u32> { self.by_text.get(t).copied().filter(|id| eog.contains(id)) };
        let end = in_eog("<|end|>");
        let slash_s = in_eog("</s>");
        let has_return = in_eog("<|return|>").is_some();
        let has_call = in_eog("<|call|>").is_some() || in_eog("<|calls|>").is_some();
        let has_flush = in_eog("<|flush|>").is_some();
        let s_is_normal = in_eog("<|tool_response>").is_some() || in_eog("<|plamo:eos|>").is_some();
        // o200k_harmony / solar-open: `<|end|>` ends a message, not the generation.
        if let Some(end) = end
            && has_call
            && (has_return || has_flush)
        {
            eog.retain(|&id| id != end);
            self.attrs[end as usize] = attr::USER_DEFINED;
        }
        // gemma4 / plamo: `</s>` is an ordinary token there.
        if let Some(s) = slash_s
            && s_is_normal
        {
            eog.retain(|&id| id != s);
            self.attrs[s as usize] = attr::NORMAL;
        }
        self.eog = eog;
    }

    /// Per-model strip attributes llama.cpp sets by model name: Phi-3 chat tokens swallow the
    /// whitespace after them.
    fn apply_model_attrs(&mut self, md: &Metadata) {
        let name = match md.get("general.name") {
            Some(Value::String(s)) => s.to_lowercase(),
            _ => return,
        };
        if name.contains("phi-3") || name.contains("phi3") {
            for i in 0..self.attrs.len() {
                if self.attrs[i] & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0 {
                    self.attrs[i] |= attr::RSTRIP;
                }
            }
            for (text, on) in [
                ("</s>", true),
                ("<unk>", false),
                ("<s>", false),
                ("<|endoftext|>", false),
            ] {
                if let Some(&id) = self.by_text.get(text) {
                    let a = &mut self.attrs[id as usize];
                    *a = if on {
                        *a | attr::RSTRIP
                    } else {
                        *a & !attr::RSTRIP
                    };
                }
            }
        }
    }

    fn build_special_cache(&mut self) {
        let mut cache: Vec<u32> = (0..self.len() as u32)
            .filter(|&id| {
                self.attrs[id as usize] & (attr::CONTROL | attr::USER_DEFINED | attr::UNKNOWN) != 0
            })
            .collect();
        // Longest first; ties by id (llama.cpp's unstable sort leaves them unspecified).
        cache.sort_by(|&a, &b| {
            let (la, lb) = (self.texts[a as usize].len(), self.texts[b as usize].len());
            lb.cmp(&la).then(a.cmp(&b))
        });
        self.special_cache = cache;
    }

    fn build_pieces(&mut self, kind: Kind) {
        let mut bytes = Vec::with_capacity(self.texts.iter().map(String::len).sum());
        let mut offsets = Vec::with_capacity(self.len() + 1);
        offsets.push(0u32);
        for (text, &a) in self.texts.iter().zip(&self.attrs) {
            if a & (attr::UNKNOWN | attr::CONTROL | attr::USER_DEFINED) != 0 {
                bytes.extend_from_slice(text.as_bytes());
            } else if a & attr::NORMAL != 0 {
                match kind {
                    Kind::Bpe => bpe::byte_decode_into(text, &mut bytes),
                    Kind::Spm => bytes.extend_from_slice(text.replace('\u{2581}', " ").as_bytes()),
                }
            } else if a & attr::BYTE != 0 {
                // Unparsable byte tokens decode to 0, like llama.cpp's strtol.
                bytes.push(parse_byte_token(text).unwrap_or(0));
            }
            // Unused and undefined tokens decode to nothing.
            offsets.push(bytes.len() as u32);
        }
        self.piece_bytes = bytes;
        self.piece_offsets = offsets;
    }
}

/// The byte of a `<0xNN>` token.
pub(crate) fn parse_byte_token(text: &str) -> Option<u8> {
    let hex = text.strip_prefix("<0x")?.strip_suffix('>')?;
    if hex.len() != 2 {
        return None;
    }
    u8::from_str_radix(hex, 16).ok()
}

fn check_len(key: &'static str, found: usize, expected: usize) -> Result<()> {
    // llama.cpp accepts longer arrays and ignores the excess.
    if found < expected {
        return Err(Error::LengthMismatch {
            key,
            found,
            expected,
        });
    }
    Ok(())
}

/// Scores may be stored as f32 or i32; absent scores are all zero (BPE does not use them).
fn read_scores(md: &Metadata, n: usize) -> Result<Vec<f32>> {
    let scores: Vec<f32> = match md.get(SCORES) {
        None => return Ok(vec![0.0; n]),
        Some(Value::Array(strata_gguf::Array::I32(v))) => v.iter().map(|&s| s as f32).collect(),
        Some(_) => md.get_f32_array(SCORES)?.to_vec(),
    };
    check_len(SCORES, scores.len(), n)?;
    Ok(scores)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::testutil::{CONTROL, NORMAL, gguf};
    use strata_gguf::Value;

    fn vocab(tokens: &[(&str, i32)], extra: Vec<(&str, Value)>) -> Vocab {
        Vocab::from_gguf(gguf("gpt2", tokens, extra).metadata(), Kind::Bpe).unwrap()
    }

    #[test]
    fn turn_enders_and_fim_repo_join_the_eog_set_and_become_control() {
        let v = vocab(
            &[
                ("<|endoftext|>", NORMAL),
                ("<|im_end|>", CONTROL),
                ("<reponame>", CONTROL),
                ("hello", NORMAL),
            ],
            vec![("tokenizer.ggml.eos_token_id", Value::U32(1))],
        );
        assert_eq!(v.eog, [0, 1, 2]);
        assert_ne!(
            v.attr(0) & attr::CONTROL,
            0,
            "typed normal, but looks like control"
        );
        assert_eq!(v.ids.fim_rep, Some(2));
        assert_eq!(v.ids.eot, Some(0), "lowest id among the EOT candidates");
    }

    #[test]
    fn harmony_end_is_not_an_end_of_generation() {
        let v = vocab(
            &[
                ("<|end|>", CONTROL),
                ("<|return|>", CONTROL),
                ("<|call|>", CONTROL),
            ],
            vec![],
        );
        assert_eq!(v.eog, [1, 2]);
        assert_eq!(v.attr(0), attr::USER_DEFINED);
    }

    #[test]
    fn special_ids_default_per_model_and_ignore_out_of_range_values() {
        let v = vocab(&[("a", NORMAL), ("b", NORMAL)], vec![]);
        assert_eq!(
            (v.ids.bos, v.ids.eos),
            (None, None),
            "BPE default 11 is out of range"
        );
        let v = vocab(
            &[("a", NORMAL), ("b", NORMAL)],
            vec![
                ("tokenizer.ggml.bos_token_id", Value::U32(99)),
                ("tokenizer.ggml.eos_token_id", Value::U32(1)),
            ],
        );
        assert_eq!((v.ids.bos, v.ids.eos), (None, Some(1)));
    }

    #[test]
    fn duplicate_and_short_arrays_are_errors_naming_the_problem() {
        let md = gguf("gpt2", &[("a", NORMAL), ("a", NORMAL)], vec![]);
        let err = Vocab::from_gguf(md.metadata(), Kind::Bpe).unwrap_err();
        assert!(err.to_string().contains("token 1"), "{err}");
        let md = gguf(
            "llama",
            &[("a", NORMAL), ("b", NORMAL)],
            vec![(
                "tokenizer.ggml.scores",
                Value::Array(strata_gguf::Array::F32(vec![0.0])),
            )],
        );
        let err = Vocab::from_gguf(md.metadata(), Kind::Spm).unwrap_err();
        assert!(
            err.to_string().contains("tokenizer.ggml.scores has 1"),
            "{err}"
        );
    }
}
