//! Incremental detokenization for streaming generated text.
//!
//! A byte-level BPE token can hold part of a UTF-8 character (an emoji is often 2–4 tokens), so
//! decoding token by token would emit replacement characters mid-stream. [`StreamDecoder`] holds
//! back an incomplete trailing sequence until the token that completes it arrives, and emits
//! everything before it at once, so a client sees text as early as possible and never a `�`
//! that later turns into a character.

use crate::Tokenizer;

/// Turns a stream of token ids into text chunks that are always complete UTF-8.
///
/// ```no_run
/// # fn demo(tok: &strata_tokenizer::Tokenizer, ids: &[u32]) {
/// let mut dec = tok.stream_decoder(false);
/// for &id in ids {
///     if let Some(text) = dec.push(id) {
///         print!("{text}");
///     }
/// }
/// if let Some(rest) = dec.finish() {
///     print!("{rest}");
/// }
/// # }
/// ```
#[derive(Debug)]
pub struct StreamDecoder<T: std::ops::Deref<Target = Tokenizer>> {
    tokenizer: T,
    special: bool,
    /// Bytes of an incomplete UTF-8 sequence at the end of what was pushed so far (≤ 3 bytes,
    /// unless a token itself carries invalid bytes, which are emitted as U+FFFD at once).
    pending: Vec<u8>,
}

impl<T: std::ops::Deref<Target = Tokenizer>> StreamDecoder<T> {
    /// A decoder for `tokenizer` (a reference, or a shared handle such as `Arc<Tokenizer>`);
    /// `special` shows control tokens as text, as in [`Tokenizer::decode`].
    pub fn new(tokenizer: T, special: bool) -> StreamDecoder<T> {
        StreamDecoder {
            tokenizer,
            special,
            pending: Vec::with_capacity(8),
        }
    }

    /// Adds one token; returns the text that became complete, if any.
    pub fn push(&mut self, id: u32) -> Option<String> {
        let piece = self.tokenizer.vocab.piece_for(id, self.special);
        if piece.is_empty() {
            return None;
        }
        self.pending.extend_from_slice(piece);
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (valid, after) = rest.split_at(e.valid_up_to());
                    // `valid_up_to` guarantees this prefix is UTF-8.
                    out.push_str(std::str::from_utf8(valid).unwrap_or_default());
                    match e.error_len() {
                        // Incomplete sequence at the end: wait for the next token.
                        None => {
                            rest = after;
                            break;
                        }
                        // Bytes that can never become valid: replace them now.
                        Some(n) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = &after[n..];
                        }
                    }
                }
            }
        }
        let keep = rest.len();
        let start = self.pending.len() - keep;
        self.pending.drain(..start);
        (!out.is_empty()).then_some(out)
    }

    /// Ends the stream: returns any held-back bytes, an incomplete character as U+FFFD.
    pub fn finish(&mut self) -> Option<String> {
        if self.pending.is_empty() {
            return None;
        }
        let text = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        Some(text)
    }
}
