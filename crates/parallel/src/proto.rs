//! The messages that drive a step through the ranks: a small binary header (what to compute),
//! followed by hidden states between pipeline stages or by sampling candidates back to rank 0.

use strata_engine::SamplingParams;

use crate::{Error, Result};

/// What a step asks of the ranks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// Run tokens through the model.
    Step = 1,
    /// Leave the serving loop.
    Shutdown = 2,
    /// One decode token for each of several sequences (`seqs`, at `poss`), run as one batch.
    Batch = 3,
    /// Prefix cache: cut slot `seq` to `pos0` positions and bring in the cached blocks
    /// listed (as [`ids_from_words`] reads them from `tokens`).
    Restore = 4,
    /// Prefix cache: keep positions `pos0..pos0 + BLOCK` of slot `seq` as the block named
    /// in `tokens`.
    Save = 5,
    /// Prefix cache: drop the blocks listed.
    Forget = 6,
    /// The embedding of `tokens`, computed alone in a cache of each rank's own and pooled as
    /// `seq` names it ([`strata_engine::embed::Pooling::gguf_code`]); the last stage's first
    /// rank sends the vector to rank 0.
    Embed = 7,
}

impl Kind {
    /// Whether the kind changes what ranks hold without running the model (ranks apply it and
    /// pass it on; nothing comes back).
    pub(crate) fn is_control(self) -> bool {
        matches!(self, Kind::Restore | Kind::Save | Kind::Forget)
    }
}

/// Prefix cache entry ids as header words (low half first).
pub(crate) fn ids_to_words(ids: &[u64], out: &mut Vec<u32>) {
    out.clear();
    for &id in ids {
        out.extend([id as u32, (id >> 32) as u32]);
    }
}

/// The entry ids [`ids_to_words`] wrote.
pub(crate) fn ids_from_words(words: &[u32]) -> Result<Vec<u64>> {
    if !words.len().is_multiple_of(2) {
        return Err(Error::Protocol("a block list of odd length".into()));
    }
    Ok(words
        .chunks_exact(2)
        .map(|w| u64::from(w[0]) | (u64::from(w[1]) << 32))
        .collect())
}

/// One step's header. Kept and reused by each rank, so decoding allocates nothing per token.
#[derive(Clone, Debug)]
pub(crate) struct Header {
    pub(crate) kind: Kind,
    /// Which sequence (KV cache slot).
    pub(crate) seq: u32,
    /// The position of the first token; ranks drop cached positions from here on first.
    pub(crate) pos0: u32,
    /// Whether the last stage sends sampling candidates back.
    pub(crate) want: bool,
    pub(crate) tokens: Vec<u32>,
    pub(crate) params: SamplingParams,
    /// Recent tokens (for the penalties the last stage must account for).
    pub(crate) history: Vec<u32>,
    /// A batch's sequence of each token (empty for other kinds).
    pub(crate) seqs: Vec<u32>,
    /// A batch's position of each token.
    pub(crate) poss: Vec<u32>,
    /// A batch's rows limited to the tokens a grammar allows: 1 for each such row (empty when
    /// none is).
    pub(crate) masked: Vec<u32>,
    /// The masks of those rows, one after another: bit `t % 32` of word `t / 32` set when
    /// token `t` is allowed, as many words per row as the vocabulary needs.
    pub(crate) masks: Vec<u32>,
}

impl Default for Header {
    fn default() -> Self {
        Header {
            kind: Kind::Step,
            seq: 0,
            pos0: 0,
            want: false,
            tokens: Vec::new(),
            params: SamplingParams::default(),
            history: Vec::new(),
            seqs: Vec::new(),
            poss: Vec::new(),
            masked: Vec::new(),
            masks: Vec::new(),
        }
    }
}

struct Reader<'a>(&'a [u8]);

impl Reader<'_> {
    fn take<const N: usize>(&mut self) -> Result<[u8; N]> {
        if self.0.len() < N {
            return Err(Error::Protocol("truncated step header".into()));
        }
        let (a, b) = self.0.split_at(N);
        self.0 = b;
        a.try_into()
            .map_err(|_| Error::Protocol("truncated step header".into()))
    }
    fn u32(&mut self) -> Result<u32> {
        self.take::<4>().map(u32::from_le_bytes)
    }
    fn f32(&mut self) -> Result<f32> {
        self.take::<4>().map(f32::from_le_bytes)
    }
    fn u64(&mut self) -> Result<u64> {
        self.take::<8>().map(u64::from_le_bytes)
    }
    fn ids(&mut self, out: &mut Vec<u32>) -> Result<()> {
        let n = self.u32()? as usize;
        if n > self.0.len() / 4 {
            return Err(Error::Protocol("step header token count too large".into()));
        }
        out.clear();
        for _ in 0..n {
            out.push(self.u32()?);
        }
        Ok(())
    }
}

impl Header {
    pub(crate) fn encode(&self, out: &mut Vec<u8>) {
        out.clear();
        out.push(self.kind as u8);
        out.push(u8::from(self.want));
        for v in [self.seq, self.pos0] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        let p = &self.params;
        for v in [
            p.temperature,
            p.top_p,
            p.min_p,
            p.repeat_penalty,
            p.presence_penalty,
            p.frequency_penalty,
        ] {
            out.extend_from_slice(&v.to_le_bytes());
        }
        out.extend_from_slice(&(p.top_k as u32).to_le_bytes());
        out.extend_from_slice(&(p.penalty_last_n as u32).to_le_bytes());
        out.extend_from_slice(&p.seed.to_le_bytes());
        for list in [
            &self.tokens,
            &self.history,
            &self.seqs,
            &self.poss,
            &self.masked,
            &self.masks,
        ] {
            out.extend_from_slice(&(list.len() as u32).to_le_bytes());
            for t in list.iter() {
                out.extend_from_slice(&t.to_le_bytes());
            }
        }
    }

    /// Decodes into `self` (reusing its vectors); returns the bytes after the header.
    pub(crate) fn decode<'a>(&mut self, buf: &'a [u8]) -> Result<&'a [u8]> {
        let mut r = Reader(buf);
        let [kind, want] = r.take::<2>()?;
        self.kind = match kind {
            1 => Kind::Step,
            2 => Kind::Shutdown,
            3 => Kind::Batch,
            4 => Kind::Restore,
            5 => Kind::Save,
            6 => Kind::Forget,
            7 => Kind::Embed,
            k => return Err(Error::Protocol(format!("unknown step kind {k}"))),
        };
        self.want = want != 0;
        self.seq = r.u32()?;
        self.pos0 = r.u32()?;
        let p = &mut self.params;
        p.temperature = r.f32()?;
        p.top_p = r.f32()?;
        p.min_p = r.f32()?;
        p.repeat_penalty = r.f32()?;
        p.presence_penalty = r.f32()?;
        p.frequency_penalty = r.f32()?;
        p.top_k = r.u32()? as usize;
        p.penalty_last_n = r.u32()? as usize;
        p.seed = r.u64()?;
        r.ids(&mut self.tokens)?;
        r.ids(&mut self.history)?;
        r.ids(&mut self.seqs)?;
        r.ids(&mut self.poss)?;
        r.ids(&mut self.masked)?;
        r.ids(&mut self.masks)?;
        if !self.masked.is_empty() && self.masked.len() != self.tokens.len() {
            return Err(Error::Protocol(format!(
                "masks for {} rows of a batch of {}",
                self.masked.len(),
                self.tokens.len()
            )));
        }
        if self.kind == Kind::Batch
            && (self.seqs.len() != self.tokens.len() || self.poss.len() != self.tokens.len())
        {
            return Err(Error::Protocol(format!(
                "a batch of {} tokens with {} sequences and {} positions",
                self.tokens.len(),
                self.seqs.len(),
                self.poss.len()
            )));
        }
        Ok(r.0)
    }
}

/// Encodes sampling candidates as (id, logit) pairs.
pub(crate) fn encode_candidates(c: &[(u32, f32)], out: &mut Vec<u8>) {
    out.clear();
    for (id, l) in c {
        out.extend_from_slice(&id.to_le_bytes());
        out.extend_from_slice(&l.to_le_bytes());
    }
}

/// Encodes one candidate list per batch row: the row count, then each row's length and pairs.
pub(crate) fn encode_candidate_rows(rows: &[Vec<(u32, f32)>], out: &mut Vec<u8>) {
    out.clear();
    out.extend_from_slice(&(rows.len() as u32).to_le_bytes());
    for row in rows {
        out.extend_from_slice(&(row.len() as u32).to_le_bytes());
        for (id, l) in row {
            out.extend_from_slice(&id.to_le_bytes());
            out.extend_from_slice(&l.to_le_bytes());
        }
    }
}

/// Appends each row's candidates in `buf` to `out[row]` (which must have as many rows).
pub(crate) fn decode_candidate_rows(buf: &[u8], out: &mut [Vec<(u32, f32)>]) -> Result<()> {
    let mut r = Reader(buf);
    let rows = r.u32()? as usize;
    if rows != out.len() {
        return Err(Error::Protocol(format!(
            "candidates for {rows} rows of a batch of {}",
            out.len()
        )));
    }
    for row in out.iter_mut() {
        let n = r.u32()? as usize;
        if n > r.0.len() / 8 {
            return Err(Error::Protocol("malformed candidate rows".into()));
        }
        for _ in 0..n {
            let id = r.u32()?;
            let l = r.f32()?;
            row.push((id, l));
        }
    }
    if !r.0.is_empty() {
        return Err(Error::Protocol(
            "trailing bytes after candidate rows".into(),
        ));
    }
    Ok(())
}

/// Appends the candidates in `buf` to `out`.
pub(crate) fn decode_candidates(buf: &[u8], out: &mut Vec<(u32, f32)>) -> Result<()> {
    if !buf.len().is_multiple_of(8) {
        return Err(Error::Protocol("malformed candidate list".into()));
    }
    for c in buf.chunks_exact(8) {
        out.push((
            u32::from_le_bytes([c[0], c[1], c[2], c[3]]),
            f32::from_le_bytes([c[4], c[5], c[6], c[7]]),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefix_cache_messages_carry_block_ids_whole() {
        let ids = [1u64, u64::from(u32::MAX) + 7, u64::MAX];
        let mut h = Header {
            kind: Kind::Restore,
            seq: 2,
            pos0: 512,
            ..Header::default()
        };
        ids_to_words(&ids, &mut h.tokens);
        let mut buf = Vec::new();
        h.encode(&mut buf);
        let mut back = Header::default();
        back.decode(&buf).expect("decodes");
        assert_eq!((back.kind, back.seq, back.pos0), (Kind::Restore, 2, 512));
        assert!(back.kind.is_control() && !Kind::Batch.is_control());
        assert_eq!(ids_from_words(&back.tokens).expect("ids"), ids);
        assert!(ids_from_words(&[1, 2, 3]).is_err());
    }

    #[test]
    fn header_round_trip_and_truncation() {
        let h = Header {
            kind: Kind::Step,
            seq: 3,
            pos0: 17,
            want: true,
            tokens: vec![1, 2, 3],
            params: SamplingParams {
                temperature: 0.7,
                top_k: 40,
                seed: 9,
                ..SamplingParams::default()
            },
            history: vec![5, 6],
            ..Header::default()
        };
        let mut buf = Vec::new();
        h.encode(&mut buf);
        buf.extend_from_slice(b"tail");
        let mut back = Header::default();
        let rest = back.decode(&buf).expect("decode");
        assert_eq!(rest, b"tail");
        assert_eq!(back.tokens, h.tokens);
        assert_eq!(back.params, h.params);
        assert_eq!((back.seq, back.pos0, back.want), (3, 17, true));
        for cut in [0, 1, 10, 50, buf.len() - 9] {
            assert!(back.decode(&buf[..cut]).is_err(), "{cut}");
        }
        // A batch names a sequence and a position for every token.
        let mut b = h.clone();
        b.kind = Kind::Batch;
        b.seqs = vec![0, 2, 1];
        b.poss = vec![4, 9, 0];
        b.encode(&mut buf);
        back.decode(&buf).expect("batch");
        assert_eq!(
            (back.kind, &back.seqs, &back.poss),
            (Kind::Batch, &b.seqs, &b.poss)
        );
        b.poss.pop();
        b.encode(&mut buf);
        assert!(back.decode(&buf).is_err());
        // Masks name every row of the batch or none.
        b.poss.push(0);
        b.masked = vec![1, 0, 1];
        b.masks = vec![7, 9, 11, 13];
        b.encode(&mut buf);
        back.decode(&buf).expect("masked batch");
        assert_eq!((&back.masked, &back.masks), (&b.masked, &b.masks));
        b.masked.pop();
        b.encode(&mut buf);
        assert!(back.decode(&buf).is_err());
    }

    #[test]
    fn candidate_rows_round_trip_and_refuse_a_wrong_row_count() {
        let rows = vec![vec![(1, 0.5), (7, -1.0)], vec![], vec![(3, 2.0)]];
        let mut buf = Vec::new();
        encode_candidate_rows(&rows, &mut buf);
        let mut back = vec![Vec::new(); 3];
        decode_candidate_rows(&buf, &mut back).expect("decode");
        assert_eq!(back, rows);
        let mut two = vec![Vec::new(); 2];
        assert!(decode_candidate_rows(&buf, &mut two).is_err());
        let mut three = vec![Vec::new(); 3];
        assert!(decode_candidate_rows(&buf[..buf.len() - 1], &mut three).is_err());
    }
}
