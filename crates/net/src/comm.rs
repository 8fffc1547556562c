//! A communicator: this rank's links to every other rank, and the progress engine that moves
//! framed messages over them without blocking.
//!
//! Every message travels as a 16-byte header (payload length, earliest delivery time) and the
//! payload, each sealed as an AEAD record on a protected link ([`crate::seal`]: 32 + payload +
//! 16 bytes on the wire). The header is opened and its length checked before the payload is
//! read, and the payload is opened in place before it is delivered. Callers post sends and receives, then [`Communicator::wait`] drives all links at once
//! until everything posted is done: sends to several peers and receives from several peers
//! overlap, and two peers exchanging large messages never deadlock on full buffers. Buffers are
//! kept between calls, so steady-state traffic allocates nothing.

use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use crate::clock::now_ns;
use crate::link::Link;
use crate::seal::{FrameHeader, HEADER, MAX_MESSAGE, SEALED_HEADER, SessionKeys, TAG};
use crate::{Error, LinkShape, Result};

/// Busy-polling rounds before a waiting rank starts yielding its core.
const SPIN_ROUNDS: u32 = 4096;
/// How long a waiting rank yields its core before it starts sleeping between polls. A rank
/// that sleeps pays for waking up (on the EPYC VM, a 2-stage pipeline's single stream ran at
/// 0.82-0.94x one process when its stages slept through each other's turn of about 4 ms, and
/// 0.96-1.07x when they yielded for up to 50 ms, `strata run`, three runs each alternated);
/// yielding gives the core to any thread that wants it, so ranks that outnumber the cores ran
/// no slower (4 ranks on 2 cores). Waits longer than this (a big model's stage) cost a
/// wake-up that is small beside them.
const YIELD_FOR: Duration = Duration::from_millis(50);
/// How often a waiting rank checks that its peers are still alive.
const ALIVE_CHECK: Duration = Duration::from_millis(10);

/// Counters of one communicator's traffic.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CommStats {
    /// Messages sent.
    pub messages: u64,
    /// Payload bytes sent.
    pub bytes: u64,
    /// Time spent inside [`Communicator::wait`] (sending, receiving and waiting for peers).
    pub wait: Duration,
}

struct Peer {
    link: Box<dyn Link>,
    /// The link's session keys; none on an `insecure_plaintext` mesh.
    keys: Option<SessionKeys>,
    /// Outgoing bytes (headers and payloads) not yet taken by the link, from `out_pos` on.
    out: Vec<u8>,
    out_pos: usize,
    /// When this link finishes sending what it was given (emulated bandwidth).
    free_at: u64,
    /// A receive is posted and not complete.
    recv_pending: bool,
    /// The incoming header: `header_len` bytes (sealed or not), `header_pos` of them arrived.
    header: [u8; SEALED_HEADER],
    header_len: usize,
    header_pos: usize,
    /// The payload of the last message received (with its tag while it is still sealed).
    payload: Vec<u8>,
    /// Its length in the clear, and on the wire.
    payload_len: usize,
    payload_wire: usize,
    payload_pos: usize,
    /// Whether the received payload has been opened (checked and decrypted).
    opened: bool,
    deliver_at: u64,
    /// Bytes read from the link ahead of need, `stash[stash_lo..stash_hi]`: one read takes a
    /// small message's header and payload (and maybe the next message) in a single call.
    stash: Box<[u8]>,
    stash_lo: usize,
    stash_hi: usize,
}

/// Bytes of each peer's read-ahead buffer.
const STASH: usize = 64 << 10;

impl Peer {
    /// Moves up to `dst.len()` stashed bytes into `dst`; returns how many.
    fn take_stashed(&mut self, dst: &mut [u8]) -> usize {
        let n = dst.len().min(self.stash_hi - self.stash_lo);
        dst[..n].copy_from_slice(&self.stash[self.stash_lo..self.stash_lo + n]);
        self.stash_lo += n;
        n
    }

    /// Refills the (empty) stash from the link; returns whether bytes arrived.
    fn refill(&mut self) -> Result<bool> {
        self.stash_lo = 0;
        self.stash_hi = self.link.read_some(&mut self.stash)?;
        Ok(self.stash_hi > 0)
    }

    /// Completes as much of the header as has arrived; returns whether anything moved.
    fn fill_header(&mut self) -> Result<bool> {
        let mut moved = false;
        for _ in 0..2 {
            let mut header = self.header;
            let n = self.take_stashed(&mut header[self.header_pos..self.header_len]);
            self.header = header;
            self.header_pos += n;
            moved |= n > 0;
            if self.header_pos == self.header_len || !self.refill()? {
                break;
            }
            moved = true;
        }
        Ok(moved)
    }

    /// Completes as much of the payload as has arrived; returns whether anything moved.
    fn fill_payload(&mut self) -> Result<bool> {
        let mut moved = false;
        loop {
            let (pos, len) = (self.payload_pos, self.payload_wire);
            let mut payload = std::mem::take(&mut self.payload);
            let n = self.take_stashed(&mut payload[pos..len]);
            self.payload = payload;
            self.payload_pos += n;
            moved |= n > 0;
            let left = self.payload_wire - self.payload_pos;
            if left == 0 {
                return Ok(moved);
            }
            if left >= STASH / 2 {
                // Large: straight into place, no copy through the stash.
                let (pos, len) = (self.payload_pos, self.payload_wire);
                let n = self.link.read_some(&mut self.payload[pos..len])?;
                self.payload_pos += n;
                return Ok(moved || n > 0);
            }
            if !self.refill()? {
                return Ok(moved);
            }
            moved = true;
        }
    }

    /// Opens the header that has fully arrived, checks the length it announces, and makes
    /// room for the payload (only then: a refused length allocates nothing).
    fn take_header(&mut self, rank: usize) -> Result<()> {
        let h = match &mut self.keys {
            Some(k) => k.rx.open_header(rank, &self.header)?,
            None => {
                let mut plain = [0u8; HEADER];
                plain.copy_from_slice(&self.header[..HEADER]);
                FrameHeader::parse(rank, &plain)?
            }
        };
        let tag = if self.keys.is_some() { TAG } else { 0 };
        self.deliver_at = h.deliver_at;
        self.payload_len = h.len;
        self.payload_wire = h.len + tag;
        if self.payload.len() < self.payload_wire {
            self.payload.resize(self.payload_wire, 0);
        }
        Ok(())
    }

    /// Checks and decrypts the payload that has fully arrived, in place.
    fn open_payload(&mut self, rank: usize) -> Result<()> {
        if let Some(k) = &mut self.keys {
            k.rx.open(rank, &mut self.payload[..self.payload_wire])?;
        }
        self.opened = true;
        Ok(())
    }
}

/// A link to one peer and its session keys (none on an `insecure_plaintext` mesh).
pub(crate) type KeyedLink = (Box<dyn Link>, Option<SessionKeys>);

/// Stops the heartbeat thread when the communicator goes.
struct Heartbeat {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
}

/// This rank's end of the mesh.
pub struct Communicator {
    rank: usize,
    world: usize,
    peers: Vec<Option<Peer>>,
    shape: LinkShape,
    /// How long a peer may stay silent (no heartbeat) before it counts as lost.
    stall: Duration,
    stats: CommStats,
    heartbeat: Option<Heartbeat>,
    pub(crate) scratch: Vec<f32>,
}

impl Drop for Communicator {
    fn drop(&mut self) {
        if let Some(h) = &self.heartbeat {
            h.stop.store(true, Ordering::Relaxed);
        }
        // Close the heartbeat sockets for every handle, so peers learn at once that this rank
        // is gone, not when the heartbeat thread next wakes.
        for p in self.peers.iter().flatten() {
            p.link.control().close();
        }
    }
}

impl std::fmt::Debug for Communicator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Communicator")
            .field("rank", &self.rank)
            .field("world", &self.world)
            .field("transport", &self.transport())
            .field("shape", &self.shape)
            .finish()
    }
}

impl Communicator {
    pub(crate) fn new(
        rank: usize,
        world: usize,
        links: Vec<Option<KeyedLink>>,
        shape: LinkShape,
        stall: Duration,
    ) -> Communicator {
        let peers = links
            .into_iter()
            .map(|l| {
                l.map(|(link, keys)| Peer {
                    link,
                    header_len: if keys.is_some() {
                        SEALED_HEADER
                    } else {
                        HEADER
                    },
                    keys,
                    out: Vec::new(),
                    out_pos: 0,
                    free_at: 0,
                    recv_pending: false,
                    header: [0; SEALED_HEADER],
                    header_pos: 0,
                    payload: Vec::new(),
                    payload_len: 0,
                    payload_wire: 0,
                    payload_pos: 0,
                    opened: false,
                    deliver_at: 0,
                    stash: vec![0; STASH].into_boxed_slice(),
                    stash_lo: 0,
                    stash_hi: 0,
                })
            })
            .collect();
        Communicator {
            rank,
            world,
            peers,
            shape,
            stall,
            stats: CommStats::default(),
            heartbeat: None,
            scratch: Vec::new(),
        }
    }

    /// Starts the thread that tells every peer, a few times a second, that this rank lives.
    pub(crate) fn start_heartbeat(&mut self) {
        let writers: Vec<std::net::TcpStream> = self
            .peers
            .iter()
            .flatten()
            .filter_map(|p| p.link.control().writer())
            .collect();
        if writers.is_empty() {
            return;
        }
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let every = (self.stall / 8).clamp(Duration::from_millis(20), Duration::from_millis(250));
        let flag = std::sync::Arc::clone(&stop);
        let spawned = std::thread::Builder::new()
            .name("strata-heartbeat".into())
            .spawn(move || {
                let mut writers = writers;
                while !flag.load(std::sync::atomic::Ordering::Relaxed) {
                    // A full buffer means the peer is not reading; its own timeout will tell.
                    writers.retain_mut(|w| {
                        use std::io::Write;
                        match w.write(&[0]) {
                            // One byte: written whole or not at all.
                            Ok(n) => n <= 1,
                            Err(e) => e.kind() == std::io::ErrorKind::WouldBlock,
                        }
                    });
                    std::thread::sleep(every);
                }
            });
        if spawned.is_ok() {
            self.heartbeat = Some(Heartbeat { stop });
        }
    }

    /// This rank.
    pub fn rank(&self) -> usize {
        self.rank
    }

    /// Number of ranks.
    pub fn world(&self) -> usize {
        self.world
    }

    /// The transport's name (`tcp` or `shm`; `local` for a world of one).
    pub fn transport(&self) -> &'static str {
        self.peers
            .iter()
            .flatten()
            .next()
            .map_or("local", |p| p.link.kind())
    }

    /// Whether every link seals its messages (false only on an `insecure_plaintext` mesh; a
    /// world of one has no links and counts as sealed).
    pub fn sealed(&self) -> bool {
        self.peers.iter().flatten().all(|p| p.keys.is_some())
    }

    /// The emulated link shape.
    pub fn shape(&self) -> LinkShape {
        self.shape
    }

    /// Traffic so far.
    pub fn stats(&self) -> CommStats {
        self.stats
    }

    /// Zeroes the traffic counters.
    pub fn reset_stats(&mut self) {
        self.stats = CommStats::default();
    }

    fn peer(&mut self, rank: usize) -> Result<&mut Peer> {
        let me = self.rank;
        self.peers
            .get_mut(rank)
            .and_then(Option::as_mut)
            .ok_or_else(|| Error::Protocol {
                peer: rank,
                what: format!("rank {me} has no link to rank {rank}"),
            })
    }

    /// Queues one message made of `parts` (concatenated) for `peer`.
    pub fn post_send(&mut self, peer: usize, parts: &[&[u8]]) -> Result<()> {
        let shape = self.shape;
        let len: usize = parts.iter().map(|p| p.len()).sum();
        if len > MAX_MESSAGE {
            return Err(Error::Protocol {
                peer,
                what: format!(
                    "a message of {len} bytes is more than the largest the protocol sends ({MAX_MESSAGE} bytes)"
                ),
            });
        }
        let p = self.peer(peer)?;
        let deliver_at = if shape.is_ideal() {
            0
        } else {
            let now = now_ns();
            p.free_at = p.free_at.max(now) + shape.wire_ns(len);
            p.free_at + shape.latency.as_nanos() as u64
        };
        if p.out_pos == p.out.len() {
            p.out.clear();
            p.out_pos = 0;
        }
        let header = FrameHeader { len, deliver_at }.encode();
        match &mut p.keys {
            None => {
                p.out.extend_from_slice(&header);
                for part in parts {
                    p.out.extend_from_slice(part);
                }
            }
            Some(k) => {
                // Sealed in place in the outgoing buffer: nothing is allocated once it is
                // large enough.
                let at = p.out.len();
                p.out.extend_from_slice(&header);
                let tag = k.tx.seal(peer, &mut p.out[at..])?;
                p.out.extend_from_slice(&tag);
                let at = p.out.len();
                for part in parts {
                    p.out.extend_from_slice(part);
                }
                let tag = k.tx.seal(peer, &mut p.out[at..])?;
                p.out.extend_from_slice(&tag);
            }
        }
        self.stats.messages += 1;
        self.stats.bytes += len as u64;
        Ok(())
    }

    /// Expects one message from `peer`; after [`Communicator::wait`], [`Communicator::payload`]
    /// holds it.
    pub fn post_recv(&mut self, peer: usize) -> Result<()> {
        let p = self.peer(peer)?;
        if p.recv_pending {
            return Err(Error::Protocol {
                peer,
                what: "two receives posted at once".into(),
            });
        }
        p.recv_pending = true;
        p.header_pos = 0;
        p.payload_pos = 0;
        p.payload_len = 0;
        p.payload_wire = 0;
        p.opened = false;
        Ok(())
    }

    /// The payload of the last message received from `peer`.
    pub fn payload(&self, peer: usize) -> &[u8] {
        self.peers
            .get(peer)
            .and_then(Option::as_ref)
            .map_or(&[], |p| &p.payload[..p.payload_len])
    }

    /// Sends one message to `peer` and waits until the link has taken it.
    pub fn send(&mut self, peer: usize, data: &[u8]) -> Result<()> {
        self.post_send(peer, &[data])?;
        self.wait()
    }

    /// Receives one message from `peer`.
    pub fn recv(&mut self, peer: usize) -> Result<&[u8]> {
        self.post_recv(peer)?;
        self.wait()?;
        Ok(self.payload(peer))
    }

    /// Drives every link until all posted sends are handed over and all posted receives have
    /// arrived (and, on an emulated link, reached their delivery time).
    pub fn wait(&mut self) -> Result<()> {
        let start = Instant::now();
        let result = self.progress(start);
        self.stats.wait += start.elapsed();
        result
    }

    fn progress(&mut self, start: Instant) -> Result<()> {
        let mut idle_rounds = 0u32;
        let mut last_progress = start;
        let mut last_check = start;
        let mut suspect = false;
        loop {
            let mut pending = None;
            let mut moved = false;
            let mut now = 0;
            for (rank, slot) in self.peers.iter_mut().enumerate() {
                let Some(p) = slot else { continue };
                if p.out_pos < p.out.len() {
                    let n = p.link.write_some(&p.out[p.out_pos..])?;
                    p.out_pos += n;
                    moved |= n > 0;
                    if p.out_pos < p.out.len() {
                        pending = Some(rank);
                    }
                }
                if !p.recv_pending {
                    continue;
                }
                if p.header_pos < p.header_len {
                    moved |= p.fill_header()?;
                    if p.header_pos < p.header_len {
                        pending = Some(rank);
                        continue;
                    }
                    p.take_header(rank)?;
                }
                if p.payload_pos < p.payload_wire {
                    moved |= p.fill_payload()?;
                    if p.payload_pos < p.payload_wire {
                        pending = Some(rank);
                        continue;
                    }
                }
                if !p.opened {
                    p.open_payload(rank)?;
                }
                if p.deliver_at != 0 {
                    if now == 0 {
                        now = now_ns();
                    }
                    if now < p.deliver_at {
                        // In flight on the emulated wire: not a stall.
                        moved = true;
                        pending = Some(rank);
                        continue;
                    }
                }
                p.recv_pending = false;
            }
            let Some(waiting_on) = pending else {
                return Ok(());
            };
            if moved {
                idle_rounds = 0;
                suspect = false;
                last_progress = Instant::now();
                continue;
            }
            idle_rounds += 1;
            if idle_rounds < SPIN_ROUNDS {
                std::hint::spin_loop();
                continue;
            }
            let now = Instant::now();
            let idle = now.duration_since(last_progress);
            // Spin first (a peer on its own core answers within microseconds), then yield the
            // core (more ranks than cores must not starve the rank being waited for), then
            // sleep between polls (an idle instance must not hold a core).
            if idle < YIELD_FOR {
                std::thread::yield_now();
            } else {
                std::thread::sleep(Duration::from_micros(50));
            }
            if now.duration_since(last_check) >= ALIVE_CHECK {
                last_check = now;
                if self.check_peers(&mut suspect)? {
                    idle_rounds = 0;
                }
                let _ = waiting_on;
            }
        }
    }

    /// Checks that every peer is alive; returns whether one looks gone. A failure is believed
    /// only when the check before also failed and nothing was read in between (`suspect`
    /// carries that): a peer may write its last message and exit while this rank sleeps
    /// between polls, and at a shutdown several go at once (rank 0 and a later stage's
    /// ranks), so a first failure, however many peers show it, only makes the caller read
    /// once more.
    fn check_peers(&mut self, suspect: &mut bool) -> Result<bool> {
        let mut failed = None;
        for p in self.peers.iter_mut().flatten() {
            if let Err(e) = p.link.check_alive(self.stall) {
                failed.get_or_insert(e);
            }
        }
        match failed {
            Some(e) if *suspect => Err(e),
            Some(_) => {
                *suspect = true;
                Ok(true)
            }
            None => {
                *suspect = false;
                Ok(false)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::link::Control;
    use std::net::{TcpListener, TcpStream};
    use std::sync::Arc;
    use std::sync::atomic::AtomicBool;

    /// A link whose peer has exited: it reports the peer closed from the start, and (when
    /// `last` holds a message) delivers that last message only once a liveness check has
    /// run, as when the peer wrote it and exited while this rank slept between polls.
    struct Gone {
        control: Control,
        last: Vec<u8>,
        checked: Arc<AtomicBool>,
    }

    impl Link for Gone {
        fn write_some(&mut self, buf: &[u8]) -> Result<usize> {
            Ok(buf.len())
        }
        fn read_some(&mut self, buf: &mut [u8]) -> Result<usize> {
            if !self.checked.load(Ordering::Relaxed) {
                return Ok(0);
            }
            let n = buf.len().min(self.last.len());
            buf[..n].copy_from_slice(&self.last[..n]);
            self.last.drain(..n);
            Ok(n)
        }
        fn check_alive(&mut self, _: Duration) -> Result<()> {
            self.checked.store(true, Ordering::Relaxed);
            Err(Error::PeerClosed { peer: 9 })
        }
        fn control(&self) -> &Control {
            &self.control
        }
        fn kind(&self) -> &'static str {
            "test"
        }
    }

    fn control() -> Control {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind");
        let s = TcpStream::connect(l.local_addr().expect("addr")).expect("connect");
        let _accepted = l.accept().expect("accept");
        Control::new(9, s).expect("control")
    }

    fn gone(last: &[u8], checked: &Arc<AtomicBool>) -> Option<KeyedLink> {
        let link = Gone {
            control: control(),
            last: last.to_vec(),
            checked: Arc::clone(checked),
        };
        Some((Box::new(link), None))
    }

    #[test]
    fn a_last_message_is_read_though_its_sender_and_another_peer_are_gone() {
        // Rank 1 of 3 waits on rank 0, which sent its last message and exited while rank 1
        // slept, as rank 2 did: the first check sees both gone, and the message is still read.
        let payload = b"shutdown";
        let mut frame = FrameHeader {
            len: payload.len(),
            deliver_at: 0,
        }
        .encode()
        .to_vec();
        frame.extend_from_slice(payload);
        let checked = Arc::new(AtomicBool::new(false));
        let links = vec![gone(&frame, &checked), None, gone(&[], &checked)];
        let mut comm =
            Communicator::new(1, 3, links, LinkShape::default(), Duration::from_secs(60));
        assert_eq!(comm.recv(0).expect("the last message"), payload);
        // With nothing left to read, the next wait believes the peers gone.
        assert!(matches!(comm.recv(0), Err(Error::PeerClosed { .. })));
    }
}
