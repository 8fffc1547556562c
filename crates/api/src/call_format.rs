//! How a model family writes tool calls, told from its chat template.
//!
//! Models are tuned on one syntax each, and a call in another syntax is a call the model was
//! never taught to make. strata reads the syntax off the template, as llama.cpp does (the
//! markers the template writes when it renders an earlier call), and the grammar, the output
//! parser and the rendering of earlier calls all follow it:
//!
//! | syntax | families | one answer with two calls |
//! |---|---|---|
//! | [`CallFormat::Hermes`] | Qwen 2.5 / 3, SmolLM3, Hermes, any template without tools | `<tool_call>{"name": "f", "arguments": {…}}</tool_call>` `\n<tool_call>…</tool_call>` |
//! | [`CallFormat::MistralList`] | Mistral 7B v0.3, Nemo, Small 3.0 / 3.1 | `[TOOL_CALLS][{"name": "f", "arguments": {…}, "id": "a1b2c3d4e"}, …]` |
//! | [`CallFormat::MistralArgs`] | Mistral Small 3.2, Devstral, Magistral | `[TOOL_CALLS]f[ARGS]{…}[TOOL_CALLS]g[ARGS]{…}` |
//! | [`CallFormat::Granite`] | Granite 3 | `<|tool_call|>[{"name": "f", "arguments": {…}}, …]` |
//! | [`CallFormat::Llama3`] | Llama 3.1 – 3.3 | `{"name": "f", "parameters": {…}}` (the whole answer; one call) |
//! | [`CallFormat::Harmony`] | gpt-oss | `<|channel|>commentary to=functions.f <|constrain|>json<|message|>{…}<|call|>` (one call; the answer ends there) |
//!
//! gpt-oss's harmony format also splits every answer into channels: `analysis` (the reasoning,
//! given out as `reasoning_content`), `final` (the content) and `commentary` (calls, and
//! preambles, which are content); [`crate::output`] reads them whether tools are on or not.

/// The text that makes a harmony message a call of one of the client's functions.
pub(crate) const HARMONY_RECIPIENT: &str = "to=functions.";

/// A tool-call syntax.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CallFormat {
    /// `<tool_call>` JSON `</tool_call>` per call, a newline between calls.
    Hermes,
    /// `[TOOL_CALLS]` and a JSON list of calls, each with a nine-character id.
    MistralList,
    /// `[TOOL_CALLS]NAME[ARGS]ARGUMENTS` per call.
    MistralArgs,
    /// `<|tool_call|>` and a JSON list of calls.
    Granite,
    /// One bare JSON call `{"name": …, "parameters": …}` as the whole answer.
    Llama3,
    /// gpt-oss's harmony messages: a call is a `commentary` message to `functions.NAME`.
    Harmony,
}

/// The fixed texts around calls; every syntax is these plus a call body.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Shape {
    /// The text that opens the calls; `None`: calls are the whole answer, from its start.
    pub trigger: Option<&'static str>,
    /// Right after the trigger, before the first call (the list's `[`).
    pub first: &'static [&'static str],
    /// After each call.
    pub after_each: &'static [&'static str],
    /// Between one call (with its `after_each`) and the next; `None`: one call only.
    pub next: Option<&'static [&'static str]>,
    /// After the last call.
    pub end: &'static [&'static str],
    /// The body: `NAME[ARGS]ARGUMENTS` rather than a JSON envelope.
    pub name_args: bool,
    /// The envelope's arguments key.
    pub args_key: &'static str,
    /// The envelope carries the model's own call id after the arguments.
    pub id: bool,
}

impl CallFormat {
    /// The syntax `template` (a chat template's source) writes calls in. A template that never
    /// mentions tools gets strata's default prompt, which asks for [`CallFormat::Hermes`].
    pub fn detect(template: Option<&str>) -> CallFormat {
        let Some(src) = template else {
            return CallFormat::Hermes;
        };
        if src.contains("<|channel|>") && src.contains("<|message|>") {
            // Harmony's channels shape every answer, with tools or without.
            CallFormat::Harmony
        } else if !src.contains("tools") {
            CallFormat::Hermes
        } else if src.contains("[TOOL_CALLS]") {
            if src.contains("[ARGS]") {
                CallFormat::MistralArgs
            } else {
                CallFormat::MistralList
            }
        } else if src.contains("<|tool_call|>") {
            CallFormat::Granite
        } else if src.contains("<|start_header_id|>") && src.contains("\"parameters\"") {
            CallFormat::Llama3
        } else {
            CallFormat::Hermes
        }
    }

    /// A short name, for logs and `/v1/models`.
    pub fn name(self) -> &'static str {
        match self {
            CallFormat::Hermes => "hermes",
            CallFormat::MistralList => "mistral-list",
            CallFormat::MistralArgs => "mistral-args",
            CallFormat::Granite => "granite",
            CallFormat::Llama3 => "llama3",
            CallFormat::Harmony => "harmony",
        }
    }

    pub(crate) fn shape(self) -> Shape {
        const NONE: &[&str] = &[];
        match self {
            CallFormat::Hermes => Shape {
                trigger: Some("<tool_call>"),
                first: NONE,
                after_each: &["</tool_call>"],
                next: Some(&["\n", "<tool_call>"]),
                end: NONE,
                name_args: false,
                args_key: "arguments",
                id: false,
            },
            CallFormat::MistralList => Shape {
                trigger: Some("[TOOL_CALLS]"),
                first: &["["],
                after_each: NONE,
                next: Some(&[", "]),
                end: &["]"],
                name_args: false,
                args_key: "arguments",
                id: true,
            },
            CallFormat::MistralArgs => Shape {
                trigger: Some("[TOOL_CALLS]"),
                first: NONE,
                after_each: NONE,
                next: Some(&["[TOOL_CALLS]"]),
                end: NONE,
                name_args: true,
                args_key: "arguments",
                id: false,
            },
            CallFormat::Granite => Shape {
                trigger: Some("<|tool_call|>"),
                id: false,
                ..CallFormat::MistralList.shape()
            },
            // The recipient opens a call; the rest of its header and the message are written
            // by the grammar of [`crate::grammar`] and read by [`crate::output`]'s channels.
            CallFormat::Harmony => Shape {
                trigger: Some(HARMONY_RECIPIENT),
                first: NONE,
                after_each: NONE,
                next: None,
                end: NONE,
                name_args: true,
                args_key: "arguments",
                id: false,
            },
            CallFormat::Llama3 => Shape {
                trigger: None,
                first: NONE,
                after_each: NONE,
                next: None,
                end: NONE,
                name_args: false,
                args_key: "parameters",
                id: false,
            },
        }
    }

    /// Whether one answer can hold several calls.
    pub fn parallel(self) -> bool {
        self.shape().next.is_some()
    }

    /// The fixed texts this syntax writes; those that are control tokens of the vocabulary
    /// must reach the output parser although control tokens are not decoded as text.
    pub fn markers(self) -> Vec<&'static str> {
        let s = self.shape();
        let mut m: Vec<&'static str> = s.trigger.into_iter().collect();
        m.extend(s.first.iter().chain(s.after_each).chain(s.end));
        m.extend(s.next.unwrap_or(&[]).iter());
        if s.name_args && self != CallFormat::Harmony {
            m.push("[ARGS]");
        }
        m.sort_unstable();
        m.dedup();
        m
    }

    /// The call id an earlier call is rendered with. Mistral's templates refuse any id but
    /// nine letters and digits, so OpenAI's `call_…` ids map to such an id (the same one for
    /// the call and for the tool result that answers it); other syntaxes keep the client's.
    pub fn history_id(self, id: &str) -> String {
        if !matches!(self, CallFormat::MistralList | CallFormat::MistralArgs)
            || (id.len() == 9 && id.bytes().all(|b| b.is_ascii_alphanumeric()))
        {
            return id.to_string();
        }
        // FNV-1a: the same id on every run and Rust version.
        let mut v = id.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
            (h ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3)
        });
        const DIGITS: &[u8] = b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
        (0..9)
            .map(|_| {
                let c = DIGITS[(v % DIGITS.len() as u64) as usize] as char;
                v /= DIGITS.len() as u64;
                c
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_syntax_is_read_off_the_template() {
        let cases = [
            (None, CallFormat::Hermes),
            (Some("{{ messages }}"), CallFormat::Hermes),
            (
                Some("{% if tools %}<tool_call>{% endif %}"),
                CallFormat::Hermes,
            ),
            (
                Some("{% if tools %}[AVAILABLE_TOOLS]{% endif %}[TOOL_CALLS]"),
                CallFormat::MistralList,
            ),
            (
                Some("{% if tools %}{% endif %}[TOOL_CALLS]{{ name }}[ARGS]"),
                CallFormat::MistralArgs,
            ),
            (
                Some("{% if tools %}<|tool_call|>{% endif %}"),
                CallFormat::Granite,
            ),
            (
                Some(
                    "<|start_header_id|>{% if tools %}{\"name\": \"\", \"parameters\": {% endif %}",
                ),
                CallFormat::Llama3,
            ),
            // Markers without tools in the template: the default prompt's syntax.
            (Some("[TOOL_CALLS]"), CallFormat::Hermes),
            (
                Some("<|start|>assistant<|channel|>final<|message|>"),
                CallFormat::Harmony,
            ),
        ];
        for (src, want) in cases {
            assert_eq!(CallFormat::detect(src), want, "{src:?}");
        }
    }

    #[test]
    fn mistral_history_ids_are_nine_alphanumerics_and_stable() {
        let f = CallFormat::MistralList;
        let a = f.history_id("call_abc_0");
        assert_eq!(a.len(), 9);
        assert!(a.bytes().all(|b| b.is_ascii_alphanumeric()));
        assert_eq!(a, f.history_id("call_abc_0"));
        assert_ne!(a, f.history_id("call_abc_1"));
        assert_eq!(f.history_id("a1B2c3D4e"), "a1B2c3D4e");
        assert_eq!(CallFormat::Hermes.history_id("call_1"), "call_1");
    }

    #[test]
    fn markers_cover_every_fixed_text() {
        assert_eq!(
            CallFormat::MistralArgs.markers(),
            vec!["[ARGS]", "[TOOL_CALLS]"]
        );
        assert!(CallFormat::Llama3.markers().is_empty());
        assert!(!CallFormat::Llama3.parallel());
        assert!(CallFormat::Granite.markers().contains(&"<|tool_call|>"));
    }
}
