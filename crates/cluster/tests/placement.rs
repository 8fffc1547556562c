//! The placement planner against hand-built clusters and random ones: memory, the fewest nodes,
//! the tensor/pipeline flip at the latency the cost model predicts, determinism, and splits that
//! follow measured speed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use proptest::prelude::*;
use strata_cluster::{
    Link, ModelFacts, Node, PlacementError, Request, SPLIT_MARGIN, StrategyChoice, place,
};

const GB: u64 = 1_000_000_000;

/// A Llama-1B-like model: 0.6 GB of Q4_0 weights.
fn model() -> ModelFacts {
    ModelFacts {
        name: "llama-1b".into(),
        weight_bytes: 600_000_000,
        token_bytes: 600_000_000,
        moe: false,
        n_expert: 0,
        n_used: 0,
        head_bytes: 60_000_000,
        kv_bytes_per_token: 2 * 4 * 16 * 8 * 64,
        n_layer: 16,
        n_head: 32,
        n_embd: 2048,
        n_ff: 8192,
        default_context: 4096,
        q_width: 2048,
        ..ModelFacts::default()
    }
}

fn node(id: &str, mem_gb: f64, bw_gbs: f64) -> Node {
    Node {
        id: id.into(),
        memory_available: (mem_gb * GB as f64) as u64,
        mem_bandwidth: bw_gbs * 1e9,
        ..Node::default()
    }
}

fn link(a: &str, b: &str, latency_us: f64) -> Link {
    Link {
        a: a.into(),
        b: b.into(),
        latency: latency_us * 1e-6,
        bandwidth: 10e9 / 8.0,
    }
}

/// Three equal nodes, every pair linked alike.
fn triangle(mem_gb: f64, bw_gbs: f64, latency_us: f64) -> ([Node; 3], [Link; 3]) {
    (
        [
            node("a", mem_gb, bw_gbs),
            node("b", mem_gb, bw_gbs),
            node("c", mem_gb, bw_gbs),
        ],
        [
            link("a", "b", latency_us),
            link("a", "c", latency_us),
            link("b", "c", latency_us),
        ],
    )
}

fn req() -> Request {
    Request {
        context: 4096,
        ..Request::default()
    }
}

#[test]
fn a_model_that_fits_on_one_node_stays_there_over_slow_links() {
    let nodes = [node("a", 8.0, 30.0), node("b", 8.0, 60.0)];
    let p = place(&model(), &nodes, &[link("a", "b", 300.0)], &req()).unwrap();
    assert_eq!(p.strategy, StrategyChoice::Single);
    // The faster of the two.
    assert_eq!(p.nodes, vec!["b"]);
    assert!(
        p.explanation.contains("fits on b alone"),
        "{}",
        p.explanation
    );
}

#[test]
fn a_model_is_split_over_fast_links_when_that_is_clearly_faster() {
    let nodes = [node("a", 8.0, 30.0), node("b", 8.0, 60.0)];
    let p = place(&model(), &nodes, &[link("a", "b", 5.0)], &req()).unwrap();
    assert_eq!(p.strategy, StrategyChoice::Tensor, "{p:?}");
    assert!(p.explanation.contains("could hold it"), "{}", p.explanation);
    // Across link speeds: two nodes only where predicted at least SPLIT_MARGIN times one
    // node's speed, one node only where splitting is predicted slower than that.
    let alone = |links: &[Link]| {
        let r = Request {
            nodes: Some(vec!["b".into()]),
            ..req()
        };
        place(&model(), &nodes, links, &r)
            .unwrap()
            .predicted_decode_tok_s
    };
    let mut seen = (false, false);
    for lat in [
        1.0, 5.0, 10.0, 20.0, 40.0, 60.0, 100.0, 200.0, 300.0, 1000.0,
    ] {
        let links = [link("a", "b", lat)];
        let p = place(&model(), &nodes, &links, &req()).unwrap();
        let one = alone(&links);
        if p.nodes.len() == 2 {
            seen.0 = true;
            assert!(
                p.predicted_decode_tok_s >= one * SPLIT_MARGIN,
                "{lat} us: {p:?}"
            );
        } else {
            seen.1 = true;
            let forced = Request {
                strategy: Some(StrategyChoice::Tensor),
                ..req()
            };
            let split = place(&model(), &nodes, &links, &forced).unwrap();
            assert!(
                split.predicted_decode_tok_s < one * SPLIT_MARGIN,
                "{lat} us"
            );
        }
    }
    assert_eq!(seen, (true, true), "the sweep crosses the margin");
}

#[test]
fn a_forced_multi_node_strategy_uses_at_least_two_nodes() {
    let (nodes, links) = triangle(64.0, 100.0, 10.0);
    for s in [StrategyChoice::Tensor, StrategyChoice::Pipeline] {
        let r = Request {
            strategy: Some(s),
            ..req()
        };
        let p = place(&model(), &nodes, &links, &r).expect("placement");
        assert_eq!(p.strategy, s);
        assert!(p.nodes.len() >= 2, "{p:?}");
    }
    // Unforced over slow links, the model stays on one node.
    let (nodes, links) = triangle(64.0, 100.0, 1000.0);
    let p = place(&model(), &nodes, &links, &req()).expect("placement");
    assert_eq!(p.nodes.len(), 1, "{p:?}");
}

#[test]
fn too_little_memory_is_refused_with_the_shortfall() {
    let nodes = [node("a", 0.3, 30.0), node("b", 0.2, 30.0)];
    let err = place(&model(), &nodes, &[link("a", "b", 5.0)], &req()).unwrap_err();
    let PlacementError::DoesNotFit { missing, .. } = &err else {
        panic!("{err:?}");
    };
    assert!(*missing > 100_000_000, "{err}");
    assert!(err.to_string().contains("missing"), "{err}");
}

#[test]
fn every_sequence_and_the_prefix_cache_are_reserved() {
    // 0.6 GB of weights, 0.27 GB of cache per 4,096-position sequence, 64 MiB per node.
    let (nodes, links) = triangle(1.2, 30.0, 300.0);
    let one = place(&model(), &nodes, &links, &req()).unwrap();
    assert_eq!(one.nodes.len(), 1, "{one:?}");
    // Four sequences' caches (1.07 GB) no longer fit beside the weights on one node.
    let four = Request {
        sequences: 4,
        ..req()
    };
    let p = place(&model(), &nodes, &links, &four).unwrap();
    assert_eq!(p.nodes.len(), 2, "{p:?}");
    assert!(
        p.explanation.contains("in each of 4 sequences"),
        "{}",
        p.explanation
    );
    // And a 1 GB prefix cache on top needs the third.
    let cached = Request {
        prefix_cache: GB,
        ..four.clone()
    };
    let p = place(&model(), &nodes, &links, &cached).unwrap();
    assert_eq!(p.nodes.len(), 3, "{p:?}");
    assert!(
        p.explanation.contains("1.00 GB of prefix cache"),
        "{}",
        p.explanation
    );
    // Eight sequences with it are more than the cluster holds, by what they add.
    let err = place(
        &model(),
        &nodes,
        &links,
        &Request {
            sequences: 8,
            ..cached
        },
    )
    .unwrap_err();
    let PlacementError::DoesNotFit {
        needed, available, ..
    } = &err
    else {
        panic!("{err:?}");
    };
    let kv = 65_536 * 4096 * 8;
    assert_eq!(*needed, 600_000_000 + kv + GB + 3 * (64 << 20), "{err}");
    let offered: u64 = nodes.iter().map(|n| n.memory_available).sum();
    assert_eq!(*available, offered, "{err}");
}

#[test]
fn nodes_on_one_machine_share_its_memory_bus_when_they_work_at_once() {
    let forced = |nodes: &[Node], strategy| {
        let r = Request {
            strategy: Some(strategy),
            nodes: Some(vec!["a".into(), "b".into()]),
            ..req()
        };
        place(&model(), nodes, &[link("a", "b", 5.0)], &r)
            .unwrap()
            .predicted_decode_tok_s
    };
    let apart = [node("a", 8.0, 20.0), node("b", 8.0, 20.0)];
    // The same two nodes as processes of one machine whose every core reads 30 GB/s.
    let together: Vec<Node> = apart
        .iter()
        .map(|n| Node {
            machine: "m1".into(),
            machine_bandwidth: 30e9,
            ..n.clone()
        })
        .collect();
    let (tp_apart, tp_together) = (
        forced(&apart, StrategyChoice::Tensor),
        forced(&together, StrategyChoice::Tensor),
    );
    // Each reads at 15 GB/s instead of 20: three quarters of the speed, less what exchanges
    // add (the same in both).
    assert!(
        tp_together < 0.8 * tp_apart && tp_together > 0.7 * tp_apart,
        "{tp_together} vs {tp_apart}"
    );
    // One stream through a pipeline takes the stages in turn: each has the bus to itself.
    let (pp_apart, pp_together) = (
        forced(&apart, StrategyChoice::Pipeline),
        forced(&together, StrategyChoice::Pipeline),
    );
    assert!(
        (pp_together / pp_apart - 1.0).abs() < 1e-9,
        "{pp_together} vs {pp_apart}"
    );
    // Machines whose every core reads more than the nodes together change nothing.
    let roomy: Vec<Node> = together
        .iter()
        .map(|n| Node {
            machine_bandwidth: 50e9,
            ..n.clone()
        })
        .collect();
    let tp_roomy = forced(&roomy, StrategyChoice::Tensor);
    assert!(
        (tp_roomy / tp_apart - 1.0).abs() < 1e-9,
        "{tp_roomy} vs {tp_apart}"
    );
}

#[test]
fn an_absurd_context_is_refused_as_too_big_not_wrapped_to_fitting() {
    // 2^64 / 16384 bytes per position: the cache alone overflows 64 bits of bytes.
    let nodes = [node("a", 64.0, 30.0), node("b", 64.0, 30.0)];
    let r = Request {
        context: usize::MAX / 2,
        ..req()
    };
    let err = place(&model(), &nodes, &[link("a", "b", 5.0)], &r).unwrap_err();
    let PlacementError::DoesNotFit { missing, .. } = &err else {
        panic!("{err:?}");
    };
    assert!(*missing > 1_000_000 * GB, "{err}");
}

#[test]
fn the_fewest_nodes_that_fit_are_used_unless_more_are_clearly_faster() {
    // No node alone holds 0.6 GB of weights plus 0.27 GB of cache; two do.
    let (nodes, links) = triangle(0.6, 30.0, 300.0);
    let p = place(&model(), &nodes, &links, &req()).unwrap();
    assert_eq!(p.nodes.len(), 2, "{p:?}");
    // Over fast links, the third node is worth it.
    let (nodes, links) = triangle(0.6, 30.0, 5.0);
    let p = place(&model(), &nodes, &links, &req()).unwrap();
    assert_eq!(p.nodes.len(), 3, "{p:?}");
    assert!(
        p.explanation.contains("2 nodes could hold it"),
        "{}",
        p.explanation
    );
}

#[test]
fn tensor_gives_way_to_pipeline_where_the_cost_model_says() {
    let nodes = [node("a", 0.6, 30.0), node("b", 0.6, 30.0)];
    let m = model();
    // Equal nodes, equal halves: tensor costs T/2 + L * (4 per layer) + bytes; pipeline costs
    // T + 2 hand-offs. They meet where the latencies make up the T/2 tensor saves.
    let t = m.weight_bytes as f64 / 30e9;
    let bw = 10e9 / 8.0;
    let per_layer_bytes = 4.0 * (m.q_width + m.n_ff + 2 * m.n_embd) as f64 / 2.0;
    let hidden = (4 * m.n_embd) as f64;
    // T/2 + n_layer (4L + B/bw) = T + 2 (L + h/bw)  =>  L* = (T/2 + 2h/bw - n B/bw) / (4n - 2)
    let n = m.n_layer as f64;
    let crossover = (t / 2.0 + 2.0 * hidden / bw - n * per_layer_bytes / bw) / (4.0 * n - 2.0);
    for (factor, want) in [
        (0.9, StrategyChoice::Tensor),
        (1.1, StrategyChoice::Pipeline),
    ] {
        let links = [link("a", "b", crossover * factor * 1e6)];
        let p = place(&m, &nodes, &links, &req()).unwrap();
        assert_eq!(
            p.strategy,
            want,
            "at {:.1} us: {}",
            crossover * factor * 1e6,
            p.explanation
        );
    }
}

#[test]
fn mixed_links_make_a_hybrid() {
    // Two pairs joined by fast links inside, a slow link between: tensor inside, pipeline across.
    let nodes: Vec<Node> = ["a", "b", "c", "d"]
        .iter()
        .map(|n| node(n, 0.3, 30.0))
        .collect();
    let mut links = vec![link("a", "b", 3.0), link("c", "d", 3.0)];
    for (x, y) in [("a", "c"), ("a", "d"), ("b", "c"), ("b", "d")] {
        links.push(link(x, y, 2000.0));
    }
    let p = place(&model(), &nodes, &links, &req()).unwrap();
    assert_eq!(
        p.strategy,
        StrategyChoice::Hybrid { tp: 2 },
        "{}",
        p.explanation
    );
    assert_eq!(p.nodes, vec!["a", "b", "c", "d"]);
}

#[test]
fn shares_follow_measured_speed_within_memory() {
    let nodes = [node("fast", 0.6, 60.0), node("slow", 0.6, 30.0)];
    let p = place(&model(), &nodes, &[link("fast", "slow", 2.0)], &req()).unwrap();
    let w: Vec<f64> = p.weights.clone();
    let fast = p.nodes.iter().position(|n| n == "fast").unwrap();
    // Twice the bandwidth, but 0.6 GB cannot hold two thirds of the model: capped by memory.
    assert!(
        w[fast] > w[1 - fast] && w[fast] < 2.0 * w[1 - fast],
        "{p:?}"
    );
    let nodes = [node("fast", 4.0, 60.0), node("slow", 4.0, 30.0)];
    let forced = Request {
        nodes: Some(vec!["fast".into(), "slow".into()]),
        strategy: Some(StrategyChoice::Tensor),
        ..req()
    };
    let p = place(&model(), &nodes, &[link("fast", "slow", 2.0)], &forced).unwrap();
    let fast = p.nodes.iter().position(|n| n == "fast").unwrap();
    assert!(
        (p.weights[fast] / p.weights[1 - fast] - 2.0).abs() < 1e-9,
        "{p:?}"
    );
}

#[test]
fn unknown_nodes_and_empty_clusters_are_errors() {
    assert_eq!(
        place(&model(), &[], &[], &req()).unwrap_err(),
        PlacementError::NoNodes
    );
    let r = Request {
        nodes: Some(vec!["ghost".into()]),
        ..req()
    };
    assert!(matches!(
        place(&model(), &[node("a", 8.0, 30.0)], &[], &r),
        Err(PlacementError::UnknownNode(_))
    ));
}

#[test]
fn facts_of_the_real_model() {
    let path = strata_store::Store::from_env()
        .expect("store")
        .ensure("smollm2-135m-instruct")
        .expect("model");
    let f = strata_gguf::GgufFile::open(&path).unwrap();
    let m = ModelFacts::from_gguf(&f).unwrap();
    // 96.4 MB streamed per token, a third of it the tied LM head.
    assert!((90_000_000..100_000_000).contains(&m.weight_bytes), "{m:?}");
    assert!(m.head_bytes * 4 > m.weight_bytes, "{m:?}");
    assert_eq!((m.n_layer, m.n_head), (30, 9));
}

proptest! {
    /// Same inputs in any order, same placement; and every placement fits every node's memory.
    #[test]
    fn deterministic_and_within_memory(
        specs in prop::collection::vec((0.05f64..2.0, 5.0f64..80.0), 1..6),
        lat in prop::collection::vec(1.0f64..3000.0, 15),
        rotate in 0usize..6,
    ) {
        let nodes: Vec<Node> = specs
            .iter()
            .enumerate()
            .map(|(i, (m, b))| node(&format!("n{i}"), *m, *b))
            .collect();
        let mut links = Vec::new();
        let mut k = 0;
        for i in 0..nodes.len() {
            for j in i + 1..nodes.len() {
                links.push(link(&nodes[i].id, &nodes[j].id, lat[k % lat.len()]));
                k += 1;
            }
        }
        let a = place(&model(), &nodes, &links, &req());
        let mut shuffled = nodes.clone();
        shuffled.rotate_left(rotate % nodes.len());
        let mut links_rev = links.clone();
        links_rev.reverse();
        let b = place(&model(), &shuffled, &links_rev, &req());
        prop_assert_eq!(&a, &b);
        if let Ok(p) = a {
            let total = model().weight_bytes as f64 + (model().kv_bytes_per_token * 4096) as f64;
            let sum: f64 = p.weights.iter().sum();
            prop_assert!((sum - 1.0).abs() < 1e-6);
            for (id, w) in p.nodes.iter().zip(&p.weights) {
                let n = nodes.iter().find(|n| &n.id == id).unwrap();
                prop_assert!(w * total <= n.memory_available as f64, "{} over memory", id);
            }
        }
    }
}

/// A Qwen3-30B-A3B-like mixture: 17 GB held, 1.7 GB read per token, 128 experts of which 8.
fn moe_model() -> ModelFacts {
    ModelFacts {
        name: "qwen3-30b-a3b".into(),
        weight_bytes: 17 * GB,
        token_bytes: 1_700_000_000,
        moe: true,
        n_expert: 128,
        n_used: 8,
        head_bytes: 300_000_000,
        kv_bytes_per_token: 4 * 48 * 4 * 2 * 128,
        n_layer: 48,
        n_head: 32,
        n_embd: 2048,
        n_ff: 6144,
        default_context: 4096,
        q_width: 4096,
        ..ModelFacts::default()
    }
}

/// A mixture of experts that needs two nodes splits every layer over a fast link (each node
/// reads half of every token's experts), by expert once latency makes the fourth exchange of a
/// column split cost more than expert parallelism's larger all-gather, and by layers over a slow
/// link, where even three exchanges per layer cost more than the halved reading saves.
#[test]
fn a_mixture_of_experts_splits_by_columns_then_experts_then_layers_as_links_slow() {
    let nodes = [node("a", 12.0, 20.0), node("b", 12.0, 20.0)];
    let req = Request {
        context: 4096,
        ..Request::default()
    };
    let at = |us: f64| place(&moe_model(), &nodes, &[link("a", "b", us)], &req).unwrap();
    let fast = at(10.0);
    assert!(
        matches!(
            fast.strategy,
            StrategyChoice::Tensor | StrategyChoice::Expert
        ),
        "{fast:?}"
    );
    let pipe = fast
        .considered
        .iter()
        .find(|(s, _)| *s == StrategyChoice::Pipeline)
        .unwrap()
        .1;
    assert!(fast.predicted_decode_tok_s > 1.5 * pipe, "{fast:?}");
    let mid = at(200.0);
    assert_eq!(mid.strategy, StrategyChoice::Expert, "{mid:?}");
    // The explanation says what a token reads and why experts are split.
    assert!(
        mid.explanation.contains("8 of 128 experts")
            && mid.explanation.contains("expert parallelism"),
        "{}",
        mid.explanation
    );
    let slow = at(2000.0);
    assert_eq!(slow.strategy, StrategyChoice::Pipeline, "{slow:?}");
}
