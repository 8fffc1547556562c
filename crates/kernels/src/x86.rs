//! AVX2 kernels (x86_64) over the packed layout of [`crate::packed`].
//!
//! Each kernel computes the products of one group of four weight rows with one to four
//! activation rows. Per block it forms the same eight 32-bit integer lane sums as llama.cpp's
//! AVX2 `ggml_vec_dot_*` (each the sum of four products), converts them to f32 and accumulates
//! `d_w * d_a * lane` with a fused multiply-add per lane across blocks, then reduces the eight
//! lanes in `hsum_float_8` order. That makes the results bit-identical to
//! [`crate::dot::dot_scalar`], and the layout lets one instruction do the scale work of four rows.
#![allow(unsafe_op_in_unsafe_fn)]

use std::arch::x86_64::*;

/// One activation row as the kernels read it.
#[derive(Clone, Copy, Debug)]
pub(crate) struct ActRow {
    /// The 32 quants of block 0; block `b`'s are at `q + b * stride`.
    pub(crate) q: *const u8,
    /// Bytes between blocks.
    pub(crate) stride: usize,
    /// Block scales as f32 (the f16 values, converted once).
    pub(crate) d: *const f32,
    /// Q8_1 `d * sum(q)` per block as f32 (Q4_1 weights only).
    pub(crate) s: *const f32,
    /// The sum of each group of four quants times the weight codes' offset (8 for Q4_0, 16 for
    /// Q5_0), eight per block; Q4_0 and Q5_0 weights only.
    pub(crate) ys: *const i32,
}

/// Formats of [`q4_tile`].
const Q4_0: u8 = 0;
const Q4_1: u8 = 1;
const Q5_0: u8 = 2;
const Q5_1: u8 = 3;

/// Lane indices that spread scales `[d0, d1]` (pair 0) or `[d2, d3]` (pair 1) over the two
/// halves of a register.
#[inline(always)]
unsafe fn pair_index(p: usize) -> __m256i {
    let a = (2 * p) as i32;
    _mm256_setr_epi32(a, a, a, a, a + 1, a + 1, a + 1, a + 1)
}

/// `hsum_float_8` of the two rows of a pair: `lo` holds lanes 0..4 of row 0 then of row 1, `hi`
/// lanes 4..8. Returns the two sums.
#[inline(always)]
unsafe fn pair_sums(lo: __m256, hi: __m256) -> (f32, f32) {
    // hsum_float_8 starts with high half + low half: for each row that is `hi + lo` lane-wise.
    let s = _mm256_add_ps(hi, lo);
    (
        hsum4(_mm256_castps256_ps128(s)),
        hsum4(_mm256_extractf128_ps(s, 1)),
    )
}

/// The last two steps of `hsum_float_8`: `(r0 + r2) + (r1 + r3)`.
#[inline(always)]
pub(crate) unsafe fn hsum4(r: __m128) -> f32 {
    let r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    _mm_cvtss_f32(_mm_add_ss(r, _mm_movehdup_ps(r)))
}

/// ggml's `hsum_float_8` (and tinyBLAS's `hsum` of a `__m256`): high half plus low half, then
/// [`hsum4`].
#[inline(always)]
pub(crate) unsafe fn hsum8(x: __m256) -> f32 {
    hsum4(_mm_add_ps(
        _mm256_extractf128_ps(x, 1),
        _mm256_castps256_ps128(x),
    ))
}

/// The sum of eight 32-bit integer lanes (exact, so the order is free).
#[inline(always)]
pub(crate) unsafe fn hsum_epi32(v: __m256i) -> i32 {
    let s4 = _mm_add_epi32(_mm256_extracti128_si256(v, 1), _mm256_castsi256_si128(v));
    let s2 = _mm_add_epi32(s4, _mm_unpackhi_epi64(s4, s4));
    _mm_cvtsi128_si32(_mm_add_epi32(s2, _mm_shuffle_epi32(s2, 1)))
}

/// How far ahead of the block being read the kernels ask for weights: a decode step streams
/// every weight once from DRAM, and the hardware prefetchers alone leave the loads waiting.
const PREFETCH_BYTES: usize = 2048;

#[inline(always)]
unsafe fn prefetch(p: *const u8) {
    // Prefetching never faults, so running past the end of the matrix is harmless.
    _mm_prefetch::<_MM_HINT_T0>(p.wrapping_add(PREFETCH_BYTES) as *const i8);
}

#[inline(always)]
unsafe fn cvt4_f16(p: *const u8) -> __m128 {
    _mm_cvtph_ps(_mm_loadl_epi64(p as *const __m128i))
}

/// Four MXFP4 scales (E8M0 exponents in the low bytes of four 16-bit slots at `p`) as
/// [`crate::formats::e8m0_half`] gives them: `(e - 1) << 23`, or the subnormal
/// `0x200000 << e` for `e` 0 and 1.
#[inline(always)]
unsafe fn cvt4_e8m0_half(p: *const u8) -> __m128 {
    let e = _mm_cvtepu16_epi32(_mm_loadl_epi64(p as *const __m128i));
    let normal = _mm_slli_epi32(_mm_sub_epi32(e, _mm_set1_epi32(1)), 23);
    let sub = _mm_sllv_epi32(_mm_set1_epi32(0x0020_0000), e);
    let small = _mm_cmplt_epi32(e, _mm_set1_epi32(2));
    _mm_castsi128_ps(_mm_blendv_epi8(normal, sub, small))
}

/// Q4_0 / Q4_1 / Q5_0 / Q5_1 weights: rows `2 * p0 .. 2 * (p0 + NP)` of the group at `g` (`NP`
/// pairs) times `C` activation rows. `out[c][r]` receives row `r` of the group (only the
/// computed rows are set).
///
/// # Safety
/// AVX2, FMA and F16C must be available; `g` must address `nb` packed group blocks of the format
/// (`FMT`) and every `a[c]` `nb` blocks of its activation rows with the side
/// arrays that format needs.
///
/// Q4_1's `m * s` terms are summed here unless `mins` holds them already (see [`q4_1_mins`]):
/// several tokens at once leave no registers for them inside this loop.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q4_tile<const C: usize, const NP: usize, const FMT: u8>(
    g: *const u8,
    p0: usize,
    nb: usize,
    a: &[ActRow; C],
    mins: Option<&[[f32; 4]; C]>,
    out: &mut [[f32; 4]; C],
) {
    const { assert!(FMT <= Q5_1) };
    let min = FMT == Q4_1 || FMT == Q5_1;
    // Whether this loop sums Q4_1's offset terms itself.
    let own_mins = min && mins.is_none();
    let five = FMT == Q5_0 || FMT == Q5_1;
    let (gbb, qoff, hoff) = match FMT {
        Q4_1 => (80, 16, 0),
        Q5_0 => (88, 24, 8),
        Q5_1 => (96, 32, 16),
        _ => (72, 8, 0),
    };
    let bit_shuf = _mm256_set_epi64x(
        0x0303_0303_0303_0303,
        0x0202_0202_0202_0202,
        0x0101_0101_0101_0101,
        0,
    );
    let bit_sel = _mm256_set1_epi64x(0x7FBF_DFEF_F7FB_FDFE);
    let fifth = _mm256_set1_epi8(0x10);
    // Bytes 0x10 where bit j of `bits` is set (ggml's `bytes_from_bits_32`, masked).
    let high_bits = |bits: u32| {
        let b = _mm256_shuffle_epi8(_mm256_set1_epi32(bits as i32), bit_shuf);
        let set = _mm256_cmpeq_epi8(_mm256_or_si256(b, bit_sel), _mm256_set1_epi64x(-1));
        _mm256_and_si256(set, fifth)
    };
    let mask = _mm256_set1_epi8(0x0F);
    let ones = _mm256_set1_epi16(1);
    let idx: [__m256i; NP] = std::array::from_fn(|i| pair_index(p0 + i));
    let mut lo_acc = [[_mm256_setzero_ps(); C]; NP];
    let mut hi_acc = [[_mm256_setzero_ps(); C]; NP];
    let mut summs = [_mm_setzero_ps(); C];
    for b in 0..nb {
        let blk = g.add(b * gbb);
        prefetch(blk);
        let d4 = _mm256_castps128_ps256(cvt4_f16(blk));
        let m4 = if own_mins {
            cvt4_f16(blk.add(8))
        } else {
            _mm_setzero_ps()
        };
        let mut nib_lo = [_mm256_setzero_si256(); NP];
        let mut nib_hi = [_mm256_setzero_si256(); NP];
        let mut dpair = [_mm256_setzero_ps(); NP];
        for i in 0..NP {
            let v = _mm256_loadu_si256(blk.add(qoff + 32 * (p0 + i)) as *const __m256i);
            nib_lo[i] = _mm256_and_si256(v, mask);
            nib_hi[i] = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
            if five {
                let bits = blk.add(hoff + 8 * (p0 + i)) as *const u32;
                nib_lo[i] = _mm256_or_si256(nib_lo[i], high_bits(bits.read_unaligned()));
                nib_hi[i] = _mm256_or_si256(nib_hi[i], high_bits(bits.add(1).read_unaligned()));
            }
            dpair[i] = _mm256_permutevar8x32_ps(d4, idx[i]);
        }
        for c in 0..C {
            let yq = a[c].q.add(b * a[c].stride);
            let ylo = _mm256_broadcastsi128_si256(_mm_loadu_si128(yq as *const __m128i));
            let yhi = _mm256_broadcastsi128_si256(_mm_loadu_si128(yq.add(16) as *const __m128i));
            let dy = _mm256_set1_ps(*a[c].d.add(b));
            if own_mins {
                summs[c] = _mm_fmadd_ps(m4, _mm_set1_ps(*a[c].s.add(b)), summs[c]);
            }
            let (ys_lo, ys_hi) = if min {
                (_mm256_setzero_si256(), _mm256_setzero_si256())
            } else {
                let ys = a[c].ys.add(8 * b);
                // Stored as 8 * sum(y) for Q4_0, 16 * sum(y) for Q5_0 (the codes' offset).
                (
                    _mm256_broadcastsi128_si256(_mm_loadu_si128(ys as *const __m128i)),
                    _mm256_broadcastsi128_si256(_mm_loadu_si128(ys.add(4) as *const __m128i)),
                )
            };
            for i in 0..NP {
                let mut il = _mm256_madd_epi16(_mm256_maddubs_epi16(nib_lo[i], ylo), ones);
                let mut ih = _mm256_madd_epi16(_mm256_maddubs_epi16(nib_hi[i], yhi), ones);
                if !min {
                    // Q4_0 codes are nibble - 8: subtract 8 * sum(y) per lane (16 for Q5_0).
                    il = _mm256_sub_epi32(il, ys_lo);
                    ih = _mm256_sub_epi32(ih, ys_hi);
                }
                let scale = _mm256_mul_ps(dpair[i], dy);
                lo_acc[i][c] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(il), lo_acc[i][c]);
                hi_acc[i][c] = _mm256_fmadd_ps(scale, _mm256_cvtepi32_ps(ih), hi_acc[i][c]);
            }
        }
    }
    for c in 0..C {
        let mut sm = [0.0f32; 4];
        match mins {
            Some(m) => sm = m[c],
            None => _mm_storeu_ps(sm.as_mut_ptr(), summs[c]),
        }
        for i in 0..NP {
            let (r0, r1) = pair_sums(lo_acc[i][c], hi_acc[i][c]);
            let r = 2 * (p0 + i);
            out[c][r] = r0 + sm[r];
            out[c][r + 1] = r1 + sm[r + 1];
        }
    }
}

/// Q4_1's (or Q5_1's: group blocks `gbb` bytes apart) offset terms of the four rows of the group
/// at `g` for `C` activation rows:
/// `sum over blocks of m_w * s_a`, accumulated block by block with one fused multiply-add per
/// row, exactly as [`q4_tile`] does when it sums them itself.
///
/// # Safety
/// As for [`q4_tile`] with the Q4_1 layout.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q4_1_mins<const C: usize>(
    g: *const u8,
    gbb: usize,
    nb: usize,
    a: &[ActRow; C],
) -> [[f32; 4]; C] {
    let mut summs = [_mm_setzero_ps(); C];
    for b in 0..nb {
        let m4 = cvt4_f16(g.add(b * gbb + 8));
        for c in 0..C {
            summs[c] = _mm_fmadd_ps(m4, _mm_set1_ps(*a[c].s.add(b)), summs[c]);
        }
    }
    let mut out = [[0.0f32; 4]; C];
    for c in 0..C {
        _mm_storeu_ps(out[c].as_mut_ptr(), summs[c]);
    }
    out
}

/// Q8_0 weights: the four rows of the group at `g` times `C` activation rows (Q8_0).
///
/// # Safety
/// As for [`q4_tile`], for the Q8_0 packed layout.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn q8_tile<const C: usize>(
    g: *const u8,
    nb: usize,
    a: &[ActRow; C],
    out: &mut [[f32; 4]; C],
) {
    let ones = _mm256_set1_epi16(1);
    let mut acc = [[_mm256_setzero_ps(); 4]; C];
    for b in 0..nb {
        let blk = g.add(b * 136);
        prefetch(blk);
        prefetch(blk.add(64));
        prefetch(blk.add(128));
        let d4 = cvt4_f16(blk);
        let mut ax = [_mm256_setzero_si256(); 4];
        let mut sx = [_mm256_setzero_si256(); 4];
        for r in 0..4 {
            sx[r] = _mm256_loadu_si256(blk.add(8 + 32 * r) as *const __m256i);
            ax[r] = _mm256_sign_epi8(sx[r], sx[r]);
        }
        for c in 0..C {
            let y = _mm256_loadu_si256(a[c].q.add(b * a[c].stride) as *const __m256i);
            let ds = _mm256_castps128_ps256(_mm_mul_ps(d4, _mm_set1_ps(*a[c].d.add(b))));
            for r in 0..4 {
                let p = _mm256_maddubs_epi16(ax[r], _mm256_sign_epi8(y, sx[r]));
                let i = _mm256_cvtepi32_ps(_mm256_madd_epi16(p, ones));
                let scale = _mm256_permutevar8x32_ps(ds, _mm256_set1_epi32(r as i32));
                acc[c][r] = _mm256_fmadd_ps(scale, i, acc[c][r]);
            }
        }
    }
    for c in 0..C {
        for r in 0..4 {
            out[c][r] = hsum8(acc[c][r]);
        }
    }
}

/// Q4_0 / IQ4_NL weights in the order of llama.cpp's repacked 8-row kernels: the four rows of the
/// group at `g` times `C` activation rows (Q8_0), each block's whole integer sum times
/// `d_w * d_a` fused into one accumulator per row ([`crate::dot::dot_repacked`]).
///
/// The codes come from a 16-entry table (`lut`: `i - 8` for Q4_0, the IQ4_NL or MXFP4 values),
/// so one kernel serves all three (`MX`: the scales are MXFP4's exponents). Per block, the
/// lane sums of rows 0/1 and 2/3 are reduced with two horizontal adds into one register of
/// four row sums.
///
/// # Safety
/// As for [`q4_tile`], for the Q4_0 packed layout (which IQ4_NL shares).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn b32_repacked_tile<const C: usize, const MX: bool>(
    lut: __m256i,
    g: *const u8,
    nb: usize,
    a: &[ActRow; C],
    out: &mut [[f32; 4]; C],
) {
    let ones = _mm256_set1_epi16(1);
    let mut acc = [_mm_setzero_ps(); C];
    for b in 0..nb {
        let blk = g.add(b * 72);
        prefetch(blk);
        let (d4, x, ax) = b32_block::<MX, false>(lut, blk);
        for c in 0..C {
            let yq = a[c].q.add(b * a[c].stride);
            let ylo = _mm256_broadcastsi128_si256(_mm_loadu_si128(yq as *const __m128i));
            let yhi = _mm256_broadcastsi128_si256(_mm_loadu_si128(yq.add(16) as *const __m128i));
            let part = |i: usize, y: __m256i| {
                _mm256_madd_epi16(_mm256_maddubs_epi16(ax[i], _mm256_sign_epi8(y, x[i])), ones)
            };
            let p01 = _mm256_add_epi32(part(0, ylo), part(1, yhi));
            let p23 = _mm256_add_epi32(part(2, ylo), part(3, yhi));
            // [r0 r0 r2 r2 | r1 r1 r3 r3] partial sums, then [r0 r2 r0 r2 | r1 r3 r1 r3].
            let h = _mm256_hadd_epi32(p01, p23);
            let h = _mm256_hadd_epi32(h, h);
            let sums =
                _mm_unpacklo_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
            let scale = _mm_mul_ps(d4, _mm_set1_ps(*a[c].d.add(b)));
            acc[c] = _mm_fmadd_ps(_mm_cvtepi32_ps(sums), scale, acc[c]);
        }
    }
    for c in 0..C {
        _mm_storeu_ps(out[c].as_mut_ptr(), acc[c]);
    }
}

/// The four row scales of a Q4_0-layout block at `blk` and its codes: rows 0/1 (`x[0]`:
/// elements 0..16 of both, `x[1]`: 16..32) and rows 2/3, as signed values from `lut` with their
/// magnitudes in `ax`, or (`NIB`) the raw unsigned nibbles (`ax` unset).
#[inline(always)]
unsafe fn b32_block<const MX: bool, const NIB: bool>(
    lut: __m256i,
    blk: *const u8,
) -> (__m128, [__m256i; 4], [__m256i; 4]) {
    let mask = _mm256_set1_epi8(0x0F);
    let d4 = if MX {
        cvt4_e8m0_half(blk)
    } else {
        cvt4_f16(blk)
    };
    let mut x = [_mm256_setzero_si256(); 4];
    let mut ax = [_mm256_setzero_si256(); 4];
    for p in 0..2 {
        let v = _mm256_loadu_si256(blk.add(8 + 32 * p) as *const __m256i);
        x[2 * p] = _mm256_and_si256(v, mask);
        x[2 * p + 1] = _mm256_and_si256(_mm256_srli_epi16(v, 4), mask);
    }
    if !NIB {
        for i in 0..4 {
            x[i] = _mm256_shuffle_epi8(lut, x[i]);
            ax[i] = _mm256_sign_epi8(x[i], x[i]);
        }
    }
    (d4, x, ax)
}

/// [`b32_repacked_tile`] for four activation rows at once, with the same bits: per block the
/// 32 integer partial sums of each row pair are reduced for all four tokens together by a
/// transposing add (two rows times four tokens in one register) instead of two horizontal adds
/// and a lane shuffle per token, and the block's scales go in with two 8-lane fused
/// multiply-adds instead of four 4-lane ones. Integer sums are exact in any order, and each
/// (row, token) still gets `acc + sum * (d_w * d_a)` fused once per block.
///
/// `NIB` (Q4_0 only) multiplies the raw nibbles (`q + 8`, unsigned) with the activations
/// directly and subtracts eight times each token's block sum (the activations' `ys`) from the
/// integer sums: no code table and no sign juggling, with the same whole sums.
///
/// # Safety
/// As for [`b32_repacked_tile`]; with `NIB`, the activation rows must carry `ys` (Q4_0 weights).
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn b32_repacked_tile4<const MX: bool, const NIB: bool>(
    lut: __m256i,
    g: *const u8,
    nb: usize,
    a: &[ActRow; 4],
    out: &mut [[f32; 4]; 4],
) {
    let ones = _mm256_set1_epi16(1);
    let lo_rows = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);
    let hi_rows = _mm256_setr_epi32(2, 2, 2, 2, 3, 3, 3, 3);
    // Lanes: row 0 (or 2) times tokens 0..4, then row 1 (or 3) times tokens 0..4.
    let mut acc01 = _mm256_setzero_ps();
    let mut acc23 = _mm256_setzero_ps();
    for b in 0..nb {
        let blk = g.add(b * 72);
        prefetch(blk);
        let (d4, x, ax) = b32_block::<MX, NIB>(lut, blk);
        let mut p01 = [_mm256_setzero_si256(); 4];
        let mut p23 = [_mm256_setzero_si256(); 4];
        for c in 0..4 {
            let yq = a[c].q.add(b * a[c].stride);
            let ylo = _mm256_broadcastsi128_si256(_mm_loadu_si128(yq as *const __m128i));
            let yhi = _mm256_broadcastsi128_si256(_mm_loadu_si128(yq.add(16) as *const __m128i));
            // [row 0 partials | row 1 partials] (and rows 2 / 3).
            if NIB {
                // Nibble pairs times quants stay within 2 * 2 * 15 * 127 in 16 bits.
                let pair = |i: usize, j: usize| {
                    _mm256_madd_epi16(
                        _mm256_add_epi16(
                            _mm256_maddubs_epi16(x[i], ylo),
                            _mm256_maddubs_epi16(x[j], yhi),
                        ),
                        ones,
                    )
                };
                p01[c] = pair(0, 1);
                p23[c] = pair(2, 3);
            } else {
                let part = |i: usize, y: __m256i| {
                    _mm256_madd_epi16(_mm256_maddubs_epi16(ax[i], _mm256_sign_epi8(y, x[i])), ones)
                };
                p01[c] = _mm256_add_epi32(part(0, ylo), part(1, yhi));
                p23[c] = _mm256_add_epi32(part(2, ylo), part(3, yhi));
            }
        }
        let mut s01 = transpose_sum4(&p01);
        let mut s23 = transpose_sum4(&p23);
        if NIB {
            // Eight times each token's block sum, in both halves: the nibbles' offset.
            let ys: [__m256i; 4] =
                std::array::from_fn(|c| _mm256_loadu_si256(a[c].ys.add(8 * b) as *const __m256i));
            let halves = transpose_sum4(&ys);
            let off = _mm256_add_epi32(halves, _mm256_permute2x128_si256(halves, halves, 1));
            s01 = _mm256_sub_epi32(s01, off);
            s23 = _mm256_sub_epi32(s23, off);
        }
        let d_a = _mm_setr_ps(
            *a[0].d.add(b),
            *a[1].d.add(b),
            *a[2].d.add(b),
            *a[3].d.add(b),
        );
        let d_a = _mm256_set_m128(d_a, d_a);
        let dw = _mm256_castps128_ps256(d4);
        let d01 = _mm256_mul_ps(_mm256_permutevar8x32_ps(dw, lo_rows), d_a);
        let d23 = _mm256_mul_ps(_mm256_permutevar8x32_ps(dw, hi_rows), d_a);
        acc01 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s01), d01, acc01);
        acc23 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s23), d23, acc23);
    }
    let mut lanes = [[0f32; 8]; 2];
    _mm256_storeu_ps(lanes[0].as_mut_ptr(), acc01);
    _mm256_storeu_ps(lanes[1].as_mut_ptr(), acc23);
    for (c, o) in out.iter_mut().enumerate() {
        for (r, v) in o.iter_mut().enumerate() {
            *v = lanes[r / 2][(r % 2) * 4 + c];
        }
    }
}

/// Each 128-bit half of `p[c]` holds four partial sums of one row for token `c`; returns, in
/// each half, the four tokens' whole sums (a 4 x 4 transpose folded into the adds).
#[inline(always)]
unsafe fn transpose_sum4(p: &[__m256i; 4]) -> __m256i {
    let s1 = _mm256_add_epi32(
        _mm256_unpacklo_epi32(p[0], p[1]),
        _mm256_unpackhi_epi32(p[0], p[1]),
    );
    let s2 = _mm256_add_epi32(
        _mm256_unpacklo_epi32(p[2], p[3]),
        _mm256_unpackhi_epi32(p[2], p[3]),
    );
    _mm256_add_epi32(_mm256_unpacklo_epi64(s1, s2), _mm256_unpackhi_epi64(s1, s2))
}

/// The code table of [`b32_repacked_tile`] for `ty` (Q4_0, IQ4_NL or MXFP4), in both halves.
#[target_feature(enable = "avx2")]
unsafe fn b32_lut(ty: strata_gguf::GgmlType) -> __m256i {
    let q4_0: [i8; 16] = std::array::from_fn(|i| i as i8 - 8);
    let t = match ty {
        strata_gguf::GgmlType::IQ4NL => &crate::kformats::IQ4NL_VALUES,
        strata_gguf::GgmlType::MXFP4 => &crate::formats::MXFP4_VALUES,
        _ => &q4_0,
    };
    _mm256_broadcastsi128_si256(_mm_loadu_si128(t.as_ptr() as *const __m128i))
}

/// Computes the whole group at `g` for `C` activation rows, choosing the pair split by width.
///
/// # Safety
/// As for [`q4_tile`] / [`q8_tile`] for `ty`'s packed layout.
#[inline(always)]
pub(crate) unsafe fn group<const C: usize>(
    ty: strata_gguf::GgmlType,
    g: *const u8,
    nb: usize,
    a: &[ActRow; C],
    out: &mut [[f32; 4]; C],
) {
    use strata_gguf::GgmlType as T;
    match (ty, C) {
        // One activation row: both pairs at once share the scale and activation loads.
        (T::Q4_1, 1) => q4_tile::<C, 2, Q4_1>(g, 0, nb, a, None, out),
        (T::Q4_0, 1) => q4_tile::<C, 2, Q4_0>(g, 0, nb, a, None, out),
        (T::Q5_0, 1) => q4_tile::<C, 2, Q5_0>(g, 0, nb, a, None, out),
        (T::Q5_1, 1) => q4_tile::<C, 2, Q5_1>(g, 0, nb, a, None, out),
        // Several: one pair at a time keeps the accumulators in registers, and Q4_1's offset
        // terms are summed once for both pairs.
        (T::Q4_1, _) => {
            let mins = q4_1_mins::<C>(g, 80, nb, a);
            q4_tile::<C, 1, Q4_1>(g, 0, nb, a, Some(&mins), out);
            q4_tile::<C, 1, Q4_1>(g, 1, nb, a, Some(&mins), out);
        }
        (T::Q5_1, _) => {
            let mins = q4_1_mins::<C>(g, 96, nb, a);
            q4_tile::<C, 1, Q5_1>(g, 0, nb, a, Some(&mins), out);
            q4_tile::<C, 1, Q5_1>(g, 1, nb, a, Some(&mins), out);
        }
        (T::Q4_0, _) => {
            q4_tile::<C, 1, Q4_0>(g, 0, nb, a, None, out);
            q4_tile::<C, 1, Q4_0>(g, 1, nb, a, None, out);
        }
        (T::Q5_0, _) => {
            q4_tile::<C, 1, Q5_0>(g, 0, nb, a, None, out);
            q4_tile::<C, 1, Q5_0>(g, 1, nb, a, None, out);
        }
        _ => q8_tile::<C>(g, nb, a, out),
    }
}

/// Rows `g0 * 4 ..` of groups `g0..g1` for activation rows `t0..t1`; results go to
/// `out[t * ldo + row]` for rows below `rows`.
///
/// # Safety
/// AVX2, FMA and F16C must be available; `packed` must be the packed matrix of `ty` with `nb`
/// blocks per row and at least `g1` groups; `acts(t)` must describe valid activation rows for all
/// `t` in `t0..t1`; `out` must hold `t1 * ldo` floats, and no other thread may write the rows of
/// groups `g0..g1`.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn matmul_groups(
    ty: strata_gguf::GgmlType,
    repacked_order: bool,
    packed: *const u8,
    nb: usize,
    rows: usize,
    groups: std::ops::Range<usize>,
    tokens: std::ops::Range<usize>,
    acts: &dyn Fn(usize) -> ActRow,
    out: *mut f32,
    ldo: usize,
) {
    let gstride = nb * crate::packed::group_block_bytes(ty);
    let store = |t: usize, g: usize, v: &[f32; 4]| {
        let r0 = g * 4;
        for (i, &x) in v.iter().enumerate() {
            if r0 + i < rows {
                *out.add(t * ldo + r0 + i) = x;
            }
        }
    };
    // Q4_0 / IQ4_NL in llama.cpp's repacked order use their own kernel and its code table.
    let lut = if repacked_order {
        Some(b32_lut(ty))
    } else {
        None
    };
    let mx = ty == strata_gguf::GgmlType::MXFP4;
    for g in groups {
        let gp = packed.add(g * gstride);
        let mut t = tokens.start;
        while t + 4 <= tokens.end {
            let a = [acts(t), acts(t + 1), acts(t + 2), acts(t + 3)];
            let mut o = [[0.0f32; 4]; 4];
            if let Some(lut) = lut {
                if mx {
                    b32_repacked_tile4::<true, false>(lut, gp, nb, &a, &mut o);
                } else if ty == strata_gguf::GgmlType::Q4_0 {
                    b32_repacked_tile4::<false, true>(lut, gp, nb, &a, &mut o);
                } else {
                    b32_repacked_tile4::<false, false>(lut, gp, nb, &a, &mut o);
                }
            } else if ty == strata_gguf::GgmlType::Q8_0 {
                // Four rows x four tokens of Q8_0 would not fit in registers: two by two.
                let mut o2 = [[0.0f32; 4]; 2];
                group::<2>(ty, gp, nb, &[a[0], a[1]], &mut o2);
                o[0] = o2[0];
                o[1] = o2[1];
                group::<2>(ty, gp, nb, &[a[2], a[3]], &mut o2);
                o[2] = o2[0];
                o[3] = o2[1];
            } else {
                group::<4>(ty, gp, nb, &a, &mut o);
            }
            for (i, v) in o.iter().enumerate() {
                store(t + i, g, v);
            }
            t += 4;
        }
        // Two or three tokens left (a batch of 2, 3, 6, 7, ...): together, so the weights are
        // unpacked once for them rather than once per token (on the EPYC, three tokens of a
        // Q4_0 8192x2048 matrix took 1.8 ms together against 2.6 one at a time). Each token's
        // sums are the same operations in the same order whatever the tile, so the result does
        // not depend on it.
        if tokens.end - t == 3 && lut.is_none() && ty != strata_gguf::GgmlType::Q8_0 {
            let mut o = [[0.0f32; 4]; 3];
            group::<3>(ty, gp, nb, &[acts(t), acts(t + 1), acts(t + 2)], &mut o);
            for (i, v) in o.iter().enumerate() {
                store(t + i, g, v);
            }
            t += 3;
        }
        if tokens.end - t >= 2 {
            let a = [acts(t), acts(t + 1)];
            let mut o = [[0.0f32; 4]; 2];
            match lut {
                Some(lut) if mx => b32_repacked_tile::<2, true>(lut, gp, nb, &a, &mut o),
                Some(lut) => b32_repacked_tile::<2, false>(lut, gp, nb, &a, &mut o),
                None => group::<2>(ty, gp, nb, &a, &mut o),
            }
            for (i, v) in o.iter().enumerate() {
                store(t + i, g, v);
            }
            t += 2;
        }
        while t < tokens.end {
            let mut o = [[0.0f32; 4]; 1];
            match lut {
                Some(lut) if mx => b32_repacked_tile::<1, true>(lut, gp, nb, &[acts(t)], &mut o),
                Some(lut) => b32_repacked_tile::<1, false>(lut, gp, nb, &[acts(t)], &mut o),
                None => group::<1>(ty, gp, nb, &[acts(t)], &mut o),
            }
            store(t, g, &o[0]);
            t += 1;
        }
    }
}
