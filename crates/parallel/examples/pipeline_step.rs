//! Probe: decode rate of the default model split into two pipeline stages (two ranks in this
//! process, one thread each, over shared memory) for 16 sequences, stepped three ways: one
//! batched step at a time (one micro-batch per stage, the pipe drained every step), two groups
//! overlapped across steps (what the API scheduler does), and one process on one thread for
//! reference, each alternated with one process in short rounds. The engine alone: no HTTP, no
//! client, no sampling beyond greedy candidates; stage 0's share of time spent waiting says
//! which stage bounds the overlapped rate.
//!
//! `cargo run --release -p strata-parallel --example pipeline_step [SEQUENCES]`; `GROUPS=K`
//! overlaps K groups instead of two, `SHARE0=F` splits the layers giving stage 0 the share F
//! of the work (default: even), to tell a stage imbalance from the hand-offs' cost.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use strata_engine::prefix::Partition;
use strata_engine::{Batch, Model, Sequences, SlotId, StepKind};
use strata_gguf::GgufFile;
use strata_parallel::{CombineStyle, ShardedBatch, Strategy, local_pair, make_plan};

/// Steps of one timed round.
const STEPS: usize = 16;
/// Rounds, alternating one process and two stages.
const ROUNDS: usize = 12;

/// Time of one round of [`STEPS`] batched steps of `steps` on `engine`.
fn rounds_of(engine: &mut impl Sequences, steps: &[(SlotId, u32)]) -> Duration {
    let t = Instant::now();
    for _ in 0..STEPS {
        engine.step_top(steps, 1).unwrap();
    }
    t.elapsed()
}

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
            let (s, _) = Sequences::admit(&mut one, p, Partition::SHARED).unwrap();
            Sequences::extend(&mut one, s, p).unwrap();
            s
        })
        .collect();
    let one_steps: Vec<(SlotId, u32)> = slots.iter().map(|&s| (s, 100)).collect();

    // SHARE0: stage 0's share of the work to split by (default: even).
    let share: Option<f64> = std::env::var("SHARE0").ok().and_then(|s| s.parse().ok());
    let shares = share.map(|s| [s, 1.0 - s]);
    let plan = make_plan(
        &file,
        &cfg,
        Strategy::Pipeline,
        2,
        shares.as_ref().map(|s| &s[..]),
        CombineStyle::Gather,
    )
    .unwrap();
    print!("{}", plan.describe(&cfg));
    let (rank, worker) = local_pair(&file, &path, plan, 512, n).unwrap();
    let mut sharded = ShardedBatch::new(rank, cfg.n_vocab).unwrap();
    let slots: Vec<SlotId> = prompts
        .iter()
        .map(|p| {
            let (s, _) = Sequences::admit(&mut sharded, p, Partition::SHARED).unwrap();
            Sequences::extend(&mut sharded, s, p).unwrap();
            s
        })
        .collect();
    let steps: Vec<(SlotId, u32)> = slots.iter().map(|&s| (s, 100)).collect();
    // One process and the drained pipeline in turn, a short round each: this VM's speed
    // changes about every second, and alternating puts both through the same phases.
    let (mut t_one, mut t_two) = (Duration::ZERO, Duration::ZERO);
    let wait0 = sharded.rank().comm().stats().wait;
    for _ in 0..ROUNDS {
        t_one += rounds_of(&mut one, &one_steps);
        t_two += rounds_of(&mut sharded, &steps);
    }
    let tokens = (n * STEPS * ROUNDS) as f64;
    let base = tokens / t_one.as_secs_f64();
    let drained = tokens / t_two.as_secs_f64();
    println!("one process, 1 thread: {base:.0} tok/s");
    // Drained, stage 0 waits while stage 1 works: its wait share is stage 1's share of a step.
    let wait = sharded.rank().comm().stats().wait - wait0;
    println!(
        "2 stages, one step at a time: {drained:.0} tok/s ({:.2}x); stage 0 waited {:.0} % of the time",
        drained / base,
        wait.as_secs_f64() / t_two.as_secs_f64() * 100.0
    );
    if n < 2 {
        // One sequence cannot be split into two groups.
        sharded.shutdown().unwrap();
        worker.join().unwrap().unwrap();
        return;
    }

    // The groups overlapped (two, one per stage, as the API scheduler keeps them), alternated
    // with one process the same way. Each round primes the pipe and drains it at the end (a
    // stage idles for about one of its 32 group-steps, some 3 %).
    let k: usize = std::env::var("GROUPS")
        .ok()
        .and_then(|g| g.parse().ok())
        .unwrap_or(2)
        .max(1);
    let groups: Vec<&[(SlotId, u32)]> = steps.chunks(n.div_ceil(k)).collect();
    let k = groups.len();
    let (mut t_one, mut t_lap) = (Duration::ZERO, Duration::ZERO);
    let wait0 = sharded.rank().comm().stats().wait;
    for _ in 0..ROUNDS {
        t_one += rounds_of(&mut one, &one_steps);
        let t = Instant::now();
        for g in &groups {
            Sequences::submit(&mut sharded, g, StepKind::Top(1)).unwrap();
        }
        for i in 0..k * STEPS {
            Sequences::collect(&mut sharded).unwrap();
            if i + k < k * STEPS {
                Sequences::submit(&mut sharded, groups[i % k], StepKind::Top(1)).unwrap();
            }
        }
        t_lap += t.elapsed();
    }
    let wait = sharded.rank().comm().stats().wait - wait0;
    let base = tokens / t_one.as_secs_f64();
    let overlapped = tokens / t_lap.as_secs_f64();
    println!(
        "2 stages, {k} groups overlapped: {overlapped:.0} tok/s ({:.2}x one process at \
         {base:.0} tok/s alternated with it); stage 0 waited {:.0} % of the time",
        overlapped / base,
        wait.as_secs_f64() / t_lap.as_secs_f64() * 100.0
    );
    sharded.shutdown().unwrap();
    worker.join().unwrap().unwrap();
}
