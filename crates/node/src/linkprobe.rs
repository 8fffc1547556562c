//! Link measurements over the data plane. A control-plane query (zenoh over mutual TLS) costs
//! far more per round trip than a data-plane message, so timing links with one made a fast
//! link look slow: on loopback it read 60-70 us one way where the data plane takes about 10,
//! and the planner then kept models on one node that tensor parallelism would have run faster.
//! Every node therefore answers probes on a data-plane listener of its own, with the same
//! handshake (a token from the cluster key), sealing and emulated link shape as its instances,
//! and its peers time that.

use std::net::{IpAddr, SocketAddr, TcpListener};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use strata_net::{LinkFigures, LinkShape, MeshConfig, ProbeSize, Transport};

use crate::key::{ClusterKey, encode_hex};
use crate::{Error, Result};

/// What one probe sends: enough round trips for a steady median, and enough bytes to see the
/// bandwidth, without loading the link much (it runs every few seconds while the nodes are idle,
/// every ten minutes while either is busy).
const SIZE: ProbeSize = ProbeSize {
    rounds: 100,
    big: 1 << 20,
    bigs: 2,
};

/// Largest probe a node answers, bytes.
const LIMIT: u64 = 16 << 20;

/// How long a prober waits for the answering node to take it (it answers one at a time).
const JOIN_TIMEOUT: Duration = Duration::from_secs(3);

fn token(key: &ClusterKey) -> String {
    encode_hex(&key.mac("link probe", &[]))
}

/// The node's probe answerer: a data-plane listener and the thread serving it. Stops (within a
/// couple of seconds) when dropped.
#[derive(Debug)]
pub struct ProbeServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
}

impl ProbeServer {
    /// Listens on `host` (any port) and answers probes from holders of `key`'s cluster, over a
    /// link shaped as `shape` and carried by `transport` (the probing side learns both at the
    /// handshake, as workers do), so a probe goes the way this node's instances' data does.
    pub fn start(
        host: IpAddr,
        key: &ClusterKey,
        shape: LinkShape,
        transport: Transport,
    ) -> Result<ProbeServer> {
        let listener = TcpListener::bind(SocketAddr::new(host, 0))
            .map_err(|e| Error::Control(format!("binding the link-probe listener: {e}")))?;
        let addr = listener
            .local_addr()
            .map_err(|e| Error::Control(format!("reading the link-probe address: {e}")))?;
        let stop = Arc::new(AtomicBool::new(false));
        let cfg = MeshConfig {
            rank: 0,
            world: 2,
            coordinator: addr,
            listen: None,
            token: token(key),
            transport,
            shape,
            // Short, so the loop notices `stop`; a prober that misses a window tries again.
            join_timeout: Duration::from_secs(2),
            stall_timeout: Duration::from_secs(2),
            insecure_plaintext: false,
        };
        let flag = Arc::clone(&stop);
        std::thread::Builder::new()
            .name("strata-link-probe".into())
            .spawn(move || {
                while !flag.load(Ordering::Relaxed) {
                    // Sleep until a prober connects (or a second passes, to see `stop`):
                    // the bootstrap's accept loop looks every 2 ms, which for a listener that
                    // waits all day cost a 2-core machine 1-3 % of a core, and woke it up under
                    // the ranks of a serving instance 500 times a second.
                    if !readable(&listener, Duration::from_secs(1)) {
                        continue;
                    }
                    let Ok(l) = listener.try_clone() else {
                        return;
                    };
                    // A timeout (no prober) or a stranger's failed handshake: listen again.
                    if let Ok(mut comm) = strata_net::coordinate(&cfg, l) {
                        let _ = strata_net::answer_probe(&mut comm, 1, LIMIT);
                    }
                }
            })
            .map_err(|e| Error::Control(format!("starting the link-probe thread: {e}")))?;
        Ok(ProbeServer { addr, stop })
    }

    /// Where peers reach it.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for ProbeServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
    }
}

/// Whether a connection waits on `listener` (or it failed), after waiting up to `timeout`.
fn readable(listener: &TcpListener, timeout: Duration) -> bool {
    use std::os::fd::AsRawFd;
    let mut fd = libc::pollfd {
        fd: listener.as_raw_fd(),
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd record for the call's duration.
    let n = unsafe { libc::poll(&mut fd, 1, timeout.as_millis() as libc::c_int) };
    // An error (a signal) counts as readable: the bootstrap then looks for itself.
    n != 0
}

/// Times the data-plane link to the node answering at `addr` (blocking): its figures, and the
/// transport the answering node's data plane took to this one (`tcp` or `shm`).
pub fn measure(addr: SocketAddr, key: &ClusterKey) -> Result<(LinkFigures, &'static str)> {
    let cfg = MeshConfig {
        rank: 1,
        world: 2,
        coordinator: addr,
        listen: None,
        token: token(key),
        // Learned from the answering node.
        transport: Transport::Auto,
        shape: LinkShape::default(),
        join_timeout: JOIN_TIMEOUT,
        stall_timeout: Duration::from_secs(2),
        insecure_plaintext: false,
    };
    let mut comm = strata_net::join(&cfg)
        .map_err(|e| Error::Control(format!("probing the link to {addr}: {e}")))?;
    strata_net::probe_link(&mut comm, 0, SIZE)
        .map(|f| (f, comm.transport()))
        .map_err(|e| Error::Control(format!("probing the link to {addr}: {e}")))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_node_measures_the_link_its_peer_answers_on_and_strangers_are_refused() {
        let key = ClusterKey::generate();
        let server = ProbeServer::start(
            IpAddr::from([127, 0, 0, 1]),
            &key,
            LinkShape {
                latency: Duration::from_micros(300),
                bandwidth: None,
            },
            Transport::Tcp,
        )
        .unwrap();
        let (f, via) = measure(server.addr(), &key).unwrap();
        assert_eq!(via, "tcp");
        assert!(
            (300e-6..5e-3).contains(&f.latency),
            "{} us",
            f.latency * 1e6
        );
        // Another probe is answered too (the server goes on after each).
        assert!(measure(server.addr(), &key).is_ok());
        // A node of another cluster is refused at the handshake.
        assert!(measure(server.addr(), &ClusterKey::generate()).is_err());
        assert!(measure(server.addr(), &key).is_ok());
    }

    /// A node on `auto` answers probes the way its instances' data would go: over shared
    /// memory to a prober on the same host.
    #[test]
    fn a_probe_goes_the_way_the_instances_data_would() {
        let key = ClusterKey::generate();
        let shape = LinkShape {
            latency: Duration::from_micros(200),
            bandwidth: None,
        };
        let server =
            ProbeServer::start(IpAddr::from([127, 0, 0, 1]), &key, shape, Transport::Auto).unwrap();
        let (f, via) = measure(server.addr(), &key).unwrap();
        assert_eq!(via, "shm");
        assert!(f.latency >= 200e-6, "{} us", f.latency * 1e6);
    }
}
