//! The decode step allocates nothing once its buffers have seen their largest batch: a counting
//! global allocator watches real decode steps on the real model.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicUsize, Ordering};

use strata_engine::Generator;

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

/// The counter is process-wide: tests take turns, so one's allocations never land in
/// another's window.
static TURN: std::sync::Mutex<()> = std::sync::Mutex::new(());

#[test]
fn decode_steps_do_not_allocate() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    let path = strata_store::Store::from_env()
        .expect("model store")
        .ensure("smollm2-135m-instruct")
        .expect("fetching the default model");
    check_no_alloc(&path);
}

/// The same for a mixture of experts (a small synthetic Qwen3-MoE): routing, grouping and the
/// experts' products run on kept buffers too.
#[test]
fn mixture_of_experts_decode_steps_do_not_allocate() {
    let _turn = TURN.lock().unwrap_or_else(|e| e.into_inner());
    use strata_engine::synth::{SynthSpec, synth};
    let path = strata_store::Store::from_env()
        .expect("model store")
        .ensure("smollm2-135m-instruct")
        .expect("fetching the default model");
    let base = strata_gguf::GgufFile::open(&path).unwrap();
    let spec = SynthSpec {
        arch: strata_engine::Arch::Qwen3Moe,
        layers: 2,
        embd: 256,
        ff: 256,
        heads: 4,
        kv_heads: 2,
        head_dim: None,
        ty: strata_gguf::GgmlType::Q4K,
        tensor_types: Vec::new(),
        seed: 5,
        sliding_window: None,
        chat_template: None,
        pooling: None,
        experts: Some((8, 2)),
    };
    let dir = tempfile::tempdir().unwrap();
    let moe = dir.path().join("moe.gguf");
    std::fs::write(&moe, synth(&spec, &base).unwrap()).unwrap();
    check_no_alloc(&moe);
}

fn check_no_alloc(path: &std::path::Path) {
    for threads in [1, 2] {
        let mut g = Generator::load(path, threads, Some(256)).unwrap();
        g.prompt_logits(&[1, 2, 3, 4, 5, 6, 7, 8]).unwrap();
        // Warm-up: the first steps size the single-token buffers.
        for t in [10, 11] {
            g.decode_logits(t).unwrap();
        }
        let before = ALLOCATIONS.load(Ordering::Relaxed);
        for t in 20..40 {
            g.decode_logits(t).unwrap();
        }
        let during = ALLOCATIONS.load(Ordering::Relaxed) - before;
        assert_eq!(
            during, 0,
            "{threads} threads: {during} allocations in 20 decode steps"
        );
    }
}
