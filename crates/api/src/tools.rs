//! Tools in the prompt and tool calls in the output.
//!
//! A chat template that knows tools (it mentions `tools`) gets them as the `tools` variable and
//! earlier calls as `tool_calls` on assistant messages, as transformers passes them. For a
//! template that does not (SmolLM2's), strata adds this documented default to the system
//! message:
//!
//! ```text
//! You can call these functions:
//! {"name": "...", "description": "...", "parameters": {...}}
//! To call a function, answer with <tool_call>{"name": "NAME", "arguments": {ARGUMENTS}}</tool_call>
//! (one line per call).
//! ```
//!
//! and renders earlier calls as such blocks and tool results as `tool` turns.

use serde_json::{Value, json};

use crate::ApiError;
use crate::call_format::CallFormat;
use crate::schema_limits::{self, SCHEMA_LISTS, SCHEMA_MAPS, SCHEMA_ONE};
use crate::types::{Tool, ToolCall};

/// The default prompt's call markers ([`CallFormat::Hermes`]).
const CALL_OPEN: &str = "<tool_call>";
const CALL_CLOSE: &str = "</tool_call>";

/// What `tool_choice` asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Choice {
    /// No call (tools are not shown to the model).
    None,
    /// The model decides.
    Auto,
    /// At least one call, of any tool.
    Required,
    /// A call of this function.
    Named(String),
}

/// Parses and checks `tool_choice` against the tools given.
pub(crate) fn choice(tools: &[Tool], raw: Option<&Value>) -> Result<Choice, ApiError> {
    let bad = |m: &str| ApiError::invalid("tool_choice", m);
    let c = match raw {
        None | Some(Value::Null) => {
            if tools.is_empty() {
                Choice::None
            } else {
                Choice::Auto
            }
        }
        Some(Value::String(s)) => match s.as_str() {
            "none" => Choice::None,
            "auto" => Choice::Auto,
            "required" => Choice::Required,
            other => {
                return Err(bad(&format!(
                    "Invalid tool_choice `{other}`: expected none, auto, required or a named function."
                )));
            }
        },
        Some(v) => {
            let name = v
                .get("function")
                .and_then(|f| f.get("name"))
                .and_then(Value::as_str)
                .ok_or_else(|| bad("A named tool_choice is {\"type\": \"function\", \"function\": {\"name\": \"...\"}}."))?;
            Choice::Named(name.to_string())
        }
    };
    match &c {
        Choice::Required | Choice::Auto if tools.is_empty() => {
            Err(bad("tool_choice needs `tools`: no tool was given."))
        }
        Choice::Named(n) if !tools.iter().any(|t| t.function.name == *n) => Err(bad(&format!(
            "tool_choice names `{n}`, which is not among the tools."
        ))),
        _ => Ok(c),
    }
}

/// Checks the tool definitions.
pub(crate) fn validate(tools: &[Tool]) -> Result<(), ApiError> {
    for (i, t) in tools.iter().enumerate() {
        if t.kind != "function" {
            return Err(ApiError::invalid(
                format!("tools[{i}].type"),
                format!(
                    "Tool type `{}` is not supported; only `function` is.",
                    t.kind
                ),
            ));
        }
        let n = &t.function.name;
        if n.is_empty()
            || n.len() > 64
            || !n
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        {
            return Err(ApiError::invalid(
                format!("tools[{i}].function.name"),
                format!("Invalid function name `{n}`: use 1 to 64 of a-z, A-Z, 0-9, _ and -."),
            ));
        }
        if let Some(p) = &t.function.parameters {
            if !p.is_object() {
                return Err(ApiError::invalid(
                    format!("tools[{i}].function.parameters"),
                    "Function parameters must be a JSON schema object.",
                ));
            }
            // Before the tools' text goes into the prompt: a hostile schema is refused for
            // what it is, not for the context it would fill.
            schema_limits::check(p).map_err(|e| {
                ApiError::invalid(
                    format!("tools[{i}].function.parameters"),
                    format!("The schema cannot be used: {e}"),
                )
            })?;
        }
        if tools[..i].iter().any(|o| o.function.name == *n) {
            return Err(ApiError::invalid(
                format!("tools[{i}].function.name"),
                format!("Two tools are named `{n}`."),
            ));
        }
    }
    Ok(())
}

/// The tools a call may name: all, or only the named one under [`Choice::Named`].
pub(crate) fn picked<'a>(tools: &'a [Tool], choice: &'a Choice) -> impl Iterator<Item = &'a Tool> {
    tools.iter().filter(move |t| match choice {
        Choice::Named(n) => t.function.name == *n,
        _ => true,
    })
}

/// The schema a call's arguments are constrained by: [`parameters`] checked against the
/// server's limits with its recursion unrolled ([`schema_limits::prepare`]), then closed and
/// bounded ([`closed`], [`bounded`]). The error names the tool.
pub(crate) fn constrained(t: &Tool) -> Result<Value, String> {
    let p = schema_limits::prepare(parameters(t))
        .map_err(|e| format!("tool `{}`'s parameters: {e}", t.function.name))?;
    Ok(bounded(closed(p)))
}

/// The JSON schema of a function's arguments (an empty object when it declares none).
pub(crate) fn parameters(t: &Tool) -> Value {
    t.function
        .parameters
        .clone()
        .unwrap_or_else(|| json!({"type": "object", "properties": {}}))
}

/// The JSON schema of one call envelope of `format`, `{"name": …, "arguments": {…}}` (Llama 3
/// names them `parameters`; Mistral's list adds the call's nine-character `id`), over the
/// picked tools. `name` comes first, so a stream names the function before its arguments.
///
/// Each tool's parameters sit in the envelope's `$defs` under a name of their own, with their
/// references rewritten to point into it: `#/$defs/Address` (pydantic's nested models) and `#`
/// (a recursive schema) mean the tool's own schema, not the envelope around it.
pub(crate) fn call_schema(
    tools: &[Tool],
    choice: &Choice,
    format: CallFormat,
) -> Result<Value, String> {
    let shape = format.shape();
    let mut defs = serde_json::Map::new();
    let mut one = |i: usize, t: &Tool| -> Result<Value, String> {
        let key = format!("strata_tool_{i}");
        let at = format!("#/$defs/{key}");
        defs.insert(key, rebase_refs(constrained(t)?, &at));
        let mut props = serde_json::Map::new();
        props.insert("name".into(), json!({"const": t.function.name}));
        props.insert(shape.args_key.into(), json!({ "$ref": at }));
        let mut required = vec![json!("name"), json!(shape.args_key)];
        if shape.id {
            props.insert(
                "id".into(),
                json!({"type": "string", "pattern": "^[a-zA-Z0-9]{9}$"}),
            );
            required.push(json!("id"));
        }
        Ok(json!({
            "type": "object",
            "properties": props,
            "required": required,
            "additionalProperties": false,
        }))
    };
    let all: Vec<Value> = picked(tools, choice)
        .enumerate()
        .map(|(i, t)| one(i, t))
        .collect::<Result<_, _>>()?;
    let mut root = if all.len() == 1 {
        all.into_iter().next().unwrap_or(Value::Null)
    } else {
        json!({ "anyOf": all })
    };
    if let Value::Object(m) = &mut root {
        m.insert("$defs".into(), Value::Object(defs));
    }
    Ok(root)
}

/// Applies `f` to `schema` and to every schema inside it (by keyword, so data such as a
/// `const`, `enum` or `default`, and property names, are never taken for schemas).
fn walk(schema: &mut Value, f: &mut dyn FnMut(&mut serde_json::Map<String, Value>)) {
    let Value::Object(m) = schema else { return };
    f(m);
    for (k, v) in m.iter_mut() {
        let k = k.as_str();
        if SCHEMA_MAPS.contains(&k) {
            if let Value::Object(children) = v {
                for c in children.values_mut() {
                    walk(c, f);
                }
            }
        } else if SCHEMA_ONE.contains(&k) || SCHEMA_LISTS.contains(&k) {
            match v {
                Value::Array(list) => list.iter_mut().for_each(|c| walk(c, f)),
                other => walk(other, f),
            }
        }
    }
}

/// Keywords the grammar does not enforce (llguidance compiles them leniently, as warnings):
/// output under a schema with any of them is checked once it is complete ([`violations`]).
const UNENFORCED: [&str; 16] = [
    "propertyNames",
    "uniqueItems",
    "not",
    "if",
    "then",
    "else",
    "contains",
    "minContains",
    "maxContains",
    "dependentRequired",
    "dependentSchemas",
    "dependencies",
    "unevaluatedProperties",
    "unevaluatedItems",
    "minProperties",
    "maxProperties",
];

/// Whether output under `schema` needs checking after it is generated: some keyword in it is
/// one the grammar leaves to [`violations`].
pub(crate) fn needs_check(schema: &Value) -> bool {
    let mut found = false;
    walk(&mut schema.clone(), &mut |m| {
        found |= m.keys().any(|k| UNENFORCED.contains(&k.as_str()));
    });
    found
}

/// How `value` breaks `schema`, one line per error naming where (a JSON pointer into the
/// value) and what; at most 8. Empty when it is valid.
pub(crate) fn violations(schema: &Value, value: &Value) -> Vec<String> {
    match jsonschema::validator_for(schema) {
        Ok(v) => v
            .iter_errors(value)
            .take(8)
            .map(|e| {
                let at = e.instance_path().to_string();
                format!("{}: {e}", if at.is_empty() { "/" } else { &at })
            })
            .collect(),
        Err(e) => vec![format!("the schema could not be checked: {e}")],
    }
}

/// `schema` with every object that lists its properties but does not say whether it takes
/// others closed to others (`additionalProperties: false`), as llama.cpp's JSON-schema grammar
/// and OpenAI's strict mode read it: otherwise a weak model may add keys until its budget
/// ends and never finish the call. An object without `properties` stays open: that is a
/// free-form object by intent (`json_object`).
pub(crate) fn closed(mut schema: Value) -> Value {
    walk(&mut schema, &mut |m| {
        if m.contains_key("properties")
            && !m.contains_key("additionalProperties")
            && !m.contains_key("patternProperties")
            && !m.contains_key("unevaluatedProperties")
        {
            m.insert("additionalProperties".into(), Value::Bool(false));
        }
    });
    schema
}

/// The largest integer JSON carries exactly (2^53 - 1): the bound of an integer whose schema
/// gives none.
pub(crate) const MAX_SAFE_INTEGER: i64 = (1 << 53) - 1;

/// The bound of a number whose schema gives none, and the finest step it is written in.
pub(crate) const NUMBER_BOUND: f64 = 1e15;

/// `schema` with bounds on numbers that have none: integers within +-(2^53 - 1), other numbers
/// within +-1e15 and written to at most six decimals. A weak model writing a number whose
/// digits nothing bounds may write digits until its budget ends (`1111111…`); JSON numbers
/// beyond these lose precision in most clients anyway. Bounds the schema gives are kept.
/// Strings are not bounded: agents write whole files through string arguments.
pub(crate) fn bounded(mut schema: Value) -> Value {
    walk(&mut schema, &mut |m| {
        let types: Vec<&str> = match m.get("type") {
            Some(Value::String(t)) => vec![t.as_str()],
            Some(Value::Array(ts)) => ts.iter().filter_map(Value::as_str).collect(),
            _ => return,
        };
        let (integer, number) = (types.contains(&"integer"), types.contains(&"number"));
        if !integer && !number {
            return;
        }
        let (low, high) = if number {
            (json!(-NUMBER_BOUND), json!(NUMBER_BOUND))
        } else {
            (json!(-MAX_SAFE_INTEGER), json!(MAX_SAFE_INTEGER))
        };
        if !m.contains_key("minimum") && !m.contains_key("exclusiveMinimum") {
            m.insert("minimum".into(), low);
        }
        if !m.contains_key("maximum") && !m.contains_key("exclusiveMaximum") {
            m.insert("maximum".into(), high);
        }
        if number && !integer && !m.contains_key("multipleOf") {
            m.insert("multipleOf".into(), json!(0.000001));
        }
    });
    schema
}

/// `schema`, moved to `at` inside another document: every local reference (`#…`) is rewritten
/// to point at the same place under `at`.
fn rebase_refs(mut schema: Value, at: &str) -> Value {
    walk(&mut schema, &mut |m| {
        if let Some(Value::String(r)) = m.get_mut("$ref")
            && let Some(rest) = r.strip_prefix('#')
        {
            *r = format!("{at}{rest}");
        }
    });
    schema
}

/// The default tool instructions for templates without tool support.
pub(crate) fn default_prompt(tools: &[Tool]) -> String {
    let mut s = String::from("You can call these functions:\n");
    for t in tools {
        let mut f = json!({"name": t.function.name});
        if let Some(d) = &t.function.description {
            f["description"] = json!(d);
        }
        if let Some(p) = &t.function.parameters {
            f["parameters"] = p.clone();
        }
        s.push_str(&f.to_string());
        s.push('\n');
    }
    s.push_str(&format!(
        "To call a function, answer with {CALL_OPEN}{{\"name\": \"NAME\", \"arguments\": {{ARGUMENTS}}}}{CALL_CLOSE} (one line per call)."
    ));
    s
}

/// An earlier call rendered as text, for templates without tool support.
pub(crate) fn call_text(call: &ToolCall) -> String {
    let args: Value = serde_json::from_str(&call.function.arguments)
        .unwrap_or(Value::String(call.function.arguments.clone()));
    format!(
        "{CALL_OPEN}{}{CALL_CLOSE}",
        json!({"name": call.function.name, "arguments": args})
    )
}

/// A call parsed from generated text.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct ParsedCall {
    /// The function.
    pub name: String,
    /// The arguments, compact JSON text.
    pub arguments: String,
}

impl ParsedCall {
    /// The arguments as the JSON object Anthropic's `input` and Ollama's `arguments` are (the
    /// grammar makes them one; anything else, which only a call without a grammar could be,
    /// is `{}`).
    pub(crate) fn arguments_object(&self) -> serde_json::Value {
        serde_json::from_str::<serde_json::Value>(&self.arguments)
            .ok()
            .filter(serde_json::Value::is_object)
            .unwrap_or_else(|| json!({}))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn tool(name: &str) -> Tool {
        serde_json::from_value(json!({"type": "function", "function": {"name": name,
            "parameters": {"type": "object", "properties": {"x": {"type": "integer"}}}}}))
        .unwrap()
    }

    #[test]
    fn tool_choice_is_checked_against_the_tools() {
        let tools = vec![tool("f")];
        assert_eq!(choice(&tools, None).unwrap(), Choice::Auto);
        assert_eq!(choice(&[], None).unwrap(), Choice::None);
        assert!(choice(&[], Some(&json!("required"))).is_err());
        assert!(choice(&tools, Some(&json!("sometimes"))).is_err());
        assert_eq!(
            choice(
                &tools,
                Some(&json!({"type": "function", "function": {"name": "f"}}))
            )
            .unwrap(),
            Choice::Named("f".into())
        );
        assert!(
            choice(
                &tools,
                Some(&json!({"type": "function", "function": {"name": "g"}}))
            )
            .is_err()
        );
        assert!(validate(&[tool("bad name")]).is_err());
        assert!(validate(&[tool("f"), tool("f")]).is_err());
    }
}
