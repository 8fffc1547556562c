//! Download throughput against a local hub: one stream against parallel ranges.
//!
//! `cargo run --release -p strata-hub --example download_bench -- [SIZE_MIB] [RATE_MB_S] [RUNS]`
//!
//! A CDN limits each connection; this hub does too (`RATE_MB_S` per stream, 0 for none), so
//! the figures show what parallel ranges buy where a single connection is the bottleneck, and
//! what they cost where it is not (loopback, no limit). Each setting is pulled `RUNS` times
//! into an empty cache; the median is printed as a Markdown table.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::{Duration, Instant};

use strata_hub::{Hub, HubCache, HubRef, Retry, Transfer};
use strata_testhub::TestHub;

fn arg(i: usize, default: u64) -> u64 {
    std::env::args()
        .nth(i)
        .and_then(|a| a.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let size_mib = arg(1, 256);
    let rate = arg(2, 40) * 1_000_000;
    let runs = arg(3, 3).max(1) as usize;
    let dir = tempfile::tempdir().expect("tempdir");
    let repo = dir.path().join("root/bench/model");
    std::fs::create_dir_all(&repo).expect("repo dir");
    let mut x = 0x2545_f491_4f6c_dd1du64;
    let bytes: Vec<u8> = (0..size_mib << 20)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect();
    std::fs::write(repo.join("m-Q8_0.gguf"), &bytes).expect("model file");
    drop(bytes);
    let hub = TestHub::builder(dir.path().join("root"))
        .start()
        .expect("test hub");
    let r = HubRef::parse("bench/model").expect("reference");
    println!("| per-stream limit | streams | median | throughput |");
    println!("| --- | ---: | ---: | ---: |");
    for limit in [rate, 0] {
        hub.faults().set_stream_rate(limit);
        for streams in [1usize, 4, 8] {
            let mut times = Vec::new();
            for run in 0..runs {
                let cache = dir.path().join(format!("cache-{limit}-{streams}-{run}"));
                let client = Hub::new(&hub.endpoint(), None, HubCache::new(&cache))
                    .with_transfer(Transfer {
                        streams,
                        chunk: 32 << 20,
                    })
                    .with_retry(Retry::default());
                let t = Instant::now();
                client.pull(&r, &mut |_| {}).expect("pull");
                times.push(t.elapsed());
                let _ = std::fs::remove_dir_all(&cache);
            }
            times.sort();
            let median: Duration = times[times.len() / 2];
            let mb_s = (size_mib << 20) as f64 / median.as_secs_f64() / 1e6;
            let shown = if limit == 0 {
                "none (loopback)".to_string()
            } else {
                format!("{} MB/s", limit / 1_000_000)
            };
            println!(
                "| {shown} | {streams} | {:.2} s | {mb_s:.0} MB/s |",
                median.as_secs_f64()
            );
        }
    }
}
