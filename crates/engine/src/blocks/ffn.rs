//! The gated feed-forward block (`down(act(gate(x)) * up(x))`), dense or dispatched to
//! [`super::moe`]; its gated product is what each expert of a mixture runs too.

use strata_kernels::attn::Flavour;
use strata_kernels::{QuantActs, ThreadPool, matmul_multi, ops};

use super::{Blocks, CombineMode, add_bias, gather, mm};
use crate::Result;
use crate::config::FfnAct;
use crate::model::{Axis, grow};
use crate::weights::{FfnWeights, GatedFfn, LayerWeights};

/// `gate = act(x gate) * (x up)` for `rows` rows of `x` (`gate` and `up` hold `rows` rows of
/// the FFN's width after).
#[allow(clippy::too_many_arguments)]
pub(super) fn gated(
    pool: &ThreadPool,
    acts: &mut QuantActs,
    x: &[f32],
    rows: usize,
    f: &GatedFfn,
    (gate, up): (&mut Vec<f32>, &mut Vec<f32>),
    act: FfnAct,
    flavour: Flavour,
) {
    let e = x.len() / rows.max(1);
    let ff = f.gate.rows();
    acts.quantize(f.gate.ggml_type(), x, rows, e);
    if f.up.ggml_type() == f.gate.ggml_type() {
        grow(gate, rows * ff);
        grow(up, rows * ff);
        matmul_multi(
            pool,
            acts,
            &mut [
                (&f.gate, &mut gate[..rows * ff]),
                (&f.up, &mut up[..rows * ff]),
            ],
        );
    } else {
        mm(pool, &f.gate, acts, gate);
        acts.quantize(f.up.ggml_type(), x, rows, e);
        mm(pool, &f.up, acts, up);
    }
    add_bias(gate, f.gate_b.as_deref(), rows);
    add_bias(up, f.up_b.as_deref(), rows);
    match act {
        FfnAct::Silu => ops::swiglu(&mut gate[..rows * ff], &up[..rows * ff], flavour),
        FfnAct::Gelu => ops::geglu(&mut gate[..rows * ff], &up[..rows * ff], flavour),
        FfnAct::SwigluOai => ops::swiglu_oai(&mut gate[..rows * ff], &up[..rows * ff]),
    }
}

/// A whole gated FFN over `rows` rows of `x` without any exchange (an expert's, a shared
/// expert's): [`gated`], then the down projection (and its bias) into `out`.
#[allow(clippy::too_many_arguments)]
pub(super) fn gated_down(
    pool: &ThreadPool,
    acts: &mut QuantActs,
    x: &[f32],
    rows: usize,
    f: &GatedFfn,
    (gate, up): (&mut Vec<f32>, &mut Vec<f32>),
    act: FfnAct,
    flavour: Flavour,
    out: &mut Vec<f32>,
) {
    gated(pool, acts, x, rows, f, (&mut *gate, up), act, flavour);
    let ff = f.gate.rows();
    acts.quantize(f.down.ggml_type(), &gate[..rows * ff], rows, ff);
    mm(pool, &f.down, acts, out);
    add_bias(out, f.down_b.as_deref(), rows);
}

impl Blocks<'_, '_> {
    /// The gated feed-forward block (`down(act(gate(xn)) * up(xn))`) over the live rows; the
    /// output rows land in `proj`.
    pub(crate) fn ffn(&mut self, lw: &LayerWeights) -> Result<()> {
        match &lw.ffn {
            FfnWeights::Dense(f) => self.dense_ffn(f),
            FfnWeights::Moe {
                router,
                router_b,
                select_b,
                experts,
                first,
                shared,
            } => self.moe_ffn(
                router,
                (router_b.as_deref(), select_b.as_deref()),
                (experts, *first),
                shared.as_deref(),
            ),
        }
    }

    fn dense_ffn(&mut self, f: &GatedFfn) -> Result<()> {
        let rows = self.live;
        let e = self.cfg.n_embd;
        let ff = f.gate.rows();
        let s = &mut *self.s;
        gated(
            self.pool,
            &mut s.acts,
            &s.xn[..rows * e],
            rows,
            f,
            (&mut s.gate, &mut s.up),
            self.cfg.ffn_act,
            self.flavour,
        );
        let combine = CombineMode::of(self.cfg, self.spec);
        let act: &[f32] = if combine.gather_ffn {
            let full = self.cfg.n_ff;
            let src = &s.gate[..rows * ff];
            gather(&mut *self.comm, Axis::Ffn, rows, src, &mut s.gathered, full)?
        } else {
            &s.gate[..rows * ff]
        };
        s.acts
            .quantize(f.down.ggml_type(), act, rows, act.len() / rows.max(1));
        mm(self.pool, &f.down, &s.acts, &mut s.proj);
        self.combine_output(&combine, rows, f.down.rows())?;
        self.out_first = 0;
        self.out_rows = rows;
        Ok(())
    }
}
