//! Collectives over a group of ranks: all-reduce (sum), all-gather of column blocks, broadcast
//! and gather.
//!
//! A group is a list of ranks in a fixed order (a tensor-parallel group of a pipeline stage, or
//! every rank). The order fixes the arithmetic: every member sums contributions in group order,
//! so all members end with bit-identical results, which tensor parallelism relies on to keep
//! its replicated activations identical across ranks. Small messages (the per-token vectors of
//! decoding) go by direct exchange, one round; large ones by ring (reduce-scatter then
//! all-gather), which sends each byte once per hop instead of to every peer.

use std::ops::Range;

use crate::{Communicator, Error, Result};

/// All-reduces of at least this many bytes use the ring (for groups larger than two).
pub const RING_MIN_BYTES: usize = 64 << 10;

fn position(comm: &Communicator, group: &[usize]) -> Result<usize> {
    group
        .iter()
        .position(|&r| r == comm.rank())
        .ok_or_else(|| Error::Protocol {
            peer: comm.rank(),
            what: format!("rank {} is not in group {group:?}", comm.rank()),
        })
}

fn check_len(peer: usize, got: usize, want: usize) -> Result<()> {
    if got != want {
        return Err(Error::Protocol {
            peer,
            what: format!("sent {got} bytes where {want} were expected"),
        });
    }
    Ok(())
}

impl Communicator {
    /// Replaces `x` on every member of `group` with the element-wise sum over the members.
    pub fn all_reduce_sum(&mut self, group: &[usize], x: &mut [f32]) -> Result<()> {
        if group.len() <= 1 {
            return Ok(());
        }
        let bytes = std::mem::size_of_val(x);
        if group.len() == 2 || bytes < RING_MIN_BYTES || x.len() < group.len() {
            self.all_reduce_direct(group, x)
        } else {
            self.all_reduce_ring(group, x)
        }
    }

    fn all_reduce_direct(&mut self, group: &[usize], x: &mut [f32]) -> Result<()> {
        let me = position(self, group)?;
        let me_rank = self.rank();
        let bytes: &[u8] = bytemuck::cast_slice(x);
        for &r in group.iter().filter(|&&r| r != me_rank) {
            self.post_send(r, &[bytes])?;
            self.post_recv(r)?;
        }
        self.wait()?;
        for &r in group.iter().filter(|&&r| r != me_rank) {
            check_len(r, self.payload(r).len(), bytes.len())?;
        }
        // Sum in group order on every member: identical bits everywhere.
        let mut acc = std::mem::take(&mut self.scratch);
        acc.clear();
        for (i, &r) in group.iter().enumerate() {
            if i == me {
                add_or_copy(&mut acc, x, i == 0);
            } else {
                let src: &[u8] = self.payload(r);
                add_or_copy_bytes(&mut acc, src, i == 0);
            }
        }
        x.copy_from_slice(&acc);
        self.scratch = acc;
        Ok(())
    }

    fn all_reduce_ring(&mut self, group: &[usize], x: &mut [f32]) -> Result<()> {
        let m = group.len();
        let me = position(self, group)?;
        let next = group[(me + 1) % m];
        let prev = group[(me + m - 1) % m];
        let len = x.len();
        let chunk = |c: usize| -> Range<usize> {
            let per = len.div_ceil(m);
            (c * per).min(len)..((c + 1) * per).min(len)
        };
        // Reduce-scatter: after m - 1 steps this member holds the full sum of chunk me + 1.
        for s in 0..m - 1 {
            let send = chunk((me + m - s) % m);
            let recv = chunk((me + m - s - 1) % m);
            self.post_send(next, &[bytemuck::cast_slice(&x[send])])?;
            self.post_recv(prev)?;
            self.wait()?;
            let got = self.payload(prev);
            check_len(prev, got.len(), recv.len() * 4)?;
            for (d, s) in x[recv].iter_mut().zip(got.chunks_exact(4)) {
                *d += f32::from_le_bytes([s[0], s[1], s[2], s[3]]);
            }
        }
        // All-gather the summed chunks around the ring.
        for s in 0..m - 1 {
            let send = chunk((me + 1 + m - s) % m);
            let recv = chunk((me + m - s) % m);
            self.post_send(next, &[bytemuck::cast_slice(&x[send])])?;
            self.post_recv(prev)?;
            self.wait()?;
            let got = self.payload(prev);
            check_len(prev, got.len(), recv.len() * 4)?;
            copy_bytes(&mut x[recv], got);
        }
        Ok(())
    }

    /// Gathers column blocks: member `i` holds `src`, a `rows x parts[i].len()` block, and every
    /// member ends with `dst` (`rows x width`) holding each member's block at its columns.
    pub fn all_gather_cols(
        &mut self,
        group: &[usize],
        src: &[f32],
        dst: &mut [f32],
        rows: usize,
        parts: &[Range<usize>],
    ) -> Result<()> {
        let me = position(self, group)?;
        let width = parts.iter().map(|p| p.len()).sum::<usize>();
        if parts.len() != group.len() || src.len() != rows * parts[me].len() {
            return Err(Error::Protocol {
                peer: self.rank(),
                what: "all-gather block sizes do not match the group".into(),
            });
        }
        let place = |dst: &mut [f32], block: &[u8], cols: &Range<usize>| {
            let w = cols.len();
            // A member may own no columns (a rank without KV heads of its own).
            if w == 0 {
                return;
            }
            for (t, row) in block.chunks_exact(w * 4).enumerate().take(rows) {
                copy_bytes(&mut dst[t * width + cols.start..t * width + cols.end], row);
            }
        };
        let bytes: &[u8] = bytemuck::cast_slice(src);
        let me_rank = self.rank();
        for &r in group.iter().filter(|&&r| r != me_rank) {
            self.post_send(r, &[bytes])?;
            self.post_recv(r)?;
        }
        self.wait()?;
        place(dst, bytes, &parts[me]);
        for (i, &r) in group.iter().enumerate() {
            if i != me {
                check_len(r, self.payload(r).len(), rows * parts[i].len() * 4)?;
                place(dst, self.payload(r), &parts[i]);
            }
        }
        Ok(())
    }

    /// Sends `data` from `root` to every other member of `group`; on the others, `data` is
    /// replaced with what the root sent.
    pub fn broadcast(&mut self, group: &[usize], root: usize, data: &mut Vec<u8>) -> Result<()> {
        if self.rank() == root {
            for &r in group.iter().filter(|&&r| r != root) {
                self.post_send(r, &[data])?;
            }
            self.wait()
        } else {
            let got = self.recv(root)?;
            data.clear();
            data.extend_from_slice(got);
            Ok(())
        }
    }
}

fn add_or_copy(acc: &mut Vec<f32>, x: &[f32], first: bool) {
    if first {
        acc.extend_from_slice(x);
    } else {
        for (a, v) in acc.iter_mut().zip(x) {
            *a += v;
        }
    }
}

fn add_or_copy_bytes(acc: &mut Vec<f32>, src: &[u8], first: bool) {
    let vals = src
        .chunks_exact(4)
        .map(|s| f32::from_le_bytes([s[0], s[1], s[2], s[3]]));
    if first {
        acc.extend(vals);
    } else {
        for (a, v) in acc.iter_mut().zip(vals) {
            *a += v;
        }
    }
}

fn copy_bytes(dst: &mut [f32], src: &[u8]) {
    // Payload buffers carry no alignment guarantee, so copy bytewise into the f32 slice.
    let n = dst.len() * 4;
    bytemuck::cast_slice_mut::<f32, u8>(dst).copy_from_slice(&src[..n]);
}
