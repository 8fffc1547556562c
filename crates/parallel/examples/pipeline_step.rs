//! Probe: decode rate of the default model split into two pipeline stages (two ranks in this
//! process, one thread each, over shared memory) for 16 sequences, stepped three ways: one
//! batched step at a time (one micro-batch per stage, the pipe drained every step), two groups
//! overlapped across steps (what the API scheduler does), and one process on one thread for
//! reference. The engine alone: no HTTP, no client, no sampling beyond greedy candidates.
//!
//! `cargo run --release -p strata-parallel --example pipeline_step [SEQUENCES]`
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use strata_engine::{Batch, Model, Sequences, SlotId, StepKind};
use strata_gguf::GgufFile;
use strata_parallel::{CombineStyle, ShardedBatch, Strategy, local_pair, make_plan};

/// Steps of one timed round.
const STEPS: usize = 16;
/// Rounds, alternating one process and two stages.
const ROUNDS: usize = 12;

fn main() {
    let n: usize = std::env::args()
        .nth(1)
        .and_then(|t| t.parse().ok())
        .unwrap_or(16);
    let path = strata_store::Store::from_env()
        .unwrap()
        .ensure("smollm2-135m-instruct")
        .unwrap();
    let file = GgufFile::open(&path).unwrap();
    let cfg = strata_engine::ModelConfig::from_gguf(&file).unwrap();
    let prompts: Vec<Vec<u32>> = (0..n as u32).map(|i| vec![1, 2, 3, 40 + i]).collect();

    let mut one = Batch::new(Model::load_full(&file).unwrap(), 1, n, 512).unwrap();
    let slots: Vec<SlotId> = prompts
        .iter()
        .map(|p| {
            let (s, _) = Sequences::admit(&mut one, p).unwrap();
            Sequences::extend(&mut one, s, p).unwrap();
            s
        })
        .collect();
    let one_steps: Vec<(SlotId, u32)> = slots.iter().map(|&s| (s, 100)).collect();

    let plan = make_plan(
        &file,
        &cfg,
        Strategy::Pipeline,
        2,
        None,
        CombineStyle::Gather,
    )
    .unwrap();
    print!("{}", plan.describe(&cfg));
    let (rank, worker) = local_pair(&file, &path, plan, 512, n).unwrap();
    let mut sharded = ShardedBatch::new(rank, cfg.n_vocab).unwrap();
    let slots: Vec<SlotId> = prompts
        .iter()
        .map(|p| {
            let (s, _) = Sequences::admit(&mut sharded, p).unwrap();
            Sequences::extend(&mut sharded, s, p).unwrap();
            s
        })
        .collect();
    let steps: Vec<(SlotId, u32)> = slots.iter().map(|&s| (s, 100)).collect();
    // One process and the drained pipeline in turn, a short round each: this VM's speed
    // changes about every second, and alternating puts both through the same phases.
    let (mut t_one, mut t_two) = (Duration::ZERO, Duration::ZERO);
    for _ in 0..ROUNDS {
        let t = Instant::now();
        for _ in 0..STEPS {
            Sequences::step_top(&mut one, &one_steps, 1).unwrap();
        }
        t_one += t.elapsed();
        let t = Instant::now();
        for _ in 0..STEPS {
            Sequences::step_top(&mut sharded, &steps, 1).unwrap();
        }
        t_two += t.elapsed();
    }
    let tokens = (n * STEPS * ROUNDS) as f64;
    let base = tokens / t_one.as_secs_f64();
    let drained = tokens / t_two.as_secs_f64();
    println!("one process, 1 thread: {base:.0} tok/s");
    println!(
        "2 stages, one step at a time: {drained:.0} tok/s ({:.2}x)",
        drained / base
    );
    if n < 2 {
        // One sequence cannot be split into two groups.
        sharded.shutdown().unwrap();
        worker.join().unwrap().unwrap();
        return;
    }

    let half = n.div_ceil(2);
    let groups = [&steps[..half], &steps[half..]];
    let t = Instant::now();
    Sequences::submit(&mut sharded, groups[0], StepKind::Top(1)).unwrap();
    Sequences::submit(&mut sharded, groups[1], StepKind::Top(1)).unwrap();
    for i in 0..2 * STEPS * ROUNDS {
        Sequences::collect(&mut sharded).unwrap();
        if i + 2 < 2 * STEPS * ROUNDS {
            Sequences::submit(&mut sharded, groups[i % 2], StepKind::Top(1)).unwrap();
        }
    }
    let overlapped = (n * STEPS * ROUNDS) as f64 / t.elapsed().as_secs_f64();
    println!(
        "2 stages, two groups overlapped: {overlapped:.0} tok/s ({:.2}x)",
        overlapped / base
    );
    sharded.shutdown().unwrap();
    worker.join().unwrap().unwrap();
}
