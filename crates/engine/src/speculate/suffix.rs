//! Suffix drafts: a server's recent answers, indexed so that any sequence can copy what
//! followed its last few tokens in one of them. Agents repeat themselves across requests (the
//! same tool call with other arguments, a file rewritten again after a small change, the
//! boilerplate of every answer), and their prompts do not always hold the earlier answers:
//! prompt lookup cannot see those, this store can.

use std::collections::{HashMap, VecDeque};

use super::{MAX_MATCH, MIN_MATCH};

/// How many tokens of recent answers a store keeps by default (older answers go first).
pub const DEFAULT_CAPACITY: usize = 1 << 17;
/// The most index entries of one key compared per lookup, newest first: a key as common as
/// three spaces of indentation must not make drafting slow.
const MAX_CANDIDATES: usize = 256;

/// Recent answers and an index of every position in them by the [`MIN_MATCH`] tokens before it.
#[derive(Debug)]
pub struct SuffixStore {
    answers: VecDeque<(u64, Vec<u32>)>,
    next_id: u64,
    tokens: usize,
    capacity: usize,
    /// For each run of [`MIN_MATCH`] tokens, the (answer, position after the run) pairs, oldest
    /// first.
    index: HashMap<[u32; MIN_MATCH], Vec<(u64, u32)>>,
}

impl Default for SuffixStore {
    fn default() -> Self {
        SuffixStore::new(DEFAULT_CAPACITY)
    }
}

impl SuffixStore {
    /// An empty store of at most `capacity` tokens.
    pub fn new(capacity: usize) -> SuffixStore {
        SuffixStore {
            answers: VecDeque::new(),
            next_id: 0,
            tokens: 0,
            capacity,
            index: HashMap::new(),
        }
    }

    /// Tokens and answers held.
    pub fn len(&self) -> (usize, usize) {
        (self.tokens, self.answers.len())
    }

    /// Whether the store holds nothing.
    pub fn is_empty(&self) -> bool {
        self.answers.is_empty()
    }

    /// Adds an answer (its last `capacity` tokens, if it is longer), dropping the oldest ones
    /// past the capacity.
    pub fn insert(&mut self, answer: &[u32]) {
        let answer = &answer[answer.len().saturating_sub(self.capacity)..];
        if answer.len() <= MIN_MATCH {
            return;
        }
        let id = self.next_id;
        self.next_id += 1;
        for p in MIN_MATCH..answer.len() {
            let key = key_at(answer, p);
            self.index.entry(key).or_default().push((id, p as u32));
        }
        self.tokens += answer.len();
        self.answers.push_back((id, answer.to_vec()));
        while self.tokens > self.capacity {
            let Some((old, toks)) = self.answers.pop_front() else {
                break;
            };
            self.tokens -= toks.len();
            for p in MIN_MATCH..toks.len() {
                let key = key_at(&toks, p);
                if let Some(v) = self.index.get_mut(&key) {
                    v.retain(|&(i, _)| i != old);
                    if v.is_empty() {
                        self.index.remove(&key);
                    }
                }
            }
        }
    }

    /// The best draft of at most `limit` tokens to follow `history`: what followed the
    /// longest (up to [`MAX_MATCH`], at least [`MIN_MATCH`]) run of tokens that ends
    /// `history` in any stored answer, the newest of equally long ones. Written to `out`;
    /// returns the run's length (0: no draft).
    pub fn draft(&self, history: &[u32], limit: usize, out: &mut Vec<u32>) -> usize {
        out.clear();
        let n = history.len();
        if n < MIN_MATCH || limit == 0 {
            return 0;
        }
        let Some(cands) = self.index.get(&key_at(history, n)) else {
            return 0;
        };
        let first = self.answers.front().map_or(0, |a| a.0);
        let mut best: Option<(usize, &[u32], usize)> = None;
        for &(id, p) in cands.iter().rev().take(MAX_CANDIDATES) {
            let Some((_, toks)) = id
                .checked_sub(first)
                .and_then(|i| self.answers.get(i as usize))
            else {
                continue;
            };
            let p = p as usize;
            if p >= toks.len() {
                continue;
            }
            let m = super::run_before(toks, p, history, MAX_MATCH);
            if best.is_none_or(|(bm, _, _)| m > bm) {
                best = Some((m, toks, p));
                if m == MAX_MATCH {
                    break;
                }
            }
        }
        let Some((m, toks, p)) = best.filter(|b| b.0 >= MIN_MATCH) else {
            return 0;
        };
        out.extend_from_slice(&toks[p..(p + limit).min(toks.len())]);
        m
    }
}

/// The [`MIN_MATCH`] tokens before position `p` of `toks`.
fn key_at(toks: &[u32], p: usize) -> [u32; MIN_MATCH] {
    std::array::from_fn(|i| toks[p - MIN_MATCH + i])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_draft_continues_the_longest_newest_match_in_any_answer() {
        let mut s = SuffixStore::new(1000);
        s.insert(&[1, 2, 3, 4, 5, 6, 7]);
        s.insert(&[9, 2, 3, 4, 50, 51]);
        s.insert(&[8, 2, 3, 4, 60, 61, 62]);
        let mut out = Vec::new();
        // "1 2 3 4" matches four tokens in the first answer, three in the others.
        assert_eq!(s.draft(&[0, 1, 2, 3, 4], 8, &mut out), 4);
        assert_eq!(out, [5, 6, 7]);
        // Of equally long matches, the newest answer's; the limit cuts the draft.
        assert_eq!(s.draft(&[7, 7, 2, 3, 4], 1, &mut out), 3);
        assert_eq!(out, [60]);
        // Fewer than three tokens in common, or a match at an answer's end: no draft.
        assert_eq!(s.draft(&[5, 5, 3, 4], 8, &mut out), 0);
        assert!(out.is_empty());
        assert_eq!(s.draft(&[60, 61, 62], 8, &mut out), 0);
        // Answers too short to index are not kept.
        s.insert(&[1, 2]);
        assert_eq!(s.len(), (20, 3));
    }

    #[test]
    fn the_oldest_answers_leave_past_the_capacity() {
        let mut s = SuffixStore::new(10);
        s.insert(&[1, 2, 3, 4, 5, 6]);
        s.insert(&[7, 8, 9, 10, 11]);
        assert_eq!(s.len(), (5, 1));
        let mut out = Vec::new();
        assert_eq!(s.draft(&[1, 2, 3], 4, &mut out), 0);
        assert_eq!(s.draft(&[7, 8, 9], 4, &mut out), 3);
        assert_eq!(out, [10, 11]);
        // An answer longer than the store keeps its end.
        s.insert(&(100..120).collect::<Vec<u32>>());
        assert_eq!(s.len(), (10, 1));
        assert_eq!(s.draft(&[110, 111, 112], 2, &mut out), 3);
        assert_eq!(out, [113, 114]);
        assert_eq!(s.draft(&[7, 8, 9], 4, &mut out), 0);
        assert!(s.index.values().all(|v| v.iter().all(|&(id, _)| id == 2)));
    }
}
