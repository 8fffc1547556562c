//! A node's stable identity: an id made once and kept in the node's state directory, so a node
//! that restarts is the same member (its instances, its links) and not a stranger.

use std::path::{Path, PathBuf};

use crate::{Error, Result};

/// Where a node keeps its state when not told: `$XDG_STATE_HOME/strata` or
/// `~/.local/state/strata`.
pub fn default_state_dir() -> PathBuf {
    if let Some(d) = std::env::var_os("XDG_STATE_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(d).join("strata");
    }
    let home = std::env::var_os("HOME").map_or_else(|| PathBuf::from("."), PathBuf::from);
    home.join(".local/state/strata")
}

/// Reads the node id from `dir`, making one (16 random hex digits) on first use.
pub fn node_id(dir: &Path) -> Result<String> {
    let path = dir.join("node-id");
    match std::fs::read_to_string(&path) {
        Ok(s) => {
            let id = s.trim().to_string();
            if valid_id(&id) {
                Ok(id)
            } else {
                Err(Error::Message {
                    peer: path.display().to_string(),
                    why: format!("{id:?} is not a node id (1-64 of a-z, 0-9, '-')"),
                })
            }
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            std::fs::create_dir_all(dir).map_err(|e| Error::io(dir, e))?;
            let id = crate::key::encode_hex(&rand::random::<[u8; 8]>());
            std::fs::write(&path, format!("{id}\n")).map_err(|e| Error::io(&path, e))?;
            Ok(id)
        }
        Err(e) => Err(Error::io(&path, e)),
    }
}

/// Whether `id` can be a node id (it appears in topics and file names).
pub fn valid_id(id: &str) -> bool {
    !id.is_empty()
        && id.len() <= 64
        && id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
}

/// This host's name: gethostname(2), which on Linux is what `/proc/sys/kernel/hostname`
/// holds (the UTS namespace's name) and on macOS the name `hostname` prints; `localhost` when
/// there is none.
pub fn hostname() -> String {
    let mut buf = [0u8; 256];
    // SAFETY: gethostname writes at most `buf.len()` bytes into the local buffer.
    let rc = unsafe { libc::gethostname(buf.as_mut_ptr().cast(), buf.len()) };
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    Some(String::from_utf8_lossy(&buf[..end]).trim().to_string())
        .filter(|s| rc == 0 && !s.is_empty())
        .unwrap_or_else(|| "localhost".into())
}

/// Every address of this host's interfaces (IPv4 and IPv6), loopback included: a node's
/// certificate names them all, since a peer may dial any of them.
pub fn local_addresses() -> Vec<std::net::IpAddr> {
    let mut out = Vec::new();
    #[cfg(unix)]
    {
        let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
        // SAFETY: getifaddrs fills `head` with a list we free below with freeifaddrs.
        if unsafe { libc::getifaddrs(&mut head) } != 0 {
            return out;
        }
        let mut cur = head;
        while !cur.is_null() {
            // SAFETY: `cur` is a node of the list getifaddrs returned, not yet freed.
            let ifa = unsafe { &*cur };
            if !ifa.ifa_addr.is_null() {
                // SAFETY: ifa_addr points to a sockaddr whose family says its real type.
                let family = i32::from(unsafe { (*ifa.ifa_addr).sa_family });
                if family == libc::AF_INET {
                    // SAFETY: AF_INET means a sockaddr_in.
                    let sin = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in) };
                    out.push(std::net::IpAddr::V4(std::net::Ipv4Addr::from(
                        u32::from_be(sin.sin_addr.s_addr),
                    )));
                } else if family == libc::AF_INET6 {
                    // SAFETY: AF_INET6 means a sockaddr_in6.
                    let sin6 = unsafe { &*(ifa.ifa_addr as *const libc::sockaddr_in6) };
                    out.push(std::net::IpAddr::V6(std::net::Ipv6Addr::from(
                        sin6.sin6_addr.s6_addr,
                    )));
                }
            }
            cur = ifa.ifa_next;
        }
        // SAFETY: `head` came from getifaddrs and is freed once.
        unsafe { libc::freeifaddrs(head) };
    }
    out.sort();
    out.dedup();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_os = "linux")]
    #[test]
    fn the_hostname_is_the_one_proc_holds() {
        let proc = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        assert_eq!(hostname(), proc.trim());
    }

    #[test]
    fn the_id_is_made_once_and_kept() {
        let dir = tempfile::tempdir().expect("tempdir");
        let a = node_id(dir.path()).expect("id");
        let b = node_id(dir.path()).expect("id");
        assert_eq!(a, b);
        assert!(valid_id(&a));
        std::fs::write(dir.path().join("node-id"), "Bad Id\n").expect("write");
        assert!(node_id(dir.path()).is_err());
    }

    #[test]
    fn loopback_is_among_the_local_addresses() {
        let addrs = local_addresses();
        assert!(addrs.iter().any(|a| a.is_loopback()), "{addrs:?}");
    }
}
