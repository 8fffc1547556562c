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
