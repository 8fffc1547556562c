//! `strata-bench scaling`: how decoding and prefill speed change as a model is split across
//! ranks, over shared memory and TCP, and as the link gets slower.
//!
//! Every configuration runs in one go, side by side: one process with 1 and with 2 threads (the
//! baselines), 2 ranks x 1 thread for tensor and pipeline parallelism (and, for a mixture of
//! experts, expert parallelism) over each transport, a sweep of emulated link latencies, pipeline throughput with several sequences in flight, and
//! (where llama.cpp's tools are installed) llama.cpp alone and llama.cpp's RPC backend with two
//! single-threaded servers. Figures are medians of several repetitions; read the ratios, which
//! are measured under the same machine state, rather than the absolute numbers. With
//! `--insecure-plaintext-comparison`, each split also runs with its data plane unprotected, and
//! the difference is what sealing (AES-256-GCM on every message) costs per token.

use std::net::TcpListener;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use clap::Args;
use serde::Serialize;
use serde_json::json;
use strata_engine::Generator;

use crate::engine::{median, random_tokens, run_llama_bench};
use strata::cmd_shard::{CombineArg, ShardOpts, StrategyArg, TransportArg};

/// `strata-bench scaling`.
#[derive(Debug, Args)]
pub(crate) struct ScalingArgs {
    /// Model id from the catalog or a path to a GGUF file.
    #[arg(long, short = 'm', default_value = strata_store::DEFAULT_MODEL_ID)]
    model: String,
    /// Prompt tokens of the prefill test.
    #[arg(long, default_value_t = 128)]
    pp: usize,
    /// Generated tokens of the decode test.
    #[arg(long, default_value_t = 64)]
    tg: usize,
    /// Repetitions per test; the median is reported.
    #[arg(long, short = 'r', default_value_t = 3)]
    repetitions: usize,
    /// Emulated link latencies of the sweep, comma-separated.
    #[arg(long, value_delimiter = ',', default_values_t = ["0".to_string(), "10us".into(), "50us".into(), "300us".into(), "1ms".into()])]
    latencies: Vec<String>,
    /// Sequences in flight for the pipeline throughput test.
    #[arg(long, default_value_t = 2)]
    seqs: usize,
    /// Also run every split with the data plane unprotected (no encryption, no authentication)
    /// and report what sealing it costs per token. Measurement only: the ranks of these runs
    /// are open to anyone on the path between them.
    #[arg(long)]
    insecure_plaintext_comparison: bool,
    #[command(flatten)]
    llama: crate::engine::LlamaOpts,
    /// Print one JSON object instead of the tables.
    #[arg(long)]
    json: bool,
}

/// One measured configuration.
#[derive(Debug, Serialize)]
struct Row {
    config: String,
    ranks: usize,
    threads_per_rank: usize,
    strategy: String,
    transport: String,
    latency_us: f64,
    /// The data plane went unprotected (`--insecure-plaintext-comparison` rows only).
    plaintext: bool,
    prefill_tok_s: f64,
    decode_tok_s: f64,
    /// The fastest repetition's decode speed: interference from other work only slows a run
    /// down, so the best of several compares two configurations more steadily than medians.
    decode_best_tok_s: f64,
    /// Rank 0's time inside exchanges per decoded token, and its share of the token time.
    comm_us_per_token: Option<f64>,
    comm_share: Option<f64>,
}

struct Ctx<'a> {
    a: &'a ScalingArgs,
    path: &'a Path,
    prompt: Vec<u32>,
    gen_tokens: Vec<u32>,
}

impl Ctx<'_> {
    fn local(&self, threads: usize) -> Result<Row> {
        let a = self.a;
        let mut g = Generator::load(self.path, threads, Some(a.pp + a.tg + 8))?;
        g.time_prefill(&self.prompt)?;
        g.time_decode(&self.gen_tokens, a.tg.min(16))?;
        let (mut pp, mut tg) = (Vec::new(), Vec::new());
        for _ in 0..a.repetitions {
            pp.push(a.pp as f64 / g.time_prefill(&self.prompt)?.as_secs_f64().max(1e-9));
            tg.push(
                a.tg as f64
                    / g.time_decode(&self.gen_tokens, a.tg)?
                        .as_secs_f64()
                        .max(1e-9),
            );
        }
        Ok(Row {
            config: format!(
                "1 process x {threads} thread{}",
                if threads > 1 { "s" } else { "" }
            ),
            ranks: 1,
            threads_per_rank: threads,
            strategy: "-".into(),
            transport: "-".into(),
            latency_us: 0.0,
            plaintext: false,
            prefill_tok_s: median(&pp),
            decode_tok_s: median(&tg),
            decode_best_tok_s: tg.iter().copied().fold(0.0, f64::max),
            comm_us_per_token: None,
            comm_share: None,
        })
    }

    fn sharded(
        &self,
        strategy: StrategyArg,
        combine: CombineArg,
        transport: TransportArg,
        latency: Duration,
        seqs: usize,
        plaintext: bool,
    ) -> Result<(Row, Option<f64>)> {
        let a = self.a;
        let opts = ShardOpts {
            ranks: 2,
            strategy,
            tp_size: 2,
            tp_combine: combine,
            transport,
            link_latency: Some(latency),
            link_bandwidth: None,
            threads_per_rank: Some(1),
            rank_weights: None,
            listen: None,
            link_timeout: Duration::from_secs(5),
            insecure_plaintext: plaintext,
        };
        let session = strata::cmd_shard::launch(
            self.path,
            &opts,
            Some(a.pp + a.tg + 8),
            seqs.max(1),
            strata_kernels::attn::Flavour::native(),
            None,
        )?;
        let mut session = session;
        let result = (|| -> Result<(Row, Option<f64>)> {
            let g = &mut session.engine;
            g.time_prefill(&self.prompt)?;
            g.time_decode(&self.gen_tokens, a.tg.min(16))?;
            let (mut pp, mut tg, mut comm) = (Vec::new(), Vec::new(), Vec::new());
            for _ in 0..a.repetitions {
                pp.push(a.pp as f64 / g.time_prefill(&self.prompt)?.as_secs_f64().max(1e-9));
                let (t, c) = g.time_decode(&self.gen_tokens, a.tg)?;
                tg.push(a.tg as f64 / t.as_secs_f64().max(1e-9));
                comm.push((
                    c.as_secs_f64() * 1e6 / a.tg as f64,
                    c.as_secs_f64() / t.as_secs_f64(),
                ));
            }
            let batch = if seqs > 1 {
                let mut v = Vec::new();
                for _ in 0..a.repetitions {
                    let t = g.time_decode_batch(&self.gen_tokens, seqs, a.tg)?;
                    v.push((seqs * a.tg) as f64 / t.as_secs_f64().max(1e-9));
                }
                Some(median(&v))
            } else {
                None
            };
            let strategy = match (strategy, combine) {
                (StrategyArg::Tensor, CombineArg::Gather) => "tensor",
                (StrategyArg::Tensor, CombineArg::Reduce) => "tensor-reduce",
                (StrategyArg::Pipeline, _) => "pipeline",
                (StrategyArg::Hybrid, _) => "hybrid",
                (StrategyArg::Expert, _) => "expert",
            };
            let transport = match transport {
                TransportArg::Shm => "shm",
                TransportArg::Tcp => "tcp",
                TransportArg::Auto => "auto",
            };
            let latency_us = latency.as_secs_f64() * 1e6;
            Ok((
                Row {
                    config: format!(
                        "2 ranks x 1 thread, {strategy}, {transport}, +{latency_us:.0} us{}",
                        if plaintext {
                            ", plaintext (insecure)"
                        } else {
                            ""
                        }
                    ),
                    ranks: 2,
                    threads_per_rank: 1,
                    strategy: strategy.into(),
                    transport: transport.into(),
                    latency_us,
                    plaintext,
                    prefill_tok_s: median(&pp),
                    decode_tok_s: median(&tg),
                    decode_best_tok_s: tg.iter().copied().fold(0.0, f64::max),
                    comm_us_per_token: Some(median(&comm.iter().map(|c| c.0).collect::<Vec<_>>())),
                    comm_share: Some(median(&comm.iter().map(|c| c.1).collect::<Vec<_>>())),
                },
                batch,
            ))
        })();
        match result {
            Ok(r) => {
                session.close()?;
                Ok(r)
            }
            Err(e) => Err(session.fail(e)),
        }
    }
}

/// What sealing cost one split: the difference in decode time per token between the best
/// repetitions of its sealed (default) and plaintext runs, and that difference's share of the
/// sealed token time.
fn sealing_cost(sealed: &Row, plain: &Row) -> serde_json::Value {
    let per_token = |tok_s: f64| 1e6 / tok_s.max(1e-9);
    let (s, p) = (sealed.decode_best_tok_s, plain.decode_best_tok_s);
    let us = per_token(s) - per_token(p);
    json!({
        "strategy": sealed.strategy,
        "transport": sealed.transport,
        "sealed_decode_tok_s": s,
        "plaintext_decode_tok_s": p,
        "sealed_decode_median_tok_s": sealed.decode_tok_s,
        "plaintext_decode_median_tok_s": plain.decode_tok_s,
        "sealed_prefill_tok_s": sealed.prefill_tok_s,
        "plaintext_prefill_tok_s": plain.prefill_tok_s,
        "us_per_token": us,
        "share_of_token_time": us / per_token(s),
    })
}

/// Sealing and opening one message the size of the model's hidden state for one token (one
/// f32 per column), on this CPU: the floor of what protection adds to each exchange.
fn hidden_state_sealing_us(model: &Path) -> Option<f64> {
    let f = strata_gguf::GgufFile::open(model).ok()?;
    let width = strata_engine::ModelConfig::from_gguf(&f).ok()?.n_embd;
    let cost = strata_net::sealing_cost(width * 4, 20_000).ok()?;
    Some(cost.as_secs_f64() * 1e6)
}

/// Peak resident memory of every rank, from short `strata run --stats-json` processes: one
/// process, then a 2-way split by each of `strategies`, with each rank's share of the single
/// figure.
fn peak_rss(model: &Path, strategies: &[&str]) -> Result<serde_json::Value> {
    let exe = crate::strata_exe()?;
    let run = |extra: &[&str]| -> Result<Vec<f64>> {
        let out = Command::new(&exe)
            .arg("run")
            .arg("-m")
            .arg(model)
            .args([
                "--raw",
                "-n",
                "8",
                "--ignore-eos",
                "--stats-json",
                "--ctx-size",
                "512",
            ])
            .args(extra)
            .arg("Hello")
            .stdin(Stdio::null())
            .output()
            .context("running strata for its memory figures")?;
        let err = String::from_utf8_lossy(&out.stderr);
        if !out.status.success() {
            bail!(
                "strata run {extra:?} failed: {}",
                err.lines().last().unwrap_or("")
            );
        }
        let v: serde_json::Value = serde_json::from_str(err.lines().last().unwrap_or(""))
            .context("reading the stats of strata run")?;
        let ranks = v["rank_peak_rss_mb"]
            .as_array()
            .map(|a| a.iter().filter_map(serde_json::Value::as_f64).collect())
            .unwrap_or_else(|| v["peak_rss_mb"].as_f64().into_iter().collect());
        Ok(ranks)
    };
    let single = run(&["--threads", "1"])?;
    let one = single.first().copied().unwrap_or(0.0);
    let mut out = json!({"one_process_mb": one});
    for &strategy in strategies {
        let ranks = run(&["--ranks", "2", "--strategy", strategy])?;
        let share: Vec<f64> = ranks.iter().map(|r| r / one.max(1e-9)).collect();
        out[strategy] = json!({"ranks_mb": ranks, "share_of_one_process": share});
    }
    Ok(out)
}

/// Two ggml RPC servers with one thread each, stopped on drop.
pub(crate) struct RpcServers(Vec<Child>);

impl Drop for RpcServers {
    fn drop(&mut self) {
        for c in &mut self.0 {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

pub(crate) fn start_rpc_servers(exe: &Path, n: usize) -> Result<(RpcServers, String)> {
    let mut servers = RpcServers(Vec::new());
    let mut addrs = Vec::new();
    for _ in 0..n {
        let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
        let child = Command::new(exe)
            .args(["-t", "1", "-H", "127.0.0.1", "-p", &port.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", exe.display()))?;
        servers.0.push(child);
        addrs.push(format!("127.0.0.1:{port}"));
    }
    // Give the servers a moment to listen.
    for a in &addrs {
        let deadline = std::time::Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(a).is_err() {
            if std::time::Instant::now() > deadline {
                bail!("the RPC server at {a} did not start");
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
    Ok((servers, addrs.join(",")))
}

pub(crate) fn scaling(a: ScalingArgs) -> Result<()> {
    if a.pp == 0 || a.tg == 0 || a.repetitions == 0 {
        bail!("--pp, --tg and --repetitions must be at least 1");
    }
    let latencies = a
        .latencies
        .iter()
        .map(|s| strata_net::parse_latency(s).map_err(anyhow::Error::from))
        .collect::<Result<Vec<_>>>()?;
    let path = strata::cmd_run::resolve_model(&a.model)?;
    let (vocab, moe) = {
        let f = strata_gguf::GgufFile::open(&path)?;
        let cfg = strata_engine::ModelConfig::from_gguf(&f)?;
        (cfg.n_vocab, cfg.moe.is_some())
    };
    let ctx = Ctx {
        a: &a,
        path: &path,
        prompt: random_tokens(a.pp, vocab, 42),
        gen_tokens: random_tokens(a.tg, vocab, 7),
    };
    let progress = |what: &str| {
        if !a.json {
            eprintln!("measuring {what}");
        }
    };
    let mut rows = Vec::new();
    progress("1 process");
    rows.push(ctx.local(1)?);
    rows.push(ctx.local(2)?);
    let mut throughput = None;
    let mut sealing = Vec::new();
    // A mixture of experts splits by experts, by every expert's columns (one process's sums
    // only) or by layers; a dense model by columns or layers.
    let strategies: &[(StrategyArg, CombineArg)] = if moe {
        &[
            (StrategyArg::Expert, CombineArg::Gather),
            (StrategyArg::Tensor, CombineArg::Gather),
            (StrategyArg::Pipeline, CombineArg::Gather),
        ]
    } else {
        &[
            (StrategyArg::Tensor, CombineArg::Gather),
            (StrategyArg::Tensor, CombineArg::Reduce),
            (StrategyArg::Pipeline, CombineArg::Gather),
        ]
    };
    for &(strategy, combine) in strategies {
        for transport in [TransportArg::Shm, TransportArg::Tcp] {
            progress(&format!("{strategy:?} ({combine:?}) over {transport:?}"));
            let seqs = if matches!(strategy, StrategyArg::Pipeline)
                && matches!(transport, TransportArg::Shm)
            {
                a.seqs
            } else {
                1
            };
            let (row, batch) =
                ctx.sharded(strategy, combine, transport, Duration::ZERO, seqs, false)?;
            if let Some(b) = batch {
                throughput = Some((seqs, b, row.decode_tok_s));
            }
            if a.insecure_plaintext_comparison {
                progress(&format!(
                    "{strategy:?} ({combine:?}) over {transport:?}, plaintext"
                ));
                let (plain, _) =
                    ctx.sharded(strategy, combine, transport, Duration::ZERO, 1, true)?;
                sealing.push(sealing_cost(&row, &plain));
                rows.push(plain);
            }
            rows.push(row);
        }
    }
    let mut sweep = Vec::new();
    for &l in latencies.iter().filter(|l| !l.is_zero()) {
        for &(strategy, combine) in strategies {
            progress(&format!("{strategy:?} ({combine:?}) over shm +{l:?}"));
            sweep.push(
                ctx.sharded(strategy, combine, TransportArg::Shm, l, 1, false)?
                    .0,
            );
        }
    }

    // llama.cpp alone and over its RPC backend, where installed.
    let llama = a.llama.find();
    let mut llama_rows = Vec::new();
    if let Some(exe) = &llama {
        progress("llama.cpp");
        let (pp, tg) = run_llama_bench(exe, &path, 1, a.pp, a.tg, a.repetitions, &[])?;
        llama_rows.push(
            json!({"config": "llama.cpp, 1 thread", "prefill_tok_s": pp, "decode_tok_s": tg}),
        );
        let rpc = exe.with_file_name("ggml-rpc-server");
        if rpc.is_file() {
            progress("llama.cpp RPC");
            let (_servers, list) = start_rpc_servers(&rpc, 2)?;
            let extra = ["-rpc".to_string(), list, "-ngl".into(), "99".into()];
            let (pp, tg) = run_llama_bench(exe, &path, 1, a.pp, a.tg, a.repetitions, &extra)?;
            llama_rows.push(json!({"config": "llama.cpp RPC, 2 servers x 1 thread, tcp", "prefill_tok_s": pp, "decode_tok_s": tg}));
        }
    }

    let base1 = rows[0].decode_tok_s;
    let base2 = rows[1].decode_tok_s;
    let pp1 = rows[0].prefill_tok_s;
    let all_rows: Vec<&Row> = rows.iter().chain(sweep.iter()).collect();
    // Figures compare the default (sealed) runs; the plaintext ones only feed `sealing`.
    let sealed_rows: Vec<&Row> = all_rows.iter().copied().filter(|r| !r.plaintext).collect();
    // The latency at which tensor parallelism stops beating pipeline parallelism.
    let mut crossover = None;
    let mut by_latency: Vec<(f64, f64, f64)> = Vec::new();
    for l in std::iter::once(0.0).chain(
        latencies
            .iter()
            .filter(|l| !l.is_zero())
            .map(|l| l.as_secs_f64() * 1e6),
    ) {
        let find = |s: &str| {
            sealed_rows
                .iter()
                .find(|r| {
                    r.strategy == s && r.transport == "shm" && (r.latency_us - l).abs() < 1e-6
                })
                .map(|r| r.decode_tok_s)
        };
        // The best split of every layer: the two tensor-parallel styles, and for a mixture
        // of experts expert parallelism.
        let tensor = [find("tensor"), find("tensor-reduce"), find("expert")]
            .into_iter()
            .flatten()
            .reduce(f64::max);
        if let (Some(t), Some(p)) = (tensor, find("pipeline")) {
            by_latency.push((l, t, p));
            if crossover.is_none() && t < p {
                crossover = Some(l);
            }
        }
    }
    let rpc_tg = llama_rows.get(1).and_then(|r| r["decode_tok_s"].as_f64());
    let find = |s: &str, t: &str| {
        sealed_rows
            .iter()
            .copied()
            .find(|r| r.strategy == s && r.transport == t)
    };
    let tensor_shm = find("tensor", "shm");
    let tensor_tcp = find("tensor", "tcp");
    let reduce_shm = find("tensor-reduce", "shm");
    let reduce_tcp = find("tensor-reduce", "tcp");
    progress("peak memory per rank");
    let split_names: Vec<&str> = if moe {
        vec!["expert", "tensor", "pipeline"]
    } else {
        vec!["tensor", "pipeline"]
    };
    let rss = peak_rss(&path, &split_names)?;
    let expert_shm = find("expert", "shm");
    let expert_tcp = find("expert", "tcp");
    let summary = json!({
        "peak_rss_mb": rss,
        "tensor_shm_decode_speedup_vs_1x1": tensor_shm.map(|r| r.decode_tok_s / base1),
        "tensor_tcp_decode_speedup_vs_1x1": tensor_tcp.map(|r| r.decode_tok_s / base1),
        "tensor_shm_prefill_speedup_vs_1x1": tensor_shm.map(|r| r.prefill_tok_s / pp1),
        "tensor_shm_efficiency_vs_1x2": tensor_shm.map(|r| r.decode_tok_s / base2),
        "tensor_shm_comm_share": tensor_shm.and_then(|r| r.comm_share),
        "tensor_tcp_vs_llama_rpc": tensor_tcp.zip(rpc_tg).map(|(r, l)| r.decode_tok_s / l),
        "reduce_shm_decode_speedup_vs_1x1": reduce_shm.map(|r| r.decode_tok_s / base1),
        "reduce_tcp_decode_speedup_vs_1x1": reduce_tcp.map(|r| r.decode_tok_s / base1),
        "reduce_shm_efficiency_vs_1x2": reduce_shm.map(|r| r.decode_tok_s / base2),
        "reduce_shm_comm_share": reduce_shm.and_then(|r| r.comm_share),
        "reduce_tcp_vs_llama_rpc": reduce_tcp.zip(rpc_tg).map(|(r, l)| r.decode_tok_s / l),
        "expert_shm_decode_speedup_vs_1x1": expert_shm.map(|r| r.decode_tok_s / base1),
        "expert_tcp_decode_speedup_vs_1x1": expert_tcp.map(|r| r.decode_tok_s / base1),
        "expert_shm_prefill_speedup_vs_1x1": expert_shm.map(|r| r.prefill_tok_s / pp1),
        "expert_shm_efficiency_vs_1x2": expert_shm.map(|r| r.decode_tok_s / base2),
        "expert_shm_comm_share": expert_shm.and_then(|r| r.comm_share),
        "pipeline_throughput": throughput.map(|(s, b, single)| json!({"sequences": s, "tok_s": b, "single_stream_tok_s": single})),
        // Tensor here is the best split of every layer (expert parallelism included).
        "tensor_beats_pipeline_until_us": by_latency.iter().take_while(|x| x.1 >= x.2).last().map(|x| x.0),
        "pipeline_wins_from_us": crossover,
        "sealing_cost": sealing,
        "sealing_cost_of_a_hidden_state_message_us": hidden_state_sealing_us(&path),
    });
    if a.json {
        println!(
            "{}",
            serde_json::to_string_pretty(&json!({
                "model": path.display().to_string(),
                "pp": a.pp,
                "tg": a.tg,
                "repetitions": a.repetitions,
                "rows": all_rows,
                "llama_cpp": llama_rows,
                "summary": summary,
            }))?
        );
        return Ok(());
    }
    println!(
        "model {}: pp{} / tg{}, median of {} runs",
        path.display(),
        a.pp,
        a.tg,
        a.repetitions
    );
    println!(
        "| configuration | prefill tok/s | decode tok/s | decode vs 1x1 | comm us/token | comm share |"
    );
    println!("| --- | ---: | ---: | ---: | ---: | ---: |");
    for r in &all_rows {
        println!(
            "| {} | {:.1} | {:.1} | {:.2}x | {} | {} |",
            r.config,
            r.prefill_tok_s,
            r.decode_tok_s,
            r.decode_tok_s / base1,
            r.comm_us_per_token
                .map_or("-".into(), |c| format!("{c:.0}")),
            r.comm_share
                .map_or("-".into(), |c| format!("{:.1} %", c * 100.0)),
        );
    }
    for r in &llama_rows {
        println!(
            "| {} | {:.1} | {:.1} | {:.2}x | - | - |",
            r["config"].as_str().unwrap_or("?"),
            r["prefill_tok_s"].as_f64().unwrap_or(0.0),
            r["decode_tok_s"].as_f64().unwrap_or(0.0),
            r["decode_tok_s"].as_f64().unwrap_or(0.0) / base1,
        );
    }
    if !sealing.is_empty() {
        println!(
            "\ncost of sealing the data plane (AES-256-GCM), decode, best repetition, sealed vs plaintext (insecure):"
        );
        println!("| split | transport | sealed tok/s | plaintext tok/s | us/token | share |");
        println!("| --- | --- | ---: | ---: | ---: | ---: |");
        for c in &sealing {
            println!(
                "| {} | {} | {:.1} | {:.1} | {:.1} | {:.1} % |",
                c["strategy"].as_str().unwrap_or("?"),
                c["transport"].as_str().unwrap_or("?"),
                c["sealed_decode_tok_s"].as_f64().unwrap_or(0.0),
                c["plaintext_decode_tok_s"].as_f64().unwrap_or(0.0),
                c["us_per_token"].as_f64().unwrap_or(0.0),
                c["share_of_token_time"].as_f64().unwrap_or(0.0) * 100.0,
            );
        }
    }
    if let Some((s, b, single)) = throughput {
        println!(
            "\npipeline, shm, {s} sequences in flight: {b:.1} tok/s in total ({:.2}x one stream)",
            b / single
        );
    }
    println!("\n{}", serde_json::to_string_pretty(&summary)?);
    Ok(())
}
