//! Protection of the data plane after the handshake: every message between two ranks travels
//! as two AEAD records (AES-256-GCM), one for its 16-byte header and one for its payload.
//!
//! Each direction of each connection has its own key (derived in [`crate::handshake`] from the
//! session token, an ephemeral X25519 exchange and both sides' nonces) and a counter that is
//! the record's nonce. The counter is never sent: the receiver opens record *n* with nonce *n*,
//! so a record that was altered, replayed, reordered or dropped in transit fails to open, and
//! the link fails with [`Error::Auth`] instead of delivering anything. The header is opened
//! before the payload is read, so a length that does not fit the protocol is refused before a
//! byte is allocated for it; a peer holding the token is still held to [`MAX_MESSAGE`].
//!
//! Why AES-256-GCM (ring's): on the x86-64 CPUs this runs on (AES-NI and carry-less multiply)
//! it seals a hidden-state-sized frame at several GB/s, faster than ChaCha20-Poly1305, and ring
//! is already built for the control plane's TLS, so nothing new compiles.

use ring::aead::{AES_256_GCM, Aad, LessSafeKey, Nonce, UnboundKey};

use crate::{Error, Result};

/// Bytes of a record's authentication tag.
pub(crate) const TAG: usize = 16;
/// Bytes of a message header in the clear: payload length, then earliest delivery time
/// (both little-endian u64).
pub(crate) const HEADER: usize = 16;
/// Bytes of a sealed message header (the header and its tag).
pub(crate) const SEALED_HEADER: usize = HEADER + TAG;
/// Bytes of a direction key.
pub(crate) const KEY: usize = 32;

/// The largest message any rank sends, and so the largest length a peer may announce.
///
/// The biggest messages of the protocol are a prefill chunk's activations: at most 512 tokens
/// (the prefill batch) of the widest row a rank exchanges (hidden states, or its block of a
/// feed-forward layer's columns in an all-gather). 256 MiB holds 512 tokens of 131,072 f32
/// columns, beyond the feed-forward width of any open model; a frame announcing more comes
/// from a broken or hostile peer and fails the link before anything is allocated.
pub const MAX_MESSAGE: usize = 256 << 20;

/// A message header, opened and checked.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct FrameHeader {
    /// Payload bytes (in the clear).
    pub(crate) len: usize,
    /// Earliest delivery time on the emulated link (0: at once).
    pub(crate) deliver_at: u64,
}

impl FrameHeader {
    /// The header's bytes.
    pub(crate) fn encode(&self) -> [u8; HEADER] {
        let mut h = [0u8; HEADER];
        h[..8].copy_from_slice(&(self.len as u64).to_le_bytes());
        h[8..].copy_from_slice(&self.deliver_at.to_le_bytes());
        h
    }

    /// Reads a header from `peer`, refusing a length above [`MAX_MESSAGE`].
    pub(crate) fn parse(peer: usize, h: &[u8; HEADER]) -> Result<FrameHeader> {
        let mut len = [0u8; 8];
        let mut at = [0u8; 8];
        len.copy_from_slice(&h[..8]);
        at.copy_from_slice(&h[8..]);
        let len = u64::from_le_bytes(len);
        if len > MAX_MESSAGE as u64 {
            return Err(Error::Oversized {
                peer,
                len,
                max: MAX_MESSAGE,
            });
        }
        Ok(FrameHeader {
            len: len as usize,
            deliver_at: u64::from_le_bytes(at),
        })
    }
}

/// One direction of a protected connection: its key and the number of records so far.
pub(crate) struct Direction {
    key: LessSafeKey,
    counter: u64,
}

impl std::fmt::Debug for Direction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the key.
        f.debug_struct("Direction")
            .field("counter", &self.counter)
            .finish()
    }
}

impl Direction {
    /// A direction starting at record 0 under `key`.
    pub(crate) fn new(key: &[u8; KEY]) -> Direction {
        // A 32-byte key is always accepted by AES-256-GCM.
        let key = match UnboundKey::new(&AES_256_GCM, key) {
            Ok(k) => LessSafeKey::new(k),
            Err(_) => unreachable!("AES-256-GCM takes 32-byte keys"),
        };
        Direction { key, counter: 0 }
    }

    /// The next record's nonce: the counter, which never repeats under one key (a connection
    /// would need 2^64 records to wrap; it is refused before that).
    fn nonce(&mut self, peer: usize) -> Result<Nonce> {
        let n = self.counter;
        self.counter = n.checked_add(1).ok_or(Error::Auth {
            peer,
            what: "the record counter is exhausted",
        })?;
        let mut bytes = [0u8; 12];
        bytes[4..].copy_from_slice(&n.to_be_bytes());
        Ok(Nonce::assume_unique_for_key(bytes))
    }

    /// Encrypts `buf` in place as the next record; returns its tag.
    pub(crate) fn seal(&mut self, peer: usize, buf: &mut [u8]) -> Result<[u8; TAG]> {
        let nonce = self.nonce(peer)?;
        let tag = self
            .key
            .seal_in_place_separate_tag(nonce, Aad::empty(), buf)
            .map_err(|_| Error::Auth {
                peer,
                what: "a record is too long to seal",
            })?;
        let mut out = [0u8; TAG];
        out.copy_from_slice(tag.as_ref());
        Ok(out)
    }

    /// Decrypts and checks the next record (`buf` holds ciphertext then tag) in place; returns
    /// the plaintext, the first `buf.len() - TAG` bytes.
    pub(crate) fn open<'a>(&mut self, peer: usize, buf: &'a mut [u8]) -> Result<&'a mut [u8]> {
        if buf.len() < TAG {
            return Err(Error::Auth {
                peer,
                what: "a record is shorter than its tag",
            });
        }
        let nonce = self.nonce(peer)?;
        self.key
            .open_in_place(nonce, Aad::empty(), buf)
            .map_err(|_| Error::Auth {
                peer,
                what: "a record does not authenticate",
            })
    }

    /// Opens a sealed header and checks the length it announces.
    pub(crate) fn open_header(
        &mut self,
        peer: usize,
        sealed: &[u8; SEALED_HEADER],
    ) -> Result<FrameHeader> {
        let mut buf = *sealed;
        let plain = self.open(peer, &mut buf)?;
        let mut h = [0u8; HEADER];
        h.copy_from_slice(plain);
        FrameHeader::parse(peer, &h)
    }
}

/// The two directions of one protected connection.
#[derive(Debug)]
pub(crate) struct SessionKeys {
    /// What this side sends.
    pub(crate) tx: Direction,
    /// What this side receives.
    pub(crate) rx: Direction,
}

impl SessionKeys {
    /// Keys from raw direction keys (the handshake derives them; tests and the fuzz target
    /// pick their own).
    pub(crate) fn from_raw(tx: &[u8; KEY], rx: &[u8; KEY]) -> SessionKeys {
        SessionKeys {
            tx: Direction::new(tx),
            rx: Direction::new(rx),
        }
    }

    /// The other end of a connection protected with these raw keys.
    pub(crate) fn peer_of_raw(tx: &[u8; KEY], rx: &[u8; KEY]) -> SessionKeys {
        SessionKeys::from_raw(rx, tx)
    }

    /// One whole message as it goes on the wire: sealed header, then payload and its tag.
    pub(crate) fn seal_message(
        &mut self,
        peer: usize,
        payload: &[u8],
        out: &mut Vec<u8>,
    ) -> Result<()> {
        let start = out.len();
        out.extend_from_slice(
            &FrameHeader {
                len: payload.len(),
                deliver_at: 0,
            }
            .encode(),
        );
        let tag = self.tx.seal(peer, &mut out[start..])?;
        out.extend_from_slice(&tag);
        let body = out.len();
        out.extend_from_slice(payload);
        let tag = self.tx.seal(peer, &mut out[body..])?;
        out.extend_from_slice(&tag);
        Ok(())
    }

    /// Reads one whole message (as [`SessionKeys::seal_message`] writes it) from the front of
    /// `wire`; returns the payload and the bytes consumed.
    pub(crate) fn open_message(&mut self, peer: usize, wire: &[u8]) -> Result<(Vec<u8>, usize)> {
        let short = || Error::Protocol {
            peer,
            what: "a message is cut short".into(),
        };
        let sealed: &[u8; SEALED_HEADER] = wire
            .get(..SEALED_HEADER)
            .and_then(|h| h.try_into().ok())
            .ok_or_else(short)?;
        let h = self.rx.open_header(peer, sealed)?;
        let end = SEALED_HEADER + h.len + TAG;
        let mut body = wire.get(SEALED_HEADER..end).ok_or_else(short)?.to_vec();
        let n = self.rx.open(peer, &mut body)?.len();
        body.truncate(n);
        Ok((body, end))
    }
}

/// How long sealing and then opening one message of `bytes` payload bytes takes on this CPU
/// (both records, as a link does them), averaged over `rounds`: for reports of what the
/// protection costs.
pub fn sealing_cost(bytes: usize, rounds: u32) -> Result<std::time::Duration> {
    let (tx, rx) = ([0x11u8; KEY], [0x22u8; KEY]);
    let mut a = SessionKeys::from_raw(&tx, &rx);
    let mut b = SessionKeys::peer_of_raw(&tx, &rx);
    let payload = vec![0x5au8; bytes];
    let mut wire = Vec::with_capacity(SEALED_HEADER + bytes + TAG);
    let start = std::time::Instant::now();
    for _ in 0..rounds.max(1) {
        wire.clear();
        a.seal_message(1, &payload, &mut wire)?;
        let mut head = [0u8; SEALED_HEADER];
        head.copy_from_slice(&wire[..SEALED_HEADER]);
        let h = b.rx.open_header(0, &head)?;
        let opened = b.rx.open(0, &mut wire[SEALED_HEADER..])?;
        std::hint::black_box((h, opened));
    }
    Ok(start.elapsed() / rounds.max(1))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pair() -> (SessionKeys, SessionKeys) {
        let (a, b) = ([1u8; KEY], [2u8; KEY]);
        (
            SessionKeys::from_raw(&a, &b),
            SessionKeys::peer_of_raw(&a, &b),
        )
    }

    #[test]
    fn messages_round_trip_and_hide_their_contents() {
        let (mut a, mut b) = pair();
        let secret = b"the hidden state of a private prompt".repeat(4);
        let mut wire = Vec::new();
        a.seal_message(1, &secret, &mut wire).expect("seal");
        a.seal_message(1, b"", &mut wire).expect("seal");
        assert!(!wire.windows(16).any(|w| secret.windows(16).any(|s| s == w)));
        let (got, used) = b.open_message(0, &wire).expect("open");
        assert_eq!(got, secret);
        let (empty, rest) = b.open_message(0, &wire[used..]).expect("open");
        assert!(empty.is_empty());
        assert_eq!(used + rest, wire.len());
    }

    #[test]
    fn a_flipped_bit_anywhere_fails_authentication() {
        let mut wire = Vec::new();
        pair()
            .0
            .seal_message(1, b"0123456789", &mut wire)
            .expect("seal");
        for at in 0..wire.len() {
            let mut bad = wire.clone();
            bad[at] ^= 0x10;
            match pair().1.open_message(0, &bad) {
                Err(Error::Auth { peer: 0, .. }) => {}
                other => panic!("byte {at}: {other:?}"),
            }
        }
    }

    #[test]
    fn replayed_and_reordered_records_are_refused() {
        let (mut a, mut b) = pair();
        let (mut first, mut second) = (Vec::new(), Vec::new());
        a.seal_message(1, b"first", &mut first).expect("seal");
        a.seal_message(1, b"second", &mut second).expect("seal");
        // Reordered: the second message arrives first.
        assert!(matches!(
            pair().1.open_message(0, &second),
            Err(Error::Auth { .. })
        ));
        // Replayed: the first message twice.
        b.open_message(0, &first).expect("first delivery");
        assert!(matches!(b.open_message(0, &first), Err(Error::Auth { .. })));
    }

    #[test]
    fn an_oversized_length_is_refused_even_when_authentic() {
        // A peer that holds the keys (a broken or hostile rank) announces 1 TiB.
        let (mut a, mut b) = pair();
        let mut h = FrameHeader {
            len: 0,
            deliver_at: 0,
        }
        .encode();
        h[..8].copy_from_slice(&(1u64 << 40).to_le_bytes());
        let tag = a.tx.seal(1, &mut h).expect("seal");
        let mut sealed = [0u8; SEALED_HEADER];
        sealed[..HEADER].copy_from_slice(&h);
        sealed[HEADER..].copy_from_slice(&tag);
        match b.rx.open_header(0, &sealed) {
            Err(Error::Oversized { len, max, .. }) => {
                assert_eq!((len, max), (1 << 40, MAX_MESSAGE));
            }
            other => panic!("{other:?}"),
        }
        let mut plain = [0xffu8; HEADER];
        plain[8..].fill(0);
        assert!(matches!(
            FrameHeader::parse(3, &plain),
            Err(Error::Oversized { peer: 3, .. })
        ));
    }
}
