//! The key/value cache of one sequence on one shard.
//!
//! Values are stored as f32 but rounded to f16 precision on the way in: numerically this is
//! llama.cpp's default f16 cache (which greedy parity depends on), while the attention loops stay
//! plain f32 arithmetic. Memory is reserved up front for the context size; pages are only touched
//! as positions fill.

/// Keys and values for `n_layers x n_kv_heads x n_ctx` positions of `head_dim` each.
#[derive(Debug)]
pub struct KvCache {
    n_kv_heads: usize,
    n_ctx: usize,
    head_dim: usize,
    len: usize,
    k: Vec<f32>,
    v: Vec<f32>,
}

impl KvCache {
    /// A cache for `n_ctx` positions; fails (rather than aborting the process) when the memory
    /// cannot be reserved.
    pub(crate) fn new(
        n_layers: usize,
        n_kv_heads: usize,
        n_ctx: usize,
        head_dim: usize,
    ) -> crate::Result<Self> {
        let too_large = || crate::Error::CacheTooLarge {
            n_ctx,
            bytes: 8 * n_layers as u128 * n_kv_heads as u128 * n_ctx as u128 * head_dim as u128,
        };
        let total = n_layers
            .checked_mul(n_kv_heads)
            .and_then(|x| x.checked_mul(n_ctx))
            .and_then(|x| x.checked_mul(head_dim))
            .ok_or_else(too_large)?;
        let alloc = || -> crate::Result<Vec<f32>> {
            // Probe first, so an impossible size is an error rather than an abort; then take
            // zeroed memory, whose pages the kernel supplies only as positions fill.
            let mut probe: Vec<f32> = Vec::new();
            probe.try_reserve_exact(total).map_err(|_| too_large())?;
            drop(probe);
            Ok(vec![0.0; total])
        };
        Ok(KvCache {
            n_kv_heads,
            n_ctx,
            head_dim,
            len: 0,
            k: alloc()?,
            v: alloc()?,
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

    pub(crate) fn store(&mut self, layer: usize, head: usize, pos: usize, k: &[f32], v: &[f32]) {
        let i = self.at(layer, head, pos);
        let hd = self.head_dim;
        for (cache, src) in [(&mut self.k, k), (&mut self.v, v)] {
            let dst = &mut cache[i..i + hd];
            dst.copy_from_slice(&src[..hd]);
            strata_kernels::ops::round_f16_slice(dst);
        }
    }

    /// Keys of positions `0..len`, back to back.
    pub(crate) fn keys(&self, layer: usize, head: usize, len: usize) -> &[f32] {
        let i = self.at(layer, head, 0);
        &self.k[i..i + len * self.head_dim]
    }

    /// Values of positions `0..len`, back to back.
    pub(crate) fn values(&self, layer: usize, head: usize, len: usize) -> &[f32] {
        let i = self.at(layer, head, 0);
        &self.v[i..i + len * self.head_dim]
    }

    pub(crate) fn advance(&mut self, n: usize) {
        self.len += n;
    }
}
