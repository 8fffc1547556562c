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
//! A block is shared, not copied, with the sequences that start with it: their caches read it
//! in place (see [`crate::KvCache`]), so concurrent sequences with one prefix hold it once.
//! Eviction passes over blocks running sequences still read while there are others to drop
//! (dropping those would free nothing).
//!
//! Blocks are kept per [`Partition`]: a prompt finds only blocks of its own partition, and a
//! free slot's leftover prompt serves only its own partition. A reused block answers its first
//! token sooner, so sharing blocks between clients would tell one what another sent; the server
//! names a partition per API key (and `cache_salt`), and all prompts share one when it is told
//! to (a single-tenant server).

use half::f16;
use std::collections::HashMap;
use std::sync::Arc;

/// Positions per cached block, and the prefill chunk that makes blocks reusable.
pub const BLOCK: usize = 256;

/// The finest grid of prefill passes whose rows compute exactly as in whole-block passes (the
/// matrix kernels' small-batch path starts under 8 rows; tested down to 16 with
/// `prefill_logits_do_not_depend_on_the_chunk_size`): blocks filled by passes of whole steps
/// of it, from multiples of it, are kept, so a server prefilling in short chunks while other
/// sequences generate still fills the cache. Divides [`BLOCK`].
pub const REUSABLE_STEP: usize = 16;

/// The id of the root of the trie (the empty prefix) of the shared partition.
pub(crate) const ROOT: u64 = 0;

/// The lowest root id of a named partition: entry ids count up from 1 and never reach it.
const NAMED: u64 = 1 << 63;

/// Which prompts may share cached blocks (see the module docs): each partition has its own root
/// in the trie, so blocks of one are never found from another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Partition(u64);

impl Partition {
    /// The partition of callers that do not name one.
    pub const SHARED: Partition = Partition(ROOT);

    /// The partition named by 63 bits of a cryptographic digest of its name (so no client can
    /// choose a name whose partition is another's).
    pub fn from_digest(digest: u64) -> Partition {
        Partition(digest | NAMED)
    }

    /// Its root's id in the trie.
    fn root(self) -> u64 {
        self.0
    }
}

/// Whether `id` is the root of a partition, not an entry.
fn is_root(id: u64) -> bool {
    id == ROOT || id >= NAMED
}

/// What a cached block's data is to the cache: its size, and whether a running sequence reads
/// it (evicting such a block frees nothing).
pub trait BlockData {
    /// Bytes the block takes.
    fn bytes(&self) -> usize;
    /// Whether a running sequence reads the block.
    fn in_use(&self) -> bool;
}

/// Keys and values of a block's positions, as [`crate::KvCache::save_block`] lays them out;
/// sequences reading the block hold it too.
impl BlockData for Arc<[f16]> {
    fn bytes(&self) -> usize {
        self.len() * 2
    }

    fn in_use(&self) -> bool {
        Arc::strong_count(self) > 1
    }
}

/// A block whose keys and values live on the ranks of a sharded instance (each its slice),
/// known to rank 0's index by the bytes it takes over all of them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Remote(pub usize);

impl BlockData for Remote {
    fn bytes(&self) -> usize {
        self.0
    }

    fn in_use(&self) -> bool {
        false
    }
}

/// One cached block.
#[derive(Debug)]
struct Entry<D> {
    parent: u64,
    tokens: Box<[u32]>,
    data: D,
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

/// The keys and values running sequences hold, for metrics: what they hold alone, and the
/// prefix blocks they read in place (shared with each other and the prefix cache).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct KvStats {
    /// Sequences running.
    pub sequences: usize,
    /// Bytes of the positions each running sequence computed itself.
    pub own_bytes: usize,
    /// Bytes of the distinct shared blocks running sequences read, each counted once.
    pub shared_bytes: usize,
    /// Bytes those blocks would take if every sequence held its own copy (the sum over
    /// sequences); `shared_bytes` of it are held.
    pub shared_read_bytes: usize,
}

/// Cached prompt blocks under a byte budget (see the module docs).
#[derive(Debug)]
pub struct PrefixCache<D = Arc<[f16]>> {
    budget: usize,
    bytes: usize,
    next_id: u64,
    clock: u64,
    evicted: u64,
    entries: HashMap<u64, Entry<D>>,
    /// `(parent, tokens)` to entry id.
    index: HashMap<(u64, Box<[u32]>), u64>,
    /// Entries evicted since [`PrefixCache::take_gone`] (whoever holds their data lets go).
    gone: Vec<u64>,
}

impl<D: BlockData> PrefixCache<D> {
    /// An empty cache that holds at most `budget` bytes of keys and values.
    pub fn new(budget: usize) -> PrefixCache<D> {
        PrefixCache {
            budget,
            bytes: 0,
            next_id: ROOT + 1,
            clock: 0,
            evicted: 0,
            entries: HashMap::new(),
            index: HashMap::new(),
            gone: Vec::new(),
        }
    }

    /// The entries evicted since the last call.
    pub fn take_gone(&mut self) -> Vec<u64> {
        std::mem::take(&mut self.gone)
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

    /// The entries of the longest cached run of whole blocks of `partition` that `tokens`
    /// starts with, in order, marking them used.
    pub(crate) fn lookup(&mut self, tokens: &[u32], partition: Partition) -> Vec<u64> {
        self.clock += 1;
        let mut chain = Vec::new();
        let mut parent = partition.root();
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
    pub(crate) fn data(&self, id: u64) -> Option<&D> {
        self.entries.get(&id).map(|e| &e.data)
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

    /// Keeps `data` as the block `block` after `parent` (which must be cached, or a root),
    /// evicting least recently used leaves to make room; `None` when it cannot be kept (too
    /// large for the budget, or its parent is gone).
    pub(crate) fn insert(&mut self, parent: u64, block: &[u32], data: D) -> Option<u64> {
        let size = data.bytes();
        if size > self.budget || (!is_root(parent) && !self.entries.contains_key(&parent)) {
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

    /// Drops the least recently used leaf other than `keep`, one no running sequence reads if
    /// there is such; false when there is no leaf to drop.
    fn evict_one(&mut self, keep: u64) -> bool {
        let victim = self
            .entries
            .iter()
            .filter(|(id, e)| e.children == 0 && **id != keep)
            .min_by_key(|(id, e)| (e.data.in_use(), e.used, **id))
            .map(|(id, _)| *id);
        let Some(id) = victim else {
            return false;
        };
        if let Some(e) = self.entries.remove(&id) {
            self.index.remove(&(e.parent, e.tokens));
            self.bytes -= e.data.bytes();
            self.evicted += 1;
            self.gone.push(id);
            if let Some(p) = self.entries.get_mut(&e.parent) {
                p.children -= 1;
            }
        }
        true
    }
}

/// A slot chosen for a prompt by [`SlotBlocks::choose`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admission {
    /// The slot.
    pub slot: usize,
    /// Whole blocks of the prompt the slot still holds (its cache is to be cut to them).
    pub kept: usize,
    /// Cached blocks that continue them, to bring into the slot in order.
    pub restore: Vec<u64>,
}

/// Which prompt blocks each slot of an engine holds, and the cache of blocks: the bookkeeping
/// of prefix reuse that the one-process engine (block data in the cache) and a sharded one
/// (data on its ranks, [`Remote`] here) share.
#[derive(Debug)]
pub struct SlotBlocks<D> {
    cache: PrefixCache<D>,
    /// Bytes of one block (checked against the budget before a block is saved).
    block_bytes: usize,
    /// Per slot, the leading tokens whose keys and values are reusable (whole blocks computed
    /// as the module docs require), kept after the slot is freed.
    held: Vec<Vec<u32>>,
    /// Per slot, the cache entries of the held blocks (shorter when a block could not be kept;
    /// then nothing after it is kept either).
    chain: Vec<Vec<u64>>,
    /// Per slot, the partition its held blocks belong to.
    owner: Vec<Partition>,
}

impl<D: BlockData> SlotBlocks<D> {
    /// Bookkeeping for `slots` slots and a cache of `budget` bytes of blocks of `block_bytes`.
    pub fn new(budget: usize, block_bytes: usize, slots: usize) -> SlotBlocks<D> {
        SlotBlocks {
            cache: PrefixCache::new(budget),
            block_bytes,
            held: vec![Vec::new(); slots],
            chain: vec![Vec::new(); slots],
            owner: vec![Partition::SHARED; slots],
        }
    }

    /// The cache.
    pub fn cache(&self) -> &PrefixCache<D> {
        &self.cache
    }

    /// Bytes of one block.
    pub fn block_bytes(&self) -> usize {
        self.block_bytes
    }

    /// The cache, to take its evictions.
    pub fn cache_mut(&mut self) -> &mut PrefixCache<D> {
        &mut self.cache
    }

    /// Picks the free slot (`busy[i]` false) that holds the most leading blocks of `prompt`
    /// of `partition` (among equals the one holding least, keeping long prefixes for prompts
    /// that want them), forgets what it holds past them, and lists the cached blocks of the
    /// partition that continue them. Only whole blocks that leave at least one token to run
    /// count. `None` when no slot is free.
    pub fn choose(
        &mut self,
        busy: &[bool],
        prompt: &[u32],
        partition: Partition,
    ) -> Option<Admission> {
        let usable = prompt.len().saturating_sub(1) / BLOCK;
        let common = |i: usize| {
            if self.owner[i] != partition {
                return 0;
            }
            self.held[i]
                .chunks_exact(BLOCK)
                .zip(prompt.chunks_exact(BLOCK))
                .take(usable)
                .take_while(|(a, b)| a == b)
                .count()
        };
        let slot = (0..self.held.len())
            .filter(|&i| !busy.get(i).copied().unwrap_or(true))
            .max_by_key(|&i| (common(i), std::cmp::Reverse(self.held[i].len())))?;
        let mut kept = common(slot);
        self.owner[slot] = partition;
        self.held[slot].truncate(kept * BLOCK);
        self.chain[slot].truncate(kept);
        let found = self.cache.lookup(&prompt[..usable * BLOCK], partition);
        // Blocks the slot computed itself that the cache holds too are read from the cache
        // instead (in place): the slot's own copy goes, and every sequence with this prefix
        // shares one.
        if kept > 0 && found.len() >= kept && found[..kept] == self.chain[slot][..] {
            kept = 0;
            self.held[slot].clear();
            self.chain[slot].clear();
        }
        let restore = if found.len() > kept && self.chain[slot].len() == kept {
            found[kept..].to_vec()
        } else {
            Vec::new()
        };
        Some(Admission {
            slot,
            kept,
            restore,
        })
    }

    /// Records that the first `n` blocks of `a.restore` were brought into the slot (the rest
    /// could not be); returns the whole blocks of `prompt` the slot now holds.
    pub fn restored(&mut self, a: &Admission, prompt: &[u32], n: usize) -> usize {
        let total = a.kept + n.min(a.restore.len());
        if total > a.kept {
            self.held[a.slot].clear();
            self.held[a.slot].extend_from_slice(&prompt[..total * BLOCK]);
            self.chain[a.slot].extend_from_slice(&a.restore[..total - a.kept]);
        }
        total
    }

    /// Forgets what `slot` holds (its cache was cleared).
    pub fn clear(&mut self, slot: usize) {
        if let (Some(h), Some(c)) = (self.held.get_mut(slot), self.chain.get_mut(slot)) {
            h.clear();
            c.clear();
        }
    }

    /// Records a pass of `tokens` at position `at` of `slot`: positions from `at` on were
    /// overwritten; when the pass continues the reusable positions on the grid of
    /// [`REUSABLE_STEP`] (whole steps from a multiple of it: the passes whose rows compute
    /// exactly as in whole-block passes) it extends them, and every block it completes is
    /// kept, `save(start)` giving the data of a block the cache lacks (`None`: not kept, and
    /// nothing after it). A pass off the grid (a decode step, a few forced tokens) ends what is
    /// reusable in the slot. Returns the blocks newly cached, as (start position, entry).
    pub fn passed(
        &mut self,
        slot: usize,
        at: usize,
        tokens: &[u32],
        mut save: impl FnMut(usize) -> Option<D>,
    ) -> Vec<(usize, u64)> {
        let mut new = Vec::new();
        let (Some(held), Some(chain), Some(&owner)) = (
            self.held.get_mut(slot),
            self.chain.get_mut(slot),
            self.owner.get(slot),
        ) else {
            return new;
        };
        if held.len() > at {
            held.truncate(at - at % BLOCK);
            chain.truncate(at / BLOCK);
        }
        if !tokens.len().is_multiple_of(REUSABLE_STEP)
            || !at.is_multiple_of(REUSABLE_STEP)
            || held.len() != at
        {
            return new;
        }
        held.extend_from_slice(tokens);
        while chain.len() < held.len() / BLOCK {
            let start = chain.len() * BLOCK;
            let block = &held[start..start + BLOCK];
            let parent = chain.last().copied().unwrap_or(owner.root());
            let id = self.cache.find(parent, block).or_else(|| {
                if !self.cache.admits(self.block_bytes) {
                    return None;
                }
                let id = self.cache.insert(parent, block, save(start)?)?;
                new.push((start, id));
                Some(id)
            });
            match id {
                Some(id) => chain.push(id),
                None => break,
            }
        }
        new
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
    fn kv(n: usize, x: f32) -> Arc<[f16]> {
        vec![f16::from_f32(x); n].into()
    }

    #[test]
    fn a_prompt_finds_its_longest_run_of_whole_cached_blocks() {
        let mut c = PrefixCache::new(1 << 20);
        let a = c.insert(ROOT, &block(1), kv(8, 1.0)).unwrap();
        let b = c.insert(a, &block(2), kv(8, 2.0)).unwrap();
        let prompt: Vec<u32> = [block(1), block(2), block(3), vec![4; 10]].concat();
        assert_eq!(c.lookup(&prompt, Partition::SHARED), vec![a, b]);
        assert_eq!(c.data(b).map(|d| &**d), Some(&*kv(8, 2.0)));
        // Same tokens after another prefix are another block.
        let other: Vec<u32> = [block(2), block(2)].concat();
        assert!(c.lookup(&other, Partition::SHARED).is_empty());
        // A partial block never matches.
        assert_eq!(c.lookup(&prompt[..BLOCK + 10], Partition::SHARED), vec![a]);
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
        c.lookup(&[block(1), block(2)].concat(), Partition::SHARED);
        let d = c.insert(b, &block(3), kv(8, 0.0)).unwrap();
        assert!(c.data(x).is_none(), "the oldest leaf was dropped");
        assert_eq!(c.stats().evicted, 1);
        // Now every block is on one chain: only the leaf d may go, and inserting its own
        // child must not evict the parent it extends.
        assert_eq!(c.insert(d, &block(4), kv(8, 0.0)), None);
        assert_eq!(
            c.lookup(&[block(1), block(2), block(3)].concat(), Partition::SHARED),
            vec![a, b, d]
        );
        // Too large for the budget, or an unknown parent: not kept.
        assert_eq!(c.insert(ROOT, &block(5), kv(25, 0.0)), None);
        assert_eq!(c.insert(999, &block(5), kv(8, 0.0)), None);
        assert!(c.stats().bytes <= 48);
    }

    #[test]
    fn blocks_running_sequences_read_are_evicted_last() {
        // Room for two blocks of 16 bytes; a sequence reads the older one.
        let mut c = PrefixCache::new(32);
        let a = c.insert(ROOT, &block(1), kv(8, 0.0)).unwrap();
        let read = c.data(a).unwrap().clone();
        let b = c.insert(ROOT, &block(2), kv(8, 0.0)).unwrap();
        c.insert(ROOT, &block(3), kv(8, 0.0)).unwrap();
        assert!(c.data(a).is_some(), "the block in use stays");
        assert!(c.data(b).is_none(), "the unused one goes, though newer");
        // Once no sequence reads it, it is an ordinary old leaf.
        drop(read);
        c.insert(ROOT, &block(4), kv(8, 0.0)).unwrap();
        assert!(c.data(a).is_none());
    }

    #[test]
    fn blocks_of_one_partition_are_never_found_from_another() {
        let (alice, bob) = (Partition::from_digest(1), Partition::from_digest(2));
        let mut slots: SlotBlocks<Arc<[f16]>> = SlotBlocks::new(1 << 20, 16, 2);
        let prompt: Vec<u32> = [block(1), block(2), vec![3; 10]].concat();
        // Alice's prompt runs in slot 0 and its two blocks are kept.
        let a = slots.choose(&[false, false], &prompt, alice).unwrap();
        assert_eq!((a.kept, a.restore.len()), (0, 0));
        let kept = slots.passed(a.slot, 0, &prompt[..2 * BLOCK], |_| Some(kv(8, 1.0)));
        assert_eq!(kept.len(), 2);
        // Bob's identical prompt finds neither the slot's leftover nor the cached blocks,
        // and the blocks he computes are his own.
        let b = slots.choose(&[true, false], &prompt, bob).unwrap();
        assert_eq!((b.kept, b.restore.len()), (0, 0));
        let b0 = slots.choose(&[false, true], &prompt, bob).unwrap();
        assert_eq!((b0.slot, b0.kept, b0.restore.len()), (0, 0, 0));
        let kept = slots.passed(b0.slot, 0, &prompt[..2 * BLOCK], |_| Some(kv(8, 2.0)));
        assert_eq!(kept.len(), 2, "Bob's blocks are kept apart from Alice's");
        // Alice, in the other slot, still finds hers; the shared partition finds none.
        let again = slots.choose(&[true, false], &prompt, alice).unwrap();
        assert_eq!(again.restore.len(), 2);
        assert_eq!(
            slots.cache().data(again.restore[1]).map(|d| &**d),
            Some(&*kv(8, 1.0))
        );
        let shared = slots
            .choose(&[true, false], &prompt, Partition::SHARED)
            .unwrap();
        assert_eq!(shared.restore.len(), 0);
    }
}
