//! Speculative decoding without a second model: drafts copied from text the sequence already
//! holds (prompt lookup), scored by the target in one pass ([`Sequences::verify`]), of which
//! the longest prefix the target itself would have produced is kept.
//!
//! Decoding one token reads every weight once; verifying `k` drafted tokens reads them once
//! too, so each accepted draft token is a weight read saved. Agents and editors copy much of
//! what they were shown (a file with a small change, repeated code, JSON, tool arguments): the
//! last few tokens then occur earlier in the sequence, and what followed them there is a good
//! guess at what follows now.
//!
//! Nothing the caller sees changes. Row `i` of a verification is bit for bit the one-token
//! step's logits, so greedy output is token for token the output without speculation, and at
//! a temperature the rejection rule of [`Sampler::sample_draft`] keeps the target's
//! distribution (the random stream is consumed differently, so a seeded run draws other
//! tokens from that same distribution).

pub mod suffix;

use std::sync::{Arc, Mutex, PoisonError};

use crate::sequences::Sequences;
use crate::{EngineError, Sampler, SlotId};
use suffix::SuffixStore;

/// A suffix store shared by the sequences of one server (see [`suffix`]).
pub type SharedAnswers = Arc<Mutex<SuffixStore>>;

/// Where drafts come from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Speculation {
    /// No drafts: one token per step.
    #[default]
    Off,
    /// Prompt lookup: what followed the latest earlier occurrence of the last few tokens.
    Ngram,
    /// Prompt lookup, and what followed the last few tokens in the server's recent answers
    /// (suffix decoding, [`suffix`]), whichever match is longer. Where there is no server
    /// (`strata run`), the same as [`Speculation::Ngram`].
    Suffix,
}

impl Speculation {
    /// The name the command line and the API take (`off`, `ngram`, `suffix`).
    pub fn name(self) -> &'static str {
        match self {
            Speculation::Off => "off",
            Speculation::Ngram => "ngram",
            Speculation::Suffix => "suffix",
        }
    }

    /// The speculation named `name`.
    pub fn from_name(name: &str) -> Option<Speculation> {
        [Speculation::Off, Speculation::Ngram, Speculation::Suffix]
            .into_iter()
            .find(|s| s.name() == name)
    }

    /// Whether drafts are made at all.
    pub fn drafts(self) -> bool {
        self != Speculation::Off
    }
}

/// The shortest run of tokens matched to find a draft when no earlier draft is being followed:
/// shorter matches (a common pair of tokens) predict little.
pub const MIN_MATCH: usize = 3;
/// The longest run of tokens compared when searching: longer matches are not told apart.
pub const MAX_MATCH: usize = 8;
/// The longest draft.
pub const MAX_DRAFT: usize = 16;
/// The draft length a sequence starts with.
const FIRST_DRAFT: usize = 4;
/// The most decode steps drafting pauses for after drafts keep failing.
const MAX_PAUSE: usize = 64;

/// Prompt-lookup drafts for one sequence, with a draft length that follows how many of its
/// drafts the target accepts.
#[derive(Clone, Debug)]
pub struct NgramDrafter {
    len: usize,
    /// The history index the last draft was copied from, past what was accepted: the next
    /// draft continues there while the copy goes on.
    follow: Option<usize>,
    /// Verifications in a row that accepted nothing, and decode steps left without drafts.
    misses: u32,
    pause: usize,
    drafted: u64,
    accepted: u64,
    /// The server's recent answers, searched beside the sequence's own history.
    answers: Option<SharedAnswers>,
    /// Where the last draft came from.
    source: Speculation,
}

impl Default for NgramDrafter {
    fn default() -> Self {
        NgramDrafter {
            len: FIRST_DRAFT,
            follow: None,
            misses: 0,
            pause: 0,
            drafted: 0,
            accepted: 0,
            answers: None,
            source: Speculation::Ngram,
        }
    }
}

impl NgramDrafter {
    /// A drafter for a new sequence.
    pub fn new() -> NgramDrafter {
        NgramDrafter::default()
    }

    /// A drafter that also copies from `answers`, the recent answers of the server it runs
    /// in ([`Speculation::Suffix`]).
    pub fn with_answers(answers: SharedAnswers) -> NgramDrafter {
        NgramDrafter {
            answers: Some(answers),
            ..NgramDrafter::default()
        }
    }

    /// Tokens drafted and accepted so far.
    pub fn counts(&self) -> (u64, u64) {
        (self.drafted, self.accepted)
    }

    /// Where the last draft came from: the sequence's own history ([`Speculation::Ngram`]) or
    /// the server's answers ([`Speculation::Suffix`]).
    pub fn source(&self) -> Speculation {
        self.source
    }

    /// Adds a finished sequence's answer to the server's answers, if this drafter reads them.
    pub fn record(&self, answer: &[u32]) {
        if let Some(a) = &self.answers {
            a.lock()
                .unwrap_or_else(PoisonError::into_inner)
                .insert(answer);
        }
    }

    /// Writes into `out` a draft of at most `limit` tokens to follow `history` (empty when
    /// none is worth verifying).
    pub fn draft(&mut self, history: &[u32], limit: usize, out: &mut Vec<u32>) {
        out.clear();
        let limit = limit.min(self.len);
        if limit == 0 || history.len() < MIN_MATCH + 1 {
            return;
        }
        if self.pause > 0 {
            self.pause -= 1;
            return;
        }
        let n = history.len();
        let from = self
            .follow
            .filter(|&j| j < n && matched(history, j, MIN_MATCH) >= MIN_MATCH)
            .map(|j| (MAX_MATCH, j))
            .or_else(|| search(history));
        self.source = Speculation::Ngram;
        // A copy being followed (or a longest match) is never beaten: no lookup then.
        let own = from.map_or(0, |f| f.0);
        if let Some(answers) = self.answers.as_ref().filter(|_| own < MAX_MATCH) {
            // The server's answers, where they match longer than the sequence itself does.
            let store = answers.lock().unwrap_or_else(PoisonError::into_inner);
            let m = store.draft(history, limit, out);
            if m > own {
                self.follow = None;
                self.source = Speculation::Suffix;
                return;
            }
            out.clear();
        }
        let Some((_, j)) = from else {
            self.follow = None;
            return;
        };
        // A match close to the end copies a repeating pattern: the copy runs on into the
        // draft itself, as an overlapping copy does.
        for i in 0..limit {
            let t = match history.get(j + i) {
                Some(&t) => t,
                None => out[j + i - n],
            };
            out.push(t);
        }
        self.follow = Some(j);
    }

    /// Records that the target accepted `accepted` of the `drafted` tokens last drafted.
    pub fn judged(&mut self, drafted: usize, accepted: usize) {
        self.drafted += drafted as u64;
        self.accepted += accepted as u64;
        if let Some(j) = self.follow.as_mut() {
            // The history grows by the accepted tokens and the target's own after them: the
            // next draft goes on from there if that token is the copy's next one too (the next
            // match checks it).
            *j += accepted + 1;
        }
        if accepted == drafted {
            self.len = (self.len * 2).min(MAX_DRAFT);
            self.misses = 0;
        } else if accepted == 0 {
            self.len = 1.max(self.len / 2);
            self.misses += 1;
            self.follow = None;
            if self.misses >= 2 {
                self.pause = (1usize << self.misses.min(6)).min(MAX_PAUSE);
            }
        } else {
            self.len = (accepted + 1).min(MAX_DRAFT);
            self.misses = 0;
        }
    }
}

/// How many tokens before history index `j` equal the last ones of `history`, up to `most`.
fn matched(history: &[u32], j: usize, most: usize) -> usize {
    run_before(history, j, history, most)
}

/// How many tokens before index `j` of `toks` equal the last ones of `history`, up to `most`.
pub(crate) fn run_before(toks: &[u32], j: usize, history: &[u32], most: usize) -> usize {
    let n = history.len();
    (1..=most.min(j).min(n))
        .take_while(|&i| toks[j - i] == history[n - i])
        .count()
}

/// The history index after the latest earlier occurrence of the longest run (at least
/// [`MIN_MATCH`], at most [`MAX_MATCH`] tokens) that ends `history`, with the run's length.
fn search(history: &[u32]) -> Option<(usize, usize)> {
    let n = history.len();
    let last = history[n - 1];
    let mut best: Option<(usize, usize)> = None;
    for j in (MIN_MATCH..n).rev() {
        if history[j - 1] != last {
            continue;
        }
        let m = matched(history, j, MAX_MATCH);
        if m >= MIN_MATCH && best.is_none_or(|(bm, _)| m > bm) {
            best = Some((m, j));
            if m == MAX_MATCH {
                break;
            }
        }
    }
    best
}

/// What one verified step did (its accepted tokens went to the history and the caller).
pub(crate) struct Verified {
    /// Why generation ended, if it did within the step.
    pub(crate) stop: Option<crate::StopReason>,
    /// The token the target chose after the accepted ones, not yet in the cache (the next
    /// step's first token), when generation goes on.
    pub(crate) next: u32,
}

/// One sequence's speculation: its drafter and the buffers of its passes.
#[derive(Debug, Default)]
pub(crate) struct Speculator {
    drafter: NgramDrafter,
    draft: Vec<u32>,
    rows: Vec<u32>,
    verified_steps: u64,
}

impl Speculator {
    /// What it did so far.
    pub(crate) fn stats(&self) -> crate::SpeculationStats {
        let (drafted, accepted) = self.drafter.counts();
        crate::SpeculationStats {
            drafted,
            accepted,
            verified_steps: self.verified_steps,
        }
    }

    /// Drafts at most `room` tokens to follow `history`, whose last token is sampled and not
    /// yet in `slot`'s cache; when there is a draft, runs that token and the draft through
    /// the target in one pass and decides each row in turn with the sampler (`None`: no
    /// draft, the caller runs a one-token step). Accepted tokens are pushed to `history` and
    /// given to `emit`, which says whether generation ends after one; the cache is cut back
    /// to what was accepted.
    pub(crate) fn step(
        &mut self,
        engine: &mut dyn Sequences,
        slot: SlotId,
        sampler: &mut Sampler,
        history: &mut Vec<u32>,
        room: usize,
        emit: &mut dyn FnMut(u32, &[u32]) -> Option<crate::StopReason>,
    ) -> Result<Option<Verified>, EngineError> {
        let Some(&tok) = history.last() else {
            return Ok(None);
        };
        self.drafter.draft(history, room, &mut self.draft);
        if self.draft.is_empty() {
            return Ok(None);
        }
        self.rows.clear();
        self.rows.push(tok);
        self.rows.extend_from_slice(&self.draft);
        self.verified_steps += 1;
        let logits = engine.verify(&[(slot, &self.rows)])?;
        let vocab = logits.len() / self.rows.len();
        let mut accepted = 0;
        let mut next = None;
        for (i, &d) in self.draft.iter().enumerate() {
            let row = &mut logits[i * vocab..(i + 1) * vocab];
            let (t, ok) = sampler.sample_draft(row, history, d);
            if !ok {
                next = Some(t);
                break;
            }
            accepted += 1;
            history.push(d);
            if let Some(stop) = emit(d, history) {
                self.drafter.judged(self.draft.len(), accepted);
                return Ok(Some(Verified {
                    stop: Some(stop),
                    next: d,
                }));
            }
        }
        let next = match next {
            Some(t) => t,
            None => {
                let k = self.draft.len();
                sampler.sample(&mut logits[k * vocab..(k + 1) * vocab], history)
            }
        };
        self.drafter.judged(self.draft.len(), accepted);
        // The cache holds `tok` and every drafted token; keep `tok` and the accepted ones.
        engine.rewind(slot, history.len())?;
        Ok(Some(Verified { stop: None, next }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_draft_copies_what_followed_the_latest_longest_match() {
        let mut d = NgramDrafter::new();
        let mut out = Vec::new();
        // "1 2 3 4 5 6 ... 1 2 3" drafts "4 5 6 7" (the first draft is 4 long).
        let h = [1, 2, 3, 4, 5, 6, 7, 8, 9, 1, 2, 3];
        d.draft(&h, 16, &mut out);
        assert_eq!(out, [4, 5, 6, 7]);
        // The longest match wins over a later, shorter one.
        let h = [9, 1, 2, 3, 50, 51, 52, 53, 8, 1, 2, 3, 60, 61, 9, 1, 2, 3];
        let mut d = NgramDrafter::new();
        d.draft(&h, 16, &mut out);
        assert_eq!(out, [50, 51, 52, 53]);
        // Of equally long ones, the latest.
        let h = [1, 2, 3, 50, 51, 1, 2, 3, 60, 61, 1, 2, 3];
        let mut d = NgramDrafter::new();
        d.draft(&h, 16, &mut out);
        assert_eq!(out, [60, 61, 1, 2]);
        // Nothing matches three tokens long: no draft.
        let mut d = NgramDrafter::new();
        d.draft(&[1, 2, 3, 4, 5, 6, 2, 3], 16, &mut out);
        assert!(out.is_empty());
        // The limit cuts the draft.
        let mut d = NgramDrafter::new();
        d.draft(&[1, 2, 3, 4, 5, 1, 2, 3], 2, &mut out);
        assert_eq!(out, [4, 5]);
        // A repeating pattern goes on repeating.
        let mut d = NgramDrafter::new();
        d.draft(&[7, 1, 2, 1, 2, 1, 2], 16, &mut out);
        assert_eq!(out, [1, 2, 1, 2]);
    }

    #[test]
    fn suffix_drafts_copy_the_servers_answers_where_they_match_longer() {
        let answers = SharedAnswers::default();
        let d0 = NgramDrafter::with_answers(answers.clone());
        d0.record(&[10, 11, 12, 13, 14, 15, 16, 17]);
        // Without a drafter of its own source, a sequence does not add to the answers.
        NgramDrafter::new().record(&[1, 2, 3, 4, 5]);
        assert_eq!(answers.lock().expect("answers").len(), (8, 1));
        let mut d = NgramDrafter::with_answers(answers.clone());
        let mut out = Vec::new();
        // Nothing in its own history: the answer's continuation.
        d.draft(&[1, 2, 11, 12, 13], 16, &mut out);
        assert_eq!(out, [14, 15, 16, 17]);
        assert_eq!(d.source(), Speculation::Suffix);
        // Its own history matches four tokens, the answer three: its own text wins.
        d.draft(&[9, 11, 12, 13, 40, 9, 11, 12, 13], 16, &mut out);
        assert_eq!(out, [40, 9, 11, 12]);
        assert_eq!(d.source(), Speculation::Ngram);
        // The answer matches four, its own text three: the answer wins.
        d.draft(&[11, 12, 13, 50, 7, 10, 11, 12, 13], 16, &mut out);
        assert_eq!(out, [14, 15, 16, 17]);
        assert_eq!(d.source(), Speculation::Suffix);
        // A plain prompt-lookup drafter never reads the answers.
        let mut plain = NgramDrafter::new();
        plain.draft(&[1, 2, 11, 12, 13], 16, &mut out);
        assert!(out.is_empty());
    }

    #[test]
    fn the_draft_length_follows_acceptance_and_failures_pause_drafting() {
        let mut d = NgramDrafter::new();
        let mut h: Vec<u32> = (0..40).chain(0..3).collect();
        let mut out = Vec::new();
        d.draft(&h, 16, &mut out);
        assert_eq!(out, [3, 4, 5, 6]);
        // Accepted whole, and the target's next token (7) follows the copy.
        h.extend_from_slice(&out);
        h.push(7);
        d.judged(4, 4);
        // Twice as long, and it goes on copying.
        d.draft(&h, 16, &mut out);
        assert_eq!(out, (8..16).collect::<Vec<u32>>());
        d.judged(8, 2);
        h.extend_from_slice(&out[..2]);
        h.push(99);
        // Two of eight, then the target's 99: the copy broke and nothing else matches.
        d.draft(&h, 16, &mut out);
        assert!(out.is_empty());
        assert_eq!(d.counts(), (12, 6));
        // Two verifications accepting nothing pause drafting for four steps.
        let mut d = NgramDrafter::new();
        let h: Vec<u32> = (0..10).chain(0..3).collect();
        for _ in 0..2 {
            d.draft(&h, 16, &mut out);
            assert!(!out.is_empty());
            d.judged(out.len(), 0);
        }
        for _ in 0..4 {
            d.draft(&h, 16, &mut out);
            assert!(out.is_empty());
        }
        d.draft(&h, 16, &mut out);
        assert!(!out.is_empty());
    }
}
