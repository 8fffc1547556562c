//! Hardware that is not at hand: node and link presets for planning a cluster before buying
//! it. Each preset carries the vendor's rated figures and where they come from
//! (`data/hardware.json`); one set of constants per hardware class turns rated figures into
//! what inference reaches (the share of rated bandwidth a token reads at, what each exchange
//! costs a device per peer). The Apple class's constants are checked against published runs
//! (`published`, every row against the same constants, none fitted to one row); the NVIDIA
//! and server-CPU constants are the usual reached shares, not yet checked against any.

use std::collections::BTreeMap;
use std::sync::OnceLock;

use serde::Deserialize;

use crate::placement::{Link, Node};

/// Why a node or link description cannot be used.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PresetError {
    /// No preset has this name.
    #[error("unknown {what} preset {name:?}; known: {known}")]
    Unknown {
        /// "node" or "link".
        what: &'static str,
        /// The name given.
        name: String,
        /// The presets there are.
        known: String,
    },
    /// A `--nodes` item is not `PRESET` or `COUNTx PRESET`.
    #[error("{0}")]
    BadSpec(String),
}

/// The constants of one hardware class.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct Class {
    /// What the class is.
    pub about: String,
    /// Share of the rated memory bandwidth decoding reaches.
    pub bandwidth_efficiency: f64,
    /// Share of the rated matrix throughput prefill reaches.
    pub compute_efficiency: f64,
    /// Per-peer cost of each exchange beyond the link, microseconds.
    pub message_overhead_us: f64,
    /// Share of the memory a model may take.
    pub usable_memory: f64,
}

/// A node preset: rated figures.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct NodePreset {
    /// `--nodes` name.
    pub id: String,
    /// What it is.
    pub name: String,
    /// Its class (a key of the classes table).
    pub class: String,
    /// Accelerators in the box, one tensor-parallel group over its own fabric.
    pub devices: usize,
    /// Memory, GB.
    pub memory_gb: f64,
    /// Rated memory bandwidth, GB/s (all devices).
    pub bandwidth_gbs: f64,
    /// Rated dense FP16/BF16 matrix throughput, TFLOP/s (all devices).
    pub tflops: f64,
    /// Power drawn while decoding, watts.
    pub power_w: f64,
    /// Performance cores, for presets of CPUs (0: not given).
    #[serde(default)]
    pub p_cores: usize,
    /// Efficiency cores, for presets of CPUs.
    #[serde(default)]
    pub e_cores: usize,
    /// Where the figures come from.
    pub source: String,
}

impl NodePreset {
    /// What a prediction on this preset assumes runs the model, in words: Apple silicon is
    /// planned either as its GPU (what MLX and llama.cpp's Metal backend use, and what the
    /// published exo rows measure) or as its CPU cores (what strata computes on), and the two
    /// reach different shares of the same memory, so the plan says which one it took.
    pub fn engine_class(&self, presets: &Presets) -> Option<String> {
        match self.class.as_str() {
            "apple" => {
                let cpu = format!("{}-cpu", self.id);
                let hint = if presets.node(&cpu).is_ok() {
                    format!("; strata computes on the CPU cores: plan those with {cpu}")
                } else {
                    "; strata computes on the CPU cores, which reach less".to_string()
                };
                Some(format!(
                    "{}: GPU-class figures (Metal engines: MLX, llama.cpp){hint}",
                    self.id
                ))
            }
            "apple-cpu" => Some(format!(
                "{}: CPU-class figures ({} performance + {} efficiency cores, as strata runs)",
                self.id, self.p_cores, self.e_cores
            )),
            _ => None,
        }
    }
}

/// A link preset: latency and bandwidth, or measured on this machine.
#[derive(Clone, Debug, Deserialize, PartialEq)]
pub struct LinkPreset {
    /// `--link` name.
    pub id: String,
    /// What it is.
    pub name: String,
    /// One-way latency of a message, microseconds.
    #[serde(default)]
    pub latency_us: f64,
    /// Bandwidth, Gbit/s.
    #[serde(default)]
    pub bandwidth_gbit: f64,
    /// The transport to measure instead ("shm" or "tcp"), for links on this machine.
    #[serde(default)]
    pub measured: Option<String>,
    /// Kernel-bypass (RDMA): a message costs the sending and receiving CPU about what a write
    /// to shared memory does, not a pass through the kernel's TCP stack each way. Emulated on
    /// one machine over shared memory, where TCP links are emulated over TCP.
    #[serde(default)]
    pub rdma: bool,
    /// Where the figures come from.
    pub source: String,
}

/// The presets file.
#[derive(Clone, Debug, Deserialize)]
pub struct Presets {
    /// What the file holds.
    pub about: String,
    /// Constants per class.
    pub classes: BTreeMap<String, Class>,
    /// Node presets.
    pub nodes: Vec<NodePreset>,
    /// Link presets.
    pub links: Vec<LinkPreset>,
}

/// The presets shipped with strata.
pub fn presets() -> &'static Presets {
    static P: OnceLock<Presets> = OnceLock::new();
    P.get_or_init(|| {
        // The file is part of the crate and checked by its tests; a broken one is a build
        // defect, not input.
        #[allow(clippy::expect_used)]
        serde_json::from_str(include_str!("../data/hardware.json"))
            .expect("data/hardware.json parses")
    })
}

impl Presets {
    /// The node preset called `id`.
    pub fn node(&self, id: &str) -> Result<&NodePreset, PresetError> {
        self.nodes
            .iter()
            .find(|n| n.id.eq_ignore_ascii_case(id))
            .ok_or_else(|| PresetError::Unknown {
                what: "node",
                name: id.to_string(),
                known: self
                    .nodes
                    .iter()
                    .map(|n| n.id.as_str())
                    .chain(["this-machine"])
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }

    /// The link preset called `id`.
    pub fn link(&self, id: &str) -> Result<&LinkPreset, PresetError> {
        self.links
            .iter()
            .find(|l| l.id.eq_ignore_ascii_case(id))
            .ok_or_else(|| PresetError::Unknown {
                what: "link",
                name: id.to_string(),
                known: self
                    .links
                    .iter()
                    .map(|l| l.id.as_str())
                    .collect::<Vec<_>>()
                    .join(", "),
            })
    }

    /// The constants of `class`.
    pub fn class(&self, class: &str) -> Option<&Class> {
        self.classes.get(class)
    }
}

impl NodePreset {
    /// The planner's node for this preset, named `id`: rated figures through its class's
    /// constants.
    pub fn node(&self, id: String, class: &Class) -> Node {
        Node {
            id,
            memory_available: (self.memory_gb * 1e9 * class.usable_memory) as u64,
            mem_bandwidth: self.bandwidth_gbs * 1e9 * class.bandwidth_efficiency,
            flops: self.tflops * 1e12 * class.compute_efficiency,
            message_overhead: class.message_overhead_us * 1e-6,
            power_watts: self.power_w,
            devices: self.devices,
            ..Node::default()
        }
    }
}

/// Splits a `--nodes` description into (count, preset name) items: `4x m3-ultra-512`,
/// `m3-ultra-512,m3-ultra-256`, `2x m4-pro-mini-64, dgx-spark`.
pub fn parse_nodes(spec: &str) -> Result<Vec<(usize, String)>, PresetError> {
    let mut out = Vec::new();
    for item in spec.split(',').map(str::trim) {
        if item.is_empty() {
            return Err(PresetError::BadSpec(format!(
                "--nodes {spec:?} has an empty item; give presets separated by commas, each \
                 optionally as COUNTx PRESET (e.g. 4x m3-ultra-512)"
            )));
        }
        let (count, name) = match item.split_once(['x', 'X']) {
            Some((n, rest)) if !n.is_empty() && n.trim().chars().all(|c| c.is_ascii_digit()) => {
                let n: usize = n.trim().parse().map_err(|_| {
                    PresetError::BadSpec(format!("--nodes: {n:?} is not a node count"))
                })?;
                (n, rest.trim())
            }
            _ => (1, item),
        };
        if count == 0 || count > 256 {
            return Err(PresetError::BadSpec(format!(
                "--nodes: {item:?} asks for {count} nodes; give 1 to 256"
            )));
        }
        if name.is_empty() {
            return Err(PresetError::BadSpec(format!(
                "--nodes: {item:?} names no preset"
            )));
        }
        out.push((count, name.to_string()));
    }
    Ok(out)
}

/// The nodes of a `--nodes` description, each named for its preset (numbered when several),
/// and links of one kind between every pair. `this_machine` stands for the preset
/// `this-machine` (measured by the caller).
pub fn cluster(
    items: &[(usize, String)],
    latency: f64,
    bandwidth: f64,
    this_machine: Option<&Node>,
) -> Result<(Vec<Node>, Vec<Link>), PresetError> {
    presets().cluster(items, latency, bandwidth, this_machine)
}

impl Presets {
    /// [`cluster`] with these presets' constants (the fit tries other constants this way).
    pub fn cluster(
        &self,
        items: &[(usize, String)],
        latency: f64,
        bandwidth: f64,
        this_machine: Option<&Node>,
    ) -> Result<(Vec<Node>, Vec<Link>), PresetError> {
        let p = self;
        let mut nodes = Vec::new();
        for (count, name) in items {
            let template = match this_machine {
                Some(n) if name.eq_ignore_ascii_case("this-machine") => n.clone(),
                _ => {
                    let preset = p.node(name)?;
                    let class = p.class(&preset.class).ok_or_else(|| {
                        PresetError::BadSpec(format!(
                            "preset {} names the unknown class {}",
                            preset.id, preset.class
                        ))
                    })?;
                    preset.node(preset.id.clone(), class)
                }
            };
            for i in 0..*count {
                let mut n = template.clone();
                let base = name.to_ascii_lowercase();
                n.id = if *count == 1 {
                    base
                } else {
                    format!("{base}-{}", i + 1)
                };
                // The same preset named twice in a list still gets distinct ids.
                if nodes.iter().any(|m: &Node| m.id == n.id) {
                    n.id = format!("{}-{}", n.id, nodes.len() + 1);
                }
                nodes.push(n);
            }
        }
        let links = full_mesh(&nodes, latency, bandwidth);
        Ok((nodes, links))
    }
}

/// Links between every pair of `nodes`, all of one kind.
pub fn full_mesh(nodes: &[Node], latency: f64, bandwidth: f64) -> Vec<Link> {
    let mut links = Vec::new();
    for (i, a) in nodes.iter().enumerate() {
        for b in &nodes[i + 1..] {
            links.push(Link {
                a: a.id.clone(),
                b: b.id.clone(),
                latency,
                bandwidth,
            });
        }
    }
    links
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn every_preset_names_a_class_and_a_source_and_has_sane_figures() {
        let p = presets();
        for n in &p.nodes {
            let class = p.class(&n.class).unwrap();
            assert!(class.bandwidth_efficiency > 0.3 && class.bandwidth_efficiency <= 1.0);
            assert!(n.memory_gb > 0.0 && n.bandwidth_gbs > 0.0 && n.tflops > 0.0);
            assert!(n.power_w > 0.0 && n.devices >= 1, "{}", n.id);
            assert!(n.source.len() > 10, "{} cites no source", n.id);
        }
        for l in &p.links {
            assert!(
                l.measured.is_some() || (l.latency_us > 0.0 && l.bandwidth_gbit > 0.0),
                "{}",
                l.id
            );
            assert!(l.source.len() > 10, "{} cites no source", l.id);
        }
    }

    #[test]
    fn node_lists_parse_counts_and_commas() {
        assert_eq!(
            parse_nodes("4x m3-ultra-512").unwrap(),
            vec![(4, "m3-ultra-512".to_string())]
        );
        assert_eq!(
            parse_nodes("2X m4-pro-mini-64, dgx-spark").unwrap(),
            vec![(2, "m4-pro-mini-64".into()), (1, "dgx-spark".into())]
        );
        // A preset whose name holds an x is not a count.
        assert_eq!(
            parse_nodes("xeon-8480").unwrap(),
            vec![(1, "xeon-8480".into())]
        );
        assert!(parse_nodes("0x dgx-spark").is_err());
        assert!(parse_nodes("dgx-spark,,").is_err());
        let e = presets().node("m9-ultra").unwrap_err().to_string();
        assert!(e.contains("unknown node preset \"m9-ultra\"") && e.contains("dgx-spark"));
    }
}
