//! Chat templates: `tokenizer.chat_template` rendered the way Hugging Face renders it.
//!
//! Models are fine-tuned on conversations formatted by their template, so the prompt must be
//! exactly what `transformers.apply_chat_template` would produce: jinja2 with `trim_blocks` and
//! `lstrip_blocks`, loop controls, `raise_exception`, `strftime_now`, Python's `tojson`, Python
//! string methods (`.strip()`, `.startswith()`), and the context variables `messages`,
//! `add_generation_prompt`, `bos_token`, `eos_token`, `tools` (`none` when absent) and
//! `documents`. minijinja with `minijinja-contrib`'s Python compatibility provides that.
//!
//! [`ChatTemplate::render_with`] takes [`RenderOptions`], so tools and template-specific
//! switches (`enable_thinking`, …) can be passed without changing the signature.

use minijinja::syntax::SyntaxConfig;
use minijinja::value::{Serde, Value};
use minijinja::{Environment, ErrorKind};
use serde::{Deserialize, Serialize};
use strata_gguf::Metadata;

use crate::jinja_compat;
use crate::{Error, Result};

/// One message of a conversation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` (or `tool`, if the template knows it).
    pub role: String,
    /// The message text.
    pub content: String,
}

impl ChatMessage {
    /// A message from its role and content.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> ChatMessage {
        ChatMessage {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// Everything besides the messages that a render may use. Construct with
/// [`RenderOptions::new`] and the builder methods; new options will be added as methods.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct RenderOptions {
    /// End with the header of an assistant turn, so the model continues as the assistant.
    pub add_generation_prompt: bool,
    /// Tool definitions (a JSON array of OpenAI-style `{"type": "function", ...}` objects),
    /// exposed to the template as `tools`.
    pub tools: Option<serde_json::Value>,
    /// Further template variables (`enable_thinking`, `documents`, …); they override the
    /// defaults of the same name.
    pub extra: serde_json::Map<String, serde_json::Value>,
}

impl RenderOptions {
    /// No generation prompt, no tools, no extra variables.
    pub fn new() -> RenderOptions {
        RenderOptions::default()
    }

    /// Sets [`RenderOptions::add_generation_prompt`].
    pub fn generation_prompt(mut self, yes: bool) -> RenderOptions {
        self.add_generation_prompt = yes;
        self
    }

    /// Sets [`RenderOptions::tools`].
    pub fn tools(mut self, tools: serde_json::Value) -> RenderOptions {
        self.tools = Some(tools);
        self
    }

    /// Adds one template variable.
    pub fn var(mut self, name: impl Into<String>, value: serde_json::Value) -> RenderOptions {
        self.extra.insert(name.into(), value);
        self
    }
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("source_len", &self.source.len())
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .finish_non_exhaustive()
    }
}

const TEMPLATE_NAME: &str = "chat_template";

/// The text of the token whose id is stored under `key`, or "" if there is none.
fn token_text(md: &Metadata, key: &str) -> Result<String> {
    if md.get(key).is_none() {
        return Ok(String::new());
    }
    let id = md.get_u32(key)? as usize;
    let tokens = md.get_str_array("tokenizer.ggml.tokens")?;
    Ok(tokens.get(id).cloned().unwrap_or_default())
}

/// Templates strata carries for models whose GGUF has none: `(name, source)`.
pub const BUILTIN_TEMPLATES: &[(&str, &str)] = &[
    ("chatml", include_str!("../templates/chatml.jinja")),
    ("gemma", include_str!("../templates/gemma.jinja")),
];

impl ChatTemplate {
    /// The source of the built-in template `name` (see [`BUILTIN_TEMPLATES`]).
    pub fn builtin(name: &str) -> Option<&'static str> {
        BUILTIN_TEMPLATES
            .iter()
            .find(|(n, _)| *n == name)
            .map(|(_, s)| *s)
    }

    /// Compiles `source` in place of the model's own template, with the BOS and EOS texts the
    /// model's metadata names.
    pub fn for_model(md: &Metadata, source: impl Into<String>) -> Result<ChatTemplate> {
        let bos = token_text(md, "tokenizer.ggml.bos_token_id")?;
        let eos = token_text(md, "tokenizer.ggml.eos_token_id")?;
        ChatTemplate::new(source, bos, eos)
    }

    /// The model's default template (`tokenizer.chat_template`), or `None` if it has none.
    /// `bos_token`/`eos_token` are the texts of the BOS/EOS tokens the metadata names.
    pub fn from_gguf(md: &Metadata) -> Result<Option<ChatTemplate>> {
        const KEY: &str = "tokenizer.chat_template";
        if md.get(KEY).is_none() {
            return Ok(None);
        }
        ChatTemplate::for_model(md, md.get_str(KEY)?).map(Some)
    }

    /// Compiles a template from source (for templates supplied by a user or a model card).
    pub fn new(
        source: impl Into<String>,
        bos_token: impl Into<String>,
        eos_token: impl Into<String>,
    ) -> Result<ChatTemplate> {
        let source = source.into();
        let mut env = Environment::new();
        env.set_syntax(
            SyntaxConfig::builder()
                .trim_blocks(true)
                .lstrip_blocks(true)
                .build()?,
        );
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", jinja_compat::tojson);
        env.add_function("raise_exception", |msg: String| -> Result<Value, _> {
            Err(minijinja::Error::new(ErrorKind::InvalidOperation, msg))
        });
        env.add_function("strftime_now", |fmt: String| {
            jinja_compat::strftime_now(&fmt)
        });
        env.add_template_owned(TEMPLATE_NAME, source.clone())?;
        Ok(ChatTemplate {
            env,
            source,
            bos_token: bos_token.into(),
            eos_token: eos_token.into(),
        })
    }

    /// The template source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Renders a conversation; with `add_generation_prompt` the result ends with the header of
    /// the assistant's turn.
    pub fn render(&self, messages: &[ChatMessage], add_generation_prompt: bool) -> Result<String> {
        self.render_with(
            messages,
            &RenderOptions::new().generation_prompt(add_generation_prompt),
        )
    }

    /// Renders a conversation with tools and extra template variables. Messages may be
    /// [`ChatMessage`]s or any serialisable objects (e.g. JSON with `tool_calls`).
    pub fn render_with<M: Serialize>(
        &self,
        messages: &[M],
        opts: &RenderOptions,
    ) -> Result<String> {
        let mut ctx = serde_json::Map::new();
        ctx.insert(
            "messages".into(),
            serde_json::to_value(messages).map_err(json_err)?,
        );
        ctx.insert(
            "add_generation_prompt".into(),
            opts.add_generation_prompt.into(),
        );
        ctx.insert("bos_token".into(), self.bos_token.clone().into());
        ctx.insert("eos_token".into(), self.eos_token.clone().into());
        // transformers passes these as None when absent, so `tools is not none` is false.
        ctx.insert(
            "tools".into(),
            opts.tools.clone().unwrap_or(serde_json::Value::Null),
        );
        ctx.insert("documents".into(), serde_json::Value::Null);
        for (k, v) in &opts.extra {
            ctx.insert(k.clone(), v.clone());
        }
        let tmpl = self.env.get_template(TEMPLATE_NAME)?;
        Ok(tmpl.render(Value::from(Serde(&ctx)))?)
    }
}

fn json_err(e: serde_json::Error) -> Error {
    Error::Template(minijinja::Error::new(
        ErrorKind::InvalidOperation,
        format!("building the template context: {e}"),
    ))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    fn tmpl(src: &str) -> ChatTemplate {
        ChatTemplate::new(src, "<s>", "</s>").unwrap()
    }

    #[test]
    fn trims_blocks_like_hf() {
        let t = tmpl(
            "{% for m in messages %}\n  {% if true %}\n[{{ m.role }}]\n  {% endif %}\n{% endfor %}\n",
        );
        let out = t.render(&[ChatMessage::new("user", "x")], false).unwrap();
        assert_eq!(out, "[user]\n");
    }

    #[test]
    fn raise_exception_becomes_an_error_with_the_message() {
        let t = tmpl("{{ raise_exception('Roles must alternate') }}");
        let err = t.render(&[], false).unwrap_err();
        assert!(err.to_string().contains("Roles must alternate"), "{err}");
    }

    #[test]
    fn python_string_methods_and_loop_controls_work() {
        let t = tmpl(
            "{% for m in messages %}{% if m.content.startswith('skip') %}{% continue %}{% endif %}\
             {{ m.content.strip() | upper }}{% endfor %}{{ bos_token }}",
        );
        let msgs = [
            ChatMessage::new("user", "skip me"),
            ChatMessage::new("user", "  hi  "),
        ];
        assert_eq!(t.render(&msgs, false).unwrap(), "HI<s>");
    }

    #[test]
    fn tools_default_to_none_and_can_be_passed() {
        let t = tmpl("{% if tools is not none %}{{ tools | tojson }}{% else %}no tools{% endif %}");
        assert_eq!(t.render(&[], false).unwrap(), "no tools");
        let opts = RenderOptions::new().tools(serde_json::json!([{"type": "function"}]));
        assert_eq!(
            t.render_with::<ChatMessage>(&[], &opts).unwrap(),
            r#"[{"type": "function"}]"#
        );
    }

    #[test]
    fn gemmas_builtin_template_writes_gemmas_turns() {
        let t = tmpl(ChatTemplate::builtin("gemma").unwrap());
        let msgs = [
            ChatMessage::new("system", "Be brief."),
            ChatMessage::new("user", " Hi "),
            ChatMessage::new("assistant", "Hello."),
            ChatMessage::new("tool", "sunny"),
        ];
        assert_eq!(
            t.render(&msgs, true).unwrap(),
            "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n\
             <start_of_turn>model\nHello.<end_of_turn>\n\
             <start_of_turn>user\nsunny<end_of_turn>\n<start_of_turn>model\n"
        );
        // A system prompt with no user turn after it gets a turn of its own; content given
        // as parts is their text.
        let parts = serde_json::json!([
            {"role": "system", "content": [{"type": "text", "text": "A"}, {"type": "text", "text": "B"}]},
            {"role": "assistant", "content": "Hi."},
        ]);
        let msgs: Vec<serde_json::Value> = serde_json::from_value(parts).unwrap();
        assert_eq!(
            t.render_with(&msgs, &RenderOptions::new()).unwrap(),
            "<start_of_turn>user\nAB<end_of_turn>\n<start_of_turn>model\nHi.<end_of_turn>\n"
        );
    }

    #[test]
    fn chatml_builtin_template_writes_any_role() {
        let t = tmpl(ChatTemplate::builtin("chatml").unwrap());
        let msgs = [
            ChatMessage::new("system", "S"),
            ChatMessage::new("tool", "T"),
        ];
        assert_eq!(
            t.render(&msgs, true).unwrap(),
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>tool\nT<|im_end|>\n<|im_start|>assistant\n"
        );
        assert!(ChatTemplate::builtin("nope").is_none());
    }
}
