//! A cache of prompt prefixes: the keys and values of whole blocks of [`BLOCK`] positions,
//! kept after their sequence ends so a later prompt that starts with the same tokens restores
//! them instead of running them through the model again.
//!
//! Reuse is bit exact because a block is only ever kept when it was computed by one pass of
//! exactly [`BLOCK`] tokens at a position that is a multiple of [`BLOCK`], on top of a cache
//! that was itself restored or computed that way. A cold prompt prefilled in aligned chunks of
//! [`BLOCK`] (as the server does) runs the very same passes, so restored keys and values are
//! the ones it would have computed. (Not every kernel is row independent across pass sizes:
//! a pass of a few rows can differ in the last bits, as Gemma 3's Q4_K weights do in 7-token
//! chunks; passes of multiples of 32 agree on the models tested, see the test
//! `prefill_logits_do_not_depend_on_the_chunk_size`.)
//!
//! Blocks form a trie: an entry is named by its parent entry and its own tokens, compared in
//! full, so two prompts can never be confused by a hash collision. Entries are evicted least
//! recently used first under a byte budget, leaves before the blocks they extend; keys and
//! values are kept as f16 (the cache rounds them to f16 on the way in, so this loses nothing).

use half::f16;
use std::collections::HashMap;

/// Positions per cached block, and the prefill chunk that makes blocks reusable.
pub const BLOCK: usize = 256;

/// The finest grid of prefill passes whose rows compute exactly as in whole-block passes (the
/// matrix kernels' small-batch path starts under 8 rows; tested down to 16 with
/// `prefill_logits_do_not_depend_on_the_chunk_size`): blocks filled by passes of whole steps
/// of it, from multiples of it, are kept, so a server prefilling in short chunks while other
/// sequences generate still fills the cache. Divides [`BLOCK`].
pub const REUSABLE_STEP: usize = 16;

/// The id of the root of the trie (the empty prefix).
pub(crate) const ROOT: u64 = 0;

/// One cached block.
#[derive(Debug)]
struct Entry {
    parent: u64,
    tokens: Box<[u32]>,
    /// Keys and values of the block's positions, as [`crate::KvCache::save_block`] lays them out.
    data: Box<[f16]>,
    /// Blocks that extend this one.
    children: usize,
    /// The clock reading of the last use.
    used: u64,
}

/// What the cache holds and has done, for metrics.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PrefixStats {
    /// Bytes of keys and values held.
    pub bytes: usize,
    /// The byte budget.
    pub budget: usize,
    /// Blocks held.
    pub blocks: usize,
    /// Blocks dropped to stay within the budget, since start.
    pub evicted: u64,
}

/// Cached prompt blocks under a byte budget (see the module docs).
#[derive(Debug)]
pub struct PrefixCache {
    budget: usize,
    bytes: usize,
    next_id: u64,
    clock: u64,
    evicted: u64,
    entries: HashMap<u64, Entry>,
    /// `(parent, tokens)` to entry id.
    index: HashMap<(u64, Box<[u32]>), u64>,
}

impl PrefixCache {
    /// An empty cache that holds at most `budget` bytes of keys and values.
    pub fn new(budget: usize) -> PrefixCache {
        PrefixCache {
            budget,
            bytes: 0,
            next_id: ROOT + 1,
            clock: 0,
            evicted: 0,
            entries: HashMap::new(),
            index: HashMap::new(),
        }
    }

    /// What the cache holds.
    pub fn stats(&self) -> PrefixStats {
        PrefixStats {
            bytes: self.bytes,
            budget: self.budget,
            blocks: self.entries.len(),
            evicted: self.evicted,
        }
    }

    /// The entries of the longest cached run of whole blocks that `tokens` starts with, in
    /// order, marking them used.
    pub(crate) fn lookup(&mut self, tokens: &[u32]) -> Vec<u64> {
        self.clock += 1;
        let mut chain = Vec::new();
        let mut parent = ROOT;
        for block in tokens.chunks_exact(BLOCK) {
            // A borrowed key would need a custom lookup; one allocation per block is nothing
            // next to the copy of its keys and values.
            let Some(&id) = self.index.get(&(parent, Box::from(block))) else {
                break;
            };
            if let Some(e) = self.entries.get_mut(&id) {
                e.used = self.clock;
            }
            chain.push(id);
            parent = id;
        }
        chain
    }

    /// The keys and values of entry `id`.
    pub(crate) fn data(&self, id: u64) -> Option<&[f16]> {
        self.entries.get(&id).map(|e| &*e.data)
    }

    /// The entry for `block` after `parent`, if cached (marking it used).
    pub(crate) fn find(&mut self, parent: u64, block: &[u32]) -> Option<u64> {
        let id = *self.index.get(&(parent, Box::from(block)))?;
        self.clock += 1;
        if let Some(e) = self.entries.get_mut(&id) {
            e.used = self.clock;
        }
        Some(id)
    }

    /// Whether a block of `bytes` could be kept at all.
    pub(crate) fn admits(&self, bytes: usize) -> bool {
        bytes <= self.budget
    }

    /// Keeps `data` as the block `block` after `parent` (which must be cached, or the root),
    /// evicting least recently used leaves to make room; `None` when it cannot be kept (too
    /// large for the budget, or its parent is gone).
    pub(crate) fn insert(&mut self, parent: u64, block: &[u32], data: Box<[f16]>) -> Option<u64> {
        let size = data.len() * 2;
        if size > self.budget || (parent != ROOT && !self.entries.contains_key(&parent)) {
            return None;
        }
        if let Some(id) = self.find(parent, block) {
            return Some(id);
        }
        while self.bytes + size > self.budget {
            if !self.evict_one(parent) {
                return None;
            }
        }
        self.clock += 1;
        let id = self.next_id;
        self.next_id += 1;
        if let Some(p) = self.entries.get_mut(&parent) {
            p.children += 1;
        }
        self.bytes += size;
        self.index.insert((parent, Box::from(block)), id);
        self.entries.insert(
            id,
            Entry {
                parent,
                tokens: Box::from(block),
                data,
                children: 0,
                used: self.clock,
            },
        );
        Some(id)
    }

    /// Drops the least recently used leaf other than `keep`; false when there is none.
    fn evict_one(&mut self, keep: u64) -> bool {
        let victim = self
            .entries
            .iter()
            .filter(|(id, e)| e.children == 0 && **id != keep)
            .min_by_key(|(id, e)| (e.used, **id))
            .map(|(id, _)| *id);
        let Some(id) = victim else {
            return false;
        };
        if let Some(e) = self.entries.remove(&id) {
            self.index.remove(&(e.parent, e.tokens));
            self.bytes -= e.data.len() * 2;
            self.evicted += 1;
            if let Some(p) = self.entries.get_mut(&e.parent) {
                p.children -= 1;
            }
        }
        true
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn block(x: u32) -> Vec<u32> {
        vec![x; BLOCK]
    }

    /// `n` halves of value `x` (2n bytes).
    fn kv(n: usize, x: f32) -> Box<[f16]> {
        vec![f16::from_f32(x); n].into()
    }

    #[test]
    fn a_prompt_finds_its_longest_run_of_whole_cached_blocks() {
        let mut c = PrefixCache::new(1 << 20);
        let a = c.insert(ROOT, &block(1), kv(8, 1.0)).unwrap();
        let b = c.insert(a, &block(2), kv(8, 2.0)).unwrap();
        let prompt: Vec<u32> = [block(1), block(2), block(3), vec![4; 10]].concat();
        assert_eq!(c.lookup(&prompt), vec![a, b]);
        assert_eq!(c.data(b), Some(&*kv(8, 2.0)));
        // Same tokens after another prefix are another block.
        let other: Vec<u32> = [block(2), block(2)].concat();
        assert!(c.lookup(&other).is_empty());
        // A partial block never matches.
        assert_eq!(c.lookup(&prompt[..BLOCK + 10]), vec![a]);
        // Inserting what is there gives the same entry and costs nothing.
        let before = c.stats();
        assert_eq!(c.insert(a, &block(2), kv(8, 9.0)), Some(b));
        assert_eq!(c.stats(), before);
        assert_eq!(before.bytes, 32);
        assert_eq!(before.blocks, 2);
    }

    #[test]
    fn the_least_recently_used_leaf_goes_first_and_parents_outlive_their_children() {
        // Room for three blocks of 16 bytes.
        let mut c = PrefixCache::new(48);
        let a = c.insert(ROOT, &block(1), kv(8, 0.0)).unwrap();
        let b = c.insert(a, &block(2), kv(8, 0.0)).unwrap();
        let x = c.insert(ROOT, &block(7), kv(8, 0.0)).unwrap();
        // Use the chain a-b again: x is now the oldest leaf.
        c.lookup(&[block(1), block(2)].concat());
        let d = c.insert(b, &block(3), kv(8, 0.0)).unwrap();
        assert!(c.data(x).is_none(), "the oldest leaf was dropped");
        assert_eq!(c.stats().evicted, 1);
        // Now every block is on one chain: only the leaf d may go, and inserting its own
        // child must not evict the parent it extends.
        assert_eq!(c.insert(d, &block(4), kv(8, 0.0)), None);
        assert_eq!(
            c.lookup(&[block(1), block(2), block(3)].concat()),
            vec![a, b, d]
        );
        // Too large for the budget, or an unknown parent: not kept.
        assert_eq!(c.insert(ROOT, &block(5), kv(25, 0.0)), None);
        assert_eq!(c.insert(999, &block(5), kv(8, 0.0)), None);
        assert!(c.stats().bytes <= 48);
    }
}
