//! `strata-bench engine`: single-node prefill and decode speed, side by side with llama.cpp's
//! own `llama-bench` on the same GGUF in the same run, against the memory-bandwidth roofline.
//!
//! The tests mirror llama-bench's: `pp N` is one prefill of N random tokens from an empty cache,
//! `tg N` is N single-token steps from an empty cache. The repetitions are interleaved rounds:
//! each round times strata once and then runs llama-bench once (`-r 1`), so a burst of load
//! from elsewhere on a shared machine hits both sides of a round alike. The ratio reported is
//! the median of the per-round ratios; the speeds are the medians of each side's rounds. Read
//! the ratio, not the absolutes.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use clap::Args;
use serde_json::{Value, json};
use strata_engine::Generator;

/// `strata-bench engine`.
#[derive(Debug, Args)]
pub(crate) struct EngineArgs {
    /// Model id from the catalog or a path to a GGUF file.
    #[arg(long, short = 'm', default_value = strata_store::DEFAULT_MODEL_ID)]
    model: String,
    /// Thread counts to measure, comma-separated.
    #[arg(long, short = 't', value_delimiter = ',', default_values_t = [1usize, 2], value_parser = strata::args::at_least_one)]
    threads: Vec<usize>,
    /// Prompt tokens of the prefill test (llama-bench `-p`).
    #[arg(long, default_value_t = 512, value_parser = strata::args::at_least_one)]
    pp: usize,
    /// Generated tokens of the decode test (llama-bench `-n`).
    #[arg(long, default_value_t = 128, value_parser = strata::args::at_least_one)]
    tg: usize,
    /// Tokens already in the context when each test starts (llama-bench `-d`): decode and
    /// prefill speed at depth, where attention over the cache costs as much as the weights.
    #[arg(long, short = 'd', default_value_t = 0, value_parser = strata::args::count)]
    depth: usize,
    /// Rounds per thread count (strata then llama-bench, interleaved); medians are reported.
    #[arg(long, short = 'r', default_value_t = 5, value_parser = strata::args::at_least_one)]
    repetitions: usize,
    #[command(flatten)]
    llama: LlamaOpts,
    /// Print one JSON object instead of the table.
    #[arg(long)]
    json: bool,
}

/// Where llama.cpp's `llama-bench` comes from, shared by the benchmarks.
#[derive(Debug, Args)]
pub(crate) struct LlamaOpts {
    /// Path of llama.cpp's `llama-bench` (default: `$STRATA_LLAMA_BENCH`, `llama-bench` on
    /// PATH, then `~/.cache/llama-bench/llama-bench`).
    #[arg(long)]
    llama_bench: Option<PathBuf>,
    /// Measure strata only.
    #[arg(long)]
    no_llama: bool,
}

impl LlamaOpts {
    /// The llama-bench to run, if any (with a note on stderr when it was wanted but not found).
    pub(crate) fn find(&self) -> Option<PathBuf> {
        if self.no_llama {
            return None;
        }
        let found = find_llama_bench(self.llama_bench.as_deref());
        if found.is_none() {
            eprintln!(
                "note: llama-bench not found (pass --llama-bench PATH or set STRATA_LLAMA_BENCH); \
                 measuring strata only"
            );
        }
        found
    }
}

/// One row of the report: a test at one thread count, one sample per round.
struct Row {
    threads: usize,
    test: String,
    strata: Vec<f64>,
    /// llama-bench's figure of the same rounds (empty without llama-bench).
    llama: Vec<f64>,
    roofline: Option<f64>,
}

impl Row {
    /// The median of the rounds' strata / llama.cpp ratios.
    fn ratio(&self) -> Option<f64> {
        let ratios: Vec<f64> = self
            .strata
            .iter()
            .zip(&self.llama)
            .map(|(ours, theirs)| ours / theirs)
            .collect();
        (!ratios.is_empty()).then(|| median(&ratios))
    }

    fn llama_median(&self) -> Option<f64> {
        (!self.llama.is_empty()).then(|| median(&self.llama))
    }
}

pub(crate) fn median(v: &[f64]) -> f64 {
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    match s.len() {
        0 => 0.0,
        n if n % 2 == 1 => s[n / 2],
        n => (s[n / 2 - 1] + s[n / 2]) / 2.0,
    }
}

/// Deterministic pseudo-random token ids below `vocab` (llama-bench also feeds random ids).
pub(crate) fn random_tokens(n: usize, vocab: usize, seed: u64) -> Vec<u32> {
    let mut x = seed.max(1);
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x % vocab as u64) as u32
        })
        .collect()
}

pub(crate) fn engine(a: EngineArgs) -> Result<()> {
    if a.threads.is_empty() || a.threads.contains(&0) {
        bail!("--threads needs thread counts of at least 1");
    }
    if a.pp == 0 || a.tg == 0 || a.repetitions == 0 {
        bail!("--pp, --tg and --repetitions must be at least 1");
    }
    let path = strata::cmd_run::resolve_model(&a.model)?;
    let llama = a.llama.find();
    let depth_arg = if a.depth > 0 {
        vec!["-d".to_string(), a.depth.to_string()]
    } else {
        Vec::new()
    };
    // llama-bench's labels: `pp512`, or `pp512 @ d2048` at depth.
    let label = |test: String| {
        if a.depth > 0 {
            format!("{test} @ d{}", a.depth)
        } else {
            test
        }
    };
    let mut rows = Vec::new();
    let mut bytes_per_token = 0usize;
    for &t in &a.threads {
        // A run takes tens of seconds per thread count: say what is being measured.
        eprintln!("strata: loading the model for {t} thread(s), warming up");
        let mut g = Generator::load(&path, t, Some(a.depth + a.pp.max(a.tg) + 8))
            .with_context(|| format!("loading {}", path.display()))?;
        bytes_per_token = g.model().streamed_bytes_per_token();
        let vocab = g.model().config().n_vocab;
        let bw = g.memory_bandwidth();
        let prompt = random_tokens(a.pp, vocab, 42);
        let gen_tokens = random_tokens(a.tg, vocab, 7);
        let context = random_tokens(a.depth, vocab, 11);
        // Warm-up: page in the weights and size every buffer.
        g.time_prefill(&prompt)?;
        g.time_decode(&gen_tokens, a.tg.min(16))?;
        let (mut pp, mut tg) = (Vec::new(), Vec::new());
        let (mut lpp, mut ltg) = (Vec::new(), Vec::new());
        for round in 1..=a.repetitions {
            eprintln!(
                "strata: {t} thread(s), round {round}/{}: {} and {}{}",
                a.repetitions,
                label(format!("pp{}", a.pp)),
                label(format!("tg{}", a.tg)),
                if llama.is_some() {
                    ", then llama-bench"
                } else {
                    ""
                }
            );
            let secs = g.time_prefill_at(&context, &prompt)?.as_secs_f64();
            pp.push(a.pp as f64 / secs.max(1e-9));
            let secs = g.time_decode_at(&context, &gen_tokens, a.tg)?.as_secs_f64();
            tg.push(a.tg as f64 / secs.max(1e-9));
            if let Some(exe) = &llama {
                let (p, t) = run_llama_bench(exe, &path, t, a.pp, a.tg, 1, &depth_arg)?;
                lpp.push(p);
                ltg.push(t);
            }
        }
        drop(g);
        rows.push(Row {
            threads: t,
            test: label(format!("pp{}", a.pp)),
            strata: pp,
            llama: lpp,
            roofline: None,
        });
        rows.push(Row {
            threads: t,
            test: label(format!("tg{}", a.tg)),
            strata: tg,
            llama: ltg,
            // At depth the cache is read too, so the weights alone no longer bound decoding.
            roofline: (a.depth == 0).then(|| bw / bytes_per_token.max(1) as f64),
        });
    }
    if a.json {
        let results: Vec<Value> = rows
            .iter()
            .map(|r| {
                let ours = median(&r.strata);
                json!({
                    "threads": r.threads,
                    "test": r.test,
                    "strata_tok_s": ours,
                    "strata_samples": r.strata,
                    "llama_cpp_tok_s": r.llama_median(),
                    "llama_cpp_samples": r.llama,
                    "ratio": r.ratio(),
                    "roofline_tok_s": r.roofline,
                    "roofline_share": r.roofline.map(|x| ours / x),
                })
            })
            .collect();
        println!(
            "{}",
            json!({
                "model": path.display().to_string(),
                "weight_bytes_per_token": bytes_per_token,
                "depth": a.depth,
                "llama_bench": llama.as_ref().map(|p| p.display().to_string()),
                "results": results,
            })
        );
        return Ok(());
    }
    println!(
        "model {}: {:.1} MB of weights read per token; medians of {} interleaved rounds",
        path.display(),
        bytes_per_token as f64 / 1e6,
        a.repetitions
    );
    println!(
        "| threads | test | strata tok/s | llama.cpp tok/s | strata / llama.cpp | roofline tok/s | strata / roofline |"
    );
    println!("| ---: | --- | ---: | ---: | ---: | ---: | ---: |");
    let opt = |v: Option<f64>, prec: usize| v.map_or("-".into(), |x| format!("{x:.prec$}"));
    for r in &rows {
        let ours = median(&r.strata);
        println!(
            "| {} | {} | {:.1} | {} | {} | {} | {} |",
            r.threads,
            r.test,
            ours,
            opt(r.llama_median(), 1),
            opt(r.ratio(), 2),
            opt(r.roofline, 0),
            r.roofline
                .map_or("-".into(), |x| format!("{:.0} %", 100.0 * ours / x)),
        );
    }
    Ok(())
}

fn find_llama_bench(given: Option<&Path>) -> Option<PathBuf> {
    if let Some(p) = given {
        return Some(p.to_path_buf());
    }
    if let Some(p) = std::env::var_os("STRATA_LLAMA_BENCH") {
        return Some(PathBuf::from(p));
    }
    if let Some(paths) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&paths) {
            let p = dir.join("llama-bench");
            if p.is_file() {
                return Some(p);
            }
        }
    }
    let home = std::env::var_os("HOME")?;
    let p = PathBuf::from(home).join(".cache/llama-bench/llama-bench");
    p.is_file().then_some(p)
}

/// Runs llama-bench once for `threads` and returns its mean (pp, tg) tok/s.
pub(crate) fn run_llama_bench(
    exe: &Path,
    model: &Path,
    threads: usize,
    pp: usize,
    tg: usize,
    reps: usize,
    extra: &[String],
) -> Result<(f64, f64)> {
    let run = |more: &[&str]| {
        Command::new(exe)
            .arg("-m")
            .arg(model)
            .args(extra)
            .args(more)
            .args(["-p", &pp.to_string(), "-n", &tg.to_string()])
            .args(["-t", &threads.to_string(), "-r", &reps.to_string()])
            .args(["-o", "json"])
            .output()
            .with_context(|| format!("running {}", exe.display()))
    };
    let mut out = run(&[])?;
    if out.status.code().is_none() && extra.is_empty() {
        // Killed by a signal: on CPUs with AMX under a hypervisor that does not grant its tile
        // state, llama.cpp's repacked (AMX) weights crash; its plain CPU path still runs.
        eprintln!(
            "note: llama-bench crashed ({}); measuring it again with --repack 0 (no AMX or \
             repacked weights)",
            out.status
        );
        out = run(&["--repack", "0"])?;
    }
    if !out.status.success() {
        bail!(
            "{} failed ({}): {}",
            exe.display(),
            out.status,
            String::from_utf8_lossy(&out.stderr)
                .lines()
                .last()
                .unwrap_or("")
        );
    }
    let v: Value = serde_json::from_slice(&out.stdout)
        .with_context(|| format!("reading the JSON output of {}", exe.display()))?;
    let find = |prompt: usize, n_gen: usize| -> Result<f64> {
        v.as_array()
            .into_iter()
            .flatten()
            .find(|r| {
                r["n_prompt"].as_u64() == Some(prompt as u64)
                    && r["n_gen"].as_u64() == Some(n_gen as u64)
            })
            .and_then(|r| r["avg_ts"].as_f64())
            .with_context(|| format!("llama-bench printed no result for pp{prompt} tg{n_gen}"))
    };
    Ok((find(pp, 0)?, find(0, tg)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_ratio_is_the_median_of_the_rounds_ratios() {
        let row = |strata: Vec<f64>, llama: Vec<f64>| Row {
            threads: 1,
            test: "pp8".into(),
            strata,
            llama,
            roofline: None,
        };
        // Round ratios 2, 3 and 1: their median is 2, while the ratio of the medians
        // (3 / 1) would credit strata's fast round against llama.cpp's slow one.
        let r = row(vec![2.0, 3.0, 4.0], vec![1.0, 1.0, 4.0]);
        assert_eq!(r.ratio(), Some(2.0));
        assert_eq!(r.llama_median(), Some(1.0));
        let none = row(vec![2.0], vec![]);
        assert_eq!(none.ratio(), None);
        assert_eq!(none.llama_median(), None);
    }
}
