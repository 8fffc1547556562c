//! Serves a directory of repositories with the Hugging Face hub's download protocol, for
//! checking strata's hub client (or the official one) against a hub that is all local.

use anyhow::{Context as _, Result};
use clap::Parser;
use std::net::IpAddr;
use std::path::PathBuf;

/// A local Hugging Face hub serving ROOT/OWNER/NAME/... .
#[derive(Parser, Debug)]
#[command(name = "strata-testhub")]
struct Args {
    /// Directory whose OWNER/NAME subdirectories are the repositories.
    #[arg(long)]
    root: PathBuf,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1")]
    bind: IpAddr,
    /// The API's port (0 picks one).
    #[arg(long, default_value_t = 0)]
    port: u16,
    /// The CDN's port (0 picks one).
    #[arg(long, default_value_t = 0)]
    cdn_port: u16,
    /// A gated repository and the tokens granted it: OWNER/NAME=TOKEN[,TOKEN...].
    #[arg(long)]
    gated: Vec<String>,
    /// A private repository and the tokens that see it: OWNER/NAME=TOKEN[,TOKEN...].
    #[arg(long)]
    private: Vec<String>,
    /// Tree listings come in pages of this many entries.
    #[arg(long, default_value_t = 1000)]
    page_size: usize,
    /// The CDN's limit per connection, in bytes per second (0: none).
    #[arg(long, default_value_t = 0)]
    stream_rate: u64,
}

fn grant(spec: &str) -> Result<(String, Vec<String>)> {
    let (repo, tokens) = spec
        .split_once('=')
        .with_context(|| format!("{spec}: expected OWNER/NAME=TOKEN[,TOKEN...]"))?;
    Ok((
        repo.to_string(),
        tokens.split(',').map(str::to_string).collect(),
    ))
}

fn main() -> Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    let args = Args::parse();
    let mut b = strata_testhub::TestHub::builder(&args.root)
        .bind(args.bind)
        .api_port(args.port)
        .cdn_port(args.cdn_port)
        .page_size(args.page_size);
    for g in &args.gated {
        let (repo, tokens) = grant(g)?;
        let t: Vec<&str> = tokens.iter().map(String::as_str).collect();
        b = b.gated(&repo, &t);
    }
    for p in &args.private {
        let (repo, tokens) = grant(p)?;
        let t: Vec<&str> = tokens.iter().map(String::as_str).collect();
        b = b.private(&repo, &t);
    }
    let hub = b
        .start()
        .with_context(|| format!("serving {}", args.root.display()))?;
    hub.faults().set_stream_rate(args.stream_rate);
    println!("endpoint {}", hub.endpoint());
    loop {
        std::thread::park();
    }
}
