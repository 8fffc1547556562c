//! Shard plans on the real model: every strategy tiles the model exactly (each layer, head, FFN
//! column, model-width row and vocabulary row owned once per stage), weights shift work, and
//! plans the model cannot take are refused.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::ops::Range;

use strata_engine::{Combine, ModelConfig};
use strata_gguf::GgufFile;
use strata_parallel::{CombineStyle, Strategy, make_plan};

fn model() -> (GgufFile, ModelConfig) {
    let path = strata_store::Store::from_env()
        .expect("store")
        .ensure("smollm2-135m-instruct")
        .expect("model");
    let f = GgufFile::open(&path).expect("open");
    let cfg = ModelConfig::from_gguf(&f).expect("config");
    (f, cfg)
}

fn tiles(ranges: &[Range<usize>], total: usize) -> bool {
    ranges.first().map(|r| r.start) == Some(0)
        && ranges.last().map(|r| r.end) == Some(total)
        && ranges.windows(2).all(|w| w[0].end == w[1].start)
        && ranges.iter().all(|r| !r.is_empty())
}

#[test]
fn every_strategy_tiles_the_model() {
    let (f, cfg) = model();
    for (strategy, world) in [
        (Strategy::Tensor, 2),
        (Strategy::Tensor, 3),
        (Strategy::Pipeline, 2),
        (Strategy::Pipeline, 3),
        (Strategy::Hybrid { tp: 2 }, 4),
        (Strategy::Hybrid { tp: 3 }, 6),
        (Strategy::Tensor, 4),
        (Strategy::Tensor, 9),
    ] {
        for style in [CombineStyle::Gather, CombineStyle::Reduce] {
            let plan = make_plan(&f, &cfg, strategy, world, None, style).expect("plan");
            assert_eq!(plan.world(), world);
            let layers: Vec<_> = plan
                .stages
                .iter()
                .map(|g| plan.ranks[g[0]].spec.layers.clone())
                .collect();
            assert!(tiles(&layers, cfg.n_layer), "{strategy:?}: {layers:?}");
            for (s, group) in plan.stages.iter().enumerate() {
                let specs: Vec<_> = group.iter().map(|&r| &plan.ranks[r].spec).collect();
                assert!(specs.iter().all(|sp| sp.layers == layers[s]));
                let kv: Vec<_> = specs.iter().map(|sp| sp.q_heads.clone()).collect();
                let ffn: Vec<_> = specs.iter().map(|sp| sp.ffn.clone()).collect();
                assert!(tiles(&kv, cfg.n_head), "{strategy:?} {kv:?}");
                assert!(tiles(&ffn, cfg.n_ff), "{strategy:?} {ffn:?}");
                if style == CombineStyle::Gather {
                    let embd: Vec<_> = specs
                        .iter()
                        .map(|sp| match &sp.combine {
                            Combine::Gather { embd } => embd.clone(),
                            Combine::Reduce => unreachable!(),
                        })
                        .collect();
                    assert!(tiles(&embd, cfg.n_embd), "{embd:?}");
                    assert_eq!(plan.parts[s].embd, embd);
                }
                if s + 1 == plan.stages.len() {
                    let vocab: Vec<_> = specs.iter().map(|sp| sp.vocab.clone()).collect();
                    assert!(tiles(&vocab, cfg.n_vocab), "{vocab:?}");
                }
                assert_eq!(plan.parts[s].ffn, ffn);
                assert!(tiles(&plan.parts[s].q, cfg.q_width()));
            }
        }
    }
}

#[test]
fn the_stage_with_the_lm_head_gets_fewer_layers_and_weights_shift_work() {
    let (f, cfg) = model();
    let plan = make_plan(&f, &cfg, Strategy::Pipeline, 2, None, CombineStyle::Gather).unwrap();
    let (a, b) = (&plan.ranks[0].spec.layers, &plan.ranks[1].spec.layers);
    // SmolLM2's tied LM head weighs about as much as 14 of its 30 layers.
    assert!(a.len() > b.len() + 6, "{a:?} {b:?}");
    let weighted = make_plan(
        &f,
        &cfg,
        Strategy::Tensor,
        2,
        Some(&[3.0, 1.0]),
        CombineStyle::Gather,
    )
    .unwrap();
    let (r0, r1) = (&weighted.ranks[0].spec, &weighted.ranks[1].spec);
    assert!(
        r0.ffn.len() >= 3 * r1.ffn.len() - 64,
        "{:?} {:?}",
        r0.ffn,
        r1.ffn
    );
    assert!(r0.vocab.len() > 2 * r1.vocab.len());
}

#[test]
fn plans_the_model_cannot_take_are_refused() {
    let (f, cfg) = model();
    let g = CombineStyle::Gather;
    assert!(make_plan(&f, &cfg, Strategy::Tensor, 10, None, g).is_err());
    assert!(make_plan(&f, &cfg, Strategy::Pipeline, 31, None, g).is_err());
    assert!(make_plan(&f, &cfg, Strategy::Hybrid { tp: 2 }, 3, None, g).is_err());
    assert!(make_plan(&f, &cfg, Strategy::Tensor, 2, Some(&[1.0]), g).is_err());
    assert!(make_plan(&f, &cfg, Strategy::Tensor, 2, Some(&[1.0, f64::NAN]), g).is_err());
}
