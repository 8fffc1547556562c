//! AVX2 kernels (x86_64). Each computes a tile of R weight rows by C activation rows, keeping the
//! per-lane accumulation order of [`crate::dot::dot_scalar`], so results are bit-identical to the
//! scalar reference (and to llama.cpp) while the weight block is decoded once per tile.
#![allow(unsafe_op_in_unsafe_fn)]

use std::arch::x86_64::*;

use strata_gguf::GgmlType;

/// Weight formats with an AVX2 tile kernel.
pub(crate) fn supported(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::Q4_0 | GgmlType::Q4_1 | GgmlType::Q8_0)
}

#[inline(always)]
unsafe fn f16_at(p: *const u8) -> f32 {
    let bits = (p as *const u16).read_unaligned();
    _mm_cvtss_f32(_mm_cvtph_ps(_mm_cvtsi32_si128(i32::from(bits))))
}

#[inline(always)]
unsafe fn hsum(x: __m256) -> f32 {
    let mut r = _mm_add_ps(_mm256_extractf128_ps(x, 1), _mm256_castps256_ps128(x));
    r = _mm_add_ps(r, _mm_movehl_ps(r, r));
    r = _mm_add_ss(r, _mm_movehdup_ps(r));
    _mm_cvtss_f32(r)
}

/// 16 bytes of nibbles to 32 bytes: low nibbles first, then high nibbles.
#[inline(always)]
unsafe fn nibbles(p: *const u8) -> __m256i {
    let tmp = _mm_loadu_si128(p as *const __m128i);
    let both = _mm256_insertf128_si256(_mm256_castsi128_si256(tmp), _mm_srli_epi16(tmp, 4), 1);
    _mm256_and_si256(both, _mm256_set1_epi8(0x0F))
}

/// Eight lanes of sums of four products `u8 * i8`, as f32.
#[inline(always)]
unsafe fn dot_us8(ux: __m256i, sy: __m256i) -> __m256 {
    let p16 = _mm256_maddubs_epi16(ux, sy);
    _mm256_cvtepi32_ps(_mm256_madd_epi16(p16, _mm256_set1_epi16(1)))
}

/// Eight lanes of sums of four products `i8 * i8`, as f32.
#[inline(always)]
unsafe fn dot_s8(x: __m256i, y: __m256i) -> __m256 {
    dot_us8(_mm256_sign_epi8(x, x), _mm256_sign_epi8(y, x))
}

/// Computes `out[c * ldo + r] = dot(w[r], a[c])` for an R x C tile.
///
/// # Safety
/// The CPU must support AVX2, FMA and F16C. `w[r]` must point to `nb` blocks of `ty`, `a[c]` to
/// `nb` blocks of its activation format, and `out` must hold `(C - 1) * ldo + R` floats.
#[target_feature(enable = "avx2,fma,f16c")]
pub(crate) unsafe fn tile<const R: usize, const C: usize>(
    ty: GgmlType,
    w: [*const u8; R],
    a: [*const u8; C],
    nb: usize,
    out: *mut f32,
    ldo: usize,
) {
    let mut acc = [[_mm256_setzero_ps(); C]; R];
    let mut summs = [[0.0f32; C]; R];
    match ty {
        GgmlType::Q4_1 => {
            for ib in 0..nb {
                let mut dy = [0.0f32; C];
                let mut sy = [0.0f32; C];
                let mut qy = [_mm256_setzero_si256(); C];
                for c in 0..C {
                    let yb = a[c].add(ib * 36);
                    dy[c] = f16_at(yb);
                    sy[c] = f16_at(yb.add(2));
                    qy[c] = _mm256_loadu_si256(yb.add(4) as *const __m256i);
                }
                for r in 0..R {
                    let xb = w[r].add(ib * 20);
                    let dx = f16_at(xb);
                    let m = f16_at(xb.add(2));
                    let qx = nibbles(xb.add(4));
                    for c in 0..C {
                        summs[r][c] = m.mul_add(sy[c], summs[r][c]);
                        let xy = dot_us8(qx, qy[c]);
                        acc[r][c] = _mm256_fmadd_ps(_mm256_set1_ps(dx * dy[c]), xy, acc[r][c]);
                    }
                }
            }
        }
        GgmlType::Q4_0 | GgmlType::Q8_0 => {
            let q8 = ty == GgmlType::Q8_0;
            let wb = ty.block_bytes();
            for ib in 0..nb {
                let mut dy = [0.0f32; C];
                let mut qy = [_mm256_setzero_si256(); C];
                for c in 0..C {
                    let yb = a[c].add(ib * 34);
                    dy[c] = f16_at(yb);
                    qy[c] = _mm256_loadu_si256(yb.add(2) as *const __m256i);
                }
                for r in 0..R {
                    let xb = w[r].add(ib * wb);
                    let dx = f16_at(xb);
                    let qx = if q8 {
                        _mm256_loadu_si256(xb.add(2) as *const __m256i)
                    } else {
                        _mm256_sub_epi8(nibbles(xb.add(2)), _mm256_set1_epi8(8))
                    };
                    for c in 0..C {
                        let xy = dot_s8(qx, qy[c]);
                        acc[r][c] = _mm256_fmadd_ps(_mm256_set1_ps(dx * dy[c]), xy, acc[r][c]);
                    }
                }
            }
        }
        _ => {}
    }
    for r in 0..R {
        for c in 0..C {
            *out.add(c * ldo + r) = hsum(acc[r][c]) + summs[r][c];
        }
    }
}
