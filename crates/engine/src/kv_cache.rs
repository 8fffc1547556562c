//! The key/value cache of one sequence on one shard.
//!
//! Keys and values are stored as f16, as llama.cpp's default cache holds them (which greedy
//! parity depends on): half the memory of f32 and half the bytes read per token at depth. The
//! attention kernels convert them to f32 as they load them (exactly), so the arithmetic is the
//! f32 arithmetic it was. Memory is reserved up front for the context size; pages are only
//! touched as positions fill.
//!
//! Keys are stored by position (a row of `head_dim` each), values transposed (a row per
//! dimension over the positions, as llama.cpp's cache holds them without flash attention): a
//! weighted sum of values is then a dot product of the probabilities with each row, which the
//! attention kernels compute for several query heads at once. The transposed values are kept in
//! tiles of [`BLOCK`] positions (every dimension's row of a tile, then the next tile), the
//! layout of a prefix-cache block: storing a position writes into one tile (`v_dim` x 256
//! halves, 32 KB for 64 dimensions) instead of one cache line in each of `v_dim` rows a whole
//! context apart (a TLB miss each), a short
//! sequence touches a tile's pages instead of a page per dimension, and attention reads a
//! tile's rows as one stream.
//!
//! A cache may start with blocks of [`BLOCK`] positions it shares with the prefix cache and with
//! other sequences (a prompt prefix computed once): those are read in place, never copied, and
//! the cache's own memory holds only the positions after them. Attention reads a sequence's
//! positions as runs (each shared block, then its own positions), which the kernels sum as one
//! row, so a sequence computes bit for bit what it would over a private copy.

use crate::prefix::BLOCK;
use half::f16;
use half::slice::HalfFloatSliceExt;
use half::vec::HalfBitsVecExt;
use std::sync::Arc;
use strata_kernels::attn::ValueRun;
use strata_kernels::ops;

/// `total` zeroed halves, or `None` when the memory cannot be reserved. Probed first, so an
/// impossible size is an error rather than an abort; then taken zeroed, so the kernel supplies
/// pages only as positions fill. (Zeroed `u16`s come from calloc untouched; `vec![f16::ZERO; n]`
/// would write every page.)
fn zeroed(total: usize) -> Option<Vec<f16>> {
    let mut probe: Vec<f16> = Vec::new();
    probe.try_reserve_exact(total).ok()?;
    drop(probe);
    Some(vec![0u16; total].reinterpret_into())
}

/// Own positions past which dropping them all gives their memory back (below it, keeping the
/// pages for the next sequence costs less than faulting them in again).
const RELEASE_BYTES: usize = 16 << 20;

/// Keys and values for `n_layers x n_kv_heads x n_ctx` positions, keys `head_dim` wide and
/// values `v_dim` (equal but under multi-head latent attention, whose values are the first
/// `v_dim` elements of its keys).
#[derive(Debug)]
pub struct KvCache {
    n_kv_heads: usize,
    n_ctx: usize,
    head_dim: usize,
    v_dim: usize,
    /// Positions filled, the shared ones included.
    len: usize,
    /// Positions `0..shared.len() * BLOCK`, read in place from blocks laid out as
    /// [`KvCache::save_block`] lays them out (other sequences and the prefix cache may hold the
    /// same blocks). The cache's own arrays start after them.
    shared: Vec<Arc<[f16]>>,
    /// `[layer][head][position][dim]`, own positions from the first after the shared blocks.
    k: Vec<f16>,
    /// `[layer][head][tile][dim][position in tile]`, tiles of [`BLOCK`] positions (a multiple
    /// of every attention order's step, so a weighted sum over padded positions stays inside
    /// its tile); past the filled positions, zero or values of an earlier sequence (finite
    /// either way: weighted sums give them weight zero).
    v: Vec<f16>,
    /// Tiles per `(layer, head)`.
    tiles: usize,
}

impl KvCache {
    /// A cache for `n_ctx` positions; fails (rather than aborting the process) when the memory
    /// cannot be reserved.
    pub(crate) fn new(
        n_layers: usize,
        n_kv_heads: usize,
        n_ctx: usize,
        (head_dim, v_dim): (usize, usize),
    ) -> crate::Result<Self> {
        let tiles = n_ctx.div_ceil(BLOCK);
        let v_stride = tiles * BLOCK;
        let too_large = || crate::Error::CacheTooLarge {
            n_ctx,
            bytes: 2
                * n_layers as u128
                * n_kv_heads as u128
                * (n_ctx as u128 * head_dim as u128 + v_stride as u128 * v_dim as u128),
        };
        let per_head = |positions: usize, width: usize| {
            n_layers
                .checked_mul(n_kv_heads)
                .and_then(|x| x.checked_mul(positions))
                .and_then(|x| x.checked_mul(width))
                .ok_or_else(too_large)
        };
        let alloc = |total: usize| zeroed(total).ok_or_else(too_large);
        Ok(KvCache {
            n_kv_heads,
            n_ctx,
            head_dim,
            v_dim,
            len: 0,
            shared: Vec::new(),
            k: alloc(per_head(n_ctx, head_dim)?)?,
            v: alloc(per_head(v_stride, v_dim)?)?,
            tiles,
        })
    }

    /// Positions filled.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no position is filled.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Positions the cache can hold.
    pub fn capacity(&self) -> usize {
        self.n_ctx
    }

    /// Forgets every position (a new sequence), letting go of shared blocks.
    pub fn clear(&mut self) {
        self.release_own();
        self.len = 0;
        self.shared.clear();
    }

    /// Gives the memory of the cache's own positions back when they are many and all about to
    /// be dropped: fresh zeroed arrays (untouched pages) replace the old (large arrays are
    /// their own mappings, returned to the system when freed). A sequence that takes shared
    /// blocks in place of a prefix it computed itself then holds no second copy.
    fn release_own(&mut self) {
        if self.own_bytes() < RELEASE_BYTES {
            return;
        }
        if let (Some(k), Some(v)) = (zeroed(self.k.len()), zeroed(self.v.len())) {
            self.k = k;
            self.v = v;
        }
    }

    /// Forgets positions from `len` on (e.g. to reuse a shared prompt prefix). Shared blocks
    /// past `len` are let go; the part of one that `len` ends inside is copied into the
    /// cache's own memory.
    pub fn truncate(&mut self, len: usize) {
        if len == self.base() {
            self.release_own();
        }
        if len >= self.base() {
            self.len = self.len.min(len);
            return;
        }
        self.release_own();
        let (keep, part) = (len / BLOCK, len % BLOCK);
        let cut = self.shared.get(keep).cloned();
        self.shared.truncate(keep);
        self.len = keep * BLOCK;
        if let Some(block) = cut.filter(|_| part > 0) {
            self.copy_in(&block, BLOCK, part);
        }
    }

    /// Positions held in shared blocks (the cache's own positions start here).
    pub fn base(&self) -> usize {
        self.shared.len() * BLOCK
    }

    /// The shared blocks this cache reads (for memory accounting: each is held once however
    /// many caches read it).
    pub fn shared_blocks(&self) -> &[Arc<[f16]>] {
        &self.shared
    }

    /// Bytes of keys and values the cache's own filled positions take.
    pub fn own_bytes(&self) -> usize {
        (self.len - self.base()) * self.block_len(1) * 2
    }

    /// Where own position `pos` of `(layer, head)` starts in the keys.
    fn at(&self, layer: usize, head: usize, pos: usize) -> usize {
        ((layer * self.n_kv_heads + head) * self.n_ctx + pos) * self.head_dim
    }

    /// Where the value tiles of `(layer, head)` start.
    fn v_at(&self, layer: usize, head: usize) -> usize {
        (layer * self.n_kv_heads + head) * self.tiles * self.v_dim * BLOCK
    }

    /// Where dimension 0 of own position `q` is, given where its `(layer, head)`'s tiles start
    /// (dimension `d` is `d * BLOCK` further).
    fn v_pos(&self, at: usize, q: usize) -> usize {
        at + (q / BLOCK) * self.v_dim * BLOCK + q % BLOCK
    }

    /// Writes position `pos` of `(layer, head)`, rounding to f16 (to nearest, ties to even, as
    /// ggml converts). Positions in shared blocks are never written (they are computed).
    pub(crate) fn store(&mut self, layer: usize, head: usize, pos: usize, k: &[f32], v: &[f32]) {
        let pos = pos
            .checked_sub(self.base())
            .expect("a position in a shared block is never written");
        let i = self.at(layer, head, pos);
        let hd = self.head_dim;
        self.k[i..i + hd].convert_from_f32_slice(&k[..hd]);
        // Values go down a column of the position's tile: convert a stretch at a time, then
        // scatter it.
        let base = self.v_pos(self.v_at(layer, head), pos);
        let mut buf = [f16::ZERO; 64];
        for (c, chunk) in v[..self.v_dim].chunks(buf.len()).enumerate() {
            let b = &mut buf[..chunk.len()];
            b.convert_from_f32_slice(chunk);
            for (j, &x) in b.iter().enumerate() {
                self.v[base + (c * 64 + j) * BLOCK] = x;
            }
        }
    }

    /// Starts fetching what [`KvCache::store`] of own position `pos` in `layer` will write (every
    /// head's key row and the cache lines down its value column): a batch stores each row's
    /// position on one thread, and the value column's scattered lines, fetched one store after
    /// another, cost more than the rest of the store.
    pub(crate) fn prefetch_store(&self, layer: usize, pos: usize) {
        let Some(pos) = pos.checked_sub(self.base()) else {
            return;
        };
        if pos >= self.n_ctx {
            return;
        }
        for head in 0..self.n_kv_heads {
            let i = self.at(layer, head, pos);
            for line in (0..self.head_dim).step_by(32) {
                ops::prefetch(self.k[i + line..].as_ptr());
            }
            let base = self.v_pos(self.v_at(layer, head), pos);
            for d in 0..self.v_dim {
                ops::prefetch(self.v[base + d * BLOCK..].as_ptr());
            }
        }
    }

    /// Where `(layer, head)` starts inside a shared block, and where its values start.
    fn in_block(&self, layer: usize, head: usize) -> (usize, usize) {
        let at = (layer * self.n_kv_heads + head) * BLOCK * (self.head_dim + self.v_dim);
        (at, at + BLOCK * self.head_dim)
    }

    /// The pieces of positions `first..end` in storage order: `(first position, block or own,
    /// offset of the first position in it, positions)`: each shared block's part, then the
    /// cache's own positions tile by tile.
    fn pieces(
        &self,
        first: usize,
        end: usize,
    ) -> impl Iterator<Item = (usize, Option<&[f16]>, usize, usize)> + Clone {
        let base = self.base();
        let shared = self
            .shared
            .iter()
            .enumerate()
            .map(|(b, blk)| (b * BLOCK, Some(&**blk), 0, BLOCK))
            .filter_map(move |(at, blk, _, n)| {
                let (from, to) = (first.max(at), end.min(at + n));
                (from < to).then_some((from, blk, from - at, to - from))
            });
        let from = first.max(base);
        let tiles = if end > from {
            (from - base) / BLOCK..(end - 1 - base) / BLOCK + 1
        } else {
            0..0
        };
        let own = tiles.map(move |t| {
            let lo = from.max(base + t * BLOCK);
            let hi = end.min(base + (t + 1) * BLOCK);
            (lo, None, lo - base, hi - lo)
        });
        shared.chain(own)
    }

    /// Keys of positions `first..len` as runs `(first position, keys back to back)`: each
    /// shared block's part, then the cache's own.
    pub(crate) fn key_runs(
        &self,
        layer: usize,
        head: usize,
        first: usize,
        len: usize,
    ) -> impl Iterator<Item = (usize, &[f16])> + Clone {
        let hd = self.head_dim;
        let (in_block, _) = self.in_block(layer, head);
        let own = self.at(layer, head, 0);
        self.pieces(first, len).map(move |(pos, blk, off, n)| {
            let keys = match blk {
                Some(b) => &b[in_block + off * hd..in_block + (off + n) * hd],
                None => &self.k[own + off * hd..own + (off + n) * hd],
            };
            (pos, keys)
        })
    }

    /// The transposed values of positions `first..end` of `(layer, head)` as runs, each shared
    /// block's part and then the cache's own, for [`strata_kernels::attn::weighted_sum_runs`]. `first` and the
    /// block edges must be whole steps of the attention order, `end` padded to one: the padded
    /// positions of the cache's own rows are zero or an earlier sequence's values (finite either
    /// way: weighted sums give them weight zero).
    pub(crate) fn value_runs(
        &self,
        layer: usize,
        head: usize,
        first: usize,
        end: usize,
    ) -> impl Iterator<Item = ValueRun<'_>> + Clone {
        let vd = self.v_dim;
        let (_, in_block) = self.in_block(layer, head);
        let own = self.v_at(layer, head);
        self.pieces(first, end).map(move |(_, blk, off, n)| {
            let (rows, at) = match blk {
                Some(b) => (b, in_block + off),
                None => (&self.v[..], self.v_pos(own, off)),
            };
            ValueRun {
                vt: &rows[at..at + (vd - 1) * BLOCK + n],
                vs: BLOCK,
                len: n,
            }
        })
    }

    pub(crate) fn advance(&mut self, n: usize) {
        self.len += n;
    }

    /// `(layer, head)` pairs held.
    fn heads(&self) -> usize {
        self.k.len() / (self.n_ctx * self.head_dim).max(1)
    }

    /// Halves a block of `n` positions takes in [`KvCache::save_block`]'s layout.
    pub(crate) fn block_len(&self, n: usize) -> usize {
        self.heads() * n * (self.head_dim + self.v_dim)
    }

    /// The keys and values of positions `start..start + n`, per `(layer, head)` the keys by
    /// position and then the values by dimension. `None` when the positions are not filled or
    /// straddle a shared block; a whole shared block is given back as it is, not copied.
    pub fn save_block(&self, start: usize, n: usize) -> Option<Arc<[f16]>> {
        if start + n > self.len {
            return None;
        }
        let base = self.base();
        if start < base {
            let whole = n == BLOCK && start.is_multiple_of(BLOCK);
            return whole.then(|| self.shared[start / BLOCK].clone());
        }
        let start = start - base;
        let mut out = vec![f16::ZERO; self.block_len(n)];
        let mut at = 0;
        for lh in 0..self.heads() {
            let (layer, head) = (lh / self.n_kv_heads, lh % self.n_kv_heads);
            let k = self.at(layer, head, start);
            let kn = n * self.head_dim;
            out[at..at + kn].copy_from_slice(&self.k[k..k + kn]);
            at += kn;
            let v = self.v_at(layer, head);
            for d in 0..self.v_dim {
                for (q, len, o) in tile_segments(start, n) {
                    let row = self.v_pos(v, q) + d * BLOCK;
                    out[at + o..at + o + len].copy_from_slice(&self.v[row..row + len]);
                }
                at += n;
            }
        }
        Some(out.into())
    }

    /// Makes a whole block saved by [`KvCache::save_block`] the next [`BLOCK`] positions
    /// without copying it: only while the cache holds nothing of its own (shared blocks come
    /// first). False when it cannot.
    pub fn attach(&mut self, block: Arc<[f16]>) -> bool {
        if self.len != self.base()
            || block.len() != self.block_len(BLOCK)
            || self.len + BLOCK > self.n_ctx
        {
            return false;
        }
        self.shared.push(block);
        self.len += BLOCK;
        true
    }

    /// Appends a whole saved block: read in place while the cache holds nothing of its own
    /// ([`KvCache::attach`]; concurrent sequences then share one copy), copied after positions
    /// of its own ([`KvCache::load_block`]). False when neither can take it.
    pub fn append_block(&mut self, block: &Arc<[f16]>) -> bool {
        self.attach(Arc::clone(block)) || self.load_block(self.len, block)
    }

    /// Writes a block saved by [`KvCache::save_block`] back at positions `start..start + n`;
    /// the block must directly follow the filled positions, and the cache then holds it.
    pub fn load_block(&mut self, start: usize, data: &[f16]) -> bool {
        let per = self.heads() * (self.head_dim + self.v_dim);
        if per == 0 || !data.len().is_multiple_of(per) || start != self.len {
            return false;
        }
        let n = data.len() / per;
        if start + n > self.n_ctx {
            return false;
        }
        self.copy_in(data, n, n);
        true
    }

    /// Appends the first `count` positions of a block of `n` (laid out as
    /// [`KvCache::save_block`] does) to the cache's own positions.
    fn copy_in(&mut self, data: &[f16], n: usize, count: usize) {
        let start = self.len - self.base();
        let mut at = 0;
        for lh in 0..self.heads() {
            let (layer, head) = (lh / self.n_kv_heads, lh % self.n_kv_heads);
            let k = self.at(layer, head, start);
            let kn = count * self.head_dim;
            self.k[k..k + kn].copy_from_slice(&data[at..at + kn]);
            at += n * self.head_dim;
            let v = self.v_at(layer, head);
            for d in 0..self.v_dim {
                for (q, len, o) in tile_segments(start, count) {
                    let row = self.v_pos(v, q) + d * BLOCK;
                    self.v[row..row + len].copy_from_slice(&data[at + o..at + o + len]);
                }
                at += n;
            }
        }
        self.len += count;
    }
}

/// Own positions `q0..q0 + n` cut at tile edges: `(first position, positions, offset from q0)`.
fn tile_segments(q0: usize, n: usize) -> impl Iterator<Item = (usize, usize, usize)> {
    let mut q = q0;
    std::iter::from_fn(move || {
        if q >= q0 + n {
            return None;
        }
        let len = (BLOCK - q % BLOCK).min(q0 + n - q);
        let seg = (q, len, q - q0);
        q += len;
        Some(seg)
    })
}

/// The KV caches of one step: row `t` of the step belongs to cache `rows.seq[t]` of these.
/// Either given one by one (a single sequence, or a batch the caller gathered), or every slot
/// of a set with the batch's picks, which gathers nothing (a step then allocates nothing).
pub(crate) enum Caches<'a, 'c> {
    /// The step's caches, in batch order.
    Refs(&'a mut [&'c mut KvCache]),
    /// Every slot, and the slot each batch position means (distinct).
    Slots {
        /// The slots.
        all: &'a mut [KvCache],
        /// Batch position to slot.
        pick: &'a [usize],
    },
}

impl<'c> Caches<'_, 'c> {
    /// The same caches for a shorter borrow.
    pub(crate) fn reborrow(&mut self) -> Caches<'_, 'c> {
        match self {
            Caches::Refs(r) => Caches::Refs(r),
            Caches::Slots { all, pick } => Caches::Slots { all, pick },
        }
    }

    /// How many sequences the step has.
    pub(crate) fn len(&self) -> usize {
        match self {
            Caches::Refs(r) => r.len(),
            Caches::Slots { pick, .. } => pick.len(),
        }
    }

    /// The cache of batch position `i`.
    pub(crate) fn get(&self, i: usize) -> &KvCache {
        match self {
            Caches::Refs(r) => r[i],
            Caches::Slots { all, pick } => &all[pick[i]],
        }
    }

    /// The cache of batch position `i`, to write.
    pub(crate) fn get_mut(&mut self, i: usize) -> &mut KvCache {
        match self {
            Caches::Refs(r) => r[i],
            Caches::Slots { all, pick } => &mut all[pick[i]],
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    /// Keys of positions `0..len` of `(layer, head)`, back to back, however they are stored.
    fn keys(c: &KvCache, layer: usize, head: usize, len: usize) -> Vec<f16> {
        let mut out = Vec::new();
        for (pos, k) in c.key_runs(layer, head, 0, len) {
            assert_eq!(pos * c.head_dim, out.len());
            out.extend_from_slice(k);
        }
        out
    }

    /// Dimension `d` of positions `0..len` of `(layer, head)`.
    fn values(c: &KvCache, layer: usize, head: usize, d: usize, len: usize) -> Vec<f16> {
        let mut out = Vec::new();
        for r in c.value_runs(layer, head, 0, len) {
            out.extend_from_slice(&r.vt[d * r.vs..d * r.vs + r.len]);
        }
        out
    }

    #[test]
    fn positions_are_kept_as_f16_keys_by_position_and_values_by_dimension() {
        let (layers, heads, ctx, hd) = (2, 3, 70, 4);
        let mut c = KvCache::new(layers, heads, ctx, (hd, hd)).unwrap();
        let k = [1.0f32, 1.0e-4, 65504.0, -0.1];
        let v = [0.3f32, 3.0, -7.25, 1.0 / 3.0];
        c.store(1, 2, 5, &k, &v);
        c.advance(6);
        let r = |x: f32| f16::from_f32(x);
        assert_eq!(&keys(&c, 1, 2, 6)[5 * hd..6 * hd], &k.map(r)[..]);
        assert!(c.tiles * BLOCK >= ctx && BLOCK.is_multiple_of(strata_kernels::attn::MAX_STEP));
        for (d, &vx) in v.iter().enumerate() {
            let vd = values(&c, 1, 2, d, 6);
            assert_eq!(vd[5], r(vx));
            assert_eq!(vd[4], f16::ZERO);
        }
        // Another head is untouched; a saved block loads back into a fresh cache bit for bit.
        assert!(keys(&c, 0, 0, 6).iter().all(|x| *x == f16::ZERO));
        let block = c.save_block(0, 6).unwrap();
        let mut d = KvCache::new(layers, heads, ctx, (hd, hd)).unwrap();
        assert!(d.load_block(0, &block));
        assert_eq!(keys(&d, 1, 2, 6), keys(&c, 1, 2, 6));
        assert_eq!(values(&d, 1, 2, 3, 6), values(&c, 1, 2, 3, 6));
    }

    /// A cache of `ctx` positions with every position of every head filled with values that
    /// name it.
    fn filled(layers: usize, heads: usize, ctx: usize, hd: usize, len: usize) -> KvCache {
        let mut c = KvCache::new(layers, heads, ctx, (hd, hd)).unwrap();
        fill(&mut c, 0..len);
        c
    }

    /// Stores positions `range` of every head of `c` with values that name them.
    fn fill(c: &mut KvCache, range: std::ops::Range<usize>) {
        let (layers, hd) = (c.heads() / c.n_kv_heads, c.head_dim);
        for p in range {
            for l in 0..layers {
                for h in 0..c.n_kv_heads {
                    let k: Vec<f32> = (0..hd).map(|i| (p * 7 + l * 3 + h + i) as f32).collect();
                    let v: Vec<f32> = k.iter().map(|x| -x).collect();
                    c.store(l, h, p, &k, &v);
                }
            }
            c.advance(1);
        }
    }

    #[test]
    fn shared_blocks_read_as_the_positions_they_hold_and_are_never_copied() {
        let (layers, heads, hd) = (2, 2, 4);
        let ctx = 3 * BLOCK;
        let len = 2 * BLOCK + 40;
        let whole = filled(layers, heads, ctx, hd, len);
        let blocks: Vec<Arc<[f16]>> = (0..2)
            .map(|b| whole.save_block(b * BLOCK, BLOCK).unwrap())
            .collect();
        // A cache that attaches the two blocks and computes the rest itself.
        let mut c = KvCache::new(layers, heads, ctx, (hd, hd)).unwrap();
        for b in &blocks {
            assert!(c.attach(b.clone()));
        }
        assert_eq!(
            (c.len(), c.base(), c.own_bytes()),
            (2 * BLOCK, 2 * BLOCK, 0)
        );
        assert!(Arc::ptr_eq(&c.shared_blocks()[1], &blocks[1]));
        fill(&mut c, 2 * BLOCK..len);
        assert_eq!(c.own_bytes(), 40 * layers * heads * 2 * hd * 2);
        // A block attaches only while the cache has nothing of its own.
        assert!(!c.attach(blocks[0].clone()));
        for (l, h) in [(0, 0), (1, 1), (0, 1)] {
            assert_eq!(keys(&c, l, h, len), keys(&whole, l, h, len));
            for d in 0..hd {
                assert_eq!(values(&c, l, h, d, len), values(&whole, l, h, d, len));
            }
            // Runs from a window's start inside the second block: that block's tail, then own.
            let runs: Vec<_> = c
                .key_runs(l, h, BLOCK + 64, len)
                .map(|(p, k)| (p, k.len()))
                .collect();
            assert_eq!(
                runs,
                [(BLOCK + 64, (BLOCK - 64) * hd), (2 * BLOCK, 40 * hd)]
            );
        }
        // A shared block saves as itself; an own one as a copy equal to the original's.
        assert!(Arc::ptr_eq(
            &c.save_block(BLOCK, BLOCK).unwrap(),
            &blocks[1]
        ));
        assert!(c.save_block(BLOCK + 1, BLOCK).is_none());
        // Cutting inside a shared block copies its first part into the cache's own memory.
        c.truncate(BLOCK + 10);
        assert_eq!(
            (c.len(), c.base(), c.shared_blocks().len()),
            (BLOCK + 10, BLOCK, 1)
        );
        assert_eq!(keys(&c, 1, 0, BLOCK + 10), keys(&whole, 1, 0, BLOCK + 10));
        assert_eq!(
            values(&c, 1, 0, 2, BLOCK + 10),
            values(&whole, 1, 0, 2, BLOCK + 10)
        );
        c.clear();
        assert_eq!((c.len(), c.base()), (0, 0));
    }

    #[test]
    fn dropping_many_own_positions_gives_their_memory_back() {
        // 1 KiB a position: 16,400 positions are past the release threshold.
        let (layers, heads, hd, len) = (2, 2, 64, 16_400);
        let mut big = filled(layers, heads, len + 64, hd, len);
        assert!(big.own_bytes() >= RELEASE_BYTES);
        big.truncate(0);
        big.advance(1);
        assert!(
            keys(&big, 1, 1, 1).iter().all(|x| *x == f16::ZERO),
            "fresh pages"
        );
        // A short sequence keeps its pages for the next.
        let mut small = filled(layers, heads, 128, hd, 100);
        let before = keys(&small, 1, 1, 1);
        small.truncate(0);
        small.advance(1);
        assert_eq!(keys(&small, 1, 1, 1), before);
        assert!(before.iter().any(|x| *x != f16::ZERO));
    }

    #[test]
    fn an_impossible_cache_is_an_error_that_counts_two_bytes_a_value() {
        let e = KvCache::new(1 << 20, 1 << 20, 1 << 20, (128, 128)).unwrap_err();
        match e {
            crate::Error::CacheTooLarge { bytes, .. } => {
                assert_eq!(bytes, 2 * (1u128 << 40) * ((1 << 20) * 128 * 2));
            }
            other => panic!("{other}"),
        }
    }
}
