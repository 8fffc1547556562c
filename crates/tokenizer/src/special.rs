//! Cutting special tokens out of raw text before pre-tokenization, as llama.cpp's
//! `tokenizer_st_partition` does.
//!
//! The order is the point: llama.cpp takes the special tokens longest text first and, for each,
//! splits every remaining text fragment at all of its occurrences. This is not leftmost-longest
//! matching — with tokens `ab` and `bcd`, the text `abcd` yields `a` + `bcd`, because `bcd` is
//! tried first — and prompts must tokenize the same way the model's reference engine does.
//!
//! Control and unknown tokens are only matched when the caller asks for special parsing (a
//! rendered chat template); user-defined tokens are matched always, in text typed by a user too,
//! following Hugging Face `tokenizers` (neox-style vocabularies define whitespace runs this way).

use std::ops::Range;

use crate::vocab::{Vocab, attr};

/// A piece of the input: raw text still to be tokenized, or an already-identified token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Fragment {
    /// Byte range of the input text.
    Text(Range<usize>),
    /// A special token's id.
    Token(u32),
}

/// C's `isspace` in the "C" locale, which llama.cpp uses for the strip attributes.
fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r')
}

/// Splits `text` into raw fragments and special tokens.
pub(crate) fn partition(vocab: &Vocab, text: &str, parse_special: bool) -> Vec<Fragment> {
    let mut frags = Vec::new();
    if text.is_empty() {
        return frags;
    }
    frags.push(Fragment::Text(0..text.len()));
    let bytes = text.as_bytes();

    for &id in &vocab.special_cache {
        let a = vocab.attrs[id as usize];
        if !parse_special && a & (attr::CONTROL | attr::UNKNOWN) != 0 {
            continue;
        }
        let tok = vocab.texts[id as usize].as_str();
        // Fragments are substrings of `text`: a token absent from it is absent from all of them.
        // This keeps vocabularies with thousands of reserved tokens cheap.
        if !text.contains(tok) {
            continue;
        }
        let mut next = Vec::with_capacity(frags.len() + 2);
        for frag in frags {
            let Fragment::Text(range) = frag else {
                next.push(frag);
                continue;
            };
            let (mut start, end) = (range.start, range.end);
            loop {
                let Some(offset) = text[start..end].find(tok) else {
                    if start < end {
                        next.push(Fragment::Text(start..end));
                    }
                    break;
                };
                let at = start + offset;
                let mut left_end = at;
                if a & attr::LSTRIP != 0 {
                    while left_end > start && is_c_space(bytes[left_end - 1]) {
                        left_end -= 1;
                    }
                }
                if left_end > start {
                    next.push(Fragment::Text(start..left_end));
                }
                next.push(Fragment::Token(id));
                start = at + tok.len();
                if a & attr::RSTRIP != 0 {
                    while start < end && is_c_space(bytes[start]) {
                        start += 1;
                    }
                }
                if start >= end {
                    break;
                }
            }
        }
        frags = next;
    }
    frags
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::Fragment::{Text, Token};
    use super::*;
    use crate::testutil::{CONTROL, NORMAL, USER_DEFINED, gguf};
    use crate::vocab::Kind;

    fn vocab(tokens: &[(&str, i32)]) -> Vocab {
        Vocab::from_gguf(gguf("gpt2", tokens, vec![]).metadata(), Kind::Bpe).unwrap()
    }

    #[test]
    fn longest_token_wins_even_when_a_shorter_one_starts_earlier() {
        let v = vocab(&[("a", NORMAL), ("ab", CONTROL), ("bcd", CONTROL)]);
        assert_eq!(partition(&v, "abcd", true), [Text(0..1), Token(2)]);
        assert_eq!(
            partition(&v, "ab ab", true),
            [Token(1), Text(2..3), Token(1)]
        );
    }

    #[test]
    fn control_tokens_need_parse_special_user_defined_ones_do_not() {
        let v = vocab(&[("<c>", CONTROL), ("<u>", USER_DEFINED)]);
        assert_eq!(
            partition(&v, "x<c>y<u>z", false),
            [Text(0..5), Token(1), Text(8..9)]
        );
        assert_eq!(
            partition(&v, "x<c>y<u>z", true),
            [Text(0..1), Token(0), Text(4..5), Token(1), Text(8..9)]
        );
        assert_eq!(partition(&v, "", true), []);
    }
}
