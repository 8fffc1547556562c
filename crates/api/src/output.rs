//! From generated tokens to what a client sees: text decoded as soon as it is complete UTF-8,
//! stop sequences cut (text that may be the start of one is held back until it is not), and,
//! when tools are on, tool calls split from the content.
//!
//! Tool calls stream as OpenAI streams them: the function's name as soon as it is known, then
//! the arguments' JSON text piece by piece as the tokens arrive, and the finished call once its
//! closing tag does. The arguments are the model's own text (the grammar makes it valid JSON),
//! so the streamed pieces join into exactly the arguments of the whole answer.

use crate::call_format::CallFormat;
use crate::harmony::{Event, Kind, Messages};
use crate::tools::ParsedCall;
use strata_scheduler::TokenLogprob;

/// One thing to tell the client.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum Piece {
    /// More content text.
    Content(String),
    /// A tool call begins: its index in the answer and the function's name.
    CallStart(usize, String),
    /// More of the arguments text of the call at this index.
    CallArgs(usize, String),
    /// The call at this index is complete (its name and arguments were given out before).
    Call(usize, ParsedCall),
    /// More of the model's reasoning (gpt-oss's `analysis` channel).
    Reasoning(String),
}

/// Turns decoded text into [`Piece`]s.
#[derive(Debug, Default)]
pub(crate) struct Output {
    stops: Vec<String>,
    /// The call syntax, when tools are on.
    format: Option<CallFormat>,
    /// Text decoded but not yet given out.
    held: String,
    /// Everything given out as content.
    pub content: String,
    /// Calls given out.
    pub calls: Vec<ParsedCall>,
    /// Inside a tool call block (tools on and the opening marker seen).
    in_calls: bool,
    /// The text right after the opening marker (a list's `[`) was read.
    opened: bool,
    /// For calls without a marker: whether the answer's start has shown if it is a call.
    decided: bool,
    /// The call being read.
    call: CallProgress,
    /// A call ended; the next text may open another.
    between_calls: bool,
    /// The text after the calls is not part of the answer.
    ignore_rest: bool,
    /// Generation ended inside a call (the budget ran out): that call is incomplete.
    pub cut_call: bool,
    /// A stop sequence matched: no more output.
    pub stopped: bool,
    /// The stop sequence that matched (Anthropic's answers name it).
    pub stop_sequence: Option<String>,
    /// Pieces of a call after the first, held until it is complete (see
    /// [`Output::hold_later_calls`]).
    pending: Vec<Piece>,
    /// The model repeated a call it had made in this answer: the answer ended there.
    pub repeated_call: bool,
    /// Log-probabilities of the tokens so far (with their ids), when asked for.
    pub logprobs: Vec<(u32, TokenLogprob)>,
    /// Harmony's messages, when the model writes them (gpt-oss): the text passes through
    /// them first, and only the answer's bodies reach the content.
    channels: Option<Messages>,
    /// The kind of the harmony message being read.
    message: Option<Kind>,
    /// The reasoning given out.
    pub reasoning: String,
}

impl Output {
    /// Output cut at `stops`; with a call `format`, the calls written in it become calls.
    pub(crate) fn new(stops: Vec<String>, format: Option<CallFormat>) -> Output {
        Output {
            stops,
            format,
            ..Output::default()
        }
    }

    /// Reads the text as harmony messages (gpt-oss): reasoning, answer and calls apart.
    pub(crate) fn with_channels(mut self) -> Output {
        self.channels = Some(Messages::default());
        self
    }

    /// Whether tools are on (a control token that marks calls must then reach [`Output::push`]
    /// as text; with tools off it stays out of the content, as every control token does).
    pub(crate) fn reads_calls(&self) -> bool {
        self.format.is_some()
    }

    /// The trigger that opens calls in the content, if tools are on and calls have one
    /// (harmony's calls are messages of their own, never inside the content).
    fn trigger(&self) -> Option<&'static str> {
        if self.channels.is_some() {
            return None;
        }
        self.format.and_then(|f| f.shape().trigger)
    }

    /// Adds the text of a generated token (and its log-probabilities); returns what can be
    /// given out now.
    pub(crate) fn push(&mut self, text: &str, logprob: Option<(u32, TokenLogprob)>) -> Vec<Piece> {
        if self.stopped {
            return Vec::new();
        }
        if let Some(lp) = logprob {
            self.logprobs.push(lp);
        }
        if self.channels.is_some() {
            return self.read_messages(text, false);
        }
        self.held.push_str(text);
        self.drain(false)
    }

    /// Generation ended (`text`: what the decoder still held); gives out the rest.
    pub(crate) fn finish(&mut self, text: &str) -> Vec<Piece> {
        if self.stopped {
            return Vec::new();
        }
        if self.channels.is_some() {
            return self.read_messages(text, true);
        }
        self.held.push_str(text);
        self.drain(true)
    }

    /// Harmony: the bodies of answer messages go through the content path (stop sequences
    /// included), reasoning out as such, a call's body as its arguments.
    fn read_messages(&mut self, text: &str, end: bool) -> Vec<Piece> {
        let Some(channels) = self.channels.as_mut() else {
            return Vec::new();
        };
        let events = channels.push(text, end);
        let mut out = Vec::new();
        for ev in events {
            if self.stopped {
                break;
            }
            match ev {
                Event::Open(Kind::Call(name)) if self.format.is_some() => {
                    out.push(Piece::CallStart(self.calls.len(), name.clone()));
                    self.message = Some(Kind::Call(name));
                }
                // A call with tools off is not one: its text is the answer's.
                Event::Open(Kind::Call(_)) => self.message = Some(Kind::Content),
                Event::Open(kind) => self.message = Some(kind),
                Event::Text(t) => match &self.message {
                    Some(Kind::Reasoning) => {
                        self.reasoning.push_str(&t);
                        out.push(Piece::Reasoning(t));
                    }
                    Some(Kind::Call(_)) => {
                        out.push(Piece::CallArgs(self.calls.len(), t.clone()));
                        self.held.push_str(&t);
                    }
                    _ => {
                        self.held.push_str(&t);
                        out.extend(self.drain(false));
                    }
                },
                Event::Close { whole } => match self.message.take() {
                    Some(Kind::Call(name)) => {
                        let arguments = self.held.trim().to_string();
                        self.held.clear();
                        if !whole && !harmony_args_complete(&arguments) {
                            self.cut_call = true;
                            continue;
                        }
                        let call = ParsedCall { name, arguments };
                        out.push(Piece::Call(self.calls.len(), call.clone()));
                        self.calls.push(call);
                    }
                    Some(Kind::Content) => out.extend(self.drain(true)),
                    _ => {}
                },
            }
        }
        out
    }

    fn drain(&mut self, end: bool) -> Vec<Piece> {
        let mut out = Vec::new();
        loop {
            if self.stopped {
                return out;
            }
            if self.in_calls {
                let mut read = Vec::new();
                let more = self.drain_call(end, &mut read);
                self.hold_later_calls(read, &mut out);
                if more {
                    continue;
                }
                return out;
            }
            if let (Some(f), false) = (self.format, self.decided)
                && f.shape().trigger.is_none()
            {
                // Calls without a marker are the whole answer: its first text decides.
                let body = self.held.trim_start_matches(is_json_ws);
                if body.is_empty() && !end {
                    return out;
                }
                self.decided = true;
                if body.starts_with('{') {
                    self.held.drain(..self.held.len() - body.len());
                    self.in_calls = true;
                    continue;
                }
                self.format = None;
            }
            // Content: cut at the earliest stop sequence, or switch to calls at the trigger.
            let mut cut: Option<(usize, bool)> = None;
            let mut matched = None;
            for s in &self.stops {
                if let Some(at) = self.held.find(s.as_str())
                    && cut.is_none_or(|c| at < c.0)
                {
                    cut = Some((at, true));
                    matched = Some(s.clone());
                }
            }
            let trigger = self.trigger();
            if let Some(t) = trigger
                && let Some(at) = self.held.find(t)
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
                    self.stop_sequence = matched;
                    self.held.clear();
                    return out;
                }
                self.held.drain(..at + trigger.map_or(0, str::len));
                self.in_calls = true;
                continue;
            }
            // Hold back a tail that could still become a stop sequence or the opening tag.
            let mut keep = if end { 0 } else { self.unsafe_tail() };
            if trigger.is_some() && !end {
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

    /// Reads the held text of the call block as far as it goes. Returns `true` when another
    /// call was opened and reading should go on.
    fn drain_call(&mut self, end: bool, out: &mut Vec<Piece>) -> bool {
        if self.ignore_rest {
            self.held.clear();
            return false;
        }
        let Some(format) = self.format else {
            return false;
        };
        let shape = format.shape();
        if !self.opened {
            match literals(&self.held, shape.first) {
                Match::Partial => return self.wait(end),
                Match::No => return self.give_up(),
                Match::Yes(at) => {
                    self.held.drain(..at);
                    self.opened = true;
                }
            }
        }
        let index = self.calls.len();
        if self.between_calls {
            // Only another call or the end of the calls may follow (the grammar allows
            // nothing else); what comes after the end is not part of the answer.
            match shape.next.map(|n| literals(&self.held, n)) {
                Some(Match::Yes(at)) => {
                    self.held.drain(..at);
                    self.between_calls = false;
                }
                Some(Match::Partial) => return self.wait(end),
                _ => {
                    if literals(&self.held, shape.end) == Match::Partial {
                        return self.wait(end);
                    }
                    return self.give_up();
                }
            }
        }
        let cp = &mut self.call;
        if cp.head.is_none() {
            let head = if shape.name_args {
                parse_name_args(&self.held)
            } else {
                parse_head(&self.held, shape.args_key)
            };
            match head {
                Match::Partial => return self.wait(end),
                Match::No => return self.give_up(),
                Match::Yes((name, at)) => {
                    out.push(Piece::CallStart(index, name.clone()));
                    cp.head = Some((name, at));
                    cp.scanned = at;
                    cp.emitted = at;
                }
            }
        }
        if cp.end.is_none() {
            let bytes = self.held.as_bytes();
            while cp.scanned < bytes.len() {
                match cp.scan.feed(bytes[cp.scanned]) {
                    Scan::More => cp.scanned += 1,
                    Scan::EndWith => {
                        cp.scanned += 1;
                        cp.end = Some(cp.scanned);
                        break;
                    }
                    Scan::EndBefore => {
                        cp.end = Some(cp.scanned);
                        break;
                    }
                }
            }
            if cp.scanned > cp.emitted {
                // Every stop is after an ASCII byte or at the end, so on a char boundary.
                let piece = self.held[cp.emitted..cp.scanned].to_string();
                cp.emitted = cp.scanned;
                out.push(Piece::CallArgs(index, piece));
            }
            if cp.end.is_none() {
                return self.wait(end);
            }
        }
        let (Some((name, args_at)), Some(args_end)) = (cp.head.clone(), cp.end) else {
            return false;
        };
        // The rest of the envelope (Mistral's id, the closing brace), then the call's end.
        let envelope = if shape.name_args {
            Match::Yes(0)
        } else {
            envelope_end(&self.held[args_end..])
        };
        let tail = match envelope {
            Match::Partial => return self.wait(end),
            Match::No => return self.give_up(),
            Match::Yes(n) => match literals(&self.held[args_end + n..], shape.after_each) {
                Match::Partial => return self.wait(end),
                Match::No => return self.give_up(),
                Match::Yes(m) => args_end + n + m,
            },
        };
        let arguments = self.held[args_at..args_end].to_string();
        let call = ParsedCall { name, arguments };
        out.push(Piece::Call(index, call.clone()));
        self.calls.push(call);
        self.call = CallProgress::default();
        self.held.drain(..tail);
        self.between_calls = true;
        !self.held.is_empty()
    }

    /// Gives out what [`Output::drain_call`] read, except that a call after the first is held
    /// until it is complete and dropped if it repeats an earlier call of this answer (the same
    /// name and the same arguments), which ends the answer. A small model asked for calls
    /// tends to write the same call again and again until its budget runs out; a repeated
    /// call can only return what the first returns, so the answer is over once one comes.
    fn hold_later_calls(&mut self, read: Vec<Piece>, out: &mut Vec<Piece>) {
        for piece in read {
            match piece {
                Piece::CallStart(i, _) | Piece::CallArgs(i, _) if i > 0 => self.pending.push(piece),
                Piece::Call(i, call) if i > 0 => {
                    let same = |c: &ParsedCall| {
                        c.name == call.name
                            && match (
                                serde_json::from_str::<serde_json::Value>(&c.arguments),
                                serde_json::from_str::<serde_json::Value>(&call.arguments),
                            ) {
                                (Ok(a), Ok(b)) => a == b,
                                _ => c.arguments == call.arguments,
                            }
                    };
                    if self.calls[..i].iter().any(same) {
                        self.calls.truncate(i);
                        self.pending.clear();
                        self.repeated_call = true;
                        self.stopped = true;
                        self.held.clear();
                        return;
                    }
                    out.append(&mut self.pending);
                    out.push(Piece::Call(i, call));
                }
                other => out.push(other),
            }
        }
    }

    /// The text does not continue the calls as the grammar writes them (only possible without
    /// a grammar): nothing more is given out.
    fn give_up(&mut self) -> bool {
        self.ignore_rest = true;
        self.held.clear();
        false
    }

    /// The call block needs more text. At the end of generation a call begun and not finished
    /// is marked cut; the held text is dropped rather than returned as a broken call.
    fn wait(&mut self, end: bool) -> bool {
        if end {
            if !self.between_calls && (self.call.head.is_some() || !self.held.is_empty()) {
                self.cut_call = true;
            }
            self.held.clear();
        }
        false
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
        let tag: Vec<String> = self.trigger().into_iter().map(String::from).collect();
        let markers = self.stops.iter().chain(tag.iter());
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

/// Whether a harmony call's arguments, cut by the end of generation, are one whole JSON value
/// (the `<|call|>` after them ends generation and is not decoded).
fn harmony_args_complete(args: &str) -> bool {
    serde_json::from_str::<serde_json::Value>(args).is_ok()
}

/// How far a piece of text matches an expected shape.
#[derive(Debug, PartialEq)]
enum Match<T> {
    /// It matches; with what was read.
    Yes(T),
    /// It is a proper prefix of a match: more text is needed.
    Partial,
    /// It cannot match.
    No,
}

/// Matches `lits` in order at the start of `s`, each after optional JSON whitespace; `Yes`
/// holds the bytes read.
fn literals(s: &str, lits: &[&str]) -> Match<usize> {
    let mut at = 0;
    for lit in lits {
        let lit = lit.trim_matches(is_json_ws);
        if lit.is_empty() {
            continue;
        }
        let rest = &s[at..];
        let trimmed = rest.trim_start_matches(is_json_ws);
        if trimmed.starts_with(lit) {
            at += rest.len() - trimmed.len() + lit.len();
        } else if lit.starts_with(trimmed) {
            return Match::Partial;
        } else {
            return Match::No;
        }
    }
    Match::Yes(at)
}

fn is_json_ws(c: char) -> bool {
    matches!(c, ' ' | '\t' | '\n' | '\r')
}

/// Reads a call's head `{"name": "NAME", "ARGS_KEY": ` (the grammar writes the name first);
/// `Yes` holds the name and where the arguments start.
fn parse_head(s: &str, args_key: &str) -> Match<(String, usize)> {
    let at = match literals(s, &["{", "\"name\"", ":", "\""]) {
        Match::Yes(at) => at,
        Match::Partial => return Match::Partial,
        Match::No => return Match::No,
    };
    let Some(len) = s[at..].find('"') else {
        return Match::Partial;
    };
    let name = &s[at..at + len];
    if name.contains('\\') {
        return Match::No;
    }
    let after = at + len + 1;
    let key = format!("\"{args_key}\"");
    let rest = match literals(&s[after..], &[",", &key, ":"]) {
        Match::Yes(n) => after + n,
        Match::Partial => return Match::Partial,
        Match::No => return Match::No,
    };
    value_start(s, rest, name)
}

/// Reads `NAME[ARGS]` (Mistral's newer syntax); `Yes` as [`parse_head`].
fn parse_name_args(s: &str) -> Match<(String, usize)> {
    const ARGS: &str = "[ARGS]";
    let name_char = |c: char| c.is_ascii_alphanumeric() || c == '_' || c == '-';
    let body = s.trim_start_matches(is_json_ws);
    let lead = s.len() - body.len();
    let Some(len) = body.find(|c: char| !name_char(c)) else {
        return Match::Partial;
    };
    let rest = &body[len..];
    if len == 0 || !(rest.starts_with(ARGS) || ARGS.starts_with(rest)) {
        return Match::No;
    }
    if rest.len() < ARGS.len() {
        return Match::Partial;
    }
    value_start(s, lead + len + ARGS.len(), &body[..len])
}

/// Where the arguments value starts at or after `from` (past whitespace).
fn value_start(s: &str, from: usize, name: &str) -> Match<(String, usize)> {
    let value = s[from..].trim_start_matches(is_json_ws);
    if value.is_empty() {
        return Match::Partial;
    }
    Match::Yes((name.to_string(), s.len() - value.len()))
}

/// Reads the rest of a call envelope after its arguments: any further members (Mistral's
/// `"id"`), then `}`. `Yes` holds the bytes read.
fn envelope_end(s: &str) -> Match<usize> {
    let mut at = 0;
    loop {
        let rest = &s[at..];
        let t = rest.trim_start_matches(is_json_ws);
        at += rest.len() - t.len();
        match t.as_bytes().first() {
            None => return Match::Partial,
            Some(b'}') => return Match::Yes(at + 1),
            Some(b',') => at += 1,
            Some(_) => return Match::No,
        }
        // A member: a key string, `:`, a value.
        for part in 0..2 {
            let rest = &s[at..];
            let t = rest.trim_start_matches(is_json_ws);
            at += rest.len() - t.len();
            if part == 1 {
                match t.as_bytes().first() {
                    None => return Match::Partial,
                    Some(b':') => at += 1,
                    Some(_) => return Match::No,
                }
                let rest = &s[at..];
                at += rest.len() - rest.trim_start_matches(is_json_ws).len();
            }
            let mut scan = ValueScan::default();
            let bytes = s.as_bytes();
            loop {
                let Some(&b) = bytes.get(at) else {
                    return Match::Partial;
                };
                match scan.feed(b) {
                    Scan::More => at += 1,
                    Scan::EndWith => {
                        at += 1;
                        break;
                    }
                    Scan::EndBefore => break,
                }
            }
        }
    }
}

/// The call being read: its head, then its arguments scanned byte by byte.
#[derive(Debug, Default)]
struct CallProgress {
    /// The function's name and where the arguments start in the held text.
    head: Option<(String, usize)>,
    scan: ValueScan,
    /// Bytes of the held text scanned, and given out, as arguments.
    scanned: usize,
    emitted: usize,
    /// Where the arguments end, once they have.
    end: Option<usize>,
}

/// What one more byte does to a JSON value being scanned.
#[derive(Debug, PartialEq)]
enum Scan {
    /// The value goes on.
    More,
    /// The value ends with this byte.
    EndWith,
    /// The value ended before this byte (a number or literal, which has no closing mark).
    EndBefore,
}

/// Finds where one JSON value ends, byte by byte (strings, escapes and nesting).
#[derive(Debug, Default)]
struct ValueScan {
    started: bool,
    depth: usize,
    in_str: bool,
    escaped: bool,
    scalar: bool,
}

impl ValueScan {
    fn feed(&mut self, b: u8) -> Scan {
        if !self.started {
            self.started = true;
            match b {
                b'{' | b'[' => self.depth = 1,
                b'"' => self.in_str = true,
                _ => self.scalar = true,
            }
            return Scan::More;
        }
        if self.in_str {
            if self.escaped {
                self.escaped = false;
            } else if b == b'\\' {
                self.escaped = true;
            } else if b == b'"' {
                self.in_str = false;
                if self.depth == 0 {
                    return Scan::EndWith;
                }
            }
            return Scan::More;
        }
        if self.scalar {
            return if matches!(b, b',' | b'}' | b']') || b.is_ascii_whitespace() {
                Scan::EndBefore
            } else {
                Scan::More
            };
        }
        match b {
            b'"' => self.in_str = true,
            b'{' | b'[' => self.depth += 1,
            b'}' | b']' => {
                self.depth = self.depth.saturating_sub(1);
                if self.depth == 0 {
                    return Scan::EndWith;
                }
            }
            _ => {}
        }
        Scan::More
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn out(stops: &[&str], tools: bool) -> Output {
        let format = tools.then_some(CallFormat::Hermes);
        Output::new(stops.iter().map(|s| s.to_string()).collect(), format)
    }

    fn feed(o: &mut Output, parts: &[&str]) -> Vec<Piece> {
        let mut v = Vec::new();
        for p in parts {
            v.extend(o.push(p, None));
        }
        v.extend(o.finish(""));
        v
    }

    fn text_of(v: &[Piece]) -> String {
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
        assert_eq!(text_of(&v), "hello ");
        assert!(o.stopped);
        let mut o = out(&["END"], false);
        let v = feed(&mut o, &["hello E", "N", "d"]);
        assert_eq!(text_of(&v), "hello ENd");
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
        assert_eq!(text_of(&v), "Sure.");
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
        assert!(o.cut_call);
    }

    /// Per call index: the name given out and the joined argument pieces.
    fn streamed_calls(v: &[Piece]) -> Vec<(String, String)> {
        let mut calls: Vec<(String, String)> = Vec::new();
        for p in v {
            match p {
                Piece::CallStart(i, name) => {
                    assert_eq!(*i, calls.len(), "calls start in order");
                    calls.push((name.clone(), String::new()));
                }
                Piece::CallArgs(i, t) => calls[*i].1.push_str(t),
                _ => {}
            }
        }
        calls
    }

    #[test]
    fn call_arguments_stream_piece_by_piece_and_join_into_the_call() {
        let args0 = r#"{"a": "}\"{ é", "b": [1, {"c": 2}], "d": -1.5e3}"#;
        let args1 = "{}";
        let text = format!(
            "Let me see. <tool_call>{{\"name\": \"f\", \"arguments\": {args0}}}</tool_call>\n<tool_call>{{\"name\": \"g-2\", \"arguments\": {args1}}}</tool_call>"
        );
        // One character at a time, as the smallest tokens would arrive.
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let parts: Vec<&str> = chars.iter().map(String::as_str).collect();
        let mut o = out(&[], true);
        let v = feed(&mut o, &parts);
        assert_eq!(text_of(&v), "Let me see.");
        let args_pieces = v
            .iter()
            .filter(|p| matches!(p, Piece::CallArgs(0, _)))
            .count();
        assert!(args_pieces > 10, "arguments arrive in pieces: {v:?}");
        assert_eq!(
            streamed_calls(&v),
            vec![("f".into(), args0.into()), ("g-2".into(), args1.into())]
        );
        assert_eq!(o.calls.len(), 2);
        assert_eq!(o.calls[0].arguments, args0);
        assert_eq!(o.calls[1].name, "g-2");
        assert!(!o.cut_call);
        // Each call's name comes before its arguments, and the finished call after both.
        let first_start = v.iter().position(|p| matches!(p, Piece::CallStart(0, _)));
        let first_args = v.iter().position(|p| matches!(p, Piece::CallArgs(0, _)));
        let first_done = v.iter().position(|p| matches!(p, Piece::Call(0, _)));
        assert!(first_start < first_args && first_args < first_done);
    }

    #[test]
    fn a_call_cut_inside_its_arguments_is_marked_cut() {
        let mut o = out(&[], true);
        let v = feed(
            &mut o,
            &["<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": \"ab"],
        );
        assert_eq!(
            streamed_calls(&v),
            vec![("f".into(), "{\"x\": \"ab".into())]
        );
        assert!(o.calls.is_empty());
        assert!(o.cut_call);
    }

    #[test]
    fn text_after_the_calls_is_not_given_out() {
        let mut o = out(&[], true);
        let v = feed(
            &mut o,
            &[
                "<tool_call>{\"name\": \"f\", \"arguments\": 7}</tool_call>",
                " and more",
            ],
        );
        assert_eq!(streamed_calls(&v), vec![("f".into(), "7".into())]);
        assert_eq!(text_of(&v), "");
        assert!(!o.cut_call);
    }

    #[test]
    fn the_value_scanner_ends_where_the_json_value_does() {
        for (text, end) in [
            (r#"{"a": "}"} x"#, 10),
            (r#"[1, [2], "]"], 3"#, 13),
            (r#""a\"b" x"#, 6),
            ("12.5}", 4),
            ("true ", 4),
        ] {
            let mut scan = ValueScan::default();
            let mut at = None;
            for (i, b) in text.bytes().enumerate() {
                match scan.feed(b) {
                    Scan::More => {}
                    Scan::EndWith => {
                        at = Some(i + 1);
                        break;
                    }
                    Scan::EndBefore => {
                        at = Some(i);
                        break;
                    }
                }
            }
            assert_eq!(at, Some(end), "{text}");
        }
    }

    #[test]
    fn llama3_calls_are_the_whole_answer_or_not_at_all() {
        let mut o = Output::new(Vec::new(), Some(CallFormat::Llama3));
        let v = feed(
            &mut o,
            &[" ", "\n{\"name\": \"f\", ", "\"parameters\": {\"x\": [1]}}"],
        );
        assert_eq!(
            streamed_calls(&v),
            vec![("f".into(), "{\"x\": [1]}".into())]
        );
        assert_eq!(text_of(&v), "");
        let mut o = Output::new(Vec::new(), Some(CallFormat::Llama3));
        let v = feed(&mut o, &["It is ", "{\"name\": \"f\"}"]);
        assert_eq!(text_of(&v), "It is {\"name\": \"f\"}");
        assert!(o.calls.is_empty());
    }

    #[test]
    fn mistral_calls_follow_text_and_each_other() {
        let mut o = Output::new(Vec::new(), Some(CallFormat::MistralArgs));
        let text = "Checking.[TOOL_CALLS]f[ARGS]{\"a\": \"[ARGS]\"}[TOOL_CALLS]g-1[ARGS]{}";
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let parts: Vec<&str> = chars.iter().map(String::as_str).collect();
        let v = feed(&mut o, &parts);
        assert_eq!(text_of(&v), "Checking.");
        assert_eq!(
            streamed_calls(&v),
            vec![
                ("f".into(), "{\"a\": \"[ARGS]\"}".into()),
                ("g-1".into(), "{}".into())
            ]
        );
        assert_eq!(o.calls.len(), 2);
        let mut o = Output::new(Vec::new(), Some(CallFormat::MistralList));
        let v = feed(
            &mut o,
            &[
                "[TOOL_CALLS][{\"name\": \"f\", \"arguments\": {}, \"id\": \"abcdefghi\"}]",
                "</s>",
            ],
        );
        assert_eq!(streamed_calls(&v), vec![("f".into(), "{}".into())]);
        assert_eq!(o.calls.len(), 1);
        assert!(!o.cut_call);
    }

    #[test]
    fn a_repeated_call_ends_the_answer_unseen() {
        // Hermes calls: the second differs (kept), the third repeats the first with its keys in
        // another order (dropped, and nothing after it is read).
        let mut o = Output::new(Vec::new(), Some(CallFormat::Hermes));
        let call = |args: &str| {
            format!("<tool_call>\n{{\"name\": \"f\", \"arguments\": {args}}}\n</tool_call>\n")
        };
        let text = format!(
            "{}{}{}{}",
            call(r#"{"a": 1, "b": [2]}"#),
            call(r#"{"a": 2}"#),
            call(r#"{"b": [2], "a": 1}"#),
            call(r#"{"a": 3}"#)
        );
        let chars: Vec<String> = text.chars().map(String::from).collect();
        let parts: Vec<&str> = chars.iter().map(String::as_str).collect();
        let v = feed(&mut o, &parts);
        assert_eq!(
            streamed_calls(&v),
            vec![
                ("f".into(), r#"{"a": 1, "b": [2]}"#.into()),
                ("f".into(), r#"{"a": 2}"#.into())
            ]
        );
        assert!(o.repeated_call && o.stopped && !o.cut_call);
        assert_eq!(o.calls.len(), 2);
        // Nothing of the repeated call was given out, not even its start.
        assert!(
            !v.iter()
                .any(|p| matches!(p, Piece::CallStart(2, _) | Piece::CallArgs(2, _)))
        );
    }
}

#[cfg(test)]
mod harmony_tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn read(o: &mut Output, text: &str) -> Vec<Piece> {
        let mut out = Vec::new();
        let mut buf = [0u8; 4];
        for c in text.chars() {
            out.extend(o.push(c.encode_utf8(&mut buf), None));
        }
        out.extend(o.finish(""));
        out
    }

    #[test]
    fn harmony_answers_split_into_reasoning_and_content_with_stops() {
        let mut o = Output::new(vec![" nice".into()], None).with_channels();
        read(
            &mut o,
            "<|channel|>analysis<|message|>Think <b>.<|end|><|start|>assistant<|channel|>final<|message|>Paris is nice.",
        );
        assert_eq!(o.reasoning, "Think <b>.");
        assert_eq!(o.content, "Paris is");
        assert!(o.stopped && o.calls.is_empty());
    }

    #[test]
    fn a_harmony_call_streams_and_a_cut_one_is_marked() {
        let head = "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>";
        let mut o = Output::new(Vec::new(), Some(CallFormat::Harmony)).with_channels();
        let pieces = read(&mut o, &format!("{head}{{\"city\": \"Oslo\"}}"));
        assert_eq!(o.reasoning, "Need weather.");
        assert_eq!(o.content, "");
        assert!(!o.cut_call);
        let args: String = pieces
            .iter()
            .filter_map(|p| match p {
                Piece::CallArgs(0, t) => Some(t.as_str()),
                _ => None,
            })
            .collect();
        assert_eq!(args, "{\"city\": \"Oslo\"}");
        assert!(pieces.contains(&Piece::CallStart(0, "get_weather".into())));
        assert_eq!(o.calls.len(), 1);
        assert_eq!(o.calls[0].arguments, "{\"city\": \"Oslo\"}");

        let mut o = Output::new(Vec::new(), Some(CallFormat::Harmony)).with_channels();
        read(&mut o, &format!("{head}{{\"city\": \"Os"));
        assert!(o.cut_call && o.calls.is_empty());
        // With tools off, a call message is only text of the answer.
        let mut o = Output::new(Vec::new(), None).with_channels();
        read(&mut o, &format!("{head}{{}}"));
        assert!(o.calls.is_empty() && o.content == "{}");
    }
}
