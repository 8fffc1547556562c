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
//! attention kernels compute for several query heads at once.

use half::f16;
use half::slice::HalfFloatSliceExt;
use half::vec::HalfBitsVecExt;
use strata_kernels::attn;

/// Keys and values for `n_layers x n_kv_heads x n_ctx` positions, keys `head_dim` wide and
/// values `v_dim` (equal but under multi-head latent attention, whose values are the first
/// `v_dim` elements of its keys).
#[derive(Debug)]
pub struct KvCache {
    n_kv_heads: usize,
    n_ctx: usize,
    head_dim: usize,
    v_dim: usize,
    len: usize,
    /// `[layer][head][position][dim]`.
    k: Vec<f16>,
    /// `[layer][head][dim][position]`, rows of `v_stride`; past the filled positions, zero or
    /// values of an earlier sequence (finite either way: weighted sums give them weight zero).
    v: Vec<f16>,
    /// Positions per value row: `n_ctx` rounded up to whole steps of every attention order, so
    /// a weighted sum over padded positions stays inside its row.
    v_stride: usize,
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
        let v_stride = n_ctx.div_ceil(attn::MAX_STEP) * attn::MAX_STEP;
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
        let alloc = |total: usize| -> crate::Result<Vec<f16>> {
            // Probe first, so an impossible size is an error rather than an abort; then take
            // zeroed memory, whose pages the kernel supplies only as positions fill. (Zeroed
            // `u16`s come from calloc untouched; `vec![f16::ZERO; n]` would write every page.)
            let mut probe: Vec<f16> = Vec::new();
            probe.try_reserve_exact(total).map_err(|_| too_large())?;
            drop(probe);
            Ok(vec![0u16; total].reinterpret_into())
        };
        Ok(KvCache {
            n_kv_heads,
            n_ctx,
            head_dim,
            v_dim,
            len: 0,
            k: alloc(per_head(n_ctx, head_dim)?)?,
            v: alloc(per_head(v_stride, v_dim)?)?,
            v_stride,
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

    /// Forgets every position (a new sequence).
    pub fn clear(&mut self) {
        self.len = 0;
    }

    /// Forgets positions from `len` on (e.g. to reuse a shared prompt prefix).
    pub fn truncate(&mut self, len: usize) {
        self.len = self.len.min(len);
    }

    fn at(&self, layer: usize, head: usize, pos: usize) -> usize {
        ((layer * self.n_kv_heads + head) * self.n_ctx + pos) * self.head_dim
    }

    /// Where the value rows of `(layer, head)` start.
    fn v_at(&self, layer: usize, head: usize) -> usize {
        (layer * self.n_kv_heads + head) * self.v_dim * self.v_stride
    }

    /// Writes position `pos` of `(layer, head)`, rounding to f16 (to nearest, ties to even, as
    /// ggml converts).
    pub(crate) fn store(&mut self, layer: usize, head: usize, pos: usize, k: &[f32], v: &[f32]) {
        let i = self.at(layer, head, pos);
        let hd = self.head_dim;
        self.k[i..i + hd].convert_from_f32_slice(&k[..hd]);
        // Values go down a column: convert a stretch at a time, then scatter it.
        let base = self.v_at(layer, head) + pos;
        let mut buf = [f16::ZERO; 64];
        for (c, chunk) in v[..self.v_dim].chunks(buf.len()).enumerate() {
            let b = &mut buf[..chunk.len()];
            b.convert_from_f32_slice(chunk);
            for (j, &x) in b.iter().enumerate() {
                self.v[base + (c * 64 + j) * self.v_stride] = x;
            }
        }
    }

    /// Keys of positions `0..len`, back to back.
    pub(crate) fn keys(&self, layer: usize, head: usize, len: usize) -> &[f16] {
        let i = self.at(layer, head, 0);
        &self.k[i..i + len * self.head_dim]
    }

    /// The transposed values of `(layer, head)`: row `d` (at `d * value_stride()`) holds
    /// dimension `d` of every position (past the filled ones, zero or an earlier sequence's).
    pub(crate) fn values_t(&self, layer: usize, head: usize) -> &[f16] {
        let i = self.v_at(layer, head);
        &self.v[i..i + self.v_dim * self.v_stride]
    }

    /// Positions per row of [`KvCache::values_t`].
    pub(crate) fn value_stride(&self) -> usize {
        self.v_stride
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

    /// The keys and values of positions `start..start + n`, per `(layer, head)` the keys by position and then the values by
    /// dimension. `None` when the positions are not filled.
    pub(crate) fn save_block(&self, start: usize, n: usize) -> Option<Box<[f16]>> {
        if start + n > self.len {
            return None;
        }
        let mut out = vec![f16::ZERO; self.block_len(n)];
        let mut at = 0;
        for lh in 0..self.heads() {
            let (layer, head) = (lh / self.n_kv_heads, lh % self.n_kv_heads);
            let k = self.at(layer, head, start);
            let kn = n * self.head_dim;
            out[at..at + kn].copy_from_slice(&self.k[k..k + kn]);
            at += kn;
            let v = self.v_at(layer, head) + start;
            for d in 0..self.v_dim {
                let row = v + d * self.v_stride;
                out[at..at + n].copy_from_slice(&self.v[row..row + n]);
                at += n;
            }
        }
        Some(out.into())
    }

    /// Writes a block saved by [`KvCache::save_block`] back at positions `start..start + n`;
    /// the block must directly follow the filled positions, and the cache then holds it.
    pub(crate) fn load_block(&mut self, start: usize, data: &[f16]) -> bool {
        let per = self.heads() * (self.head_dim + self.v_dim);
        if per == 0 || !data.len().is_multiple_of(per) || start != self.len {
            return false;
        }
        let n = data.len() / per;
        if start + n > self.n_ctx {
            return false;
        }
        let mut at = 0;
        for lh in 0..self.heads() {
            let (layer, head) = (lh / self.n_kv_heads, lh % self.n_kv_heads);
            let k = self.at(layer, head, start);
            let kn = n * self.head_dim;
            self.k[k..k + kn].copy_from_slice(&data[at..at + kn]);
            at += kn;
            let v = self.v_at(layer, head) + start;
            for d in 0..self.v_dim {
                let row = v + d * self.v_stride;
                self.v[row..row + n].copy_from_slice(&data[at..at + n]);
                at += n;
            }
        }
        self.len += n;
        true
    }
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

    #[test]
    fn positions_are_kept_as_f16_keys_by_position_and_values_by_dimension() {
        let (layers, heads, ctx, hd) = (2, 3, 70, 4);
        let mut c = KvCache::new(layers, heads, ctx, (hd, hd)).unwrap();
        let k = [1.0f32, 1.0e-4, 65504.0, -0.1];
        let v = [0.3f32, 3.0, -7.25, 1.0 / 3.0];
        c.store(1, 2, 5, &k, &v);
        c.advance(6);
        let r = |x: f32| f16::from_f32(x);
        assert_eq!(&c.keys(1, 2, 6)[5 * hd..6 * hd], &k.map(r)[..]);
        let (vt, vs) = (c.values_t(1, 2), c.value_stride());
        assert!(vs >= ctx && vs % attn::MAX_STEP == 0);
        for d in 0..hd {
            assert_eq!(vt[d * vs + 5], r(v[d]));
            assert_eq!(vt[d * vs + 4], f16::ZERO);
        }
        // Another head is untouched; a saved block loads back into a fresh cache bit for bit.
        assert!(c.keys(0, 0, 6).iter().all(|x| *x == f16::ZERO));
        let block = c.save_block(0, 6).unwrap();
        let mut d = KvCache::new(layers, heads, ctx, (hd, hd)).unwrap();
        assert!(d.load_block(0, &block));
        assert_eq!(d.keys(1, 2, 6), c.keys(1, 2, 6));
        assert_eq!(d.values_t(1, 2)[..6], c.values_t(1, 2)[..6]);
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
