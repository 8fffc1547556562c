//! Measures the cost of one small all-gather (288 floats each way, a decode step's typical
//! exchange) between two ranks over shared memory and over TCP loopback, median of 5 batches of
//! 20 000 exchanges, both transports sealed (the default) and in the clear, in one run; then the
//! cost of sealing and opening one hidden-state-sized message (576 f32, SmolLM2's width) alone.
//!
//! `cargo run --release -p strata-net --example exchange_latency [FLOATS]`: `FLOATS` each rank
//! sends per exchange instead of 288 (a 16-row decode step of SmolLM2 sends about 8,448 in its
//! average all-gather), to compare an exchange's cost with the link probe's one-way figures.
//! `[FLOATS] [KIB]`: each rank reads KIB KiB of other data before each exchange, and only the
//! exchanges are timed (a decode step's exchanges come between reads of the weights).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::TcpListener;
use std::time::{Duration, Instant};

use strata_net::{LinkShape, MeshConfig, Transport, coordinate, join};

fn config(rank: usize, at: std::net::SocketAddr, t: Transport, plain: bool) -> MeshConfig {
    MeshConfig {
        rank,
        world: 2,
        coordinator: at,
        listen: None,
        token: "probe".into(),
        transport: t,
        shape: LinkShape::default(),
        join_timeout: Duration::from_secs(20),
        stall_timeout: Duration::from_secs(20),
        insecure_plaintext: plain,
    }
}

fn probe(c: &mut strata_net::Communicator, floats: usize, between: usize) -> Duration {
    let src = vec![1.0f32; floats];
    let mut dst = vec![0.0f32; 2 * floats];
    let parts = [0..floats, floats..2 * floats];
    // What a decode step does between two exchanges, roughly: reads through weights.
    let work = vec![1u64; between / 8];
    // About as many bytes in every batch whatever the size.
    let n = (20_000 * 288 / floats.max(1)).clamp(200, 20_000) as u32;
    let n = if between > 0 { n.min(400) } else { n };
    let mut batches = Vec::new();
    for _ in 0..6 {
        let mut spent = Duration::ZERO;
        for _ in 0..n {
            std::hint::black_box(
                std::hint::black_box(&work)
                    .iter()
                    .fold(0u64, |a, &b| a.wrapping_add(b)),
            );
            let start = Instant::now();
            c.all_gather_cols(&[0, 1], &src, &mut dst, 1, &parts)
                .expect("all-gather");
            spent += start.elapsed();
        }
        batches.push(spent / n);
    }
    // The first batch warms up; median of the rest.
    let mut rest = batches.split_off(1);
    rest.sort();
    rest[rest.len() / 2]
}

fn main() {
    let floats: usize = std::env::args()
        .nth(1)
        .and_then(|f| f.parse().ok())
        .unwrap_or(288);
    // Bytes each rank reads between two exchanges (the second argument, KiB): an exchange
    // after the caches were filled with other data, as in a decode step, costs more than one
    // of a tight loop.
    let between: usize = std::env::args()
        .nth(2)
        .and_then(|f| f.parse::<usize>().ok())
        .unwrap_or(0)
        * 1024;
    for t in [Transport::Shm, Transport::Tcp] {
        for plain in [false, true] {
            let listener = TcpListener::bind("127.0.0.1:0").expect("bind");
            let at = listener.local_addr().expect("addr");
            let peer = std::thread::spawn(move || {
                probe(
                    &mut join(&config(1, at, t, plain)).expect("join"),
                    floats,
                    between,
                )
            });
            let mine = probe(
                &mut coordinate(&config(0, at, t, plain), listener).expect("coordinate"),
                floats,
                between,
            );
            peer.join().expect("peer");
            let how = if plain { "plaintext" } else { "sealed" };
            println!("{t:?} {how}: {mine:?} per exchange of {floats} floats each way");
        }
    }
    for _ in 0..3 {
        println!(
            "the nodes' overhead probe (an exchange after reading {} KiB, less one back to back): {:.2} us",
            strata_net::OVERHEAD_READ >> 10,
            strata_net::exchange_overhead().expect("overhead") * 1e6
        );
    }
    for bytes in [576 * 4, 1 << 20] {
        let per = strata_net::sealing_cost(bytes, (200 << 20) / bytes as u32).expect("sealing");
        println!(
            "AES-256-GCM seal + open of a {bytes}-byte message (header and payload records): {per:?} ({:.2} GB/s)",
            bytes as f64 / per.as_secs_f64() / 1e9
        );
    }
}
