//! Turning logits into the next token: greedy, or temperature sampling with top-k, top-p and
//! min-p filters, after repetition, presence and frequency penalties. A seed makes sampling
//! reproducible.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};

/// Sampling settings. The defaults are greedy decoding with no penalties.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SamplingParams {
    /// Softmax temperature; `<= 0` means greedy (argmax).
    pub temperature: f32,
    /// Keep only the `k` most likely tokens (0 = off).
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches `p` (1.0 = off).
    pub top_p: f32,
    /// Drop tokens less likely than `min_p` times the most likely one (0 = off).
    pub min_p: f32,
    /// Divide positive (multiply negative) logits of recent tokens by this (1.0 = off).
    pub repeat_penalty: f32,
    /// Subtract this from logits of tokens that appeared (0 = off).
    pub presence_penalty: f32,
    /// Subtract this times the count of each token that appeared (0 = off).
    pub frequency_penalty: f32,
    /// How many recent tokens the penalties look at.
    pub penalty_last_n: usize,
    /// Random seed.
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repeat_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            penalty_last_n: 64,
            seed: 0,
        }
    }
}

impl SamplingParams {
    /// How many of a row's greatest logits these settings read: 1 when greedy, `top_k` under
    /// top-k sampling, `None` when they need the whole row (penalties, or sampling over every
    /// token). An engine may then move only those candidates (see `Sequences::step_top`).
    pub fn reads_top(&self) -> Option<usize> {
        let penalties = self.repeat_penalty != 1.0
            || self.presence_penalty != 0.0
            || self.frequency_penalty != 0.0;
        if penalties {
            None
        } else if self.is_greedy() {
            Some(1)
        } else {
            (self.top_k > 0).then_some(self.top_k)
        }
    }

    /// Checks ranges, naming the offending parameter.
    pub fn validate(&self) -> Result<(), String> {
        let finite = |v: f32| v.is_finite();
        if !finite(self.temperature) || self.temperature < 0.0 {
            return Err(format!(
                "temperature must be >= 0, got {}",
                self.temperature
            ));
        }
        if !finite(self.top_p) || !(0.0..=1.0).contains(&self.top_p) || self.top_p == 0.0 {
            return Err(format!("top_p must be in (0, 1], got {}", self.top_p));
        }
        if !finite(self.min_p) || !(0.0..=1.0).contains(&self.min_p) {
            return Err(format!("min_p must be in [0, 1], got {}", self.min_p));
        }
        if !finite(self.repeat_penalty) || self.repeat_penalty <= 0.0 {
            return Err(format!(
                "repeat_penalty must be > 0, got {}",
                self.repeat_penalty
            ));
        }
        if !finite(self.presence_penalty) || !(-2.0..=2.0).contains(&self.presence_penalty) {
            return Err(format!(
                "presence_penalty must be in [-2, 2], got {}",
                self.presence_penalty
            ));
        }
        if !finite(self.frequency_penalty) || !(-2.0..=2.0).contains(&self.frequency_penalty) {
            return Err(format!(
                "frequency_penalty must be in [-2, 2], got {}",
                self.frequency_penalty
            ));
        }
        Ok(())
    }

    /// Whether this is plain greedy decoding (argmax, no penalties).
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0
    }
}

/// A stateful sampler (its random stream advances with each sample).
#[derive(Debug)]
pub struct Sampler {
    params: SamplingParams,
    rng: StdRng,
    candidates: Vec<(u32, f32)>,
    counts: std::collections::HashMap<u32, u32>,
}

impl Sampler {
    /// A sampler with `params`, seeded from `params.seed`.
    pub fn new(params: SamplingParams) -> Self {
        Sampler {
            rng: StdRng::seed_from_u64(params.seed),
            params,
            candidates: Vec::new(),
            counts: std::collections::HashMap::new(),
        }
    }

    /// The settings.
    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    fn apply_penalties(&mut self, logits: &mut [f32], history: &[u32]) {
        let p = &self.params;
        if p.repeat_penalty == 1.0 && p.presence_penalty == 0.0 && p.frequency_penalty == 0.0 {
            return;
        }
        self.count_recent(history);
        for (&t, &c) in &self.counts {
            if let Some(l) = logits.get_mut(t as usize) {
                *l = penalise(*l, c, &self.params);
            }
        }
    }

    /// Picks the next token from `logits` (modified in place by penalties), given the tokens so far.
    pub fn sample(&mut self, logits: &mut [f32], history: &[u32]) -> u32 {
        self.apply_penalties(logits, history);
        if self.params.is_greedy() {
            return strata_kernels::ops::argmax(logits) as u32;
        }
        let mut c = std::mem::take(&mut self.candidates);
        self.gather(logits, &mut c);
        let tok = self.pick(&mut c);
        self.candidates = c;
        tok
    }

    /// The candidates [`Sampler::filter`] starts from: every logit, or the top k in one pass
    /// (a fifth of the time of selecting among all of them; the filter keeps exactly this
    /// set).
    fn gather(&self, logits: &[f32], c: &mut Vec<(u32, f32)>) {
        c.clear();
        let k = self.params.top_k;
        if k > 1 && k <= HEAP_TOP_K && k < logits.len() {
            best_k(logits, 0, k, &[], c);
        } else {
            c.extend(logits.iter().enumerate().map(|(i, &l)| (i as u32, l)));
        }
    }

    /// Decides a drafted token `draft` against `logits` (modified in place by penalties) so
    /// that the token that comes out has exactly the distribution [`Sampler::sample`] draws
    /// from: greedy takes the argmax; otherwise the draft is kept with its probability under
    /// the filtered distribution and, if refused, a token is drawn from that distribution
    /// without it (the rejection rule of speculative sampling for a draft that proposes one
    /// token with certainty). Returns the token and whether it is the draft.
    pub fn sample_draft(&mut self, logits: &mut [f32], history: &[u32], draft: u32) -> (u32, bool) {
        self.apply_penalties(logits, history);
        if self.params.is_greedy() {
            let t = strata_kernels::ops::argmax(logits) as u32;
            return (t, t == draft);
        }
        let mut c = std::mem::take(&mut self.candidates);
        self.gather(logits, &mut c);
        self.filter(&mut c);
        let total: f32 = c.iter().map(|x| x.1).sum();
        let p = c.iter().find(|x| x.0 == draft).map_or(0.0, |x| x.1);
        let out = if self.rng.random::<f32>() * total < p {
            (draft, true)
        } else {
            c.retain(|x| x.0 != draft);
            if c.is_empty() {
                (draft, true)
            } else {
                (self.draw(&c), false)
            }
        };
        self.candidates = c;
        out
    }

    /// Picks the next token from candidates gathered from vocabulary shards (see
    /// [`shard_candidates`]): the same choice [`Sampler::sample`] makes on the full logits.
    pub fn sample_candidates(&mut self, cands: &mut Vec<(u32, f32)>, history: &[u32]) -> u32 {
        let p = &self.params;
        if p.repeat_penalty != 1.0 || p.presence_penalty != 0.0 || p.frequency_penalty != 0.0 {
            self.count_recent(history);
            for (id, l) in cands.iter_mut() {
                if let Some(&c) = self.counts.get(id) {
                    *l = penalise(*l, c, &self.params);
                }
            }
        }
        if self.params.is_greedy() {
            // The first maximum, as `argmax` on the full logits finds it.
            return cands
                .iter()
                .fold(None::<(u32, f32)>, |best, &(id, l)| match best {
                    Some((bid, bl)) if bl > l || (bl == l && bid < id) => Some((bid, bl)),
                    _ => Some((id, l)),
                })
                .map_or(0, |b| b.0);
        }
        self.pick(cands)
    }

    fn count_recent(&mut self, history: &[u32]) {
        let recent = &history[history.len().saturating_sub(self.params.penalty_last_n)..];
        self.counts.clear();
        for &t in recent {
            *self.counts.entry(t).or_insert(0) += 1;
        }
    }

    /// Temperature sampling with the top-k, min-p and top-p filters over candidates.
    fn pick(&mut self, c: &mut Vec<(u32, f32)>) -> u32 {
        self.filter(c);
        self.draw(c)
    }

    /// Turns candidate logits into the probabilities temperature sampling draws from, after
    /// the top-k, min-p and top-p filters (the survivors, best first; they may sum to less
    /// than 1 after the cuts).
    fn filter(&self, c: &mut Vec<(u32, f32)>) {
        let p = &self.params;
        let by_logit = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if p.top_k > 0 && p.top_k < c.len() {
            c.select_nth_unstable_by(p.top_k - 1, by_logit);
            c.truncate(p.top_k);
        }
        c.sort_unstable_by(by_logit);
        // Softmax with temperature over the survivors.
        let max = c.first().map_or(0.0, |x| x.1);
        let mut sum = 0.0f64;
        for x in c.iter_mut() {
            x.1 = ((x.1 - max) / p.temperature).exp();
            sum += f64::from(x.1);
        }
        for x in c.iter_mut() {
            x.1 = (f64::from(x.1) / sum) as f32;
        }
        if p.min_p > 0.0 {
            let cut = c.first().map_or(0.0, |x| x.1) * p.min_p;
            let keep = c.iter().take_while(|x| x.1 >= cut).count().max(1);
            c.truncate(keep);
        }
        if p.top_p < 1.0 {
            let mut acc = 0.0f32;
            let mut keep = c.len();
            for (i, x) in c.iter().enumerate() {
                acc += x.1;
                if acc >= p.top_p {
                    keep = i + 1;
                    break;
                }
            }
            c.truncate(keep.max(1));
        }
    }

    /// Draws a token from [`Sampler::filter`]'s probabilities.
    fn draw(&mut self, c: &[(u32, f32)]) -> u32 {
        let total: f32 = c.iter().map(|x| x.1).sum();
        let mut r = self.rng.random::<f32>() * total;
        for x in c.iter() {
            r -= x.1;
            if r <= 0.0 {
                return x.0;
            }
        }
        c.last().map_or(0, |x| x.0)
    }
}

fn penalise(l: f32, count: u32, p: &SamplingParams) -> f32 {
    let l = if l > 0.0 {
        l / p.repeat_penalty
    } else {
        l * p.repeat_penalty
    };
    l - (count as f32 * p.frequency_penalty + p.presence_penalty)
}

/// What one vocabulary shard (logits of ids `offset..offset + logits.len()`) must send so that
/// [`Sampler::sample_candidates`] on the union of all shards' candidates picks exactly the token
/// [`Sampler::sample`] would pick from the full logits: every token the penalties may change
/// (those in the recent `history`), plus the best `top_k` others by (logit, lower id) — one for
/// greedy decoding, all of them when top-k is off.
pub fn shard_candidates(
    params: &SamplingParams,
    logits: &[f32],
    offset: u32,
    history: &[u32],
    out: &mut Vec<(u32, f32)>,
) {
    out.clear();
    let penalised = params.repeat_penalty != 1.0
        || params.presence_penalty != 0.0
        || params.frequency_penalty != 0.0;
    let recent = if penalised {
        &history[history.len().saturating_sub(params.penalty_last_n)..]
    } else {
        &[]
    };
    let end = offset as usize + logits.len();
    let is_recent = |id: u32| recent.contains(&id);
    for &id in recent {
        if (offset as usize..end).contains(&(id as usize)) && !out.iter().any(|c| c.0 == id) {
            out.push((id, logits[(id - offset) as usize]));
        }
    }
    let k = if params.is_greedy() {
        1
    } else if params.top_k > 0 {
        params.top_k
    } else {
        usize::MAX
    };
    let fixed = out.len();
    if k > 1 && k <= HEAP_TOP_K && k < logits.len() {
        best_k(logits, offset, k, recent, out);
        return;
    }
    if k == 1 {
        let mut best: Option<(u32, f32)> = None;
        for (i, &l) in logits.iter().enumerate() {
            let id = offset + i as u32;
            if best.is_none_or(|b| l > b.1) && !is_recent(id) {
                best = Some((id, l));
            }
        }
        out.extend(best);
        return;
    }
    // Every logit in id order, then the recent ones (already kept above) flagged in the top
    // bit of their id and dropped: linear in the shard, not in shard x history.
    const FLAG: u32 = 1 << 31;
    out.extend(
        logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (offset + i as u32, l)),
    );
    for &id in recent {
        if (offset as usize..end).contains(&(id as usize)) {
            out[fixed + (id - offset) as usize].0 |= FLAG;
        }
    }
    if !recent.is_empty() {
        out.retain(|c| c.0 & FLAG == 0);
    }
    let rest = &mut out[fixed..];
    if k < rest.len() {
        let by_logit = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        rest.select_nth_unstable_by(k - 1, by_logit);
        out.truncate(fixed + k);
    }
}

/// Largest top-k [`best_k`] selects with its heap (beyond it, selecting in place is as fast).
const HEAP_TOP_K: usize = 256;

/// `f32::total_cmp`'s order as an integer: `key(a) < key(b)` exactly when `a.total_cmp(&b)` is
/// `Less`.
fn key(l: f32) -> i32 {
    let b = l.to_bits() as i32;
    b ^ (((b >> 31) as u32) >> 1) as i32
}

/// Appends to `out` the best `k` logits of the shard by (logit, lower id), leaving out ids in
/// `recent` (the caller already kept them): the set [`shard_candidates`]' selection over the
/// whole shard gives, in one pass over the logits and without copying them. A min-heap of the
/// kept `k` (its root the worst) sits in `out` after what is already there; a logit enters only
/// when it beats the root, which after the first few hundred is rare, so the pass is mostly
/// one integer compare per logit. On rank 0 of a tensor-parallel SmolLM2 this selection (over
/// 24,576 logits, top-k 40) ran while the other rank waited, 2.7 % of the rank's time.
fn best_k(logits: &[f32], offset: u32, k: usize, recent: &[u32], out: &mut Vec<(u32, f32)>) {
    let base = out.len();
    // Heap entries order as (key, reversed id): the root is the smallest logit, and among equal
    // logits the highest id (the one the order ranks last).
    let worse = |a: &(u32, f32), b: &(u32, f32)| -> bool {
        let (ka, kb) = (key(a.1), key(b.1));
        ka < kb || (ka == kb && a.0 > b.0)
    };
    let sift_down = |heap: &mut [(u32, f32)], mut i: usize| {
        loop {
            let (l, r) = (2 * i + 1, 2 * i + 2);
            let mut m = i;
            if l < heap.len() && worse(&heap[l], &heap[m]) {
                m = l;
            }
            if r < heap.len() && worse(&heap[r], &heap[m]) {
                m = r;
            }
            if m == i {
                return;
            }
            heap.swap(i, m);
            i = m;
        }
    };
    let mut i = 0;
    // Fill the heap with the first k eligible logits.
    while i < logits.len() && out.len() - base < k {
        let id = offset + i as u32;
        if !recent.contains(&id) {
            out.push((id, logits[i]));
        }
        i += 1;
    }
    let heap = &mut out[base..];
    for j in (0..heap.len() / 2).rev() {
        sift_down(heap, j);
    }
    if heap.len() < k {
        return;
    }
    let mut worst = key(heap[0].1);
    // Sixteen logits at a time: their greatest key (a vector max) usually says none enters.
    const CHUNK: usize = 16;
    for (c, chunk) in logits[i..].chunks(CHUNK).enumerate() {
        if chunk.iter().fold(i32::MIN, |m, &l| m.max(key(l))) <= worst {
            continue;
        }
        for (j, &l) in chunk.iter().enumerate() {
            // Ids rise through the pass, so an equal logit ranks below the root: only a
            // greater one enters.
            if key(l) <= worst {
                continue;
            }
            let id = offset + (i + c * CHUNK + j) as u32;
            if recent.contains(&id) {
                continue;
            }
            heap[0] = (id, l);
            sift_down(heap, 0);
            worst = key(heap[0].1);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn logits() -> Vec<f32> {
        vec![1.0, 3.0, 2.0, 0.5, 2.9]
    }

    /// A row holding only its `k` greatest logits (the rest minus infinity, as a sharded
    /// instance fills it) samples exactly as the whole row does under top-k (with k at most
    /// that), whatever temperature, min-p and top-p follow.
    #[test]
    fn a_row_of_its_top_k_samples_as_the_whole_row() {
        let full: Vec<f32> = (0..300u32)
            .map(|i| ((i * 7919 % 101) as f32 * 0.37).sin() * 4.0)
            .collect();
        for (k, kept) in [(1usize, 1usize), (5, 5), (5, 12), (40, 40)] {
            let mut order: Vec<usize> = (0..full.len()).collect();
            order.sort_by(|&a, &b| full[b].total_cmp(&full[a]).then(a.cmp(&b)));
            let mut sparse = vec![f32::NEG_INFINITY; full.len()];
            for &i in &order[..kept] {
                sparse[i] = full[i];
            }
            let params = SamplingParams {
                temperature: if k == 1 { 0.0 } else { 0.8 },
                top_k: k,
                top_p: 0.9,
                min_p: 0.02,
                seed: 11,
                ..SamplingParams::default()
            };
            let (mut a, mut b) = (Sampler::new(params.clone()), Sampler::new(params));
            for _ in 0..200 {
                let x = a.sample(&mut full.clone(), &[]);
                let y = b.sample(&mut sparse.clone(), &[]);
                assert_eq!(x, y, "k {k}, {kept} kept");
            }
        }
    }

    #[test]
    fn greedy_is_argmax() {
        let mut s = Sampler::new(SamplingParams::default());
        assert_eq!(s.sample(&mut logits(), &[]), 1);
    }

    #[test]
    fn same_seed_same_tokens_different_seed_differs() {
        let run = |seed| {
            let mut s = Sampler::new(SamplingParams {
                temperature: 1.5,
                seed,
                ..SamplingParams::default()
            });
            (0..64)
                .map(|_| s.sample(&mut logits(), &[]))
                .collect::<Vec<_>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
    }

    #[test]
    fn top_k_one_is_greedy() {
        let mut s = Sampler::new(SamplingParams {
            temperature: 5.0,
            top_k: 1,
            ..SamplingParams::default()
        });
        for _ in 0..50 {
            assert_eq!(s.sample(&mut logits(), &[]), 1);
        }
    }

    /// Deciding a draft keeps the sampler's distribution: over many draws, each token comes
    /// out as often with a draft of any token (in or out of the support) as `sample` draws
    /// it, and greedy keeps the argmax whatever the draft.
    #[test]
    fn a_decided_draft_keeps_the_distribution() {
        let draws = 40_000;
        let settings = [
            SamplingParams {
                temperature: 0.8,
                ..SamplingParams::default()
            },
            SamplingParams {
                temperature: 1.3,
                top_k: 3,
                top_p: 0.9,
                ..SamplingParams::default()
            },
        ];
        for params in settings {
            let mut s = Sampler::new(params.clone());
            let mut want = [0f64; 5];
            for _ in 0..draws {
                want[s.sample(&mut logits(), &[]) as usize] += 1.0;
            }
            for draft in 0..5u32 {
                let mut s = Sampler::new(SamplingParams {
                    seed: 7 + u64::from(draft),
                    ..params.clone()
                });
                let mut got = [0f64; 5];
                let mut kept = 0;
                for _ in 0..draws {
                    let (t, ok) = s.sample_draft(&mut logits(), &[], draft);
                    assert_eq!(ok, t == draft);
                    kept += usize::from(ok);
                    got[t as usize] += 1.0;
                }
                for t in 0..5 {
                    let (g, w) = (got[t] / draws as f64, want[t] / draws as f64);
                    assert!(
                        (g - w).abs() < 0.012,
                        "{params:?}, draft {draft}: token {t} {g} vs {w}"
                    );
                }
                // A draft is kept as often as the sampler would draw it.
                let p = want[draft as usize] / draws as f64;
                assert!((kept as f64 / draws as f64 - p).abs() < 0.012);
            }
        }
        let mut greedy = Sampler::new(SamplingParams::default());
        assert_eq!(greedy.sample_draft(&mut logits(), &[], 1), (1, true));
        assert_eq!(greedy.sample_draft(&mut logits(), &[], 4), (1, false));
    }

    #[test]
    fn top_p_and_min_p_restrict_the_support() {
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            min_p: 0.5,
            ..SamplingParams::default()
        });
        for _ in 0..200 {
            let t = s.sample(&mut logits(), &[]);
            assert!([1, 2, 4].contains(&t), "{t}");
        }
        let mut s = Sampler::new(SamplingParams {
            temperature: 1.0,
            top_p: 0.3,
            ..SamplingParams::default()
        });
        for _ in 0..200 {
            assert_eq!(s.sample(&mut logits(), &[]), 1);
        }
    }

    #[test]
    fn penalties_push_away_from_history() {
        let mut s = Sampler::new(SamplingParams {
            repeat_penalty: 2.0,
            ..SamplingParams::default()
        });
        // 3.0 / 2 = 1.5 < 2.9
        assert_eq!(s.sample(&mut logits(), &[1]), 4);
        let mut s = Sampler::new(SamplingParams {
            frequency_penalty: 1.5,
            ..SamplingParams::default()
        });
        // 3.0 - 1.5 and 2.9 - 1.5 both fall below token 2's 2.0.
        assert_eq!(s.sample(&mut logits(), &[1, 4]), 2);
    }

    /// Splits random logits into uneven shards and checks that sampling from the gathered
    /// candidates picks what sampling from the full logits picks, for every kind of setting.
    #[test]
    fn shard_candidates_reproduce_full_sampling() {
        use rand::Rng;
        let mut rng = StdRng::seed_from_u64(3);
        let settings = [
            SamplingParams::default(),
            SamplingParams {
                repeat_penalty: 1.3,
                ..SamplingParams::default()
            },
            SamplingParams {
                temperature: 0.8,
                top_k: 5,
                frequency_penalty: 0.5,
                ..SamplingParams::default()
            },
            SamplingParams {
                temperature: 1.0,
                top_p: 0.9,
                min_p: 0.05,
                presence_penalty: -0.7,
                ..SamplingParams::default()
            },
        ];
        for params in settings {
            for seed in 0..40u64 {
                // Coarse values make ties common.
                let logits: Vec<f32> = (0..200)
                    .map(|_| rng.random_range(0..40) as f32 / 4.0)
                    .collect();
                let history: Vec<u32> = (0..30).map(|_| rng.random_range(0..200)).collect();
                let p = SamplingParams {
                    seed,
                    ..params.clone()
                };
                let want = Sampler::new(p.clone()).sample(&mut logits.clone(), &history);
                let mut all = Vec::new();
                let mut part = Vec::new();
                for r in [0..64usize, 64..96, 96..200] {
                    shard_candidates(&p, &logits[r.clone()], r.start as u32, &history, &mut part);
                    all.extend_from_slice(&part);
                }
                let got = Sampler::new(p.clone()).sample_candidates(&mut all, &history);
                assert_eq!(got, want, "{p:?}");
            }
        }
    }

    /// The heap selection keeps exactly the set the in-place selection keeps, ties, recent
    /// ids and NaN included.
    #[test]
    fn best_k_selects_what_selecting_in_place_selects() {
        use rand::Rng;
        let mut rng = StdRng::seed_from_u64(7);
        let by_logit = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        for round in 0..300 {
            let n = rng.random_range(1..600);
            let coarse = round % 2 == 0;
            let mut logits: Vec<f32> = (0..n)
                .map(|_| {
                    if coarse {
                        rng.random_range(-8..8) as f32 / 2.0
                    } else {
                        rng.random_range(-20.0..20.0)
                    }
                })
                .collect();
            if round % 7 == 0 {
                logits[0] = f32::NAN;
                logits[n / 2] = -0.0;
                logits[n - 1] = f32::INFINITY;
            }
            let offset = rng.random_range(0..1000u32);
            let recent: Vec<u32> = (0..rng.random_range(0..20))
                .map(|_| offset + rng.random_range(0..n as u32 + 5))
                .collect();
            let k = rng.random_range(2..HEAP_TOP_K.min(n + 3) + 1);
            let mut want: Vec<(u32, f32)> = (0..n)
                .map(|i| (offset + i as u32, logits[i]))
                .filter(|c| !recent.contains(&c.0))
                .collect();
            want.sort_unstable_by(by_logit);
            want.truncate(k);
            let mut got = vec![(u32::MAX, 0.0)];
            best_k(&logits, offset, k, &recent, &mut got);
            assert_eq!(got[0].0, u32::MAX, "what was in `out` stays");
            let mut got = got.split_off(1);
            got.sort_unstable_by(by_logit);
            let bits =
                |v: &[(u32, f32)]| v.iter().map(|c| (c.0, c.1.to_bits())).collect::<Vec<_>>();
            assert_eq!(bits(&got), bits(&want), "n {n} k {k} offset {offset}");
        }
    }

    #[test]
    fn validation_names_the_parameter() {
        let p = SamplingParams {
            top_p: 1.5,
            ..SamplingParams::default()
        };
        assert!(
            p.validate()
                .expect_err("top_p 1.5 is invalid")
                .contains("top_p")
        );
    }
}
