//! Real meshes of ranks (threads of this test process, each with its own communicator) over
//! both transports: collectives against a sequential reference, the link emulator's delays,
//! refusals at the handshake, and a peer that goes away.

use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use strata_net::{Communicator, Error, LinkShape, MeshConfig, Transport, coordinate, join};

fn config(rank: usize, world: usize, at: SocketAddr, t: Transport, shape: LinkShape) -> MeshConfig {
    MeshConfig {
        rank,
        world,
        coordinator: at,
        listen: None,
        token: "test-token".into(),
        transport: t,
        shape,
        join_timeout: Duration::from_secs(20),
        stall_timeout: Duration::from_secs(20),
        insecure_plaintext: false,
    }
}

/// Runs `f` on every rank of a fresh mesh and returns each rank's result, in rank order.
fn mesh<T: Send + 'static>(
    world: usize,
    t: Transport,
    shape: LinkShape,
    f: impl Fn(&mut Communicator) -> T + Send + Sync + Clone + 'static,
) -> Vec<T> {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let at = listener.local_addr().expect("addr");
    let mut handles = Vec::new();
    for r in 1..world {
        let f = f.clone();
        handles.push(std::thread::spawn(move || {
            let mut c = join(&config(r, world, at, t, shape)).expect("join");
            f(&mut c)
        }));
    }
    let mut c0 = coordinate(&config(0, world, at, t, shape), listener).expect("coordinate");
    let mut out = vec![f(&mut c0)];
    for h in handles {
        out.push(h.join().expect("rank thread"));
    }
    out
}

fn contribution(rank: usize, len: usize) -> Vec<f32> {
    (0..len)
        .map(|i| ((i * 31 + rank * 7) % 97) as f32 * 0.013 - 0.5 + rank as f32)
        .collect()
}

#[test]
fn all_reduce_is_identical_on_every_rank_for_both_algorithms() {
    for t in [Transport::Tcp, Transport::Shm] {
        // 3 ranks: 100 floats go direct, 100k floats (400 kB) go by ring.
        for len in [100usize, 100_000] {
            let results = mesh(3, t, LinkShape::default(), move |c| {
                let mut x = contribution(c.rank(), len);
                c.all_reduce_sum(&[0, 1, 2], &mut x).expect("all-reduce");
                x
            });
            assert_eq!(results[0], results[1], "{t:?} {len}");
            assert_eq!(results[0], results[2], "{t:?} {len}");
            let parts: Vec<Vec<f32>> = (0..3).map(|r| contribution(r, len)).collect();
            for (i, v) in results[0].iter().enumerate() {
                let want: f32 = parts.iter().map(|p| p[i]).sum();
                assert!((v - want).abs() < 1e-4, "{t:?} {len} [{i}]: {v} vs {want}");
            }
        }
    }
}

#[test]
fn direct_all_reduce_sums_in_group_order() {
    let results = mesh(3, Transport::Shm, LinkShape::default(), |c| {
        let mut x = contribution(c.rank(), 64);
        c.all_reduce_sum(&[0, 1, 2], &mut x).expect("all-reduce");
        x
    });
    let want: Vec<f32> = (0..64)
        .map(|i| contribution(0, 64)[i] + contribution(1, 64)[i] + contribution(2, 64)[i])
        .collect();
    assert_eq!(results[1], want);
}

#[test]
fn all_gather_places_uneven_column_blocks() {
    for t in [Transport::Tcp, Transport::Shm] {
        let results = mesh(3, t, LinkShape::default(), |c| {
            let parts = [0..5, 5..6, 6..13];
            let rows = 4;
            let mine = &parts[c.rank()];
            let src: Vec<f32> = (0..rows)
                .flat_map(|r| mine.clone().map(move |col| (r * 100 + col) as f32))
                .collect();
            let mut dst = vec![0.0; rows * 13];
            c.all_gather_cols(&[0, 1, 2], &src, &mut dst, rows, &parts)
                .expect("all-gather");
            dst
        });
        let want: Vec<f32> = (0..4)
            .flat_map(|r| (0..13).map(move |col| (r * 100 + col) as f32))
            .collect();
        for r in &results {
            assert_eq!(r, &want, "{t:?}");
        }
    }
}

#[test]
fn large_exchanges_in_both_directions_do_not_deadlock() {
    // 24 MB each way at once: far beyond socket buffers and ring sizes.
    for t in [Transport::Tcp, Transport::Shm] {
        let results = mesh(2, t, LinkShape::default(), |c| {
            let mut x = contribution(c.rank(), 6 << 20);
            c.all_reduce_sum(&[0, 1], &mut x).expect("all-reduce");
            x[12345]
        });
        assert_eq!(results[0], results[1]);
    }
}

#[test]
fn broadcast_and_point_to_point() {
    let results = mesh(3, Transport::Tcp, LinkShape::default(), |c| {
        let mut data = if c.rank() == 1 {
            b"from one".to_vec()
        } else {
            Vec::new()
        };
        c.broadcast(&[0, 1, 2], 1, &mut data).expect("broadcast");
        // A ring of messages: each rank sends its rank to the next.
        let (next, prev) = ((c.rank() + 1) % 3, (c.rank() + 2) % 3);
        c.post_send(next, &[&[c.rank() as u8]]).expect("send");
        c.post_recv(prev).expect("recv");
        c.wait().expect("wait");
        (data, c.payload(prev).to_vec())
    });
    for (r, (data, got)) in results.iter().enumerate() {
        assert_eq!(data, b"from one");
        assert_eq!(got, &[((r + 2) % 3) as u8]);
    }
}

#[test]
fn emulated_latency_and_bandwidth_delay_delivery() {
    let shape = LinkShape {
        latency: Duration::from_millis(2),
        bandwidth: Some(100e6),
    };
    let results = mesh(2, Transport::Shm, shape, |c| {
        let start = Instant::now();
        // Ten ping-pongs of 4 bytes: at least 20 one-way trips of 2 ms.
        for _ in 0..10 {
            if c.rank() == 0 {
                c.send(1, b"ping").expect("send");
                c.recv(1).expect("recv");
            } else {
                c.recv(0).expect("recv");
                c.send(0, b"pong").expect("send");
            }
        }
        let pings = start.elapsed();
        // 1 MB at 100 MB/s: at least 10 ms on the wire.
        let start = Instant::now();
        if c.rank() == 0 {
            c.send(1, &vec![0u8; 1 << 20]).expect("send");
            c.recv(1).expect("ack");
        } else {
            c.recv(0).expect("recv");
            c.send(0, b"ack").expect("ack");
        }
        (pings, start.elapsed())
    });
    let (pings, bulk) = results[0];
    assert!(pings >= Duration::from_millis(40), "{pings:?}");
    assert!(bulk >= Duration::from_millis(10), "{bulk:?}");
}

#[test]
fn wrong_token_is_refused_and_the_mesh_still_forms() {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
    let at = listener.local_addr().expect("addr");
    let intruder = std::thread::spawn(move || {
        let mut cfg = config(1, 2, at, Transport::Tcp, LinkShape::default());
        cfg.token = "guess".into();
        join(&cfg)
    });
    let honest = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(200));
        let mut c = join(&config(1, 2, at, Transport::Tcp, LinkShape::default()))?;
        c.recv(0).map(<[u8]>::to_vec)
    });
    let mut c0 = coordinate(
        &config(0, 2, at, Transport::Tcp, LinkShape::default()),
        listener,
    )
    .expect("coordinate");
    c0.send(1, b"hi").expect("send");
    match intruder.join().expect("thread") {
        Err(Error::Handshake(why)) => assert!(why.contains("token"), "{why}"),
        other => panic!("intruder got {other:?}"),
    }
    assert_eq!(honest.join().expect("thread").expect("honest"), b"hi");
}

#[test]
fn a_vanished_peer_is_reported_quickly() {
    for t in [Transport::Tcp, Transport::Shm] {
        let results = mesh(2, t, LinkShape::default(), |c| {
            if c.rank() == 1 {
                // Leave without a word: the communicator and its sockets are dropped.
                return None;
            }
            let start = Instant::now();
            let err = c.recv(1).err();
            Some((err, start.elapsed()))
        });
        let (err, took) = results[0].as_ref().expect("rank 0 result");
        assert!(
            matches!(err, Some(Error::PeerClosed { peer: 1 })),
            "{t:?}: {err:?}"
        );
        assert!(*took < Duration::from_secs(2), "{t:?}: {took:?}");
    }
}
