//! Matrix products in the arithmetic of llama.cpp's aarch64 builds (see [`crate::arm`]): every
//! row through that build's `vec_dot` for the format, except the batches it sends through
//! tinyBLAS (F16 and F32 weights, with the f32 activations).

use strata_gguf::GgmlType;

use crate::ThreadPool;
use crate::acts::QuantActs;
use crate::arm::{self, Lanes};
use crate::matmul::{OutPtr, QMatrix, Storage, check_shapes};

/// Rows a thread claims at a time.
const ROW_CHUNK: usize = 16;

/// Whether llama.cpp's aarch64 NEON build sends a batch of `n` tokens times `w` through
/// tinyBLAS: F16 weights for two or more tokens, F32 for four or more (its NEON tinyBLAS takes
/// f32 activations), when the row length and the tensor's row count are multiples of 4.
fn tinyblas(w: &QMatrix, acts: &QuantActs, n: usize) -> bool {
    let least = match w.ty {
        GgmlType::F16 => 2,
        GgmlType::F32 => 4,
        _ => return false,
    };
    n >= least && !acts.mul_mat_id && w.cols.is_multiple_of(4) && w.order_rows.is_multiple_of(4)
}

/// `out[t * w.rows() + r] = dot(row r of w, acts[t])` in the flavour's order (see
/// [`crate::matmul`]).
pub(crate) fn matmul(pool: &ThreadPool, w: &QMatrix, acts: &QuantActs, out: &mut [f32]) {
    check_shapes(w, acts, out);
    let n = acts.n;
    let (order_n, _) = acts.order_batch();
    let tiny = tinyblas(w, acts, order_n) && acts.raw.len() >= n * w.cols;
    let optr = OutPtr(out.as_mut_ptr());
    pool.run_units(w.rows.div_ceil(ROW_CHUNK), &|_tid, chunk| {
        let r0 = chunk * ROW_CHUNK;
        let r1 = (r0 + ROW_CHUNK).min(w.rows);
        // A matrix repacked for the x86 kernels (an x86 CPU computing in an ARM flavour)
        // gives its rows back one at a time.
        let mut unpacked = Vec::new();
        for r in r0..r1 {
            let row: &[u8] = match &w.data {
                Storage::Plain(b) => &b.bytes()[r * w.row_bytes..(r + 1) * w.row_bytes],
                Storage::Packed(p) => {
                    unpacked.resize(w.row_bytes, 0);
                    let nb = w.cols / w.ty.block_size();
                    crate::packed::unpack_row(w.ty, p, nb, r, &mut unpacked);
                    &unpacked
                }
            };
            for t in 0..n {
                let v = if tiny {
                    arm::dot_tinyblas(w.ty, row, &acts.raw[t * w.cols..(t + 1) * w.cols], w.cols)
                } else {
                    let a = &acts.buf[t * acts.row_bytes..(t + 1) * acts.row_bytes];
                    arm::dot(Lanes::Neon, w.ty, row, a, w.cols)
                };
                // SAFETY: in bounds (checked by `check_shapes`) and owned by this thread.
                unsafe { *optr.ptr().add(t * w.rows + r) = v };
            }
        }
    });
}
