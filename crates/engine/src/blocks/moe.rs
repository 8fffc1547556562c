//! A mixture of experts, as llama.cpp's `build_moe_ffn` computes it: routing (softmax,
//! sigmoid or group-limited), each expert's FFN over the rows routed to it, a shared expert,
//! and the exchanges of the two ways to split experts over ranks (each rank a slice of every
//! expert's columns, or whole experts each). Its own module: the routing and the grouping of
//! rows by expert are most of its code, and none of it concerns dense layers.

use strata_kernels::{QMatrix, ops};

use super::ffn::{gated, gated_down};
use super::{Blocks, CombineMode, add_bias, gather, mm};
use crate::config::{ExpertGroups, FfnAct, Gating};
use crate::model::{Axis, grow};
use crate::weights::{GatedFfn, SharedExpert};
use crate::{Error, ExpertSplit, Result};

/// DeepSeek V3's group-limited routing over one row's selection scores: each group of
/// `n_expert / count` experts is scored by the sum of its two best scores (ggml's `sum_rows`,
/// in f64), and the experts of all but the `used` best groups are masked to -inf.
fn mask_groups(
    select: &mut [f32],
    g: ExpertGroups,
    order: &mut Vec<u32>,
    group_scores: &mut Vec<f32>,
) {
    let per = select.len() / g.count;
    group_scores.clear();
    for grp in select.chunks_exact(per) {
        order.clear();
        order.extend(0..per as u32);
        order.sort_unstable_by(|&a, &b| grp[b as usize].total_cmp(&grp[a as usize]));
        let best = f64::from(grp[order[0] as usize]) + f64::from(grp[order[1] as usize]);
        group_scores.push(best as f32);
    }
    order.clear();
    order.extend(0..g.count as u32);
    order.sort_unstable_by(|&a, &b| group_scores[b as usize].total_cmp(&group_scores[a as usize]));
    for &dropped in &order[g.used..] {
        let d = dropped as usize;
        select[d * per..(d + 1) * per].fill(f32::NEG_INFINITY);
    }
}

/// The experts (from expert `first` on) that choices were routed to, with the span of their
/// choices in the grouped order (`starts[x]..starts[x + 1]`).
fn routed<'e>(
    experts: &'e [GatedFfn],
    first: usize,
    starts: &[usize],
) -> impl Iterator<Item = (&'e GatedFfn, usize, usize)> {
    experts
        .iter()
        .enumerate()
        .map(move |(i, f)| (f, starts[first + i], starts[first + i + 1]))
        .filter(|&(_, a, b)| a < b)
}

/// Bytes of an expert's three matrices (what running it reads).
fn expert_bytes(f: &GatedFfn) -> u64 {
    [&f.gate, &f.up, &f.down]
        .iter()
        .map(|q| (q.rows() * q.row_bytes()) as u64)
        .sum()
}

/// Copies the rows of `xn` (`e` wide) that the choices `entries` (`row * k + slot`) route to an
/// expert into `input`, in order.
fn gather_rows(input: &mut Vec<f32>, xn: &[f32], entries: &[u32], k: usize, e: usize) {
    grow(input, entries.len() * e);
    for (j, &i) in entries.iter().enumerate() {
        let r = i as usize / k;
        input[j * e..(j + 1) * e].copy_from_slice(&xn[r * e..(r + 1) * e]);
    }
}

/// Places an expert's output rows (`w` wide, one per choice in `entries`) at their choices.
fn scatter_rows(outputs: &mut [f32], rows: &[f32], entries: &[u32], w: usize) {
    for (j, &i) in entries.iter().enumerate() {
        let i = i as usize;
        outputs[i * w..(i + 1) * w].copy_from_slice(&rows[j * w..(j + 1) * w]);
    }
}

fn grow_u32(v: &mut Vec<u32>, n: usize) {
    if v.len() < n {
        v.resize(n, 0);
    }
}

impl Blocks<'_, '_> {
    /// A mixture of experts, as llama.cpp's `build_moe_ffn` computes it: router logits (an
    /// ordinary product), their softmax (ggml's operator), the `n_used` most probable experts
    /// (best first) with their probabilities, renormalised and scaled if the family says so;
    /// then each expert's FFN over the rows routed to it (llama.cpp's `mul_mat_id`: the rows
    /// form one batch, which picks the kernel, and never tinyBLAS), each output times its
    /// weight, and a row's outputs summed in choice order.
    pub(super) fn moe_ffn(
        &mut self,
        router: &QMatrix,
        (router_b, select_b): (Option<&[f32]>, Option<&[f32]>),
        (experts, first): (&[GatedFfn], usize),
        shared: Option<&SharedExpert>,
    ) -> Result<()> {
        let rows = self.live;
        let e = self.cfg.n_embd;
        let Some(moe) = self.cfg.moe else {
            return Err(Error::InvalidModel("experts without expert counts".into()));
        };
        let (nx, k) = (moe.n_expert, moe.n_used);
        let s = &mut *self.s;
        let m = &mut s.moe;
        s.acts
            .quantize(router.ggml_type(), &s.xn[..rows * e], rows, e);
        mm(self.pool, router, &s.acts, &mut m.probs);
        add_bias(&mut m.probs, router_b, rows);
        grow_u32(&mut m.chosen, rows * k);
        grow(&mut m.weight, rows * k);
        for r in 0..rows {
            let p = &mut m.probs[r * nx..(r + 1) * nx];
            match moe.gating {
                Gating::Softmax => ops::softmax_op(p, self.flavour),
                // ggml_sigmoid: `1 / (1 + expf(-x))`.
                Gating::Sigmoid => p.iter_mut().for_each(|v| *v = 1.0 / (1.0 + (-*v).exp())),
                Gating::SoftmaxWeight => {}
            }
            // The choice follows the probabilities plus any selection bias, within the best
            // groups; the weights are the probabilities themselves.
            m.select.clear();
            m.select.extend_from_slice(p);
            if let Some(b) = select_b {
                ops::add_assign(&mut m.select, b);
            }
            if let Some(g) = moe.groups {
                mask_groups(&mut m.select, g, &mut m.order, &mut m.group_scores);
            }
            let sel = &m.select;
            m.order.clear();
            m.order.extend(0..nx as u32);
            m.order
                .sort_unstable_by(|&a, &b| sel[b as usize].total_cmp(&sel[a as usize]));
            let w = &mut m.weight[r * k..(r + 1) * k];
            for (slot, &x) in m.order[..k].iter().enumerate() {
                m.chosen[r * k + slot] = x;
                w[slot] = p[x as usize];
            }
            if moe.gating == Gating::SoftmaxWeight {
                // ggml's soft_max over the chosen logits only.
                ops::softmax_op(w, self.flavour);
            }
            if moe.norm_weights {
                // ggml_sum_rows (in f64), clamped to the smallest f16 normal, then a division.
                let sum = w.iter().map(|&v| f64::from(v)).sum::<f64>() as f32;
                let sum = sum.max(6.103_515_6e-5);
                for v in w.iter_mut() {
                    *v /= sum;
                }
            }
            if moe.weights_scale != 1.0 {
                for v in w.iter_mut() {
                    *v *= moe.weights_scale;
                }
            }
        }
        // Group the choices by expert, rows in order (a counting sort, as ggml groups them).
        m.starts.clear();
        m.starts.resize(nx + 1, 0);
        for &x in &m.chosen[..rows * k] {
            m.starts[x as usize + 1] += 1;
        }
        for x in 0..nx {
            m.starts[x + 1] += m.starts[x];
        }
        grow_u32(&mut m.grouped, rows * k);
        m.fill.clear();
        m.fill.extend_from_slice(&m.starts);
        for (i, &x) in m.chosen[..rows * k].iter().enumerate() {
            m.grouped[m.fill[x as usize]] = i as u32;
            m.fill[x as usize] += 1;
        }
        // Under tensor parallelism each rank computes its columns of every expert's gate and up,
        // the group all-gathers the activations, and each rank projects them onto its rows of
        // the model width; otherwise every output is whole.
        let cfg = self.cfg;
        let tp = self.spec.ffn_exp.is_some();
        let ew = if tp {
            self.spec.embd_rows(cfg).len()
        } else {
            e
        };
        grow(&mut m.outputs, rows * k * ew);
        s.acts.set_mul_mat_id(true);
        // Each routed expert's activations (its gate and up over its rows), in grouped order;
        // then, all-gathered under tensor parallelism, its down projection.
        let n_ent = rows * k;
        let lf = experts.first().map_or(0, |f| f.gate.rows());
        grow(&mut m.act, n_ent * lf);
        for (f, a, b) in routed(experts, first, &m.starts) {
            let c = b - a;
            s.expert_bytes += expert_bytes(f);
            gather_rows(&mut m.input, &s.xn, &m.grouped[a..b], k, e);
            gated(
                self.pool,
                &mut s.acts,
                &m.input[..c * e],
                c,
                f,
                (&mut s.gate, &mut s.up),
                cfg.ffn_act,
                self.flavour,
            );
            m.act[a * lf..b * lf].copy_from_slice(&s.gate[..c * lf]);
        }
        let (act, ff): (&[f32], usize) = if tp {
            let ff = moe.n_ff_exp;
            let src = &m.act[..n_ent * lf];
            let all = gather(
                &mut *self.comm,
                Axis::ExpertFfn,
                n_ent,
                src,
                &mut m.act_full,
                ff,
            )?;
            (all, ff)
        } else {
            (&m.act, lf)
        };
        for (f, a, b) in routed(experts, first, &m.starts) {
            let c = b - a;
            s.acts
                .quantize(f.down.ggml_type(), &act[a * ff..b * ff], c, ff);
            mm(self.pool, &f.down, &s.acts, &mut m.down);
            add_bias(&mut m.down, f.down_b.as_deref(), c);
            scatter_rows(&mut m.outputs, &m.down, &m.grouped[a..b], ew);
        }
        s.acts.set_mul_mat_id(false);
        let has_shared = moe.n_ff_shexp.is_some();
        if let Some(x) = shared {
            self.shared_expert(x);
        }
        if let Some(split) = &self.spec.experts {
            self.exchange_experts(split, has_shared)?;
        }
        let s = &mut *self.s;
        let m = &mut s.moe;
        grow(&mut s.proj, rows * ew);
        for r in 0..rows {
            let out = &mut s.proj[r * ew..(r + 1) * ew];
            for slot in 0..k {
                let i = r * k + slot;
                let w = m.weight[i];
                let y = &m.outputs[i * ew..(i + 1) * ew];
                if slot == 0 {
                    for (o, &v) in out.iter_mut().zip(y) {
                        *o = v * w;
                    }
                } else {
                    for (o, &v) in out.iter_mut().zip(y) {
                        *o += v * w;
                    }
                }
            }
            // The shared expert's contribution joins after the routed ones (ggml_add).
            if has_shared {
                ops::add_assign(out, &m.shared[r * ew..(r + 1) * ew]);
            }
        }
        self.out_first = 0;
        self.out_rows = rows;
        if tp {
            // This rank's rows of the model width, all-gathered into whole rows.
            let mode = CombineMode::of(cfg, self.spec);
            return self.combine_output(&mode, rows, ew);
        }
        self.out_gathered = false;
        self.out_first = 0;
        self.out_rows = rows;
        Ok(())
    }

    /// Expert parallelism's exchange: every member sends the outputs of the choices routed to
    /// its experts (grouped by expert, in the order all members derive from the same routing)
    /// and, on its owner, the shared expert's contributions; every member places what it
    /// receives where one process would have computed it.
    fn exchange_experts(&mut self, split: &ExpertSplit, has_shared: bool) -> Result<()> {
        let (rows, e) = (self.live, self.cfg.n_embd);
        let m = &mut self.s.moe;
        let shared_len = |member: usize| {
            if has_shared && member == split.shared_owner {
                rows * e
            } else {
                0
            }
        };
        m.counts.clear();
        for (i, p) in split.parts.iter().enumerate() {
            m.counts
                .push((m.starts[p.end] - m.starts[p.start]) * e + shared_len(i));
        }
        let mine = split.mine();
        m.send.clear();
        for &i in &m.grouped[m.starts[mine.start]..m.starts[mine.end]] {
            let i = i as usize;
            m.send.extend_from_slice(&m.outputs[i * e..(i + 1) * e]);
        }
        if shared_len(split.me) > 0 {
            m.send.extend_from_slice(&m.shared[..rows * e]);
        }
        let total = m.counts.iter().sum::<usize>();
        grow(&mut m.recv, total);
        self.comm
            .all_gather_varying(&m.counts, &m.send, &mut m.recv[..total])
            .map_err(Error::Collective)?;
        if has_shared {
            grow(&mut m.shared, rows * e);
        }
        let mut at = 0;
        for (member, p) in split.parts.iter().enumerate() {
            for &i in &m.grouped[m.starts[p.start]..m.starts[p.end]] {
                let i = i as usize;
                m.outputs[i * e..(i + 1) * e].copy_from_slice(&m.recv[at..at + e]);
                at += e;
            }
            let n = shared_len(member);
            m.shared[..n].copy_from_slice(&m.recv[at..at + n]);
            at += n;
        }
        Ok(())
    }

    /// A shared expert's contributions into `moe.shared`, as llama.cpp's graphs compute them:
    /// the FFN over every row, times `silu(g) / g` (a sigmoid by ggml's operators) of the row's
    /// gate logit `g` when the model has a gate (Qwen2-MoE).
    fn shared_expert(&mut self, x: &SharedExpert) {
        let rows = self.live;
        let e = self.cfg.n_embd;
        let s = &mut *self.s;
        let m = &mut s.moe;
        if let Some(g) = &x.gate {
            s.acts.quantize(g.ggml_type(), &s.xn[..rows * e], rows, e);
            mm(self.pool, g, &s.acts, &mut m.probs);
            for v in &mut m.probs[..rows] {
                // ggml_silu of a one-element row: the scalar `x / (1 + expf(-x))`.
                let silu = *v / (1.0 + (-*v).exp());
                *v = silu / *v;
            }
        }
        gated_down(
            self.pool,
            &mut s.acts,
            &s.xn[..rows * e],
            rows,
            &x.ffn,
            (&mut s.gate, &mut s.up),
            FfnAct::Silu,
            self.flavour,
            &mut m.down,
        );
        // The model width, or this rank's rows of it under tensor parallelism.
        let w = x.ffn.down.rows();
        grow(&mut m.shared, rows * w);
        for r in 0..rows {
            let y = &m.down[r * w..(r + 1) * w];
            let out = &mut m.shared[r * w..(r + 1) * w];
            match x.gate {
                Some(_) => {
                    let g = m.probs[r];
                    for (o, &v) in out.iter_mut().zip(y) {
                        *o = v * g;
                    }
                }
                None => out.copy_from_slice(y),
            }
        }
    }
}
