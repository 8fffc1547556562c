//! A sharded decode step allocates nothing once warm, on any rank: two ranks (threads of this
//! process, each with its own links over real shared memory) run tensor- and pipeline-parallel
//! decode steps on the real model under a counting global allocator.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use strata_engine::ModelConfig;
use strata_gguf::GgufFile;
use strata_parallel::{CombineStyle, ShardedBatch, Strategy, local_pair, make_plan};

struct Counting;

static ALLOCATIONS: AtomicUsize = AtomicUsize::new(0);

// SAFETY: forwards every call to the system allocator unchanged; only counts.
unsafe impl GlobalAlloc for Counting {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: the caller's contract is passed through.
        unsafe { System.alloc(layout) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: as above.
        unsafe { System.dealloc(ptr, layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        ALLOCATIONS.fetch_add(1, Ordering::Relaxed);
        // SAFETY: as above.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
}

#[global_allocator]
static GLOBAL: Counting = Counting;

/// The counter is global: the tests take turns, so one's loading is not counted in the
/// other's steps.
static SERIAL: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn smollm2() -> std::path::PathBuf {
    strata_store::Store::from_env()
        .expect("store")
        .ensure("smollm2-135m-instruct")
        .expect("model")
}

#[test]
fn sharded_decode_steps_do_not_allocate() {
    let _turn = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let path = smollm2();
    for strategy in [Strategy::Tensor, Strategy::Pipeline] {
        let file = GgufFile::open(&path).unwrap();
        let cfg = ModelConfig::from_gguf(&file).unwrap();
        let plan = make_plan(&file, &cfg, strategy, 2, None, CombineStyle::Gather).unwrap();
        let (rank, worker) = local_pair(&file, &path, plan, 256, 1).unwrap();
        let mut g = ShardedBatch::new(rank, cfg.n_vocab).unwrap();
        let tokens: Vec<u32> = (100..140).collect();
        // Warm-up sizes every buffer on both ranks.
        g.time_decode(&tokens, 24).unwrap();
        let before = ALLOCATIONS.load(Ordering::Relaxed);
        g.time_decode(&tokens, 24).unwrap();
        let during = ALLOCATIONS.load(Ordering::Relaxed) - before;
        g.shutdown().unwrap();
        worker.join().unwrap().unwrap();
        assert_eq!(
            during, 0,
            "{strategy:?}: {during} allocations in 24 sharded decode steps"
        );
    }
}

/// Batched steps of a sharded instance (every live sequence in one step; a pipeline's in one
/// micro-batch per stage, in flight together) allocate nothing once warm either, on any rank,
/// whatever the micro-batches' sizes.
#[test]
fn batched_sharded_steps_do_not_allocate() {
    let _turn = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let path = smollm2();
    let params = strata_engine::SamplingParams {
        temperature: 1.0,
        top_k: 4,
        ..strata_engine::SamplingParams::default()
    };
    for strategy in [Strategy::Tensor, Strategy::Pipeline] {
        let file = GgufFile::open(&path).unwrap();
        let cfg = ModelConfig::from_gguf(&file).unwrap();
        let plan = make_plan(&file, &cfg, strategy, 2, None, CombineStyle::Gather).unwrap();
        let (mut rank, worker) = local_pair(&file, &path, plan, 256, 3).unwrap();
        let micro = rank.stages();
        let mut rows = Vec::new();
        let mut steps: Vec<(usize, usize, u32)> = (0..3).map(|s| (s, 0, 100 + s as u32)).collect();
        let mut run = |rank: &mut strata_parallel::Rank, steps: &mut Vec<(usize, usize, u32)>| {
            let per = steps.len().div_ceil(micro);
            for m in steps.chunks(per) {
                rank.submit_batch(m, &params).unwrap();
            }
            for m in steps.chunks(per) {
                rank.collect_batch(m.len(), &mut rows).unwrap();
            }
            for s in steps.iter_mut() {
                s.1 += 1;
                s.2 += 1;
            }
        };
        for _ in 0..8 {
            run(&mut rank, &mut steps);
        }
        let mut per = [0usize; 16];
        for p in &mut per {
            let b = ALLOCATIONS.load(Ordering::Relaxed);
            run(&mut rank, &mut steps);
            *p = ALLOCATIONS.load(Ordering::Relaxed) - b;
        }
        let during: usize = per.iter().sum();
        rank.shutdown().unwrap();
        worker.join().unwrap().unwrap();
        assert_eq!(
            during, 0,
            "{strategy:?}: {during} allocations in 16 batched sharded steps ({per:?})"
        );
    }
}

/// A pipeline's steps overlapped across steps through the sequence engine (two groups of
/// sequences stepping in turn, each submitted while the other is in flight, as the API
/// scheduler drives it) allocate nothing once warm either.
#[test]
fn overlapped_pipeline_steps_do_not_allocate() {
    use strata_engine::{Sequences, SlotId, StepKind};
    let _turn = SERIAL
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    let path = smollm2();
    let file = GgufFile::open(&path).unwrap();
    let cfg = ModelConfig::from_gguf(&file).unwrap();
    let plan = make_plan(
        &file,
        &cfg,
        Strategy::Pipeline,
        2,
        None,
        CombineStyle::Gather,
    )
    .unwrap();
    let (rank, worker) = local_pair(&file, &path, plan, 256, 4).unwrap();
    let mut g = ShardedBatch::new(rank, cfg.n_vocab).unwrap();
    let slots: Vec<SlotId> = (0..4u32)
        .map(|i| {
            let prompt = [1, 200 + i, 300];
            let (s, _) = g
                .admit(&prompt, strata_engine::prefix::Partition::SHARED)
                .unwrap();
            g.extend(s, &prompt).unwrap();
            s
        })
        .collect();
    let groups = [
        [(slots[0], 100u32), (slots[1], 101)],
        [(slots[2], 102), (slots[3], 103)],
    ];
    // Greedy rows and top-k rows alternate, as mixed clients would ask.
    let kind = |turn: usize| {
        if turn.is_multiple_of(2) {
            StepKind::Top(1)
        } else {
            StepKind::Top(8)
        }
    };
    g.submit(&groups[0], kind(0)).unwrap();
    g.submit(&groups[1], kind(1)).unwrap();
    let run = |g: &mut ShardedBatch, turns: std::ops::Range<usize>| {
        for turn in turns {
            g.collect().unwrap();
            g.submit(&groups[turn % 2], kind(turn)).unwrap();
        }
    };
    run(&mut g, 0..16);
    let before = ALLOCATIONS.load(Ordering::Relaxed);
    run(&mut g, 16..48);
    let during = ALLOCATIONS.load(Ordering::Relaxed) - before;
    g.collect().unwrap();
    g.collect().unwrap();
    g.shutdown().unwrap();
    worker.join().unwrap().unwrap();
    assert_eq!(
        during, 0,
        "{during} allocations in 32 overlapped pipeline steps"
    );
}
