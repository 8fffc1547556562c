//! The control plane between real zenoh sessions on loopback: members find each other through
//! `--peer` addresses, agree on a leader, exchange state, measure links, notice a member leaving,
//! and never admit a process with another cluster key.

use std::net::{SocketAddr, TcpListener};
use std::time::{Duration, Instant};

use strata_node::control::{Control, ControlConfig, NodeState};
use strata_node::{ClusterKey, Profile};

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

fn config(key: &ClusterKey, id: &str, port: u16, peers: &[u16]) -> ControlConfig {
    ControlConfig {
        key: key.clone(),
        node_id: id.into(),
        listen: SocketAddr::from(([127, 0, 0, 1], port)),
        peers: peers.iter().map(|p| format!("127.0.0.1:{p}")).collect(),
        multicast: false,
        cert_names: vec!["127.0.0.1".into(), "localhost".into()],
    }
}

fn state(id: &str) -> NodeState {
    NodeState {
        profile: Profile {
            id: id.into(),
            name: id.into(),
            hostname: "test".into(),
            version: "test".into(),
            memory_total: 1 << 30,
            memory_available: 1 << 29,
            cores: 2,
            backend: "cpu".into(),
            matmul_gflops: 10.0,
            matmul_gflops_by_type: Default::default(),
            stream_gweights_by_type: Default::default(),
            machine: String::new(),
            machine_bandwidth: 0.0,
            exchange_overhead_us: 0.0,
            attention_gflops: 0.0,
            attention_fixed_us: 0.0,
            row_cost_ns: 0.0,
            memory_limit: None,
            mem_bandwidth: 1e10,
            api_addr: String::new(),
            started_at: 0,
        },
        links: Vec::new(),
        draining: false,
        extra: serde_json::Value::Null,
    }
}

async fn until(what: &str, limit: Duration, mut f: impl FnMut() -> bool) {
    let t = Instant::now();
    while !f() {
        assert!(t.elapsed() < limit, "timed out waiting until {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn ids(c: &Control) -> Vec<String> {
    c.snapshot().members.into_iter().map(|m| m.id).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_meet_elect_measure_and_keep_strangers_out() {
    let key = ClusterKey::generate();
    let (pa, pb, pr) = (free_port(), free_port(), free_port());
    let a = Control::start(config(&key, "node-b", pa, &[]))
        .await
        .expect("a");
    let b = Control::start(config(&key, "node-a", pb, &[pa]))
        .await
        .expect("b");
    // A process with another key dials the same member.
    let rogue_key = ClusterKey::generate();
    let rogue = Control::start(config(&rogue_key, "node-0", pr, &[pa, pb]))
        .await
        .expect("rogue");

    until(
        "both members see each other",
        Duration::from_secs(10),
        || ids(&a) == ["node-a", "node-b"] && ids(&b) == ["node-a", "node-b"],
    )
    .await;
    assert_eq!(
        a.leader().as_deref(),
        Some("node-a"),
        "the smallest id leads"
    );
    assert!(b.is_leader() && !a.is_leader());

    a.publish(&state("node-b")).await.expect("publish");
    b.publish(&state("node-a")).await.expect("publish");
    until("states arrive", Duration::from_secs(5), || {
        a.snapshot().members.iter().all(|m| m.state.is_some())
            && b.snapshot().members.iter().all(|m| m.state.is_some())
    })
    .await;

    let link = b.probe("node-b").await.expect("probe");
    assert!(link.latency_s > 0.0 && link.latency_s < 0.05, "{link:?}");
    assert!(link.bandwidth_bps > 1e6, "{link:?}");
    assert!(b.probe("node-zzz").await.is_err(), "no such member");

    // The stranger has been dialling all along and is never a member, on either side.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(ids(&a), ["node-a", "node-b"]);
    assert_eq!(ids(&rogue), ["node-0"], "the stranger sees nobody");
    assert!(rogue.probe("node-b").await.is_err());

    // The leader leaves: the other member notices quickly and takes over.
    let t = Instant::now();
    b.close().await.expect("close");
    until(
        "the leader's departure is seen",
        Duration::from_secs(3),
        || ids(&a) == ["node-b"],
    )
    .await;
    assert!(t.elapsed() < Duration::from_secs(3));
    assert!(a.is_leader());
    let events: Vec<String> = a.snapshot().events.into_iter().map(|e| e.what).collect();
    assert!(events.iter().any(|e| e == "node-a joined"), "{events:?}");
    assert!(events.iter().any(|e| e == "node-a left"), "{events:?}");
    rogue.close().await.expect("close");
    a.close().await.expect("close");
}

fn named(id: &str, name: &str) -> NodeState {
    let mut s = state(id);
    s.profile.name = name.into();
    s
}

/// The name of the profile `c` holds for member `id`.
fn name_of(c: &Control, id: &str) -> Option<String> {
    c.snapshot()
        .members
        .into_iter()
        .find(|m| m.id == id)
        .and_then(|m| m.state)
        .map(|s| s.profile.name)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_joining_with_a_live_members_id_is_refused_and_told_to_go() {
    let key = ClusterKey::generate();
    let (pa, pb, pc) = (free_port(), free_port(), free_port());
    let first = Control::start(config(&key, "node-x", pa, &[]))
        .await
        .expect("first");
    let other = Control::start(config(&key, "node-y", pb, &[pa]))
        .await
        .expect("other");
    until("the members meet", Duration::from_secs(10), || {
        ids(&other) == ["node-x", "node-y"]
    })
    .await;
    let t = Instant::now();
    while name_of(&other, "node-x").as_deref() != Some("first") {
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "the first state never arrived"
        );
        first
            .publish(&named("node-x", "first"))
            .await
            .expect("publish");
        other
            .publish(&named("node-y", "other"))
            .await
            .expect("publish");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // A copy of the first node's state directory starts elsewhere: same id, another process.
    let copy = Control::start(config(&key, "node-x", pc, &[pa, pb]))
        .await
        .expect("copy");
    let publisher = {
        let copy_state = named("node-x", "copy");
        let t = Instant::now();
        let mut told = None;
        while t.elapsed() < Duration::from_secs(10) {
            copy.publish(&copy_state).await.expect("publish");
            first
                .publish(&named("node-x", "first"))
                .await
                .expect("publish");
            if let Some(by) = copy.displaced_by() {
                told = Some(by);
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        told
    };
    assert_eq!(
        publisher.as_deref(),
        Some("first (host test, API )"),
        "the copy was not told that another node holds its id"
    );
    // Meanwhile the others kept the first node's profile, and said what they saw.
    for _ in 0..5 {
        copy.publish(&named("node-x", "copy"))
            .await
            .expect("publish");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(name_of(&other, "node-x").as_deref(), Some("first"));
    assert_eq!(name_of(&first, "node-x").as_deref(), Some("first"));
    assert!(first.displaced_by().is_none());
    let warned = |c: &Control| {
        c.snapshot()
            .events
            .iter()
            .any(|e| e.what.contains("two nodes claim the node id node-x"))
    };
    assert!(warned(&other), "{:?}", other.snapshot().events);
    assert!(warned(&first), "{:?}", first.snapshot().events);

    // The copy goes: the first node is still a member, with its own profile.
    copy.close().await.expect("close");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    first
        .publish(&named("node-x", "first"))
        .await
        .expect("publish");
    until(
        "the first node is still seen",
        Duration::from_secs(5),
        || {
            ids(&other) == ["node-x", "node-y"]
                && name_of(&other, "node-x").as_deref() == Some("first")
        },
    )
    .await;
    other.close().await.expect("close");
    first.close().await.expect("close");
}
