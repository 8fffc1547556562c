//! Byte links between two ranks: a TCP connection, or a pair of shared-memory rings.
//!
//! Both are used without blocking: the communicator moves as many bytes as each link takes,
//! in both directions at once, so two ranks sending each other megabytes (a prefill all-gather)
//! never wait on each other's full buffers.

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::error::io;
use crate::{Error, Result};

/// One end of a bidirectional byte stream to a peer.
pub(crate) trait Link: Send {
    /// Writes as many bytes of `buf` as fit now; returns how many (0 when full).
    fn write_some(&mut self, buf: &[u8]) -> Result<usize>;
    /// Reads what has arrived, up to `buf.len()` bytes; returns how many (0 when nothing yet).
    fn read_some(&mut self, buf: &mut [u8]) -> Result<usize>;
    /// Fails if the peer is gone: its sockets closed, or no heartbeat for `timeout`.
    fn check_alive(&mut self, timeout: std::time::Duration) -> Result<()>;
    /// The heartbeat connection.
    fn control(&self) -> &Control;
    /// The transport's name, for reports.
    fn kind(&self) -> &'static str;
}

/// A TCP connection (TCP_NODELAY, non-blocking), with a second one for heartbeats.
pub(crate) struct TcpLink {
    peer: usize,
    stream: TcpStream,
    control: Control,
}

impl TcpLink {
    pub(crate) fn new(peer: usize, stream: TcpStream, control: Control) -> Result<TcpLink> {
        stream
            .set_nodelay(true)
            .map_err(io(peer, "setting TCP_NODELAY"))?;
        stream
            .set_nonblocking(true)
            .map_err(io(peer, "making a socket non-blocking"))?;
        Ok(TcpLink {
            peer,
            stream,
            control,
        })
    }
}

impl Link for TcpLink {
    fn write_some(&mut self, buf: &[u8]) -> Result<usize> {
        match self.stream.write(buf) {
            Ok(n) => Ok(n),
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {
                Ok(0)
            }
            Err(e) if is_disconnect(&e) => Err(Error::PeerClosed { peer: self.peer }),
            Err(e) => Err(io(self.peer, "sending")(e)),
        }
    }

    fn read_some(&mut self, buf: &mut [u8]) -> Result<usize> {
        match self.stream.read(buf) {
            Ok(0) if !buf.is_empty() => Err(Error::PeerClosed { peer: self.peer }),
            Ok(n) => Ok(n),
            Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => {
                Ok(0)
            }
            Err(e) if is_disconnect(&e) => Err(Error::PeerClosed { peer: self.peer }),
            Err(e) => Err(io(self.peer, "receiving")(e)),
        }
    }

    fn check_alive(&mut self, timeout: std::time::Duration) -> Result<()> {
        // Reads on this link report a closed socket themselves; this finds a dead peer this
        // rank is not reading from right now, and a silent one.
        socket_closed(self.peer, &self.stream)?;
        self.control.check(timeout)
    }

    fn control(&self) -> &Control {
        &self.control
    }

    fn kind(&self) -> &'static str {
        "tcp"
    }
}

fn is_disconnect(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        ErrorKind::ConnectionReset
            | ErrorKind::ConnectionAborted
            | ErrorKind::BrokenPipe
            | ErrorKind::UnexpectedEof
    )
}

/// A connection to a peer that carries nothing but heartbeats: every rank's heartbeat thread
/// writes a byte to each peer a few times a second, and a waiting rank reads them. Silence longer
/// than the link timeout means the peer's process is frozen or the link is cut, which a closed
/// socket alone would never show.
///
/// The connection was opened with a full handshake, but the heartbeat bytes themselves are not
/// sealed: they carry nothing, and all a man in the middle gains by forging them is to make a
/// frozen peer look alive, which only delays a failure it could cause anyway by cutting the
/// link. Data never travels here.
pub(crate) struct Control {
    peer: usize,
    stream: TcpStream,
    last_heard: std::time::Instant,
}

impl Control {
    pub(crate) fn new(peer: usize, stream: TcpStream) -> Result<Control> {
        stream
            .set_nonblocking(true)
            .map_err(io(peer, "making a socket non-blocking"))?;
        let _ = stream.set_nodelay(true);
        Ok(Control {
            peer,
            stream,
            last_heard: std::time::Instant::now(),
        })
    }

    /// A handle to the same socket for the heartbeat thread.
    pub(crate) fn writer(&self) -> Option<TcpStream> {
        self.stream.try_clone().ok()
    }

    /// Drains heartbeats; fails if the peer closed the connection or has been silent too long.
    pub(crate) fn check(&mut self, timeout: std::time::Duration) -> Result<()> {
        let mut buf = [0u8; 64];
        loop {
            match self.stream.read(&mut buf) {
                Ok(0) => return Err(Error::PeerClosed { peer: self.peer }),
                Ok(_) => self.last_heard = std::time::Instant::now(),
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) if is_disconnect(&e) => return Err(Error::PeerClosed { peer: self.peer }),
                Err(e) => return Err(io(self.peer, "reading heartbeats")(e)),
            }
        }
        let silent = self.last_heard.elapsed();
        if silent > timeout {
            return Err(Error::Timeout {
                peer: self.peer,
                waited: silent,
            });
        }
        Ok(())
    }

    /// Closes the connection for every handle at once, so the peer sees it go now.
    pub(crate) fn close(&self) {
        let _ = self.stream.shutdown(std::net::Shutdown::Both);
    }
}

/// Whether the peer of a (non-blocking) socket has closed it.
pub(crate) fn socket_closed(peer: usize, s: &TcpStream) -> Result<()> {
    let mut b = [0u8; 1];
    match s.peek(&mut b) {
        Ok(0) => Err(Error::PeerClosed { peer }),
        Ok(_) => Ok(()),
        Err(e) if e.kind() == ErrorKind::WouldBlock || e.kind() == ErrorKind::Interrupted => Ok(()),
        Err(e) if is_disconnect(&e) => Err(Error::PeerClosed { peer }),
        Err(e) => Err(io(peer, "checking a link")(e)),
    }
}

/// Bytes of one ring's header: producer and consumer counters on separate cache lines.
const RING_HEADER: usize = 128;

/// A shared-memory region holding one single-producer single-consumer ring per ordered pair of
/// ranks. Created by rank 0 as a file under `/dev/shm` and mapped by every rank of the host.
#[derive(Debug)]
pub(crate) struct ShmRegion {
    map: memmap2::MmapRaw,
    world: usize,
    ring_bytes: usize,
}

impl ShmRegion {
    /// Bytes a region for `world` ranks with rings of `ring_bytes` needs.
    pub(crate) fn size(world: usize, ring_bytes: usize) -> usize {
        world * world * (RING_HEADER + ring_bytes)
    }

    /// Maps `file` (already sized with [`ShmRegion::size`]).
    pub(crate) fn map(
        file: &std::fs::File,
        world: usize,
        ring_bytes: usize,
        me: usize,
    ) -> Result<Arc<ShmRegion>> {
        assert!(ring_bytes.is_power_of_two());
        let map = memmap2::MmapOptions::new()
            .len(Self::size(world, ring_bytes))
            .map_raw(file)
            .map_err(io(me, "mapping the shared-memory region"))?;
        Ok(Arc::new(ShmRegion {
            map,
            world,
            ring_bytes,
        }))
    }

    fn ring(self: &Arc<Self>, from: usize, to: usize) -> Ring {
        let at = (from * self.world + to) * (RING_HEADER + self.ring_bytes);
        Ring {
            region: Arc::clone(self),
            at,
            cap: self.ring_bytes,
        }
    }
}

/// One direction of a shared-memory link.
struct Ring {
    region: Arc<ShmRegion>,
    /// Offset of the ring's header in the region.
    at: usize,
    cap: usize,
}

// SAFETY: the ring only touches its own slice of the mapping, through atomics for the counters
// and through the producer/consumer protocol for the data; the mapping lives as long as `region`.
unsafe impl Send for Ring {}

impl Ring {
    fn base(&self) -> *mut u8 {
        // SAFETY: `at` lies inside the mapping (see ShmRegion::ring).
        unsafe { self.region.map.as_mut_ptr().add(self.at) }
    }

    /// Bytes written so far (advanced by the producer).
    fn head(&self) -> &AtomicU64 {
        // SAFETY: the header is 128-byte aligned inside a page-aligned mapping and holds two u64
        // counters that are only accessed atomically.
        unsafe { &*(self.base() as *const AtomicU64) }
    }

    /// Bytes read so far (advanced by the consumer).
    fn tail(&self) -> &AtomicU64 {
        // SAFETY: as for `head`, 64 bytes further on.
        unsafe { &*(self.base().add(64) as *const AtomicU64) }
    }

    fn data(&self) -> *mut u8 {
        // SAFETY: the data area follows the header inside the ring's slice.
        unsafe { self.base().add(RING_HEADER) }
    }

    fn push(&mut self, buf: &[u8]) -> usize {
        let head = self.head().load(Ordering::Relaxed);
        let tail = self.tail().load(Ordering::Acquire);
        let free = self.cap - (head - tail) as usize;
        let n = free.min(buf.len());
        if n == 0 {
            return 0;
        }
        let start = (head as usize) & (self.cap - 1);
        let first = n.min(self.cap - start);
        // SAFETY: bytes [start, start + first) and [0, n - first) of the data area are free (the
        // consumer has read past them) and only this producer writes them.
        unsafe {
            std::ptr::copy_nonoverlapping(buf.as_ptr(), self.data().add(start), first);
            std::ptr::copy_nonoverlapping(buf.as_ptr().add(first), self.data(), n - first);
        }
        self.head().store(head + n as u64, Ordering::Release);
        n
    }

    fn pop(&mut self, buf: &mut [u8]) -> usize {
        let tail = self.tail().load(Ordering::Relaxed);
        let head = self.head().load(Ordering::Acquire);
        let n = ((head - tail) as usize).min(buf.len());
        if n == 0 {
            return 0;
        }
        let start = (tail as usize) & (self.cap - 1);
        let first = n.min(self.cap - start);
        // SAFETY: the producer published these bytes (Acquire on head) and does not touch them
        // until the tail moves past them.
        unsafe {
            std::ptr::copy_nonoverlapping(self.data().add(start), buf.as_mut_ptr(), first);
            std::ptr::copy_nonoverlapping(self.data(), buf.as_mut_ptr().add(first), n - first);
        }
        self.tail().store(tail + n as u64, Ordering::Release);
        n
    }
}

/// A shared-memory link: an outgoing and an incoming ring, plus the TCP connection to the same
/// peer, which carries heartbeats and shows when the peer's process is gone.
pub(crate) struct ShmLink {
    tx: Ring,
    rx: Ring,
    control: Control,
}

impl ShmLink {
    pub(crate) fn new(
        region: &Arc<ShmRegion>,
        me: usize,
        peer: usize,
        control: Control,
    ) -> Result<ShmLink> {
        Ok(ShmLink {
            tx: region.ring(me, peer),
            rx: region.ring(peer, me),
            control,
        })
    }
}

impl Link for ShmLink {
    fn write_some(&mut self, buf: &[u8]) -> Result<usize> {
        Ok(self.tx.push(buf))
    }

    fn read_some(&mut self, buf: &mut [u8]) -> Result<usize> {
        Ok(self.rx.pop(buf))
    }

    fn check_alive(&mut self, timeout: std::time::Duration) -> Result<()> {
        self.control.check(timeout)
    }

    fn control(&self) -> &Control {
        &self.control
    }

    fn kind(&self) -> &'static str {
        "shm"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_wraps_and_keeps_order() {
        let file = tempfile::tempfile().expect("temp file");
        file.set_len(ShmRegion::size(2, 64) as u64).expect("size");
        let region = ShmRegion::map(&file, 2, 64, 0).expect("map");
        let mut tx = region.ring(0, 1);
        let mut rx = region.ring(0, 1);
        let data: Vec<u8> = (0..1000u32).map(|i| (i * 7) as u8).collect();
        let (mut sent, mut got) = (0, Vec::new());
        let mut buf = [0u8; 48];
        while got.len() < data.len() {
            sent += tx.push(&data[sent..]);
            let n = rx.pop(&mut buf);
            got.extend_from_slice(&buf[..n]);
        }
        assert_eq!(got, data);
    }
}
