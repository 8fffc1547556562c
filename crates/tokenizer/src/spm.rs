//! SentencePiece-style tokenization (`tokenizer.ggml.model = "llama"`), as llama.cpp's SPM
//! session does it: Llama 1/2, Mistral v1, Gemma 1–3.
//!
//! Spaces become `▁`; characters are merged pairwise, always taking the adjacent pair whose merged
//! text is the highest-scoring token (ties: leftmost), and a character that is not a token falls
//! back to its UTF-8 bytes as `<0xNN>` tokens. (llama.cpp also keeps a map to re-split merged
//! pieces that are not tokens, but a merge only happens when its result is a token, so that path
//! never runs and is left out here.) Unlike BPE there is no merge list: the scores are the
//! whole model. This is a port of that algorithm rather than a use of `tokenizers`, because the
//! resegmentation and byte fallback must match llama.cpp exactly.

use std::cmp::Ordering;
use std::collections::BinaryHeap;

use crate::vocab::Vocab;

/// Byte-fallback token ids, `<0x00>`..`<0xFF>`, resolved once.
#[derive(Debug)]
pub(crate) struct SpmEncoder {
    byte_tokens: Box<[Option<u32>; 256]>,
}

#[derive(Clone, Copy)]
struct Symbol {
    prev: Option<usize>,
    next: Option<usize>,
    start: usize,
    len: usize,
}

struct Bigram {
    score: f32,
    left: usize,
    right: usize,
    size: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    /// Max-heap order: higher score first, then the leftmost pair.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

impl SpmEncoder {
    pub(crate) fn new(vocab: &Vocab) -> SpmEncoder {
        let mut byte_tokens = [None; 256];
        for (b, slot) in byte_tokens.iter_mut().enumerate() {
            *slot = vocab
                .by_text
                .get(&format!("<0x{b:02X}>"))
                .or_else(|| {
                    // llama.cpp falls back to the byte itself as a one-byte token text.
                    std::str::from_utf8(&[b as u8])
                        .ok()
                        .and_then(|s| vocab.by_text.get(s))
                })
                .copied();
        }
        SpmEncoder {
            byte_tokens: Box::new(byte_tokens),
        }
    }

    /// Appends the ids of one text fragment. `prefix_space` is llama.cpp's `add_space_prefix`
    /// rule: the fragment starts the input or follows a special token.
    pub(crate) fn encode_into(
        &self,
        vocab: &Vocab,
        fragment: &str,
        prefix_space: bool,
        out: &mut Vec<u32>,
    ) {
        let mut text = String::with_capacity(fragment.len() + 4);
        if prefix_space {
            text.push(' ');
        }
        text.push_str(fragment);
        let text = text.replace(' ', "\u{2581}");
        if text.is_empty() {
            return;
        }

        let starts: Vec<usize> = text.char_indices().map(|(i, _)| i).collect();
        let mut symbols: Vec<Symbol> = starts
            .iter()
            .enumerate()
            .map(|(i, &start)| Symbol {
                prev: i.checked_sub(1),
                next: (i + 1 < starts.len()).then_some(i + 1),
                start,
                len: starts.get(i + 1).copied().unwrap_or(text.len()) - start,
            })
            .collect();

        let mut session = Session {
            vocab,
            text: &text,
            queue: BinaryHeap::new(),
        };
        for i in 1..symbols.len() {
            session.try_add_bigram(&symbols, Some(i - 1), Some(i));
        }
        while let Some(bigram) = session.queue.pop() {
            let (l, r) = (symbols[bigram.left], symbols[bigram.right]);
            // Stale entry: one side was merged away since it was queued.
            if l.len == 0 || r.len == 0 || l.len + r.len != bigram.size {
                continue;
            }
            symbols[bigram.left].len += r.len;
            symbols[bigram.right].len = 0;
            symbols[bigram.left].next = r.next;
            if let Some(next) = r.next {
                symbols[next].prev = Some(bigram.left);
            }
            let left = symbols[bigram.left];
            session.try_add_bigram(&symbols, left.prev, Some(bigram.left));
            session.try_add_bigram(&symbols, Some(bigram.left), left.next);
        }

        let mut i = Some(0);
        while let Some(idx) = i {
            let sym = symbols[idx];
            match vocab.by_text.get(session.sym_text(&sym)) {
                Some(&id) => out.push(id),
                // llama.cpp throws if a byte has no token; dropping it is the safe equivalent
                // for a vocabulary without byte fallback.
                None => out.extend(
                    session
                        .sym_text(&sym)
                        .bytes()
                        .filter_map(|b| self.byte_tokens[b as usize]),
                ),
            }
            i = sym.next;
        }
    }
}

struct Session<'a> {
    vocab: &'a Vocab,
    text: &'a str,
    queue: BinaryHeap<Bigram>,
}

impl<'a> Session<'a> {
    fn sym_text(&self, s: &Symbol) -> &'a str {
        &self.text[s.start..s.start + s.len]
    }

    fn try_add_bigram(&mut self, symbols: &[Symbol], left: Option<usize>, right: Option<usize>) {
        let (Some(left), Some(right)) = (left, right) else {
            return;
        };
        let (l, r) = (symbols[left], symbols[right]);
        let merged = &self.text[l.start..l.start + l.len + r.len];
        let Some(&id) = self.vocab.by_text.get(merged) else {
            return;
        };
        self.queue.push(Bigram {
            score: self.vocab.scores.get(id as usize).copied().unwrap_or(0.0),
            left,
            right,
            size: merged.len(),
        });
    }
}
