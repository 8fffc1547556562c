//! RMSNorm in the places a layer applies it: before a block (into `xn`), after one (Gemma's
//! post-norms, in place on the block output), and over whole rows of queries and keys that a
//! rank holds only a slice of (OLMo 2), which needs an exchange to stay bit for bit one
//! process's.

use strata_kernels::ops;

use super::Blocks;
use crate::model::{Axis, Collective, grow};
use crate::weights::LayerWeights;
use crate::{Error, Result};

impl Blocks<'_, '_> {
    /// `xn = rms_norm(x) * w` for every live row; with no weights (a layer without pre-norms),
    /// `xn = x`.
    pub(crate) fn norm(&mut self, w: Option<&[f32]>) {
        let e = self.cfg.n_embd;
        let s = &mut *self.s;
        grow(&mut s.xn, self.live * e);
        let Some(w) = w else {
            s.xn[..self.live * e].copy_from_slice(&s.x[..self.live * e]);
            return;
        };
        for (src, dst) in s.x[..self.live * e]
            .chunks_exact(e)
            .zip(s.xn.chunks_exact_mut(e))
        {
            ops::rms_norm(src, w, self.cfg.rms_eps, dst);
        }
    }

    /// RMSNorm of the block output in place (Gemma's post-attention and post-FFN norms).
    pub(crate) fn post_norm(&mut self, w: Option<&[f32]>) {
        let e = self.cfg.n_embd;
        if let Some(w) = w {
            let out = if self.out_gathered {
                &mut self.s.gathered
            } else {
                &mut self.s.proj
            };
            for row in out[..self.out_rows * e].chunks_exact_mut(e) {
                ops::rms_norm_in_place(row, w, self.cfg.rms_eps);
            }
        }
    }

    /// OLMo 2's Q and K norms, over whole rows (every head together) of the `n` rows in `q` and
    /// `k`, which hold this rank's `n_q` query and `n_kv` KV heads. A rank with a slice of the
    /// heads all-gathers the whole rows to compute each row's factor exactly as one process
    /// does, then scales its own slice; every rank of a group makes the same exchanges (all
    /// shard heads, or none does).
    pub(super) fn qk_norm_rows(
        &mut self,
        lw: &LayerWeights,
        n: usize,
        n_q: usize,
        n_kv: usize,
    ) -> Result<()> {
        let (Some(qw), Some(kw)) = (lw.q_norm.as_deref(), lw.k_norm.as_deref()) else {
            return Ok(());
        };
        let cfg = self.cfg;
        let hd = cfg.head_dim;
        let spec = self.spec;
        let kv = spec.kv_heads(cfg);
        // Each KV head travels from the one rank that owns it; others may hold copies.
        let owned = spec.owned_kv_heads(cfg);
        let sharded = spec.q_heads != (0..cfg.n_head);
        let eps = cfg.rms_eps;
        let q = RowNorm {
            axis: Axis::QHeads,
            local: n_q * hd,
            full: cfg.q_width(),
            first: spec.q_heads.start * hd,
            owned: 0..n_q * hd,
            sharded,
            eps,
        };
        let k = RowNorm {
            axis: Axis::KvHeads,
            local: n_kv * hd,
            full: cfg.kv_width(),
            first: kv.start * hd,
            owned: (owned.start - kv.start) * hd..(owned.end - kv.start) * hd,
            sharded,
            eps,
        };
        let s = &mut *self.s;
        q.apply(&mut *self.comm, n, &mut s.q, qw, &mut s.up, &mut s.gathered)?;
        k.apply(&mut *self.comm, n, &mut s.k, kw, &mut s.up, &mut s.gathered)
    }
}

/// An RMSNorm over whole rows of which a rank holds a slice (OLMo 2's Q and K norms).
struct RowNorm {
    /// The axis the slices are gathered along.
    axis: Axis,
    /// Width of this rank's slice, and of a whole row.
    local: usize,
    full: usize,
    /// Where the slice starts in a whole row (and in the norm's weights).
    first: usize,
    /// The part of the slice this rank sends (the others send the rest of the row).
    owned: std::ops::Range<usize>,
    /// Whether the group shards the heads (else every rank holds whole rows).
    sharded: bool,
    /// The norm's epsilon.
    eps: f32,
}

impl RowNorm {
    /// Normalises the `n` rows of slices in `x` with weights `w` (a whole row's): directly when
    /// the rank holds whole rows, else from the all-gathered rows (`send` and `gathered` are
    /// scratch).
    fn apply(
        &self,
        comm: &mut dyn Collective,
        n: usize,
        x: &mut [f32],
        w: &[f32],
        send: &mut Vec<f32>,
        gathered: &mut Vec<f32>,
    ) -> Result<()> {
        let (x, eps) = (&mut x[..n * self.local], self.eps);
        if !self.sharded {
            for row in x.chunks_exact_mut(self.full) {
                ops::rms_norm_in_place(row, w, eps);
            }
            return Ok(());
        }
        let width = self.owned.len();
        grow(send, n * width);
        for (dst, src) in send[..n * width]
            .chunks_exact_mut(width.max(1))
            .zip(x.chunks_exact(self.local))
        {
            dst.copy_from_slice(&src[self.owned.clone()]);
        }
        grow(gathered, n * self.full);
        comm.all_gather(
            self.axis,
            n,
            &send[..n * width],
            &mut gathered[..n * self.full],
        )
        .map_err(Error::Collective)?;
        let w = &w[self.first..self.first + self.local];
        for (row, whole) in x
            .chunks_exact_mut(self.local)
            .zip(gathered.chunks_exact(self.full))
        {
            ops::scale_by(row, ops::rms_scale(whole, eps), w);
        }
        Ok(())
    }
}
