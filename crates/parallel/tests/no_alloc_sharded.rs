//! A sharded decode step allocates nothing once warm, on any rank: two ranks (threads of this
//! process, each with its own links over real shared memory) run tensor- and pipeline-parallel
//! decode steps on the real model under a counting global allocator.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use strata_engine::ModelConfig;
use strata_gguf::GgufFile;
use strata_parallel::{
    Assignment, CombineStyle, ShardedGenerator, Strategy, local_pair, make_plan,
};
use strata_tokenizer::Tokenizer;

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

#[test]
fn sharded_decode_steps_do_not_allocate() {
    let path = strata_store::Store::from_env()
        .expect("store")
        .ensure("smollm2-135m-instruct")
        .expect("model");
    for strategy in [Strategy::Tensor, Strategy::Pipeline] {
        let file = GgufFile::open(&path).unwrap();
        let cfg = ModelConfig::from_gguf(&file).unwrap();
        let plan = make_plan(&file, &cfg, strategy, 2, None, CombineStyle::Gather).unwrap();
        let a = Assignment {
            plan,
            model_path: path.clone(),
            model_bytes: file.bytes().len() as u64,
            threads: 1,
            n_ctx: 256,
            max_seqs: 1,
            numerics: "avx2".into(),
        };
        let (rank, worker) = local_pair(&file, &a).unwrap();
        let tok = Tokenizer::from_gguf(file.metadata()).unwrap();
        let mut g = ShardedGenerator::new(rank, tok, None).unwrap();
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
