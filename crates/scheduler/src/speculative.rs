//! Decode rounds with speculative drafts (see [`strata_engine::speculate`]). Each decoding
//! sequence that may speculate drafts from its own history; the round runs every decoding
//! sequence's last token, and its draft if it has one, through the engine in one verification
//! pass (a sequence without a draft gets one row, bit for bit its decode step's), then decides
//! each sequence's rows in order with its own sampler. What a sequence generates is what it
//! generates without drafts; only the number of passes changes.

use strata_engine::Sequences;
use strata_engine::SlotId;
use strata_engine::speculate::Speculation;
use strata_tokenizer::Tokenizer;

use super::{Seq, fail_all};
use crate::metrics::{DraftLabels, Metrics};

/// The buffers of the rounds, kept across them.
#[derive(Debug, Default)]
pub(super) struct Drafts {
    /// Each sequence's draft, then its last token and draft (the pass's rows).
    drafts: Vec<Vec<u32>>,
    rows: Vec<Vec<u32>>,
    /// What each sequence that goes on keeps in its cache, and which sequences ended.
    keep: Vec<(SlotId, usize)>,
    gone: Vec<bool>,
}

impl Seq {
    /// Decides a verification pass's `rows` (one per token of `[last] + draft`, `vocab` wide):
    /// each drafted token in turn is kept or refused by the sampler, the tokens that come out
    /// are reported, and after a whole accepted draft the last row is sampled as a decode
    /// step's. Returns whether the sequence goes on and how many drafted tokens were accepted.
    fn decide(
        &mut self,
        rows: &mut [f32],
        vocab: usize,
        draft: &[u32],
        tok: &Tokenizer,
        n_ctx: usize,
        m: &Metrics,
    ) -> (bool, usize) {
        for (j, &d) in draft.iter().enumerate() {
            let row = &mut rows[j * vocab..(j + 1) * vocab];
            let (id, ok) = self.sampler.sample_draft(row, &self.history, d);
            if !self.emit(id, None, tok, m) || self.finish(tok.is_eog(id), false, n_ctx) {
                return (false, j + usize::from(ok));
            }
            if !ok {
                return (true, j);
            }
        }
        let k = draft.len();
        let goes_on = self.advance(&mut rows[k * vocab..(k + 1) * vocab], tok, n_ctx, m);
        (goes_on, k)
    }
}

/// Runs a decode round of the sequences `idx` (indices into `active`, every one decoding)
/// with drafts; `false` when none of them drafted (the caller runs its usual step). Sequences
/// that end leave `active` and their slots.
pub(super) fn round(
    batch: &mut dyn Sequences,
    active: &mut Vec<Seq>,
    idx: &[usize],
    d: &mut Drafts,
    tok: &Tokenizer,
    n_ctx: usize,
    m: &Metrics,
) -> bool {
    if d.drafts.len() < idx.len() {
        d.drafts.resize_with(idx.len(), Vec::new);
        d.rows.resize_with(idx.len(), Vec::new);
    }
    let mut any = false;
    for (k, &i) in idx.iter().enumerate() {
        let s = &mut active[i];
        let draft = &mut d.drafts[k];
        draft.clear();
        if let Some(drafter) = s.drafter.as_mut() {
            // Each drafted token counts against the budget, and the pass needs room for all.
            let used = s.job.prompt.len() + s.generated;
            let room =
                (s.job.max_tokens.saturating_sub(s.generated)).min(n_ctx.saturating_sub(used + 1));
            drafter.draft(&s.history, room, draft);
            any |= !draft.is_empty();
        }
        let row = &mut d.rows[k];
        row.clear();
        row.push(s.last);
        row.extend_from_slice(draft);
    }
    if !any {
        return false;
    }
    let items: Vec<(SlotId, &[u32])> = idx
        .iter()
        .zip(&d.rows)
        .map(|(&i, r)| (active[i].slot, r.as_slice()))
        .collect();
    let logits = match batch.verify(&items) {
        Ok(l) => l,
        Err(e) => {
            fail_all(batch, active, &e);
            return true;
        }
    };
    m.verify_passes.inc();
    let total: usize = d.rows[..idx.len()].iter().map(Vec::len).sum();
    let vocab = logits.len() / total.max(1);
    let sources = [Speculation::Ngram, Speculation::Suffix].map(|s| DraftLabels {
        source: s.name().into(),
    });
    d.keep.clear();
    d.gone.clear();
    d.gone.resize(active.len(), false);
    let mut at = 0;
    for (k, &i) in idx.iter().enumerate() {
        let n = d.rows[k].len();
        let rows = &mut logits[at * vocab..(at + n) * vocab];
        at += n;
        let s = &mut active[i];
        let draft = &d.drafts[k];
        // The cache held all of the history but its last token; the pass added that token
        // and the draft.
        let before = s.history.len();
        let (goes_on, accepted) = s.decide(rows, vocab, draft, tok, n_ctx, m);
        if let Some(drafter) = s.drafter.as_mut().filter(|_| !draft.is_empty()) {
            drafter.judged(draft.len(), accepted);
            let source = &sources[usize::from(drafter.source() == Speculation::Suffix)];
            m.drafted_tokens
                .get_or_create(source)
                .inc_by(draft.len() as u64);
            m.accepted_tokens
                .get_or_create(source)
                .inc_by(accepted as u64);
        }
        if goes_on {
            // It keeps that token and the accepted part of the draft; the token chosen after
            // them runs next.
            d.keep.push((s.slot, before + accepted));
        } else {
            d.gone[i] = true;
        }
    }
    for &(slot, len) in &d.keep {
        if let Err(e) = batch.rewind(slot, len) {
            fail_all(batch, active, &e);
            return true;
        }
    }
    let mut i = 0;
    active.retain(|s| {
        let gone = d.gone.get(i).copied().unwrap_or(false);
        i += 1;
        if gone {
            batch.release(s.slot);
        }
        !gone
    });
    true
}
