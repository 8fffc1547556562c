//! Constrained decoding with llguidance: JSON-schema output (`response_format`) and tool calls
//! whose arguments always match the function's schema.
//!
//! Tool calls are written in the model family's own syntax ([`CallFormat`]). Under
//! `tool_choice: required` or a named function the whole answer follows the call grammar. Under
//! `auto` the model writes freely until it opens a call; from the opening marker on, the call
//! grammar takes over (a lazy grammar, as llama.cpp's trigger words work), so any call it makes
//! is well formed. Llama 3's calls have no marker: they are the whole answer, so there the
//! first token decides (a `{` opens a call, and must begin a well-formed one).

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use serde_json::{Value, json};
use strata_tokenizer::Tokenizer;

use crate::call_format::CallFormat;
use crate::tools::{self, Choice};
use crate::types::Tool;
use strata_scheduler::{Constraint, ConstraintError};

/// JSON layout every constrained output uses: one space after `:` and `,`, no other
/// whitespace, so a weak model cannot pad the output forever. Leniently: keywords the grammar
/// cannot enforce (`propertyNames`, `uniqueItems`, `not`, `if`/`then`/`else`, `contains`,
/// `dependentRequired`, unknown `format`s, `minProperties` over optional keys) are left to the
/// check of the finished output ([`crate::tools::violations`]) instead of refusing the schema.
fn compact(mut schema: Value) -> Value {
    if let Value::Object(m) = &mut schema {
        m.insert(
            "x-guidance".into(),
            json!({
                "whitespace_flexible": false,
                "item_separator": ", ",
                "key_separator": ": ",
                "lenient": true,
            }),
        );
    }
    schema
}

/// A grammar compiler's error as a client can act on it: its first line, without the
/// position in strata's own grammar text (which the client never wrote).
fn readable(e: String) -> String {
    let first = e.lines().next().unwrap_or_default().trim();
    // "at 2(7): failed to compile JSON schema: ..." names a line of the generated grammar.
    let first = match first.split_once("): ") {
        Some((at, rest)) if at.starts_with("at ") => rest,
        _ => first,
    };
    first
        .strip_prefix("failed to compile JSON schema: ")
        .unwrap_or(first)
        .to_string()
}

/// The largest grammar compiled for a request, in bytes of its text (the JSON schema, or the
/// tool calls' grammar with every tool's parameters). Real tool sets are tens of KiB; compile
/// time and memory grow with size, and a 3 MB `const` took seconds of engine time.
pub(crate) const MAX_GRAMMAR_BYTES: usize = 256 << 10;

/// Why a grammar cannot be set up, compiled or followed; the message is the request's.
#[derive(Debug, thiserror::Error)]
pub enum GrammarError {
    /// The vocabulary cannot back a grammar compiler.
    #[error("{0}")]
    Setup(String),
    /// The schema breaks a limit this server keeps.
    #[error(transparent)]
    Schema(#[from] crate::schema_limits::SchemaError),
    /// A tool's definition cannot be turned into a call grammar.
    #[error("{0}")]
    Tool(String),
    /// The grammar's text is over the size this server compiles (256 KiB).
    #[error("it is {kib} KiB, more than the {limit_kib} KiB this server compiles")]
    TooLarge {
        /// Its size.
        kib: usize,
        /// The limit.
        limit_kib: usize,
    },
    /// The most grammars this server compiles at once are compiling already.
    #[error("{MAX_COMPILING} grammars are compiling on this server already; retry in a moment")]
    Busy,
    /// The compiler refused the grammar (its reason, made readable).
    #[error("{0}")]
    Rejected(String),
    /// The compiler panicked on it.
    #[error("the grammar compiler gave up on it: {0}")]
    Panicked(String),
    /// No thread for the compiler.
    #[error("the grammar compiler could not start: {0}")]
    NoThread(#[source] std::io::Error),
    /// The compile outlasted its deadline.
    #[error("it took more than {} s to compile", COMPILE_DEADLINE.as_secs())]
    TimedOut,
    /// The compiling thread ended without an answer.
    #[error("the grammar compiler stopped without an answer")]
    Stopped,
    /// Following the output failed (a mask, a token the grammar cannot take).
    #[error("{0}")]
    Follow(String),
}

fn check_size(text: &str) -> Result<(), GrammarError> {
    if text.len() > MAX_GRAMMAR_BYTES {
        return Err(GrammarError::TooLarge {
            kib: text.len().div_ceil(1024),
            limit_kib: MAX_GRAMMAR_BYTES >> 10,
        });
    }
    Ok(())
}

/// The stack of a grammar-compiling thread. The compiler recurses a few KiB per nested
/// schema; [`crate::schema_limits::MAX_DEPTH`] keeps a schema well under a tenth of this
/// (tested on a thread of the default 2 MiB).
const COMPILE_STACK: usize = 64 << 20;

/// How long a request waits for its grammar. The limits make compiles take milliseconds;
/// this is the bound on a wait, should one not.
const COMPILE_DEADLINE: std::time::Duration = std::time::Duration::from_secs(10);

/// Most grammars compiling at once on one server (a compile past its deadline still counts
/// until it ends, so hostile schemas cannot pile up threads).
const MAX_COMPILING: usize = 8;

/// Most lexer states one grammar builds (see [`Grammars::new`]).
const MAX_LEXER_STATES: usize = 100_000;

/// Grammars compiling now.
static COMPILING: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// One of [`MAX_COMPILING`] places, held while a grammar compiles.
struct CompileSlot;

impl CompileSlot {
    fn take() -> Option<CompileSlot> {
        use std::sync::atomic::Ordering;
        COMPILING
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |n| {
                (n < MAX_COMPILING).then_some(n + 1)
            })
            .ok()
            .map(|_| CompileSlot)
    }
}

impl Drop for CompileSlot {
    fn drop(&mut self) {
        COMPILING.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// The compile itself (see [`Grammars::matcher`]).
fn compile(factory: &ParserFactory, grammar: TopLevelGrammar) -> Result<Matcher, GrammarError> {
    let parser = factory
        .create_parser(grammar)
        .map_err(|e| GrammarError::Rejected(readable(e.to_string())))?;
    let mut m = Matcher::new(Ok(parser));
    if let Some(e) = m.get_error() {
        return Err(GrammarError::Rejected(readable(e)));
    }
    m.compute_mask()
        .map_err(|e| GrammarError::Rejected(readable(e.to_string())))?;
    Ok(m)
}

struct Env {
    trie: TokTrie,
    tok: Arc<Tokenizer>,
}

impl TokenizerEnv for Env {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<u32> {
        self.tok
            .encode_continuation(&String::from_utf8_lossy(s))
            .unwrap_or_default()
    }
}

/// Grammar compilation for one tokenizer (building the token trie takes ~0.1 s, once).
#[derive(Clone)]
pub struct Grammars {
    factory: Arc<ParserFactory>,
    tok: Arc<Tokenizer>,
    format: CallFormat,
    /// Tokens whose text contains the last character of the format's trigger (candidates for
    /// completing it).
    closers: Arc<Vec<u32>>,
}

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammars").finish_non_exhaustive()
    }
}

impl Grammars {
    /// Builds the token trie of `tok`, for calls in `format`. Control tokens are marked
    /// special, so grammars never produce them as text (a marker that is a control token is
    /// written as that token); end-of-generation tokens end a complete grammar.
    pub fn new(tok: Arc<Tokenizer>, format: CallFormat) -> Result<Grammars, GrammarError> {
        let n = tok.vocab_size() as u32;
        let words: Vec<Vec<u8>> = (0..n)
            .map(|id| {
                let b = tok.token_bytes(id);
                if tok.is_control(id) || tok.is_eog(id) {
                    let mut w = vec![TokTrie::SPECIAL_TOKEN_MARKER];
                    w.extend_from_slice(b);
                    w
                } else {
                    b.to_vec()
                }
            })
            .collect();
        let eos = tok
            .eos_id()
            .or_else(|| tok.eog_ids().first().copied())
            .unwrap_or(0);
        let info = TokRxInfo::new(n, eos);
        let trie = TokTrie::from(&info, &words).with_eos_tokens(tok.eog_ids());
        let closers = match format.shape().trigger {
            Some(t) => {
                let last = t.as_bytes()[t.len() - 1];
                (0..n)
                    .filter(|&id| !tok.is_control(id) && tok.token_bytes(id).contains(&last))
                    .collect()
            }
            None => Vec::new(),
        };
        let env: TokEnv = Arc::new(Env {
            trie,
            tok: Arc::clone(&tok),
        });
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| GrammarError::Setup(e.to_string()))?;
        factory.set_stderr_log_level(0);
        // Errors go back to the client: the reason, not llguidance's parser state and grammar.
        factory.limits_mut().verbose_errors = false;
        // The memory one request's grammar may take as it runs: lexer states are built as the
        // output needs them (about 1-2 KiB each), and the compiler's default of 250,000 lets
        // one hostile grammar hold up to half a GiB. 100,000 holds the longest bounded strings
        // real schemas ask for (a state per character of a `maxLength`) many times over.
        factory.limits_mut().max_lexer_states = MAX_LEXER_STATES;
        Ok(Grammars {
            factory: Arc::new(factory),
            tok,
            format,
            closers: Arc::new(closers),
        })
    }

    /// Compiles `grammar` and computes its first mask, so a grammar that fails only when first
    /// used (a schema that refers to itself without end) fails here, as the request's 400, and
    /// not on the engine thread in the middle of a batch.
    ///
    /// The work runs on a thread of its own with a [`COMPILE_STACK`] stack, whatever thread
    /// asks: the compiler recurses along the schema, and a panic or a deep recursion there is
    /// the request's error, never the process's end. The schema limits
    /// ([`crate::schema_limits`]) and the compiler's own ([`Grammars::new`]) bound the work;
    /// past [`COMPILE_DEADLINE`] the request is answered anyway, and the thread, whose work is
    /// bounded, still counts against [`MAX_COMPILING`] until it ends.
    fn matcher(&self, grammar: TopLevelGrammar) -> Result<Matcher, GrammarError> {
        let slot = CompileSlot::take().ok_or(GrammarError::Busy)?;
        let factory = Arc::clone(&self.factory);
        let (tx, rx) = std::sync::mpsc::sync_channel(1);
        std::thread::Builder::new()
            .name("grammar-compile".into())
            .stack_size(COMPILE_STACK)
            .spawn(move || {
                let _slot = slot;
                let compiled = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    compile(&factory, grammar)
                }))
                .unwrap_or_else(|panic| {
                    let why = panic
                        .downcast_ref::<&str>()
                        .map(|s| s.to_string())
                        .or_else(|| panic.downcast_ref::<String>().cloned())
                        .unwrap_or_else(|| "no reason given".into());
                    tracing::warn!(%why, "the grammar compiler panicked");
                    Err(GrammarError::Panicked(why))
                });
                let _ = tx.send(compiled);
            })
            .map_err(GrammarError::NoThread)?;
        match rx.recv_timeout(COMPILE_DEADLINE) {
            Ok(compiled) => compiled,
            Err(std::sync::mpsc::RecvTimeoutError::Timeout) => Err(GrammarError::TimedOut),
            Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => Err(GrammarError::Stopped),
        }
    }

    /// Output that is a JSON value matching `schema` (`{"type": "object"}` for `json_object`).
    pub fn json(&self, schema: Value) -> Result<Box<dyn Constraint>, GrammarError> {
        let schema = crate::schema_limits::prepare(schema)?;
        let schema = compact(tools::bounded(tools::closed(schema)));
        check_size(&schema.to_string())?;
        let m = self.matcher(TopLevelGrammar::from_json_schema(schema))?;
        Ok(Box::new(Grammar { m }))
    }

    /// The tool-call syntax these grammars write.
    pub fn format(&self) -> CallFormat {
        self.format
    }

    /// Output that is one or more tool calls (one if `!parallel`) and nothing else.
    pub fn tool_calls(
        &self,
        tools: &[Tool],
        choice: &Choice,
        parallel: bool,
    ) -> Result<Box<dyn Constraint>, GrammarError> {
        let g = self.calls_grammar(tools, choice, parallel, true)?;
        check_size(&g)?;
        let m = self.matcher(TopLevelGrammar::from_lark(g))?;
        Ok(Box::new(Grammar { m }))
    }

    /// Free text that, once it opens a tool call, continues as well-formed calls only.
    pub fn lazy_tool_calls(
        &self,
        tools: &[Tool],
        choice: &Choice,
        parallel: bool,
    ) -> Result<Box<dyn Constraint>, GrammarError> {
        let rest = self.calls_grammar(tools, choice, parallel, false)?;
        check_size(&rest)?;
        // Compile now, so a bad schema is the request's 400 rather than a failure mid-stream.
        let first = self.matcher(TopLevelGrammar::from_lark(rest))?;
        let at_start = self.format.shape().trigger.is_none();
        Ok(Box::new(Lazy {
            g: self.clone(),
            at_start: at_start.then(|| first.clone()),
            fresh: first,
            tail: String::new(),
            active: None,
            free: false,
        }))
    }

    /// A fixed text as a lark terminal: the control token it is, if the vocabulary has one
    /// (Mistral's `[TOOL_CALLS]`), else the quoted text.
    fn lit(&self, text: &str) -> String {
        match self.tok.token_id(text) {
            Some(id) if self.tok.is_control(id) => format!("<[{id}]>"),
            _ => Value::String(text.to_string()).to_string(),
        }
    }

    fn lits(&self, texts: &[&str]) -> String {
        texts
            .iter()
            .map(|t| self.lit(t))
            .collect::<Vec<_>>()
            .join(" ")
    }

    /// The lark grammar of the calls of this format over `tools` (only the named one under
    /// [`Choice::Named`]). With `open`, the text starts with the opening marker; without,
    /// just after it.
    fn calls_grammar(
        &self,
        tools: &[Tool],
        choice: &Choice,
        parallel: bool,
        open: bool,
    ) -> Result<String, GrammarError> {
        if self.format == CallFormat::Harmony {
            return self.harmony_call(tools, choice, open);
        }
        let shape = self.format.shape();
        let mut start = Vec::new();
        if let (true, Some(t)) = (open, shape.trigger) {
            start.push(self.lit(t));
        }
        start.push(self.lits(shape.first));
        start.push(format!("call {}", self.lits(shape.after_each)));
        if let (true, Some(next)) = (parallel, shape.next) {
            start.push(format!(
                "({} call {})*",
                self.lits(next),
                self.lits(shape.after_each)
            ));
        }
        start.push(self.lits(shape.end));
        let start: Vec<String> = start.into_iter().filter(|p| !p.trim().is_empty()).collect();
        let call = if shape.name_args {
            // `NAME[ARGS]ARGUMENTS`, one alternative per function.
            tools::picked(tools, choice)
                .map(|t| {
                    Ok(format!(
                        "{} {} %json {}",
                        Value::String(t.function.name.clone()),
                        self.lit("[ARGS]"),
                        compact(tools::constrained(t).map_err(GrammarError::Tool)?)
                    ))
                })
                .collect::<Result<Vec<_>, GrammarError>>()?
                .join("\n    | ")
        } else {
            format!(
                "%json {}",
                compact(
                    tools::call_schema(tools, choice, self.format).map_err(GrammarError::Tool)?
                )
            )
        };
        Ok(format!("start: {}\ncall: {call}\n", start.join(" ")))
    }
}

impl Grammars {
    /// One harmony call message (the format has one call per answer): with `open`, from its
    /// channel on, else from just after the recipient's `to=functions.`; the function's name,
    /// the JSON constraint, the arguments and `<|call|>`, which ends the generation.
    fn harmony_call(
        &self,
        tools: &[Tool],
        choice: &Choice,
        open: bool,
    ) -> Result<String, GrammarError> {
        let head = if open {
            format!(
                "{} {} ",
                self.lit("<|channel|>"),
                Value::String(format!(
                    "commentary {}",
                    crate::call_format::HARMONY_RECIPIENT
                ))
            )
        } else {
            String::new()
        };
        // ` <|constrain|>json<|message|>`: the space and `json` are text, the markers tokens.
        let body = format!(
            "{} {} {} {}",
            Value::String(" ".into()),
            self.lit("<|constrain|>"),
            Value::String("json".into()),
            self.lit("<|message|>")
        );
        let end = self.lit("<|call|>");
        let call = tools::picked(tools, choice)
            .map(|t| {
                Ok(format!(
                    "{} {body} %json {} {end}",
                    Value::String(t.function.name.clone()),
                    compact(tools::constrained(t).map_err(GrammarError::Tool)?),
                ))
            })
            .collect::<Result<Vec<_>, GrammarError>>()?
            .join("\n    | ");
        Ok(format!("start: {head}call\ncall: {call}\n"))
    }
}

/// A grammar from the first token.
struct Grammar {
    m: Matcher,
}

fn apply_mask(m: &mut Matcher, logits: &mut [f32]) -> Result<(), GrammarError> {
    let mask = m
        .compute_mask()
        .map_err(|e| GrammarError::Follow(e.to_string()))?;
    for (id, l) in logits.iter_mut().enumerate() {
        if !mask.is_allowed(id as u32) {
            *l = f32::NEG_INFINITY;
        }
    }
    Ok(())
}

fn follow(m: &mut Matcher, token: u32) -> Result<bool, GrammarError> {
    m.consume_token(token)
        .map_err(|e| GrammarError::Follow(e.to_string()))?;
    Ok(complete(m))
}

/// Whether the grammar can take no more tokens.
fn complete(m: &mut Matcher) -> bool {
    m.is_stopped() || m.compute_mask().map(|v| v.is_zero()).unwrap_or(false)
}

/// Follows the tokens the grammar forces from here (a tool call's `{"name": "` and the
/// properties a schema requires in order are most of a call's tokens).
fn follow_forced(m: &mut Matcher, max: usize) -> Result<(Vec<u32>, bool), GrammarError> {
    let mut forced = m.compute_ff_tokens();
    if let Some(e) = m.get_error() {
        return Err(GrammarError::Follow(e));
    }
    forced.truncate(max);
    if forced.is_empty() {
        return Ok((forced, false));
    }
    m.consume_tokens(&forced)
        .map_err(|e| GrammarError::Follow(e.to_string()))?;
    let done = complete(m);
    Ok((forced, done))
}

impl Constraint for Grammar {
    fn mask(&mut self, logits: &mut [f32]) -> Result<(), ConstraintError> {
        Ok(apply_mask(&mut self.m, logits)?)
    }

    fn commit(&mut self, token: u32) -> Result<bool, ConstraintError> {
        Ok(follow(&mut self.m, token)?)
    }

    fn forced(&mut self, max: usize) -> Result<(Vec<u32>, bool), ConstraintError> {
        Ok(follow_forced(&mut self.m, max)?)
    }
}

/// Free text until the format's trigger, then the call grammar; for a format whose calls are
/// the whole answer, the first token decides.
struct Lazy {
    g: Grammars,
    /// The call grammar as compiled for the request, cloned when the trigger appears (no
    /// compile on the engine thread).
    fresh: Matcher,
    /// The last few characters of the free text.
    tail: String,
    active: Option<Matcher>,
    /// Calls only at the start: the call grammar, until the first token is chosen.
    at_start: Option<Matcher>,
    /// The answer began as text, and stays text.
    free: bool,
}

impl Lazy {
    /// The first token of an answer whose calls have no marker: it may begin a call (as the
    /// call grammar allows) or text that cannot be taken for one.
    fn mask_first(&mut self, logits: &mut [f32]) -> Result<(), ConstraintError> {
        let Some(m) = self.at_start.as_mut() else {
            return Ok(());
        };
        let mask = m
            .compute_mask()
            .map_err(|e| GrammarError::Follow(e.to_string()))?;
        for (id, l) in logits.iter_mut().enumerate() {
            let id = id as u32;
            if mask.is_allowed(id) || self.g.tok.is_control(id) || self.g.tok.is_eog(id) {
                continue;
            }
            let text = String::from_utf8_lossy(self.g.tok.token_bytes(id));
            let t = text.trim_start();
            if t.is_empty() || t.starts_with('{') {
                *l = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }
}

impl Constraint for Lazy {
    fn mask(&mut self, logits: &mut [f32]) -> Result<(), ConstraintError> {
        if let Some(m) = self.active.as_mut() {
            return Ok(apply_mask(m, logits)?);
        }
        if self.free {
            return Ok(());
        }
        if self.at_start.is_some() {
            return self.mask_first(logits);
        }
        let Some(trigger) = self.g.format.shape().trigger else {
            return Ok(());
        };
        // A token may complete the trigger only as its last characters, so the grammar
        // starts on a token boundary.
        for &id in self.g.closers.iter() {
            let piece = String::from_utf8_lossy(self.g.tok.token_bytes(id));
            let joined = format!("{}{}", self.tail, piece);
            if let Some(at) = joined.find(trigger)
                && at + trigger.len() < joined.len()
                && let Some(l) = logits.get_mut(id as usize)
            {
                *l = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }

    fn commit(&mut self, token: u32) -> Result<bool, ConstraintError> {
        if let Some(m) = self.active.as_mut() {
            return Ok(follow(m, token)?);
        }
        if self.free {
            return Ok(false);
        }
        if let Some(mut m) = self.at_start.take() {
            let text = String::from_utf8_lossy(self.g.tok.token_bytes(token));
            if !self.g.tok.is_control(token) && text.trim_start().starts_with('{') {
                let done = follow(&mut m, token)?;
                self.active = Some(m);
                return Ok(done);
            }
            self.free = true;
            return Ok(false);
        }
        let Some(trigger) = self.g.format.shape().trigger else {
            return Ok(false);
        };
        self.tail
            .push_str(&String::from_utf8_lossy(self.g.tok.token_bytes(token)));
        if self.tail.ends_with(trigger) {
            self.active = Some(self.fresh.clone());
        } else {
            let keep = self.tail.len().saturating_sub(trigger.len());
            let cut = (keep..=self.tail.len())
                .find(|&i| self.tail.is_char_boundary(i))
                .unwrap_or(self.tail.len());
            self.tail.drain(..cut);
        }
        Ok(false)
    }

    fn forced(&mut self, max: usize) -> Result<(Vec<u32>, bool), ConstraintError> {
        match self.active.as_mut() {
            Some(m) => Ok(follow_forced(m, max)?),
            None => Ok((Vec::new(), false)),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use crate::tools::Choice;
    use strata_gguf::GgufFile;

    /// A byte-level vocabulary (the test server's): any text can be written.
    fn grammars() -> Grammars {
        let file = GgufFile::from_bytes(crate::testkit::vocabulary()).unwrap();
        let tok = Tokenizer::from_gguf(file.metadata()).unwrap();
        Grammars::new(Arc::new(tok), CallFormat::detect(None)).unwrap()
    }

    /// Whether the constraint takes `text` token by token.
    fn takes(g: &Grammars, c: &mut Box<dyn Constraint>, text: &str) -> bool {
        let tokens = g.tok.encode_continuation(text).unwrap();
        tokens.iter().all(|&t| c.commit(t).is_ok())
    }

    fn tool(name: &str, parameters: Option<Value>) -> Tool {
        serde_json::from_value(json!({"type": "function",
            "function": {"name": name, "parameters": parameters}}))
        .unwrap()
    }

    #[test]
    fn tool_schemas_resolve_their_own_refs_and_take_no_keys_they_do_not_name() {
        let g = grammars();
        let address = json!({"type": "object", "properties": {"street": {"type": "string"}},
            "required": ["street"]});
        let tools = vec![
            tool(
                "ship",
                Some(json!({"type": "object", "$defs": {"Address": address},
                "properties": {"to": {"$ref": "#/$defs/Address"}}, "required": ["to"]})),
            ),
            tool(
                "tree",
                Some(json!({"type": "object", "properties": {
                "kids": {"type": "array", "items": {"$ref": "#"}}}})),
            ),
            tool(
                "outline",
                Some(json!({"type": "object", "$defs": {
                    "Section": {"type": "object", "properties": {"title": {"type": "string"},
                        "sections": {"type": "array", "items": {"$ref": "#/$defs/Section"}}},
                        "required": ["title"]},
                    "Address": address.clone()},
                "properties": {"root": {"$ref": "#/$defs/Section"},
                    "owner": {"$ref": "#/$defs/Address"}}, "required": ["root"]})),
            ),
            tool("ping", None),
            tool(
                "count",
                Some(json!({"type": "object", "properties": {"n": {"type": "integer"}}})),
            ),
        ];
        let envelope =
            tools::call_schema(&tools, &Choice::Required, CallFormat::detect(None)).unwrap();
        let call = |text: &str| {
            let mut c = g.json(envelope.clone()).unwrap();
            takes(&g, &mut c, text)
        };
        assert!(call(
            r#"{"name": "ship", "arguments": {"to": {"street": "Main"}}}"#
        ));
        assert!(!call(
            r#"{"name": "ship", "arguments": {"to": {"city": "Paris"}}}"#
        ));
        // `#` is the tool's own schema, not the envelope, nested at most MAX_SELF_NESTING deep.
        assert!(call(
            r#"{"name": "tree", "arguments": {"kids": [{"kids": []}]}}"#
        ));
        assert!(call(
            r#"{"name": "tree", "arguments": {"kids": [{"kids": [{"kids": [{"kids": []}]}]}]}}"#
        ));
        assert!(!call(
            r#"{"name": "tree", "arguments": {"kids": [{"kids": [{"kids": [{"kids": [{"#
        ));
        // Recursion through definitions (pydantic's self-referencing models) is bounded too.
        assert!(call(
            r#"{"name": "outline", "arguments": {"root": {"title": "a", "sections": [{"title": "b", "sections": [{"title": "c", "sections": []}]}]}}}"#
        ));
        assert!(!call(
            r#"{"name": "outline", "arguments": {"root": {"title": "a", "sections": [{"title": "b", "sections": [{"title": "c", "sections": [{"#
        ));
        assert!(call(
            r#"{"name": "outline", "arguments": {"root": {"title": "a", "sections": [{"title": "b"}]}, "owner": {"street": "x"}}}"#
        ));
        // Numbers in a call's arguments are bounded as in any constrained JSON.
        assert!(call(
            r#"{"name": "count", "arguments": {"n": 9007199254740991}}"#
        ));
        assert!(!call(
            r#"{"name": "count", "arguments": {"n": 11111111111111111111"#
        ));
        assert!(!call(
            r#"{"name": "tree", "arguments": {"kids": [{"name": "ping"}]}}"#
        ));
        // Unnamed keys are refused, and a tool without parameters takes only `{}`.
        assert!(!call(
            r#"{"name": "ship", "arguments": {"to": {"street": "a"}, "x": 1}}"#
        ));
        assert!(call(r#"{"name": "ping", "arguments": {}}"#));
        assert!(!call(r#"{"name": "ping", "arguments": {"a": 1}}"#));
        // Numbers without bounds get JSON-safe ones; bounds a schema gives are its own.
        let n = json!({"type": "object", "properties": {"i": {"type": "integer"},
            "x": {"type": "number"}, "big": {"type": "integer", "maximum": 1e18}}});
        let num = |text: &str| {
            let mut c = g.json(n.clone()).unwrap();
            takes(&g, &mut c, text)
        };
        assert!(num(
            r#"{"i": -9007199254740991, "x": -2.5, "big": 999999999999999999}"#
        ));
        assert!(num(r#"{"x": 999999999999999.123456}"#));
        assert!(!num(r#"{"i": 11111111111111111111"#));
        assert!(!num(r#"{"x": 2022.2000000000000013"#));
        assert!(!num(r#"{"x": 1e300"#));
        // A free-form object stays free.
        let mut free = g.json(json!({"type": "object"})).unwrap();
        assert!(takes(&g, &mut free, r#"{"any": [1, 2]}"#));
    }

    #[test]
    fn schemas_that_cannot_work_fail_at_compile_time_with_a_short_reason() {
        let g = grammars();
        assert!(
            g.json(json!({"type": "object", "properties": {"a": {"type": "string"}}}))
                .is_ok()
        );
        for bad in [
            json!({"$ref": "#"}),
            json!({"type": "object", "properties": {"a": {"$ref": "#/nowhere"}}, "required": ["a"]}),
            json!({"const": "x".repeat(MAX_GRAMMAR_BYTES)}),
        ] {
            let e = match g.json(bad.clone()) {
                Ok(_) => panic!("{bad:.80} compiled"),
                Err(e) => e,
            };
            assert!(
                e.to_string().len() < 600,
                "a parser dump instead of a reason: {e}"
            );
        }
        let big = g.json(json!({"const": "x".repeat(MAX_GRAMMAR_BYTES)}));
        assert!(big.err().unwrap().to_string().contains("KiB"));
    }

    /// The schemas that aborted the process (a `$ref` chain deeper than a worker's stack,
    /// mutually recursive definitions expanding without end, a pattern of nested counted
    /// repetitions) and variants of them: each is a short error or a grammar, quickly, as a
    /// response format and as a tool's parameters.
    #[test]
    fn hostile_schemas_are_refused_or_compiled_quickly_and_never_take_the_process_down() {
        use crate::schema_limits::MAX_DEPTH;
        let g = grammars();
        use crate::schema_limits::hostile::{chain, mutual};
        let refused = [
            chain(700),
            chain(550),
            chain(MAX_DEPTH + 1),
            json!({"type": "string", "pattern": "^(x{1000}){1000}$"}),
        ];
        let compiled = [
            chain(MAX_DEPTH - 2),
            mutual("ABCD"),
            mutual("ABCDE"),
            mutual("ABCDEFGH"),
        ];
        for (schema, ok) in refused
            .iter()
            .map(|s| (s, false))
            .chain(compiled.iter().map(|s| (s, true)))
        {
            let t0 = std::time::Instant::now();
            let as_format = g.json(schema.clone());
            let as_tool =
                g.tool_calls(&[tool("f", Some(schema.clone()))], &Choice::Required, false);
            let took = t0.elapsed();
            assert_eq!(
                as_format.is_ok(),
                ok,
                "{schema:.120}: {:?}",
                as_format.err()
            );
            assert_eq!(as_tool.is_ok(), ok, "{schema:.120}: {:?}", as_tool.err());
            for e in [as_format.err(), as_tool.err()].into_iter().flatten() {
                assert!(e.to_string().len() < 400, "{e}");
            }
            assert!(took.as_secs() < 20, "{schema:.120} took {took:?}");
        }
        // The deepest schema allowed compiles on a thread of the default stack: the compile
        // thread's stack is many times what the limits let a schema use.
        let factory = Arc::clone(&g.factory);
        let deepest = compact(crate::schema_limits::prepare(chain(MAX_DEPTH - 2)).unwrap());
        let on_small_stack = std::thread::Builder::new()
            .stack_size(2 << 20)
            .spawn(move || compile(&factory, TopLevelGrammar::from_json_schema(deepest)).is_ok())
            .unwrap()
            .join()
            .unwrap();
        assert!(on_small_stack);
    }
}
