//! The Responses API's tools as the chat tools strata prompts with, and back.
//!
//! Three kinds arrive in `tools`:
//! - `function` tools, written flat (`{"type": "function", "name": …}`);
//! - `namespace` tools, groups of functions (Codex CLI sends its multi-agent tools so). Their
//!   functions are flattened into the prompt, and a call to one goes back to the client with
//!   its `name` and `namespace`, as the client routes it;
//! - hosted tools (`web_search`, `file_search`, `code_interpreter`, …) that OpenAI runs on its
//!   side. strata cannot run them, so they are left out of the prompt and named in the
//!   `x-strata-ignored-tools` response header. Clients send them by default (Codex CLI adds
//!   `web_search`), and refusing the request would end their session; only a `tool_choice`
//!   that forces one is refused.

use std::collections::HashMap;

use serde_json::{Value, json};

use crate::ApiError;
use crate::types::{FunctionDef, Tool};

/// The response header that names the hosted tools a request carried and strata left out.
pub(crate) const IGNORED_HEADER: &str = "x-strata-ignored-tools";

/// Whether a tool `type` is one OpenAI runs on its side.
fn hosted(kind: &str) -> bool {
    kind.starts_with("web_search")
        || kind.starts_with("computer_use")
        || matches!(
            kind,
            "file_search" | "code_interpreter" | "image_generation" | "mcp" | "local_shell"
        )
}

/// A request's tools: what the model is prompted with, and how its calls are named back.
#[derive(Debug, Clone, Default)]
pub(crate) struct ToolSet {
    /// The functions the prompt offers, by the names the model calls them.
    pub(crate) tools: Vec<Tool>,
    /// A namespaced function's prompt name → its namespace and own name.
    namespaced: HashMap<String, (String, String)>,
    /// The hosted tool types left out, in request order, each once.
    pub(crate) ignored: Vec<String>,
}

impl ToolSet {
    /// Reads `tools`. A namespaced function keeps its own name in the prompt unless another
    /// tool has that name too; then it is called `NAMESPACE__NAME` there.
    pub(crate) fn parse(list: &[Value]) -> Result<ToolSet, ApiError> {
        let mut set = ToolSet::default();
        // (index path for errors, namespace, the function's JSON)
        let mut found: Vec<(String, Option<String>, &Value)> = Vec::new();
        for (i, t) in list.iter().enumerate() {
            let kind = t.get("type").and_then(Value::as_str).unwrap_or("");
            match kind {
                "function" => found.push((format!("tools[{i}]"), None, t)),
                "namespace" => {
                    let ns = t.get("name").and_then(Value::as_str).ok_or_else(|| {
                        ApiError::invalid(format!("tools[{i}].name"), "A namespace needs a `name`.")
                    })?;
                    let inner = t.get("tools").and_then(Value::as_array).ok_or_else(|| {
                        ApiError::invalid(
                            format!("tools[{i}].tools"),
                            "A namespace needs a list of `tools`.",
                        )
                    })?;
                    for (j, f) in inner.iter().enumerate() {
                        let at = format!("tools[{i}].tools[{j}]");
                        if f.get("type").and_then(Value::as_str) != Some("function") {
                            return Err(ApiError::invalid(
                                format!("{at}.type"),
                                "A namespace holds function tools only.",
                            ));
                        }
                        found.push((at, Some(ns.to_string()), f));
                    }
                }
                k if hosted(k) => {
                    if !set.ignored.iter().any(|s| s == k) {
                        set.ignored.push(k.to_string());
                    }
                }
                other => {
                    return Err(ApiError::invalid(
                        format!("tools[{i}].type"),
                        format!(
                            "Tool type `{other}` is not supported here: strata runs `function` \
                             tools and `namespace`s of them (hosted tools such as web_search are \
                             left out)."
                        ),
                    ));
                }
            }
        }
        let name_of = |at: &str, f: &Value| -> Result<String, ApiError> {
            f.get("name")
                .and_then(Value::as_str)
                .filter(|n| !n.is_empty())
                .map(str::to_string)
                .ok_or_else(|| {
                    ApiError::invalid(format!("{at}.name"), "A function tool needs a `name`.")
                })
        };
        let mut uses: HashMap<String, usize> = HashMap::new();
        for (at, _, f) in &found {
            *uses.entry(name_of(at, f)?).or_default() += 1;
        }
        for (at, ns, f) in found {
            let name = name_of(&at, f)?;
            let shown = match ns {
                Some(ns) => {
                    let shown = if uses[&name] > 1 {
                        format!("{ns}__{name}")
                    } else {
                        name.clone()
                    };
                    set.namespaced.insert(shown.clone(), (ns, name));
                    shown
                }
                None => name,
            };
            if set.tools.iter().any(|t| t.function.name == shown) {
                return Err(ApiError::invalid(
                    format!("{at}.name"),
                    format!("Two tools are named `{shown}`."),
                ));
            }
            set.tools.push(Tool {
                kind: "function".into(),
                function: FunctionDef {
                    name: shown,
                    description: f
                        .get("description")
                        .and_then(Value::as_str)
                        .map(str::to_string),
                    parameters: f.get("parameters").cloned().filter(|p| !p.is_null()),
                    strict: f.get("strict").and_then(Value::as_bool),
                },
            });
        }
        Ok(set)
    }

    /// The name the prompt gives the function `name` of `namespace`.
    pub(crate) fn prompt_name(&self, namespace: Option<&str>, name: &str) -> String {
        namespace
            .and_then(|ns| {
                self.namespaced
                    .iter()
                    .find(|(_, (n, f))| n == ns && f == name)
                    .map(|(shown, _)| shown.clone())
            })
            .unwrap_or_else(|| name.to_string())
    }

    /// A call's `name` and `namespace` as the client knows the function.
    pub(crate) fn wire_name<'a>(&'a self, prompt_name: &'a str) -> (&'a str, Option<&'a str>) {
        match self.namespaced.get(prompt_name) {
            Some((ns, name)) => (name, Some(ns)),
            None => (prompt_name, None),
        }
    }

    /// The chat request's `tool_choice` for the Responses API's.
    pub(crate) fn tool_choice(&self, choice: Option<&Value>) -> Result<Option<Value>, ApiError> {
        let c = match choice {
            None | Some(Value::Null) => return Ok(None),
            Some(c @ Value::String(_)) => return Ok(Some(c.clone())),
            Some(c) => c,
        };
        match (c.get("type").and_then(Value::as_str), c.get("name")) {
            (Some("function"), Some(Value::String(name))) => {
                let ns = c.get("namespace").and_then(Value::as_str);
                let shown = self.prompt_name(ns, name);
                Ok(Some(
                    json!({"type": "function", "function": {"name": shown}}),
                ))
            }
            (Some(kind), _) if hosted(kind) => Err(ApiError::invalid(
                "tool_choice",
                format!(
                    "tool_choice forces the hosted tool `{kind}`, which does not run on strata."
                ),
            )),
            _ => Err(ApiError::invalid(
                "tool_choice",
                "tool_choice must be none, auto, required or {\"type\": \"function\", \"name\": …}.",
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn namespaces_are_flattened_and_hosted_tools_left_out() {
        let set = ToolSet::parse(&[
            json!({"type": "function", "name": "exec_command", "parameters": {"type": "object"}}),
            json!({"type": "namespace", "name": "agents", "description": "Sub-agents.", "tools": [
                {"type": "function", "name": "spawn_agent", "description": "Spawn."},
                {"type": "function", "name": "exec_command"},
            ]}),
            json!({"type": "web_search", "external_web_access": false}),
            json!({"type": "web_search"}),
            json!({"type": "code_interpreter", "container": {"type": "auto"}}),
        ])
        .unwrap();
        let names: Vec<&str> = set.tools.iter().map(|t| t.function.name.as_str()).collect();
        assert_eq!(
            names,
            ["exec_command", "spawn_agent", "agents__exec_command"]
        );
        assert_eq!(set.ignored, ["web_search", "code_interpreter"]);
        assert_eq!(
            set.wire_name("spawn_agent"),
            ("spawn_agent", Some("agents"))
        );
        assert_eq!(
            set.wire_name("agents__exec_command"),
            ("exec_command", Some("agents"))
        );
        assert_eq!(set.wire_name("exec_command"), ("exec_command", None));
        assert_eq!(
            set.prompt_name(Some("agents"), "exec_command"),
            "agents__exec_command"
        );
        assert_eq!(set.prompt_name(None, "exec_command"), "exec_command");
        assert_eq!(set.tools[1].function.description.as_deref(), Some("Spawn."));
    }

    #[test]
    fn unknown_types_and_forced_hosted_tools_are_refused() {
        let e = ToolSet::parse(&[json!({"type": "custom", "name": "apply_patch"})]).unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tools[0].type"));
        let e = ToolSet::parse(&[json!({"type": "namespace", "name": "n", "tools": [
            {"type": "web_search"}]})])
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tools[0].tools[0].type"));
        let e = ToolSet::parse(&[
            json!({"type": "function", "name": "f"}),
            json!({"type": "function", "name": "f"}),
        ])
        .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tools[1].name"));
        let set = ToolSet::parse(&[json!({"type": "web_search"})]).unwrap();
        let e = set
            .tool_choice(Some(&json!({"type": "web_search"})))
            .unwrap_err();
        assert_eq!(e.param.as_deref(), Some("tool_choice"));
        assert!(e.message.contains("web_search"), "{}", e.message);
        assert_eq!(
            set.tool_choice(Some(&json!({"type": "function", "name": "f"})))
                .unwrap()
                .unwrap()["function"]["name"],
            "f"
        );
    }
}
