//! The fuzzing entry point of the data plane's decoders: everything a peer (or a stranger, or
//! a man in the middle) can put on the wire before and after the handshake reaches one of the
//! pure functions driven here. The libFuzzer target `data_plane_frames` (`fuzz/` at the
//! repository root, nightly) and a bounded, seeded test of this module (stable, CI) both call
//! [`data_plane_frames`].
//!
//! Besides "never panics", it checks that each decoder fails with the error its layer owns
//! (handshake errors before the keys exist, authentication or size errors after), and that
//! authentic input round-trips.

use crate::Error;
use crate::handshake::{
    self, FRAME_HEAD, MAC, MAX_HELLO, SHARE, Shares, Verdict, check_hello, decode_challenge,
    decode_dial, decode_verdict, mac,
};
use crate::seal::{FrameHeader, HEADER, MAX_MESSAGE, SEALED_HEADER, SessionKeys};

const TOKEN: &str = "fuzz-token";
const ACCEPTOR: [u8; SHARE] = [0xa5; SHARE];
const DIALER: [u8; SHARE] = [0x5a; SHARE];
const TX: [u8; 32] = [7; 32];
const RX: [u8; 32] = [9; 32];

fn shares() -> Shares {
    Shares {
        acceptor: ACCEPTOR,
        dialer: DIALER,
    }
}

fn handshake_error<T: std::fmt::Debug>(what: &str, r: &crate::Result<T>) {
    if let Err(e) = r {
        assert!(
            matches!(e, Error::Handshake(_)),
            "{what}: a handshake decoder failed with {e:?}"
        );
    }
}

fn link_error(what: &str, e: &Error) {
    assert!(
        matches!(
            e,
            Error::Auth { .. } | Error::Oversized { .. } | Error::Protocol { .. }
        ),
        "{what}: a frame decoder failed with {e:?}"
    );
}

/// Feeds `data` to one of the decoders, chosen by its first byte; panics only if a decoder
/// panics or breaks one of the properties above.
pub fn data_plane_frames(data: &[u8]) {
    let Some((&mode, rest)) = data.split_first() else {
        return;
    };
    match mode % 8 {
        // The plain head of a handshake frame: magic and a bounded length.
        0 => {
            if let Some(head) = rest.get(..FRAME_HEAD).and_then(|h| h.try_into().ok()) {
                let r = handshake::parse_frame_head(head);
                handshake_error("frame head", &r);
                if let Ok(len) = r {
                    assert!(len <= MAX_HELLO);
                }
            }
        }
        // A challenge, as the dialer reads it.
        1 => {
            let r = decode_challenge(1, rest);
            handshake_error("challenge", &r);
            assert_eq!(r.is_ok(), rest.len() == SHARE);
        }
        // A dialer's frame as a stranger sends it: the proof cannot hold.
        2 => {
            let r = decode_dial(TOKEN, &ACCEPTOR, rest);
            handshake_error("dial", &r);
            if r.is_ok() {
                let proof = mac(
                    TOKEN,
                    &[
                        b"strata dial",
                        &ACCEPTOR,
                        &rest[MAC..MAC + SHARE],
                        &rest[MAC + SHARE..],
                    ],
                );
                assert_eq!(&rest[..MAC], &proof, "a hello was read without its proof");
            }
        }
        // A proven hello whose body is anything: the JSON and the mesh checks behind the proof.
        3 => {
            let proof = mac(TOKEN, &[b"strata dial", &ACCEPTOR, &DIALER, rest]);
            let mut frame = proof.to_vec();
            frame.extend_from_slice(&DIALER);
            frame.extend_from_slice(rest);
            let r = decode_dial(TOKEN, &ACCEPTOR, &frame);
            handshake_error("proven dial", &r);
            if let Ok((hello, share)) = r {
                assert_eq!(share, DIALER);
                let _ = check_hello(&hello, 4);
            }
        }
        // A verdict as a stranger sends it: never a welcome.
        4 => {
            let r = decode_verdict(0, TOKEN, &shares(), rest);
            handshake_error("verdict", &r);
            if r.is_ok() {
                let proof = mac(TOKEN, &[b"strata accept", &DIALER, &ACCEPTOR, &rest[MAC..]]);
                assert_eq!(&rest[..MAC], &proof, "an unproven welcome was trusted");
            }
        }
        // A proven verdict whose body is anything.
        5 => {
            let proof = mac(TOKEN, &[b"strata accept", &DIALER, &ACCEPTOR, rest]);
            let mut frame = proof.to_vec();
            frame.extend_from_slice(rest);
            let r = decode_verdict(0, TOKEN, &shares(), &frame);
            handshake_error("proven verdict", &r);
            if r.is_ok() {
                assert!(matches!(
                    serde_json::from_slice::<Verdict>(rest),
                    Ok(Verdict::Welcome)
                ));
            }
        }
        // Sealed messages as a man in the middle sends them: nothing opens.
        6 => {
            let mut keys = SessionKeys::peer_of_raw(&TX, &RX);
            let mut at = 0;
            while at < rest.len() {
                match keys.open_message(1, &rest[at..]) {
                    Ok((_, used)) => at += used,
                    Err(e) => {
                        link_error("sealed stream", &e);
                        break;
                    }
                }
            }
        }
        // Authentic frames with any header a peer holding the keys could send: lengths are
        // held to the cap, payloads round-trip, and a flipped byte never opens.
        _ => {
            let Some((head, payload)) = rest.split_at_checked(HEADER) else {
                return;
            };
            let mut sender = SessionKeys::from_raw(&TX, &RX);
            let mut receiver = SessionKeys::peer_of_raw(&TX, &RX);
            let mut other = SessionKeys::peer_of_raw(&TX, &RX);
            let mut sealed = [0u8; SEALED_HEADER];
            sealed[..HEADER].copy_from_slice(head);
            let Ok(tag) = sender.tx.seal(0, &mut sealed[..HEADER]) else {
                panic!("sealing a header failed");
            };
            sealed[HEADER..].copy_from_slice(&tag);
            let mut announced = [0u8; 8];
            announced.copy_from_slice(&head[..8]);
            let announced = u64::from_le_bytes(announced);
            match receiver.rx.open_header(0, &sealed) {
                Ok(h) => assert!(h.len <= MAX_MESSAGE && h.len as u64 == announced),
                Err(Error::Oversized { len, .. }) => {
                    assert!(announced > MAX_MESSAGE as u64 && len == announced);
                    return;
                }
                Err(e) => panic!("an authentic header failed to open: {e:?}"),
            }
            assert!(other.rx.open_header(0, &sealed).is_ok());
            let mut body = payload.to_vec();
            let Ok(tag) = sender.tx.seal(0, &mut body) else {
                panic!("sealing a payload failed");
            };
            body.extend_from_slice(&tag);
            let mut tampered = body.clone();
            let flip = payload.first().map_or(0, |&b| b as usize) % tampered.len();
            tampered[flip] ^= 1 << (payload.len() % 8);
            match receiver.rx.open(0, &mut body) {
                Ok(p) => assert_eq!(p, payload),
                Err(e) => panic!("an authentic payload failed to open: {e:?}"),
            }
            match other.rx.open(0, &mut tampered) {
                Err(e) => link_error("tampered payload", &e),
                Ok(_) => panic!("a tampered payload opened"),
            }
        }
    }
}

/// Valid inputs of every mode, for mutation: what a well-behaved peer sends.
pub fn seeds() -> Vec<Vec<u8>> {
    let with_mode = |mode: u8, body: &[u8]| {
        let mut v = vec![mode];
        v.extend_from_slice(body);
        v
    };
    let mut head = handshake::MAGIC.to_vec();
    head.extend_from_slice(&64u32.to_le_bytes());
    let hello =
        br#"{"version":3,"rank":1,"world":4,"addr":"127.0.0.1:9","host":"h","control":false}"#;
    let welcome = serde_json::to_vec(&Verdict::Welcome).unwrap_or_default();
    let mut verdict = mac(TOKEN, &[b"strata accept", &DIALER, &ACCEPTOR, &welcome]).to_vec();
    verdict.extend_from_slice(&welcome);
    let mut dial = mac(TOKEN, &[b"strata dial", &ACCEPTOR, &DIALER, hello]).to_vec();
    dial.extend_from_slice(&DIALER);
    dial.extend_from_slice(hello);
    let mut stream = Vec::new();
    let mut keys = SessionKeys::from_raw(&TX, &RX);
    for msg in [&b"first message"[..], &[0u8; 2304][..], b""] {
        let _ = keys.seal_message(1, msg, &mut stream);
    }
    let mut frame = FrameHeader {
        len: 5,
        deliver_at: 0,
    }
    .encode()
    .to_vec();
    frame.extend_from_slice(b"hello");
    vec![
        with_mode(0, &head),
        with_mode(1, &ACCEPTOR),
        with_mode(2, &dial),
        with_mode(3, hello),
        with_mode(4, &verdict),
        with_mode(5, &welcome),
        with_mode(6, &stream),
        with_mode(7, &frame),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// A bounded mutation fuzzer on stable Rust: random inputs and mutations of valid ones
    /// (flipped bits, cut or grown tails, spliced bytes, a changed mode), from a fixed seed so a
    /// failure reproduces. Runs for about two seconds.
    #[test]
    fn the_decoders_survive_random_and_mutated_input() {
        let mut rng = rand::rngs::StdRng::seed_from_u64(0x5eed_da7a);
        let seeds = seeds();
        for s in &seeds {
            data_plane_frames(s);
        }
        let start = std::time::Instant::now();
        let mut runs = 0u64;
        while start.elapsed() < std::time::Duration::from_secs(2) || runs < 20_000 {
            let mut input = if rng.random_bool(0.2) {
                let len = rng.random_range(0..300);
                (0..len).map(|_| rng.random()).collect()
            } else {
                seeds[rng.random_range(0..seeds.len())].clone()
            };
            for _ in 0..rng.random_range(1..4) {
                match rng.random_range(0..5) {
                    0 if !input.is_empty() => {
                        let i = rng.random_range(0..input.len());
                        input[i] ^= 1 << rng.random_range(0..8);
                    }
                    1 if !input.is_empty() => {
                        input.truncate(rng.random_range(0..input.len()));
                    }
                    2 => {
                        let n = rng.random_range(0..40);
                        input.extend((0..n).map(|_| rng.random::<u8>()));
                    }
                    3 if !input.is_empty() => {
                        let i = rng.random_range(0..input.len());
                        input[i] = rng.random();
                    }
                    _ => {
                        if let Some(m) = input.first_mut() {
                            *m = rng.random();
                        }
                    }
                }
            }
            data_plane_frames(&input);
            runs += 1;
        }
        assert!(runs >= 20_000, "{runs} runs");
    }

    #[test]
    fn the_seeds_are_accepted_where_they_should_be() {
        // The valid seeds reach past every check: a mutation-fuzzer starting there explores the
        // decoders' inner paths, not only their first refusal.
        let s = seeds();
        let mut keys = SessionKeys::peer_of_raw(&TX, &RX);
        let (first, _) = keys
            .open_message(1, &s[6][1..])
            .expect("sealed stream seed");
        assert_eq!(first, b"first message");
        assert!(decode_dial(TOKEN, &ACCEPTOR, &s[2][1..]).is_ok());
        assert!(decode_verdict(0, TOKEN, &shares(), &s[4][1..]).is_ok());
    }
}
