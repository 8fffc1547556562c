//! Tests of [`ShardedBatch`](super::ShardedBatch): every row and embedding bit for bit one
//! process's, for tensor and pipeline splits, with steps in flight.
#![allow(clippy::unwrap_used, clippy::expect_used)]
use crate::{CombineStyle, Strategy, local_pair, make_plan};
use strata_engine::Batch;
use strata_engine::{Model, ModelConfig};
use strata_gguf::GgufFile;
use strata_kernels::attn::Flavour;

use super::*;

/// The default model: its path, file and configuration.
fn smollm2() -> (std::path::PathBuf, GgufFile, ModelConfig) {
    let path = strata_store::Store::from_env()
        .expect("store")
        .ensure("smollm2-135m-instruct")
        .expect("model");
    let file = GgufFile::open(&path).unwrap();
    let cfg = ModelConfig::from_gguf(&file).unwrap();
    (path, file, cfg)
}

/// SmolLM2 split into two pipeline stages (rank 1 on a thread of its own, shared memory)
/// and whole in one process, each with `slots` slots of 96 positions.
fn pipeline_and_one_process(
    slots: usize,
) -> (
    ShardedBatch,
    std::thread::JoinHandle<crate::Result<()>>,
    Batch,
) {
    let (path, file, cfg) = smollm2();
    let plan = make_plan(
        &file,
        &cfg,
        Strategy::Pipeline,
        2,
        None,
        CombineStyle::Gather,
    )
    .unwrap();
    let (rank, worker) = local_pair(&file, &path, plan, 96, slots).unwrap();
    let sharded = ShardedBatch::new(rank, cfg.n_vocab).unwrap();
    let mut model = Model::load_full(&file).unwrap();
    model.set_flavour(Flavour::native());
    (sharded, worker, Batch::new(model, 1, slots, 96).unwrap())
}

/// The `k` greatest logits with their ids, ties to the lower id.
fn top(row: &[f32], k: usize) -> Vec<(u32, u32)> {
    let mut v: Vec<(u32, f32)> = row
        .iter()
        .enumerate()
        .map(|(i, &x)| (i as u32, x))
        .collect();
    v.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    v.iter().take(k).map(|&(i, x)| (i, x.to_bits())).collect()
}

fn argmax(row: &[f32]) -> u32 {
    let mut best = 0;
    for (i, &x) in row.iter().enumerate() {
        if x > row[best] {
            best = i;
        }
    }
    best as u32
}

/// Sequences of different lengths join and leave a sharded instance's batched steps (all
/// live sequences in one step, a pipeline's in one micro-batch per stage), and every row
/// of logits is bit for bit what one process's batch gives the same sequence.
#[test]
fn sharded_batched_steps_match_one_process_per_sequence() {
    let (path, file, cfg) = smollm2();
    let flavour = Flavour::native();
    for strategy in [Strategy::Tensor, Strategy::Pipeline] {
        let plan = make_plan(&file, &cfg, strategy, 2, None, CombineStyle::Gather).unwrap();
        let (rank, worker) = local_pair(&file, &path, plan, 96, 4).unwrap();
        let mut sharded = ShardedBatch::new(rank, cfg.n_vocab).unwrap();
        let mut model = Model::load_full(&file).unwrap();
        model.set_flavour(flavour);
        let mut local = Batch::new(model, 1, 4, 96).unwrap();

        // Each sequence: its slot in either engine and its next token.
        let mut live: Vec<(SlotId, SlotId, u32)> = Vec::new();
        let join = |sharded: &mut ShardedBatch, local: &mut Batch, prompt: &[u32]| {
            let (s, _) = Sequences::admit(sharded, prompt, Partition::SHARED).unwrap();
            let (l, cached) = Sequences::admit(local, prompt, Partition::SHARED).unwrap();
            let a = Sequences::extend(sharded, s, prompt).unwrap().to_vec();
            let b = Sequences::extend(local, l, &prompt[cached..])
                .unwrap()
                .to_vec();
            assert_eq!(a, b, "{strategy:?}: prefill of {} tokens", prompt.len());
            (s, l, argmax(&b))
        };
        live.push(join(&mut sharded, &mut local, &[1, 504, 3000, 25, 77]));
        live.push(join(
            &mut sharded,
            &mut local,
            &(200..212).collect::<Vec<_>>(),
        ));
        for step in 0..10 {
            if step == 3 {
                live.push(join(&mut sharded, &mut local, &[9, 8, 7]));
            }
            if step == 6 {
                let (s, l, _) = live.remove(0);
                Sequences::release(&mut sharded, s);
                Sequences::release(&mut local, l);
            }
            let s_steps: Vec<(SlotId, u32)> = live.iter().map(|x| (x.0, x.2)).collect();
            let l_steps: Vec<(SlotId, u32)> = live.iter().map(|x| (x.1, x.2)).collect();
            let a = Sequences::step(&mut sharded, &s_steps).unwrap().to_vec();
            let b = Sequences::step(&mut local, &l_steps).unwrap().to_vec();
            let v = cfg.n_vocab;
            for (i, seq) in live.iter_mut().enumerate() {
                let (ra, rb) = (&a[i * v..(i + 1) * v], &b[i * v..(i + 1) * v]);
                let same = ra.iter().zip(rb).all(|(x, y)| x.to_bits() == y.to_bits());
                assert!(same, "{strategy:?}: step {step}, row {i} differs");
                seq.2 = argmax(rb);
            }
        }
        // Greedy steps move each rank's best logit per row, nothing more, and pick the
        // token the full row's argmax picks; top-k steps move k per rank and row, the
        // row's k best among them.
        for step in 0..4 {
            let k = if step < 2 { 1 } else { 5 };
            let s_steps: Vec<(SlotId, u32)> = live.iter().map(|x| (x.0, x.2)).collect();
            let l_steps: Vec<(SlotId, u32)> = live.iter().map(|x| (x.1, x.2)).collect();
            let a = Sequences::step_top(&mut sharded, &s_steps, k)
                .unwrap()
                .to_vec();
            let b = Sequences::step(&mut local, &l_steps).unwrap().to_vec();
            let v = cfg.n_vocab;
            for (i, seq) in live.iter_mut().enumerate() {
                let (ra, rb) = (&a[i * v..(i + 1) * v], &b[i * v..(i + 1) * v]);
                let kept = ra.iter().filter(|x| x.is_finite()).count();
                assert!(
                    (k..=2 * k).contains(&kept),
                    "{strategy:?}: {kept} logits moved"
                );
                assert_eq!(top(ra, k), top(rb, k), "{strategy:?}: step {step}, k {k}");
                seq.2 = argmax(rb);
            }
        }
        // A pipeline's stages had two micro-batches in flight; a single stage, one.
        let want = if strategy == Strategy::Pipeline { 2 } else { 1 };
        assert_eq!(sharded.rank.max_in_flight(), want, "{strategy:?}");
        sharded.shutdown().unwrap();
        worker.join().unwrap().unwrap();
    }
}

/// A pipeline's steps overlap across steps: two groups of sequences step in turn through
/// `submit` and `collect`, each submitted again while the other is in flight, and every
/// row is bit for bit one process's. No step or pass that waits for its answer may start
/// while a step is in flight, and no more steps than stages may be in flight.
#[test]
fn pipelined_groups_overlap_across_steps_and_match_one_process() {
    let (mut sharded, worker, mut local) = pipeline_and_one_process(4);
    assert_eq!(Sequences::depth(&sharded), 2);
    let v = sharded.vocab;
    // Per sequence: its slot in either engine and its next token.
    let mut seqs: Vec<(SlotId, SlotId, u32)> = Vec::new();
    for prompt in [
        &[1u32, 504, 3000][..],
        &[7, 8],
        &[200, 201, 202, 203],
        &[42],
    ] {
        let (s, _) = Sequences::admit(&mut sharded, prompt, Partition::SHARED).unwrap();
        let (l, _) = Sequences::admit(&mut local, prompt, Partition::SHARED).unwrap();
        let a = Sequences::extend(&mut sharded, s, prompt).unwrap().to_vec();
        let b = Sequences::extend(&mut local, l, prompt).unwrap().to_vec();
        assert!(a == b);
        seqs.push((s, l, argmax(&b)));
    }
    let groups = [[0, 1], [2, 3]];
    let steps = |seqs: &[(SlotId, SlotId, u32)], g: usize| -> Vec<(SlotId, u32)> {
        groups[g].iter().map(|&i| (seqs[i].0, seqs[i].2)).collect()
    };
    Sequences::submit(&mut sharded, &steps(&seqs, 0), StepKind::Full).unwrap();
    Sequences::submit(&mut sharded, &steps(&seqs, 1), StepKind::Top(1)).unwrap();
    let err = Sequences::submit(&mut sharded, &steps(&seqs, 0), StepKind::Full);
    assert!(err.is_err(), "a third step in flight on two stages");
    assert!(Sequences::extend(&mut sharded, seqs[0].0, &[5]).is_err());
    assert!(Sequences::step(&mut sharded, &steps(&seqs, 0)).is_err());
    for turn in 0..12 {
        let g = turn % 2;
        let got = Sequences::collect(&mut sharded).unwrap().to_vec();
        let l_steps: Vec<(SlotId, u32)> =
            groups[g].iter().map(|&i| (seqs[i].1, seqs[i].2)).collect();
        let want = Sequences::step(&mut local, &l_steps).unwrap().to_vec();
        for (r, &i) in groups[g].iter().enumerate() {
            let (a, b) = (&got[r * v..(r + 1) * v], &want[r * v..(r + 1) * v]);
            if g == 0 {
                assert!(a == b, "turn {turn}, row {r}");
            } else {
                assert_eq!(top(a, 1), top(b, 1), "turn {turn}, row {r}");
            }
            seqs[i].2 = argmax(b);
        }
        if turn < 10 {
            let kind = if g == 0 {
                StepKind::Full
            } else {
                StepKind::Top(1)
            };
            Sequences::submit(&mut sharded, &steps(&seqs, g), kind).unwrap();
        }
    }
    assert!(
        Sequences::collect(&mut sharded).is_err(),
        "nothing in flight"
    );
    // Steps were submitted while the other group's was in flight.
    assert_eq!(sharded.rank.max_in_flight(), 2);
    sharded.shutdown().unwrap();
    worker.join().unwrap().unwrap();
}

/// A prompt admitted while another sequence's step is in flight runs its chunks as passes
/// in flight beside that sequence's steps (`submit_extend`), and every row, the passes'
/// and the steps', is bit for bit one process's.
#[test]
fn prompt_passes_run_beside_steps_in_flight_and_match_one_process() {
    let (mut sharded, worker, mut local) = pipeline_and_one_process(2);
    let first = [1u32, 504, 3000];
    let (sa, _) = Sequences::admit(&mut sharded, &first, Partition::SHARED).unwrap();
    let (la, _) = Sequences::admit(&mut local, &first, Partition::SHARED).unwrap();
    let a = Sequences::extend(&mut sharded, sa, &first)
        .unwrap()
        .to_vec();
    let b = Sequences::extend(&mut local, la, &first).unwrap().to_vec();
    assert!(a == b);
    let mut next = argmax(&b);
    Sequences::submit(&mut sharded, &[(sa, next)], StepKind::Full).unwrap();
    // Admitted and prefilled while the first sequence's step is in flight.
    let prompt: Vec<u32> = (0..40).map(|i| 300 + i * 11).collect();
    let (sb, _) = Sequences::admit(&mut sharded, &prompt, Partition::SHARED).unwrap();
    let (lb, _) = Sequences::admit(&mut local, &prompt, Partition::SHARED).unwrap();
    for chunk in [&prompt[..16], &prompt[16..]] {
        Sequences::submit_extend(&mut sharded, sb, chunk).unwrap();
        assert!(
            Sequences::submit_extend(&mut sharded, sb, chunk).is_err(),
            "a third step in flight on two stages"
        );
        let got = Sequences::collect(&mut sharded).unwrap().to_vec();
        let want = Sequences::step(&mut local, &[(la, next)]).unwrap().to_vec();
        assert!(got == want, "the step beside a pass");
        next = argmax(&want);
        Sequences::submit(&mut sharded, &[(sa, next)], StepKind::Full).unwrap();
        let got = Sequences::collect(&mut sharded).unwrap().to_vec();
        let want = Sequences::extend(&mut local, lb, chunk).unwrap().to_vec();
        assert!(got == want, "the pass beside a step");
    }
    let got = Sequences::collect(&mut sharded).unwrap().to_vec();
    let want = Sequences::step(&mut local, &[(la, next)]).unwrap().to_vec();
    assert!(got == want);
    assert_eq!(
        sharded.rank.max_in_flight(),
        1,
        "batched steps never overlapped"
    );
    sharded.shutdown().unwrap();
    worker.join().unwrap().unwrap();
}

/// With the prefix cache on, a sharded instance keeps every block a prompt completes on
/// every rank (each its slice), restores them for a later prompt in another slot (read in
/// place), reuses what a free slot still holds, and every logit is bit for bit a cold
/// one-process prefill's and step's.
#[test]
fn a_sharded_instance_restores_cached_prefixes_on_every_rank() {
    let (path, file, cfg) = smollm2();
    let shared: Vec<u32> = (0..2 * BLOCK as u32).map(|i| 100 + i * 7 % 900).collect();
    let prompt = |tail: u32| -> Vec<u32> {
        let tail: Vec<u32> = (0..20 + tail).map(|i| 3000 + tail * 50 + i).collect();
        [shared.clone(), tail].concat()
    };
    let (a, b, c) = (prompt(0), prompt(1), prompt(2));
    // Runs `p` from `from` in block-aligned chunks; the logits after it.
    fn run<E: Sequences>(e: &mut E, slot: SlotId, p: &[u32], from: usize) -> Vec<f32> {
        let mut last = Vec::new();
        for chunk in p[from..].chunks(BLOCK) {
            last = e.extend(slot, chunk).unwrap().to_vec();
        }
        last
    }
    for strategy in [Strategy::Tensor, Strategy::Pipeline] {
        let plan = make_plan(&file, &cfg, strategy, 2, None, CombineStyle::Gather).unwrap();
        let (rank, worker) = local_pair(&file, &path, plan, 1024, 3).unwrap();
        let mut sharded = ShardedBatch::new(rank, cfg.n_vocab)
            .unwrap()
            .with_prefix_cache(256 << 20);
        let mut model = Model::load_full(&file).unwrap();
        model.set_flavour(Flavour::native());
        let mut cold = Batch::new(model, 1, 3, 1024).unwrap();
        let expect = |cold: &mut Batch, p: &[u32]| {
            let (slot, held) = Sequences::admit(cold, p, Partition::SHARED).unwrap();
            assert_eq!(held, 0);
            (slot, run(cold, slot, p, 0))
        };
        let (ca, want_a) = expect(&mut cold, &a);
        let (cb, want_b) = expect(&mut cold, &b);
        Sequences::release(&mut cold, ca);
        let (cc, want_c) = expect(&mut cold, &c);

        let (sa, held) = Sequences::admit(&mut sharded, &a, Partition::SHARED).unwrap();
        assert_eq!(held, 0);
        assert!(run(&mut sharded, sa, &a, 0) == want_a, "{strategy:?}: a");
        let stats = sharded.prefix_stats().unwrap();
        assert_eq!(stats.blocks, 2, "{strategy:?}: {stats:?}");
        assert!(sharded.rank.block_bytes() > 0);
        // While `a` runs, `b` takes another slot and its prefix comes from the cache.
        let (sb, held) = Sequences::admit(&mut sharded, &b, Partition::SHARED).unwrap();
        assert_ne!(sb, sa);
        assert_eq!(held, 2 * BLOCK, "{strategy:?}: b restored");
        assert!(run(&mut sharded, sb, &b, held) == want_b, "{strategy:?}: b");
        // `a` leaves; `c` takes the slot that still holds the prefix.
        Sequences::release(&mut sharded, sa);
        let (sc, held) = Sequences::admit(&mut sharded, &c, Partition::SHARED).unwrap();
        assert_eq!((sc, held), (sa, 2 * BLOCK), "{strategy:?}: c");
        assert!(run(&mut sharded, sc, &c, held) == want_c, "{strategy:?}: c");
        // Decoding both together matches one process step for step.
        let (mut tb, mut tc) = (argmax(&want_b), argmax(&want_c));
        for step in 0..4 {
            let x = Sequences::step(&mut sharded, &[(sb, tb), (sc, tc)])
                .unwrap()
                .to_vec();
            let y = Sequences::step(&mut cold, &[(cb, tb), (cc, tc)])
                .unwrap()
                .to_vec();
            assert!(x == y, "{strategy:?}: step {step}");
            let v = cfg.n_vocab;
            (tb, tc) = (argmax(&y[..v]), argmax(&y[v..]));
        }
        sharded.shutdown().unwrap();
        worker.join().unwrap().unwrap();
    }
}

/// A grammar's mask goes to the ranks that hold the vocabulary: a masked row comes back
/// with only the allowed candidates (each rank filters its slice), equal bit for bit to one
/// process's row with the mask applied; an unmasked row in the same step stays whole.
#[test]
fn grammar_masks_are_applied_on_the_ranks() {
    let (path, file, cfg) = smollm2();
    let v = cfg.n_vocab;
    // Allowed: a few tokens spread over both ranks' vocabulary slices.
    let allowed = [17u32, 3000, 25_000, 40_000, v as u32 - 1];
    let mut mask = vec![0u32; v.div_ceil(32)];
    for t in allowed {
        strata_engine::mask_allow(&mut mask, t as usize);
    }
    for strategy in [Strategy::Tensor, Strategy::Pipeline] {
        let plan = make_plan(&file, &cfg, strategy, 2, None, CombineStyle::Gather).unwrap();
        let (rank, worker) = local_pair(&file, &path, plan, 96, 2).unwrap();
        let mut sharded = ShardedBatch::new(rank, v).unwrap();
        let mut model = Model::load_full(&file).unwrap();
        model.set_flavour(Flavour::native());
        let mut local = Batch::new(model, 1, 2, 96).unwrap();
        let mut slots = Vec::new();
        for prompt in [&[1u32, 504, 3000][..], &[9, 8, 7, 6]] {
            let (s, _) = Sequences::admit(&mut sharded, prompt, Partition::SHARED).unwrap();
            let (l, _) = Sequences::admit(&mut local, prompt, Partition::SHARED).unwrap();
            Sequences::extend(&mut sharded, s, prompt).unwrap();
            Sequences::extend(&mut local, l, prompt).unwrap();
            slots.push((s, l));
        }
        let masks = [Some(&mask[..]), None];
        let s_steps = [(slots[0].0, 42), (slots[1].0, 43)];
        let l_steps = [(slots[0].1, 42), (slots[1].1, 43)];
        let a = Sequences::step_masked(&mut sharded, &s_steps, &masks)
            .unwrap()
            .to_vec();
        // Row 0's candidates were only the allowed tokens; row 1's, every token.
        let mut counts: Vec<usize> = sharded.rows.iter().take(2).map(Vec::len).collect();
        if strategy == Strategy::Pipeline {
            // Two micro-batches of one row: only the last collected (row 1) is kept; row 0's
            // mask is checked by the logits below.
            counts = vec![allowed.len(), counts[0]];
        }
        assert_eq!(counts, [allowed.len(), v], "{strategy:?}");
        let mut b = Sequences::step(&mut local, &l_steps).unwrap().to_vec();
        for (t, l) in b[..v].iter_mut().enumerate() {
            if !allowed.contains(&(t as u32)) {
                *l = f32::NEG_INFINITY;
            }
        }
        let same = a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits());
        assert!(same, "{strategy:?}: masked step differs from one process's");
        sharded.shutdown().unwrap();
        worker.join().unwrap().unwrap();
    }
}

/// A sharded instance's embeddings are bit for bit one process's, for tensor and pipeline
/// splits and each pooling, texts shorter and longer than a prefill block; one computed while
/// two pipeline steps are in flight leaves their rows as they would have been; a text the
/// model cannot take is refused on rank 0 and the instance goes on.
#[test]
fn sharded_embeddings_match_one_process() {
    use strata_engine::embed::Pooling;
    let (path, file, cfg) = smollm2();
    let texts: Vec<Vec<u32>> = vec![
        vec![1],
        vec![1, 504, 3000, 25, 77],
        (100..100 + BLOCK as u32 + 9).collect(),
    ];
    for strategy in [Strategy::Tensor, Strategy::Pipeline] {
        let plan = make_plan(&file, &cfg, strategy, 2, None, CombineStyle::Gather).unwrap();
        let (rank, worker) = local_pair(&file, &path, plan, 2 * BLOCK, 2).unwrap();
        let mut sharded = ShardedBatch::new(rank, cfg.n_vocab).unwrap();
        let mut model = Model::load_full(&file).unwrap();
        model.set_flavour(Flavour::native());
        let mut local = Batch::new(model, 1, 2, 2 * BLOCK).unwrap();
        for text in &texts {
            for pooling in [Pooling::Mean, Pooling::Cls, Pooling::Last] {
                let a = Sequences::embed(&mut sharded, text, pooling).unwrap();
                let b = Sequences::embed(&mut local, text, pooling).unwrap();
                assert_eq!(a.len(), cfg.n_embd);
                let same = a.iter().zip(&b).all(|(x, y)| x.to_bits() == y.to_bits());
                assert!(same, "{strategy:?}, {pooling:?}, {} tokens", text.len());
            }
        }
        for bad in [&[][..], &[cfg.n_vocab as u32][..]] {
            assert!(Sequences::embed(&mut sharded, bad, Pooling::Mean).is_err());
        }
        let too_long = vec![5u32; 2 * BLOCK + 1];
        assert!(Sequences::embed(&mut sharded, &too_long, Pooling::Mean).is_err());

        // Two decode steps in flight, an embedding, then the steps' rows.
        let mut seqs = Vec::new();
        for prompt in [&[1u32, 504, 3000][..], &[7, 8]] {
            let (s, _) = Sequences::admit(&mut sharded, prompt, Partition::SHARED).unwrap();
            let (l, _) = Sequences::admit(&mut local, prompt, Partition::SHARED).unwrap();
            Sequences::extend(&mut sharded, s, prompt).unwrap();
            Sequences::extend(&mut local, l, prompt).unwrap();
            seqs.push((s, l));
        }
        let depth = Sequences::depth(&sharded);
        for (i, &(s, _)) in seqs.iter().enumerate().take(depth) {
            Sequences::submit(&mut sharded, &[(s, 42 + i as u32)], StepKind::Full).unwrap();
        }
        let a = Sequences::embed(&mut sharded, &texts[1], Pooling::Mean).unwrap();
        let b = Sequences::embed(&mut local, &texts[1], Pooling::Mean).unwrap();
        assert!(a == b, "{strategy:?}: an embedding among steps in flight");
        assert!(
            Sequences::step(&mut sharded, &[(seqs[0].0, 1)]).is_err(),
            "a step before the rows taken early are collected"
        );
        for (i, &(_, l)) in seqs.iter().enumerate().take(depth) {
            let got = Sequences::collect(&mut sharded).unwrap().to_vec();
            let want = Sequences::step(&mut local, &[(l, 42 + i as u32)])
                .unwrap()
                .to_vec();
            assert!(got == want, "{strategy:?}: row {i} after the embedding");
        }
        assert!(
            Sequences::collect(&mut sharded).is_err(),
            "nothing in flight"
        );
        sharded.shutdown().unwrap();
        worker.join().unwrap().unwrap();
    }
}
