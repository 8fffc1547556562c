//! The data plane under attack (issue 17 items 7 and 10): a relay between two ranks that reads,
//! alters, replays, drops or injects frames, and strangers that hold rank 0's port open or
//! send it garbage while a mesh forms. Every attack must be refused with a clear error, never
//! delivered, and never stop honest ranks from meeting.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex, mpsc};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use strata_net::{
    Communicator, Error, LinkShape, MAX_MESSAGE, MeshConfig, Transport, coordinate, join,
};

fn config(rank: usize, world: usize, at: SocketAddr, plain: bool) -> MeshConfig {
    MeshConfig {
        rank,
        world,
        coordinator: at,
        listen: None,
        token: "attack-test-token".into(),
        transport: Transport::Tcp,
        shape: LinkShape::default(),
        join_timeout: Duration::from_secs(20),
        stall_timeout: Duration::from_secs(20),
        insecure_plaintext: plain,
    }
}

/// What the relay does to the next frame rank 0 sends rank 1 (frames are `frame` bytes).
#[derive(Clone, Copy, Debug)]
enum Tamper {
    Pass,
    Flip { frame: usize, at: usize },
    Replay { frame: usize },
    Drop { frame: usize },
}

/// A man in the middle: a TCP relay in front of rank 0 that records every byte of every
/// connection, and on the first one (rank 1's bootstrap connection, which becomes its data
/// link) applies [`Tamper`] to what rank 0 sends.
struct Relay {
    addr: SocketAddr,
    seen: Arc<Mutex<Vec<u8>>>,
    tamper: Arc<Mutex<Tamper>>,
    /// Rank 1's end of its data connection, to inject bytes as if rank 0 sent them.
    to_rank1: Arc<Mutex<Option<TcpStream>>>,
}

impl Relay {
    fn start(to: SocketAddr) -> Relay {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind relay");
        let relay = Relay {
            addr: listener.local_addr().expect("addr"),
            seen: Arc::default(),
            tamper: Arc::new(Mutex::new(Tamper::Pass)),
            to_rank1: Arc::default(),
        };
        let (seen, tamper, to_rank1) = (
            Arc::clone(&relay.seen),
            Arc::clone(&relay.tamper),
            Arc::clone(&relay.to_rank1),
        );
        std::thread::spawn(move || {
            for (i, down) in listener.incoming().enumerate() {
                let Ok(down) = down else { return };
                let up = TcpStream::connect(to).expect("relay to rank 0");
                let _ = (up.set_nodelay(true), down.set_nodelay(true));
                if i == 0 {
                    *to_rank1.lock().expect("lock") = down.try_clone().ok();
                }
                let first = (i == 0).then(|| Arc::clone(&tamper));
                let (d2, u2) = (
                    down.try_clone().expect("clone"),
                    up.try_clone().expect("clone"),
                );
                let s = Arc::clone(&seen);
                std::thread::spawn(move || pipe(down, up, s, None));
                let s = Arc::clone(&seen);
                std::thread::spawn(move || pipe(u2, d2, s, first));
            }
        });
        relay
    }

    fn arm(&self, t: Tamper) {
        *self.tamper.lock().expect("lock") = t;
    }

    fn inject(&self, bytes: &[u8]) {
        let mut guard = self.to_rank1.lock().expect("lock");
        let s = guard.as_mut().expect("rank 1 connected");
        s.write_all(bytes).expect("inject");
    }

    fn seen(&self) -> Vec<u8> {
        self.seen.lock().expect("lock").clone()
    }
}

fn pipe(
    mut from: TcpStream,
    mut to: TcpStream,
    seen: Arc<Mutex<Vec<u8>>>,
    tamper: Option<Arc<Mutex<Tamper>>>,
) {
    let mut buf = vec![0u8; 1 << 16];
    let mut queue: Vec<u8> = Vec::new();
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => {
                let _ = to.shutdown(Shutdown::Both);
                return;
            }
            Ok(n) => n,
        };
        seen.lock().expect("lock").extend_from_slice(&buf[..n]);
        queue.extend_from_slice(&buf[..n]);
        let mode = tamper
            .as_ref()
            .map_or(Tamper::Pass, |t| *t.lock().expect("lock"));
        let (frame, out): (usize, Vec<u8>) = match mode {
            Tamper::Pass => (0, Vec::new()),
            Tamper::Flip { frame, at } if queue.len() >= frame => {
                let mut f = queue[..frame].to_vec();
                f[at] ^= 0x01;
                (frame, f)
            }
            Tamper::Replay { frame } if queue.len() >= frame => {
                (frame, [&queue[..frame], &queue[..frame]].concat())
            }
            Tamper::Drop { frame } if queue.len() >= frame => (frame, Vec::new()),
            // A frame not yet whole: wait for the rest.
            _ => continue,
        };
        if let Some(t) = &tamper
            && frame > 0
        {
            *t.lock().expect("lock") = Tamper::Pass;
        }
        let rest = queue.split_off(frame);
        if to
            .write_all(&out)
            .and_then(|()| to.write_all(&rest))
            .is_err()
        {
            return;
        }
        queue.clear();
    }
}

/// Two ranks over TCP with the relay in front of rank 0. Rank 1 runs `worker` once the mesh
/// is up; rank 0's communicator is returned once both ends have finished the bootstrap.
fn through_relay<T: Send + 'static>(
    plain: bool,
    worker: impl FnOnce(&mut Communicator) -> T + Send + 'static,
) -> (Relay, Communicator, JoinHandle<T>) {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let relay = Relay::start(listener.local_addr().expect("addr"));
    let at = relay.addr;
    let (ready, is_ready) = mpsc::channel();
    let handle = std::thread::spawn(move || {
        let mut c = join(&config(1, 2, at, plain)).expect("join");
        ready.send(()).expect("ready");
        worker(&mut c)
    });
    // Rank 0 tells rank 1 to reach it at the relay, so the heartbeat connection goes through
    // it as well.
    let c0 = coordinate(&config(0, 2, at, plain), listener).expect("coordinate");
    is_ready.recv().expect("rank 1 joined");
    (relay, c0, handle)
}

/// Bytes of one sealed message of `len` payload bytes on the wire.
fn sealed_frame(len: usize) -> usize {
    32 + len + 16
}

#[test]
fn a_tampered_frame_fails_the_link_instead_of_delivering_data() {
    let msg = b"token 42 goes next".to_vec();
    let (relay, mut c0, rank1) = through_relay(false, |c| c.recv(0).map(<[u8]>::to_vec));
    // One bit of the payload's ciphertext, past the sealed header.
    relay.arm(Tamper::Flip {
        frame: sealed_frame(msg.len()),
        at: 32 + 3,
    });
    c0.send(1, &msg).expect("send");
    match rank1.join().expect("rank 1") {
        Err(Error::Auth { peer: 0, .. }) => {}
        other => panic!("a tampered frame gave {other:?}"),
    }
    // The header is protected as well.
    let (relay, mut c0, rank1) = through_relay(false, |c| c.recv(0).map(<[u8]>::to_vec));
    relay.arm(Tamper::Flip {
        frame: sealed_frame(msg.len()),
        at: 2,
    });
    c0.send(1, &msg).expect("send");
    let err = rank1.join().expect("rank 1").expect_err("tampered header");
    assert!(matches!(err, Error::Auth { peer: 0, .. }), "{err:?}");
    assert!(err.to_string().contains("failed authentication"), "{err}");
}

#[test]
fn a_replayed_frame_is_refused() {
    let msg = b"sample token 7".to_vec();
    let (relay, mut c0, rank1) = through_relay(false, |c| {
        let first = c.recv(0).map(<[u8]>::to_vec);
        (first, c.recv(0).map(<[u8]>::to_vec))
    });
    relay.arm(Tamper::Replay {
        frame: sealed_frame(msg.len()),
    });
    c0.send(1, &msg).expect("send");
    let (first, second) = rank1.join().expect("rank 1");
    assert_eq!(first.expect("the original arrives"), msg);
    assert!(
        matches!(second, Err(Error::Auth { peer: 0, .. })),
        "the replay gave {second:?}"
    );
}

#[test]
fn a_dropped_frame_is_noticed_at_the_next_one() {
    let (relay, mut c0, rank1) = through_relay(false, |c| c.recv(0).map(<[u8]>::to_vec));
    relay.arm(Tamper::Drop {
        frame: sealed_frame(5),
    });
    c0.send(1, b"first").expect("send");
    c0.send(1, b"second").expect("send");
    let got = rank1.join().expect("rank 1");
    assert!(
        matches!(got, Err(Error::Auth { peer: 0, .. })),
        "after a dropped frame: {got:?}"
    );
}

#[test]
fn an_injected_huge_length_is_refused_without_allocating_it() {
    // 2^62 bytes: allocating it would abort this test process.
    let mut header = [0u8; 32];
    header[..8].copy_from_slice(&(1u64 << 62).to_le_bytes());
    // In the clear (an `insecure_plaintext` mesh) the length is read, and refused by size.
    let (relay, _c0, rank1) = through_relay(true, |c| c.recv(0).map(<[u8]>::to_vec));
    relay.inject(&header[..16]);
    match rank1.join().expect("rank 1") {
        Err(Error::Oversized { peer: 0, len, max }) => {
            assert_eq!((len, max), (1 << 62, MAX_MESSAGE));
        }
        other => panic!("a huge length gave {other:?}"),
    }
    // Sealed, a forged header does not even open.
    let (relay, _c0, rank1) = through_relay(false, |c| c.recv(0).map(<[u8]>::to_vec));
    relay.inject(&header);
    let got = rank1.join().expect("rank 1");
    assert!(matches!(got, Err(Error::Auth { peer: 0, .. })), "{got:?}");
}

#[test]
fn a_captured_connection_does_not_contain_the_plaintext() {
    let pattern: Vec<u8> = b"<<hidden state of a private prompt>>".repeat(64);
    let run = |plain: bool| {
        let p = pattern.clone();
        let (relay, mut c0, rank1) = through_relay(plain, move |c| {
            let got = c.recv(0).map(<[u8]>::to_vec);
            c.send(0, &p).expect("send back");
            got
        });
        assert_eq!(c0.sealed(), !plain);
        c0.send(1, &pattern).expect("send");
        assert_eq!(c0.recv(1).expect("echo"), &pattern[..]);
        assert_eq!(rank1.join().expect("rank 1").expect("recv"), pattern);
        relay.seen()
    };
    let needle = &pattern[..36];
    let sealed = run(false);
    assert!(
        sealed.len() > 2 * pattern.len(),
        "the relay saw the traffic"
    );
    assert!(
        !sealed.windows(needle.len()).any(|w| w == needle),
        "the plaintext crossed the wire"
    );
    // The same capture of a plaintext mesh shows it: the check above can fail.
    let plain = run(true);
    assert!(plain.windows(needle.len()).any(|w| w == needle));
}

#[test]
fn shared_memory_frames_are_sealed_too() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let at = listener.local_addr().expect("addr");
    let shm = move |rank| MeshConfig {
        transport: Transport::Shm,
        ..config(rank, 2, at, false)
    };
    let worker = std::thread::spawn(move || {
        let mut c = join(&shm(1)).expect("join");
        let sealed = c.sealed();
        c.send(0, b"over the ring").expect("send");
        sealed
    });
    let mut c0 = coordinate(&shm(0), listener).expect("coordinate");
    assert_eq!(c0.recv(1).expect("recv"), b"over the ring");
    assert!(c0.sealed() && worker.join().expect("rank 1"));
    assert_eq!(c0.transport(), "shm");
}

/// Starts a mesh of `world` TCP ranks on `listener` (rank 0 here, the others on threads) and
/// returns how long it took to form, after checking that every rank can reach rank 0.
fn form_mesh(world: usize, listener: TcpListener) -> Duration {
    let at = listener.local_addr().expect("addr");
    let start = Instant::now();
    let workers: Vec<_> = (1..world)
        .map(|r| {
            std::thread::spawn(move || {
                let mut c = join(&config(r, world, at, false)).expect("join");
                c.send(0, &[r as u8]).expect("send");
            })
        })
        .collect();
    let mut c0 = coordinate(&config(0, world, at, false), listener).expect("coordinate");
    let took = start.elapsed();
    for r in 1..world {
        assert_eq!(c0.recv(r).expect("recv"), &[r as u8]);
    }
    for w in workers {
        w.join().expect("worker");
    }
    took
}

/// Reads `s` until the other side closes it; returns what came and how long that took.
fn until_closed(s: &mut TcpStream) -> (Vec<u8>, Duration) {
    let start = Instant::now();
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("timeout");
    let mut got = Vec::new();
    let mut buf = [0u8; 4096];
    loop {
        match s.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => got.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => break,
            Err(e) => panic!("still open after {:?}: {e}", start.elapsed()),
        }
    }
    (got, start.elapsed())
}

#[test]
fn silent_and_garbage_connections_do_not_stop_a_mesh_from_forming() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let at = listener.local_addr().expect("addr");
    // Before any rank shows up: six silent connections, one speaking HTTP, one with a
    // well-formed frame but a wrong proof of the token, and one dripping a byte at a time.
    let silent: Vec<TcpStream> = (0..6)
        .map(|_| TcpStream::connect(at).expect("connect"))
        .collect();
    let mut garbage = TcpStream::connect(at).expect("connect");
    garbage
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("write");
    let mut forged = TcpStream::connect(at).expect("connect");
    let mut frame = b"STRATA\x00\x03".to_vec();
    frame.extend_from_slice(&(96u32).to_le_bytes());
    frame.extend_from_slice(&[0x42; 96]);
    forged.write_all(&frame).expect("write");
    let mut drip = TcpStream::connect(at).expect("connect");
    let dripping = std::thread::spawn(move || {
        for _ in 0..8 {
            if drip.write_all(b"S").is_err() {
                return;
            }
            std::thread::sleep(Duration::from_millis(900));
        }
    });

    let took = form_mesh(3, listener);
    // The handshake deadline is 5 s each; sequential handshakes would have taken 30 s or more.
    assert!(took < Duration::from_secs(3), "the mesh took {took:?}");

    // The strangers were turned away: the forged hello got a refusal naming the token, the
    // garbage and the silent ones a closed connection (the silent ones at their deadline).
    let (answer, _) = until_closed(&mut forged);
    assert!(
        String::from_utf8_lossy(&answer).contains("wrong session token"),
        "{answer:?}"
    );
    let (_, when) = until_closed(&mut garbage);
    assert!(when < Duration::from_secs(2), "garbage kept for {when:?}");
    let mut quiet = silent.into_iter().next().expect("a silent connection");
    let (got, when) = until_closed(&mut quiet);
    assert_eq!(got.len(), 12 + 32, "a challenge, then closed");
    assert!(
        when < Duration::from_secs(8),
        "a silent one kept for {when:?}"
    );
    dripping.join().expect("drip");
}

#[test]
fn a_flood_of_silent_connections_delays_the_mesh_only_until_their_handshakes_expire() {
    // More than the 64 handshakes a listener runs at once: the extra connections are closed at
    // once, a worker turned away retries, and the mesh forms once the silent ones time out.
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let at = listener.local_addr().expect("addr");
    let flood: Vec<TcpStream> = (0..80)
        .map(|_| TcpStream::connect(at).expect("connect"))
        .collect();
    let took = form_mesh(2, listener);
    assert!(took < Duration::from_secs(12), "the mesh took {took:?}");
    drop(flood);
}
