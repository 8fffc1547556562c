//! Measuring a link the way the data plane uses it: small messages bounced to time the round
//! trip (what every exchange of a tensor-parallel step waits for), then large ones streamed to
//! time the bandwidth, over an established [`Communicator`] (sealed, heartbeats, emulated shape
//! and all). The planner's link figures come from here, so they price what decoding pays, not
//! what a control-plane query pays.

use std::time::Instant;

use crate::{Communicator, Error, Result};

/// What a probe found.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LinkFigures {
    /// One-way latency: half the 5th-percentile round trip of a small message, seconds.
    pub latency: f64,
    /// Bytes per second of a stream of large messages.
    pub bandwidth: f64,
}

/// How much a probe sends.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ProbeSize {
    /// Small messages bounced.
    pub rounds: u32,
    /// Size of each large message, bytes.
    pub big: u32,
    /// Large messages streamed.
    pub bigs: u32,
}

const SMALL: usize = 64;

/// Measures the link to `peer`, which must be running [`answer_probe`].
pub fn probe_link(comm: &mut Communicator, peer: usize, size: ProbeSize) -> Result<LinkFigures> {
    if size.rounds == 0 || size.big == 0 || size.bigs == 0 {
        return Err(Error::Handshake(
            "a probe needs rounds and large messages".into(),
        ));
    }
    let mut head = [0u8; 12];
    head[..4].copy_from_slice(&size.rounds.to_le_bytes());
    head[4..8].copy_from_slice(&size.big.to_le_bytes());
    head[8..].copy_from_slice(&size.bigs.to_le_bytes());
    comm.send(peer, &head)?;
    let small = [0u8; SMALL];
    let mut trips = Vec::with_capacity(size.rounds as usize);
    for _ in 0..size.rounds {
        let t = Instant::now();
        comm.send(peer, &small)?;
        comm.recv(peer)?;
        trips.push(t.elapsed().as_secs_f64());
    }
    let big = vec![0x5a_u8; size.big as usize];
    let t = Instant::now();
    for _ in 0..size.bigs {
        comm.send(peer, &big)?;
    }
    comm.recv(peer)?;
    let bytes = f64::from(size.big) * f64::from(size.bigs);
    Ok(figures(&mut trips, t.elapsed().as_secs_f64(), bytes))
}

/// A probe's figures from its small messages' round trips and the time `bytes` of large ones
/// took to stream and be acknowledged, seconds.
fn figures(trips: &mut [f64], elapsed: f64, bytes: f64) -> LinkFigures {
    // The fifth-fastest round trip in a hundred: on a machine whose cores are busy (another
    // instance prefilling, a model loading) most trips measure the scheduler's wake-up delay
    // rather than the link, while the luckiest one alone would flatter it.
    trips.sort_by(f64::total_cmp);
    let trip = trips.get(trips.len() / 20).copied().unwrap_or(0.0);
    // The acknowledgement's own trip is not transfer time, and the fastest trip is the least
    // of it: the percentile, inflated by busy cores, once exceeded the whole stream's time
    // and read as 16 million Gbit/s. Should even that leave nothing, the whole time counts.
    let fastest = trips.first().copied().unwrap_or(0.0);
    let transfer = match elapsed - fastest {
        d if d > 0.0 => d,
        _ => elapsed.max(1e-9),
    };
    LinkFigures {
        latency: trip / 2.0,
        bandwidth: bytes / transfer,
    }
}

/// Answers one [`probe_link`] from `peer`: echoes its small messages, takes its large ones, and
/// says when they have all arrived. Refuses a probe larger than `limit` bytes in all.
pub fn answer_probe(comm: &mut Communicator, peer: usize, limit: u64) -> Result<()> {
    let head = comm.recv(peer)?;
    let word = |i: usize| -> Result<u32> {
        head.get(i..i + 4)
            .and_then(|b| b.try_into().ok())
            .map(u32::from_le_bytes)
            .ok_or_else(|| Error::Handshake("a malformed probe".into()))
    };
    let (rounds, big, bigs) = (word(0)?, word(4)?, word(8)?);
    let total = u64::from(rounds) * SMALL as u64 + u64::from(big) * u64::from(bigs);
    if total > limit {
        return Err(Error::Handshake(format!(
            "a probe of {total} bytes is over the limit of {limit}"
        )));
    }
    for _ in 0..rounds {
        let m = comm.recv(peer)?.to_vec();
        comm.send(peer, &m)?;
    }
    for _ in 0..bigs {
        comm.recv(peer)?;
    }
    comm.send(peer, b"done")
}

/// Bytes each side of [`exchange_overhead`] reads before each exchange of its second kind:
/// more than a core's private caches hold, as a tensor-parallel decode step reads weights
/// between two exchanges (SmolLM2's ranks read about a quarter of a megabyte, a 7B model's
/// several megabytes).
pub const OVERHEAD_READ: usize = 1 << 20;

/// Pairs of batches of [`exchange_overhead`].
const OVERHEAD_PAIRS: usize = 12;

/// Exchanges in each batch of [`exchange_overhead`].
const OVERHEAD_EXCHANGES: usize = 50;

/// Pause between two pairs of batches of [`exchange_overhead`].
const OVERHEAD_GAP: std::time::Duration = std::time::Duration::from_millis(25);

/// What one exchange of a decode step costs this machine beyond one made back to back, seconds:
/// two ranks over a shared-memory pair exchange a decode row's halves (288 floats each way)
/// in pairs of batches, one back to back and one each after reading [`OVERHEAD_READ`] bytes of
/// other data; the difference of each pair's mean exchange times is kept, and the lower
/// quartile of twelve pairs 25 ms apart is the figure (0 if negative).
///
/// A link probe bounces small messages back to back, with the code and data of the exchange
/// hot in the cores' caches; in a decode step every exchange follows a stretch of reading
/// weights, and each rank also waits out the other's variation in that stretch. On a 2-core
/// EPYC VM an exchange over shared memory after a 1 MiB read took 5.4-11 us against 2.1 us back
/// to back (`exchange_latency 288 1024`), while the planner charged live nodes the
/// back-to-back figure alone. Nodes publish this figure, and the planner adds it to every
/// exchange, per peer.
///
/// Pairs spread out with pauses, and a low quantile: run back to back in bursts, on that VM
/// the difference read 1.4-6 us at some moments and 18-28 us at others (its two cores are at
/// times much slower together than apart under sustained load); with pauses, 0.8-3.1 us. A
/// start-up probe cannot know how long the slow state will last, so it prices the steady
/// cost. Nodes also start beside others that are measuring themselves (a cluster starting at
/// once, or tests), and a batch whose thread waited for a core reads that wait, never less:
/// the lower quartile keeps a few such batches, or more, from standing for the machine.
pub fn exchange_overhead() -> Result<f64> {
    let (mut a, mut b) = crate::loopback_pair(crate::Transport::Shm)?;
    let peer = std::thread::spawn(move || exchanges(&mut b, 1));
    let mine = exchanges(&mut a, 0);
    let theirs = peer
        .join()
        .map_err(|_| Error::Handshake("the overhead probe's peer panicked".into()))?;
    let mut diffs = mine?;
    theirs?;
    diffs.sort_by(f64::total_cmp);
    Ok(diffs.get(diffs.len() / 4).copied().unwrap_or(0.0).max(0.0))
}

/// One side of [`exchange_overhead`]: the difference of each pair of batches' mean exchange
/// times (after reading, back to back), seconds.
fn exchanges(comm: &mut Communicator, rank: usize) -> Result<Vec<f64>> {
    const FLOATS: usize = 288;
    let src = vec![rank as f32; FLOATS];
    let mut dst = vec![0.0f32; 2 * FLOATS];
    let parts = [0..FLOATS, FLOATS..2 * FLOATS];
    let other = vec![1u64; OVERHEAD_READ / 8];
    let mut batch = |read: bool| -> Result<f64> {
        let mut spent = 0.0;
        for _ in 0..OVERHEAD_EXCHANGES {
            if read {
                std::hint::black_box(
                    std::hint::black_box(&other)
                        .iter()
                        .fold(0u64, |s, &x| s.wrapping_add(x)),
                );
            }
            let t = Instant::now();
            comm.all_gather_cols(&[0, 1], &src, &mut dst, 1, &parts)?;
            spent += t.elapsed().as_secs_f64();
        }
        Ok(spent / OVERHEAD_EXCHANGES as f64)
    };
    // A first batch of each kind warms the link and the buffer.
    batch(false)?;
    batch(true)?;
    let mut diffs = Vec::with_capacity(OVERHEAD_PAIRS);
    for _ in 0..OVERHEAD_PAIRS {
        let hot = batch(false)?;
        let cold = batch(true)?;
        diffs.push(cold - hot);
        // Both sides pause alike; the next exchange brings them back in step.
        std::thread::sleep(OVERHEAD_GAP);
    }
    Ok(diffs)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::time::Duration;

    use super::*;
    use crate::{LinkShape, MeshConfig, Transport, coordinate, join};

    /// A probe over an emulated link finds the latency it was given (and the answering side
    /// taught the shape to the probing one, as rank 0 teaches workers).
    /// The emulated one-way latency of [`a_probe_measures_the_emulated_link`].
    const LATENCY_MS: u64 = 8;

    #[test]
    fn a_probe_measures_the_emulated_link() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let at = listener.local_addr().unwrap();
        let cfg = move |rank: usize| MeshConfig {
            rank,
            world: 2,
            coordinator: at,
            listen: None,
            token: "probe-test".into(),
            transport: Transport::Tcp,
            shape: LinkShape {
                latency: Duration::from_millis(LATENCY_MS),
                bandwidth: Some(100e6),
            },
            join_timeout: Duration::from_secs(10),
            stall_timeout: Duration::from_secs(5),
            insecure_plaintext: false,
        };
        // Three probes, judged by the best: a busy machine (CI runs other test binaries beside
        // this one) only adds wake-up delay to a trip and takes cycles from a stream, never the
        // reverse. The emulated latency is milliseconds, not microseconds, because a loaded
        // two-core machine has delayed the best trip of three probes by over a millisecond (a
        // 500 us link once read 1,815 us): the bounds must stay wider than that noise while
        // still catching a wrong formula (a full round trip reads twice the latency or more,
        // an unhalved one-way much less than it).
        const PROBES: usize = 3;
        let answerer = std::thread::spawn(move || {
            let mut c = coordinate(&cfg(0), listener).unwrap();
            for _ in 0..PROBES {
                answer_probe(&mut c, 1, 1 << 30).unwrap();
            }
        });
        let mut c = join(&cfg(1)).unwrap();
        let size = ProbeSize {
            rounds: 20,
            big: 1 << 20,
            bigs: 4,
        };
        let found: Vec<LinkFigures> = (0..PROBES)
            .map(|_| probe_link(&mut c, 0, size).unwrap())
            .collect();
        answerer.join().unwrap();
        let latency = found
            .iter()
            .map(|f| f.latency)
            .fold(f64::INFINITY, f64::min);
        let bandwidth = found.iter().map(|f| f.bandwidth).fold(0.0, f64::max);
        let want = LATENCY_MS as f64 * 1e-3;
        assert!(
            (want..2.0 * want).contains(&latency),
            "latency {} us",
            latency * 1e6
        );
        assert!(
            (50e6..=110e6).contains(&bandwidth),
            "bandwidth {} MB/s",
            bandwidth / 1e6
        );
    }

    #[test]
    fn busy_round_trips_never_make_the_stream_look_faster_than_it_was() {
        // A hundred trips of 600 us but for a few of the scheduler's: the 5th percentile is
        // 600 us; a 2 MiB stream took 2.3 ms including its 0.6 ms acknowledgement.
        let mut trips: Vec<f64> = (0..100).map(|i| 600e-6 + f64::from(i) * 1e-6).collect();
        let f = figures(&mut trips, 2.3e-3, 2.0 * 1048576.0);
        assert!((f.latency - 302.5e-6).abs() < 1e-9, "{}", f.latency);
        assert!(
            (f.bandwidth - 2097152.0 / 1.7e-3).abs() < 1.0,
            "{}",
            f.bandwidth
        );
        // Most trips met busy cores (the percentile is 3 ms), the stream did not.
        let mut busy: Vec<f64> = (0..100)
            .map(|i| if i < 3 { 600e-6 } else { 3e-3 })
            .collect();
        let f = figures(&mut busy, 2.3e-3, 2.0 * 1048576.0);
        assert!(
            (f.bandwidth - 2097152.0 / 1.7e-3).abs() < 1.0,
            "{}",
            f.bandwidth
        );
        // Nothing left after even the fastest trip: the whole time counts.
        let mut slow = vec![3e-3; 100];
        let f = figures(&mut slow, 2.3e-3, 2.0 * 1048576.0);
        assert!(
            (f.bandwidth - 2097152.0 / 2.3e-3).abs() < 1.0,
            "{}",
            f.bandwidth
        );
    }

    #[test]
    fn an_exchange_after_reading_costs_a_finite_overhead() {
        // Its size is the machine's (and a busy test machine's cores add to it); what must
        // hold anywhere is that it is measured and in seconds, not microseconds or NaN.
        let o = exchange_overhead().unwrap();
        assert!((0.0..0.1).contains(&o), "{} us", o * 1e6);
    }

    #[test]
    fn an_oversized_probe_is_refused() {
        let (mut a, mut b) = crate::loopback_pair(Transport::Tcp).unwrap();
        let t = std::thread::spawn(move || answer_probe(&mut b, 0, 1000));
        let size = ProbeSize {
            rounds: 1,
            big: 1 << 20,
            bigs: 1,
        };
        assert!(probe_link(&mut a, 1, size).is_err());
        assert!(t.join().unwrap().is_err());
    }
}
