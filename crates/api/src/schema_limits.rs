//! What a client's JSON schema may ask of this server, checked before anything is expanded or
//! compiled, and the unrolling of its recursion.
//!
//! A schema is a program for the grammar compiler, and a small one can ask for unbounded work:
//! a chain of a few hundred `$ref`s recurses deeper than a thread's stack, a handful of
//! definitions that refer to each other expand exponentially when unrolled, a `pattern` of
//! nested counted repetitions builds millions of regex nodes. So every schema (a
//! `response_format`, Ollama's `format`, each tool's parameters) first passes [`prepare`], which
//! reads it once and decides from its reference graph alone, building nothing:
//!
//! - every `$ref` points inside the schema (`#` or a `#/...` JSON pointer) at something there;
//!   features that move the base of a reference (`$id` below the root, anchors, dynamic and
//!   recursive references) are refused;
//! - at most [`MAX_DEFINITIONS`] definitions and distinct reference targets;
//! - at most [`MAX_DEPTH`] nested schemas along any path once references are followed and
//!   recursion unrolled (a chain of references counts every link);
//! - at most [`MAX_EXPANDED_BYTES`] of schema once recursion is unrolled;
//! - every `pattern` (and `patternProperties` name) at most [`MAX_PATTERN_SIZE`] once its
//!   counted repetitions are multiplied out.
//!
//! Each refusal is a [`SchemaError`] naming the limit and where in the client's schema it was
//! passed. Only then is recursion unrolled, in time and size linear in the schema: each
//! definition on a cycle gets one copy per level of its cycle (at most
//! [`MAX_SELF_NESTING`] levels per definition of the cycle, [`MAX_CYCLE_LEVELS`] in all), a
//! reference from one level to a definition of the same cycle goes to the next level, and the
//! last level's references allow nothing (`false`: an array of them stays empty). A weak model
//! asked for a recursive structure otherwise nests until its budget ends and never finishes.

use std::collections::{HashMap, HashSet};

use serde_json::{Map, Value};

/// Most definitions (`$defs` and `definitions` entries) and distinct reference targets a schema
/// may have. Real tool schemas have tens; pydantic's largest models a few hundred.
pub(crate) const MAX_DEFINITIONS: usize = 256;

/// Most schemas nested along any path, references followed and recursion unrolled. Real tool
/// schemas nest under 20; the grammar compiler recurses once per level (a few KiB of stack).
pub(crate) const MAX_DEPTH: usize = 64;

/// Largest schema once its recursion is unrolled, in bytes of JSON (estimated before anything
/// is copied): the same bound as the compiled grammar's text.
pub(crate) const MAX_EXPANDED_BYTES: usize = crate::grammar::MAX_GRAMMAR_BYTES;

/// Largest `pattern` once counted repetitions are multiplied out (`(x{1000}){1000}` is a
/// million): the regex compiler builds about one node per unit, and real patterns (ids, dates,
/// `.{1,4096}`) are a few thousand at most.
pub(crate) const MAX_PATTERN_SIZE: u64 = 10_000;

/// How many levels deep a definition that refers to itself (or the schema through `#`) may
/// nest in constrained output; a cycle of n definitions gets n times as many levels.
pub(crate) const MAX_SELF_NESTING: usize = 3;

/// Most levels any cycle of definitions is unrolled to, however many definitions it has.
pub(crate) const MAX_CYCLE_LEVELS: usize = 12;

/// Why a schema is refused. `at` is a JSON pointer into the schema as the client wrote it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SchemaError {
    /// A reference to another document, an anchor or a base this server cannot resolve.
    #[error(
        "`$ref` {target:?} at {at} is not supported: references must point inside the schema \
         (`#` or `#/...`)"
    )]
    ForeignRef {
        /// Where the reference is.
        at: String,
        /// What it names.
        target: String,
    },
    /// A reference to a place the schema does not have.
    #[error("`$ref` {target:?} at {at} points at nothing in the schema")]
    Dangling {
        /// Where the reference is.
        at: String,
        /// What it names.
        target: String,
    },
    /// A keyword that changes how references resolve.
    #[error("`{keyword}` at {at} is not supported")]
    Unsupported {
        /// Where it is.
        at: String,
        /// The keyword.
        keyword: &'static str,
    },
    /// Too many definitions or reference targets.
    #[error("the schema has {count} {what}; at most {MAX_DEFINITIONS} are allowed")]
    TooManyDefinitions {
        /// How many.
        count: usize,
        /// Definitions or reference targets.
        what: &'static str,
    },
    /// Nested too deep once references are followed.
    #[error(
        "the schema nests {depth} levels deep with its references followed ({path}); at most \
         {MAX_DEPTH} are allowed"
    )]
    TooDeep {
        /// How deep.
        depth: usize,
        /// The references along the deepest path.
        path: String,
    },
    /// Too large, as it is or once recursion is unrolled.
    #[error(
        "the schema, its recursion unrolled, would be about {kib} KiB; at most {} KiB are \
         allowed",
        MAX_EXPANDED_BYTES >> 10
    )]
    TooLarge {
        /// The estimated size.
        kib: usize,
    },
    /// A regular expression too large once its repetitions are counted.
    #[error(
        "the pattern at {at} repeats to about {size} characters; at most {MAX_PATTERN_SIZE} \
         are allowed"
    )]
    Pattern {
        /// Where the pattern is.
        at: String,
        /// Its expanded size (saturating).
        size: u64,
    },
}

/// Keywords whose value is a map of names to schemas.
pub(crate) const SCHEMA_MAPS: [&str; 5] = [
    "properties",
    "patternProperties",
    "$defs",
    "definitions",
    "dependentSchemas",
];
/// Keywords whose value is a schema (or, for `items`, a list of them in old drafts).
pub(crate) const SCHEMA_ONE: [&str; 10] = [
    "items",
    "additionalProperties",
    "additionalItems",
    "unevaluatedProperties",
    "not",
    "if",
    "then",
    "else",
    "contains",
    "propertyNames",
];
/// Keywords whose value is a list of schemas.
pub(crate) const SCHEMA_LISTS: [&str; 4] = ["anyOf", "oneOf", "allOf", "prefixItems"];

/// Keywords that move where references resolve, refused anywhere (`$id` only below the root).
const REFUSED: [&str; 5] = [
    "$anchor",
    "$dynamicRef",
    "$dynamicAnchor",
    "$recursiveRef",
    "$recursiveAnchor",
];

/// What [`each_schema`] calls on a schema: its keywords, its pointer and its depth.
type Visit<'a> = dyn FnMut(&Map<String, Value>, &str, usize) + 'a;

/// A copy of a target (target, level).
type Placed = (usize, usize);

/// How deep each copy reaches, and the copy its deepest path goes on to.
type Depths = HashMap<Placed, (usize, Option<Placed>)>;

/// Calls `f` on every schema inside `v` (by keyword, so data such as a `const`, `enum` or
/// `default`, and property names, are never taken for schemas), with its JSON pointer and how
/// deep it is (the root is 1), children before `f` returns for their parent's siblings.
/// Recursion follows the JSON's own nesting, which the JSON parser bounds.
fn each_schema(v: &Value, at: &mut String, depth: usize, f: &mut Visit<'_>) {
    let Value::Object(m) = v else { return };
    f(m, at, depth);
    for (k, c) in m {
        let len = at.len();
        push(at, k);
        if SCHEMA_MAPS.contains(&k.as_str()) {
            if let Value::Object(children) = c {
                for (name, child) in children {
                    let inner = at.len();
                    push(at, name);
                    each_schema(child, at, depth + 1, f);
                    at.truncate(inner);
                }
            }
        } else if SCHEMA_ONE.contains(&k.as_str()) || SCHEMA_LISTS.contains(&k.as_str()) {
            match c {
                Value::Array(list) => {
                    for (i, child) in list.iter().enumerate() {
                        let inner = at.len();
                        push(at, &i.to_string());
                        each_schema(child, at, depth + 1, f);
                        at.truncate(inner);
                    }
                }
                other => each_schema(other, at, depth + 1, f),
            }
        }
        at.truncate(len);
    }
}

/// Appends `/segment` to a JSON pointer, escaped.
fn push(at: &mut String, segment: &str) {
    at.push('/');
    for c in segment.chars() {
        match c {
            '~' => at.push_str("~0"),
            '/' => at.push_str("~1"),
            c => at.push(c),
        }
    }
}

/// `#` followed by a pointer, as a reference and an error message name it.
fn shown(pointer: &str) -> String {
    format!("#{pointer}")
}

/// Whether a pointer lies inside the root's own definitions (which the root does not contain
/// inline: they count only where they are referred to).
fn in_root_defs(pointer: &str) -> bool {
    pointer.starts_with("/$defs/") || pointer.starts_with("/definitions/")
}

/// The pointer a local reference names (`#` is the root, `""`), percent-decoded; `None` for
/// anything else.
fn target_of(reference: &str) -> Option<String> {
    let rest = reference.strip_prefix('#')?;
    if !(rest.is_empty() || rest.starts_with('/')) {
        return None;
    }
    if !rest.contains('%') {
        return Some(rest.to_string());
    }
    let bytes = rest.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%'
            && let Some(hex) = rest.get(i + 1..i + 3)
            && let Ok(b) = u8::from_str_radix(hex, 16)
        {
            out.push(b);
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

/// A reference found in the schema.
struct Ref {
    /// Where it is (a JSON pointer).
    at: String,
    /// How deep the schema holding it is.
    depth: usize,
    /// The index of the target it names.
    target: usize,
}

/// The schema's reference graph: its targets (the root is target 0), the references inside
/// each (with their depth relative to the target's own top), and its cycles.
struct Graph {
    /// Target pointers; `""` (the root) first.
    targets: Vec<String>,
    /// `refs[t]`: the references inside target `t`'s schema, depth counted from `t`'s top (1).
    refs: Vec<Vec<(usize, usize)>>,
    /// The deepest schema inside each target, references not followed.
    own_depth: Vec<usize>,
    /// Approximate JSON size of each target's schema.
    size: Vec<usize>,
    /// The cycle (strongly connected component) each target is on, if any.
    cycle: Vec<Option<usize>>,
    /// The number of definitions on each cycle.
    cycle_len: Vec<usize>,
}

impl Graph {
    /// Levels the cycle of target `t` is unrolled to (0 when `t` is on none).
    fn levels(&self, t: usize) -> usize {
        self.cycle[t].map_or(0, |c| {
            (MAX_SELF_NESTING * self.cycle_len[c]).min(MAX_CYCLE_LEVELS)
        })
    }

    /// Where a reference from target `from` at `level` to target `to` leads: the copy of `to`
    /// at the returned level, or `None` past the last level.
    fn next(&self, from: usize, level: usize, to: usize) -> Option<usize> {
        match self.cycle[to] {
            None => Some(0),
            Some(c) if self.cycle[from] == Some(c) => {
                (level < self.levels(to)).then_some(level + 1)
            }
            Some(_) => Some(1),
        }
    }
}

/// Checks `schema` against every limit (see the module docs), then returns it with its
/// recursion unrolled. A schema without cycles comes back as it was.
pub(crate) fn prepare(schema: Value) -> Result<Value, SchemaError> {
    match checked(&schema)? {
        Some(graph) => Ok(unroll(&schema, &graph)),
        None => Ok(schema),
    }
}

/// Checks `schema` against every limit without unrolling it (a request's tools are checked
/// before their text goes into the prompt).
pub(crate) fn check(schema: &Value) -> Result<(), SchemaError> {
    checked(schema).map(|_| ())
}

/// The checks of [`prepare`]; the graph when the schema has recursion to unroll.
fn checked(schema: &Value) -> Result<Option<Graph>, SchemaError> {
    if !schema.is_object() {
        return Ok(None);
    }
    let raw = approximate_len(schema, false);
    if raw > MAX_EXPANDED_BYTES {
        return Err(SchemaError::TooLarge {
            kib: raw.div_ceil(1024),
        });
    }
    let graph = graph(schema)?;
    check_depth(&graph)?;
    if graph.cycle.iter().all(Option::is_none) {
        return Ok(None);
    }
    let estimate = expanded_size(&graph);
    if estimate > MAX_EXPANDED_BYTES {
        return Err(SchemaError::TooLarge {
            kib: estimate.div_ceil(1024),
        });
    }
    Ok(Some(graph))
}

/// Reads the schema's references, definitions and patterns, checking each (see [`prepare`]).
fn graph(schema: &Value) -> Result<Graph, SchemaError> {
    let Value::Object(root) = schema else {
        unreachable!("prepare passes objects only")
    };
    let defs: usize = ["$defs", "definitions"]
        .iter()
        .filter_map(|k| root.get(*k).and_then(Value::as_object))
        .map(Map::len)
        .sum();
    if defs > MAX_DEFINITIONS {
        return Err(SchemaError::TooManyDefinitions {
            count: defs,
            what: "definitions",
        });
    }
    // Every reference, keyword and pattern, with its place.
    let mut raw: Vec<(String, usize, String)> = Vec::new();
    let mut bad: Option<SchemaError> = None;
    each_schema(schema, &mut String::new(), 1, &mut |m, at, depth| {
        if bad.is_some() {
            return;
        }
        for k in REFUSED {
            if m.contains_key(k) {
                bad = Some(SchemaError::Unsupported {
                    at: shown(at),
                    keyword: k,
                });
                return;
            }
        }
        if !at.is_empty() && m.contains_key("$id") {
            bad = Some(SchemaError::Unsupported {
                at: shown(at),
                keyword: "$id",
            });
            return;
        }
        if let Some(r) = m.get("$ref") {
            let r = r.as_str().unwrap_or_default();
            raw.push((at.to_string(), depth, r.to_string()));
        }
        if let Some(Value::String(p)) = m.get("pattern")
            && let Err(e) = check_pattern(p, &format!("{}/pattern", shown(at)))
        {
            bad = Some(e);
            return;
        }
        if let Some(Value::Object(pp)) = m.get("patternProperties") {
            for name in pp.keys() {
                let mut place = shown(at);
                push(&mut place, "patternProperties");
                push(&mut place, name);
                if let Err(e) = check_pattern(name, &place) {
                    bad = Some(e);
                    return;
                }
            }
        }
    });
    if let Some(e) = bad {
        return Err(e);
    }
    let mut targets = vec![String::new()];
    let mut index: HashMap<String, usize> = HashMap::from([(String::new(), 0)]);
    let mut found: Vec<Ref> = Vec::with_capacity(raw.len());
    for (at, depth, r) in raw {
        let Some(pointer) = target_of(&r) else {
            return Err(SchemaError::ForeignRef {
                at: shown(&at),
                target: r,
            });
        };
        if schema.pointer(&pointer).is_none() {
            return Err(SchemaError::Dangling {
                at: shown(&at),
                target: r,
            });
        }
        let next = targets.len();
        let t = *index.entry(pointer.clone()).or_insert(next);
        if t == next {
            targets.push(pointer);
            if targets.len() > MAX_DEFINITIONS + 1 {
                return Err(SchemaError::TooManyDefinitions {
                    count: targets.len() - 1,
                    what: "distinct reference targets",
                });
            }
        }
        found.push(Ref {
            at,
            depth,
            target: t,
        });
    }
    // Each target holds the references whose place lies under its pointer (the root: all but
    // those in its definitions), at their depth below the target's top.
    let mut refs: Vec<Vec<(usize, usize)>> = vec![Vec::new(); targets.len()];
    let mut own_depth = vec![1; targets.len()];
    let mut size = vec![0; targets.len()];
    // How deep each target sits; a target that is no schema of its own (a pointer into a
    // keyword's map) counts as the top.
    let mut target_depth = vec![1; targets.len()];
    each_schema(schema, &mut String::new(), 1, &mut |_, at, depth| {
        if let Some(&t) = index.get(at) {
            target_depth[t] = depth;
        }
    });
    for (t, p) in targets.iter().enumerate() {
        let below = format!("{p}/");
        for r in &found {
            let inside = if p.is_empty() {
                !in_root_defs(&r.at)
            } else {
                r.at == *p || r.at.starts_with(&below)
            };
            if inside {
                refs[t].push((
                    (r.depth + 1).saturating_sub(target_depth[t]).max(1),
                    r.target,
                ));
            }
        }
        if let Some(body) = schema.pointer(p) {
            let mut deepest = 1;
            let mut bytes = 0;
            each_schema(body, &mut String::new(), 1, &mut |m, at, depth| {
                if p.is_empty() && in_root_defs(at) {
                    return;
                }
                deepest = deepest.max(depth);
                bytes += m.len() * 8;
            });
            own_depth[t] = deepest;
            bytes += approximate_len(body, p.is_empty());
            size[t] = bytes;
        }
    }
    let (cycle, cycle_len) = cycles(&refs);
    Ok(Graph {
        targets,
        refs,
        own_depth,
        size,
        cycle,
        cycle_len,
    })
}

/// The JSON text length of `v`, near enough to budget by (the root without its definitions).
fn approximate_len(v: &Value, skip_defs: bool) -> usize {
    match v {
        Value::Null | Value::Bool(_) => 5,
        Value::Number(n) => n.to_string().len(),
        Value::String(s) => s.len() + 2,
        Value::Array(a) => {
            2 + a
                .iter()
                .map(|c| approximate_len(c, false) + 1)
                .sum::<usize>()
        }
        Value::Object(m) => {
            2 + m
                .iter()
                .filter(|(k, _)| !(skip_defs && (*k == "$defs" || *k == "definitions")))
                .map(|(k, c)| k.len() + 4 + approximate_len(c, false))
                .sum::<usize>()
        }
    }
}

/// The strongly connected components of the reference graph that are cycles (a target that
/// reaches itself): each target's component, and each component's size.
fn cycles(refs: &[Vec<(usize, usize)>]) -> (Vec<Option<usize>>, Vec<usize>) {
    let n = refs.len();
    let reach: Vec<Vec<bool>> = (0..n)
        .map(|start| {
            let mut seen = vec![false; n];
            let mut todo: Vec<usize> = refs[start].iter().map(|&(_, t)| t).collect();
            while let Some(t) = todo.pop() {
                if !seen[t] {
                    seen[t] = true;
                    todo.extend(refs[t].iter().map(|&(_, u)| u));
                }
            }
            seen
        })
        .collect();
    let mut cycle = vec![None; n];
    let mut len = Vec::new();
    for t in 0..n {
        if cycle[t].is_some() || !reach[t][t] {
            continue;
        }
        let c = len.len();
        let members: Vec<usize> = (0..n).filter(|&u| reach[t][u] && reach[u][t]).collect();
        for &u in &members {
            cycle[u] = Some(c);
        }
        len.push(members.len());
    }
    (cycle, len)
}

/// Refuses a schema that nests deeper than [`MAX_DEPTH`] along any path of the unrolled
/// schema, computed over (target, level) pairs without building anything: the unrolled graph
/// is acyclic (levels rise inside a cycle; cycles are left for other cycles only downhill), so
/// an explicit-stack walk over it ends.
fn check_depth(g: &Graph) -> Result<(), SchemaError> {
    let mut memo: Depths = HashMap::new();
    let mut stack: Vec<Placed> = vec![(0, 0)];
    while let Some(&(t, level)) = stack.last() {
        if memo.contains_key(&(t, level)) {
            stack.pop();
            continue;
        }
        let mut waiting = false;
        let mut best = (g.own_depth[t], None);
        for &(d, u) in &g.refs[t] {
            let Some(l) = g.next(t, level, u) else {
                continue;
            };
            match memo.get(&(u, l)) {
                // The reference is a level of its own, so a chain counts every link.
                Some(&(below, _)) => {
                    let total = d + below;
                    if total > best.0 {
                        best = (total, Some((u, l)));
                    }
                }
                None => {
                    waiting = true;
                    stack.push((u, l));
                }
            }
        }
        if stack.len() > MAX_DEFINITIONS * MAX_CYCLE_LEVELS * 64 {
            // Unreachable for an acyclic graph of this size; a bound all the same.
            return Err(SchemaError::TooDeep {
                depth: stack.len(),
                path: shown(&g.targets[t]),
            });
        }
        if !waiting {
            memo.insert((t, level), best);
            stack.pop();
            if best.0 > MAX_DEPTH {
                return Err(too_deep(g, &memo, best.0, (t, level)));
            }
        }
    }
    Ok(())
}

/// The [`SchemaError::TooDeep`] of the first copy found past the limit, `at`: the references
/// along its deepest path.
fn too_deep(g: &Graph, memo: &Depths, depth: usize, at: (usize, usize)) -> SchemaError {
    let mut chain = vec![at.0];
    let mut here = at;
    while let Some(&(_, Some(next))) = memo.get(&here) {
        chain.push(next.0);
        here = next;
        if chain.len() > MAX_DEPTH * MAX_CYCLE_LEVELS {
            break;
        }
    }
    let names: Vec<String> = chain.iter().map(|&t| shown(&g.targets[t])).collect();
    let path = if names.len() <= 4 {
        names.join(" -> ")
    } else {
        format!(
            "{} -> {} -> ... -> {}, {} references",
            names[0],
            names[1],
            names[names.len() - 1],
            names.len() - 1
        )
    };
    SchemaError::TooDeep { depth, path }
}

/// The size of the unrolled schema: the root without its definitions, one copy of every
/// target off cycles, one per level of every target on one.
fn expanded_size(g: &Graph) -> usize {
    (0..g.targets.len())
        .map(|t| g.size[t].saturating_mul(g.levels(t).max(1) + usize::from(t == 0)))
        .fold(0usize, usize::saturating_add)
}

/// The name of target `t`'s copy at `level` in the unrolled schema's `$defs`.
fn copy_name(t: usize, level: usize) -> String {
    format!("strata_{t}_{level}")
}

/// The unrolled schema (see the module docs): the root at level 0 with every reference
/// rewritten, and the copies it reaches in a fresh `$defs` that replaces the client's own.
fn unroll(schema: &Value, g: &Graph) -> Value {
    let mut defs = Map::new();
    let mut todo: Vec<(usize, usize)> = Vec::new();
    let mut made: HashSet<(usize, usize)> = HashSet::new();
    let mut root = rewritten(schema.clone(), g, 0, 0, &mut todo);
    while let Some((t, level)) = todo.pop() {
        if !made.insert((t, level)) {
            continue;
        }
        let body = schema
            .pointer(&g.targets[t])
            .cloned()
            .unwrap_or(Value::Bool(false));
        defs.insert(copy_name(t, level), rewritten(body, g, t, level, &mut todo));
    }
    if let Value::Object(m) = &mut root {
        m.remove("definitions");
        m.insert("$defs".into(), Value::Object(defs));
    }
    root
}

/// `body` (target `t`'s schema) as its copy at `level`: each reference rewritten to the copy
/// it leads to (queued in `todo`), or `false` past the last level. Nested schemas that are
/// targets themselves stay inline here; references to them get their own copies.
fn rewritten(
    mut body: Value,
    g: &Graph,
    t: usize,
    level: usize,
    todo: &mut Vec<(usize, usize)>,
) -> Value {
    fn visit(
        v: &mut Value,
        top: bool,
        g: &Graph,
        from: (usize, usize),
        index: &HashMap<&str, usize>,
        todo: &mut Vec<(usize, usize)>,
    ) {
        let Value::Object(m) = v else { return };
        if let Some(r) = m.get("$ref").and_then(Value::as_str)
            && let Some(p) = target_of(r)
            && let Some(&u) = index.get(p.as_str())
        {
            match g.next(from.0, from.1, u) {
                Some(l) => {
                    m.insert(
                        "$ref".into(),
                        Value::String(format!("#/$defs/{}", copy_name(u, l))),
                    );
                    todo.push((u, l));
                }
                None => {
                    *v = Value::Bool(false);
                    return;
                }
            }
        }
        for (k, c) in m.iter_mut() {
            let k = k.as_str();
            if top && (k == "$defs" || k == "definitions") {
                continue;
            }
            if SCHEMA_MAPS.contains(&k) {
                if let Value::Object(children) = c {
                    for child in children.values_mut() {
                        visit(child, false, g, from, index, todo);
                    }
                }
            } else if SCHEMA_ONE.contains(&k) || SCHEMA_LISTS.contains(&k) {
                match c {
                    Value::Array(list) => list
                        .iter_mut()
                        .for_each(|child| visit(child, false, g, from, index, todo)),
                    other => visit(other, false, g, from, index, todo),
                }
            }
        }
    }
    let index: HashMap<&str, usize> = g
        .targets
        .iter()
        .enumerate()
        .map(|(i, p)| (p.as_str(), i))
        .collect();
    // The root's definitions are not part of its body; other targets keep what they hold.
    visit(&mut body, t == 0, g, (t, level), &index, todo);
    body
}

/// Refuses a pattern whose counted repetitions multiply past [`MAX_PATTERN_SIZE`]. A pattern
/// this parser cannot read is left to the grammar compiler, which says what is wrong with it.
fn check_pattern(pattern: &str, at: &str) -> Result<(), SchemaError> {
    use regex_syntax::ast::{Ast, RepetitionKind, RepetitionRange};
    fn size(ast: &Ast) -> u64 {
        match ast {
            Ast::Repetition(r) => {
                let times = match &r.op.kind {
                    RepetitionKind::ZeroOrOne
                    | RepetitionKind::ZeroOrMore
                    | RepetitionKind::OneOrMore => 1,
                    RepetitionKind::Range(RepetitionRange::Exactly(n))
                    | RepetitionKind::Range(RepetitionRange::AtLeast(n)) => u64::from(*n).max(1),
                    RepetitionKind::Range(RepetitionRange::Bounded(a, b)) => {
                        u64::from(*a.max(b)).max(1)
                    }
                };
                size(&r.ast).saturating_mul(times)
            }
            Ast::Group(g) => size(&g.ast),
            Ast::Alternation(a) => a.asts.iter().map(size).fold(0, u64::saturating_add),
            Ast::Concat(c) => c.asts.iter().map(size).fold(0, u64::saturating_add),
            _ => 1,
        }
    }
    let Ok(ast) = regex_syntax::ast::parse::Parser::new().parse(pattern) else {
        return Ok(());
    };
    let n = size(&ast);
    if n > MAX_PATTERN_SIZE {
        return Err(SchemaError::Pattern {
            at: at.to_string(),
            size: n,
        });
    }
    Ok(())
}

/// A map of a schema's targets to their copies, for tests and diagnostics.
#[cfg(test)]
fn copies(v: &Value) -> std::collections::BTreeMap<String, usize> {
    v.get("$defs")
        .and_then(Value::as_object)
        .map(|d| {
            d.iter()
                .map(|(k, c)| (k.clone(), c.to_string().len()))
                .collect()
        })
        .unwrap_or_default()
}

/// Schemas that once took the process down, for tests here and of the grammar compiler.
#[cfg(test)]
pub(crate) mod hostile {
    use serde_json::{Map, Value, json};

    /// The `$ref` chain of `n` definitions that overflowed a worker's stack in the compiler.
    pub(crate) fn chain(n: usize) -> Value {
        let mut defs = Map::new();
        for i in 0..n {
            defs.insert(
                format!("d{i}"),
                json!({"$ref": format!("#/$defs/d{}", i + 1)}),
            );
        }
        defs.insert(format!("d{n}"), json!({"type": "string"}));
        json!({"$defs": defs, "$ref": "#/$defs/d0"})
    }

    /// Definitions that are each an array of any of all of them: exponential when each
    /// reference was expanded in place.
    pub(crate) fn mutual(names: &str) -> Value {
        let mut defs = Map::new();
        for x in names.chars() {
            let any: Vec<Value> = names
                .chars()
                .map(|y| json!({"$ref": format!("#/$defs/{y}")}))
                .collect();
            defs.insert(
                x.to_string(),
                json!({"type": "array", "items": {"anyOf": any}}),
            );
        }
        json!({"$defs": defs, "$ref": "#/$defs/A"})
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::hostile::{chain, mutual};
    use super::*;
    use serde_json::json;

    #[test]
    fn a_long_reference_chain_is_refused_before_it_is_followed() {
        assert!(prepare(chain(40)).is_ok());
        // The chain that overflowed the stack has more definitions than allowed.
        let e = prepare(chain(700)).unwrap_err();
        assert!(
            matches!(e, SchemaError::TooManyDefinitions { count: 701, .. }),
            "{e}"
        );
        let e = prepare(chain(200)).unwrap_err();
        let SchemaError::TooDeep { depth, path } = &e else {
            panic!("{e}")
        };
        assert!(*depth > MAX_DEPTH, "{e}");
        assert!(path.contains("#/$defs/d"), "{e}");
        assert!(e.to_string().len() < 300, "{e}");
    }

    #[test]
    fn mutual_recursion_unrolls_in_linear_size() {
        for names in ["AB", "ABCD", "ABCDE", "ABCDEFGHIJKL"] {
            let out = prepare(mutual(names)).unwrap();
            let n = names.len();
            let levels = (MAX_SELF_NESTING * n).min(MAX_CYCLE_LEVELS);
            // `A` at the first level (the root's reference), then every definition at each
            // level after it.
            assert_eq!(copies(&out).len(), 1 + n * (levels - 1), "{names}");
            assert!(out.to_string().len() < 400 * n * levels, "{names}");
        }
    }

    #[test]
    fn references_out_of_the_schema_and_moved_bases_are_refused() {
        for (bad, word) in [
            (
                json!({"$ref": "https://example.com/s.json"}),
                "not supported",
            ),
            (json!({"$ref": "#/$defs/missing"}), "points at nothing"),
            (json!({"$ref": "#anchor"}), "not supported"),
            (
                json!({"properties": {"a": {"$id": "x", "type": "string"}}}),
                "`$id`",
            ),
            (json!({"$dynamicRef": "#meta"}), "`$dynamicRef`"),
        ] {
            let e = prepare(bad.clone()).unwrap_err().to_string();
            assert!(e.contains(word), "{bad}: {e}");
        }
        assert!(prepare(json!({"$id": "https://example.com/root", "type": "object"})).is_ok());
    }

    #[test]
    fn too_many_definitions_are_refused() {
        let defs: Map<String, Value> = (0..=MAX_DEFINITIONS)
            .map(|i| (format!("d{i}"), json!({"type": "string"})))
            .collect();
        let e = prepare(json!({"$defs": defs})).unwrap_err();
        assert!(matches!(e, SchemaError::TooManyDefinitions { .. }), "{e}");
    }

    #[test]
    fn nested_repetitions_in_patterns_are_refused_where_they_are() {
        let e = prepare(
            json!({"type": "object", "properties": {"x": {"type": "string",
            "pattern": "^(x{1000}){1000}$"}}}),
        )
        .unwrap_err();
        let SchemaError::Pattern { at, size } = &e else {
            panic!("{e}")
        };
        assert_eq!(at, "#/properties/x/pattern");
        assert!((1_000_000..1_000_010).contains(size), "{e}");
        assert!(prepare(json!({"type": "string", "pattern": "^[a-f0-9]{8}-[a-f0-9]{4}$"})).is_ok());
        let e = prepare(json!({"patternProperties": {"^(a{200}){200}$": {}}})).unwrap_err();
        assert!(matches!(e, SchemaError::Pattern { .. }), "{e}");
    }

    #[test]
    fn self_reference_keeps_four_levels_of_the_root() {
        let tree = json!({"type": "object", "properties": {
            "kids": {"type": "array", "items": {"$ref": "#"}}}});
        let out = prepare(tree).unwrap();
        assert_eq!(copies(&out).len(), MAX_SELF_NESTING);
        // The deepest copy allows no further kids.
        let last = &out["$defs"][copy_name(0, MAX_SELF_NESTING)];
        assert_eq!(last["properties"]["kids"]["items"], json!(false));
    }

    #[test]
    fn pointer_references_and_escaped_names_resolve() {
        let s = json!({"$defs": {"a/b": {"type": "string"}, "c d": {"type": "integer"}},
            "properties": {"x": {"$ref": "#/$defs/a~1b"}, "y": {"$ref": "#/$defs/c%20d"},
                "z": {"$ref": "#/properties/x"}}});
        assert_eq!(prepare(s.clone()).unwrap(), s);
        // A cycle through a pointer that is not a definition unrolls too.
        let s =
            json!({"properties": {"x": {"type": "array", "items": {"$ref": "#/properties/x"}}}});
        let out = prepare(s).unwrap();
        assert_eq!(copies(&out).len(), MAX_SELF_NESTING);
    }
}
