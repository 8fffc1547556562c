//! End-to-end tests of sharded runs: `strata run --ranks N` starts real worker processes that
//! load only their shard of the real model and talk over real shared memory or TCP. Greedy (and
//! seeded sampled) output must be exactly the single-process output, for every strategy and
//! both transports; a killed worker must end the run with a clear error, quickly, leaving no
//! process behind.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Read;
use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant};

const PROMPT: &str = "Explain in two sentences why the sky is blue.";

fn ensure(model: &str) {
    strata_store::Store::from_env()
        .expect("store")
        .ensure(model)
        .expect("model");
}

fn strata(args: &[&str]) -> Output {
    ensure("smollm2-135m-instruct");
    Command::new(env!("CARGO_BIN_EXE_strata"))
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("running strata")
}

fn text(out: &Output, what: &str) -> String {
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout.clone()).unwrap()
}

/// Writes a small synthetic model (4 layers, width 256, FFN 768, 8 query heads) to `path`;
/// `extra` adds or overrides `strata synth` flags.
fn synth_small(path: &str, extra: &[&str]) {
    let mut args = vec![
        "synth", "-o", path, "--layers", "4", "--embd", "256", "--ff", "768", "--heads", "8",
    ];
    args.extend_from_slice(extra);
    text(&strata(&args), "synth");
}

fn run(extra: &[&str], prompt: &str, n: &str) -> Output {
    let mut args = vec![
        "run",
        "--numerics",
        "avx512",
        "--max-tokens",
        n,
        "--ignore-eos",
    ];
    args.extend_from_slice(extra);
    args.push(prompt);
    strata(&args)
}

#[test]
fn greedy_output_matches_one_process_for_every_strategy_and_transport() {
    let want = text(&run(&["--threads", "1"], PROMPT, "64"), "single process");
    assert!(want.len() > 100, "{want}");
    let configs: &[&[&str]] = &[
        &["--ranks", "2", "--strategy", "tensor", "--transport", "shm"],
        &["--ranks", "2", "--strategy", "tensor", "--transport", "tcp"],
        // Uneven: rank 0 gets three quarters of every dimension (7 of the 9 query heads).
        &[
            "--ranks",
            "2",
            "--strategy",
            "tensor",
            "--rank-weights",
            "3,1",
        ],
        &["--ranks", "3", "--strategy", "tensor", "--transport", "tcp"],
        &[
            "--ranks",
            "3",
            "--strategy",
            "tensor",
            "--rank-weights",
            "1,2,1",
        ],
        &[
            "--ranks",
            "2",
            "--strategy",
            "pipeline",
            "--transport",
            "shm",
        ],
        &[
            "--ranks",
            "2",
            "--strategy",
            "pipeline",
            "--transport",
            "tcp",
            "--rank-weights",
            "1,3",
        ],
        &[
            "--ranks",
            "3",
            "--strategy",
            "pipeline",
            "--transport",
            "tcp",
        ],
        &["--ranks", "4", "--strategy", "hybrid", "--tp-size", "2"],
    ];
    for c in configs {
        let mut args = c.to_vec();
        args.extend(["--threads-per-rank", "1"]);
        let got = text(&run(&args, PROMPT, "64"), &c.join(" "));
        assert_eq!(got, want, "{}", c.join(" "));
    }
}

#[test]
fn long_prompts_prefill_in_chunks_across_ranks() {
    // Over 512 tokens: prefill takes two steps through every rank.
    let long = "The quick brown fox jumps over the lazy dog. ".repeat(70);
    let want = text(&run(&["--threads", "1", "--raw"], &long, "16"), "single");
    for c in [["--strategy", "tensor"], ["--strategy", "pipeline"]] {
        let mut args = vec!["--raw", "--ranks", "2", "--threads-per-rank", "1"];
        args.extend(c);
        assert_eq!(text(&run(&args, &long, "16"), c[1]), want, "{}", c[1]);
    }
}

#[test]
fn seeded_sampling_with_penalties_matches_one_process() {
    let sampling = [
        "--temperature",
        "0.9",
        "--top-k",
        "40",
        "--top-p",
        "0.95",
        "--repeat-penalty",
        "1.2",
        "--seed",
        "11",
    ];
    let mut single = vec!["--threads", "1"];
    single.extend(sampling);
    let want = text(&run(&single, PROMPT, "48"), "single");
    for extra in [["--strategy", "tensor"], ["--strategy", "pipeline"]] {
        let mut args = vec!["--ranks", "2", "--threads-per-rank", "1"];
        args.extend(extra);
        args.extend(sampling);
        assert_eq!(
            text(&run(&args, PROMPT, "48"), extra[1]),
            want,
            "{}",
            extra[1]
        );
    }
}

#[test]
fn gemma_shards_with_one_kv_head() {
    ensure("gemma3-270m");
    let base = [
        "run",
        "-m",
        "gemma3-270m",
        "--numerics",
        "avx2",
        "-n",
        "32",
        "--ignore-eos",
        "--raw",
    ];
    let mut single: Vec<&str> = base.to_vec();
    single.extend(["--threads", "1", PROMPT]);
    let want = text(&strata(&single), "single");
    let mut piped: Vec<&str> = base.to_vec();
    piped.extend([
        "--ranks",
        "2",
        "--strategy",
        "pipeline",
        "--transport",
        "tcp",
        PROMPT,
    ]);
    assert_eq!(text(&strata(&piped), "pipeline"), want);
    // Its single KV head is computed by both ranks, each with two of the four query heads.
    let mut tp: Vec<&str> = base.to_vec();
    tp.extend([
        "--ranks",
        "2",
        "--strategy",
        "tensor",
        "--transport",
        "shm",
        PROMPT,
    ]);
    assert_eq!(text(&strata(&tp), "tensor"), want);
}

/// Synthesises a small model of `arch` (with `extra` synth flags) at `path` and checks that
/// each of `configs` gives `n` tokens of exactly the single-process output.
fn check_synth_shards(path: &Path, arch: &str, extra: &[&str], n: &str, configs: &[&[&str]]) {
    let mut flags = vec!["--arch", arch, "--kv-heads", "2"];
    flags.extend_from_slice(extra);
    synth_small(path.to_str().unwrap(), &flags);
    check_shards(path, &format!("{arch} {extra:?}"), n, configs);
}

/// Checks that each of `configs` gives `n` tokens of the model at `path` exactly as one
/// process does.
fn check_shards(path: &Path, what: &str, n: &str, configs: &[&[&str]]) {
    let path_s = path.to_str().unwrap();
    let base = ["run", "-m", path_s, "-n", n, "--ignore-eos", "--raw"];
    let with = |extra: &[&str]| {
        let mut a: Vec<&str> = base.to_vec();
        a.extend_from_slice(extra);
        a.push(PROMPT);
        text(&strata(&a), what)
    };
    let want = with(&["--threads", "1"]);
    assert!(!want.is_empty(), "{what}: no output");
    for cfg in configs {
        assert_eq!(with(cfg), want, "{what} {cfg:?}");
    }
}

const TENSOR_SHM: &[&str] = &["--ranks", "2", "--strategy", "tensor", "--transport", "shm"];
const PIPELINE_TCP: &[&str] = &[
    "--ranks",
    "2",
    "--strategy",
    "pipeline",
    "--transport",
    "tcp",
];

/// Every family beyond the two real models, synthesised (random weights, real tokenizer) in
/// legacy and K formats: 2-rank tensor-parallel and pipeline shards give exactly the
/// single-process output, biases and per-head norms included (the single-process output itself is checked against llama.cpp by the engine's
/// parity test).
#[test]
fn synthetic_families_shard_like_one_process() {
    let dir = tempfile::tempdir().unwrap();
    for (arch, ty, head_dim) in [
        ("qwen2", "q8_0", None),
        ("qwen3", "q4_1", Some("64")),
        ("qwen2", "q5_k", None),
        ("llama", "q3_k", None),
        ("qwen3", "iq4_xs", Some("64")),
        ("phi3", "q5_k", None),
        ("llama", "iq4_nl", None),
        ("qwen2", "bf16", None),
        ("qwen3", "q4_0", Some("64")),
    ] {
        let mut extra = vec!["--type", ty, "--seed", "7"];
        if let Some(hd) = head_dim {
            extra.extend(["--head-dim", hd]);
        }
        let path = dir.path().join(format!("{arch}.gguf"));
        check_synth_shards(&path, arch, &extra, "24", &[TENSOR_SHM, PIPELINE_TCP]);
    }
}

/// Phi-3 as the 4k checkpoints' files are (fused `attn_qkv` and `ffn_up`, no LongRoPE) and
/// with separate Q/K/V: tensor-parallel ranks take their share of each part of a fused tensor,
/// not a slice of its rows, and give exactly the single-process output.
#[test]
fn phi3_fused_and_separate_qkv_shard_like_one_process() {
    let dir = tempfile::tempdir().unwrap();
    for (name, extra) in [
        ("phi3-4k", &["--type", "q8_0", "--no-longrope"][..]),
        ("phi3-split", &["--type", "q4_k", "--split-qkv"][..]),
    ] {
        let mut extra = extra.to_vec();
        extra.extend(["--seed", "7"]);
        let path = dir.path().join(format!("{name}.gguf"));
        check_synth_shards(&path, "phi3", &extra, "24", &[TENSOR_SHM, PIPELINE_TCP]);
    }
}

/// Mistral 3 (YaRN, attention temperature) and OLMo 2 (Q/K norms over whole rows, which a
/// tensor-parallel rank computes from all-gathered Q and K rows) shard like one process; the
/// uneven and three-way splits leave a rank with query heads but no KV head of its own, and
/// KV heads computed on two ranks.
#[test]
fn mistral3_and_olmo2_shard_like_one_process() {
    let dir = tempfile::tempdir().unwrap();
    let uneven: &[&str] = &[
        "--ranks",
        "2",
        "--strategy",
        "tensor",
        "--rank-weights",
        "3,1",
    ];
    let three: &[&str] = &["--ranks", "3", "--strategy", "tensor", "--transport", "tcp"];
    for (name, arch, extra) in [
        ("mistral3", "mistral3", &["--type", "q4_k"][..]),
        ("olmo2", "olmo2", &["--type", "q8_0"][..]),
        (
            "olmo3",
            "olmo2",
            &["--type", "q5_k", "--sliding-window", "16"][..],
        ),
    ] {
        let mut extra = extra.to_vec();
        extra.extend(["--seed", "5"]);
        let path = dir.path().join(format!("{name}.gguf"));
        let configs = [TENSOR_SHM, uneven, three, PIPELINE_TCP];
        check_synth_shards(&path, arch, &extra, "40", &configs);
    }
}

#[test]
fn impossible_plans_are_refused_clearly() {
    for (args, needle) in [
        (vec!["--ranks", "10", "--strategy", "tensor"], "query heads"),
        (
            vec!["--ranks", "3", "--strategy", "hybrid", "--tp-size", "2"],
            "stages",
        ),
        (vec!["--ranks", "2", "--rank-weights", "1,0"], "weights"),
        (vec!["--ranks", "2", "--link-latency", "fast"], "fast"),
    ] {
        let out = run(&args, PROMPT, "4");
        assert!(!out.status.success(), "{args:?}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(needle), "{args:?}: {err}");
    }
}

/// Worker processes whose parent is `pid`.
#[cfg(not(target_os = "macos"))]
fn children_of(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let Ok(p) = e.file_name().to_string_lossy().parse::<u32>() else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(format!("/proc/{p}/stat")) else {
            continue;
        };
        // The parent pid is the second field after the parenthesised command name.
        let after = &stat[stat.rfind(')').unwrap() + 2..];
        let ppid: u32 = after.split(' ').nth(1).unwrap().parse().unwrap();
        if ppid == pid {
            out.push(p);
        }
    }
    out
}

#[cfg(not(target_os = "macos"))]
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| !s[s.rfind(')').unwrap() + 2..].starts_with('Z'))
        .unwrap_or(false)
}

/// Worker processes whose parent is `pid` (`proc_listchildpids`).
#[cfg(target_os = "macos")]
fn children_of(pid: u32) -> Vec<u32> {
    strata_node::host::children(pid)
}

/// Whether `pid` runs (exists and is not a zombie), as ps(1) reports its state.
#[cfg(target_os = "macos")]
fn alive(pid: u32) -> bool {
    Command::new("ps")
        .args(["-o", "stat=", "-p", &pid.to_string()])
        .output()
        .is_ok_and(|o| {
            let stat = String::from_utf8_lossy(&o.stdout);
            o.status.success() && !stat.trim().is_empty() && !stat.trim().starts_with('Z')
        })
}

/// Starts a long sharded run, waits for tokens, does `signal` to one worker, and checks that rank
/// 0 fails within `limit`, says why, and that no worker outlives the run.
fn break_a_worker(transport: &str, signal: &str, limit: Duration) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args([
            "run",
            "--ranks",
            "3",
            "--strategy",
            "tensor",
            "--transport",
            transport,
            "--threads-per-rank",
            "1",
            "--ignore-eos",
            "-n",
            "100000",
            "--ctx-size",
            "8192",
            PROMPT,
        ])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait until tokens flow, so the fault lands mid-generation.
    let mut stdout = child.stdout.take().unwrap();
    let mut first = [0u8; 16];
    stdout.read_exact(&mut first).unwrap();
    let workers = children_of(child.id());
    assert_eq!(workers.len(), 2, "{workers:?}");
    let victim = workers[1];
    Command::new("kill")
        .args([signal, &victim.to_string()])
        .status()
        .unwrap();
    let hit = Instant::now();
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        assert!(
            hit.elapsed() < Duration::from_secs(20),
            "{transport} {signal}: rank 0 hangs"
        );
        std::thread::sleep(Duration::from_millis(10));
    };
    let took = hit.elapsed();
    let mut err = String::new();
    child
        .stderr
        .take()
        .unwrap()
        .read_to_string(&mut err)
        .unwrap();
    let what = format!("{transport} {signal}");
    assert!(!status.success(), "{what}: a broken run must not succeed");
    assert!(took < limit, "{what}: took {took:?}");
    assert!(err.contains("rank"), "{what}: {err}");
    assert!(err.contains("incomplete"), "{what}: {err}");
    for w in workers {
        assert!(!alive(w), "{what}: worker {w} outlived the run");
    }
}

#[test]
fn a_killed_worker_ends_the_run_quickly_and_cleanly() {
    ensure("smollm2-135m-instruct");
    for transport in ["shm", "tcp"] {
        break_a_worker(transport, "-KILL", Duration::from_millis(2500));
    }
}

#[test]
fn a_frozen_worker_is_noticed_by_its_silence() {
    ensure("smollm2-135m-instruct");
    // A stopped process keeps its sockets open: only the missing heartbeats give it away
    // (the link timeout is 1.5 s).
    for transport in ["shm", "tcp"] {
        break_a_worker(transport, "-STOP", Duration::from_millis(4500));
    }
}

#[test]
fn a_synthetic_model_shards_identically_four_ways() {
    ensure("smollm2-135m-instruct");
    let dir = tempfile::tempdir().unwrap();
    let model = dir.path().join("synthetic.gguf");
    let model = model.to_str().unwrap();
    synth_small(model, &["--kv-heads", "4", "--type", "q8_0"]);
    let base = ["run", "-m", model, "--raw", "-n", "24", "--ignore-eos"];
    let with = |extra: &[&str]| {
        let mut a: Vec<&str> = base.to_vec();
        a.extend_from_slice(extra);
        a.push("synthetic weights");
        text(&strata(&a), &extra.join(" "))
    };
    let want = with(&["--threads", "1"]);
    for c in [
        &[
            "--ranks",
            "4",
            "--strategy",
            "tensor",
            "--threads-per-rank",
            "1",
        ][..],
        &[
            "--ranks",
            "3",
            "--strategy",
            "pipeline",
            "--transport",
            "tcp",
        ][..],
        &[
            "--ranks",
            "2",
            "--strategy",
            "tensor",
            "--rank-weights",
            "1,3",
        ][..],
    ] {
        assert_eq!(with(c), want, "{}", c.join(" "));
    }
}

#[test]
fn hand_started_workers_join_with_the_token_and_strangers_are_refused() {
    ensure("smollm2-135m-instruct");
    let want = text(&run(&["--threads", "1"], PROMPT, "24"), "single");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let rank0 = Command::new(env!("CARGO_BIN_EXE_strata"))
        .args([
            "run",
            "--numerics",
            "avx512",
            "-n",
            "24",
            "--ignore-eos",
            "--ranks",
            "2",
            "--listen",
            &addr,
            PROMPT,
        ])
        .env("STRATA_TOKEN", "s3cret")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let worker = |token: &str| {
        Command::new(env!("CARGO_BIN_EXE_strata"))
            .args([
                "worker",
                "--coordinator",
                &addr,
                "--rank",
                "1",
                "--world",
                "2",
            ])
            .env("STRATA_TOKEN", token)
            .stdin(Stdio::null())
            .output()
            .unwrap()
    };
    let stranger = worker("guess");
    assert!(!stranger.status.success());
    let err = String::from_utf8_lossy(&stranger.stderr);
    assert!(err.contains("token"), "{err}");
    let honest = worker("s3cret");
    assert!(
        honest.status.success(),
        "{}",
        String::from_utf8_lossy(&honest.stderr)
    );
    let out = rank0.wait_with_output().unwrap();
    assert_eq!(text(&out, "rank 0"), want);
}

#[test]
fn chat_runs_sharded_with_the_same_replies() {
    ensure("smollm2-135m-instruct");
    let chat = |extra: &[&str]| {
        let mut child = Command::new(env!("CARGO_BIN_EXE_strata"))
            .args(["chat", "--numerics", "avx512", "-n", "24"])
            .args(extra)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        {
            use std::io::Write;
            let mut stdin = child.stdin.take().unwrap();
            stdin
                .write_all(b"Name a colour.\nAnd another one?\n/exit\n")
                .unwrap();
        }
        text(&child.wait_with_output().unwrap(), &extra.join(" "))
    };
    let want = chat(&["--threads", "1"]);
    assert!(
        want.lines().filter(|l| !l.is_empty()).count() >= 2,
        "{want}"
    );
    assert_eq!(chat(&["--ranks", "2", "--strategy", "pipeline"]), want);
}

const EXPERT_SHM: &[&str] = &["--ranks", "2", "--strategy", "expert", "--transport", "shm"];

/// Every mixture-of-experts family splits by layers and by experts (two ranks, three over TCP,
/// and an uneven split) exactly like one process: routed experts' outputs and the shared
/// expert's cross ranks, attention heads are split too (DeepSeek's latent attention, OLMoE's
/// whole-row norms, gpt-oss's sinks).
#[test]
fn mixtures_of_experts_split_by_experts_and_layers_like_one_process() {
    let dir = tempfile::tempdir().unwrap();
    let three: &[&str] = &["--ranks", "3", "--strategy", "expert", "--transport", "tcp"];
    let tensor3: &[&str] = &["--ranks", "3", "--strategy", "tensor", "--transport", "tcp"];
    let tensor_uneven: &[&str] = &[
        "--ranks",
        "2",
        "--strategy",
        "tensor",
        "--rank-weights",
        "1,3",
    ];
    let uneven: &[&str] = &[
        "--ranks",
        "2",
        "--strategy",
        "expert",
        "--rank-weights",
        "3,1",
    ];
    for (arch, extra) in [
        (
            "qwen3moe",
            &["--heads", "8", "--head-dim", "64", "--kv-heads", "2"][..],
        ),
        (
            "gpt-oss",
            &["--heads", "8", "--head-dim", "64", "--kv-heads", "2"][..],
        ),
        ("qwen2moe", &["--heads", "8", "--kv-heads", "2"][..]),
        ("olmoe", &["--heads", "8", "--kv-heads", "8"][..]),
        (
            "deepseek2",
            &["--heads", "4", "--kv-heads", "1", "--head-dim", "64"][..],
        ),
    ] {
        let path = dir.path().join(format!("{arch}.gguf"));
        let experts = if arch == "deepseek2" { "16" } else { "8" };
        let mut args = vec!["synth", "-o", path.to_str().unwrap(), "--arch", arch];
        args.extend([
            "--layers", "4", "--embd", "256", "--ff", "256", "--type", "q8_0",
        ]);
        args.extend(["--seed", "7", "--experts", experts, "--experts-used", "3"]);
        args.extend_from_slice(extra);
        text(&strata(&args), "synth");
        let configs = [
            PIPELINE_TCP,
            EXPERT_SHM,
            three,
            uneven,
            TENSOR_SHM,
            tensor3,
            tensor_uneven,
        ];
        check_shards(&path, arch, "24", &configs);
    }
    // Splitting the experts' columns keeps one process's sums only: the all-reduce style is
    // refused in one line.
    let p = dir.path().join("qwen3moe.gguf");
    let out = strata(&[
        "run",
        "-m",
        p.to_str().unwrap(),
        "-n",
        "4",
        "--raw",
        "--ranks",
        "2",
        "--strategy",
        "tensor",
        "--tp-combine",
        "reduce",
        PROMPT,
    ]);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("mixture of experts") && err.contains("--tp-combine gather"),
        "{err}"
    );
    // A dense model has no experts to split.
    let out = run(&["--ranks", "2", "--strategy", "expert"], PROMPT, "4");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no experts to split"), "{err}");
}

/// Peak resident memory and weight bytes per token, from `--stats-json`.
fn stats_of(out: &Output) -> serde_json::Value {
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    serde_json::from_str(err.lines().last().unwrap()).unwrap()
}

/// Under expert parallelism each rank holds only its experts: on a model whose experts are most
/// of its bytes, each of two ranks peaks at well under two thirds of one process's memory. And
/// decode reads only the chosen experts: the bytes per token the engine counts match the
/// planner's figure (the router's top-k of each layer plus the rest).
#[test]
fn expert_parallel_ranks_hold_only_their_experts_and_decode_reads_only_chosen_ones() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("moe.gguf");
    let p = path.to_str().unwrap();
    // 16 layers of 32 experts: 850 MB of experts against under 100 MB of everything else.
    let mut args = vec!["synth", "-o", p, "--arch", "qwen3moe", "--layers", "16"];
    args.extend([
        "--embd",
        "512",
        "--ff",
        "1024",
        "--heads",
        "8",
        "--kv-heads",
        "2",
    ]);
    args.extend(["--head-dim", "64", "--experts", "32", "--experts-used", "4"]);
    args.extend(["--type", "q8_0", "--seed", "3"]);
    text(&strata(&args), "synth");
    let base = [
        "run",
        "-m",
        p,
        "-n",
        "16",
        "--ignore-eos",
        "--raw",
        "--stats-json",
    ];
    let with = |extra: &[&str]| {
        let mut a: Vec<&str> = base.to_vec();
        a.extend_from_slice(extra);
        a.extend(["--ctx-size", "512", PROMPT]);
        stats_of(&strata(&a))
    };
    let single = with(&["--threads", "1"]);
    let one = single["peak_rss_mb"].as_f64().unwrap();
    let split = with(&["--ranks", "2", "--strategy", "expert"]);
    let ranks: Vec<f64> = split["rank_peak_rss_mb"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_f64().unwrap())
        .collect();
    assert_eq!(ranks.len(), 2, "{split}");
    for (r, mb) in ranks.iter().enumerate() {
        assert!(
            *mb <= 0.6 * one,
            "rank {r} peaked at {mb:.0} MB, one process at {one:.0} MB"
        );
    }
    let plan = strata(&["plan", "-m", p, "--json"]);
    let plan: serde_json::Value = serde_json::from_slice(&plan.stdout).unwrap();
    let planned = plan["model"]["token_bytes"].as_f64().unwrap();
    let read = single["weight_bytes_per_token"].as_f64().unwrap();
    assert!(
        (read - planned).abs() <= 0.1 * planned,
        "decode read {read} bytes per token, the planner expects {planned}"
    );
    // Far fewer than every expert's bytes: only the chosen ones were read.
    let held = plan["model"]["weight_bytes"].as_f64().unwrap();
    assert!(read < 0.4 * held, "read {read} of {held}");
}

/// The answers (text, and why each ended; an embedding's vector) of `requests` — (route,
/// body) — sent together through the real HTTP API to a scheduler over `engine`.
fn answers_through_the_api(
    engine: Box<dyn strata_engine::Sequences>,
    file: &strata_gguf::GgufFile,
    requests: &[(&str, String)],
) -> Vec<(String, String)> {
    let tokenizer = std::sync::Arc::new(
        strata_tokenizer::Tokenizer::from_gguf(file.metadata()).expect("tokenizer"),
    );
    let template = strata_tokenizer::ChatTemplate::from_gguf(file.metadata()).expect("template");
    let state = strata_api::start_engine(
        engine,
        tokenizer,
        template,
        strata_api::EngineOptions {
            model_id: "m".into(),
            queue: 16,
            shared: strata_api::Shared::new(None, 1),
            max_body: 1 << 20,
            info: strata_api::ModelInfo::from_gguf(file),
            aliases: Vec::new(),
            defaults: strata_api::types::SamplingDefaults::default(),
        },
    )
    .expect("engine");
    let rt = tokio::runtime::Runtime::new().expect("runtime");
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .expect("bind");
    let addr = listener.local_addr().expect("address");
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let server = rt.spawn(async move {
        let http = strata_http::listen::HttpOptions::default();
        strata_api::serve(listener, vec![state], &http, async {
            let _ = stopped.await;
        })
        .await
    });
    let out = std::thread::scope(|s| {
        let calls: Vec<_> = requests
            .iter()
            .map(|(route, body)| {
                s.spawn(move || {
                    let v: serde_json::Value = ureq::post(format!("http://{addr}{route}"))
                        .header("content-type", "application/json")
                        .send(body.as_str())
                        .expect("request")
                        .body_mut()
                        .read_json()
                        .expect("json");
                    if let Some(e) = v["data"][0].get("embedding") {
                        return (e.to_string(), "embedding".to_string());
                    }
                    let c = &v["choices"][0];
                    let text = c["text"]
                        .as_str()
                        .or(c["message"]["content"].as_str())
                        .unwrap_or_else(|| panic!("{v}"));
                    (text.to_string(), c["finish_reason"].to_string())
                })
            })
            .collect();
        calls
            .into_iter()
            .map(|c| c.join().expect("client"))
            .collect()
    });
    let _ = stop.send(());
    rt.block_on(server).expect("server").expect("serve");
    out
}

/// Requests sent together through the API to a two-stage pipeline, more than it has slots,
/// get one process's greedy answers: its prompt chunks run as turns beside the other streams'
/// steps (a 300-token prompt's blocks kept by the prefix cache on both ranks), requests wait
/// for slots and join as others leave, and a grammar's forced tokens run as passes of their
/// own; embeddings sent among them are one process's too.
#[test]
fn a_pipeline_serves_requests_sent_together_as_one_process_does() {
    use strata_engine::{Batch, Model, ModelConfig};
    use strata_parallel::{CombineStyle, ShardedBatch, Strategy, local_pair, make_plan};
    let path = strata_store::Store::from_env()
        .expect("store")
        .ensure("smollm2-135m-instruct")
        .expect("model");
    let file = strata_gguf::GgufFile::open(&path).expect("gguf");
    let cfg = ModelConfig::from_gguf(&file).expect("config");
    let long = "The harbour at dawn was quiet, and the boats rocked gently. ".repeat(25);
    let prompts = [
        "Once upon a time".to_string(),
        format!("{long}What happened next?"),
        "List three colours of the rainbow:".to_string(),
        "The capital of France is".to_string(),
        "Write a haiku about the sea. ".repeat(4),
    ];
    let mut requests: Vec<(&str, String)> = prompts
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let body = serde_json::json!({
                "model": "m", "prompt": p, "max_tokens": 12 + 9 * i, "temperature": 0
            });
            ("/v1/completions", body.to_string())
        })
        .collect();
    let schema = serde_json::json!({
        "model": "m", "max_tokens": 60, "temperature": 0,
        "messages": [{"role": "user", "content": "Give me a person as JSON."}],
        "response_format": {"type": "json_schema", "json_schema": {"name": "person", "schema": {
            "type": "object",
            "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
            "required": ["name", "age"], "additionalProperties": false}}}
    });
    requests.insert(2, ("/v1/chat/completions", schema.to_string()));
    // Embeddings arrive among the streams: computed between their turns, with turns in flight.
    for text in ["The sky is blue.", long.as_str()] {
        let body = serde_json::json!({"model": "m", "input": text});
        requests.push(("/v1/embeddings", body.to_string()));
    }
    let (slots, n_ctx) = (3, 1024);
    let mut model = Model::load_full(&file).expect("model");
    model.set_flavour(strata_kernels::attn::Flavour::native());
    let local = Batch::new(model, 1, slots, n_ctx).expect("batch");
    let want = answers_through_the_api(Box::new(local), &file, &requests);
    let plan = make_plan(
        &file,
        &cfg,
        Strategy::Pipeline,
        2,
        None,
        CombineStyle::Gather,
    )
    .expect("plan");
    let (rank, _worker) = local_pair(&file, &path, plan, n_ctx, slots).expect("ranks");
    let sharded = ShardedBatch::new(rank, cfg.n_vocab)
        .expect("rank 0")
        .with_prefix_cache(64 << 20);
    let got = answers_through_the_api(Box::new(sharded), &file, &requests);
    assert_eq!(got, want);
    // The grammar's answer is whole JSON of its schema.
    let person: serde_json::Value = serde_json::from_str(&got[2].0).expect("JSON");
    assert!(person["age"].is_i64(), "{person}");
}
