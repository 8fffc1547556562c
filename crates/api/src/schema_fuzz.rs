//! Structure-aware fuzzing of the schema limits and the grammar compiler behind them: schemas
//! built the way hostile ones are (reference chains, cycles, mutual recursion and fan-out
//! among definitions, nested `anyOf`/`allOf`, patterns of nested counted repetitions, huge
//! enums, consts and length bounds) go through [`Grammars::json`] and
//! [`Grammars::tool_calls`], each of which must answer (a grammar or an error) within the
//! compile deadline without taking the process down, with the process's memory bounded.
//!
//! CI runs a fixed seed and [`DEFAULT_CASES`] cases; `scripts/fuzz-schemas.sh` runs longer,
//! with fresh seeds (`STRATA_FUZZ_CASES`, `STRATA_FUZZ_SEED`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use proptest::prelude::*;
use proptest::test_runner::{Config, RngSeed, TestRunner};
use serde_json::{Map, Value, json};

use crate::call_format::CallFormat;
use crate::grammar::Grammars;
use crate::tools::Choice;
use crate::types::Tool;

/// Cases a run tries unless `STRATA_FUZZ_CASES` says otherwise.
const DEFAULT_CASES: u32 = 96;

/// The seed of CI's runs unless `STRATA_FUZZ_SEED` says otherwise.
const DEFAULT_SEED: u64 = 0x5EED_5C4E_3A00_0052;

/// Longest a schema may take to answer, either way: past the compile deadline a request is
/// answered anyway, so this is that deadline plus room for a loaded machine.
const ANSWER_WITHIN: Duration = Duration::from_secs(15);

/// Most resident memory the test process may reach (the test vocabulary and a few grammars
/// take tens of MiB; an expansion without bound takes gigabytes).
const PEAK_MIB: u64 = 1536;

/// A `$ref` to definition `i`.
fn to(i: usize) -> Value {
    json!({"$ref": format!("#/$defs/d{i}")})
}

/// A chain of references of any length, the last to a string.
fn chains() -> impl Strategy<Value = Value> {
    (1usize..1200, any::<bool>()).prop_map(|(n, described)| {
        let mut d = Map::new();
        for i in 0..n {
            let mut link = to(i + 1);
            if described {
                link["description"] = json!(format!("link {i}"));
            }
            d.insert(format!("d{i}"), link);
        }
        d.insert(format!("d{n}"), json!({"type": "string"}));
        json!({"$defs": d, "$ref": "#/$defs/d0"})
    })
}

/// One definition of a graph: what it is, over references to `refs`.
fn definition(kind: u8, refs: &[usize]) -> Value {
    let any: Vec<Value> = refs.iter().map(|&r| to(r)).collect();
    match kind % 6 {
        0 => json!({"type": "array", "items": {"anyOf": any}}),
        1 => {
            let props: Map<String, Value> = refs
                .iter()
                .enumerate()
                .map(|(i, &r)| (format!("p{i}"), to(r)))
                .collect();
            let required: Vec<String> = (0..refs.len()).map(|i| format!("p{i}")).collect();
            json!({"type": "object", "properties": props, "required": required})
        }
        2 => json!({"allOf": any}),
        3 => json!({"oneOf": any, "description": "either"}),
        4 => json!({"type": "array", "prefixItems": any, "minItems": refs.len()}),
        _ => json!({"type": ["string", "null"], "maxLength": 8}),
    }
}

/// Definitions referring to any of each other (cycles, mutual recursion, fan-out), the root
/// one of them or the schema itself (`#`).
fn graphs() -> impl Strategy<Value = Value> {
    (1usize..12)
        .prop_flat_map(|n| {
            (
                Just(n),
                proptest::collection::vec((any::<u8>(), proptest::collection::vec(0..n, 1..7)), n),
                any::<bool>(),
            )
        })
        .prop_map(|(n, defs, root_ref)| {
            let mut d = Map::new();
            for (i, (kind, refs)) in defs.iter().enumerate() {
                d.insert(format!("d{i}"), definition(*kind, refs));
            }
            let mut root = json!({"$defs": d});
            if root_ref {
                // The root refers to itself through its last definition.
                root["$defs"][format!("d{}", n - 1)] =
                    json!({"type": "array", "items": {"$ref": "#"}});
                root["anyOf"] = json!([to(0), {"type": "integer"}]);
            } else {
                root["$ref"] = json!("#/$defs/d0");
            }
            root
        })
}

/// The mutual recursion that grew without bound: every definition an array of any of all.
fn mutual() -> impl Strategy<Value = Value> {
    (2usize..16).prop_map(|n| {
        let all: Vec<usize> = (0..n).collect();
        let d: Map<String, Value> = (0..n)
            .map(|i| (format!("d{i}"), definition(0, &all)))
            .collect();
        json!({"$defs": d, "$ref": "#/$defs/d0"})
    })
}

/// Nested `anyOf`, `allOf`, arrays and objects, with self-references among the leaves.
fn nested() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(json!({"type": "string"})),
        Just(json!({"type": "integer", "minimum": 0})),
        Just(json!({"type": "boolean"})),
        Just(json!({"$ref": "#"})),
        Just(json!({"enum": ["a", "b", 1, null]})),
    ];
    leaf.prop_recursive(48, 256, 4, |inner| {
        prop_oneof![
            proptest::collection::vec(inner.clone(), 1..5).prop_map(|v| json!({"anyOf": v})),
            proptest::collection::vec(inner.clone(), 1..4).prop_map(|v| json!({"allOf": v})),
            inner
                .clone()
                .prop_map(|v| json!({"type": "array", "items": v})),
            (inner.clone(), inner).prop_map(|(a, b)| json!({"type": "object",
                "properties": {"a": a, "b": b}, "required": ["a"]})),
        ]
    })
}

/// Patterns of nested counted repetitions, and strings and arrays with huge length bounds.
fn repetitions() -> impl Strategy<Value = Value> {
    let pattern = (
        proptest::collection::vec(1u32..3000, 1..4),
        prop_oneof![Just("x"), Just("[a-z]"), Just("(a|bc)"), Just("\\d")],
    )
        .prop_map(|(counts, atom)| {
            let mut p = atom.to_string();
            for c in counts {
                p = format!("({p}){{{c}}}");
            }
            json!({"type": "object", "properties": {"s": {"type": "string",
                "pattern": format!("^{p}$")}}, "required": ["s"]})
        });
    let lengths = (0u64..2_000_000, 0u64..2_000_000, any::<bool>()).prop_map(|(a, b, array)| {
        let (lo, hi) = (a.min(b), a.max(b));
        if array {
            json!({"type": "array", "items": {"type": "integer"}, "minItems": lo, "maxItems": hi})
        } else {
            json!({"type": "string", "minLength": lo, "maxLength": hi})
        }
    });
    prop_oneof![pattern, lengths]
}

/// Huge enums and consts.
fn literals() -> impl Strategy<Value = Value> {
    prop_oneof![
        (1usize..12_000).prop_map(|n| {
            let e: Vec<String> = (0..n).map(|i| format!("value-{i}")).collect();
            json!({"enum": e})
        }),
        (1usize..400_000).prop_map(|n| json!({"const": "y".repeat(n)})),
        (1usize..3000).prop_map(|n| {
            let any: Vec<Value> = (0..n).map(|i| json!({"const": i})).collect();
            json!({"anyOf": any})
        }),
    ]
}

/// Every kind of hostile schema.
fn schemas() -> impl Strategy<Value = Value> {
    prop_oneof![
        chains(),
        graphs(),
        mutual(),
        nested(),
        repetitions(),
        literals()
    ]
}

/// Peak resident memory of this process (VmHWM), in MiB (0 where there is no `/proc`).
#[cfg(not(target_os = "macos"))]
fn peak_mib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmHWM:"))
                .and_then(|v| v.split_whitespace().next())
                .and_then(|v| v.parse::<u64>().ok())
        })
        .map_or(0, |kb| kb / 1024)
}

/// Peak resident memory of this process, in MiB: getrusage's maximum resident set size,
/// which macOS gives in bytes (Linux in KiB).
#[cfg(target_os = "macos")]
fn peak_mib() -> u64 {
    // SAFETY: an all-zero rusage is a valid value for getrusage to overwrite.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes the struct it is given and nothing else.
    if unsafe { libc::getrusage(libc::RUSAGE_SELF, &mut u) } != 0 {
        return 0;
    }
    u64::try_from(u.ru_maxrss).map_or(0, |b| b >> 20)
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

#[test]
fn generated_hostile_schemas_are_answered_in_time_without_taking_the_process_down() {
    #![allow(clippy::unwrap_used)]
    let file = strata_gguf::GgufFile::from_bytes(crate::testkit::vocabulary()).unwrap();
    let tok = strata_tokenizer::Tokenizer::from_gguf(file.metadata()).unwrap();
    let g = Grammars::new(Arc::new(tok), CallFormat::detect(None)).unwrap();
    let cases = env_or("STRATA_FUZZ_CASES", DEFAULT_CASES);
    let seed = env_or("STRATA_FUZZ_SEED", DEFAULT_SEED);
    let mut runner = TestRunner::new(Config {
        cases,
        rng_seed: RngSeed::Fixed(seed),
        failure_persistence: None,
        ..Config::default()
    });
    let result = runner.run(&schemas(), |schema| {
        let tool: Tool = serde_json::from_value(json!({"type": "function",
            "function": {"name": "f", "parameters": schema}}))
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
        let t0 = Instant::now();
        let as_format = g.json(schema.clone());
        let t1 = Instant::now();
        let as_tool = g.tool_calls(std::slice::from_ref(&tool), &Choice::Required, false);
        let t2 = Instant::now();
        let text = schema.to_string();
        let shown = &text[..text.len().min(200)];
        for (what, took, answer) in [
            ("response format", t1 - t0, as_format.err()),
            ("tool parameters", t2 - t1, as_tool.err()),
        ] {
            prop_assert!(
                took < ANSWER_WITHIN,
                "{what} took {took:?}: {shown} ({} bytes)",
                text.len()
            );
            if let Some(e) = answer {
                prop_assert!(
                    e.to_string().len() < 600,
                    "{what}: an error of {} bytes: {e:.300}",
                    e.to_string().len()
                );
            }
        }
        let peak = peak_mib();
        prop_assert!(peak < PEAK_MIB, "peak memory {peak} MiB after {shown}");
        Ok(())
    });
    if let Err(e) = result {
        panic!("seed {seed:#x}: {e}");
    }
    println!(
        "{cases} schemas, seed {seed:#x}: peak memory {} MiB",
        peak_mib()
    );
}
