//! The pieces decoder layers are built from, one module per kind of block: [`norm`] (RMSNorm,
//! post-norms, OLMo 2's whole-row Q/K norms), [`attention`] (grouped-query attention over the
//! KV cache), [`latent`] (DeepSeek's multi-head latent attention), [`ffn`] (the gated
//! feed-forward block) and [`moe`] (a mixture of experts); this module holds the step's state
//! and what every block shares: the exchange that makes a block's output whole, and the
//! residual add. llama.cpp's graph builder keeps them apart the same way (`build_norm`,
//! `build_attn`, `build_ffn`, `build_moe_ffn`), so each reads beside its counterpart.
//!
//! A family's layer ([`crate::models::Family::layer`]) is a few calls on [`Blocks`]. The blocks
//! hide the shard: each computes the rank's heads or FFN columns and performs the exchange its
//! [`crate::Combine`] mode needs, so a block's output is always full model-width rows,
//! identical on every rank. Every operation rounds where ggml rounds, so outputs stay bit for
//! bit llama.cpp's.
//!
//! Data flow: `x` is the residual stream (`live` rows), `xn` a block's input, `proj` a block's
//! output (rows `out_first..` of the stream). On the last layer of a prefill only the last row
//! is needed after attention ("trim", as llama.cpp's `inp_out_ids`): attention then outputs one
//! row and [`Blocks::residual`] leaves one live row.

use strata_kernels::attn::{self, Flavour};
use strata_kernels::{QMatrix, QuantActs, ThreadPool, matmul, ops};

use crate::kv_cache::Caches;
use crate::model::{Axis, Collective, Model, Rows, Scratch, grow};
use crate::{Combine, Error, ModelConfig, Result, ShardSpec};

mod attention;
mod ffn;
mod latent;
mod moe;
mod norm;

/// One step's state as it passes through the layers of a shard.
pub(crate) struct Blocks<'a, 'c> {
    pub(crate) cfg: &'a ModelConfig,
    pub(crate) spec: &'a ShardSpec,
    pub(crate) flavour: Flavour,
    pub(crate) pool: &'a ThreadPool,
    pub(crate) caches: Caches<'a, 'c>,
    pub(crate) s: &'a mut Scratch,
    pub(crate) rows: &'a Rows,
    pub(crate) order: attn::DotOrder,
    pub(crate) comm: &'a mut dyn Collective,
    /// Layer index within the shard.
    pub(crate) li: usize,
    /// Whether only the last row continues after this layer's attention.
    pub(crate) trim: bool,
    /// Rows of `x` still computed.
    pub(crate) live: usize,
    /// The first row of `x` that `proj` row 0 belongs to.
    out_first: usize,
    /// Rows of the block output.
    out_rows: usize,
    /// Whether the block output is in `gathered` (an all-gathered model width) rather than
    /// `proj`.
    out_gathered: bool,
}

/// RoPE with the family's pairing (halves, or adjacent elements) and the step's tables.
fn rotate(cfg: &ModelConfig, flavour: Flavour, x: &mut [f32], cos: &[f32], sin: &[f32]) {
    if cfg.rope_neox {
        ops::rope_apply_neox(x, cos, sin);
    } else if flavour.arm() {
        ops::rope_apply_neon(x, cos, sin);
    } else {
        ops::rope_apply(x, cos, sin);
    }
}

/// All-gathers `rows` rows of this rank's block `src` of `axis` into `dst` (grown to whole
/// rows of `full`), and returns the whole rows.
fn gather<'d>(
    comm: &mut dyn Collective,
    axis: Axis,
    rows: usize,
    src: &[f32],
    dst: &'d mut Vec<f32>,
    full: usize,
) -> Result<&'d [f32]> {
    grow(dst, rows * full);
    comm.all_gather(axis, rows, src, &mut dst[..rows * full])
        .map_err(Error::Collective)?;
    Ok(&dst[..rows * full])
}

fn mm(pool: &ThreadPool, w: &QMatrix, acts: &QuantActs, out: &mut Vec<f32>) {
    grow(out, acts.n() * w.rows());
    matmul(pool, w, acts, &mut out[..acts.n() * w.rows()]);
}

/// Adds `bias` to each of the first `rows` rows of `x` (ggml's broadcast `ggml_add`).
fn add_bias(x: &mut [f32], bias: Option<&[f32]>, rows: usize) {
    if let Some(b) = bias {
        for row in x.chunks_exact_mut(b.len()).take(rows) {
            ops::add_assign(row, b);
        }
    }
}

impl<'a, 'c> Blocks<'a, 'c> {
    /// The state of a step over `rows` (the residual stream already holds their inputs).
    pub(crate) fn new(
        model: &'a Model,
        pool: &'a ThreadPool,
        caches: Caches<'a, 'c>,
        s: &'a mut Scratch,
        rows: &'a Rows,
        order: attn::DotOrder,
        comm: &'a mut dyn Collective,
    ) -> Self {
        s.acts.set_flavour(model.flavour());
        Blocks {
            cfg: model.config(),
            spec: model.spec(),
            flavour: model.flavour(),
            pool,
            caches,
            s,
            rows,
            order,
            comm,
            li: 0,
            trim: false,
            live: rows.pos.len(),
            out_first: 0,
            out_rows: 0,
            out_gathered: false,
        }
    }
}

impl Blocks<'_, '_> {
    /// Adds the block output to the residual stream; after a trimmed attention, only the last
    /// row stays live (moved to row 0).
    pub(crate) fn residual(&mut self) {
        let e = self.cfg.n_embd;
        let scale = self.cfg.residual_scale;
        let s = &mut *self.s;
        let out = if self.out_gathered {
            &mut s.gathered
        } else {
            &mut s.proj
        };
        for (tt, row) in out[..self.out_rows * e].chunks_exact_mut(e).enumerate() {
            let t = self.out_first + tt;
            if let Some(f) = scale {
                ops::scale(row, f);
            }
            ops::add_assign(&mut s.x[t * e..(t + 1) * e], row);
        }
        if self.out_first > 0 {
            s.x.copy_within(self.out_first * e..(self.out_first + 1) * e, 0);
            self.live = self.out_rows;
            self.out_first = 0;
        }
    }

    /// Turns this rank's output-projection result (`rows` rows of `part` values in `proj`) into
    /// the full model-width rows every rank adds to its residual stream (all-gathered into
    /// `gathered`, or all-reduced in place in `proj`).
    fn combine_output(&mut self, mode: &CombineMode, rows: usize, part: usize) -> Result<()> {
        let e = self.cfg.n_embd;
        let s = &mut *self.s;
        self.out_gathered = mode.gather_embd;
        if mode.gather_embd {
            let src = &s.proj[..rows * part];
            gather(&mut *self.comm, Axis::Embd, rows, src, &mut s.gathered, e)?;
            return Ok(());
        }
        if mode.reduce {
            self.comm
                .all_reduce_sum(&mut s.proj[..rows * e])
                .map_err(Error::Collective)?;
        }
        Ok(())
    }
}

/// The exchanges a layer of one shard makes.
struct CombineMode {
    gather_heads: bool,
    gather_ffn: bool,
    gather_embd: bool,
    reduce: bool,
}

impl CombineMode {
    fn of(cfg: &ModelConfig, spec: &ShardSpec) -> CombineMode {
        match &spec.combine {
            Combine::Gather { embd } => CombineMode {
                gather_heads: spec.q_heads != (0..cfg.n_head),
                gather_ffn: spec.ffn != (0..cfg.n_ff),
                gather_embd: *embd != (0..cfg.n_embd),
                reduce: false,
            },
            Combine::Reduce => CombineMode {
                gather_heads: false,
                gather_ffn: false,
                gather_embd: false,
                reduce: !spec.is_full_width(cfg),
            },
        }
    }
}
