//! A prompt whose start was computed before restores those keys and values instead of running
//! them again, and gets, bit for bit, the logits and tokens of a cold prefill: from the slot
//! that still holds them (no copy) and from the prefix cache (another slot).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use strata_engine::prefix::BLOCK;
use strata_engine::{Batch, Model, SlotId};
use strata_gguf::GgufFile;

/// A model of the store, and its tokenizer.
fn model_and_tokenizer(id: &str) -> (GgufFile, strata_tokenizer::Tokenizer) {
    let path = strata_store::Store::from_env()
        .expect("model store")
        .ensure(id)
        .expect("fetching the model");
    let file = GgufFile::open(&path).unwrap();
    let tok = strata_tokenizer::Tokenizer::from_gguf(file.metadata()).unwrap();
    (file, tok)
}

fn smollm2() -> std::path::PathBuf {
    strata_store::Store::from_env()
        .expect("model store")
        .ensure("smollm2-135m-instruct")
        .expect("fetching the default model")
}

/// Runs the rest of `prompt` from position `from` in chunks that end on multiples of
/// [`BLOCK`] (as the server prefills alone), then `n` greedy steps: the logits after the
/// prompt and the tokens.
fn finish(
    batch: &mut Batch,
    slot: SlotId,
    prompt: &[u32],
    from: usize,
    n: usize,
) -> (Vec<f32>, Vec<u32>) {
    finish_in(batch, slot, prompt, (from, BLOCK), n)
}

/// [`finish`] in chunks ending on multiples of `chunk` (16: as the server prefills while other
/// sequences generate).
fn finish_in(
    batch: &mut Batch,
    slot: SlotId,
    prompt: &[u32],
    (from, chunk): (usize, usize),
    n: usize,
) -> (Vec<f32>, Vec<u32>) {
    let mut at = from;
    let mut logits = Vec::new();
    while at < prompt.len() {
        let end = prompt.len().min((at / chunk + 1) * chunk);
        logits = batch.extend(slot, &prompt[at..end]).unwrap().to_vec();
        at = end;
    }
    let first = logits.clone();
    let mut toks = Vec::new();
    for _ in 0..n {
        let t = strata_kernels::ops::argmax(&logits) as u32;
        toks.push(t);
        logits = batch.step(&[(slot, t)]).unwrap().to_vec();
    }
    (first, toks)
}

#[test]
fn a_cached_prefix_gives_the_logits_of_a_cold_prefill() {
    let path = smollm2();
    let file = GgufFile::open(&path).unwrap();
    let tok = strata_tokenizer::Tokenizer::from_gguf(file.metadata()).unwrap();
    let para = "The committee met on Tuesday to review the budget for the coming year. \
                Several members raised concerns about the cost of the new library, the \
                repairs to the bridge, and the salaries of the park staff. ";
    let shared = tok.encode(&para.repeat(14), false).unwrap();
    assert!(shared.len() > 2 * BLOCK + 10, "{} tokens", shared.len());
    let with = |tail: &str| -> Vec<u32> {
        let mut p = shared.clone();
        p.extend(tok.encode(tail, false).unwrap());
        p
    };
    let a = with(" In the end the committee decided that");
    let b = with(" The mayor answered that");
    let c = with(" Nobody expected that the library");

    let mut cold = Batch::new(Model::load_full(&file).unwrap(), 2, 1, 2048).unwrap();
    let mut expect = |prompt: &[u32]| {
        let (slot, held) = cold.admit(prompt).unwrap();
        assert_eq!(held, 0, "no prefix cache, nothing held");
        let r = finish(&mut cold, slot, prompt, 0, 8);
        cold.release(slot);
        r
    };
    let (want_b, want_c) = (expect(&b), expect(&c));

    let mut warm = Batch::new(Model::load_full(&file).unwrap(), 2, 2, 2048)
        .unwrap()
        .with_prefix_cache(256 << 20);
    let (sa, held) = warm.admit(&a).unwrap();
    assert_eq!(held, 0);
    // Prefilled in chunks of 16 (as while other streams run): the blocks are kept all the same.
    finish_in(&mut warm, sa, &a, (0, 16), 4);
    warm.release(sa);
    let blocks = shared.len() / BLOCK;
    let stats = warm.prefix_stats().unwrap();
    assert!(stats.blocks >= blocks, "{stats:?}");
    assert!(stats.bytes > 0 && stats.bytes <= stats.budget);

    // The slot that ran `a` still holds the shared blocks: taken again, nothing is copied.
    let (sb, held) = warm.admit(&b).unwrap();
    assert_eq!(sb, sa, "the slot holding the prefix is preferred");
    assert_eq!(held, blocks * BLOCK);
    let got_b = finish(&mut warm, sb, &b, held, 8);
    assert!(
        got_b.0 == want_b.0,
        "logits after a held prefix differ from a cold prefill"
    );
    assert_eq!(got_b.1, want_b.1);

    // With that slot busy, `c` goes to the other slot and its prefix comes from the cache.
    let (sc, held) = warm.admit(&c).unwrap();
    assert_ne!(sc, sb);
    assert_eq!(held, blocks * BLOCK);
    let got_c = finish_in(&mut warm, sc, &c, (held, 16), 8);
    assert!(
        got_c.0 == want_c.0,
        "logits after a restored prefix differ from a cold prefill"
    );
    assert_eq!(got_c.1, want_c.1);
    warm.release(sb);
    warm.release(sc);

    // A prompt no longer than one block plus a token keeps a token to run; one that shares
    // nothing starts from zero.
    let short = &a[..BLOCK + 1];
    let (s, held) = warm.admit(short).unwrap();
    assert_eq!(held, BLOCK);
    warm.release(s);
    let (s, held) = warm.admit(&a[..BLOCK]).unwrap();
    assert_eq!(held, 0);
    warm.release(s);
    let other = tok.encode("Something else entirely.", false).unwrap();
    let (s, held) = warm.admit(&other).unwrap();
    assert_eq!(held, 0);
    warm.release(s);
}

#[test]
fn a_prefix_cache_too_small_for_a_block_stores_nothing_and_changes_nothing() {
    let path = smollm2();
    let file = GgufFile::open(&path).unwrap();
    let prompt: Vec<u32> = (0..(BLOCK as u32 + 40)).map(|i| 100 + i % 500).collect();
    let mut cold = Batch::new(Model::load_full(&file).unwrap(), 2, 1, 1024).unwrap();
    let (slot, _) = cold.admit(&prompt).unwrap();
    let want = finish(&mut cold, slot, &prompt, 0, 2);
    let mut tiny = Batch::new(Model::load_full(&file).unwrap(), 2, 1, 1024)
        .unwrap()
        .with_prefix_cache(1024);
    for _ in 0..2 {
        let (slot, held) = tiny.admit(&prompt).unwrap();
        let got = finish(&mut tiny, slot, &prompt, held, 2);
        assert!(got.0 == want.0);
        assert_eq!(got.1, want.1);
        tiny.release(slot);
    }
    assert_eq!(tiny.prefix_stats().unwrap().blocks, 0);
}

/// A prompt's logits do not depend on the size of the chunks it is prefilled in, among
/// multiples of 32, on either arithmetic flavour: the matrix kernels sum every row alike
/// whatever the batch (chunks of a few rows may not: some kernels tile rows), and attention
/// takes the batch order for any chunk of two or more. What lets the server prefill in chunks
/// smaller than the prefix cache's block.
#[test]
fn prefill_logits_do_not_depend_on_the_chunk_size() {
    use strata_kernels::attn::Flavour;
    for id in ["smollm2-135m-instruct", "gemma3-270m"] {
        let (file, tok) = model_and_tokenizer(id);
        let whole = tok
            .encode(
                &"The keeper lit the lamp above the grey water. ".repeat(60),
                false,
            )
            .unwrap();
        assert!(whole.len() > 2 * BLOCK, "{} tokens", whole.len());
        // The whole prompt, and one whose last 32-chunk would be 4 rows where blocks leave 36.
        for (prompt, flavour) in [&whole[..], &whole[..BLOCK + 36]]
            .into_iter()
            .flat_map(|p| [(p, Flavour::Avx512), (p, Flavour::Avx2)])
        {
            let mut logits = Vec::new();
            for chunk in [BLOCK, 64, 32, 16] {
                let mut model = Model::load_full(&file).unwrap();
                model.set_flavour(flavour);
                let mut batch = Batch::new(model, 2, 1, 1024).unwrap();
                let (slot, _) = batch.admit(prompt).unwrap();
                let mut at = 0;
                let mut last = Vec::new();
                let tail = match prompt.len() % BLOCK {
                    0 => BLOCK,
                    r => r,
                };
                while at < prompt.len() {
                    let mut end = prompt.len().min((at / chunk + 1) * chunk);
                    // The server's rule: a last chunk of fewer than 8 rows (which would take the
                    // small-batch kernels, or with one row the one-token order) joins the one
                    // before unless whole blocks leave the same one.
                    let rest = prompt.len() - end;
                    if rest > 0 && rest < 8 && tail >= 8 {
                        end = prompt.len();
                    }
                    last = batch.extend(slot, &prompt[at..end]).unwrap().to_vec();
                    at = end;
                }
                let bits: Vec<u32> = last.iter().map(|x| x.to_bits()).collect();
                logits.push((chunk, bits));
            }
            for (chunk, bits) in &logits[1..] {
                assert!(
                    bits == &logits[0].1,
                    "{id} {flavour:?} {} tokens: chunks of {chunk} differ from chunks of {BLOCK}",
                    prompt.len()
                );
            }
        }
    }
}

/// Sequences running at once with one cached prefix read its blocks in place, one copy for all,
/// and each gets, bit for bit, the logits and tokens it gets alone from a cold prefill, decoded
/// together in batched steps, on both arithmetic flavours; on Gemma 3 the window layers' runs
/// start inside a shared block.
#[test]
fn concurrent_sequences_share_one_copy_of_a_prefix_and_compute_as_alone() {
    use strata_kernels::attn::Flavour;
    for (id, blocks) in [("smollm2-135m-instruct", 2), ("gemma3-270m", 3)] {
        let (file, tok) = model_and_tokenizer(id);
        let text = "The harbour master counted the boats that came in before the storm. ";
        let mut shared = tok.encode(&text.repeat(70), false).unwrap();
        assert!(shared.len() >= blocks * BLOCK, "{} tokens", shared.len());
        shared.truncate(blocks * BLOCK);
        let prompts: Vec<Vec<u32>> = [
            " Then the keeper said",
            " The first boat was",
            " Nobody on the pier knew that",
        ]
        .iter()
        .map(|tail| {
            // Tails long enough that Gemma's 512-position window starts inside a shared block.
            let tail = format!("{tail} {}", "the wind rose and the gulls cried. ".repeat(8));
            [shared.clone(), tok.encode(&tail, false).unwrap()].concat()
        })
        .collect();
        for flavour in [Flavour::Avx512, Flavour::Avx2] {
            let load = || {
                let mut m = Model::load_full(&file).unwrap();
                m.set_flavour(flavour);
                m
            };
            let mut cold = Batch::new(load(), 2, 1, 1024).unwrap();
            let want: Vec<(Vec<f32>, Vec<u32>)> = prompts
                .iter()
                .map(|p| {
                    let (slot, _) = cold.admit(p).unwrap();
                    let r = finish(&mut cold, slot, p, 0, 6);
                    cold.release(slot);
                    r
                })
                .collect();

            let mut warm = Batch::new(load(), 2, 4, 1024)
                .unwrap()
                .with_prefix_cache(256 << 20);
            // One sequence computes the prefix and leaves it in the cache.
            let (s, _) = warm.admit(&prompts[0]).unwrap();
            finish(&mut warm, s, &prompts[0], 0, 1);
            // Three at once once it is done: each reads the cache's blocks in place, the first
            // in the slot that computed them (which lets its own copy go).
            warm.release(s);
            let mut live = Vec::new();
            for p in &prompts {
                let (slot, held) = warm.admit(p).unwrap();
                assert_eq!(held, blocks * BLOCK, "{id}");
                live.push(slot);
            }
            assert_eq!(live[0], s, "{id}: the slot holding the prefix is preferred");
            let kv = warm.kv_stats();
            let cached = warm.prefix_stats().unwrap();
            let block_bytes = cached.bytes / cached.blocks;
            assert_eq!(kv.sequences, 3);
            assert_eq!(
                kv.shared_bytes,
                blocks * block_bytes,
                "{id}: one copy, {kv:?}"
            );
            assert_eq!(
                kv.shared_read_bytes,
                3 * blocks * block_bytes,
                "{id}: {kv:?}"
            );
            assert_eq!(kv.own_bytes, 0);
            // Their tails, then decoding all three in batched steps.
            let mut logits: Vec<Vec<f32>> = Vec::new();
            for (slot, p) in live.iter().zip(&prompts) {
                logits.push(batch_extend(&mut warm, *slot, &p[blocks * BLOCK..]));
            }
            for (i, l) in logits.iter().enumerate() {
                assert!(
                    *l == want[i].0,
                    "{id} {flavour:?}: prompt {i}'s logits differ"
                );
            }
            let mut toks: Vec<Vec<u32>> = vec![Vec::new(); 3];
            for _ in 0..6 {
                let steps: Vec<(SlotId, u32)> = live
                    .iter()
                    .zip(&logits)
                    .map(|(s, l)| (*s, strata_kernels::ops::argmax(l) as u32))
                    .collect();
                for (t, (_, x)) in toks.iter_mut().zip(&steps) {
                    t.push(*x);
                }
                let rows = warm.step(&steps).unwrap();
                let vocab = rows.len() / 3;
                logits = rows.chunks(vocab).map(<[f32]>::to_vec).collect();
            }
            for (i, t) in toks.iter().enumerate() {
                assert_eq!(
                    *t, want[i].1,
                    "{id} {flavour:?}: prompt {i}'s tokens differ"
                );
            }
            let kv = warm.kv_stats();
            assert!(
                kv.own_bytes > 0 && kv.shared_bytes == blocks * block_bytes,
                "{kv:?}"
            );
        }
    }
}

/// Runs `tokens` through `slot` in one chunk per block edge; the logits after the last.
fn batch_extend(batch: &mut Batch, slot: SlotId, tokens: &[u32]) -> Vec<f32> {
    let mut last = Vec::new();
    for chunk in tokens.chunks(BLOCK) {
        last = batch.extend(slot, chunk).unwrap().to_vec();
    }
    last
}
