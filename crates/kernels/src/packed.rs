//! The repacked weight layout the SIMD kernels read.
//!
//! GGUF stores a quantised matrix row by row, each block carrying its own f16 scale. A kernel that
//! reads it that way spends more instructions on scales than on products: every block of every
//! row needs a 16-bit load, an f16 conversion, a multiply and a broadcast. At load time strata
//! therefore regroups rows in fours ([`GROUP`]) and interleaves them block by block:
//!
//! ```text
//! group g, block b:  d[4] f16 | m[4] f16 (Q4_1, Q5_1) | fifth bits (Q5_0, Q5_1) | quants
//!   (MXFP4: the four E8M0 exponents in the low bytes of the four scale slots)
//!   4- and 5-bit quants: row0 16 B | row1 16 B | row2 16 B | row3 16 B   (two rows per 256 bits)
//!   Q8_0 quants:         row0 32 B | row1 32 B | row2 32 B | row3 32 B
//! ```
//!
//! Four scales convert in one instruction, and one 256-bit load of a 4-bit format yields both
//! rows of a pair: masking gives their low nibbles side by side, shifting their high nibbles. The
//! integer sum of each group of four products lands in the same 32-bit lane index it has in
//! llama.cpp's kernels, and each lane accumulates across blocks in the same order, so results stay
//! bit-identical to [`crate::dot::dot_scalar`]. The bytes are the same ones as in the file, only
//! reordered: a packed matrix is exactly as large as the original (plus padding rows when the row
//! count is not a multiple of four).

use strata_gguf::GgmlType;

/// Rows interleaved together.
pub(crate) const GROUP: usize = 4;

/// Whether `ty` has a packed layout.
pub(crate) fn packable(ty: GgmlType) -> bool {
    matches!(
        ty,
        GgmlType::Q4_0
            | GgmlType::Q4_1
            | GgmlType::Q5_0
            | GgmlType::Q5_1
            | GgmlType::Q8_0
            | GgmlType::IQ4NL
            | GgmlType::MXFP4
    )
}

/// Bytes of one block of one group (four rows) of `ty`.
pub(crate) fn group_block_bytes(ty: GgmlType) -> usize {
    match ty {
        GgmlType::Q4_1 => 8 + 8 + 64,
        GgmlType::Q4_0 | GgmlType::IQ4NL | GgmlType::MXFP4 => 8 + 64,
        GgmlType::Q5_0 => 8 + 16 + 64,
        GgmlType::Q5_1 => 8 + 8 + 16 + 64,
        GgmlType::Q8_0 => 8 + 128,
        _ => 0,
    }
}

/// Offset of the quants inside a group block.
pub(crate) fn quants_offset(ty: GgmlType) -> usize {
    match ty {
        GgmlType::Q4_1 => 16,
        GgmlType::Q5_0 => 24,
        GgmlType::Q5_1 => 32,
        _ => 8,
    }
}

/// Offset of the fifth bits inside a group block of the 5-bit formats.
pub(crate) fn high_bits_offset(ty: GgmlType) -> Option<usize> {
    match ty {
        GgmlType::Q5_0 => Some(8),
        GgmlType::Q5_1 => Some(16),
        _ => None,
    }
}

/// Q5_0's (and Q5_1's) fifth bits of rows `2p` and `2p + 1` as the pair kernel wants them: the low word holds
/// bits 0..16 of both rows (the elements in low nibbles), the high word bits 16..32.
fn q5_pair_bits(qh0: u32, qh1: u32) -> (u32, u32) {
    (
        (qh0 & 0xFFFF) | (qh1 << 16),
        (qh0 >> 16) | (qh1 & 0xFFFF_0000),
    )
}

/// Repacks `rows` rows of `row_bytes` bytes each (format `ty`, `nb` blocks per row) into groups.
/// Missing rows of the last group are zero (zero scales, so their products are zero).
pub(crate) fn pack(ty: GgmlType, plain: &[u8], rows: usize, nb: usize) -> Vec<u8> {
    let gbb = group_block_bytes(ty);
    let bb = ty.block_bytes();
    let row_bytes = nb * bb;
    let groups = rows.div_ceil(GROUP);
    let mut out = vec![0u8; groups * nb * gbb];
    let qoff = quants_offset(ty);
    for g in 0..groups {
        for b in 0..nb {
            let dst = &mut out[(g * nb + b) * gbb..(g * nb + b + 1) * gbb];
            for r in 0..GROUP {
                let row = g * GROUP + r;
                if row >= rows {
                    continue;
                }
                let src = &plain[row * row_bytes + b * bb..row * row_bytes + (b + 1) * bb];
                if ty == GgmlType::MXFP4 {
                    dst[2 * r] = src[0];
                    dst[qoff + 16 * r..qoff + 16 * (r + 1)].copy_from_slice(&src[1..17]);
                    continue;
                }
                dst[2 * r..2 * r + 2].copy_from_slice(&src[0..2]);
                match ty {
                    GgmlType::Q4_1 => {
                        dst[8 + 2 * r..10 + 2 * r].copy_from_slice(&src[2..4]);
                        dst[qoff + 16 * r..qoff + 16 * (r + 1)].copy_from_slice(&src[4..20]);
                    }
                    GgmlType::Q4_0 | GgmlType::IQ4NL => {
                        dst[qoff + 16 * r..qoff + 16 * (r + 1)].copy_from_slice(&src[2..18]);
                    }
                    GgmlType::Q5_0 => {
                        dst[qoff + 16 * r..qoff + 16 * (r + 1)].copy_from_slice(&src[6..22]);
                    }
                    GgmlType::Q5_1 => {
                        dst[8 + 2 * r..10 + 2 * r].copy_from_slice(&src[2..4]);
                        dst[qoff + 16 * r..qoff + 16 * (r + 1)].copy_from_slice(&src[8..24]);
                    }
                    _ => {
                        dst[qoff + 32 * r..qoff + 32 * (r + 1)].copy_from_slice(&src[2..34]);
                    }
                }
            }
            if let Some(hoff) = high_bits_offset(ty) {
                let at_qh = if ty == GgmlType::Q5_1 { 4 } else { 2 };
                let qh = |r: usize| -> u32 {
                    let row = g * GROUP + r;
                    if row >= rows {
                        return 0;
                    }
                    let at = row * row_bytes + b * bb + at_qh;
                    u32::from_le_bytes([plain[at], plain[at + 1], plain[at + 2], plain[at + 3]])
                };
                for p in 0..2 {
                    let (lo, hi) = q5_pair_bits(qh(2 * p), qh(2 * p + 1));
                    dst[hoff + 8 * p..hoff + 4 + 8 * p].copy_from_slice(&lo.to_le_bytes());
                    dst[hoff + 4 + 8 * p..hoff + 8 + 8 * p].copy_from_slice(&hi.to_le_bytes());
                }
            }
        }
    }
    out
}

/// Restores row `r` in the file layout: the inverse the packing tests check against, and how
/// an ARM flavour's products read a matrix packed for the x86 kernels.
pub(crate) fn unpack_row(ty: GgmlType, packed: &[u8], nb: usize, r: usize, out: &mut [u8]) {
    let gbb = group_block_bytes(ty);
    let bb = ty.block_bytes();
    let qoff = quants_offset(ty);
    let (g, i) = (r / GROUP, r % GROUP);
    for b in 0..nb {
        let src = &packed[(g * nb + b) * gbb..(g * nb + b + 1) * gbb];
        let dst = &mut out[b * bb..(b + 1) * bb];
        if ty == GgmlType::MXFP4 {
            dst[0] = src[2 * i];
            dst[1..17].copy_from_slice(&src[qoff + 16 * i..qoff + 16 * (i + 1)]);
            continue;
        }
        dst[0..2].copy_from_slice(&src[2 * i..2 * i + 2]);
        match ty {
            GgmlType::Q4_1 => {
                dst[2..4].copy_from_slice(&src[8 + 2 * i..10 + 2 * i]);
                dst[4..20].copy_from_slice(&src[qoff + 16 * i..qoff + 16 * (i + 1)]);
            }
            GgmlType::Q4_0 | GgmlType::IQ4NL => {
                dst[2..18].copy_from_slice(&src[qoff + 16 * i..qoff + 16 * (i + 1)])
            }
            GgmlType::Q5_0 | GgmlType::Q5_1 => {
                let hoff = if ty == GgmlType::Q5_1 { 16 } else { 8 };
                let (p, second) = (i / 2, i % 2 == 1);
                let word = |at: usize| {
                    u32::from_le_bytes([src[at], src[at + 1], src[at + 2], src[at + 3]])
                };
                let (lo, hi) = (word(hoff + 8 * p), word(hoff + 4 + 8 * p));
                let qh = if second {
                    (lo >> 16) | (hi & 0xFFFF_0000)
                } else {
                    (lo & 0xFFFF) | (hi << 16)
                };
                // Q5_1 blocks: d, m, qh, quants; Q5_0: d, qh, quants.
                let at = if ty == GgmlType::Q5_1 {
                    dst[2..4].copy_from_slice(&src[8 + 2 * i..10 + 2 * i]);
                    4
                } else {
                    2
                };
                dst[at..at + 4].copy_from_slice(&qh.to_le_bytes());
                dst[at + 4..at + 20].copy_from_slice(&src[qoff + 16 * i..qoff + 16 * (i + 1)]);
            }
            _ => dst[2..34].copy_from_slice(&src[qoff + 32 * i..qoff + 32 * (i + 1)]),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pack_then_unpack_restores_every_row() {
        for ty in [
            GgmlType::Q4_0,
            GgmlType::Q4_1,
            GgmlType::Q5_0,
            GgmlType::Q5_1,
            GgmlType::Q8_0,
            GgmlType::IQ4NL,
            GgmlType::MXFP4,
        ] {
            let (rows, nb) = (7, 3);
            let rb = nb * ty.block_bytes();
            let plain: Vec<u8> = (0..rows * rb).map(|i| (i * 31 % 251) as u8).collect();
            let packed = pack(ty, &plain, rows, nb);
            assert_eq!(packed.len(), 2 * nb * group_block_bytes(ty));
            let mut row = vec![0u8; rb];
            for r in 0..rows {
                unpack_row(ty, &packed, nb, r, &mut row);
                assert_eq!(row, plain[r * rb..(r + 1) * rb], "{ty} row {r}");
            }
        }
    }
}
