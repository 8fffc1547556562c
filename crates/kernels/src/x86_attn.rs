//! AVX2 kernels of attention for the query heads that share one KV head
//! ([`crate::attn::scores_grouped`], [`crate::attn::weighted_sum_grouped`]), in the orders of
//! both builds of llama.cpp: tinyBLAS's for batches (one accumulator of 8 lanes with AVX2, 16
//! with AVX-512, then a horizontal sum) and `ggml_vec_dot_f16`'s for single tokens (four
//! accumulators of 8 or 16 lanes over 32- or 64-element steps). A 16-lane AVX-512 accumulator
//! is kept as two 8-lane halves ([`V16`]): the multiply-adds are lane-wise, so the sums are
//! the same bit for bit, and one generic kernel per order serves (and is tested on) AVX2 and
//! AVX-512 machines.
//!
//! Both products are the same shape: `G` vectors (the heads' queries, or their probabilities)
//! dotted with each of `n` rows (keys, or transposed value rows), the rows in f16 as the KV cache
//! holds them (converted on load, exactly). Every output keeps its
//! accumulators, order and reduction exactly; only the tiling changes. One load of a row feeds
//! every head of the group and, in batches, several rows share each load of a head's vector, so
//! the loop is bound by the multiply-adds rather than by loads from L2.
#![allow(unsafe_op_in_unsafe_fn)]

use std::arch::x86_64::*;

use crate::x86::hsum8;

/// One accumulator of a llama.cpp build: 8 lanes (`__m256`, AVX2) or 16 (AVX-512's
/// `__m512`, kept as two halves), with the two reductions its builds use.
trait Lanes: Copy {
    /// Elements per accumulator.
    const WIDTH: usize;
    unsafe fn zero() -> Self;
    unsafe fn load(p: *const f32) -> Self;
    /// Loads f16 values (their bits) as f32, exactly.
    unsafe fn load_h(p: *const u16) -> Self;
    /// `x * y + self`, lane by lane, each rounded once.
    unsafe fn fmadd(self, x: Self, y: Self) -> Self;
    unsafe fn add(self, o: Self) -> Self;
    /// tinyBLAS's horizontal sum (batches).
    unsafe fn reduce_batch(self) -> f32;
    /// `ggml_vec_dot_f16`'s reduction of its four accumulators (single tokens).
    unsafe fn reduce_single(s: &[Self; 4]) -> f32;
}

impl Lanes for __m256 {
    const WIDTH: usize = 8;
    #[inline(always)]
    unsafe fn zero() -> Self {
        _mm256_setzero_ps()
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        _mm256_loadu_ps(p)
    }
    #[inline(always)]
    unsafe fn load_h(p: *const u16) -> Self {
        _mm256_cvtph_ps(_mm_loadu_si128(p.cast()))
    }
    #[inline(always)]
    unsafe fn fmadd(self, x: Self, y: Self) -> Self {
        _mm256_fmadd_ps(x, y, self)
    }
    #[inline(always)]
    unsafe fn add(self, o: Self) -> Self {
        _mm256_add_ps(self, o)
    }
    #[inline(always)]
    unsafe fn reduce_batch(self) -> f32 {
        hsum8(self)
    }
    /// As [`crate::x86_ops::dot_single8`]: `(s0 + s2) + (s1 + s3)`, halves, then two
    /// horizontal adds.
    #[inline(always)]
    unsafe fn reduce_single(s: &[Self; 4]) -> f32 {
        let x = s[0].add(s[2]).add(s[1].add(s[3]));
        let t0 = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
        let t1 = _mm_hadd_ps(t0, t0);
        _mm_cvtss_f32(_mm_hadd_ps(t1, t1))
    }
}

/// A 16-lane AVX-512 accumulator as two 8-lane halves (lanes 0-7, 8-15): the multiply-adds
/// are lane-wise, so the sums are an AVX-512 build's bit for bit on any AVX2 machine.
#[derive(Clone, Copy)]
struct V16(__m256, __m256);

impl Lanes for V16 {
    const WIDTH: usize = 16;
    #[inline(always)]
    unsafe fn zero() -> Self {
        V16(_mm256_setzero_ps(), _mm256_setzero_ps())
    }
    #[inline(always)]
    unsafe fn load(p: *const f32) -> Self {
        V16(_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)))
    }
    #[inline(always)]
    unsafe fn load_h(p: *const u16) -> Self {
        V16(
            _mm256_cvtph_ps(_mm_loadu_si128(p.cast())),
            _mm256_cvtph_ps(_mm_loadu_si128(p.add(8).cast())),
        )
    }
    #[inline(always)]
    unsafe fn fmadd(self, x: Self, y: Self) -> Self {
        V16(
            _mm256_fmadd_ps(x.0, y.0, self.0),
            _mm256_fmadd_ps(x.1, y.1, self.1),
        )
    }
    #[inline(always)]
    unsafe fn add(self, o: Self) -> Self {
        V16(_mm256_add_ps(self.0, o.0), _mm256_add_ps(self.1, o.1))
    }
    /// `_mm512_reduce_add_ps` as GCC expands it: halves, quarters, then pairs.
    #[inline(always)]
    unsafe fn reduce_batch(self) -> f32 {
        hsum8(_mm256_add_ps(self.1, self.0))
    }
    /// `(s0 + s2) + (s1 + s3)`, then the 16-lane reduction.
    #[inline(always)]
    unsafe fn reduce_single(s: &[Self; 4]) -> f32 {
        s[0].add(s[2]).add(s[1].add(s[3])).reduce_batch()
    }
}

/// One stretch of every row: elements `off..off + len` of row `r` are at `rows + r * rs`, f16
/// bits. A product's rows are one run (keys) or several back to back (a sequence's values,
/// some in shared prefix blocks and the rest in its own cache), summed with the same
/// accumulators as if they were one row.
#[derive(Clone, Copy)]
pub(crate) struct Run {
    pub(crate) rows: *const u16,
    pub(crate) rs: usize,
    pub(crate) len: usize,
}

/// `G` vectors and `n` rows: what both grouped products read and write (the rows themselves
/// come as runs).
#[derive(Clone, Copy)]
pub(crate) struct Dots {
    /// Vector `h` at `x + h * xs`.
    pub(crate) x: *const f32,
    pub(crate) xs: usize,
    pub(crate) n: usize,
    /// Each result is multiplied by this (1 leaves it exact).
    pub(crate) scale: f32,
    /// Result `(h, r)` goes to `out + h * os + r`.
    pub(crate) out: *mut f32,
    pub(crate) os: usize,
}

impl Dots {
    /// The same product for heads `h0..` only.
    unsafe fn heads_from(self, h0: usize) -> Dots {
        Dots {
            x: self.x.add(h0 * self.xs),
            out: self.out.add(h0 * self.os),
            ..self
        }
    }
}

/// Batch order: `out(h, r) = reduce_batch(sum over L-wide steps of x_h * row_r) * scale`, `R`
/// rows at a time from row `r0`, the steps running through every run in turn.
///
/// # Safety
/// AVX2, FMA and F16C must be available; every run's `len` must be a multiple of `L::WIDTH`
/// and every vector (as long as the runs together), row and output inside its buffer.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn batch_tile<L: Lanes, const G: usize, const R: usize, I>(d: Dots, runs: I, mut r0: usize)
where
    I: Iterator<Item = Run> + Clone,
{
    while r0 + R <= d.n {
        let mut acc = [[L::zero(); R]; G];
        let mut off = 0;
        for run in runs.clone() {
            let mut i = 0;
            while i < run.len {
                for r in 0..R {
                    let row = L::load_h(run.rows.add((r0 + r) * run.rs + i));
                    for (h, a) in acc.iter_mut().enumerate() {
                        a[r] = a[r].fmadd(L::load(d.x.add(h * d.xs + off + i)), row);
                    }
                }
                i += L::WIDTH;
            }
            off += run.len;
        }
        for (h, a) in acc.iter().enumerate() {
            for (r, &v) in a.iter().enumerate() {
                *d.out.add(h * d.os + r0 + r) = v.reduce_batch() * d.scale;
            }
        }
        r0 += R;
    }
    if R > 1 && r0 < d.n {
        // The last rows, one at a time.
        batch_tile::<L, G, 1, I>(d, runs, r0);
    }
}

/// [`batch_tile`] for `g` heads, with as many rows per tile as keep the accumulators (at most
/// twelve registers) in registers.
///
/// # Safety
/// As for [`batch_tile`], with `g` in `1..=4`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dots_batch<L: Lanes, I: Iterator<Item = Run> + Clone>(g: usize, d: Dots, runs: I) {
    match (L::WIDTH, g) {
        (8, 1) => batch_tile::<L, 1, 4, I>(d, runs, 0),
        (8, 2) => batch_tile::<L, 2, 4, I>(d, runs, 0),
        (8, 3) => batch_tile::<L, 3, 4, I>(d, runs, 0),
        (8, 4) => batch_tile::<L, 4, 3, I>(d, runs, 0),
        (_, 1) => batch_tile::<L, 1, 4, I>(d, runs, 0),
        (_, 2) => batch_tile::<L, 2, 3, I>(d, runs, 0),
        (_, 3) => batch_tile::<L, 3, 2, I>(d, runs, 0),
        (_, 4) => {
            batch_tile::<L, 2, 3, I>(d, runs.clone(), 0);
            batch_tile::<L, 2, 3, I>(d.heads_from(2), runs, 0);
        }
        _ => unreachable!("groups are split into at most four heads, got {g}"),
    }
}

/// Single-token order: `out(h, r) = reduce_single(four accumulators over 4L-wide steps of x_h *
/// row_r) * scale`, a row at a time, the steps running through every run in turn.
///
/// # Safety
/// AVX2, FMA and F16C must be available; every run's `len` must be a multiple of
/// `4 * L::WIDTH` and every vector, row and output inside its buffer.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn single_tile<L: Lanes, const G: usize, I>(d: Dots, runs: I)
where
    I: Iterator<Item = Run> + Clone,
{
    let step = 4 * L::WIDTH;
    for r in 0..d.n {
        let mut acc = [[L::zero(); 4]; G];
        let mut off = 0;
        for run in runs.clone() {
            let row = run.rows.add(r * run.rs);
            let mut i = 0;
            while i < run.len {
                // Transposed value rows are short streams that start cold (keys are one long
                // stream, for which this changes little): fetch the next row alongside this one.
                let next = run.rows.wrapping_add((r + 1) * run.rs + i) as *const i8;
                for line in (0..2 * step).step_by(64) {
                    _mm_prefetch::<_MM_HINT_T0>(next.wrapping_add(line));
                }
                for j in 0..4 {
                    let y = L::load_h(row.add(i + L::WIDTH * j));
                    for (h, a) in acc.iter_mut().enumerate() {
                        a[j] = a[j].fmadd(L::load(d.x.add(h * d.xs + off + i + L::WIDTH * j)), y);
                    }
                }
                i += step;
            }
            off += run.len;
        }
        for (h, a) in acc.iter().enumerate() {
            *d.out.add(h * d.os + r) = L::reduce_single(a) * d.scale;
        }
    }
}

/// [`single_tile`] for `g` heads: four accumulators per head, at most twelve registers (8-lane
/// heads in pairs, 16-lane heads one at a time).
///
/// # Safety
/// As for [`single_tile`], with `g` in `1..=4`.
#[target_feature(enable = "avx2,fma,f16c")]
unsafe fn dots_single<L: Lanes, I: Iterator<Item = Run> + Clone>(g: usize, d: Dots, runs: I) {
    if L::WIDTH == 8 {
        match g {
            1 => single_tile::<L, 1, I>(d, runs),
            2 => single_tile::<L, 2, I>(d, runs),
            3 => single_tile::<L, 3, I>(d, runs),
            4 => {
                single_tile::<L, 2, I>(d, runs.clone());
                single_tile::<L, 2, I>(d.heads_from(2), runs);
            }
            _ => unreachable!("groups are split into at most four heads, got {g}"),
        }
    } else {
        for h in 0..g {
            single_tile::<L, 1, I>(d.heads_from(h), runs.clone());
        }
    }
}

/// The grouped product in `order`.
///
/// # Safety
/// As for [`batch_tile`] or [`single_tile`] with the order's lanes (every run's length a
/// multiple of 8 for `Batch8`, 16 for `Batch`, 32 for `Single8`, 64 for `Single`).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn dots<I>(order: crate::attn::DotOrder, g: usize, d: Dots, runs: I)
where
    I: Iterator<Item = Run> + Clone,
{
    use crate::attn::DotOrder;
    match order {
        DotOrder::Batch8 => dots_batch::<__m256, I>(g, d, runs),
        DotOrder::Batch => dots_batch::<V16, I>(g, d, runs),
        DotOrder::Single8 => dots_single::<__m256, I>(g, d, runs),
        DotOrder::Single => dots_single::<V16, I>(g, d, runs),
        DotOrder::Neon | DotOrder::NeonBatch => {
            unreachable!("grouped_simd takes no ARM order")
        }
    }
}
