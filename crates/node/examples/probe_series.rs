//! How steady the node's probes are here: the Q4_1 and Q8_0 matmul probes and the row cost,
//! taken again and again for a while, one line each.
//!
//! `cargo run --release -p strata-node --example probe_series [SECONDS]`
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use strata_kernels::{GgmlType, ThreadPool};
use strata_node::profile;

fn main() {
    let secs: u64 = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(10);
    let pool = ThreadPool::new(1);
    let start = Instant::now();
    println!("t_s q4_1_one_15ms q4_1_best3 q8_0_best3 row_cost_ns");
    while start.elapsed() < Duration::from_secs(secs) {
        let t = start.elapsed().as_secs_f64();
        let one = profile::matmul_gflops_of(&pool, GgmlType::Q4_1, 1, Duration::from_millis(15));
        let q41 = profile::matmul_gflops_of(&pool, GgmlType::Q4_1, 3, Duration::from_millis(15));
        let q80 = profile::matmul_gflops_of(&pool, GgmlType::Q8_0, 3, Duration::from_millis(15));
        let att = profile::attention_speed(1);
        let rc = profile::row_cost_s(1, &att);
        println!("{t:.2} {one:.1} {q41:.1} {q80:.1} {:.2}", rc * 1e9);
    }
}
