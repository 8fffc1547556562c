//! Probe: prompt-processing speed (llama-bench's `pp`) of a catalog model, median of several
//! prefills, at each requested thread count. Set `STRATA_NO_KTILES=1` to time the per-row K-quant
//! path instead of the tiled one. Ends with a fingerprint of the prompt's logits (their bits).
//!
//! `cargo run --release -p strata-engine --example prefill_speed [MODEL] [TOKENS] [REPS] [THREADS...]`
#![allow(clippy::unwrap_used, clippy::expect_used)]

use strata_engine::Generator;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let model = args.first().map_or("gemma3-270m", String::as_str);
    let tokens: usize = args.get(1).map_or(512, |a| a.parse().unwrap());
    let reps: usize = args.get(2).map_or(5, |a| a.parse().unwrap());
    let threads: Vec<usize> = if args.len() > 3 {
        args[3..].iter().map(|a| a.parse().unwrap()).collect()
    } else {
        vec![1, 2]
    };
    let path = strata_store::Store::from_env()
        .unwrap()
        .ensure(model)
        .unwrap();
    // A fixed pseudo-random prompt of ordinary token ids.
    let prompt: Vec<u32> = (0..tokens as u32)
        .map(|i| 1000 + (i * 7919) % 20000)
        .collect();
    for &t in &threads {
        let mut g = Generator::load(&path, t, Some(tokens + 16)).unwrap();
        g.time_prefill(&prompt).unwrap();
        let mut ms: Vec<f64> = (0..reps)
            .map(|_| g.time_prefill(&prompt).unwrap().as_secs_f64() * 1e3)
            .collect();
        ms.sort_by(f64::total_cmp);
        let med = ms[ms.len() / 2];
        println!(
            "{model} pp{tokens} threads {t}: median {med:.1} ms  {:.1} tok/s  (min {:.1} max {:.1})",
            tokens as f64 * 1e3 / med,
            ms[0],
            ms[ms.len() - 1]
        );
    }
    // A fingerprint of the last token's logits, to compare paths bit for bit.
    let mut g = Generator::load(&path, threads[0], Some(tokens + 16)).unwrap();
    let logits = g.prompt_logits(&prompt).unwrap();
    let fnv = logits.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, v| {
        (h ^ u64::from(v.to_bits())).wrapping_mul(0x100_0000_01b3)
    });
    println!("{model} pp{tokens} logits fingerprint {fnv:016x}");
}
