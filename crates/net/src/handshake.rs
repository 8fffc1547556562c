//! The handshake's wire format, as pure functions over bytes (the socket side lives in
//! [`crate::bootstrap`]; the fuzz target drives these directly).
//!
//! Every connection starts with a mutual proof of the session token, which never crosses the
//! wire, and an ephemeral X25519 exchange:
//!
//! 1. the acceptor sends its *share*: a fresh X25519 public key, which is also its challenge;
//! 2. the dialer answers with an HMAC (under the token) over both shares and its hello, its own
//!    share, and the hello; the acceptor checks the HMAC before it parses a byte of the hello;
//! 3. the acceptor's verdict carries an HMAC over both shares and the verdict in turn.
//!
//! Both sides then derive one AES-256-GCM key per direction with HKDF-SHA256 from the X25519
//! secret, the token and both shares ([`derive_keys`]), and everything after the verdict is
//! sealed ([`crate::seal`]). The token authenticates the exchange (a stranger, or a man in the
//! middle, cannot complete it) and the ephemeral secret makes the keys of every connection new:
//! a recorded session cannot be decrypted later even by someone who learns the token then.
//! A recorded handshake is useless to replay, since the acceptor's share is fresh.

use ring::agreement::{EphemeralPrivateKey, UnparsedPublicKey, X25519, agree_ephemeral};
use serde::{Deserialize, Serialize};

use crate::seal::{KEY, SessionKeys};
use crate::{Error, Result, Transport};

/// The wire protocol version; ranks of different versions refuse each other.
pub const PROTOCOL_VERSION: u32 = 3;
/// What every handshake frame starts with (the last byte is the protocol version).
pub(crate) const MAGIC: &[u8; 8] = b"STRATA\x00\x03";
/// Bytes of a handshake frame's head: the magic, then the body's length (u32, little-endian).
pub(crate) const FRAME_HEAD: usize = 12;
/// Largest handshake message accepted before the peer is trusted.
pub(crate) const MAX_HELLO: usize = 64 << 10;
/// Bytes of a share: an X25519 public key.
pub(crate) const SHARE: usize = 32;
/// Bytes of a handshake MAC.
pub(crate) const MAC: usize = 32;

/// A dialer's introduction.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Hello {
    pub(crate) version: u32,
    pub(crate) rank: usize,
    pub(crate) world: usize,
    /// Where the sender listens (workers registering with rank 0).
    pub(crate) addr: Option<std::net::SocketAddr>,
    /// Which shared memory the sender reaches, as whom (host, `/dev/shm`, user), as a digest
    /// keyed by the session token: equal ids can share a region.
    pub(crate) host: String,
    /// Whether this connection is the pair's heartbeat connection (TCP transport).
    #[serde(default)]
    pub(crate) control: bool,
}

/// Rank 0's table of the mesh, sent (sealed) to every worker after its handshake.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct Table {
    pub(crate) addrs: Vec<std::net::SocketAddr>,
    pub(crate) transport: Transport,
    pub(crate) shm_path: Option<std::path::PathBuf>,
    pub(crate) latency_ns: u64,
    pub(crate) bandwidth: Option<f64>,
    pub(crate) stall_ms: u64,
    /// Whether the data plane goes unprotected (`--insecure-plaintext` comparisons only). The
    /// table itself is sealed, so a man in the middle cannot switch this on.
    pub(crate) plaintext: bool,
}

/// An acceptor's answer to a hello, or a worker's report.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) enum Verdict {
    Welcome,
    Refused(String),
}

/// Both shares of one handshake.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Shares {
    pub(crate) acceptor: [u8; SHARE],
    pub(crate) dialer: [u8; SHARE],
}

/// Which end of a connection this side is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    Acceptor,
    Dialer,
}

/// HMAC-SHA-256 of `parts` (each prefixed with its length) under the session token.
pub(crate) fn mac(token: &str, parts: &[&[u8]]) -> [u8; MAC] {
    use hmac::Mac as _;
    let mut m = match <hmac::Hmac<sha2::Sha256>>::new_from_slice(token.as_bytes()) {
        Ok(m) => m,
        Err(_) => unreachable!("HMAC takes keys of any length"),
    };
    for p in parts {
        m.update(&(p.len() as u64).to_le_bytes());
        m.update(p);
    }
    m.finalize().into_bytes().into()
}

/// Compares secrets in time that does not depend on where they differ.
pub(crate) fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// A fresh ephemeral key and its share.
pub(crate) fn new_share() -> Result<(EphemeralPrivateKey, [u8; SHARE])> {
    let failed = |_| Error::Handshake("the system's random source failed".into());
    let rng = ring::rand::SystemRandom::new();
    let secret = EphemeralPrivateKey::generate(&X25519, &rng).map_err(failed)?;
    let public = secret.compute_public_key().map_err(failed)?;
    let mut share = [0u8; SHARE];
    share.copy_from_slice(public.as_ref());
    Ok((secret, share))
}

/// The body length a handshake frame head announces, refusing other protocols and lengths
/// above [`MAX_HELLO`] (checked before anything is allocated).
pub(crate) fn parse_frame_head(head: &[u8; FRAME_HEAD]) -> Result<usize> {
    if &head[..8] != MAGIC {
        return Err(Error::Handshake(format!(
            "the peer does not speak strata protocol version {PROTOCOL_VERSION}"
        )));
    }
    let len = u32::from_le_bytes([head[8], head[9], head[10], head[11]]) as usize;
    if len > MAX_HELLO {
        return Err(Error::Handshake(format!(
            "a handshake message of {len} bytes refused (at most {MAX_HELLO})"
        )));
    }
    Ok(len)
}

/// Dialer: reads the acceptor's share.
pub(crate) fn decode_challenge(peer: usize, body: &[u8]) -> Result<[u8; SHARE]> {
    body.try_into()
        .map_err(|_| Error::Handshake(format!("rank {peer} sent a malformed challenge")))
}

/// Dialer: its answer to the challenge: proof, share, hello.
pub(crate) fn encode_dial(token: &str, shares: &Shares, hello: &Hello) -> Result<Vec<u8>> {
    let body = serde_json::to_vec(hello).map_err(|e| Error::Handshake(e.to_string()))?;
    let proof = mac(
        token,
        &[b"strata dial", &shares.acceptor, &shares.dialer, &body],
    );
    let mut frame = proof.to_vec();
    frame.extend_from_slice(&shares.dialer);
    frame.extend_from_slice(&body);
    Ok(frame)
}

/// Acceptor: checks a dialer's proof of the token, then parses its hello; returns the hello
/// and the dialer's share. Nothing of the hello is read unless the proof holds.
pub(crate) fn decode_dial(
    token: &str,
    acceptor: &[u8; SHARE],
    frame: &[u8],
) -> Result<(Hello, [u8; SHARE])> {
    if frame.len() < MAC + SHARE {
        return Err(Error::Handshake(format!(
            "a hello of {} bytes is too short",
            frame.len()
        )));
    }
    let (proof, rest) = frame.split_at(MAC);
    let (share, body) = rest.split_at(SHARE);
    let expected = mac(token, &[b"strata dial", acceptor, share, body]);
    if !same_secret(proof, &expected) {
        return Err(Error::Handshake("wrong session token".into()));
    }
    let hello: Hello = serde_json::from_slice(body)
        .map_err(|e| Error::Handshake(format!("malformed hello: {e}")))?;
    let mut dialer = [0u8; SHARE];
    dialer.copy_from_slice(share);
    Ok((hello, dialer))
}

/// Acceptor: a verdict with the MAC that proves this side knows the token (zeros for a dialer
/// that could not prove it either).
pub(crate) fn encode_verdict(
    token: &str,
    shares: Option<&Shares>,
    verdict: &Verdict,
) -> Result<Vec<u8>> {
    let body = serde_json::to_vec(verdict).map_err(|e| Error::Handshake(e.to_string()))?;
    let proof = match shares {
        Some(s) => mac(token, &[b"strata accept", &s.dialer, &s.acceptor, &body]),
        None => [0; MAC],
    };
    let mut frame = proof.to_vec();
    frame.extend_from_slice(&body);
    Ok(frame)
}

/// Dialer: reads the acceptor's verdict; a welcome counts only with the acceptor's proof.
pub(crate) fn decode_verdict(
    peer: usize,
    token: &str,
    shares: &Shares,
    frame: &[u8],
) -> Result<()> {
    if frame.len() < MAC {
        return Err(Error::Handshake(format!(
            "rank {peer} sent a malformed verdict"
        )));
    }
    let (proof, body) = frame.split_at(MAC);
    let authentic = same_secret(
        proof,
        &mac(
            token,
            &[b"strata accept", &shares.dialer, &shares.acceptor, body],
        ),
    );
    let verdict: Verdict = serde_json::from_slice(body)
        .map_err(|e| Error::Handshake(format!("malformed verdict from rank {peer}: {e}")))?;
    match (verdict, authentic) {
        (Verdict::Welcome, true) => Ok(()),
        (Verdict::Welcome, false) => Err(Error::Handshake(format!(
            "rank {peer} could not prove it knows the session token"
        ))),
        (Verdict::Refused(why), _) => Err(Error::Handshake(format!("rank {peer} refused: {why}"))),
    }
}

/// Checks what a hello says against this mesh (not yet whether its rank is free).
pub(crate) fn check_hello(h: &Hello, world: usize) -> std::result::Result<(), String> {
    if h.version != PROTOCOL_VERSION {
        return Err(format!(
            "protocol version {} does not match {PROTOCOL_VERSION}",
            h.version
        ));
    }
    if h.world != world {
        return Err(format!("world size {} does not match {world}", h.world));
    }
    if h.rank == 0 || h.rank >= world {
        return Err(format!("rank {} is outside 1..{world}", h.rank));
    }
    Ok(())
}

/// The X25519 secret of this side's ephemeral key and the peer's share.
pub(crate) fn agree(secret: EphemeralPrivateKey, peer_share: &[u8; SHARE]) -> Result<[u8; KEY]> {
    agree_ephemeral(secret, &UnparsedPublicKey::new(&X25519, peer_share), |k| {
        let mut out = [0u8; KEY];
        out.copy_from_slice(k);
        out
    })
    .map_err(|_| Error::Handshake("the peer's key share is invalid".into()))
}

struct Len(usize);

impl ring::hkdf::KeyType for Len {
    fn len(&self) -> usize {
        self.0
    }
}

/// The session keys of one connection: HKDF-SHA256 with both shares as salt, the X25519
/// secret and the token as input, one expansion per direction.
pub(crate) fn derive_keys(
    token: &str,
    shared: &[u8; KEY],
    shares: &Shares,
    role: Role,
) -> Result<SessionKeys> {
    let mut salt = [0u8; 2 * SHARE];
    salt[..SHARE].copy_from_slice(&shares.acceptor);
    salt[SHARE..].copy_from_slice(&shares.dialer);
    let mut ikm = Vec::with_capacity(KEY + token.len());
    ikm.extend_from_slice(shared);
    ikm.extend_from_slice(token.as_bytes());
    let prk = ring::hkdf::Salt::new(ring::hkdf::HKDF_SHA256, &salt).extract(&ikm);
    let expand = |label: &[u8]| -> Result<[u8; KEY]> {
        let mut key = [0u8; KEY];
        prk.expand(&[b"strata v3 ", label], Len(KEY))
            .and_then(|okm| okm.fill(&mut key))
            .map_err(|_| Error::Handshake("deriving the session keys failed".into()))?;
        Ok(key)
    };
    let to_acceptor = expand(b"dialer to acceptor")?;
    let to_dialer = expand(b"acceptor to dialer")?;
    Ok(match role {
        Role::Acceptor => SessionKeys::from_raw(&to_dialer, &to_acceptor),
        Role::Dialer => SessionKeys::from_raw(&to_acceptor, &to_dialer),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello() -> Hello {
        Hello {
            version: PROTOCOL_VERSION,
            rank: 1,
            world: 2,
            addr: None,
            host: "h".into(),
            control: false,
        }
    }

    /// Runs both sides of a handshake in memory; returns their keys.
    fn handshake(dialer_token: &str) -> Result<(SessionKeys, SessionKeys)> {
        let (a_secret, acceptor) = new_share()?;
        let (d_secret, dialer) = new_share()?;
        let shares = Shares { acceptor, dialer };
        let frame = encode_dial(dialer_token, &shares, &hello())?;
        let (h, got) = decode_dial("token", &acceptor, &frame)?;
        assert_eq!((h.rank, got), (1, dialer));
        let verdict = encode_verdict("token", Some(&shares), &Verdict::Welcome)?;
        decode_verdict(0, dialer_token, &shares, &verdict)?;
        let a = derive_keys("token", &agree(a_secret, &dialer)?, &shares, Role::Acceptor)?;
        let d = derive_keys(
            dialer_token,
            &agree(d_secret, &acceptor)?,
            &shares,
            Role::Dialer,
        )?;
        Ok((a, d))
    }

    #[test]
    fn both_ends_derive_matching_keys_for_each_direction() {
        let (mut a, mut d) = handshake("token").expect("handshake");
        let mut wire = Vec::new();
        a.seal_message(1, b"to the dialer", &mut wire)
            .expect("seal");
        assert_eq!(d.open_message(0, &wire).expect("open").0, b"to the dialer");
        // The directions differ: the acceptor cannot open its own records.
        let (mut a2, mut d2) = handshake("token").expect("handshake");
        let mut wire = Vec::new();
        d2.seal_message(0, b"x", &mut wire).expect("seal");
        assert!(a2.open_message(1, &wire).is_ok());
        let mut wire = Vec::new();
        a2.seal_message(1, b"x", &mut wire).expect("seal");
        assert!(a2.open_message(1, &wire).is_err());
    }

    #[test]
    fn a_wrong_token_fails_before_the_hello_is_read() {
        match handshake("guess") {
            Err(Error::Handshake(why)) => assert!(why.contains("token"), "{why}"),
            other => panic!("{:?}", other.map(|_| ())),
        }
    }

    #[test]
    fn a_recorded_dial_is_useless_against_a_new_challenge() {
        let (_, acceptor) = new_share().expect("share");
        let (_, dialer) = new_share().expect("share");
        let frame = encode_dial("token", &Shares { acceptor, dialer }, &hello()).expect("dial");
        let (_, fresh) = new_share().expect("share");
        assert!(decode_dial("token", &fresh, &frame).is_err());
    }

    #[test]
    fn an_unproven_welcome_is_not_trusted() {
        let (_, acceptor) = new_share().expect("share");
        let (_, dialer) = new_share().expect("share");
        let shares = Shares { acceptor, dialer };
        let forged = encode_verdict("token", None, &Verdict::Welcome).expect("verdict");
        assert!(decode_verdict(0, "token", &shares, &forged).is_err());
    }

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret(b"abc", b"abc"));
        assert!(!same_secret(b"abc", b"abd"));
        assert!(!same_secret(b"abc", b"ab"));
    }
}
