//! Two nodes, each in its own network namespace, load a Hugging Face model tensor parallel from
//! a hub in a third namespace (`strata-testhub`, counting the bytes it sends to each address):
//! each node keeps only the bytes its shard loads, sparse; what both shards read crosses the
//! internet once (the second node copies it from the first); and the cluster answers what one
//! process answers on the whole file.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::IpAddr;
use std::os::fd::AsRawFd as _;
use std::path::{Path, PathBuf};

use strata_testhub::TestHub;

use crate::cli_cluster::{Net, answer_text, complete_model};

const REPO: &str = "someone/SmolLM2-135M-Instruct-GGUF";

/// A test hub whose sockets live in namespace `ns`, bound to `ip` there.
fn hub_in(ns: &str, root: &Path, ip: IpAddr) -> TestHub {
    let path = format!("/var/run/netns/{ns}");
    std::thread::scope(|s| {
        s.spawn(|| {
            let f = std::fs::File::open(&path).expect("the namespace");
            // SAFETY: setns(2) moves only this short-lived thread, with a valid namespace fd;
            // the hub's listeners are made on it and so belong to that namespace.
            let rc = unsafe { libc::setns(f.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns into {ns}");
            TestHub::builder(root).bind(ip).start().expect("test hub")
        })
        .join()
        .expect("hub thread")
    })
}

/// Bytes of the model a node's hub cache holds: complete blobs, and the recorded ranges of
/// partial ones.
fn held(cache: &Path) -> u64 {
    let blobs = cache.join(format!("models--{}/blobs", REPO.replace('/', "--")));
    let Ok(rd) = std::fs::read_dir(&blobs) else {
        return 0;
    };
    rd.flatten()
        .map(|e| {
            let name = e.file_name().to_string_lossy().into_owned();
            if name.ends_with(".strata-partial.ranges") {
                strata_hub::RangeSet::load(&e.path()).unwrap().len()
            } else if name.ends_with(".strata-partial") {
                0
            } else {
                e.metadata().unwrap().len()
            }
        })
        .sum()
}

#[test]
#[ignore = "needs root and iproute2 (network namespaces)"]
fn each_node_fetches_only_its_shard_of_a_hub_model() {
    let mut net = Net::new(3);
    let key = net.key("cluster.key");
    let dir = net.dir.path().to_path_buf();
    let catalog = strata_store::Store::from_env()
        .expect("store")
        .ensure(strata_store::DEFAULT_MODEL_ID)
        .expect("default model");
    let total = std::fs::metadata(&catalog).unwrap().len();

    // The hub, in host 3's namespace, serves the default model as a split set.
    let root = dir.join("hub-root");
    std::fs::create_dir_all(root.join(REPO)).unwrap();
    let whole = strata_gguf::GgufFile::open(&catalog).unwrap();
    let parts = strata_gguf::split::split_by_tensors(&whole, 100);
    let n = parts.len() as u32;
    for (i, bytes) in parts.iter().enumerate() {
        let name = strata_gguf::split::part_name("SmolLM2-135M-Instruct-Q4_1", i as u32 + 1, n);
        std::fs::write(root.join(REPO).join(name), bytes).unwrap();
    }
    drop(parts);
    let hub = hub_in(&net.ns(3), &root, IpAddr::from([10, 77, 0, 3]));
    let endpoint = PathBuf::from(hub.endpoint());

    let caches: Vec<PathBuf> = (1..=2).map(|h| dir.join(format!("hf-cache{h}"))).collect();
    for h in 1..=2 {
        net.spawn(
            h,
            &key,
            &[
                ("HF_ENDPOINT", endpoint.as_path()),
                ("HF_HUB_CACHE", caches[h - 1].as_path()),
            ],
            &["--transport", "tcp"],
        );
    }
    net.wait_for_two_nodes();

    let id = format!("hf:{REPO}:Q4_1");
    let loaded = net.load_model(1, &id, &["--nodes", "host1,host2", "--strategy", "tensor"]);
    assert_eq!(loaded["placement"]["strategy"], "tensor", "{loaded}");
    let (code, body) = complete_model(&net, 1, &id, 24);
    let sharded = answer_text(code, &body);
    assert!(!sharded.is_empty());

    let stats = hub.stats();
    let mut fetched_all = 0;
    for h in 1..=2u8 {
        let fetched = stats.cdn_bytes_to(IpAddr::from([10, 77, 0, h]));
        let kept = held(&caches[h as usize - 1]);
        fetched_all += fetched;
        eprintln!("node {h}: fetched {fetched} bytes, holds {kept} of {total}");
        assert!(fetched > 0, "node {h} fetched nothing");
        // Every byte fetched is kept (no range twice), and the shard is far from the whole.
        assert!(
            fetched <= kept + kept / 20,
            "node {h}: fetched {fetched}, holds {kept}"
        );
        assert!(
            kept < total * 4 / 5,
            "node {h} holds {kept} of {total} bytes"
        );
    }
    // What both shards read crossed the internet once: the second node copied it from the
    // first. Only the headers come from the hub to each node.
    assert!(
        fetched_all >= total / 2 && fetched_all <= total + total / 20,
        "the nodes fetched {fetched_all} bytes of a {total}-byte model"
    );

    // One process on the whole file (the catalog copy) answers the same.
    net.load_model(1, strata_store::DEFAULT_MODEL_ID, &["--nodes", "host1"]);
    let (code, body) = complete_model(&net, 1, strata_store::DEFAULT_MODEL_ID, 24);
    assert_eq!(answer_text(code, &body), sharded);
}
