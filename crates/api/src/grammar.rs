//! Constrained decoding with llguidance: JSON-schema output (`response_format`) and tool calls
//! whose arguments always match the function's schema.
//!
//! Tool calls are written `<tool_call>{"name": …, "arguments": {…}}</tool_call>` (the Hermes
//! format most open models are tuned on; see [`crate::tools`]). Under `tool_choice: required` or
//! a named function the whole answer follows the call grammar. Under `auto` the model writes
//! freely until it opens a call; from the opening tag on, the call grammar takes over (a lazy
//! grammar, as llama.cpp's trigger words work), so any call it makes is well formed.

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{TokEnv, TokRxInfo, TokTrie, TokenizerEnv};
use llguidance::{Matcher, ParserFactory};
use serde_json::{Value, json};
use strata_tokenizer::Tokenizer;

use crate::scheduler::Constraint;

/// The text that opens a tool call.
pub const CALL_OPEN: &str = "<tool_call>";
/// The text that closes a tool call.
pub const CALL_CLOSE: &str = "</tool_call>";

/// JSON layout every constrained output uses: one space after `:` and `,`, no other
/// whitespace, so a weak model cannot pad the output forever.
fn compact(mut schema: Value) -> Value {
    if let Value::Object(m) = &mut schema {
        m.insert(
            "x-guidance".into(),
            json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}),
        );
    }
    schema
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
            .encode(&String::from_utf8_lossy(s), false)
            .unwrap_or_default()
    }
}

/// Grammar compilation for one tokenizer (building the token trie takes ~0.1 s, once).
#[derive(Clone)]
pub struct Grammars {
    factory: Arc<ParserFactory>,
    tok: Arc<Tokenizer>,
    /// Tokens whose text contains the last character of [`CALL_OPEN`] (candidates for
    /// completing the trigger).
    closers: Arc<Vec<u32>>,
}

impl std::fmt::Debug for Grammars {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Grammars").finish_non_exhaustive()
    }
}

impl Grammars {
    /// Builds the token trie of `tok`. Control tokens are marked special, so grammars never
    /// produce them as text; end-of-generation tokens end a complete grammar.
    pub fn new(tok: Arc<Tokenizer>) -> Result<Grammars, String> {
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
        let last = CALL_OPEN.as_bytes()[CALL_OPEN.len() - 1];
        let closers = (0..n)
            .filter(|&id| !tok.is_control(id) && tok.token_bytes(id).contains(&last))
            .collect();
        let env: TokEnv = Arc::new(Env {
            trie,
            tok: Arc::clone(&tok),
        });
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| e.to_string())?;
        factory.set_stderr_log_level(0);
        Ok(Grammars {
            factory: Arc::new(factory),
            tok,
            closers: Arc::new(closers),
        })
    }

    fn matcher(&self, grammar: TopLevelGrammar) -> Result<Matcher, String> {
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| e.to_string())?;
        let m = Matcher::new(Ok(parser));
        match m.get_error() {
            Some(e) => Err(e),
            None => Ok(m),
        }
    }

    /// Output that is a JSON value matching `schema` (`{"type": "object"}` for `json_object`).
    pub fn json(&self, schema: Value) -> Result<Box<dyn Constraint>, String> {
        let m = self.matcher(TopLevelGrammar::from_json_schema(compact(schema)))?;
        Ok(Box::new(Grammar { m }))
    }

    /// Output that is one or more tool calls (one if `!parallel`) and nothing else.
    pub fn tool_calls(&self, calls: &Value, parallel: bool) -> Result<Box<dyn Constraint>, String> {
        let m = self.matcher(TopLevelGrammar::from_lark(calls_grammar(
            calls, parallel, true,
        )))?;
        Ok(Box::new(Grammar { m }))
    }

    /// Free text that, once it opens a tool call, continues as well-formed calls only.
    pub fn lazy_tool_calls(
        &self,
        calls: &Value,
        parallel: bool,
    ) -> Result<Box<dyn Constraint>, String> {
        let rest = calls_grammar(calls, parallel, false);
        // Compile now, so a bad schema is the request's 400 rather than a failure mid-stream.
        self.matcher(TopLevelGrammar::from_lark(rest.clone()))?;
        Ok(Box::new(Lazy {
            g: self.clone(),
            rest,
            tail: String::new(),
            active: None,
        }))
    }
}

/// The lark grammar of tool calls: `calls` is the JSON schema of one call's envelope. With
/// `open`, the text starts with the opening tag; without, just after it.
fn calls_grammar(calls: &Value, parallel: bool, open: bool) -> String {
    let schema = compact(calls.clone()).to_string();
    let first = if open {
        format!("\"{CALL_OPEN}\" body")
    } else {
        "body".to_string()
    };
    let more = if parallel {
        format!(" (\"\\n\" \"{CALL_OPEN}\" body)*")
    } else {
        String::new()
    };
    format!("start: {first}{more}\nbody: %json {schema} \"{CALL_CLOSE}\"\n")
}

/// A grammar from the first token.
struct Grammar {
    m: Matcher,
}

fn apply_mask(m: &mut Matcher, logits: &mut [f32]) -> Result<(), String> {
    let mask = m.compute_mask().map_err(|e| e.to_string())?;
    for (id, l) in logits.iter_mut().enumerate() {
        if !mask.is_allowed(id as u32) {
            *l = f32::NEG_INFINITY;
        }
    }
    Ok(())
}

fn follow(m: &mut Matcher, token: u32) -> Result<bool, String> {
    m.consume_token(token).map_err(|e| e.to_string())?;
    Ok(complete(m))
}

/// Whether the grammar can take no more tokens.
fn complete(m: &mut Matcher) -> bool {
    m.is_stopped() || m.compute_mask().map(|v| v.is_zero()).unwrap_or(false)
}

/// Follows the tokens the grammar forces from here (a tool call's `{"name": "` and the
/// properties a schema requires in order are most of a call's tokens).
fn follow_forced(m: &mut Matcher, max: usize) -> Result<(Vec<u32>, bool), String> {
    let mut forced = m.compute_ff_tokens();
    if let Some(e) = m.get_error() {
        return Err(e);
    }
    forced.truncate(max);
    if forced.is_empty() {
        return Ok((forced, false));
    }
    m.consume_tokens(&forced).map_err(|e| e.to_string())?;
    let done = complete(m);
    Ok((forced, done))
}

impl Constraint for Grammar {
    fn mask(&mut self, logits: &mut [f32]) -> Result<(), String> {
        apply_mask(&mut self.m, logits)
    }

    fn commit(&mut self, token: u32) -> Result<bool, String> {
        follow(&mut self.m, token)
    }

    fn forced(&mut self, max: usize) -> Result<(Vec<u32>, bool), String> {
        follow_forced(&mut self.m, max)
    }
}

/// Free text until [`CALL_OPEN`], then the call grammar.
struct Lazy {
    g: Grammars,
    rest: String,
    /// The last few characters of the free text.
    tail: String,
    active: Option<Matcher>,
}

impl Constraint for Lazy {
    fn mask(&mut self, logits: &mut [f32]) -> Result<(), String> {
        if let Some(m) = self.active.as_mut() {
            return apply_mask(m, logits);
        }
        // A token may complete the opening tag only as its last characters, so the grammar
        // starts on a token boundary.
        for &id in self.g.closers.iter() {
            let piece = String::from_utf8_lossy(self.g.tok.token_bytes(id));
            let joined = format!("{}{}", self.tail, piece);
            if let Some(at) = joined.find(CALL_OPEN)
                && at + CALL_OPEN.len() < joined.len()
                && let Some(l) = logits.get_mut(id as usize)
            {
                *l = f32::NEG_INFINITY;
            }
        }
        Ok(())
    }

    fn commit(&mut self, token: u32) -> Result<bool, String> {
        if let Some(m) = self.active.as_mut() {
            return follow(m, token);
        }
        self.tail
            .push_str(&String::from_utf8_lossy(self.g.tok.token_bytes(token)));
        if self.tail.ends_with(CALL_OPEN) {
            self.active = Some(
                self.g
                    .matcher(TopLevelGrammar::from_lark(self.rest.clone()))?,
            );
        } else {
            let keep = self.tail.len().saturating_sub(CALL_OPEN.len());
            let cut = (keep..=self.tail.len())
                .find(|&i| self.tail.is_char_boundary(i))
                .unwrap_or(self.tail.len());
            self.tail.drain(..cut);
        }
        Ok(false)
    }

    fn forced(&mut self, max: usize) -> Result<(Vec<u32>, bool), String> {
        match self.active.as_mut() {
            Some(m) => follow_forced(m, max),
            None => Ok((Vec::new(), false)),
        }
    }
}
