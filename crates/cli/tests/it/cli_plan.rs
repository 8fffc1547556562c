//! `strata plan` on a described cluster: the placement, its prediction and every rank's shard,
//! as text and JSON, and a clear refusal when the cluster is too small.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

fn plan(cluster: &str, extra: &[&str]) -> std::process::Output {
    strata_store::Store::from_env()
        .expect("store")
        .ensure("smollm2-135m-instruct")
        .expect("model");
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("cluster.json");
    std::fs::write(&file, cluster).unwrap();
    Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["plan", "--cluster", file.to_str().unwrap()])
        .args(extra)
        .output()
        .unwrap()
}

const TWO_SMALL_NODES: &str = r#"{"nodes": [
  {"id": "a", "memory_available": 200000000, "mem_bandwidth": 3e10},
  {"id": "b", "memory_available": 200000000, "mem_bandwidth": 3e10}],
 "links": [{"a": "a", "b": "b", "latency": 3e-6, "bandwidth": 1e10}]}"#;

#[test]
fn two_nodes_over_a_fast_link_get_tensor_parallelism() {
    let out = plan(TWO_SMALL_NODES, &["--ctx-size", "2048", "--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["placement"]["strategy"], "tensor");
    assert_eq!(v["placement"]["nodes"].as_array().unwrap().len(), 2);
    assert!(v["placement"]["predicted_decode_tok_s"].as_f64().unwrap() > 0.0);
    assert_eq!(v["shards"]["ranks"].as_array().unwrap().len(), 2);
    let text = plan(TWO_SMALL_NODES, &["--ctx-size", "2048"]);
    let text = String::from_utf8(text.stdout).unwrap();
    assert!(text.contains("On tensor parallel over 2 nodes"), "{text}");
    // The alternative the planner rejected, with its own prediction.
    assert!(
        text.contains("the other strategy: a pipeline of 2 nodes"),
        "{text}"
    );
    assert!(text.contains("rank 1"), "{text}");
}

/// The plan names the model as the user did, reserves the context `serve` would use, lists the
/// one node's shard, explains a strategy that cannot apply, and documents its file format.
#[test]
fn one_node_plans_say_what_they_assume() {
    let one = r#"{"nodes": [{"id": "a", "memory_available": 2000000000, "mem_bandwidth": 3e10}]}"#;
    let run = |extra: &[&str]| plan(one, extra);
    let out = run(&["--json"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["model"]["name"], "smollm2-135m-instruct");
    // SmolLM2 is trained on 8192 positions: serve's default context.
    assert_eq!(v["context"], 8192);
    assert_eq!(v["placement"]["strategy"], "single");
    assert_eq!(v["shards"]["ranks"].as_array().unwrap().len(), 1);
    // A description predicts the same every time (only this machine is measured).
    let again: serde_json::Value = serde_json::from_slice(&run(&["--json"]).stdout).unwrap();
    assert_eq!(
        v["placement"]["predicted_decode_tok_s"],
        again["placement"]["predicted_decode_tok_s"]
    );

    let forced = run(&["--strategy", "tensor"]);
    assert!(!forced.status.success());
    let err = String::from_utf8_lossy(&forced.stderr);
    assert!(
        err.contains("--strategy tensor splits a model over two or more nodes")
            && err.contains("has one (a)"),
        "{err}"
    );
    assert_eq!(err.trim().lines().count(), 1, "{err}");

    let help = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(["plan", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&help.stdout);
    assert!(
        help.contains("\"memory_available\"") && help.contains("\"latency\""),
        "{help}"
    );
}

#[test]
fn a_cluster_too_small_is_refused_with_the_shortfall() {
    let tiny = r#"{"nodes": [{"id": "a", "memory_available": 90000000, "mem_bandwidth": 3e10}]}"#;
    let out = plan(tiny, &["--ctx-size", "2048"]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("missing"), "{err}");
}
