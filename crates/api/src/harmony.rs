//! gpt-oss's harmony messages, split out of the generated text.
//!
//! A gpt-oss answer is a sequence of messages, each a header and a body:
//! `<|channel|>analysis<|message|>…<|end|><|start|>assistant<|channel|>final<|message|>…`. The
//! header's channel says what the body is (`analysis`: reasoning; `final`: the answer;
//! `commentary`: a preamble the user sees, or, with a recipient `to=functions.NAME`, a call whose
//! body is the arguments). The structure tokens are decoded as text (llama.cpp renders them too),
//! so this reads text: [`Messages::push`] turns it into [`Event`]s as soon as they are certain,
//! holding back only what may be the start of a structure token.

use crate::call_format::HARMONY_RECIPIENT;

/// What a message's body is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// The `analysis` channel: the model's reasoning.
    Reasoning,
    /// The answer (`final`), a `commentary` preamble, or text outside any header.
    Content,
    /// A call of the named function; the body is its arguments.
    Call(String),
}

/// One step of the message stream.
#[derive(Debug, PartialEq)]
pub(crate) enum Event {
    /// A message of this kind begins.
    Open(Kind),
    /// More of the open message's body.
    Text(String),
    /// The open message ended; `whole` unless generation stopped inside it.
    Close { whole: bool },
}

const HEADER_END: &str = "<|message|>";
/// A header opens a message; the answer's first one may also go on from the generation
/// prompt's `<|start|>assistant` with the recipient (` to=functions.f<|channel|>…`).
const HEADER_STARTS: [&str; 3] = ["<|start|>", "<|channel|>", " to="];
/// What ends a body: the end of a message (`<|end|>`; `<|return|>` and `<|call|>` end the
/// generation and are seldom decoded), or a next header.
const BODY_ENDS: [&str; 5] = [
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|start|>",
    "<|channel|>",
];

/// The message reader.
#[derive(Debug, Default)]
pub(crate) struct Messages {
    held: String,
    open: Option<Kind>,
}

impl Messages {
    /// Adds generated text (`end`: generation is over); returns what is now certain.
    pub(crate) fn push(&mut self, text: &str, end: bool) -> Vec<Event> {
        self.held.push_str(text);
        let mut out = Vec::new();
        loop {
            if self.open.is_none() {
                // Between messages: a message's end marker may still be ahead of the header.
                let rest = self.held.trim_start_matches("<|end|>");
                let cut = self.held.len() - rest.len();
                self.held.drain(..cut);
                if self.held.is_empty() {
                    return out;
                }
                let header = HEADER_STARTS.iter().any(|h| self.held.starts_with(h));
                let maybe = HEADER_STARTS
                    .iter()
                    .chain(&["<|end|>"])
                    .any(|h| h.starts_with(self.held.as_str()));
                if header {
                    let Some(at) = self.held.find(HEADER_END) else {
                        if end {
                            // A header cut off: nothing of it is an answer.
                            self.held.clear();
                        }
                        return out;
                    };
                    let kind = kind_of(&self.held[..at]);
                    self.held.drain(..at + HEADER_END.len());
                    out.push(Event::Open(kind.clone()));
                    self.open = Some(kind);
                } else if maybe && !end {
                    return out;
                } else {
                    // Text outside any header (a model that skips them): the answer.
                    out.push(Event::Open(Kind::Content));
                    self.open = Some(Kind::Content);
                }
                continue;
            }
            let found = BODY_ENDS
                .iter()
                .filter_map(|m| self.held.find(m).map(|at| (at, *m)))
                .min();
            if let Some((at, marker)) = found {
                let body: String = self.held.drain(..at).collect();
                if !body.is_empty() {
                    out.push(Event::Text(body));
                }
                if !matches!(marker, "<|start|>" | "<|channel|>") {
                    self.held.drain(..marker.len());
                }
                out.push(Event::Close { whole: true });
                self.open = None;
                continue;
            }
            let keep = if end { 0 } else { partial_marker(&self.held) };
            let body: String = self.held.drain(..self.held.len() - keep).collect();
            if !body.is_empty() {
                out.push(Event::Text(body));
            }
            if end {
                out.push(Event::Close { whole: false });
                self.open = None;
            }
            return out;
        }
    }
}

/// What the message whose header is `header` holds: a call if it is addressed to a function,
/// reasoning on the `analysis` channel, the answer otherwise.
fn kind_of(header: &str) -> Kind {
    if let Some(at) = header.find(HARMONY_RECIPIENT) {
        let rest = &header[at + HARMONY_RECIPIENT.len()..];
        let len = rest
            .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
            .unwrap_or(rest.len());
        if len > 0 {
            return Kind::Call(rest[..len].to_string());
        }
    }
    let channel = header
        .rsplit_once("<|channel|>")
        .map(|(_, c)| c.split([' ', '<']).next().unwrap_or(""));
    match channel {
        Some("analysis") => Kind::Reasoning,
        _ => Kind::Content,
    }
}

/// Length of the longest suffix of `s` that is a proper prefix of a body's end marker.
fn partial_marker(s: &str) -> usize {
    let mut keep = 0;
    for m in BODY_ENDS {
        for n in (1..m.len()).rev() {
            if n > keep && s.ends_with(&m[..n]) {
                keep = n;
                break;
            }
        }
    }
    keep
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(pieces: &[&str]) -> Vec<Event> {
        let mut m = Messages::default();
        let mut out = Vec::new();
        for p in pieces {
            out.extend(m.push(p, false));
        }
        out.extend(m.push("", true));
        // Join consecutive texts, so the result does not depend on where pieces were cut.
        let mut joined: Vec<Event> = Vec::new();
        for e in out {
            match (joined.last_mut(), e) {
                (Some(Event::Text(a)), Event::Text(b)) => a.push_str(&b),
                (_, e) => joined.push(e),
            }
        }
        joined
    }

    fn text(s: &str) -> Event {
        Event::Text(s.to_string())
    }

    #[test]
    fn reasoning_then_answer_in_any_cut() {
        let whole = "<|channel|>analysis<|message|>User asks. <b> is fine.<|end|><|start|>assistant<|channel|>final<|message|>Paris.";
        let want = vec![
            Event::Open(Kind::Reasoning),
            text("User asks. <b> is fine."),
            Event::Close { whole: true },
            Event::Open(Kind::Content),
            text("Paris."),
            Event::Close { whole: false },
        ];
        assert_eq!(read(&[whole]), want);
        // Every cut into two pieces, and one character at a time, reads the same.
        for at in (0..whole.len()).filter(|&i| whole.is_char_boundary(i)) {
            assert_eq!(read(&[&whole[..at], &whole[at..]]), want, "cut at {at}");
        }
        let chars: Vec<String> = whole.chars().map(String::from).collect();
        let chars: Vec<&str> = chars.iter().map(String::as_str).collect();
        assert_eq!(read(&chars), want);
    }

    #[test]
    fn calls_in_either_header_order() {
        for header in [
            "<|channel|>commentary to=functions.get_weather <|constrain|>json",
            "<|start|>assistant to=functions.get_weather<|channel|>commentary json",
        ] {
            let s = format!("{header}<|message|>{{\"city\": \"Oslo\"}}");
            assert_eq!(
                read(&[&s]),
                vec![
                    Event::Open(Kind::Call("get_weather".into())),
                    text("{\"city\": \"Oslo\"}"),
                    Event::Close { whole: false },
                ],
                "{header}"
            );
        }
        // A preamble to the user on the commentary channel is content.
        assert_eq!(
            read(&["<|channel|>commentary<|message|>Checking.<|end|>"]),
            vec![
                Event::Open(Kind::Content),
                text("Checking."),
                Event::Close { whole: true },
            ]
        );
    }

    #[test]
    fn text_without_headers_is_the_answer_and_cut_headers_are_dropped() {
        assert_eq!(
            read(&["Hello <|", "there"]),
            vec![
                Event::Open(Kind::Content),
                text("Hello <|there"),
                Event::Close { whole: false },
            ]
        );
        assert_eq!(read(&["<|channel|>analy"]), vec![]);
    }
}
