//! Models move between nodes: a node that needs a catalog model it lacks asks its peers first,
//! and installs a peer's copy only after the store has checked its size and SHA-256 against the
//! catalog card, exactly as it checks a download. Only files of catalog models that are
//! installed in the store are ever served, never arbitrary paths.
//!
//! A transfer is one zenoh query: the first reply says how many bytes follow, then the file
//! comes in 4 MiB replies, in order, over the encrypted control plane.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::time::Duration;

use zenoh::Wait as _;

use crate::{Error, Result};

/// Bytes per reply.
const CHUNK: usize = 4 << 20;

/// Where a node can get models from besides its own store.
#[derive(Clone)]
pub struct Peers {
    /// The control-plane session.
    pub session: zenoh::Session,
    /// The cluster's topic prefix.
    pub prefix: String,
    /// Live members to ask, in order.
    pub ids: Vec<String>,
}

impl std::fmt::Debug for Peers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Peers").field("ids", &self.ids).finish()
    }
}

/// The model file for `spec` on this node: from its store if installed; for a catalog model
/// it lacks, a verified copy from the first peer that has one; else whatever the store does
/// (download). A path is used as it is.
pub fn resolve(spec: &str, peers: Option<&Peers>) -> Result<PathBuf> {
    let store = strata_store::Store::from_env().map_err(|e| Error::Instance(e.to_string()))?;
    if let (Some(peers), Some(card)) = (peers, store.catalog().get(spec))
        && !store.is_present(spec).unwrap_or(false)
    {
        let card = card.clone();
        for peer in &peers.ids {
            match fetch_from(&store, &card, peers, peer) {
                Ok(path) => {
                    eprintln!("strata: got {spec} from node {peer} (SHA-256 verified)");
                    return Ok(path);
                }
                Err(e) => eprintln!("strata: {spec} from node {peer}: {e}"),
            }
        }
    }
    let resolved = store
        .resolve_with(spec, &mut |_| {})
        .map_err(|e| Error::Instance(format!("{spec}: {e}")))?;
    Ok(resolved.path)
}

fn fetch_from(
    store: &strata_store::Store,
    card: &strata_store::ModelCard,
    peers: &Peers,
    peer: &str,
) -> Result<PathBuf> {
    let replies = peers
        .session
        .get(format!("{}/rpc/{peer}/model", peers.prefix))
        .payload(card.id.clone().into_bytes())
        .consolidation(zenoh::query::ConsolidationMode::None)
        .timeout(Duration::from_secs(3600))
        .wait()
        .map_err(Error::control)?;
    let head = next(&replies).ok_or_else(|| Error::Instance("no answer".into()))?;
    let head: serde_json::Value =
        serde_json::from_slice(&head).map_err(|e| Error::Instance(e.to_string()))?;
    if let Some(e) = head.get("error").and_then(|e| e.as_str()) {
        return Err(Error::Instance(e.to_string()));
    }
    let mut reader = Replies {
        replies,
        buf: Vec::new(),
        at: 0,
    };
    store
        .install_from(
            card,
            &mut reader,
            Path::new(&format!("node {peer}")),
            &mut |_| {},
        )
        .map_err(|e| Error::Instance(e.to_string()))
}

fn next(replies: &zenoh::handlers::FifoChannelHandler<zenoh::query::Reply>) -> Option<Vec<u8>> {
    let r = replies.recv().ok()?;
    Some(r.result().ok()?.payload().to_bytes().to_vec())
}

/// The replies of a transfer as a byte stream.
struct Replies {
    replies: zenoh::handlers::FifoChannelHandler<zenoh::query::Reply>,
    buf: Vec<u8>,
    at: usize,
}

impl Read for Replies {
    fn read(&mut self, out: &mut [u8]) -> std::io::Result<usize> {
        while self.at == self.buf.len() {
            match next(&self.replies) {
                Some(b) => {
                    self.buf = b;
                    self.at = 0;
                }
                None => return Ok(0),
            }
        }
        let n = out.len().min(self.buf.len() - self.at);
        out[..n].copy_from_slice(&self.buf[self.at..self.at + n]);
        self.at += n;
        Ok(n)
    }
}

/// Answers a peer's request for a model: the size, then the file, if it is an installed
/// catalog model (blocking; run it off the async threads).
pub fn serve(q: &zenoh::query::Query) {
    let key = q.key_expr().clone();
    let id = q
        .payload()
        .map(|p| String::from_utf8_lossy(&p.to_bytes()).into_owned())
        .unwrap_or_default();
    let file = (|| -> std::result::Result<(std::fs::File, u64), String> {
        let store = strata_store::Store::from_env().map_err(|e| e.to_string())?;
        // Catalog ids only: a peer never names a path.
        if store.catalog().get(&id).is_none() {
            return Err(format!("{id:?} is not a catalog model"));
        }
        if !store.is_present(&id).unwrap_or(false) {
            return Err(format!("{id} is not installed here"));
        }
        let path = store.path(&id).map_err(|e| e.to_string())?;
        let f = std::fs::File::open(&path).map_err(|e| e.to_string())?;
        let len = f.metadata().map_err(|e| e.to_string())?.len();
        Ok((f, len))
    })();
    let (mut f, len) = match file {
        Ok(x) => x,
        Err(e) => {
            let _ = q
                .reply(key, serde_json::json!({ "error": e }).to_string())
                .wait();
            return;
        }
    };
    if q.reply(key.clone(), serde_json::json!({ "size": len }).to_string())
        .wait()
        .is_err()
    {
        return;
    }
    let mut buf = vec![0u8; CHUNK];
    loop {
        let n = match f.read(&mut buf) {
            Ok(0) | Err(_) => return,
            Ok(n) => n,
        };
        if q.reply(key.clone(), buf[..n].to_vec()).wait().is_err() {
            return;
        }
    }
}
