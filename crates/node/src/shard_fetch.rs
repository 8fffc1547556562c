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
use strata_hub::{HubEvent, HubRef, Sparse};
use strata_store::Store;

use crate::transfer::{ArrivalSlot, update_arrival};
use crate::{Error, Result};

/// The hub reference `spec` names and the store whose hub fetches it, when `spec` is an `hf:`
/// id this node can reach a hub for and whose files its cache does not hold whole.
fn hub_source(spec: &str) -> Result<Option<(Store, HubRef)>> {
    let Some(rest) = spec.strip_prefix(strata_hub::SCHEME) else {
        return Ok(None);
    };
    let store = Store::from_env()?;
    let Some(hub) = store.hub() else {
        return Ok(None);
    };
    let Ok(r) = HubRef::parse(rest) else {
        return Ok(None);
    };
    if hub.cache().find(&r).is_ok() {
        return Ok(None);
    }
    Ok(Some((store, r)))
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
    let Some((store, r)) = hub_source(spec)? else {
        return Ok(None);
    };
    let Some(hub) = store.hub() else {
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
    arrival: Option<&ArrivalSlot>,
) -> Result<Option<PathBuf>> {
    let Some((store, r)) = hub_source(spec)? else {
        return Ok(None);
    };
    let Some(hub) = store.hub() else {
        return Ok(None);
    };
    let sparse = hub
        .headers(&r, &mut |e| note(arrival, &e))
        .map_err(|e| hub_error(spec, e))?;
    let want = shard_ranges(&sparse, placement, rank)?;
    let got = hub
        .fetch_ranges(&sparse, &want, &mut |e| note(arrival, &e))
        .map_err(|e| hub_error(spec, e))?;
    tracing::info!(
        model = spec,
        rank,
        held = got.bytes_held(),
        size = got.size(),
        fetched = got.fetched(),
        complete = got.complete(),
        "this rank's shard of the model is here"
    );
    update_arrival(arrival, |_| true);
    Ok(Some(got.view))
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
