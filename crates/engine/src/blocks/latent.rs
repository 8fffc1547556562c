//! Multi-head latent attention (DeepSeek V2 and V3, and their relatives), in llama.cpp's
//! absorbed form: the cache holds one compressed latent row per position, shared by every
//! head, instead of each head's keys and values. It has its own projections and cache layout,
//! and shares the scoring loop and the output projection with [`super::attention`].

use strata_kernels::ops;

use super::attention::AttnJob;
use super::{Blocks, mm, rotate};
use crate::model::grow;
use crate::weights::{LayerWeights, MlaQuery, MlaWeights};
use crate::{Error, Result};

impl Blocks<'_, '_> {
    /// Multi-head latent attention as llama.cpp's DeepSeek graph runs it (absorbed): the
    /// queries (directly, or through a normed low rank), the latent row (normed) and the
    /// shared rotated key part; each head's un-rotated query projected into the latent space
    /// and joined to its rotated part; the latent row and rotated key cached as one key, its
    /// latent part doubling as the value; grouped attention of every head over that single
    /// KV head; each head's latent output decompressed into its values; then the output
    /// projection. Every product is ggml's, head by head where it multiplies 3-D tensors.
    pub(super) fn latent_attention(&mut self, lw: &LayerWeights, m: &MlaWeights) -> Result<()> {
        let cfg = self.cfg;
        let Some(mla) = cfg.mla else {
            return Err(Error::InvalidModel(
                "latent attention without its sizes".into(),
            ));
        };
        let n = self.live;
        let (e, rope) = (cfg.n_embd, cfg.rope_dims);
        let (qh, kl, vh, nope) = (mla.q_head(rope), mla.kv_lora, mla.v_head, mla.nope);
        let kw = cfg.head_dim;
        let n_q = m.k_b.len();
        let half = rope / 2;
        let li = self.li;
        let gl = self.spec.layers.start + li;
        let pool = self.pool;
        let s = &mut *self.s;
        let xn = &s.xn[..n * e];

        // Queries, `qh` per head: `nope` elements, then the rotated ones.
        match &m.q {
            MlaQuery::Direct(wq) => {
                s.acts.quantize(wq.ggml_type(), xn, n, e);
                mm(pool, wq, &s.acts, &mut s.up);
            }
            MlaQuery::Lora { a, norm, b } => {
                let r = a.rows();
                s.acts.quantize(a.ggml_type(), xn, n, e);
                mm(pool, a, &s.acts, &mut s.gate);
                for row in s.gate[..n * r].chunks_exact_mut(r) {
                    ops::rms_norm_in_place(row, norm, cfg.rms_eps);
                }
                s.acts.quantize(b.ggml_type(), &s.gate[..n * r], n, r);
                mm(pool, b, &s.acts, &mut s.up);
            }
        }
        // The latent row (normed) and the shared key part (rotated): the cached key.
        s.acts.quantize(m.kv_a.ggml_type(), xn, n, e);
        mm(pool, &m.kv_a, &s.acts, &mut s.k);
        let rows = self.rows;
        let rounds = self.order.scores().rounds_operand();
        let flavour = self.flavour;
        for t in 0..n {
            let (c, sn) = (
                &s.rope_cos[t * half..(t + 1) * half],
                &s.rope_sin[t * half..(t + 1) * half],
            );
            let k = &mut s.k[t * kw..(t + 1) * kw];
            ops::rms_norm_in_place(&mut k[..kl], &m.kv_a_norm, cfg.rms_eps);
            rotate(cfg, flavour, &mut k[kl..], c, sn);
            let (k, v) = (&s.k[t * kw..(t + 1) * kw], &s.k[t * kw..t * kw + kl]);
            self.caches
                .get_mut(rows.seq[t])
                .store(li, 0, rows.pos[t], k, v);
        }
        // Each head's query: its un-rotated part through `attn_k_b` into the latent space,
        // then its rotated part, rounded to f16 where it meets the f16 keys.
        grow(&mut s.q, n * n_q * kw);
        grow(&mut s.gate, n * nope);
        for (h, kb) in m.k_b.iter().enumerate() {
            for t in 0..n {
                let src = (t * n_q + h) * qh;
                s.gate[t * nope..(t + 1) * nope].copy_from_slice(&s.up[src..src + nope]);
            }
            s.acts
                .quantize(kb.ggml_type(), &s.gate[..n * nope], n, nope);
            mm(pool, kb, &s.acts, &mut s.v);
            for t in 0..n {
                let dst = (t * n_q + h) * kw;
                s.q[dst..dst + kl].copy_from_slice(&s.v[t * kl..(t + 1) * kl]);
            }
        }
        for t in 0..n {
            let (c, sn) = (
                &s.rope_cos[t * half..(t + 1) * half],
                &s.rope_sin[t * half..(t + 1) * half],
            );
            for h in 0..n_q {
                let src = (t * n_q + h) * qh + nope;
                let dst = &mut s.q[(t * n_q + h) * kw..(t * n_q + h + 1) * kw];
                dst[kl..].copy_from_slice(&s.up[src..src + rope]);
                rotate(cfg, flavour, &mut dst[kl..], c, sn);
                if rounds {
                    ops::round_f16_slice(dst);
                }
            }
        }

        // Every head reads the one latent KV head.
        let t_first = if self.trim { n - 1 } else { 0 };
        let n_out = n - t_first;
        grow(&mut self.s.att, n_out * n_q * kl);
        let job = AttnJob {
            li,
            gl,
            n_q,
            q0: self.spec.q_heads.start,
            kv0: 0,
            group: cfg.n_head,
            t_first,
            order: self.order,
        };
        self.attend(&job, None);

        // Each head's latent output through `attn_v_b` (llama.cpp decompresses every row
        // before it drops all but the last: follow its kernel choice).
        let s = &mut *self.s;
        grow(&mut s.gate, n_out * kl);
        grow(&mut s.v, n_out * n_q * vh);
        for (h, vb) in m.v_b.iter().enumerate() {
            for tt in 0..n_out {
                let src = (tt * n_q + h) * kl;
                s.gate[tt * kl..(tt + 1) * kl].copy_from_slice(&s.att[src..src + kl]);
            }
            s.acts
                .quantize(vb.ggml_type(), &s.gate[..n_out * kl], n_out, kl);
            s.acts.as_rows_of(n, t_first);
            mm(pool, vb, &s.acts, &mut s.up);
            for tt in 0..n_out {
                let dst = (tt * n_q + h) * vh;
                s.v[dst..dst + vh].copy_from_slice(&s.up[tt * vh..(tt + 1) * vh]);
            }
        }
        grow(&mut s.att, n_out * n_q * vh);
        s.att[..n_out * n_q * vh].copy_from_slice(&s.v[..n_out * n_q * vh]);
        self.attn_output(lw, n, t_first, n_q)
    }
}
