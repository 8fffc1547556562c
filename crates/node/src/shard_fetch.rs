//! A node that runs one shard of a Hugging Face model fetches only that shard's bytes.
//!
//! The leader plans from the model's headers alone; each rank's node then works out which
//! byte ranges its shard loads (by loading the shard from the partial files with every read
//! recorded: a hole reads as zeros and costs no I/O) and fetches just those from the hub into
//! its own cache, sparse, with a record of what it holds. A later placement that needs more
//! fetches only the rest. This applies to `hf:` ids whose files the cache does not hold whole;
//! a model already complete here loads as any file does.

use std::path::PathBuf;

use strata_cluster::Placement;
use strata_gguf::GgufFile;
use strata_hub::{Hub, HubEvent, HubRef, Sparse};
use strata_store::Store;
use zenoh::Wait as _;

use crate::transfer::{ArrivalSlot, Peers, update_arrival};
use crate::{Error, Result};

/// The hub reference `spec` names and the hub that fetches it, when `spec` is an `hf:` id
/// this node can reach a hub for and whose files its cache does not hold whole.
fn hub_source(spec: &str) -> Result<Option<(Hub, HubRef)>> {
    let Some(rest) = spec.strip_prefix(strata_hub::SCHEME) else {
        return Ok(None);
    };
    let Some(hub) = Store::from_env()?.hub().cloned() else {
        return Ok(None);
    };
    let Ok(r) = HubRef::parse(rest) else {
        return Ok(None);
    };
    if hub.cache().find(&r).is_ok() {
        return Ok(None);
    }
    Ok(Some((hub, r)))
}

fn hub_error(spec: &str, e: strata_hub::Error) -> Error {
    Error::Fetch {
        model: spec.to_string(),
        source: Box::new(strata_store::Error::from(e)),
    }
}

/// Records a hub event as the instance's arrival step.
fn note(slot: Option<&ArrivalSlot>, ev: &HubEvent<'_>) {
    update_arrival(slot, |now| {
        match *ev {
            HubEvent::Resolving { .. } => now.step = "asking the hub for the model".into(),
            HubEvent::File(strata_hub::FileEvent::Downloading { file, done, total }) => {
                now.step = format!("fetching this node's shard of {file}");
                (now.done, now.total) = (done, total);
            }
            HubEvent::File(strata_hub::FileEvent::Verifying { .. }) => {
                now.step = "verifying".into();
            }
            _ => {}
        }
        false
    });
}

/// For planning: the model's headers, fetched alone when `spec` is a hub model not whole in
/// the cache (`None` otherwise: plan from the file as usual).
pub(crate) fn header_file(spec: &str) -> Result<Option<GgufFile>> {
    let Some((hub, r)) = hub_source(spec)? else {
        return Ok(None);
    };
    let sparse = hub
        .headers(&r, &mut |_| {})
        .map_err(|e| hub_error(spec, e))?;
    Ok(Some(GgufFile::open_header(&sparse.view)?))
}

/// For rank `rank` of `placement`: the bytes its shard loads, fetched (only those not here
/// yet) when `spec` is a hub model not whole in the cache; returns the path to load it from.
/// `None`: resolve the model as usual.
pub(crate) fn shard_file(
    spec: &str,
    placement: &Placement,
    rank: usize,
    peers: &Peers,
) -> Result<Option<PathBuf>> {
    let arrival = peers.arrival.as_ref();
    let Some((hub, r)) = hub_source(spec)? else {
        return Ok(None);
    };
    let sparse = hub
        .headers(&r, &mut |e| note(arrival, &e))
        .map_err(|e| hub_error(spec, e))?;
    let want = shard_ranges(&sparse, placement, rank)?;
    let copied = from_peers(&hub, &sparse, &want, peers);
    let got = hub
        .fetch_ranges(&sparse, &want, &mut |e| note(arrival, &e))
        .map_err(|e| hub_error(spec, e))?;
    tracing::info!(
        model = spec,
        rank,
        held = got.bytes_held(),
        size = got.size(),
        from_peers = copied,
        from_hub = got.fetched(),
        complete = got.complete(),
        "this rank's shard of the model is here"
    );
    update_arrival(arrival, |_| true);
    Ok(Some(got.view))
}

/// Bytes per reply of a range transfer.
const CHUNK: u64 = 4 << 20;

/// What a node asks a peer for: ranges of one file of a hub repository.
#[derive(serde::Serialize, serde::Deserialize)]
struct RangeAsk {
    repo: String,
    etag: String,
    ranges: Vec<(u64, u64)>,
}

/// Copies from peers the ranges of `want` this node lacks and they hold (a range crosses the
/// internet once: the rank that fetched it first serves it to the others). Failures are
/// logged and leave the ranges to the hub. Returns the bytes copied.
fn from_peers(hub: &Hub, sparse: &Sparse, want: &[Vec<(u64, u64)>], peers: &Peers) -> u64 {
    let mut copied = 0;
    for (i, entry) in sparse.files.iter().enumerate() {
        let held = &sparse.held[i].ranges;
        let mut gaps: Vec<(u64, u64)> = want
            .get(i)
            .into_iter()
            .flatten()
            .flat_map(|&(a, b)| held.gaps(a, b))
            .collect();
        for peer in &peers.ids {
            if gaps.is_empty() {
                break;
            }
            let ask = RangeAsk {
                repo: sparse.repo.clone(),
                etag: entry.etag().to_string(),
                ranges: gaps.clone(),
            };
            match copy_from(hub, sparse, i, &ask, peers, peer) {
                Ok(got) => {
                    copied += got.len();
                    gaps = gaps.iter().flat_map(|&(a, b)| got.gaps(a, b)).collect();
                }
                Err(e) => tracing::warn!("ranges of {} from node {peer}: {e}", entry.path),
            }
        }
    }
    copied
}

/// Asks `peer` for `ask`'s ranges and writes what it sends; returns the ranges written.
fn copy_from(
    hub: &Hub,
    sparse: &Sparse,
    i: usize,
    ask: &RangeAsk,
    peers: &Peers,
    peer: &str,
) -> Result<strata_hub::RangeSet> {
    let body = serde_json::to_vec(ask).map_err(|e| Error::Instance(e.to_string()))?;
    let replies = peers
        .session
        .get(format!("{}/rpc/{peer}/hubrange", peers.prefix))
        .payload(body)
        .consolidation(zenoh::query::ConsolidationMode::None)
        .timeout(std::time::Duration::from_secs(3600))
        .wait()
        .map_err(Error::control)?;
    let next = || crate::transfer::next(&replies);
    let head = next().ok_or_else(|| Error::Instance("no answer".into()))?;
    let head: serde_json::Value =
        serde_json::from_slice(&head).map_err(|e| Error::Instance(e.to_string()))?;
    if let Some(e) = head.get("error").and_then(|e| e.as_str()) {
        return Err(Error::Instance(e.to_string()));
    }
    let held: Vec<(u64, u64)> = serde_json::from_value(head["held"].clone())
        .map_err(|e| Error::Instance(format!("the peer's ranges: {e}")))?;
    let mut written = strata_hub::RangeSet::new();
    for (a, b) in held {
        // Only what was asked for is taken, whatever the peer says it has.
        if !ask.ranges.iter().any(|&(x, y)| x <= a && b <= y) {
            return Err(Error::Instance(format!(
                "sent bytes {a}..{b}, not asked for"
            )));
        }
        let mut at = a;
        while at < b {
            let chunk = next().ok_or_else(|| Error::Instance("the transfer ended early".into()))?;
            if chunk.is_empty() || at + chunk.len() as u64 > b {
                return Err(Error::Instance("a reply of the wrong size".into()));
            }
            hub.put_range(sparse, i, at, &chunk)
                .map_err(|e| hub_error(&sparse.repo, e))?;
            written.insert(at, at + chunk.len() as u64);
            at += chunk.len() as u64;
        }
    }
    Ok(written)
}

/// The file a node serves ranges from (none when it holds nothing) and the ranges it sends.
type Offer = (Option<std::fs::File>, Vec<(u64, u64)>);

/// Answers a peer asking for ranges of a hub file: which of them this node holds, then their
/// bytes in order (blocking; run it off the async threads).
pub(crate) fn serve_ranges(q: &zenoh::query::Query) {
    let key = q.key_expr().clone();
    let answer = (|| -> std::result::Result<Offer, String> {
        let body = q
            .payload()
            .map(|p| p.to_bytes().to_vec())
            .unwrap_or_default();
        let ask: RangeAsk = serde_json::from_slice(&body).map_err(|e| e.to_string())?;
        let Some(cache) = strata_hub::HubCache::from_env() else {
            return Ok((None, Vec::new()));
        };
        let Some((path, have)) = cache
            .holding(&ask.repo, &ask.etag)
            .map_err(|e| e.to_string())?
        else {
            return Ok((None, Vec::new()));
        };
        let mut held = Vec::new();
        for &(a, b) in &ask.ranges {
            // The asked range minus its gaps here, in order.
            let mut at = a;
            for (x, y) in have.gaps(a, b) {
                if at < x {
                    held.push((at, x));
                }
                at = y;
            }
            if at < b {
                held.push((at, b));
            }
        }
        let f = std::fs::File::open(&path).map_err(|e| e.to_string())?;
        Ok((Some(f), held))
    })();
    let (file, held) = match answer {
        Ok(x) => x,
        Err(e) => return crate::transfer::reply_error(q, &e),
    };
    let head = serde_json::json!({ "held": held });
    if q.reply(key.clone(), head.to_string()).wait().is_err() {
        return;
    }
    let Some(file) = file else { return };
    let mut buf = vec![0u8; CHUNK as usize];
    for (a, b) in held {
        let mut at = a;
        while at < b {
            let n = (b - at).min(CHUNK) as usize;
            if std::os::unix::fs::FileExt::read_exact_at(&file, &mut buf[..n], at).is_err() {
                return;
            }
            if q.reply(key.clone(), buf[..n].to_vec()).wait().is_err() {
                return;
            }
            at += n as u64;
        }
    }
}

/// The byte ranges of each file that rank `rank` of `placement` loads.
fn shard_ranges(
    sparse: &Sparse,
    placement: &Placement,
    rank: usize,
) -> Result<Vec<Vec<(u64, u64)>>> {
    let header = GgufFile::open_header(&sparse.view)?;
    let cfg = strata_engine::ModelConfig::from_gguf(&header)?;
    // The same plan rank 0 makes for the instance (it reads only the tensor shapes).
    let plan = strata_parallel::make_plan(
        &header,
        &cfg,
        crate::instances::strategy(placement),
        placement.nodes.len(),
        Some(&placement.weights),
        strata_parallel::CombineStyle::Gather,
    )?;
    let spec = plan
        .ranks
        .get(rank)
        .ok_or_else(|| Error::Instance(format!("the plan has no rank {rank}")))?
        .spec
        .clone();
    let file = GgufFile::open_recording(&sparse.view)?;
    drop(strata_engine::Model::load(&file, spec)?);
    let sizes: Vec<u64> = sparse.files.iter().map(|e| e.size).collect();
    Ok(per_file(&file.reads(), &file.part_starts(), &sizes))
}

/// Ranges of the model's address space as ranges of each file (a range may cross a part's
/// end; tensors never do, but the split costs nothing).
fn per_file(reads: &[(u64, u64)], starts: &[u64], sizes: &[u64]) -> Vec<Vec<(u64, u64)>> {
    let mut out = vec![Vec::new(); starts.len()];
    for &(a, b) in reads {
        for (i, (&s, &n)) in starts.iter().zip(sizes).enumerate() {
            let (lo, hi) = (a.max(s), b.min(s + n));
            if lo < hi {
                out[i].push((lo - s, hi - s));
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::per_file;

    #[test]
    fn reads_are_cut_at_the_parts_ends() {
        let got = per_file(&[(5, 10), (90, 130), (150, 160)], &[0, 100], &[100, 100]);
        assert_eq!(got, vec![vec![(5, 10), (90, 100)], vec![(0, 30), (50, 60)]]);
    }
}
