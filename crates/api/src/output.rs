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
#[path = "output_tests.rs"]
mod tests;
