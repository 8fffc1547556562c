//! llama.cpp's reference weight quantisers, ported operation for operation.
//!
//! Synthetic models (`strata synth`, the parity tests) must carry the bytes llama.cpp's quantiser
//! writes, so that a model strata quantises and the same f32 model quantised by `llama-quantize`
//! are one file and llama.cpp's logits are a valid reference for ours. [`quantize`] therefore
//! reproduces what `ggml_quantize_chunk` runs without an importance matrix, not just something
//! close to it: the same f32 operations in the same order (ggml-quants.c is built for baseline
//! x86-64, so there is no fused multiply-add to imitate), the same float-to-int conversions
//! (`nearest_int`'s round half to even, C's truncating casts) and ggml's own f16 and bf16
//! conversions. `fixtures/quant/vectors.json` (written by `scripts/make-quant-vectors.py` from
//! llama.cpp's output) pins the result byte for byte.
//!
//! Which C function each type follows:
//!
//! | type | `ggml_quantize_chunk` (imatrix NULL) runs |
//! |------|-------------------------------------------|
//! | Q2_K | `quantize_row_q2_K_ref` (`make_qkx2_quants`, 16 values, MAD error) |
//! | Q3_K | `quantize_row_q3_K_ref` (`make_q3_quants`) |
//! | Q4_K | `quantize_row_q4_K_ref` (`make_qkx2_quants`, 32 values) |
//! | Q5_K | `quantize_row_q5_K_ref` (`make_qkx2_quants`, 32 values) |
//! | Q6_K | `quantize_row_q6_K_ref` (`make_qx_quants`, rmse type 1) |
//! | Q5_1 | `quantize_row_q5_1_ref` |
//! | IQ4_NL | `quantize_iq4_nl`: `quantize_row_iq4_nl_impl(32, 32, .., ntry 7)` |
//! | IQ4_XS | `quantize_iq4_xs`: `quantize_row_iq4_nl_impl(256, 32, .., ntry 7)` |
//! | BF16 | `ggml_fp32_to_bf16_row_ref` (`ggml_compute_fp32_to_bf16`) |
//!
//! IQ4_NL goes through `quantize_iq4_nl` (7 extra scale tries), not `quantize_row_iq4_nl_ref`
//! (none), because that is what `ggml_quantize_chunk` calls.
//!
//! The block quantisers live by type family, as ggml-quants.c groups them: [`k_quants`],
//! [`legacy`] and [`iq4`](mod@iq4); this module holds the dispatch and the rounding and f16
//! conversions every family shares.

use strata_gguf::GgmlType;

use iq4::iq4;
use k_quants::{q2_k, q3_k, q4_k, q5_k, q6_k};
use legacy::q5_1;

mod iq4;
mod k_quants;
mod legacy;

const QK_K: usize = 256;
/// Below this absolute maximum a group counts as all zeros (`GROUP_MAX_EPS`).
const GROUP_MAX_EPS: f32 = 1e-15;

/// Quantises `x` to `ty` exactly as llama.cpp's `ggml_quantize_chunk` does without an importance
/// matrix. `None` if `ty` is not one of Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, Q5_1, IQ4_NL, IQ4_XS and
/// BF16, or if `x` is not a whole number of `ty`'s blocks. Any input, finite or not, gives bytes.
pub(crate) fn quantize(ty: GgmlType, x: &[f32]) -> Option<Vec<u8>> {
    let block: fn(&[f32], &mut [u8]) = match ty {
        GgmlType::Q2K => q2_k,
        GgmlType::Q3K => q3_k,
        GgmlType::Q4K => q4_k,
        GgmlType::Q5K => q5_k,
        GgmlType::Q6K => q6_k,
        GgmlType::Q5_1 => q5_1,
        GgmlType::IQ4NL | GgmlType::IQ4XS => iq4,
        GgmlType::BF16 => |x, out| out.copy_from_slice(&fp32_to_bf16(x[0]).to_le_bytes()),
        _ => return None,
    };
    let (n, bytes) = (ty.block_size(), ty.block_bytes());
    if !x.len().is_multiple_of(n) {
        return None;
    }
    let mut out = vec![0u8; x.len() / n * bytes];
    for (xb, ob) in x.chunks_exact(n).zip(out.chunks_exact_mut(bytes)) {
        block(xb, ob);
    }
    Some(out)
}

// ---------------------------------------------------------------- conversions

/// Round half to even through the float adder (`nearest_int`); meaningless but harmless beyond
/// +-4194303, where the C code asserts in debug builds only.
#[inline]
fn nearest_int(x: f32) -> i32 {
    let v = x + 12_582_912.0;
    ((v.to_bits() & 0x007F_FFFF) as i32) - 0x0040_0000
}

/// C's `(int)f` as x86-64 compiles it (`cvttss2si`): truncation toward zero, and `INT_MIN` for
/// NaN and out-of-range values (where Rust's `as` would saturate).
#[inline]
fn c_int(f: f32) -> i32 {
    if (-2_147_483_648.0..2_147_483_648.0).contains(&f) {
        f as i32
    } else {
        i32::MIN
    }
}

/// `ggml_compute_fp32_to_fp16`: ggml's portable conversion (round to nearest even; every NaN
/// becomes 0x7E00 with its sign).
fn fp32_to_fp16(f: f32) -> u16 {
    let scale_to_inf = f32::from_bits(0x7780_0000); // 2^112
    let scale_to_zero = f32::from_bits(0x0880_0000); // 2^-110
    let mut base = (f.abs() * scale_to_inf) * scale_to_zero;
    let w = f.to_bits();
    let shl1_w = w.wrapping_add(w);
    let sign = w & 0x8000_0000;
    let bias = (shl1_w & 0xFF00_0000).max(0x7100_0000);
    base += f32::from_bits((bias >> 1) + 0x0780_0000);
    let bits = base.to_bits();
    let nonsign = ((bits >> 13) & 0x7C00) + (bits & 0x0FFF);
    ((sign >> 16)
        | if shl1_w > 0xFF00_0000 {
            0x7E00
        } else {
            nonsign
        }) as u16
}

/// `ggml_compute_fp16_to_fp32`.
fn fp16_to_fp32(h: u16) -> f32 {
    let w = u32::from(h) << 16;
    let sign = w & 0x8000_0000;
    let two_w = w.wrapping_add(w);
    let exp_scale = f32::from_bits(0x0780_0000); // 2^-112
    let normalized = f32::from_bits((two_w >> 4) + (0xE0 << 23)) * exp_scale;
    let denormalized = f32::from_bits((two_w >> 17) | (126 << 23)) - 0.5;
    let mag = if two_w < (1 << 27) {
        denormalized
    } else {
        normalized
    };
    f32::from_bits(sign | mag.to_bits())
}

/// `ggml_compute_fp32_to_bf16`: round to nearest even, NaN kept (and made quiet).
pub(crate) fn fp32_to_bf16(s: f32) -> u16 {
    let u = s.to_bits();
    if u & 0x7FFF_FFFF > 0x7F80_0000 {
        return ((u >> 16) | 64) as u16;
    }
    (u.wrapping_add(0x7FFF + ((u >> 16) & 1)) >> 16) as u16
}

/// Stores `v` as ggml's f16 at `out[at..at + 2]` and returns the value stored (what the C code
/// reads back with `GGML_FP16_TO_FP32`).
fn put_f16(out: &mut [u8], at: usize, v: f32) -> f32 {
    let h = fp32_to_fp16(v);
    out[at..at + 2].copy_from_slice(&h.to_le_bytes());
    fp16_to_fp32(h)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use sha2::{Digest, Sha256};

    /// Every type [`quantize`] supports.
    const TYPES: [GgmlType; 9] = [
        GgmlType::Q2K,
        GgmlType::Q3K,
        GgmlType::Q4K,
        GgmlType::Q5K,
        GgmlType::Q6K,
        GgmlType::Q5_1,
        GgmlType::IQ4NL,
        GgmlType::IQ4XS,
        GgmlType::BF16,
    ];
    const ROWS: usize = 16;
    const N_PER_ROW: usize = 4096;

    /// splitmix64, as `SplitMix` in scripts/make-quant-vectors.py.
    struct SplitMix(u64);

    impl SplitMix {
        fn next(&mut self) -> u64 {
            self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut z = self.0;
            z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            z ^ (z >> 31)
        }

        /// In [-1, 1), exact: an integer below 2^24 over 2^23, minus one.
        fn unit(&mut self) -> f32 {
            (self.next() >> 40) as f32 / 8_388_608.0 - 1.0
        }
    }

    /// Row `kind` of the fixture's input (`case` in scripts/make-quant-vectors.py).
    pub(crate) fn case(kind: usize) -> Vec<f32> {
        let mut r = SplitMix(1000 + kind as u64);
        (0..N_PER_ROW)
            .map(|i| match kind {
                0 => r.unit(),
                1 => r.unit() * 0.02,
                2 => 0.0,
                3 => r.unit() * 1e-30,
                4 => r.unit() * 1e-7,
                5 => {
                    let v = r.unit() * 0.01;
                    match i {
                        17 => 1000.0,
                        2049 => -300.0,
                        _ => v,
                    }
                }
                6 => -r.unit().abs() * 0.5,
                7 => r.unit().abs() * 3.0,
                8 => {
                    let (a, b, c) = (r.unit(), r.unit(), r.unit());
                    (a + b + c) * 0.05
                }
                9 => r.unit() * f32::from_bits(((127 + i / 32 % 24 - 12) as u32) << 23),
                10 => {
                    let m = r.next();
                    let u = r.unit();
                    if m.is_multiple_of(10) { u * 0.5 } else { 0.0 }
                }
                11 => (i / 32 % 7) as f32 * 0.125 - 0.375,
                12 => r.unit() * 1e5,
                13 => ((r.next() % 17) as i32 - 8) as f32 * 0.25,
                14 => r.unit() * if i % 2 == 0 { 1e3 } else { 1e-3 },
                _ => {
                    let u = r.unit();
                    if i % 32 == 5 { u } else { 0.0 }
                }
            })
            .collect()
    }

    fn hex(d: impl AsRef<[u8]>) -> String {
        d.as_ref().iter().map(|b| format!("{b:02x}")).collect()
    }

    #[test]
    fn writes_the_bytes_llama_cpp_writes() {
        let doc: serde_json::Value =
            serde_json::from_str(include_str!("../../../fixtures/quant/vectors.json"))
                .expect("fixtures/quant/vectors.json parses");
        assert_eq!(doc["rows"], ROWS);
        assert_eq!(doc["n_per_row"], N_PER_ROW);
        let x: Vec<f32> = (0..ROWS).flat_map(case).collect();
        let raw: Vec<u8> = x.iter().flat_map(|v| v.to_le_bytes()).collect();
        assert_eq!(
            hex(Sha256::digest(&raw)),
            doc["input_sha256"],
            "the generator differs from scripts/make-quant-vectors.py"
        );
        let types = doc["types"].as_object().expect("a types object");
        assert_eq!(types.len(), TYPES.len());
        let mut wrong = Vec::new();
        for (name, t) in types {
            let id = t["id"].as_u64().expect("a type id") as u32;
            let ty = GgmlType::from_id(id).expect("a known type id");
            let q = quantize(ty, &x).expect("a supported type");
            assert_eq!(
                q.len() as u64,
                t["bytes"].as_u64().expect("a length"),
                "{name}"
            );
            let row = q.len() / ROWS;
            let rows = t["row_sha256"].as_array().expect("row digests");
            for (r, want) in rows.iter().enumerate() {
                if hex(Sha256::digest(&q[r * row..(r + 1) * row])) != *want {
                    wrong.push(format!("{name} row {r}"));
                }
            }
            if hex(Sha256::digest(&q)) != t["sha256"] {
                wrong.push(format!("{name} (whole)"));
            }
        }
        assert!(wrong.is_empty(), "bytes differ from llama.cpp's: {wrong:?}");
    }

    #[test]
    fn lengths_are_whole_blocks_and_output_is_deterministic() {
        let mut r = SplitMix(7);
        for ty in TYPES {
            for blocks in [1, 3] {
                let x: Vec<f32> = (0..blocks * ty.block_size()).map(|_| r.unit()).collect();
                let q = quantize(ty, &x).expect("a supported type");
                assert_eq!(q.len(), blocks * ty.block_bytes(), "{ty}");
                assert_eq!(quantize(ty, &x), Some(q), "{ty}");
            }
            if ty.block_size() > 1 {
                assert_eq!(quantize(ty, &[0.5; 33]), None, "{ty}: 33 values");
            }
        }
        assert_eq!(quantize(GgmlType::Q8_0, &[0.0; 32]), None);
        assert_eq!(quantize(GgmlType::F16, &[0.0; 32]), None);
    }

    #[test]
    fn dequantised_output_is_close_to_the_input() {
        // Worst absolute error on uniform [-1, 1) input, about 1.4 times what llama.cpp's
        // bytes give (Q2_K 0.31, Q3_K 0.21, Q4_K 0.089, Q5_K 0.038, Q6_K 0.016, Q5_1 0.032,
        // IQ4_XS 0.11, BF16 0.0019); `None` where this crate cannot dequantise the type yet
        // (lengths and determinism are checked for every type above).
        let bound = |ty| match ty {
            GgmlType::Q2K => Some(0.45),
            GgmlType::Q3K => Some(0.3),
            GgmlType::Q4K => Some(0.13),
            GgmlType::Q5K | GgmlType::Q5_1 => Some(0.06),
            GgmlType::Q6K => Some(0.025),
            GgmlType::IQ4XS => Some(0.16),
            GgmlType::BF16 => Some(0.004),
            _ => None,
        };
        let mut r = SplitMix(3);
        let x: Vec<f32> = (0..1024).map(|_| r.unit()).collect();
        for ty in TYPES {
            let Some(bound) = bound(ty) else { continue };
            let q = quantize(ty, &x).expect("a supported type");
            let mut back = vec![0.0f32; x.len()];
            if ty == GgmlType::BF16 {
                for (b, c) in back.iter_mut().zip(q.chunks_exact(2)) {
                    *b = f32::from_bits(u32::from(u16::from_le_bytes([c[0], c[1]])) << 16);
                }
            } else {
                crate::formats::dequantize_row(ty, &q, &mut back);
            }
            let err = x
                .iter()
                .zip(&back)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f32::max);
            assert!(err <= bound, "{ty}: max error {err} above {bound}");
        }
    }

    #[test]
    fn non_finite_inputs_give_bytes_not_panics() {
        let specials = [
            f32::NAN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::MAX,
            -f32::MAX,
        ];
        for ty in TYPES {
            for (k, &s) in specials.iter().enumerate() {
                let mut x = case(k);
                x.truncate(512);
                x[k * 37] = s;
                let q = quantize(ty, &x).expect("a supported type");
                assert_eq!(q.len(), 512 / ty.block_size() * ty.block_bytes(), "{ty}");
                assert_eq!(quantize(ty, &vec![s; 512]).map(|q| q.len()), Some(q.len()));
            }
            // Arbitrary bit patterns: NaN payloads, subnormals, signed zeros, huge values.
            let mut r = SplitMix(ty.id().into());
            for _ in 0..32 {
                let x: Vec<f32> = (0..512).map(|_| f32::from_bits(r.next() as u32)).collect();
                assert_eq!(
                    quantize(ty, &x).map(|q| q.len()),
                    Some(512 / ty.block_size() * ty.block_bytes())
                );
            }
        }
    }

    #[test]
    fn nearest_int_rounds_half_to_even() {
        let got: Vec<i32> = [0.5, 1.5, 2.5, -0.5, -1.5, -2.5, 2.4999, -0.0]
            .map(nearest_int)
            .to_vec();
        assert_eq!(got, [0, 2, 2, 0, -2, -2, 2, 0]);
        assert_eq!(c_int(31.9), 31);
        assert_eq!(c_int(-0.9), 0);
        assert_eq!(c_int(f32::NAN), i32::MIN);
        assert_eq!(c_int(3e9), i32::MIN);
    }

    #[test]
    fn ggml_half_conversions_agree_with_ieee_rounding() {
        // Every f16 reads back as the IEEE value, and converting it again is the identity.
        for h in 0..=u16::MAX {
            let v = half::f16::from_bits(h);
            if v.is_nan() {
                assert!(fp16_to_fp32(h).is_nan());
                continue;
            }
            assert_eq!(fp16_to_fp32(h).to_bits(), v.to_f32().to_bits(), "{h:#06x}");
            assert_eq!(fp32_to_fp16(v.to_f32()), h, "{h:#06x}");
        }
        // Values between f16s (ties included) round as IEEE round-to-nearest-even does.
        let mut r = SplitMix(11);
        for _ in 0..100_000 {
            let v = f32::from_bits(r.next() as u32);
            if !v.is_nan() {
                assert_eq!(fp32_to_fp16(v), half::f16::from_f32(v).to_bits(), "{v:e}");
            }
        }
        assert_eq!(fp32_to_fp16(f32::NAN), 0x7E00);
        assert_eq!(fp32_to_bf16(1.0), 0x3F80);
        assert_eq!(fp32_to_bf16(f32::from_bits(0x3F80_8000)), 0x3F80); // tie, to even
        assert_eq!(fp32_to_bf16(f32::from_bits(0x3F81_8000)), 0x3F82); // tie, to even
        assert_eq!(fp32_to_bf16(f32::from_bits(0x7F80_0001)), 0x7FC0); // NaN made quiet
    }
}
