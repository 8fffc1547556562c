//! Building the mesh: every rank knows rank 0's address (the coordinator); workers register
//! there with the address of their own listener, rank 0 answers with the full rank table, and
//! then each pair of ranks connects directly (rank i dials every rank below it). With the
//! shared-memory transport, rank 0 also creates one region of rings under `/dev/shm` (see
//! [`crate::shm_place`] for macOS), every rank
//! maps it, and rank 0 removes its name once all have: nothing is left behind even if a process
//! is killed later. The TCP connections stay open beside the rings so a dead peer is noticed.
//!
//! Every connection starts with the handshake of [`crate::handshake`] (a mutual proof of the
//! session token and an ephemeral key exchange); everything after it is sealed
//! ([`crate::seal`]). A process that does not know the token, speaks another protocol version,
//! or claims a rank that is taken is turned away with a clear error on both sides. Handshakes
//! run concurrently, each within a few seconds, so connections that never complete one (a
//! stranger holding the port open) cannot stop the ranks from meeting.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use serde::{Deserialize, Serialize};

use crate::comm::KeyedLink;
use crate::error::io;
use crate::handshake::{
    self, FRAME_HEAD, Hello, MAGIC, MAX_HELLO, PROTOCOL_VERSION, Role, Shares, Table, Verdict,
};
use crate::link::{Control, ShmLink, ShmRegion, TcpLink};
use crate::seal::{SEALED_HEADER, SessionKeys, TAG};
use crate::{Communicator, Error, LinkShape, Result};

/// Bytes of each shared-memory ring.
pub const SHM_RING_BYTES: usize = 4 << 20;
/// How long an accepted connection may take to complete its side of the handshake (send a
/// proven hello). A legitimate rank needs a round trip; a silent or dripping stranger is
/// dropped after this, and never holds up the ranks that do answer (each handshake runs on
/// its own thread).
const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);
/// Most handshakes in progress at once on one listener. Beyond this a new connection is
/// closed at once (a legitimate dialer retries), so a flood costs a bounded number of threads.
const MAX_PENDING: usize = 64;
/// How long a bootstrap message between ranks that have completed their handshake may take.
const BOOTSTRAP_READ: Duration = Duration::from_secs(30);

/// How ranks exchange data.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Transport {
    /// TCP connections (any hosts).
    Tcp,
    /// Shared-memory rings (ranks on one host), with TCP alongside to notice dead peers.
    Shm,
    /// Rank 0 only: shared memory when every rank turns out to share this host's `/dev/shm`
    /// as the same user, TCP otherwise. Ranks on one host then skip the kernel's TCP stack,
    /// which on a loaded machine costs each message more than the link itself.
    Auto,
}

impl Transport {
    /// The transport a mesh uses: `Auto` settled by whether every rank shares rank 0's host.
    fn settle(self, one_host: bool) -> Transport {
        match self {
            Transport::Auto if one_host => Transport::Shm,
            Transport::Auto => Transport::Tcp,
            t => t,
        }
    }
}

impl std::str::FromStr for Transport {
    type Err = Error;
    fn from_str(s: &str) -> Result<Transport> {
        match s {
            "tcp" => Ok(Transport::Tcp),
            "shm" => Ok(Transport::Shm),
            "auto" => Ok(Transport::Auto),
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
    /// Rank 0 only (workers learn it, sealed): send the data plane's messages in the clear,
    /// unauthenticated. Only for measuring what the protection costs; never a default. The
    /// handshake and the bootstrap messages are protected either way.
    pub insecure_plaintext: bool,
}

/// Whether frames over shared memory are sealed like those over TCP.
///
/// The rings live in an owner-only file under `/dev/shm`, so only processes of the same user
/// reach them; on a plain host those can also read the ranks' memory, and sealing would not
/// keep them out. But containers of one user that share `/dev/shm` (`--ipc=host`) reach the
/// file without reaching each other's memory, and sealing costs little next to a decode step
/// (see README's scaling table), so shared memory is protected the same way as TCP.
const SEAL_SHM: bool = true;

fn write_frame(peer: usize, s: &mut TcpStream, body: &[u8]) -> Result<()> {
    let mut frame = Vec::with_capacity(FRAME_HEAD + body.len());
    frame.extend_from_slice(MAGIC);
    frame.extend_from_slice(&(body.len() as u32).to_le_bytes());
    frame.extend_from_slice(body);
    s.write_all(&frame).map_err(io(peer, "sending a handshake"))
}

/// Fills `buf` from `s`, giving up at `deadline` however the bytes trickle in (a read timeout
/// alone would let a peer that sends a byte now and then hold the connection forever).
fn read_exact_by(
    s: &mut TcpStream,
    mut buf: &mut [u8],
    deadline: Option<Instant>,
) -> std::io::Result<()> {
    while !buf.is_empty() {
        if let Some(d) = deadline {
            let left = d.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return Err(std::io::ErrorKind::TimedOut.into());
            }
            s.set_read_timeout(Some(left))?;
        }
        match s.read(buf) {
            Ok(0) => return Err(std::io::ErrorKind::UnexpectedEof.into()),
            Ok(n) => buf = &mut buf[n..],
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn read_err(peer: usize, what: &'static str) -> impl FnOnce(std::io::Error) -> Error {
    move |e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            Error::PeerClosed { peer }
        } else {
            io(peer, what)(e)
        }
    }
}

fn read_frame(peer: usize, s: &mut TcpStream, deadline: Option<Instant>) -> Result<Vec<u8>> {
    let mut head = [0u8; FRAME_HEAD];
    read_exact_by(s, &mut head, deadline).map_err(read_err(peer, "receiving a handshake"))?;
    let len = handshake::parse_frame_head(&head)?;
    let mut body = vec![0; len];
    read_exact_by(s, &mut body, deadline).map_err(read_err(peer, "receiving a handshake"))?;
    Ok(body)
}

/// A connection whose handshake is complete: everything on it from now on is sealed.
struct Conn {
    stream: TcpStream,
    keys: SessionKeys,
}

impl Conn {
    fn send<T: Serialize>(&mut self, peer: usize, v: &T) -> Result<()> {
        let body = serde_json::to_vec(v).map_err(|e| Error::Handshake(e.to_string()))?;
        let mut wire = Vec::with_capacity(SEALED_HEADER + body.len() + TAG);
        self.keys.seal_message(peer, &body, &mut wire)?;
        self.stream
            .write_all(&wire)
            .map_err(io(peer, "sending a bootstrap message"))
    }

    fn recv<T: for<'de> Deserialize<'de>>(&mut self, peer: usize) -> Result<T> {
        let what = "receiving a bootstrap message";
        let deadline = Some(Instant::now() + BOOTSTRAP_READ);
        let mut head = [0u8; SEALED_HEADER];
        read_exact_by(&mut self.stream, &mut head, deadline).map_err(read_err(peer, what))?;
        let h = self.keys.rx.open_header(peer, &head)?;
        if h.len > MAX_HELLO {
            return Err(Error::Oversized {
                peer,
                len: h.len as u64,
                max: MAX_HELLO,
            });
        }
        let mut body = vec![0; h.len + TAG];
        read_exact_by(&mut self.stream, &mut body, deadline).map_err(read_err(peer, what))?;
        let plain = self.keys.rx.open(peer, &mut body)?;
        serde_json::from_slice(plain).map_err(|e| {
            Error::Handshake(format!("malformed bootstrap message from rank {peer}: {e}"))
        })
    }
}

/// Which shared memory this process reaches, as whom: the kernel's boot id (equal for all
/// processes and network namespaces of one host), the device and inode of the directory
/// regions go in (containers of one host that each mount their own `/dev/shm` differ here),
/// and the effective user (a region is owner-only). Two ranks with equal ids can share a
/// region; empty when the boot id cannot be read, which never matches for `Auto`.
///
/// The hello carrying it is authenticated but not encrypted, so it goes as an HMAC under the
/// session token: equal for ranks of one session on one host, and telling an onlooker nothing
/// about the host, its user or other sessions.
fn host_id(token: &str) -> String {
    use std::os::unix::fs::MetadataExt;
    let Some(boot) = crate::shm_place::boot_id() else {
        return String::new();
    };
    let Ok(dir) = std::fs::metadata(crate::shm_place::shm_dir()) else {
        return String::new();
    };
    // SAFETY: geteuid has no preconditions and cannot fail.
    let uid = unsafe { libc::geteuid() };
    let raw = format!("{boot}/{}:{}/{uid}", dir.dev(), dir.ino());
    handshake::mac(token, &[b"strata host", raw.as_bytes()])
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

/// A connection whose dialer proved the token; the acceptor's verdict is still to be sent.
struct Accepted {
    conn: Conn,
    hello: Hello,
    shares: Shares,
}

/// Connections arriving on a listener, each handshaken on a thread of its own, so that
/// connections which never complete their hello (strangers, port scanners, a hostile peer)
/// cannot delay the ranks that do. Only connections that prove the token come out of
/// [`Incoming::next`]; the rest are dropped with a line on standard error and never take a
/// rank's place.
struct Incoming<'a> {
    listener: &'a TcpListener,
    me: usize,
    token: Arc<str>,
    done_tx: mpsc::Sender<Accepted>,
    done: mpsc::Receiver<Accepted>,
    pending: Arc<AtomicUsize>,
}

impl<'a> Incoming<'a> {
    fn new(listener: &'a TcpListener, me: usize, token: &str) -> Result<Incoming<'a>> {
        listener
            .set_nonblocking(true)
            .map_err(io(me, "configuring the listener"))?;
        let (done_tx, done) = mpsc::channel();
        Ok(Incoming {
            listener,
            me,
            token: token.into(),
            done_tx,
            done,
            pending: Arc::new(AtomicUsize::new(0)),
        })
    }

    /// The next connection that proved the token.
    fn next(&mut self, deadline: Instant) -> Result<Accepted> {
        loop {
            loop {
                match self.listener.accept() {
                    Ok((s, from)) => self.start(s, from),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break,
                    Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
                    // A connection reset before it was accepted, or out of descriptors for a
                    // moment: neither stops the bootstrap.
                    Err(e) => {
                        tracing::warn!(rank = self.me, "accepting a connection: {e}");
                        break;
                    }
                }
            }
            match self.done.recv_timeout(Duration::from_millis(2)) {
                Ok(a) => return Ok(a),
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    unreachable!("this side holds a sender")
                }
            }
            if Instant::now() >= deadline {
                return Err(Error::Handshake(
                    "timed out waiting for the other ranks to connect".into(),
                ));
            }
        }
    }

    fn start(&self, s: TcpStream, from: SocketAddr) {
        let me = self.me;
        if self.pending.fetch_add(1, Ordering::AcqRel) >= MAX_PENDING {
            self.pending.fetch_sub(1, Ordering::AcqRel);
            tracing::warn!(
                rank = me,
                %from,
                "closed a connection: {MAX_PENDING} handshakes are already in progress"
            );
            return;
        }
        let (token, tx, pending) = (
            Arc::clone(&self.token),
            self.done_tx.clone(),
            Arc::clone(&self.pending),
        );
        let spawned = std::thread::Builder::new()
            .name("strata-handshake".into())
            .stack_size(256 << 10)
            .spawn(move || {
                let result = accept_handshake(s, &token);
                pending.fetch_sub(1, Ordering::AcqRel);
                match result {
                    // After the bootstrap nobody listens any more; the connection just closes.
                    Ok(a) => drop(tx.send(a)),
                    Err(e) => tracing::warn!(rank = me, %from, "refused a connection: {e}"),
                }
            });
        if let Err(e) = spawned {
            self.pending.fetch_sub(1, Ordering::AcqRel);
            tracing::warn!(rank = me, %from, "closed a connection: {e}");
        }
    }
}

/// Acceptor's side of one handshake, within [`HANDSHAKE_TIMEOUT`]: sends a share, checks the
/// dialer's proof, derives the keys. A dialer that fails the proof gets a (plain) refusal. The
/// error says, for the log, why the connection was dropped.
fn accept_handshake(mut s: TcpStream, token: &str) -> std::result::Result<Accepted, String> {
    // The dialer has no rank yet: errors name what went wrong instead.
    let peer = usize::MAX;
    let why = |e: Error| match e {
        Error::Handshake(w) => w,
        Error::PeerClosed { .. } => "it closed the connection before its hello".into(),
        Error::Io { source, .. }
            if matches!(
                source.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            format!("no hello within {HANDSHAKE_TIMEOUT:?}")
        }
        Error::Io { what, source, .. } => format!("{what}: {source}"),
        other => other.to_string(),
    };
    let deadline = Instant::now() + HANDSHAKE_TIMEOUT;
    s.set_nonblocking(false)
        .and_then(|()| s.set_write_timeout(Some(HANDSHAKE_TIMEOUT)))
        .map_err(|e| format!("configuring the connection: {e}"))?;
    let (secret, acceptor) = handshake::new_share().map_err(why)?;
    write_frame(peer, &mut s, &acceptor).map_err(why)?;
    let frame = read_frame(peer, &mut s, Some(deadline)).map_err(why)?;
    let (hello, dialer) = match handshake::decode_dial(token, &acceptor, &frame) {
        Ok(x) => x,
        Err(e) => {
            let why = why(e);
            if let Ok(v) = handshake::encode_verdict(token, None, &Verdict::Refused(why.clone())) {
                let _ = write_frame(peer, &mut s, &v);
            }
            return Err(why);
        }
    };
    let shares = Shares { acceptor, dialer };
    let shared = handshake::agree(secret, &dialer).map_err(why)?;
    let keys = handshake::derive_keys(token, &shared, &shares, Role::Acceptor).map_err(why)?;
    s.set_read_timeout(Some(BOOTSTRAP_READ))
        .map_err(|e| format!("configuring the connection: {e}"))?;
    Ok(Accepted {
        conn: Conn { stream: s, keys },
        hello,
        shares,
    })
}

/// Acceptor: sends the verdict on an accepted hello; the connection is kept on a welcome.
fn answer(
    a: Accepted,
    token: &str,
    verdict: std::result::Result<(), String>,
) -> Result<Option<Conn>> {
    let mut a = a;
    let peer = a.hello.rank;
    match verdict {
        Ok(()) => {
            let v = handshake::encode_verdict(token, Some(&a.shares), &Verdict::Welcome)?;
            write_frame(peer, &mut a.conn.stream, &v)?;
            Ok(Some(a.conn))
        }
        Err(why) => {
            let v = handshake::encode_verdict(token, Some(&a.shares), &Verdict::Refused(why))?;
            let _ = write_frame(peer, &mut a.conn.stream, &v);
            Ok(None)
        }
    }
}

fn dial_until(addr: SocketAddr, deadline: Instant, peer: usize) -> Result<TcpStream> {
    loop {
        match TcpStream::connect_timeout(&addr, Duration::from_secs(1)) {
            Ok(s) => {
                s.set_read_timeout(Some(BOOTSTRAP_READ))
                    .and_then(|()| s.set_write_timeout(Some(BOOTSTRAP_READ)))
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

/// Dialer: connects to `peer` at `addr`, answers its challenge with `hello` and a proof of the
/// token, checks the acceptor's proof and derives the keys. A connection closed before its
/// challenge arrives (an acceptor with too many handshakes in progress) is retried until the
/// deadline. `first` is a connection to `addr` already made.
fn dial(
    addr: SocketAddr,
    deadline: Instant,
    peer: usize,
    token: &str,
    hello: &Hello,
    mut first: Option<TcpStream>,
) -> Result<Conn> {
    let (mut s, acceptor) = loop {
        let mut s = match first.take() {
            Some(s) => s,
            None => dial_until(addr, deadline, peer)?,
        };
        match read_frame(peer, &mut s, None) {
            Ok(body) => break (s, handshake::decode_challenge(peer, &body)?),
            Err(Error::PeerClosed { .. }) if Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(50));
            }
            Err(e) => return Err(e),
        }
    };
    let (secret, dialer) = handshake::new_share()?;
    let shares = Shares { acceptor, dialer };
    write_frame(
        peer,
        &mut s,
        &handshake::encode_dial(token, &shares, hello)?,
    )?;
    let verdict = read_frame(peer, &mut s, None)?;
    handshake::decode_verdict(peer, token, &shares, &verdict)?;
    let shared = handshake::agree(secret, &acceptor)?;
    let keys = handshake::derive_keys(token, &shared, &shares, Role::Dialer)?;
    Ok(Conn { stream: s, keys })
}

/// Joins the mesh as rank 0, listening on `listener` (already bound, so a launcher can learn its
/// port before starting the workers).
pub fn coordinate(cfg: &MeshConfig, listener: TcpListener) -> Result<Communicator> {
    let n = cfg.world;
    let deadline = Instant::now() + cfg.join_timeout;
    let mut incoming = Incoming::new(&listener, 0, &cfg.token)?;
    let mut streams: Vec<Option<Conn>> = (0..n).map(|_| None).collect();
    let mut addrs: Vec<Option<SocketAddr>> = vec![None; n];
    addrs[0] = Some(cfg.coordinator);
    let me = host_id(&cfg.token);
    // Whether every rank so far reaches this host's shared memory (for `Transport::Auto`).
    let mut one_host = !me.is_empty();
    let mut joined = 1;
    while joined < n {
        let a = incoming.next(deadline)?;
        let hello = a.hello.clone();
        let verdict = handshake::check_hello(&hello, n).and_then(|()| {
            if hello.control {
                Err(format!(
                    "rank {} sent a heartbeat connection before joining",
                    hello.rank
                ))
            } else if streams[hello.rank].is_some() {
                Err(format!("rank {} has already joined", hello.rank))
            } else if cfg.transport == Transport::Shm && hello.host != me {
                Err("the shm transport needs every rank on one host, sharing /dev/shm as the same user".into())
            } else if hello.addr.is_none() {
                Err("no listening address".into())
            } else {
                Ok(())
            }
        });
        if let Some(conn) = answer(a, &cfg.token, verdict)? {
            addrs[hello.rank] = hello.addr;
            streams[hello.rank] = Some(conn);
            one_host &= hello.host == me;
            joined += 1;
        }
    }
    let addrs: Vec<SocketAddr> = addrs.into_iter().flatten().collect();

    let transport = cfg.transport.settle(one_host);
    let shm = match transport {
        Transport::Shm => Some(create_region(n)?),
        Transport::Tcp | Transport::Auto => None,
    };
    let table = Table {
        addrs,
        transport,
        shm_path: shm.as_ref().map(|(p, _)| p.clone()),
        latency_ns: cfg.shape.latency.as_nanos() as u64,
        bandwidth: cfg.shape.bandwidth,
        stall_ms: cfg.stall_timeout.as_millis() as u64,
        plaintext: cfg.insecure_plaintext,
    };
    let mut controls: Vec<Option<TcpStream>> = (0..n).map(|_| None).collect();
    let result = (|| {
        for (r, s) in streams.iter_mut().enumerate().skip(1) {
            if let Some(s) = s {
                s.send(r, &table)?;
            }
        }
        if transport == Transport::Tcp {
            while controls.iter().skip(1).any(Option::is_none) {
                let a = incoming.next(deadline)?;
                let h = a.hello.clone();
                let verdict = handshake::check_hello(&h, n).and_then(|()| {
                    if !h.control || controls[h.rank].is_some() {
                        Err(format!("unexpected connection from rank {}", h.rank))
                    } else {
                        Ok(())
                    }
                });
                if let Some(conn) = answer(a, &cfg.token, verdict)? {
                    controls[h.rank] = Some(conn.stream);
                }
            }
        }
        // Each worker reports once its links (and its map of the region) are up.
        for (r, s) in streams.iter_mut().enumerate().skip(1) {
            if let Some(s) = s {
                match s.recv::<Verdict>(r)? {
                    Verdict::Welcome => {}
                    Verdict::Refused(why) => {
                        return Err(Error::Handshake(format!("rank {r}: {why}")));
                    }
                }
            }
        }
        Ok(())
    })();
    drop(incoming);
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
            s.send(r, &Verdict::Welcome)?;
        }
    }
    let links = Links {
        me: 0,
        streams,
        controls,
        region: region.as_ref(),
        plaintext: cfg.insecure_plaintext,
    };
    finish(cfg, links, cfg.shape, cfg.stall_timeout)
}

/// Creates the shared-memory region's file. Its name is the process id and a random id only:
/// `/dev/shm` is listed by every local user, so nothing of the session token goes into it.
fn create_region(world: usize) -> Result<(PathBuf, std::fs::File)> {
    let dir = crate::shm_place::shm_dir();
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
    // The listener's address goes into the hello; bind it on the interface that reaches rank 0.
    let first = dial_until(cfg.coordinator, deadline, 0)?;
    let local = first.local_addr().map_err(io(me, "reading an address"))?;
    let listen = cfg.listen.unwrap_or(SocketAddr::new(local.ip(), 0));
    let listener = TcpListener::bind(listen).map_err(io(me, "binding the peer listener"))?;
    let mut addr = listener
        .local_addr()
        .map_err(io(me, "reading an address"))?;
    if addr.ip().is_unspecified() {
        addr.set_ip(local.ip());
    }
    let hello = |addr: Option<SocketAddr>, control: bool| Hello {
        version: PROTOCOL_VERSION,
        rank: me,
        world: n,
        addr,
        host: host_id(&cfg.token),
        control,
    };
    let mut to_root = dial(
        cfg.coordinator,
        deadline,
        0,
        &cfg.token,
        &hello(Some(addr), false),
        Some(first),
    )?;
    let table: Table = to_root.recv(0)?;
    if table.addrs.len() != n {
        return Err(Error::Handshake("the rank table has the wrong size".into()));
    }
    let mut streams: Vec<Option<Conn>> = (0..n).map(|_| None).collect();
    streams[0] = Some(to_root);
    let tcp = table.transport == Transport::Tcp;
    let mut controls: Vec<Option<TcpStream>> = (0..n).map(|_| None).collect();
    let setup = (|| {
        let mut incoming = Incoming::new(&listener, me, &cfg.token)?;
        for (j, slot) in streams.iter_mut().enumerate().take(me).skip(1) {
            *slot = Some(dial(
                table.addrs[j],
                deadline,
                j,
                &cfg.token,
                &hello(None, false),
                None,
            )?);
        }
        if tcp {
            for (j, c) in controls.iter_mut().enumerate().take(me) {
                let conn = dial(
                    table.addrs[j],
                    deadline,
                    j,
                    &cfg.token,
                    &hello(None, true),
                    None,
                )?;
                *c = Some(conn.stream);
            }
        }
        let missing = |streams: &[Option<Conn>], controls: &[Option<TcpStream>]| {
            streams.iter().skip(me + 1).any(Option::is_none)
                || (tcp && controls.iter().skip(me + 1).any(Option::is_none))
        };
        while missing(&streams, &controls) {
            let a = incoming.next(deadline)?;
            let h = a.hello.clone();
            let verdict = handshake::check_hello(&h, n).and_then(|()| {
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
            if let Some(conn) = answer(a, &cfg.token, verdict)? {
                if h.control {
                    controls[h.rank] = Some(conn.stream);
                } else {
                    streams[h.rank] = Some(conn);
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
            (Transport::Auto, _) => {
                return Err(Error::Handshake(
                    "rank 0 sent a transport it had not settled".into(),
                ));
            }
        };
        Ok(region)
    })();
    let root = streams[0].as_mut().ok_or(Error::PeerClosed { peer: 0 })?;
    let region = match setup {
        Ok(r) => {
            root.send(0, &Verdict::Welcome)?;
            r
        }
        Err(e) => {
            let _ = root.send(0, &Verdict::Refused(e.to_string()));
            return Err(e);
        }
    };
    match root.recv::<Verdict>(0)? {
        Verdict::Welcome => {}
        Verdict::Refused(why) => return Err(Error::Handshake(why)),
    }
    let shape = LinkShape {
        latency: Duration::from_nanos(table.latency_ns),
        bandwidth: table.bandwidth,
    };
    let stall = Duration::from_millis(table.stall_ms.max(1));
    let links = Links {
        me,
        streams,
        controls,
        region: region.as_ref(),
        plaintext: table.plaintext,
    };
    finish(cfg, links, shape, stall)
}

/// What the bootstrap leaves for the communicator.
struct Links<'a> {
    me: usize,
    streams: Vec<Option<Conn>>,
    controls: Vec<Option<TcpStream>>,
    region: Option<&'a Arc<ShmRegion>>,
    plaintext: bool,
}

fn finish(
    cfg: &MeshConfig,
    l: Links<'_>,
    shape: LinkShape,
    stall: Duration,
) -> Result<Communicator> {
    let me = l.me;
    let mut links: Vec<Option<KeyedLink>> = Vec::with_capacity(cfg.world);
    for (peer, (s, c)) in l.streams.into_iter().zip(l.controls).enumerate() {
        let link: Option<KeyedLink> = match (s, c, l.region) {
            (None, _, _) => None,
            // On shared memory the bootstrap connection carries the heartbeats, and its keys
            // (their counters carry on from the bootstrap messages) seal the rings' frames.
            (Some(s), _, Some(region)) => {
                let keys = (SEAL_SHM && !l.plaintext).then_some(s.keys);
                let link = ShmLink::new(region, me, peer, Control::new(peer, s.stream)?)?;
                Some((Box::new(link), keys))
            }
            (Some(s), Some(c), None) => {
                s.stream
                    .set_read_timeout(None)
                    .map_err(io(peer, "configuring a connection"))?;
                let keys = (!l.plaintext).then_some(s.keys);
                let link = TcpLink::new(peer, s.stream, Control::new(peer, c)?)?;
                Some((Box::new(link), keys))
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

/// Two ranks of one mesh in this process, joined over `transport` on loopback: (rank 0,
/// rank 1). For tests and for measuring this machine's own links.
pub fn loopback_pair(transport: Transport) -> Result<(Communicator, Communicator)> {
    let listener = TcpListener::bind("127.0.0.1:0").map_err(io(0, "binding a loopback port"))?;
    let at = listener
        .local_addr()
        .map_err(io(0, "reading the loopback port"))?;
    let token = new_token();
    let config = |rank: usize| MeshConfig {
        rank,
        world: 2,
        coordinator: at,
        listen: None,
        token: token.clone(),
        transport,
        shape: LinkShape::default(),
        join_timeout: Duration::from_secs(30),
        stall_timeout: Duration::from_secs(30),
        insecure_plaintext: false,
    };
    let peer = config(1);
    let joiner = std::thread::spawn(move || join(&peer));
    let first = coordinate(&config(0), listener)?;
    let second = joiner.join().map_err(|_| Error::Protocol {
        peer: 1,
        what: "the joining rank's thread panicked".into(),
    })??;
    Ok((first, second))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn auto_settles_on_shared_memory_only_when_every_rank_shares_the_host() {
        assert_eq!(Transport::Auto.settle(true), Transport::Shm);
        assert_eq!(Transport::Auto.settle(false), Transport::Tcp);
        assert_eq!(Transport::Tcp.settle(true), Transport::Tcp);
        assert_eq!(Transport::Shm.settle(false), Transport::Shm);
        // One process: one host, one /dev/shm, one user; another session's id differs.
        let id = host_id("session a");
        assert_eq!(id.len(), 64, "{id}");
        assert_eq!(host_id("session a"), id);
        assert_ne!(host_id("session b"), id);
        let (mut a, mut b) = loopback_pair(Transport::Auto).expect("pair");
        assert_eq!((a.transport(), b.transport()), ("shm", "shm"));
        a.send(1, b"over the rings").expect("send");
        assert_eq!(b.recv(0).expect("recv"), b"over the rings");
    }

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
}
