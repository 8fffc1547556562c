//! Attention arithmetic in llama.cpp's exact summation order.
//!
//! ggml computes `K·q` and `V·p` with f16 operands in two ways: one token at a time with
//! `ggml_vec_dot_f16` (four 16-lane accumulators, elements strided by 16 and 64), or for a batch
//! with llamafile's tinyBLAS (one 16-lane accumulator). The float sums differ in the last bit, and
//! after 30 layers of 8-bit requantisation such bits decide near-tied tokens, so strata reproduces
//! the order of whichever path llama.cpp takes for the same batch size.

/// Which of ggml's f16 dot-product orders to reproduce.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DotOrder {
    /// One token, as an AVX-512 build of llama.cpp sums it (`ggml_vec_dot_f16`: 4 x 16 lanes
    /// over 64-element steps).
    Single,
    /// One token, as an AVX2 build sums it (`ggml_vec_dot_f16`: 4 x 8 lanes over 32-element
    /// steps, reduced pairwise then with two horizontal adds).
    Single8,
    /// A batch of tokens, as an AVX-512 build sums it (tinyBLAS: 16 lanes).
    Batch,
    /// A batch of tokens, as an AVX2 build sums it (tinyBLAS: 8 lanes, `hsum` of a `__m256`).
    Batch8,
    /// One token, as an aarch64 NEON build without half-precision arithmetic sums it
    /// (`ggml_vec_dot_f16`: 4 x 4 lanes over 16-element steps, reduced pairwise).
    Neon,
    /// A batch of tokens' value sums, as an aarch64 NEON build computes them: tinyBLAS
    /// multiplies the f16 values by the *f32* probabilities, unrounded, in one fused 4-lane
    /// accumulator reduced pairwise (its scores take [`DotOrder::Neon`], see
    /// [`DotOrder::scores`]).
    NeonBatch,
}

impl DotOrder {
    /// Elements per step of the order's accumulators (the slots of a weighted sum).
    fn slots(self) -> usize {
        match self {
            DotOrder::Single => 64,
            DotOrder::Single8 => 32,
            DotOrder::Batch => 16,
            DotOrder::Batch8 => 8,
            DotOrder::Neon => 16,
            DotOrder::NeonBatch => 4,
        }
    }

    /// The order of the scores (`K·q`) in a step whose value sums take this order. The same
    /// but for the aarch64 build's batches: its tinyBLAS takes only contiguous f32 operands, and
    /// a batch's queries are a permuted view, so its scores stay with `vec_dot_f16` (queries
    /// rounded to f16), while the contiguous probabilities go through tinyBLAS.
    pub fn scores(self) -> DotOrder {
        if self == DotOrder::NeonBatch {
            DotOrder::Neon
        } else {
            self
        }
    }

    /// Whether llama.cpp rounds the f32 operand (queries, probabilities) to f16 first: it does
    /// wherever it converts the activations to the weights' f16 (`vec_dot_f16`, x86 tinyBLAS),
    /// not where the aarch64 tinyBLAS takes them as f32.
    pub fn rounds_operand(self) -> bool {
        self != DotOrder::NeonBatch
    }
}

/// Which llama.cpp build's arithmetic to reproduce where builds differ (the single-token f16
/// dot products of attention): llama.cpp compiles for the CPU it runs on, so "identical to
/// llama.cpp" depends on that CPU's vector width.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flavour {
    /// A build with AVX-512.
    Avx512,
    /// A build with AVX2 but no AVX-512.
    Avx2,
    /// An aarch64 build for plain NEON (`-march=armv8-a`: no dotprod, no half-precision
    /// arithmetic), as on a Cortex-A72; any aarch64 CPU can run it.
    Neon,
}

impl Default for Flavour {
    fn default() -> Self {
        Flavour::native()
    }
}

impl Flavour {
    /// The flavour llama.cpp would be built with on this CPU (on aarch64, the plain NEON
    /// build, the one whose arithmetic strata reproduces there).
    pub fn native() -> Flavour {
        #[cfg(target_arch = "aarch64")]
        return Flavour::Neon;
        #[cfg(target_arch = "x86_64")]
        if !is_x86_feature_detected!("avx512f") {
            return Flavour::Avx2;
        }
        #[allow(unreachable_code)]
        Flavour::Avx512
    }

    /// The flavour's name (`--numerics`, cluster assignments).
    pub fn name(self) -> &'static str {
        match self {
            Flavour::Avx512 => "avx512",
            Flavour::Avx2 => "avx2",
            Flavour::Neon => "neon",
        }
    }

    /// The flavour named `name` (see [`Flavour::name`]).
    pub fn from_name(name: &str) -> Option<Flavour> {
        [Flavour::Avx512, Flavour::Avx2, Flavour::Neon]
            .into_iter()
            .find(|f| f.name() == name)
    }

    /// Whether this is one of llama.cpp's aarch64 builds (their matrix products follow the
    /// orders of the kernels' `arm` module).
    pub fn arm(self) -> bool {
        self == Flavour::Neon
    }

    /// The order of a single-token attention step.
    pub fn single(self) -> DotOrder {
        match self {
            Flavour::Avx512 => DotOrder::Single,
            Flavour::Avx2 => DotOrder::Single8,
            Flavour::Neon => DotOrder::Neon,
        }
    }

    /// The order of a batched attention step.
    pub fn batch(self) -> DotOrder {
        match self {
            Flavour::Avx512 => DotOrder::Batch,
            Flavour::Avx2 => DotOrder::Batch8,
            Flavour::Neon => DotOrder::NeonBatch,
        }
    }
}

/// `ggml_vec_dot_f16`'s AVX2 reduction of four 8-lane accumulators.
#[inline(always)]
fn reduce4x8(s: &[[f32; 8]; 4]) -> f32 {
    let mut x = [0.0f32; 8];
    for l in 0..8 {
        x[l] = (s[0][l] + s[2][l]) + (s[1][l] + s[3][l]);
    }
    let t: [f32; 4] = std::array::from_fn(|i| x[i] + x[i + 4]);
    (t[0] + t[1]) + (t[2] + t[3])
}

/// `_mm512_reduce_add_ps` as GCC expands it: halves, quarters, then pairs.
#[inline(always)]
fn reduce16(a: &[f32; 16]) -> f32 {
    let mut s8 = [0.0f32; 8];
    for i in 0..8 {
        s8[i] = a[i + 8] + a[i];
    }
    let mut s4 = [0.0f32; 4];
    for i in 0..4 {
        s4[i] = s8[i + 4] + s8[i];
    }
    let t0 = s4[0] + s4[2];
    let t1 = s4[1] + s4[3];
    t0 + t1
}

/// Combines `ggml_vec_dot_f16`'s four accumulators (pairwise, then a 16-lane reduce).
#[inline(always)]
fn reduce4x16(s: &[[f32; 16]; 4]) -> f32 {
    let mut x = [0.0f32; 16];
    for l in 0..16 {
        x[l] = (s[0][l] + s[2][l]) + (s[1][l] + s[3][l]);
    }
    reduce16(&x)
}

/// What a dot product's second operand holds: f32, or f16 as the KV cache keeps it (read as f32,
/// exactly).
pub trait Elem: Copy {
    /// The value as f32.
    fn get(self) -> f32;
}

impl Elem for f32 {
    #[inline(always)]
    fn get(self) -> f32 {
        self
    }
}

impl Elem for half::f16 {
    #[inline(always)]
    fn get(self) -> f32 {
        self.to_f32()
    }
}

/// The accumulators of one dot product in an order, fed whole steps of it (so a product can
/// run over operands split in several stretches and still sum exactly as over one).
enum Acc {
    /// tinyBLAS, 16 lanes.
    Batch([f32; 16]),
    /// tinyBLAS, 8 lanes.
    Batch8([f32; 8]),
    /// `ggml_vec_dot_f16`, 4 x 8 lanes.
    Single8([[f32; 8]; 4]),
    /// `ggml_vec_dot_f16`, 4 x 16 lanes.
    Single([[f32; 16]; 4]),
    /// `ggml_vec_dot_f16` on NEON, 4 x 4 lanes.
    Neon([[f32; 4]; 4]),
    /// aarch64 tinyBLAS, 4 lanes.
    NeonBatch([f32; 4]),
}

impl Acc {
    #[inline(always)]
    fn new(order: DotOrder) -> Acc {
        match order {
            DotOrder::Batch => Acc::Batch([0.0; 16]),
            DotOrder::Batch8 => Acc::Batch8([0.0; 8]),
            DotOrder::Single8 => Acc::Single8([[0.0; 8]; 4]),
            DotOrder::Single => Acc::Single([[0.0; 16]; 4]),
            DotOrder::Neon => Acc::Neon([[0.0; 4]; 4]),
            DotOrder::NeonBatch => Acc::NeonBatch([0.0; 4]),
        }
    }

    /// Adds `q · k` over the whole steps of `q` (elements past the last whole step are left
    /// out).
    #[inline(always)]
    fn add<T: Elem>(&mut self, q: &[f32], k: &[T]) {
        match self {
            Acc::Batch(acc) => {
                for (qc, kc) in q.chunks_exact(16).zip(k.chunks_exact(16)) {
                    for l in 0..16 {
                        acc[l] = qc[l].mul_add(kc[l].get(), acc[l]);
                    }
                }
            }
            Acc::Batch8(acc) => {
                for (qc, kc) in q.chunks_exact(8).zip(k.chunks_exact(8)) {
                    for l in 0..8 {
                        acc[l] = qc[l].mul_add(kc[l].get(), acc[l]);
                    }
                }
            }
            Acc::Single8(s) => {
                for (qc, kc) in q.chunks_exact(32).zip(k.chunks_exact(32)) {
                    for j in 0..4 {
                        for l in 0..8 {
                            s[j][l] = qc[8 * j + l].mul_add(kc[8 * j + l].get(), s[j][l]);
                        }
                    }
                }
            }
            Acc::Single(s) => {
                for (qc, kc) in q.chunks_exact(64).zip(k.chunks_exact(64)) {
                    for j in 0..4 {
                        for l in 0..16 {
                            s[j][l] = qc[16 * j + l].mul_add(kc[16 * j + l].get(), s[j][l]);
                        }
                    }
                }
            }
            Acc::Neon(s) => {
                for (qc, kc) in q.chunks_exact(16).zip(k.chunks_exact(16)) {
                    for j in 0..4 {
                        for l in 0..4 {
                            s[j][l] = qc[4 * j + l].mul_add(kc[4 * j + l].get(), s[j][l]);
                        }
                    }
                }
            }
            Acc::NeonBatch(acc) => {
                for (qc, kc) in q.chunks_exact(4).zip(k.chunks_exact(4)) {
                    for l in 0..4 {
                        acc[l] = qc[l].mul_add(kc[l].get(), acc[l]);
                    }
                }
            }
        }
    }

    /// The accumulators reduced as the order's build reduces them.
    #[inline(always)]
    fn finish(&self) -> f32 {
        match self {
            Acc::Batch(acc) => reduce16(acc),
            Acc::Batch8(acc) => crate::dot::hsum8(acc),
            Acc::Single8(s) => reduce4x8(s),
            Acc::Single(s) => reduce4x16(s),
            Acc::Neon(s) => {
                let x: [f32; 4] =
                    std::array::from_fn(|l| (s[0][l] + s[2][l]) + (s[1][l] + s[3][l]));
                crate::arm::hsum4(&x)
            }
            Acc::NeonBatch(acc) => crate::arm::hsum4(acc),
        }
    }
}

#[inline(always)]
fn dot_impl<T: Elem>(order: DotOrder, q: &[f32], k: &[T]) -> f32 {
    let mut acc = Acc::new(order);
    acc.add(q, k);
    if matches!(
        order,
        DotOrder::Batch | DotOrder::Batch8 | DotOrder::NeonBatch
    ) {
        return acc.finish();
    }
    // ggml adds leftover elements of single tokens (head widths not a multiple of its step)
    // in f64, one by one after the reduced sum.
    let mut sum = f64::from(acc.finish());
    for i in q.len() / order.slots() * order.slots()..q.len() {
        sum += f64::from(q[i] * k[i].get());
    }
    sum as f32
}

/// Accumulates `sum_p w[p] * v_p` for value rows `v(p)` of width `out.len()` into `out`, in the
/// lane order of `order`. `acc` is scratch of at least `64 * out.len()` floats.
#[cfg(test)]
fn weighted_sum_impl<'a>(
    order: DotOrder,
    w: &[f32],
    v: impl Fn(usize) -> &'a [f32],
    acc: &mut [f32],
    out: &mut [f32],
) {
    let hd = out.len();
    let slots = order.slots();
    let acc = &mut acc[..slots * hd];
    acc.fill(0.0);
    for (p, &wp) in w.iter().enumerate() {
        let slot = p % slots;
        let row = &mut acc[slot * hd..(slot + 1) * hd];
        for (a, &x) in row.iter_mut().zip(v(p)) {
            *a = wp.mul_add(x, *a);
        }
    }
    reduce_slots(order, acc, out);
}

/// `acc[dst] = acc[a] + acc[b]`, element-wise over rows of `hd`.
#[cfg(test)]
fn add_rows(acc: &mut [f32], hd: usize, dst: usize, a: usize, b: usize) {
    for d in 0..hd {
        acc[dst * hd + d] = acc[a * hd + d] + acc[b * hd + d];
    }
}

/// Reduces the accumulator slots of a weighted sum (row `s` of `acc` is slot `s`) into `out`,
/// in the lane order of `order`, working in place on `acc`. Equivalent, element by element, to
/// [`reduce16`] (batch) or [`reduce4x16`] (single) over the slots.
#[cfg(test)]
fn reduce_slots(order: DotOrder, acc: &mut [f32], out: &mut [f32]) {
    let hd = out.len();
    // Lanes of one vector register in the build's width: 16 (AVX-512) or 8 (AVX2).
    let width = match order {
        DotOrder::Single | DotOrder::Batch => 16,
        DotOrder::Single8 | DotOrder::Batch8 => 8,
        DotOrder::Neon | DotOrder::NeonBatch => 4,
    };
    if matches!(order, DotOrder::Single | DotOrder::Single8 | DotOrder::Neon) {
        // `ggml_vec_dot_f16`'s four accumulators: slot `width * j + l` is accumulator j, lane
        // l; (s0 + s2) + (s1 + s3) into rows 0..width.
        let w = width;
        for l in 0..w {
            add_rows(acc, hd, 2 * w + l, l, 2 * w + l);
            add_rows(acc, hd, 3 * w + l, w + l, 3 * w + l);
            add_rows(acc, hd, l, 2 * w + l, 3 * w + l);
        }
    }
    // Halve the lanes down to four (high half plus low half each time).
    let mut w = width;
    while w > 4 {
        w /= 2;
        for i in 0..w {
            add_rows(acc, hd, i, i + w, i);
        }
    }
    // The last four lanes: `_mm_hadd_ps` twice in the AVX2 `ggml_vec_dot_f16` reduction and
    // NEON's pairwise `vaddvq_f32`, `movehl` then `movehdup` everywhere else.
    let (a, b) = if matches!(
        order,
        DotOrder::Single8 | DotOrder::Neon | DotOrder::NeonBatch
    ) {
        add_rows(acc, hd, 0, 0, 1);
        add_rows(acc, hd, 2, 2, 3);
        (0, 2)
    } else {
        add_rows(acc, hd, 0, 0, 2);
        add_rows(acc, hd, 1, 1, 3);
        (0, 1)
    };
    for (d, o) in out.iter_mut().enumerate() {
        *o = acc[a * hd + d] + acc[b * hd + d];
    }
}

/// `q · k` for f16-valued operands, summed in `order`.
pub fn dot_f16_order(order: DotOrder, q: &[f32], k: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if crate::isa().avx2 {
        // SAFETY: `isa().avx2` implies AVX2, FMA and F16C are available.
        return unsafe {
            match order {
                DotOrder::Single if q.len().is_multiple_of(64) => crate::x86_ops::dot_single(q, k),
                DotOrder::Batch if q.len().is_multiple_of(16) => crate::x86_ops::dot_batch(q, k),
                DotOrder::Single8 if q.len().is_multiple_of(32) => {
                    crate::x86_ops::dot_single8(q, k)
                }
                _ => dot_fma(order, q, k),
            }
        };
    }
    dot_impl(order, q, k)
}

/// The most query heads [`scores_grouped`] and [`weighted_sum_grouped`] take at once (their
/// accumulators must fit in the sixteen AVX2 registers).
pub const MAX_GROUP: usize = 4;

/// The longest accumulator step of any order (64 positions, [`DotOrder::Single`]): a row of
/// transposed values padded to a multiple of it can be summed in every order.
pub const MAX_STEP: usize = 64;

/// `len` rounded up to whole accumulator steps of `order`: the positions a weighted sum in
/// `order` reads (past `len`, the probabilities are zero).
pub fn padded_len(order: DotOrder, len: usize) -> usize {
    len.div_ceil(order.slots()) * order.slots()
}

/// Which grouped SIMD kernel reproduces `order` for heads of width `hd`, if any.
#[cfg(target_arch = "x86_64")]
fn grouped_simd(order: DotOrder, hd: usize) -> Option<DotOrder> {
    // Head widths past the last whole step would need ggml's f64 tail (single tokens) or
    // are not whole vectors (batches): those take the portable path.
    let fits = match order {
        DotOrder::Batch8 => hd.is_multiple_of(8),
        DotOrder::Single8 => hd.is_multiple_of(32),
        DotOrder::Batch => hd.is_multiple_of(16),
        DotOrder::Single => hd.is_multiple_of(64),
        DotOrder::Neon | DotOrder::NeonBatch => return None,
    };
    (crate::isa().avx2 && hd > 0 && fits).then_some(order)
}

/// Scores of the query heads in `q` (rows of `hd`, at most [`MAX_GROUP`]) that share the keys
/// `keys` (positions `0..len`, rows of `hd`, f16 as the cache holds them): `out[h * stride + p]` is
/// `dot_f16_order(order, q_h, k_p) * scale`, bit for bit. Reading each key once for the whole
/// group is what makes it faster than scoring head by head.
///
/// # Panics
/// If the sizes do not fit (`q` whole rows of at most [`MAX_GROUP`] heads, `keys` at least
/// `len` rows, `out` at least `(heads - 1) * stride + len` with `stride >= len`).
#[allow(clippy::too_many_arguments)]
pub fn scores_grouped(
    order: DotOrder,
    q: &[f32],
    hd: usize,
    keys: &[half::f16],
    len: usize,
    scale: f32,
    out: &mut [f32],
    stride: usize,
) {
    let g = q.len() / hd.max(1);
    assert!(
        hd > 0
            && q.len() == g * hd
            && (1..=MAX_GROUP).contains(&g)
            && keys.len() >= len * hd
            && stride >= len
            && out.len() >= (g - 1) * stride + len,
        "scores_grouped: q {} hd {hd} keys {} len {len} out {} stride {stride}",
        q.len(),
        keys.len(),
        out.len()
    );
    #[cfg(target_arch = "x86_64")]
    if let Some(simd) = grouped_simd(order, hd) {
        let d = crate::x86_attn::Dots {
            x: q.as_ptr(),
            xs: hd,
            n: len,
            scale,
            out: out.as_mut_ptr(),
            os: stride,
        };
        let keys = crate::x86_attn::Run {
            rows: keys.as_ptr().cast(),
            rs: hd,
            len: hd,
        };
        // SAFETY: `grouped_simd` found AVX2, FMA and F16C and a head width the kernel takes;
        // the sizes were checked above (`f16` is its bits, as the kernel reads them).
        unsafe { crate::x86_attn::dots(simd, g, d, std::iter::once(keys)) };
        return;
    }
    for (h, qh) in q.chunks_exact(hd).enumerate() {
        for p in 0..len {
            out[h * stride + p] = dot_rows(order, qh, &keys[p * hd..(p + 1) * hd]) * scale;
        }
    }
}

/// A stretch of positions of transposed f16 values: row `d` (dimension `d`) of the stretch at
/// `vt[d * vs..]`, `len` positions long (the rows may go on past it).
#[derive(Clone, Copy, Debug)]
pub struct ValueRun<'a> {
    /// The rows.
    pub vt: &'a [half::f16],
    /// Elements from one row to the next.
    pub vs: usize,
    /// Positions of the stretch.
    pub len: usize,
}

/// Weighted sums in `order` of the heads whose probabilities are the rows of `w` (row `h` at
/// `w[h * ws..]`, at most [`MAX_GROUP`] rows, `padded_len(order, len)` long and zero past the
/// head's real length) over transposed f16 values (`vt`: row `d` at `vt[d * vs..]` holds column `d`
/// of every position, finite past `len`): `out[h * hd..][..hd]` is `sum_p w[p] * v_p` of that
/// head summed in `order`'s lanes (as ggml sums `V·p` one value row at a time), bit for bit.
///
/// # Panics
/// If the sizes do not fit (`lenp` a multiple of `order`'s step, `out` whole rows of at most
/// [`MAX_GROUP`] heads of `hd`, `ws` and `vs` at least `lenp`).
#[allow(clippy::too_many_arguments)]
pub fn weighted_sum_grouped(
    order: DotOrder,
    w: &[f32],
    ws: usize,
    vt: &[half::f16],
    vs: usize,
    hd: usize,
    lenp: usize,
    out: &mut [f32],
) {
    let run = ValueRun { vt, vs, len: lenp };
    weighted_sum_runs(order, w, ws, std::iter::once(run), hd, out);
}

/// [`weighted_sum_grouped`] over positions whose values lie in several stretches back to back
/// (a sequence reading a prefix shared with others and then its own positions): the sums are
/// those over one row holding the stretches in order, bit for bit, because every stretch is
/// whole steps of `order` and the accumulators run on through them.
///
/// # Panics
/// If the sizes do not fit (every run's `len` a multiple of `order`'s step and its rows inside
/// `vt`, `out` whole rows of at most [`MAX_GROUP`] heads of `hd`, `ws` and the rows of `w` at
/// least the runs' total length).
pub fn weighted_sum_runs<'a, I>(
    order: DotOrder,
    w: &[f32],
    ws: usize,
    runs: I,
    hd: usize,
    out: &mut [f32],
) where
    I: Iterator<Item = ValueRun<'a>> + Clone,
{
    let g = out.len() / hd.max(1);
    let mut lenp = 0;
    for r in runs.clone() {
        assert!(
            hd > 0
                && padded_len(order, r.len) == r.len
                && r.vs >= r.len
                && r.vt.len() >= (hd - 1) * r.vs + r.len,
            "weighted_sum_runs: vt {} vs {} hd {hd} len {}",
            r.vt.len(),
            r.vs,
            r.len
        );
        lenp += r.len;
    }
    assert!(
        hd > 0
            && out.len() == g * hd
            && (1..=MAX_GROUP).contains(&g)
            && ws >= lenp
            && w.len() >= (g - 1) * ws + lenp,
        "weighted_sum_runs: w {} ws {ws} hd {hd} lenp {lenp} out {}",
        w.len(),
        out.len()
    );
    #[cfg(target_arch = "x86_64")]
    if let Some(simd) = grouped_simd(order, hd) {
        let d = crate::x86_attn::Dots {
            x: w.as_ptr(),
            xs: ws,
            n: hd,
            scale: 1.0,
            out: out.as_mut_ptr(),
            os: hd,
        };
        let runs = runs.map(|r| crate::x86_attn::Run {
            rows: r.vt.as_ptr().cast(),
            rs: r.vs,
            len: r.len,
        });
        // SAFETY: `grouped_simd` found AVX2, FMA and F16C; the sizes were checked above.
        unsafe { crate::x86_attn::dots(simd, g, d, runs) };
        return;
    }
    // Over whole steps with zero weights past the end, a weighted sum is a dot product of the
    // probabilities with each transposed row, the runs one after another.
    for (h, oh) in out.chunks_exact_mut(hd).enumerate() {
        let wh = &w[h * ws..h * ws + lenp];
        for (d, o) in oh.iter_mut().enumerate() {
            *o = dot_runs(
                order,
                wh,
                runs.clone().map(|r| &r.vt[d * r.vs..d * r.vs + r.len]),
            );
        }
    }
}

/// [`dot_impl`] compiled with FMA (and F16C) available, so `mul_add` is one instruction, not a
/// call.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dot_fma<T: Elem>(order: DotOrder, q: &[f32], k: &[T]) -> f32 {
    dot_impl(order, q, k)
}

/// `q · k` in `order` against a row of the f16 cache: the grouped kernels' portable path.
fn dot_rows(order: DotOrder, q: &[f32], k: &[half::f16]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if crate::isa().avx2 {
        // SAFETY: `isa().avx2` implies AVX2, FMA and F16C are available.
        return unsafe { dot_fma(order, q, k) };
    }
    dot_impl(order, q, k)
}

/// `q · k` in `order` where `k` comes in stretches of whole steps (the portable path of
/// [`weighted_sum_runs`]; the steps' accumulators run on through the stretches).
fn dot_runs<'a>(order: DotOrder, q: &[f32], k: impl Iterator<Item = &'a [half::f16]>) -> f32 {
    let mut acc = Acc::new(order);
    let mut off = 0;
    for part in k {
        acc.add(&q[off..off + part.len()], part);
        off += part.len();
    }
    acc.finish()
}

/// The scalar definition of [`dot_f16_order`].
pub fn dot_f16_order_ref(order: DotOrder, q: &[f32], k: &[f32]) -> f32 {
    dot_impl(order, q, k)
}

/// `out = sum_p w[p] * v(p)` in `order`, one value row at a time: the definition the grouped
/// kernel is checked against (`acc` is scratch of `64 * out.len()` floats).
#[cfg(test)]
pub(crate) fn weighted_sum_order_ref<'a>(
    order: DotOrder,
    w: &[f32],
    v: impl Fn(usize) -> &'a [f32],
    acc: &mut [f32],
    out: &mut [f32],
) {
    weighted_sum_impl(order, w, v, acc, out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn orders_agree_with_plain_sums_closely_and_with_each_other_exactly_on_integers() {
        let q: Vec<f32> = (0..64).map(|i| (i % 7) as f32 - 3.0).collect();
        let k: Vec<f32> = (0..64).map(|i| (i % 5) as f32 - 2.0).collect();
        let exact: f32 = q.iter().zip(&k).map(|(a, b)| a * b).sum();
        assert_eq!(dot_f16_order(DotOrder::Single, &q, &k), exact);
        assert_eq!(dot_f16_order(DotOrder::Batch, &q, &k), exact);
        assert_eq!(dot_f16_order(DotOrder::Single8, &q, &k), exact);
        assert_eq!(dot_f16_order(DotOrder::Batch8, &q, &k), exact);
        let w: Vec<f32> = (0..100).map(|p| (p % 3) as f32).collect();
        let vals: Vec<Vec<f32>> = (0..100).map(|p| vec![p as f32, 1.0]).collect();
        let mut acc = vec![0.0; 128];
        let mut out = [0.0f32; 2];
        for order in [
            DotOrder::Single,
            DotOrder::Single8,
            DotOrder::Batch,
            DotOrder::Batch8,
        ] {
            weighted_sum_order_ref(order, &w, |p| &vals[p], &mut acc, &mut out);
            let e0: f32 = (0..100).map(|p| w[p] * p as f32).sum();
            let e1: f32 = w.iter().sum();
            assert_eq!(out, [e0, e1]);
        }
    }
}
