//! From generated tokens to what a client sees: text decoded as soon as it is complete UTF-8,
//! stop sequences cut (text that may be the start of one is held back until it is not), and,
//! when tools are on, tool calls split from the content.

use crate::grammar::{CALL_CLOSE, CALL_OPEN};
use crate::scheduler::TokenLogprob;
use crate::tools::{ParsedCall, parse_calls};

/// One thing to tell the client.
#[derive(Debug, Clone, PartialEq)]
pub enum Piece {
    /// More content text.
    Content(String),
    /// A complete tool call (index in the answer, call).
    Call(usize, ParsedCall),
}

/// Turns decoded text into [`Piece`]s.
#[derive(Debug, Default)]
pub struct Output {
    stops: Vec<String>,
    tools: bool,
    /// Text decoded but not yet given out.
    held: String,
    /// Everything given out as content.
    pub content: String,
    /// Calls given out.
    pub calls: Vec<ParsedCall>,
    /// Inside a tool call block (tools on and the opening tag seen).
    in_calls: bool,
    /// A stop sequence matched: no more output.
    pub stopped: bool,
    /// Log-probabilities of the tokens so far (with their ids), when asked for.
    pub logprobs: Vec<(u32, TokenLogprob)>,
}

impl Output {
    /// Output cut at `stops`; with `tools`, `<tool_call>` blocks become calls.
    pub fn new(stops: Vec<String>, tools: bool) -> Output {
        Output {
            stops,
            tools,
            ..Output::default()
        }
    }

    /// Adds the text of a generated token (and its log-probabilities); returns what can be
    /// given out now.
    pub fn push(&mut self, text: &str, logprob: Option<(u32, TokenLogprob)>) -> Vec<Piece> {
        if self.stopped {
            return Vec::new();
        }
        if let Some(lp) = logprob {
            self.logprobs.push(lp);
        }
        self.held.push_str(text);
        self.drain(false)
    }

    /// Generation ended (`text`: what the decoder still held); gives out the rest.
    pub fn finish(&mut self, text: &str) -> Vec<Piece> {
        if self.stopped {
            return Vec::new();
        }
        self.held.push_str(text);
        self.drain(true)
    }

    fn drain(&mut self, end: bool) -> Vec<Piece> {
        let mut out = Vec::new();
        loop {
            if self.stopped {
                return out;
            }
            if self.in_calls {
                // Calls are given out whole, when their closing tag arrives.
                let Some(close) = self.held.find(CALL_CLOSE) else {
                    if end {
                        // A call cut short (token budget): whatever parses is kept, the rest
                        // is dropped rather than returned as a broken call.
                        self.held.clear();
                    }
                    return out;
                };
                let block = format!("{}{}", &self.held[..close], CALL_CLOSE);
                let (_, calls) = parse_calls(&block);
                self.held.drain(..close + CALL_CLOSE.len());
                let trimmed = self.held.trim_start().len();
                let cut = self.held.len() - trimmed;
                self.held.drain(..cut);
                for c in calls {
                    out.push(Piece::Call(self.calls.len(), c.clone()));
                    self.calls.push(c);
                }
                if self.held.starts_with(CALL_OPEN) {
                    continue;
                }
                if self.held.is_empty() {
                    return out;
                }
                // Text after the calls is not part of the answer (the grammar forbids it).
                self.held.clear();
                return out;
            }
            // Content: cut at the earliest stop sequence, or switch to calls at the opening tag.
            let mut cut: Option<(usize, bool)> = None;
            for s in &self.stops {
                if let Some(at) = self.held.find(s.as_str())
                    && cut.is_none_or(|c| at < c.0)
                {
                    cut = Some((at, true));
                }
            }
            if self.tools
                && let Some(at) = self.held.find(CALL_OPEN)
                && cut.is_none_or(|c| at < c.0)
            {
                cut = Some((at, false));
            }
            if let Some((at, is_stop)) = cut {
                let text: String = self.held[..at].to_string();
                let text = if is_stop {
                    text
                } else {
                    text.trim_end().to_string()
                };
                self.emit_content(text, &mut out);
                if is_stop {
                    self.stopped = true;
                    self.held.clear();
                    return out;
                }
                self.held.drain(..at + CALL_OPEN.len());
                self.held.insert_str(0, CALL_OPEN);
                self.in_calls = true;
                continue;
            }
            // Hold back a tail that could still become a stop sequence or the opening tag.
            let mut keep = if end { 0 } else { self.unsafe_tail() };
            if self.tools && !end {
                // Whitespace before a call is not content; hold it until text follows.
                let before = &self.held[..self.held.len() - keep];
                keep += before.len() - before.trim_end().len();
            }
            let at = self.held.len() - keep;
            let text: String = self.held.drain(..at).collect();
            self.emit_content(text, &mut out);
            return out;
        }
    }

    fn emit_content(&mut self, text: String, out: &mut Vec<Piece>) {
        if !text.is_empty() {
            self.content.push_str(&text);
            out.push(Piece::Content(text));
        }
    }

    /// Length of the longest suffix of `held` that is a proper prefix of a stop sequence or of
    /// the opening tag.
    fn unsafe_tail(&self) -> usize {
        let mut keep = 0;
        let tag = [CALL_OPEN.to_string()];
        let markers = self.stops.iter().chain(tag.iter().filter(|_| self.tools));
        for s in markers {
            for n in (1..s.len()).rev() {
                if n <= keep || n > self.held.len() {
                    continue;
                }
                if !s.is_char_boundary(n) || !self.held.is_char_boundary(self.held.len() - n) {
                    continue;
                }
                if self.held.ends_with(&s[..n]) {
                    keep = n;
                    break;
                }
            }
        }
        keep
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn out(stops: &[&str], tools: bool) -> Output {
        Output::new(stops.iter().map(|s| s.to_string()).collect(), tools)
    }

    fn feed(o: &mut Output, parts: &[&str]) -> Vec<Piece> {
        let mut v = Vec::new();
        for p in parts {
            v.extend(o.push(p, None));
        }
        v.extend(o.finish(""));
        v
    }

    fn text(v: &[Piece]) -> String {
        v.iter()
            .filter_map(|p| match p {
                Piece::Content(t) => Some(t.as_str()),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn stop_sequences_cut_even_across_tokens() {
        let mut o = out(&["END"], false);
        let v = feed(&mut o, &["hello E", "N", "D world"]);
        assert_eq!(text(&v), "hello ");
        assert!(o.stopped);
        let mut o = out(&["END"], false);
        let v = feed(&mut o, &["hello E", "N", "d"]);
        assert_eq!(text(&v), "hello ENd");
    }

    #[test]
    fn tool_calls_split_from_content() {
        let mut o = out(&[], true);
        let v = feed(
            &mut o,
            &[
                "Sure. <tool",
                "_call>{\"name\": \"f\", \"arguments\": {\"x\": 1}}</tool_call>\n<tool_call>{\"name\": \"g\", ",
                "\"arguments\": {}}</tool_call>",
            ],
        );
        assert_eq!(text(&v), "Sure.");
        let calls: Vec<_> = v
            .iter()
            .filter_map(|p| match p {
                Piece::Call(i, c) => Some((*i, c.name.clone())),
                _ => None,
            })
            .collect();
        assert_eq!(calls, vec![(0, "f".to_string()), (1, "g".to_string())]);
    }

    #[test]
    fn a_call_cut_short_is_dropped_not_broken() {
        let mut o = out(&[], true);
        let v = feed(&mut o, &["<tool_call>{\"name\": \"f\", \"argu"]);
        assert!(v.is_empty(), "{v:?}");
        assert!(o.calls.is_empty());
    }
}
