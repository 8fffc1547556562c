//! End-to-end tests of `strata-bench`: real processes measuring the real model.
//!
//! `cluster` starts `strata node` processes from the `strata` binary beside `strata-bench`:
//! `cargo test --workspace` builds both (with `-p strata-bench` alone, build `strata` first).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

/// Runs `strata-bench engine --no-llama --json` with `args` on the default model and returns
/// its JSON report.
fn bench_json(args: &[&str]) -> serde_json::Value {
    strata_store::Store::from_env()
        .expect("store")
        .ensure("smollm2-135m-instruct")
        .expect("default model");
    let out = Command::new(env!("CARGO_BIN_EXE_strata-bench"))
        .args(["engine", "--no-llama", "--json"])
        .args(args)
        .output()
        .expect("running strata");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn bench_engine_reports_every_test_with_a_roofline() {
    let v = bench_json(&["--threads", "1,2", "--pp", "16", "--tg", "4", "-r", "2"]);
    assert!(v["weight_bytes_per_token"].as_u64().unwrap() > 90_000_000);
    let results = v["results"].as_array().unwrap();
    let tests: Vec<(u64, &str)> = results
        .iter()
        .map(|r| (r["threads"].as_u64().unwrap(), r["test"].as_str().unwrap()))
        .collect();
    assert_eq!(tests, [(1, "pp16"), (1, "tg4"), (2, "pp16"), (2, "tg4")]);
    for r in results {
        assert!(r["strata_tok_s"].as_f64().unwrap() > 0.0, "{r}");
        assert_eq!(r["strata_samples"].as_array().unwrap().len(), 2);
        assert!(r["llama_cpp_tok_s"].is_null());
        assert!(r["ratio"].is_null());
        assert_eq!(r["llama_cpp_samples"].as_array().unwrap().len(), 0);
        if r["test"] == "tg4" {
            assert!(r["roofline_tok_s"].as_f64().unwrap() > 0.0, "{r}");
        }
    }
}

#[test]
fn bench_engine_measures_at_depth() {
    let v = bench_json(&[
        "--threads",
        "1",
        "--pp",
        "8",
        "--tg",
        "4",
        "-r",
        "1",
        "--depth",
        "40",
    ]);
    assert_eq!(v["depth"], 40);
    let results = v["results"].as_array().unwrap();
    let tests: Vec<&str> = results
        .iter()
        .map(|r| r["test"].as_str().unwrap())
        .collect();
    assert_eq!(tests, ["pp8 @ d40", "tg4 @ d40"]);
    for r in results {
        assert!(r["strata_tok_s"].as_f64().unwrap() > 0.0, "{r}");
        // The weights alone do not bound decoding at depth.
        assert!(r["roofline_tok_s"].is_null(), "{r}");
    }
}

#[test]
fn bench_refuses_bad_options_in_one_line() {
    let missing = "/nonexistent/strata-test-model.gguf";
    let cases: [(&[&str], &str); 2] = [
        (
            &["engine", "-m", missing, "--depth", "-1"],
            "'--depth <DEPTH>': takes a whole number, 0 or more",
        ),
        (
            &["engine", "-m", missing, "--pp", "0"],
            "'--pp <PP>': takes a whole number, 1 or more",
        ),
    ];
    for (args, want) in cases {
        let out = Command::new(env!("CARGO_BIN_EXE_strata-bench"))
            .args(args)
            .output()
            .expect("running strata-bench");
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        let err = String::from_utf8(out.stderr).unwrap();
        assert_eq!(err.lines().count(), 1, "{args:?}: {err}");
        assert!(err.contains(want), "{args:?}: {err}");
    }
}

#[test]
fn bench_engine_rejects_zero_threads() {
    let out = Command::new(env!("CARGO_BIN_EXE_strata-bench"))
        .args(["engine", "--no-llama", "--threads", "0"])
        .output()
        .expect("running strata");
    assert!(!out.status.success());
    let err = String::from_utf8(out.stderr).unwrap();
    assert!(err.contains("--threads"), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}

/// `strata-bench cluster` end to end, small: one node and two nodes over an emulated
/// Thunderbolt-TCP link (300 us), tensor and pipeline, 1 and 2 streaming clients through the
/// OpenAI API, every figure beside the planner's prediction.
#[test]
fn bench_cluster_measures_every_strategy_through_the_api() {
    strata_store::Store::from_env()
        .expect("store")
        .ensure("smollm2-135m-instruct")
        .expect("default model");
    let dir = tempfile::tempdir().unwrap();
    let json = dir.path().join("cluster.json");
    let out = Command::new(env!("CARGO_BIN_EXE_strata-bench"))
        .args(["cluster", "--no-llama", "--links", "tb-tcp"])
        .args(["--strategies", "tensor,pipeline", "--streams", "1,2"])
        .args(["--tokens", "6", "--rounds", "1", "--prefill-tokens", "32"])
        .args(["--ctx-size", "512", "--json"])
        .arg(&json)
        .output()
        .expect("running strata");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let table = String::from_utf8_lossy(&out.stdout);
    // A TCP-class link is emulated over TCP.
    assert!(
        table.contains("tb-tcp (300 us over tcp; measured "),
        "{table}"
    );
    // Every row of the table has the header's columns.
    let lines: Vec<&str> = table.lines().filter(|l| l.starts_with('|')).collect();
    let columns = lines[0].matches('|').count();
    assert!(
        lines.iter().all(|l| l.matches('|').count() == columns),
        "{table}"
    );
    let v: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let rows = v["rows"].as_array().unwrap();
    let configs: Vec<(u64, &str)> = rows
        .iter()
        .map(|r| {
            (
                r["nodes"].as_u64().unwrap(),
                r["strategy"].as_str().unwrap(),
            )
        })
        .collect();
    assert_eq!(configs, [(1, "single"), (2, "tensor"), (2, "pipeline")]);
    // The planner's own choice on the link is said, and marks the row it names (over a
    // 300 us link it may rather keep so small a model on one node).
    let choice = rows[1]["planner_choice"].as_str().unwrap();
    assert_eq!(rows[2]["planner_choice"], choice);
    let picks: Vec<&str> = rows[1..]
        .iter()
        .filter(|r| r["planner_pick"] == true)
        .map(|r| r["strategy"].as_str().unwrap())
        .collect();
    match choice {
        "tensor" | "pipeline" => assert_eq!(picks, [choice], "{v}"),
        "single" => assert!(picks.is_empty(), "{v}"),
        other => panic!("the planner chose {other:?}: {v}"),
    }
    // The planner priced the link the nodes emulated, measured over the data plane.
    for r in &rows[1..] {
        assert_eq!(r["transport"], "tcp", "{r}");
        let lat = r["measured_latency_us"].as_f64().unwrap();
        assert!((300.0..2000.0).contains(&lat), "{r}");
    }
    for r in rows {
        assert!(r["prefill_tok_s"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["predicted_prefill_tok_s"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["predicted_decode_tok_s"].as_f64().unwrap() > 0.0, "{r}");
        let levels = r["levels"].as_array().unwrap();
        assert_eq!(levels.len(), 2);
        for l in levels {
            let clients = l["clients"].as_u64().unwrap();
            assert_eq!(l["requests"].as_u64().unwrap(), clients);
            // Every request produced tokens (a stop is possible, nothing else).
            assert!(l["tokens"].as_u64().unwrap() >= clients, "{l}");
            assert!(l["aggregate_tok_s"].as_f64().unwrap() > 0.0, "{l}");
            assert!(l["itl_p99_ms"].as_f64().unwrap() >= l["itl_p50_ms"].as_f64().unwrap());
            assert!(
                l["predicted_aggregate_tok_s"].as_f64().unwrap() > 0.0,
                "{l}"
            );
            assert!(l["predicted_steady_tok_s"].as_f64().unwrap() > 0.0, "{l}");
            if clients == 1 {
                assert!(l["steady_tok_s"].as_f64().unwrap() > 0.0, "{l}");
            }
            assert_eq!(l["vs_one_node"].is_null(), r["nodes"] == 1, "{l}");
        }
    }
}

#[test]
fn bench_cluster_names_an_unknown_link() {
    let out = Command::new(env!("CARGO_BIN_EXE_strata-bench"))
        .args(["cluster", "--no-llama", "--links", "tb9-warp"])
        .output()
        .expect("running strata");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("tb9-warp"), "{err}");
}
