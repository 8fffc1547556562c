//! `strata models`: list, pull, verify, remove and locate models in the local store.
//!
//! A thin layer over `strata_store::Store`: this module parses arguments, draws progress and
//! formats output; every decision about files, hashes and locking is the store's.

use std::io::Write;

use anyhow::Context;
use strata_store::{ModelStatus, Store, TerminalProgress};

/// Manage downloaded models (`$STRATA_HOME`, default `~/.cache/strata`).
#[derive(Debug, clap::Args)]
pub(crate) struct ModelsArgs {
    #[command(subcommand)]
    cmd: ModelsCmd,
}

#[derive(Debug, clap::Subcommand)]
enum ModelsCmd {
    /// List the catalog and which models are downloaded.
    List {
        /// Print JSON (one array of objects) instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Download a model, check its SHA-256 and install it (re-checks it if already present).
    Pull {
        /// Model id, as shown by `strata models list`.
        id: String,
    },
    /// Re-hash a downloaded model and compare with its catalog SHA-256.
    Verify {
        /// Model id.
        id: String,
    },
    /// Delete a downloaded model.
    #[command(visible_alias = "remove")]
    Rm {
        /// Model id.
        id: String,
    },
    /// Print the path of a downloaded model (fails if it is not downloaded).
    Path {
        /// Model id.
        id: String,
    },
}

/// Runs a `strata models` subcommand.
pub(crate) fn run(args: ModelsArgs) -> anyhow::Result<()> {
    let store = Store::from_env()?;
    match args.cmd {
        ModelsCmd::List { json } => list(&store, json),
        ModelsCmd::Pull { id } => {
            let card = store.catalog().card(&id)?;
            let mut progress = TerminalProgress::stderr();
            let pulled = store.pull(card, &mut |event| progress.handle(event));
            progress.finish();
            let path = pulled.with_context(|| format!("pulling {id}"))?;
            println!("{}", path.display());
            Ok(())
        }
        ModelsCmd::Verify { id } => {
            let path = store.verify(&id)?;
            let card = store.catalog().card(&id)?;
            println!("ok {id} sha256 {} {}", card.sha256, path.display());
            Ok(())
        }
        ModelsCmd::Rm { id } => {
            if store.remove(&id)? {
                println!("removed {id}");
            } else {
                println!("{id} was not downloaded");
            }
            Ok(())
        }
        ModelsCmd::Path { id } => {
            let path = store.path(&id)?;
            if !store.is_present(&id)? {
                anyhow::bail!(
                    "model '{id}' is not downloaded (expected at {}); run `strata models pull {id}`",
                    path.display()
                );
            }
            println!("{}", path.display());
            Ok(())
        }
    }
}

fn list(store: &Store, json: bool) -> anyhow::Result<()> {
    let models = store.list();
    let mut out = std::io::stdout().lock();
    if json {
        serde_json::to_writer_pretty(&mut out, &models)?;
        writeln!(out)?;
    } else {
        write!(out, "{}", table(&models))?;
        writeln!(out, "store: {}  (* = default)", store.root().display())?;
    }
    Ok(())
}

/// The `list` table: one row per model, columns padded to their widest cell.
fn table(models: &[ModelStatus]) -> String {
    let header = ["ID", "FAMILY", "PARAMS", "QUANT", "SIZE", "PRESENT"];
    let rows: Vec<[String; 6]> = models
        .iter()
        .map(|m| {
            let mark = if m.is_default { "*" } else { "" };
            [
                format!("{}{mark}", m.card.id),
                m.card.family.clone(),
                m.card.params.clone(),
                m.card.quant.clone(),
                human_size(m.card.size),
                if m.present { "yes" } else { "no" }.to_string(),
            ]
        })
        .collect();
    let mut widths = header.map(str::len);
    for row in &rows {
        for (w, cell) in widths.iter_mut().zip(row) {
            *w = (*w).max(cell.len());
        }
    }
    let mut text = String::new();
    let mut push_row = |cells: &[&str]| {
        let line: Vec<String> = cells
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        text.push_str(line.join("  ").trim_end());
        text.push('\n');
    };
    push_row(&header);
    for row in &rows {
        push_row(&row.each_ref().map(String::as_str));
    }
    text
}

/// Sizes in binary units with one decimal, as `ls -lh` and pip show them.
fn human_size(bytes: u64) -> String {
    const UNITS: [&str; 4] = ["KiB", "MiB", "GiB", "TiB"];
    if bytes < 1024 {
        return format!("{bytes} B");
    }
    let mut value = bytes as f64 / 1024.0;
    let mut unit = 0;
    while value >= 1024.0 && unit + 1 < UNITS.len() {
        value /= 1024.0;
        unit += 1;
    }
    format!("{value:.1} {}", UNITS[unit])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn human_sizes() {
        assert_eq!(human_size(512), "512 B");
        assert_eq!(human_size(98_362_432), "93.8 MiB");
        assert_eq!(human_size(253_113_024), "241.4 MiB");
        assert_eq!(human_size(3 << 30), "3.0 GiB");
    }

    #[test]
    fn table_lists_every_model_with_aligned_columns() {
        let store = Store::new("/nonexistent/strata-test-root");
        let text = table(&store.list());
        let lines: Vec<&str> = text.lines().collect();
        assert_eq!(lines.len(), 1 + store.catalog().cards().len());
        assert!(lines[0].starts_with("ID"));
        assert!(lines[1].starts_with("smollm2-135m-instruct*"));
        assert!(lines[1].ends_with("no"));
        let col = lines[0].find("FAMILY").unwrap_or(0);
        assert_eq!(lines[2].find("gemma3 "), Some(col));
    }
}
