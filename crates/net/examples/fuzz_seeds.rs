//! Writes the valid inputs of every decoder of the `data_plane_frames` fuzz target (what a
//! well-behaved peer sends, `strata_net::fuzz::seeds`) into a corpus directory, so libFuzzer
//! starts past the checks it cannot forge its way through (sealed records).
//!
//! `cargo run -p strata-net --example fuzz_seeds -- fuzz/corpus/data_plane_frames`

fn main() -> std::io::Result<()> {
    let dir = std::env::args()
        .nth(1)
        .unwrap_or_else(|| "fuzz/corpus/data_plane_frames".into());
    std::fs::create_dir_all(&dir)?;
    for (i, seed) in strata_net::fuzz::seeds().iter().enumerate() {
        std::fs::write(format!("{dir}/seed-{i}"), seed)?;
    }
    Ok(())
}
