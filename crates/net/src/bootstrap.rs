//! Building the mesh: every rank knows rank 0's address (the coordinator); workers register
//! there with the address of their own listener, rank 0 answers with the full rank table, and
//! then each pair of ranks connects directly (rank i dials every rank below it). With the
//! shared-memory transport, rank 0 also creates one region of rings under `/dev/shm`, every rank
//! maps it, and rank 0 removes its name once all have: nothing is left behind even if a process
//! is killed later. The TCP connections stay open beside the rings so a dead peer is noticed.
//!
//! Every connection starts with a mutual proof of the session token, which never crosses the
//! wire: the accepting side sends a fresh challenge, the dialer answers with its hello and an
//! HMAC over the challenge, its own nonce and the hello (checked before the hello is parsed), and
//! the acceptor's verdict carries an HMAC over both nonces in turn. A process that does not know
//! the token, speaks another protocol version, or claims a rank that is taken is turned away
//! with a clear error on both sides, and a recorded handshake is useless to replay.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::error::io;
use crate::link::{Control, Link, ShmLink, ShmRegion, TcpLink};
use crate::{Communicator, Error, LinkShape, Result};

/// The wire protocol version; ranks of different versions refuse each other.
pub const PROTOCOL_VERSION: u32 = 2;
const MAGIC: &[u8; 8] = b"STRATA\x00\x02";
/// Largest bootstrap message accepted before the peer is trusted.
const MAX_HELLO: usize = 64 << 10;
/// Bytes of each shared-memory ring.
pub const SHM_RING_BYTES: usize = 4 << 20;

/// How ranks exchange data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Transport {
    /// TCP connections (any hosts).
    Tcp,
    /// Shared-memory rings (ranks on one host), with TCP alongside to notice dead peers.
    Shm,
}

impl std::str::FromStr for Transport {
    type Err = Error;
    fn from_str(s: &str) -> Result<Transport> {
        match s {
            "tcp" => Ok(Transport::Tcp),
            "shm" => Ok(Transport::Shm),
            _ => Err(Error::BadLinkSetting(s.to_string())),
        }
    }
}

/// Everything a rank needs to join the mesh.
#[derive(Clone, Debug)]
pub struct MeshConfig {
    /// This rank.
    pub rank: usize,
    /// Number of ranks.
    pub world: usize,
    /// Where rank 0 listens.
    pub coordinator: SocketAddr,
    /// Where this worker listens for its peers (port 0 picks one). Default: the address it
    /// reaches the coordinator from, any port.
    pub listen: Option<SocketAddr>,
    /// The session secret every rank must present.
    pub token: String,
    /// Rank 0 only: the transport (workers learn it from rank 0).
    pub transport: Transport,
    /// Rank 0 only: the emulated link shape (workers learn it from rank 0).
    pub shape: LinkShape,
    /// How long to wait for the other ranks to show up.
    pub join_timeout: Duration,
    /// Rank 0 only (workers learn it): how long a peer may stay silent (no data and no
    /// heartbeat; heartbeats flow several times a second) before it counts as lost.
    pub stall_timeout: Duration,
}

#[derive(Serialize, Deserialize)]
struct Hello {
    version: u32,
    rank: usize,
    world: usize,
    /// Where the sender listens (workers registering with rank 0).
    addr: Option<SocketAddr>,
    /// Which host the sender runs on (kernel boot id), to check shared-memory reachability.
    host: String,
    /// Whether this connection is the pair's heartbeat connection (TCP transport).
    #[serde(default)]
    control: bool,
}

#[derive(Serialize, Deserialize)]
struct Table {
    addrs: Vec<SocketAddr>,
    transport: Transport,
    shm_path: Option<PathBuf>,
    latency_ns: u64,
    bandwidth: Option<f64>,
    stall_ms: u64,
}

#[derive(Serialize, Deserialize)]
enum Verdict {
    Welcome,
    Refused(String),
}

fn write_frame(peer: usize, s: &mut TcpStream, body: &[u8]) -> Result<()> {
    s.write_all(MAGIC)
        .and_then(|()| s.write_all(&(body.len() as u32).to_le_bytes()))
        .and_then(|()| s.write_all(body))
        .map_err(io(peer, "sending a handshake"))
}

fn read_frame(peer: usize, s: &mut TcpStream) -> Result<Vec<u8>> {
    let mut head = [0u8; 12];
    s.read_exact(&mut head).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            Error::PeerClosed { peer }
        } else {
            io(peer, "receiving a handshake")(e)
        }
    })?;
    if &head[..8] != MAGIC {
        return Err(Error::Handshake(format!(
            "a connection from {} does not speak strata protocol version {PROTOCOL_VERSION}",
            s.peer_addr().map_or("?".into(), |a| a.to_string())
        )));
    }
    let len = u32::from_le_bytes([head[8], head[9], head[10], head[11]]) as usize;
    if len > MAX_HELLO {
        return Err(Error::Handshake(format!(
            "handshake of {len} bytes refused"
        )));
    }
    let mut body = vec![0; len];
    s.read_exact(&mut body)
        .map_err(io(peer, "receiving a handshake"))?;
    Ok(body)
}

fn send_json<T: Serialize>(peer: usize, s: &mut TcpStream, v: &T) -> Result<()> {
    let body = serde_json::to_vec(v).map_err(|e| Error::Handshake(e.to_string()))?;
    write_frame(peer, s, &body)
}

fn recv_json<T: for<'de> Deserialize<'de>>(peer: usize, s: &mut TcpStream) -> Result<T> {
    let body = read_frame(peer, s)?;
    serde_json::from_slice(&body)
        .map_err(|e| Error::Handshake(format!("malformed handshake from rank {peer}: {e}")))
}

/// The kernel's boot id: equal for all processes (and network namespaces) of one host.
fn host_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().to_string())
        .unwrap_or_default()
}

fn accept_until(listener: &TcpListener, deadline: Instant, me: usize) -> Result<TcpStream> {
    listener
        .set_nonblocking(true)
        .map_err(io(me, "configuring the listener"))?;
    loop {
        match listener.accept() {
            Ok((s, _)) => {
                s.set_nonblocking(false)
                    .map_err(io(me, "configuring a connection"))?;
                s.set_read_timeout(Some(Duration::from_secs(10)))
                    .map_err(io(me, "configuring a connection"))?;
                return Ok(s);
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {
                if Instant::now() >= deadline {
                    return Err(Error::Handshake(
                        "timed out waiting for the other ranks to connect".into(),
                    ));
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            Err(e) => return Err(io(me, "accepting a connection")(e)),
        }
    }
}

fn dial_until(addr: SocketAddr, deadline: Instant, peer: usize) -> Result<TcpStream> {
    loop {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
            Ok(s) => {
                s.set_read_timeout(Some(Duration::from_secs(30)))
                    .map_err(io(peer, "configuring a connection"))?;
                return Ok(s);
            }
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(20));
            }
            Err(e) => return Err(io(peer, "connecting")(e)),
        }
    }
}

fn check_hello(h: &Hello, cfg: &MeshConfig) -> std::result::Result<(), String> {
    if h.version != PROTOCOL_VERSION {
        return Err(format!(
            "protocol version {} does not match {PROTOCOL_VERSION}",
            h.version
        ));
    }
    if h.world != cfg.world {
        return Err(format!(
            "world size {} does not match {}",
            h.world, cfg.world
        ));
    }
    if h.rank == 0 || h.rank >= cfg.world {
        return Err(format!("rank {} is outside 1..{}", h.rank, cfg.world));
    }
    Ok(())
}

/// Bytes of a challenge or nonce.
const NONCE: usize = 32;
/// Bytes of a handshake MAC.
const MAC: usize = 32;

/// HMAC-SHA-256 of `parts` under the session token.
fn mac(token: &str, parts: &[&[u8]]) -> [u8; MAC] {
    use hmac::Mac as _;
    let mut m = <hmac::Hmac<sha2::Sha256>>::new_from_slice(token.as_bytes())
        .expect("HMAC takes any key length");
    for p in parts {
        m.update(&(p.len() as u64).to_le_bytes());
        m.update(p);
    }
    m.finalize().into_bytes().into()
}

/// The nonces of one handshake: the acceptor's challenge and the dialer's nonce.
struct Nonces {
    challenge: [u8; NONCE],
    dialer: [u8; NONCE],
}

/// Acceptor: sends a challenge, then reads the dialer's hello and checks its proof of the token
/// before parsing it. A connection that fails gets a (plain) refusal and is dropped.
fn accept_hello(s: &mut TcpStream, cfg: &MeshConfig) -> std::result::Result<(Hello, Nonces), ()> {
    let challenge: [u8; NONCE] = rand::random();
    write_frame(usize::MAX, s, &challenge).map_err(|_| ())?;
    let frame = read_frame(usize::MAX, s).map_err(|_| ())?;
    if frame.len() < MAC + NONCE {
        return Err(());
    }
    let (proof, rest) = frame.split_at(MAC);
    let (nonce, body) = rest.split_at(NONCE);
    let expected = mac(&cfg.token, &[b"strata dial", &challenge, nonce, body]);
    if !same_secret(proof, &expected) {
        let _ = send_answer(
            s,
            cfg,
            None,
            &Verdict::Refused("wrong session token".into()),
        );
        return Err(());
    }
    let hello: Hello = serde_json::from_slice(body).map_err(|_| ())?;
    let mut dialer = [0u8; NONCE];
    dialer.copy_from_slice(nonce);
    Ok((hello, Nonces { challenge, dialer }))
}

/// Acceptor: the verdict on a hello, with a MAC that proves this side knows the token (none
/// for a dialer that could not prove it either).
fn send_answer(
    s: &mut TcpStream,
    cfg: &MeshConfig,
    nonces: Option<&Nonces>,
    verdict: &Verdict,
) -> Result<()> {
    let body = serde_json::to_vec(verdict).map_err(|e| Error::Handshake(e.to_string()))?;
    let proof = match nonces {
        Some(n) => mac(
            &cfg.token,
            &[b"strata accept", &n.dialer, &n.challenge, &body],
        ),
        None => [0; MAC],
    };
    let mut frame = proof.to_vec();
    frame.extend_from_slice(&body);
    write_frame(usize::MAX, s, &frame)
}

/// Dialer: answers the challenge with `hello` and its proof, then reads the verdict and checks
/// the acceptor's proof before trusting a welcome.
fn dial_hello(s: &mut TcpStream, peer: usize, cfg: &MeshConfig, hello: &Hello) -> Result<()> {
    let challenge = read_frame(peer, s)?;
    if challenge.len() != NONCE {
        return Err(Error::Handshake(format!(
            "rank {peer} sent a malformed challenge"
        )));
    }
    let nonce: [u8; NONCE] = rand::random();
    let body = serde_json::to_vec(hello).map_err(|e| Error::Handshake(e.to_string()))?;
    let mut frame = mac(&cfg.token, &[b"strata dial", &challenge, &nonce, &body]).to_vec();
    frame.extend_from_slice(&nonce);
    frame.extend_from_slice(&body);
    write_frame(peer, s, &frame)?;
    let answer = read_frame(peer, s)?;
    if answer.len() < MAC {
        return Err(Error::Handshake(format!(
            "rank {peer} sent a malformed verdict"
        )));
    }
    let (proof, body) = answer.split_at(MAC);
    let authentic = same_secret(
        proof,
        &mac(&cfg.token, &[b"strata accept", &nonce, &challenge, body]),
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

/// Compares secrets in time that does not depend on where they differ.
fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// Joins the mesh as rank 0, listening on `listener` (already bound, so a launcher can learn its
/// port before starting the workers).
pub fn coordinate(cfg: &MeshConfig, listener: TcpListener) -> Result<Communicator> {
    let n = cfg.world;
    let deadline = Instant::now() + cfg.join_timeout;
    let mut streams: Vec<Option<TcpStream>> = (0..n).map(|_| None).collect();
    let mut addrs: Vec<Option<SocketAddr>> = vec![None; n];
    addrs[0] = Some(cfg.coordinator);
    let me = host_id();
    let mut joined = 1;
    while joined < n {
        let mut s = accept_until(&listener, deadline, 0)?;
        // A stray or hostile connection is refused and does not stop the bootstrap.
        let Ok((hello, nonces)) = accept_hello(&mut s, cfg) else {
            continue;
        };
        let verdict = check_hello(&hello, cfg).and_then(|()| {
            if streams[hello.rank].is_some() {
                Err(format!("rank {} has already joined", hello.rank))
            } else if cfg.transport == Transport::Shm && hello.host != me {
                Err("the shm transport needs every rank on one host".into())
            } else if hello.addr.is_none() {
                Err("no listening address".into())
            } else {
                Ok(())
            }
        });
        match verdict {
            Ok(()) => {
                send_answer(&mut s, cfg, Some(&nonces), &Verdict::Welcome)?;
                addrs[hello.rank] = hello.addr;
                streams[hello.rank] = Some(s);
                joined += 1;
            }
            Err(why) => {
                let _ = send_answer(&mut s, cfg, Some(&nonces), &Verdict::Refused(why));
            }
        }
    }
    let addrs: Vec<SocketAddr> = addrs.into_iter().flatten().collect();

    let shm = match cfg.transport {
        Transport::Shm => Some(create_region(n)?),
        Transport::Tcp => None,
    };
    let table = Table {
        addrs,
        transport: cfg.transport,
        shm_path: shm.as_ref().map(|(p, _)| p.clone()),
        latency_ns: cfg.shape.latency.as_nanos() as u64,
        bandwidth: cfg.shape.bandwidth,
        stall_ms: cfg.stall_timeout.as_millis() as u64,
    };
    let mut controls: Vec<Option<TcpStream>> = (0..n).map(|_| None).collect();
    let result = (|| {
        for (r, s) in streams.iter_mut().enumerate().skip(1) {
            if let Some(s) = s {
                send_json(r, s, &table)?;
            }
        }
        if cfg.transport == Transport::Tcp {
            while controls.iter().skip(1).any(Option::is_none) {
                let mut s = accept_until(&listener, deadline, 0)?;
                let Ok((h, nonces)) = accept_hello(&mut s, cfg) else {
                    continue;
                };
                let verdict = check_hello(&h, cfg).and_then(|()| {
                    if !h.control || controls[h.rank].is_some() {
                        Err(format!("unexpected connection from rank {}", h.rank))
                    } else {
                        Ok(())
                    }
                });
                match verdict {
                    Ok(()) => {
                        send_answer(&mut s, cfg, Some(&nonces), &Verdict::Welcome)?;
                        controls[h.rank] = Some(s);
                    }
                    Err(why) => {
                        let _ = send_answer(&mut s, cfg, Some(&nonces), &Verdict::Refused(why));
                    }
                }
            }
        }
        // Each worker reports once its links (and its map of the region) are up.
        for (r, s) in streams.iter_mut().enumerate().skip(1) {
            if let Some(s) = s {
                match recv_json::<Verdict>(r, s)? {
                    Verdict::Welcome => {}
                    Verdict::Refused(why) => {
                        return Err(Error::Handshake(format!("rank {r}: {why}")));
                    }
                }
            }
        }
        Ok(())
    })();
    let region = shm.map(|(path, file)| {
        let _ = std::fs::remove_file(&path);
        file
    });
    result?;
    let region = match &region {
        Some(file) => Some(ShmRegion::map(file, n, SHM_RING_BYTES, 0)?),
        None => None,
    };
    for (r, s) in streams.iter_mut().enumerate().skip(1) {
        if let Some(s) = s {
            send_json(r, s, &Verdict::Welcome)?;
        }
    }
    finish(
        cfg,
        0,
        streams,
        controls,
        region.as_ref(),
        cfg.shape,
        cfg.stall_timeout,
    )
}

/// Creates the shared-memory region's file. Its name is the process id and a random id only:
/// `/dev/shm` is listed by every local user, so nothing of the session token goes into it.
fn create_region(world: usize) -> Result<(PathBuf, std::fs::File)> {
    let dir = if std::path::Path::new("/dev/shm").is_dir() {
        PathBuf::from("/dev/shm")
    } else {
        std::env::temp_dir()
    };
    let nonce: u64 = rand::random();
    let path = dir.join(format!("strata-{}-{nonce:016x}", std::process::id()));
    // Owner-only: the rings carry activations (and so, indirectly, prompts).
    use std::os::unix::fs::OpenOptionsExt;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&path)
        .map_err(io(0, "creating the shared-memory region"))?;
    file.set_len(ShmRegion::size(world, SHM_RING_BYTES) as u64)
        .map_err(io(0, "sizing the shared-memory region"))?;
    Ok((path, file))
}

/// Joins the mesh as a worker (rank >= 1).
pub fn join(cfg: &MeshConfig) -> Result<Communicator> {
    let (me, n) = (cfg.rank, cfg.world);
    if me == 0 || me >= n {
        return Err(Error::Handshake(format!("rank {me} is outside 1..{n}")));
    }
    let deadline = Instant::now() + cfg.join_timeout;
    let mut to_root = dial_until(cfg.coordinator, deadline, 0)?;
    let listen = match cfg.listen {
        Some(a) => a,
        None => {
            let local = to_root.local_addr().map_err(io(me, "reading an address"))?;
            SocketAddr::new(local.ip(), 0)
        }
    };
    let listener = TcpListener::bind(listen).map_err(io(me, "binding the peer listener"))?;
    let mut addr = listener
        .local_addr()
        .map_err(io(me, "reading an address"))?;
    if addr.ip().is_unspecified() {
        let local = to_root.local_addr().map_err(io(me, "reading an address"))?;
        addr.set_ip(local.ip());
    }
    dial_hello(
        &mut to_root,
        0,
        cfg,
        &Hello {
            version: PROTOCOL_VERSION,
            rank: me,
            world: n,
            addr: Some(addr),
            host: host_id(),
            control: false,
        },
    )?;
    let table: Table = recv_json(0, &mut to_root)?;
    if table.addrs.len() != n {
        return Err(Error::Handshake("the rank table has the wrong size".into()));
    }
    let mut streams: Vec<Option<TcpStream>> = (0..n).map(|_| None).collect();
    streams[0] = Some(to_root);
    let tcp = table.transport == Transport::Tcp;
    let mut controls: Vec<Option<TcpStream>> = (0..n).map(|_| None).collect();
    let setup = (|| {
        let dial = |j: usize, control: bool| -> Result<TcpStream> {
            let mut s = dial_until(table.addrs[j], deadline, j)?;
            dial_hello(
                &mut s,
                j,
                cfg,
                &Hello {
                    version: PROTOCOL_VERSION,
                    rank: me,
                    world: n,
                    addr: None,
                    host: host_id(),
                    control,
                },
            )?;
            Ok(s)
        };
        for (j, slot) in streams.iter_mut().enumerate().take(me).skip(1) {
            *slot = Some(dial(j, false)?);
        }
        if tcp {
            for (j, c) in controls.iter_mut().enumerate().take(me) {
                *c = Some(dial(j, true)?);
            }
        }
        let missing = |streams: &[Option<TcpStream>], controls: &[Option<TcpStream>]| {
            streams.iter().skip(me + 1).any(Option::is_none)
                || (tcp && controls.iter().skip(me + 1).any(Option::is_none))
        };
        while missing(&streams, &controls) {
            let mut s = accept_until(&listener, deadline, me)?;
            let Ok((h, nonces)) = accept_hello(&mut s, cfg) else {
                continue;
            };
            let verdict = check_hello(&h, cfg).and_then(|()| {
                let taken = if h.control {
                    !tcp || controls[h.rank].is_some()
                } else {
                    streams[h.rank].is_some()
                };
                if h.rank <= me || taken {
                    Err(format!("rank {} may not dial rank {me}", h.rank))
                } else {
                    Ok(())
                }
            });
            match verdict {
                Ok(()) => {
                    send_answer(&mut s, cfg, Some(&nonces), &Verdict::Welcome)?;
                    if h.control {
                        controls[h.rank] = Some(s);
                    } else {
                        streams[h.rank] = Some(s);
                    }
                }
                Err(why) => {
                    let _ = send_answer(&mut s, cfg, Some(&nonces), &Verdict::Refused(why));
                }
            }
        }
        let region = match (&table.transport, &table.shm_path) {
            (Transport::Shm, Some(path)) => {
                let file = std::fs::OpenOptions::new()
                    .read(true)
                    .write(true)
                    .open(path)
                    .map_err(io(0, "opening the shared-memory region"))?;
                Some(ShmRegion::map(&file, n, SHM_RING_BYTES, me)?)
            }
            (Transport::Shm, None) => {
                return Err(Error::Handshake("shm transport without a region".into()));
            }
            (Transport::Tcp, _) => None,
        };
        Ok(region)
    })();
    let root = streams[0].as_mut().ok_or(Error::PeerClosed { peer: 0 })?;
    let region = match setup {
        Ok(r) => {
            send_json(0, root, &Verdict::Welcome)?;
            r
        }
        Err(e) => {
            let _ = send_json(0, root, &Verdict::Refused(e.to_string()));
            return Err(e);
        }
    };
    match recv_json::<Verdict>(0, root)? {
        Verdict::Welcome => {}
        Verdict::Refused(why) => return Err(Error::Handshake(why)),
    }
    let shape = LinkShape {
        latency: Duration::from_nanos(table.latency_ns),
        bandwidth: table.bandwidth,
    };
    let stall = Duration::from_millis(table.stall_ms.max(1));
    finish(cfg, me, streams, controls, region.as_ref(), shape, stall)
}

fn finish(
    cfg: &MeshConfig,
    me: usize,
    streams: Vec<Option<TcpStream>>,
    controls: Vec<Option<TcpStream>>,
    region: Option<&Arc<ShmRegion>>,
    shape: LinkShape,
    stall: Duration,
) -> Result<Communicator> {
    let mut links: Vec<Option<Box<dyn Link>>> = Vec::with_capacity(cfg.world);
    for (peer, (s, c)) in streams.into_iter().zip(controls).enumerate() {
        let link: Option<Box<dyn Link>> = match (s, c, region) {
            (None, _, _) => None,
            // On shared memory the bootstrap connection carries the heartbeats.
            (Some(s), _, Some(region)) => Some(Box::new(ShmLink::new(
                region,
                me,
                peer,
                Control::new(peer, s)?,
            )?)),
            (Some(s), Some(c), None) => {
                s.set_read_timeout(None)
                    .map_err(io(peer, "configuring a connection"))?;
                Some(Box::new(TcpLink::new(peer, s, Control::new(peer, c)?)?))
            }
            (Some(_), None, None) => {
                return Err(Error::Handshake(format!(
                    "no heartbeat connection to rank {peer}"
                )));
            }
        };
        links.push(link);
    }
    let mut comm = Communicator::new(me, cfg.world, links, shape, stall);
    comm.start_heartbeat();
    Ok(comm)
}

/// A random session token (128 bits, hex).
pub fn new_token() -> String {
    let a: u128 = rand::random();
    format!("{a:032x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_region_file_is_owner_only_and_named_without_secrets() {
        use std::os::unix::fs::PermissionsExt;
        let (path, file) = create_region(2).expect("region");
        let mode = file.metadata().expect("metadata").permissions().mode();
        let _ = std::fs::remove_file(&path);
        assert_eq!(mode & 0o777, 0o600);
        // `strata-PID-RANDOM`: a listing of the directory tells nothing of the session.
        let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
        let parts: Vec<&str> = name.split('-').collect();
        assert_eq!(parts.len(), 3, "{name}");
        assert_eq!(parts[1], std::process::id().to_string());
        assert_eq!(parts[2].len(), 16, "{name}");
        let (other, _) = create_region(2).expect("region");
        let _ = std::fs::remove_file(&other);
        assert_ne!(other, path, "every region gets its own random id");
    }

    #[test]
    fn secrets_compare_whole() {
        assert!(same_secret(b"abc", b"abc"));
        assert!(!same_secret(b"abc", b"abd"));
        assert!(!same_secret(b"abc", b"ab"));
    }
}
