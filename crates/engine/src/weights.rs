//! Loading a shard's weights from the mapped GGUF file.
//!
//! Row slices (query/key/value heads, FFN gate/up columns, vocabulary rows) are contiguous in the
//! file and stay zero-copy views of the map, so only the pages of the owned rows are ever read.
//! Column slices (the inputs of the attention output and FFN down projections under tensor
//! parallelism) are gathered into owned buffers once at load time.

use std::ops::Range;

use strata_gguf::{GgufFile, TensorInfo};
use strata_kernels::formats::dequantize_row;
use strata_kernels::{QMatrix, WeightBytes};

use crate::{Combine, Error, ModelConfig, Result, ShardSpec};

/// Weights of one decoder layer, restricted to a shard's heads and FFN columns.
#[derive(Debug)]
pub(crate) struct LayerWeights {
    /// RMSNorm weights of the attention and FFN inputs (none in OLMo 2, which normalises
    /// block outputs only).
    pub(crate) attn_norm: Option<Vec<f32>>,
    /// Where queries, keys and values come from.
    pub(crate) attn: AttnProj,
    pub(crate) wo: QMatrix,
    /// Bias of the attention output (whole model width: added once the shards' outputs are
    /// combined).
    pub(crate) bo: Option<Vec<f32>>,
    /// Attention sinks, one logit per query head of the whole model (gpt-oss): each head's
    /// softmax weighs them in as a key that contributes no value.
    pub(crate) sinks: Option<Vec<f32>>,
    pub(crate) ffn_norm: Option<Vec<f32>>,
    /// The feed-forward block: one gated FFN, or a mixture of experts.
    pub(crate) ffn: FfnWeights,
    /// RMSNorm weights of queries and keys: per head (Gemma 3, Qwen3: one head wide), or over
    /// whole rows (OLMo 2: the full Q and K widths, of which each rank applies its slice).
    pub(crate) q_norm: Option<Vec<f32>>,
    pub(crate) k_norm: Option<Vec<f32>>,
    /// RMSNorm weights applied to the attention and FFN outputs before the residual (Gemma 3).
    pub(crate) attn_post_norm: Option<Vec<f32>>,
    pub(crate) ffn_post_norm: Option<Vec<f32>>,
}

/// A layer's query, key and value projections.
#[derive(Debug)]
pub(crate) enum AttnProj {
    /// Per-head Q, K and V (every family but DeepSeek's).
    Heads(HeadsQkv),
    /// Multi-head latent attention (DeepSeek).
    Latent(MlaWeights),
}

/// The shard's rows of Q, K and V.
#[derive(Debug)]
pub(crate) struct HeadsQkv {
    pub(crate) wq: QMatrix,
    pub(crate) wk: QMatrix,
    pub(crate) wv: QMatrix,
    /// Biases of the shard's Q, K and V rows (Qwen2, and any file that has them).
    pub(crate) bq: Option<Vec<f32>>,
    pub(crate) bk: Option<Vec<f32>>,
    pub(crate) bv: Option<Vec<f32>>,
}

/// Multi-head latent attention's projections, for the shard's query heads.
#[derive(Debug)]
pub(crate) struct MlaWeights {
    /// Queries of the shard's heads (`nope` then rotated elements per head).
    pub(crate) q: MlaQuery,
    /// The latent row and the shared rotated key part (`attn_kv_a_mqa`: `kv_lora + rope`
    /// rows), and the latent row's RMSNorm.
    pub(crate) kv_a: QMatrix,
    pub(crate) kv_a_norm: Vec<f32>,
    /// Per local head: the query's un-rotated part into the latent space (`attn_k_b`,
    /// `kv_lora` rows of `nope`), and the latent output back to the head's values
    /// (`attn_v_b`, `v_head` rows of `kv_lora`).
    pub(crate) k_b: Vec<QMatrix>,
    pub(crate) v_b: Vec<QMatrix>,
}

/// How queries are projected under MLA.
#[derive(Debug)]
pub(crate) enum MlaQuery {
    /// One matrix (`attn_q`, DeepSeek V2 Lite).
    Direct(QMatrix),
    /// Through a compressed rank: `attn_q_a`, an RMSNorm, `attn_q_b`.
    Lora {
        a: QMatrix,
        norm: Vec<f32>,
        b: QMatrix,
    },
}

impl AttnProj {
    /// The matrices of the projections (for byte counts).
    pub(crate) fn matrices(&self) -> Vec<&QMatrix> {
        match self {
            AttnProj::Heads(h) => vec![&h.wq, &h.wk, &h.wv],
            AttnProj::Latent(m) => {
                let mut v = match &m.q {
                    MlaQuery::Direct(q) => vec![q],
                    MlaQuery::Lora { a, b, .. } => vec![a, b],
                };
                v.push(&m.kv_a);
                v.extend(m.k_b.iter().chain(&m.v_b));
                v
            }
        }
    }
}

/// A gated FFN: `down(act(gate(x) + gate_b) * (up(x) + up_b)) + down_b`, the biases only where
/// the model has them (gpt-oss's experts).
#[derive(Debug)]
pub(crate) struct GatedFfn {
    pub(crate) gate: QMatrix,
    pub(crate) up: QMatrix,
    pub(crate) down: QMatrix,
    pub(crate) gate_b: Option<Vec<f32>>,
    pub(crate) up_b: Option<Vec<f32>>,
    pub(crate) down_b: Option<Vec<f32>>,
}

/// A layer's feed-forward block.
#[derive(Debug)]
pub(crate) enum FfnWeights {
    /// One FFN (the shard's columns of it).
    Dense(GatedFfn),
    /// A router (`n_expert` rows, f32 in llama.cpp's files) and every expert's FFN, each a view
    /// of its slice of the layer's 3-D expert tensors.
    Moe {
        router: QMatrix,
        /// Bias of the router's logits (gpt-oss).
        router_b: Option<Vec<f32>>,
        /// Bias added to the probabilities to choose the experts, not to weigh them
        /// (`ffn_exp_probs_b`, DeepSeek V3).
        select_b: Option<Vec<f32>>,
        /// The experts this shard owns, from expert `first` on (all of them, but under expert
        /// parallelism).
        experts: Vec<GatedFfn>,
        first: usize,
        /// An expert every token uses (Qwen2-MoE), with its gate.
        shared: Option<Box<SharedExpert>>,
    },
}

/// A shared expert: an FFN over every row, its output scaled by `sigmoid(gate · x)` when the
/// model has a gate vector (`ffn_gate_inp_shexp`).
#[derive(Debug)]
pub(crate) struct SharedExpert {
    pub(crate) ffn: GatedFfn,
    /// The gate, as a one-row f32 matrix.
    pub(crate) gate: Option<QMatrix>,
}

/// All weights a shard needs.
#[derive(Debug)]
pub(crate) struct Weights {
    pub(crate) layers: Vec<LayerWeights>,
    /// Token embedding (first stage only; rows are read on demand from the map).
    pub(crate) embd: Option<QMatrix>,
    /// Final norm and the shard's rows of the LM head (last stage only).
    pub(crate) head: Option<(Vec<f32>, QMatrix)>,
    /// Llama 3's per-frequency RoPE divisors (`rope_freqs.weight`, `rope_dims / 2` values).
    pub(crate) rope_factors: Option<Vec<f32>>,
    /// LongRoPE's divisors beyond and within the original context (Phi-3's
    /// `rope_factors_long` / `rope_factors_short`).
    pub(crate) rope_long_short: Option<(Vec<f32>, Vec<f32>)>,
    /// Experts a token uses, and experts per layer (0 without experts).
    pub(crate) moe_used: usize,
    pub(crate) moe_total: usize,
}

fn kernel_err(t: &TensorInfo) -> impl FnOnce(strata_kernels::Error) -> Error + '_ {
    move |source| Error::Kernel {
        tensor: t.name.clone(),
        source,
    }
}

fn tensor<'a>(file: &'a GgufFile, name: &str, cols: usize, rows: usize) -> Result<&'a TensorInfo> {
    let t = file.require_tensor(name)?;
    if t.row_len() != cols || t.n_rows() != rows {
        return Err(Error::InvalidModel(format!(
            "{name} is {}x{}, expected {cols}x{rows}",
            t.row_len(),
            t.n_rows()
        )));
    }
    Ok(t)
}

/// Rows `rows` of a `cols x n_rows` matrix, as a view of the map.
fn row_slice(
    file: &GgufFile,
    name: &str,
    cols: usize,
    n_rows: usize,
    rows: Range<usize>,
) -> Result<QMatrix> {
    let t = tensor(file, name, cols, n_rows)?;
    let rb = t.row_bytes();
    let data = WeightBytes::Mapped {
        file: file.clone(),
        start: t.offset as usize + rows.start * rb,
        len: rows.len() * rb,
    };
    QMatrix::new(t.ggml_type, rows.len(), cols, data)
        .map(|m| m.cut_from(n_rows))
        .map_err(kernel_err(t))
}

/// A row slice in the layout the compute kernels prefer (repacked into an owned buffer when a
/// SIMD kernel exists for the format).
fn compute_rows(
    file: &GgufFile,
    name: &str,
    cols: usize,
    n_rows: usize,
    rows: Range<usize>,
) -> Result<QMatrix> {
    Ok(row_slice(file, name, cols, n_rows, rows)?.prepared())
}

/// Columns `keep` of every row of a `cols x n_rows` matrix (copied unless `keep` is all columns).
fn col_slice(
    file: &GgufFile,
    name: &str,
    cols: usize,
    n_rows: usize,
    keep: Range<usize>,
) -> Result<QMatrix> {
    if keep == (0..cols) {
        return compute_rows(file, name, cols, n_rows, 0..n_rows);
    }
    let t = tensor(file, name, cols, n_rows)?;
    let ty = t.ggml_type;
    let (Some(skip), Some(take)) = (ty.row_bytes(keep.start), ty.row_bytes(keep.len())) else {
        return Err(Error::InvalidShard(format!(
            "{name}: column range {keep:?} does not fall on {ty} block boundaries"
        )));
    };
    let src = file.tensor_data(t);
    let rb = t.row_bytes();
    let mut out = Vec::with_capacity(n_rows * take);
    for r in 0..n_rows {
        out.extend_from_slice(&src[r * rb + skip..r * rb + skip + take]);
    }
    QMatrix::new(ty, n_rows, keep.len(), WeightBytes::Owned(out))
        .map(|m| m.cut_from(n_rows).prepared())
        .map_err(kernel_err(t))
}

/// A 1-D f32 (or f16) tensor of `len` elements, as f32.
fn vector(file: &GgufFile, name: &str, len: usize) -> Result<Vec<f32>> {
    let t = file.require_tensor(name)?;
    if t.dims.iter().product::<u64>() != len as u64 {
        return Err(Error::InvalidModel(format!(
            "{name} has {:?} elements, expected {len}",
            t.dims
        )));
    }
    let mut v = vec![0.0; len];
    dequantize_row(t.ggml_type, file.tensor_data(t), &mut v);
    if v.iter().any(|x| x.is_nan()) {
        return Err(Error::InvalidModel(format!(
            "{name} ({}) is not a float vector",
            t.ggml_type
        )));
    }
    Ok(v)
}

/// Where a layer's Q, K and V come from: three tensors, or one fused `attn_qkv` whose rows are
/// Q's, then K's, then V's (Phi-3 and some conversions).
struct QkvSource {
    fused: bool,
}

impl QkvSource {
    fn of(file: &GgufFile, l: usize) -> QkvSource {
        QkvSource {
            fused: file.tensor(&format!("blk.{l}.attn_qkv.weight")).is_some(),
        }
    }

    /// The tensor holding part `which` (`q`, `k` or `v`), and the row where that part starts.
    fn locate(&self, l: usize, which: &str, cfg: &ModelConfig, suffix: &str) -> (String, usize) {
        if self.fused {
            let at = match which {
                "q" => 0,
                "k" => cfg.q_width(),
                _ => cfg.q_width() + cfg.kv_width(),
            };
            (format!("blk.{l}.attn_qkv.{suffix}"), at)
        } else {
            (format!("blk.{l}.attn_{which}.{suffix}"), 0)
        }
    }

    fn total_rows(&self, which: &str, cfg: &ModelConfig) -> usize {
        match (self.fused, which) {
            (true, _) => cfg.q_width() + 2 * cfg.kv_width(),
            (false, "q") => cfg.q_width(),
            (false, _) => cfg.kv_width(),
        }
    }
}

/// Elements `range` of an optional 1-D tensor of `len` elements (a bias), as f32.
fn opt_slice(
    file: &GgufFile,
    name: &str,
    len: usize,
    range: Range<usize>,
) -> Result<Option<Vec<f32>>> {
    if file.tensor(name).is_none() {
        return Ok(None);
    }
    Ok(Some(vector(file, name, len)?[range].to_vec()))
}

/// Loads an output projection (name, columns, the shard's columns) as the shard combines it.
type OutProj<'a> = dyn Fn(&str, usize, Range<usize>) -> Result<QMatrix> + 'a;

/// A layer's dense FFN: the shard's gate and up rows (separate tensors, or one fused tensor
/// holding the gate's rows, then the up projection's) and its down projection.
fn dense_ffn(
    file: &GgufFile,
    l: usize,
    cfg: &ModelConfig,
    spec: &ShardSpec,
    out_proj: &OutProj<'_>,
) -> Result<FfnWeights> {
    let n = |s: &str| format!("blk.{l}.{s}.weight");
    let (e, ff) = (cfg.n_embd, cfg.n_ff);
    let (gate, up) = if file.tensor(&n("ffn_gate")).is_some() {
        (
            compute_rows(file, &n("ffn_gate"), e, ff, spec.ffn.clone())?,
            compute_rows(file, &n("ffn_up"), e, ff, spec.ffn.clone())?,
        )
    } else {
        let up = |at: usize| {
            compute_rows(
                file,
                &n("ffn_up"),
                e,
                2 * ff,
                at + spec.ffn.start..at + spec.ffn.end,
            )
        };
        (up(0)?, up(ff)?)
    };
    Ok(FfnWeights::Dense(GatedFfn {
        gate,
        up,
        down: out_proj(&n("ffn_down"), ff, spec.ffn.clone())?,
        gate_b: None,
        up_b: None,
        down_b: None,
    }))
}

/// Rows `keep` of matrix `x` (of `rows` rows) of a 3-D tensor `[cols, rows, n]` (an expert, a
/// head), as a view of the map. llama.cpp picks the kernel by the matrix's own row count, so a
/// slice keeps the whole matrix's order.
fn slab(
    file: &GgufFile,
    t: &TensorInfo,
    x: usize,
    (rows, keep): (usize, Range<usize>),
    cols: usize,
) -> Result<QMatrix> {
    let rb = t.row_bytes();
    let data = WeightBytes::Mapped {
        file: file.clone(),
        start: t.offset as usize + (x * rows + keep.start) * rb,
        len: keep.len() * rb,
    };
    let m = QMatrix::new(t.ggml_type, keep.len(), cols, data).map_err(kernel_err(t))?;
    Ok(m.cut_from(rows))
}

/// Rows `keep` of expert `x` of a 3-D expert tensor (`mul_mat_id` repacks experts as it
/// repacks 2-D weights).
fn expert(
    file: &GgufFile,
    t: &TensorInfo,
    x: usize,
    rows: (usize, Range<usize>),
    cols: usize,
) -> Result<QMatrix> {
    Ok(slab(file, t, x, rows, cols)?.prepared())
}

/// A 3-D tensor's `dims`, checked dimension by dimension (a tensor of the right size but
/// another shape would pair the wrong rows).
fn three_d<'a>(
    file: &'a GgufFile,
    name: &str,
    want: [usize; 3],
    what: &str,
) -> Result<&'a TensorInfo> {
    let t = file.require_tensor(name)?;
    let want = want.map(|d| d as u64);
    if t.dims.as_slice() != want {
        return Err(Error::InvalidModel(format!(
            "{name} is {:?}, expected {want:?} ({what})",
            t.dims
        )));
    }
    Ok(t)
}

/// A layer's latent-attention projections for the shard's query heads.
fn mla_weights(
    file: &GgufFile,
    l: usize,
    cfg: &ModelConfig,
    spec: &ShardSpec,
) -> Result<MlaWeights> {
    let Some(m) = cfg.mla else {
        return Err(Error::InvalidModel(format!(
            "{} layer {l} has latent attention but no latent sizes",
            cfg.arch
        )));
    };
    let n = |s: &str| format!("blk.{l}.{s}.weight");
    let (e, rope, nh) = (cfg.n_embd, cfg.rope_dims, cfg.n_head);
    let qh = m.q_head(rope);
    let heads = spec.q_heads.clone();
    let q_rows = heads.start * qh..heads.end * qh;
    let q = match m.q_lora {
        Some(r) => MlaQuery::Lora {
            a: compute_rows(file, &n("attn_q_a"), e, r, 0..r)?,
            norm: vector(file, &n("attn_q_a_norm"), r)?,
            b: compute_rows(file, &n("attn_q_b"), r, nh * qh, q_rows)?,
        },
        None => MlaQuery::Direct(compute_rows(file, &n("attn_q"), e, nh * qh, q_rows)?),
    };
    let kv_rows = m.kv_lora + rope;
    // ggml_mul_mat multiplies these 3-D tensors head by head and never repacks them.
    let per_head = |s: &str, cols: usize, rows: usize| -> Result<Vec<QMatrix>> {
        let t = three_d(file, &n(s), [cols, rows, nh], "one matrix per query head")?;
        heads
            .clone()
            .map(|h| {
                Ok(slab(file, t, h, (rows, 0..rows), cols)?
                    .never_repacked()
                    .prepared())
            })
            .collect()
    };
    Ok(MlaWeights {
        q,
        kv_a: compute_rows(file, &n("attn_kv_a_mqa"), e, kv_rows, 0..kv_rows)?,
        kv_a_norm: vector(file, &n("attn_kv_a_norm"), m.kv_lora)?,
        k_b: per_head("attn_k_b", m.nope, m.kv_lora)?,
        v_b: per_head("attn_v_b", m.kv_lora, m.v_head)?,
    })
}

/// A layer's mixture of experts: the router and every expert's gate, up and down matrices,
/// each tensor checked dimension by dimension (a 3-D tensor of the right size but another
/// shape would pair the wrong rows).
fn moe_ffn(file: &GgufFile, l: usize, cfg: &ModelConfig, spec: &ShardSpec) -> Result<FfnWeights> {
    let Some(moe) = cfg.moe else {
        return Err(Error::InvalidModel(format!(
            "{} layer {l} has experts but no expert counts",
            cfg.arch
        )));
    };
    let (e, fx, nx) = (cfg.n_embd, moe.n_ff_exp, moe.n_expert);
    let n = |s: &str| format!("blk.{l}.{s}.weight");
    let router = compute_rows(file, &n("ffn_gate_inp"), e, nx, 0..nx)?;
    let bias = |s: &str| format!("blk.{l}.{s}.bias");
    let router_b = opt_slice(file, &bias("ffn_gate_inp"), nx, 0..nx)?;
    let select_b = opt_slice(file, &bias("exp_probs_b"), nx, 0..nx)?;
    // Expert biases: one row per expert (`[rows, n_expert]`), or none.
    let expert_bias = |s: &str, rows: usize| -> Result<Option<Vec<f32>>> {
        let name = bias(s);
        let Some(t) = file.tensor(&name) else {
            return Ok(None);
        };
        if t.dims.as_slice() != [rows as u64, nx as u64] {
            return Err(Error::InvalidModel(format!(
                "{name} is {:?}, expected [{rows}, {nx}]",
                t.dims
            )));
        }
        Ok(Some(vector(file, &name, rows * nx)?))
    };
    let (gb, ub, db) = (
        expert_bias("ffn_gate_exps", fx)?,
        expert_bias("ffn_up_exps", fx)?,
        expert_bias("ffn_down_exps", e)?,
    );
    let row_of = |b: &Option<Vec<f32>>, x: usize, rows: usize| {
        b.as_ref().map(|b| b[x * rows..(x + 1) * rows].to_vec())
    };
    let three = |s: &str, cols: usize, rows: usize| -> Result<&TensorInfo> {
        three_d(
            file,
            &n(s),
            [cols, rows, nx],
            &format!("{nx} experts of {rows} rows of {cols}"),
        )
    };
    let (g, u, d) = (
        three("ffn_gate_exps", e, fx)?,
        three("ffn_up_exps", e, fx)?,
        three("ffn_down_exps", fx, e)?,
    );
    let mine = spec.experts.as_ref().map_or(0..nx, |x| x.mine());
    // Under tensor parallelism: the rank's columns of each expert's gate and up, and its
    // model-width rows of each expert's down projection.
    let cols = spec.ffn_exp.clone().unwrap_or(0..fx);
    let embd = match spec.ffn_exp {
        Some(_) => spec.embd_rows(cfg),
        None => 0..e,
    };
    let slice = |b: Option<Vec<f32>>, keep: &Range<usize>| b.map(|b| b[keep.clone()].to_vec());
    let experts = mine
        .clone()
        .map(|x| {
            Ok(GatedFfn {
                gate: expert(file, g, x, (fx, cols.clone()), e)?,
                up: expert(file, u, x, (fx, cols.clone()), e)?,
                down: expert(file, d, x, (e, embd.clone()), fx)?,
                gate_b: slice(row_of(&gb, x, fx), &cols),
                up_b: slice(row_of(&ub, x, fx), &cols),
                down_b: slice(row_of(&db, x, e), &embd),
            })
        })
        .collect::<Result<Vec<_>>>()?;
    if spec.ffn_exp.is_some() {
        // Reading a slice of every expert faults in the neighbouring pages of the other ranks'
        // rows too (the kernel maps pages around a fault): let the whole tensors' pages go. A
        // matrix read from the map faults its own pages back in when it is used.
        for t in [g, u, d] {
            file.release(t.offset as usize, file.tensor_data(t).len());
        }
    }
    // A family with a shared expert (its width set) requires its tensors, as llama.cpp does.
    let owns_shared = spec.experts.as_ref().is_none_or(|x| x.owns_shared());
    let shared = match moe.n_ff_shexp {
        Some(fs) if owns_shared => {
            let gate = match file.tensor(&n("ffn_gate_inp_shexp")) {
                Some(_) => Some(compute_rows(file, &n("ffn_gate_inp_shexp"), e, 1, 0..1)?),
                None => None,
            };
            Some(Box::new(SharedExpert {
                ffn: GatedFfn {
                    gate: compute_rows(file, &n("ffn_gate_shexp"), e, fs, 0..fs)?,
                    up: compute_rows(file, &n("ffn_up_shexp"), e, fs, 0..fs)?,
                    down: compute_rows(file, &n("ffn_down_shexp"), fs, e, embd.clone())?,
                    gate_b: None,
                    up_b: None,
                    down_b: None,
                },
                gate,
            }))
        }
        _ => None,
    };
    Ok(FfnWeights::Moe {
        router,
        router_b,
        select_b,
        experts,
        first: mine.start,
        shared,
    })
}

impl Weights {
    pub(crate) fn load(file: &GgufFile, cfg: &ModelConfig, spec: &ShardSpec) -> Result<Weights> {
        spec.validate(cfg)?;
        crate::models::check_known_tensors(file, cfg)?;
        let family = crate::models::family(cfg.kind).tensors();
        let hd = cfg.head_dim;
        let e = cfg.n_embd;
        let q_rows = {
            let h = spec.q_heads.clone();
            h.start * hd..h.end * hd
        };
        let kv = spec.kv_heads(cfg);
        let kv_rows = kv.start * hd..kv.end * hd;
        let q_width = cfg.q_width();
        // The output projection's input columns this shard owns (its heads' outputs).
        let out_cols = {
            let (h, vd) = (spec.q_heads.clone(), cfg.v_head_dim());
            h.start * vd..h.end * vd
        };
        // Output projections: row slices of whole dot products (Gather) or column slices
        // giving partial sums (Reduce).
        let out_proj = |name: &str, cols: usize, keep: Range<usize>| -> Result<QMatrix> {
            match &spec.combine {
                Combine::Gather { embd } => compute_rows(file, name, cols, e, embd.clone()),
                Combine::Reduce => col_slice(file, name, cols, e, keep),
            }
        };
        let mut layers = Vec::with_capacity(spec.layers.len());
        for l in spec.layers.clone() {
            let n = |s: &str| format!("blk.{l}.{s}.weight");
            let opt_vec = |want: bool, s: &str, len: usize| -> Result<Option<Vec<f32>>> {
                if want {
                    Ok(Some(vector(file, &n(s), len)?))
                } else {
                    Ok(None)
                }
            };
            let attn = if family.mla {
                AttnProj::Latent(mla_weights(file, l, cfg, spec)?)
            } else {
                let qkv = QkvSource::of(file, l);
                let part = |which: &str,
                            rows: &Range<usize>|
                 -> Result<(QMatrix, Option<Vec<f32>>)> {
                    let (name, at) = qkv.locate(l, which, cfg, "weight");
                    let total = qkv.total_rows(which, cfg);
                    let m = compute_rows(file, &name, e, total, at + rows.start..at + rows.end)?;
                    let (bias, at) = qkv.locate(l, which, cfg, "bias");
                    let b = opt_slice(file, &bias, total, at + rows.start..at + rows.end)?;
                    Ok((m, b))
                };
                let (wq, bq) = part("q", &q_rows)?;
                let (wk, bk) = part("k", &kv_rows)?;
                let (wv, bv) = part("v", &kv_rows)?;
                AttnProj::Heads(HeadsQkv {
                    wq,
                    wk,
                    wv,
                    bq,
                    bk,
                    bv,
                })
            };
            let ffn = if family.moe && cfg.moe.is_some_and(|m| m.is_moe_layer(l)) {
                moe_ffn(file, l, cfg, spec)?
            } else {
                dense_ffn(file, l, cfg, spec, &out_proj)?
            };
            layers.push(LayerWeights {
                attn_norm: opt_vec(!family.no_pre_norms, "attn_norm", e)?,
                q_norm: match (family.qk_norm, family.qk_norm_rows) {
                    (true, _) => opt_vec(true, "attn_q_norm", hd)?,
                    (false, rows) => opt_vec(rows, "attn_q_norm", q_width)?,
                },
                k_norm: match (family.qk_norm, family.qk_norm_rows) {
                    (true, _) => opt_vec(true, "attn_k_norm", hd)?,
                    (false, rows) => opt_vec(rows, "attn_k_norm", cfg.kv_width())?,
                },
                attn_post_norm: opt_vec(family.post_norms, "post_attention_norm", e)?,
                ffn_post_norm: opt_vec(family.post_norms, "post_ffw_norm", e)?,
                attn,
                wo: out_proj(&n("attn_output"), cfg.attn_out_width(), out_cols.clone())?,
                bo: opt_slice(file, &format!("blk.{l}.attn_output.bias"), e, 0..e)?,
                sinks: opt_vec(family.sinks, "attn_sinks", cfg.n_head)?,
                ffn_norm: opt_vec(
                    !family.no_pre_norms,
                    family.ffn_norm_tensor().trim_end_matches(".weight"),
                    e,
                )?,
                ffn,
            });
        }
        let embd = if spec.is_first_stage() {
            Some(row_slice(
                file,
                "token_embd.weight",
                e,
                cfg.n_vocab,
                0..cfg.n_vocab,
            )?)
        } else {
            None
        };
        let head = if spec.is_last_stage(cfg) {
            let name = if cfg.tied_embeddings {
                "token_embd.weight"
            } else {
                "output.weight"
            };
            Some((
                vector(file, "output_norm.weight", e)?,
                compute_rows(file, name, e, cfg.n_vocab, spec.vocab.clone())?,
            ))
        } else {
            None
        };
        let rope_factors = match file.tensor("rope_freqs.weight") {
            Some(_) => Some(vector(file, "rope_freqs.weight", cfg.rope_dims / 2)?),
            None => None,
        };
        let rope_long_short = match (
            file.tensor("rope_factors_long.weight"),
            file.tensor("rope_factors_short.weight"),
        ) {
            (None, None) => None,
            _ => Some((
                vector(file, "rope_factors_long.weight", cfg.rope_dims / 2)?,
                vector(file, "rope_factors_short.weight", cfg.rope_dims / 2)?,
            )),
        };
        Ok(Weights {
            layers,
            embd,
            head,
            rope_factors,
            rope_long_short,
            moe_used: cfg.moe.map_or(0, |m| m.n_used),
            moe_total: cfg.moe.map_or(0, |m| m.n_expert),
        })
    }
}

impl Weights {
    /// Bytes of the matrices every step reads: all but the experts (the shared expert and the
    /// router included), and the LM head.
    pub(crate) fn fixed_bytes(&self) -> usize {
        let m = |q: &QMatrix| q.rows() * q.row_bytes();
        let layers: usize = self
            .layers
            .iter()
            .map(|l| {
                let ffn = match &l.ffn {
                    FfnWeights::Dense(f) => m(&f.gate) + m(&f.up) + m(&f.down),
                    FfnWeights::Moe { router, shared, .. } => {
                        m(router)
                            + shared.as_ref().map_or(0, |x| {
                                m(&x.ffn.gate)
                                    + m(&x.ffn.up)
                                    + m(&x.ffn.down)
                                    + x.gate.as_ref().map_or(0, m)
                            })
                    }
                };
                l.attn.matrices().into_iter().map(m).sum::<usize>() + m(&l.wo) + ffn
            })
            .sum();
        layers + self.head.as_ref().map_or(0, |(_, h)| m(h))
    }

    /// Bytes of weight matrices one decode step reads (every layer matrix and the LM head; the
    /// embedding only contributes one row).
    pub(crate) fn streamed_bytes(&self) -> usize {
        let m = |q: &QMatrix| q.rows() * q.row_bytes();
        let experts: usize = self
            .layers
            .iter()
            .map(|l| match &l.ffn {
                FfnWeights::Dense(_) => 0,
                FfnWeights::Moe { experts, .. } => experts
                    .iter()
                    .map(|f| m(&f.gate) + m(&f.up) + m(&f.down))
                    .sum(),
            })
            .sum();
        // Each expert is chosen by `used / total` of the tokens, on average.
        self.fixed_bytes() + experts * self.moe_used / self.moe_total.max(1)
    }
}
