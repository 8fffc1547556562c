//! A prompt whose start was computed before restores those keys and values instead of running
//! them again, and gets, bit for bit, the logits and tokens of a cold prefill: from the slot
//! that still holds them (no copy) and from the prefix cache (another slot).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use strata_engine::prefix::BLOCK;
use strata_engine::{Batch, Model, SlotId};
use strata_gguf::GgufFile;

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
        let path = strata_store::Store::from_env()
            .expect("model store")
            .ensure(id)
            .expect("fetching the model");
        let file = GgufFile::open(&path).unwrap();
        let tok = strata_tokenizer::Tokenizer::from_gguf(file.metadata()).unwrap();
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
