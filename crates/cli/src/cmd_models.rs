//! `strata models`: list, pull, verify, remove, locate and import models in the local store.
//!
//! A thin layer over `strata_store::Store`: this module parses arguments, draws progress and
//! formats output; every decision about files, hashes and locking is the store's. The one thing
//! it adds is for `import`: the store never reads GGUF, so this module checks that the file
//! loads in the engine and reads the card's description of it from its metadata.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use strata_gguf::{GgmlType, GgufFile};
use strata_store::{
    ImportMeta, ImportMethod, ModelStatus, Store, TerminalProgress, check_import_id,
    default_import_id,
};

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
    /// `hf:OWNER/REPO[:QUANT][@REVISION]` pulls from the Hugging Face hub into its cache,
    /// fetching only what is not there yet.
    Pull {
        /// Model id, as shown by `strata models list`, or an `hf:` id.
        id: String,
    },
    /// Re-hash a downloaded model and compare with its catalog SHA-256 (for an hf: id, with
    /// the hub's hash of each file; a node's shard, held in part, is reported as such).
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
    /// Add a local GGUF file to the store under an id, once it is checked to load; it then runs
    /// by id and nodes of a cluster can copy it from this one.
    Import {
        /// The GGUF file. It is hard-linked into the store when on the same file system, else
        /// copied.
        path: PathBuf,
        /// Id to store it under. Default: the file name, lowercased, without `.gguf`, with
        /// characters outside [a-z0-9._-] replaced by '-'.
        #[arg(long)]
        id: Option<String>,
    },
}

/// Runs a `strata models` subcommand.
pub(crate) fn run(args: ModelsArgs) -> anyhow::Result<()> {
    let mut store = Store::from_env()?;
    match args.cmd {
        ModelsCmd::List { json } => list(&store, json),
        ModelsCmd::Pull { id } if id.starts_with(strata_hub::SCHEME) => {
            let mut progress = TerminalProgress::stderr();
            let pulled = store.pull_hub(&id, &mut |event| progress.handle(event));
            progress.finish();
            let pulled = pulled.with_context(|| format!("pulling {id}"))?;
            let first = pulled.paths.first().context("the hub listed no file")?;
            eprintln!(
                "{id}: {} in {} file(s) at commit {}, {} downloaded",
                strata_hub::human(pulled.size),
                pulled.paths.len(),
                pulled.commit,
                strata_hub::human(pulled.fetched)
            );
            println!("{}", first.display());
            Ok(())
        }
        ModelsCmd::Pull { id } => {
            let card = card(&store, &id, "pull")?;
            let mut progress = TerminalProgress::stderr();
            let pulled = store.pull(card, &mut |event| progress.handle(event));
            progress.finish();
            let path = pulled.with_context(|| format!("pulling {id}"))?;
            println!("{}", path.display());
            Ok(())
        }
        ModelsCmd::Verify { id } if id.starts_with(strata_hub::SCHEME) => verify_hub(&id),
        ModelsCmd::Verify { id } => {
            card(&store, &id, "verify")?;
            let path = store.verify(&id)?;
            let card = store.catalog().card(&id)?;
            println!("ok {id} sha256 {} {}", card.sha256, path.display());
            Ok(())
        }
        ModelsCmd::Rm { id } if id.starts_with(strata_hub::SCHEME) => {
            let r = strata_hub::HubRef::parse(&id[strata_hub::SCHEME.len()..])
                .map_err(|why| anyhow::anyhow!("{id}: {why}"))?;
            let cache = strata_hub::HubCache::from_env()
                .context("no Hugging Face cache folder (set HF_HUB_CACHE or HF_HOME)")?;
            let gone = cache.remove(&r).with_context(|| format!("removing {id}"))?;
            println!(
                "removed {id}: {} file(s), {} freed",
                gone.files,
                strata_hub::human(gone.bytes)
            );
            Ok(())
        }
        ModelsCmd::Rm { id } => {
            let imported = card(&store, &id, "rm")?.is_import();
            if store.remove(&id)? {
                let card = if imported { " and its import card" } else { "" };
                println!("removed {id}{card}");
            } else if imported {
                println!("{id} was not on this node; removed its import card");
            } else {
                println!("{id} was not downloaded");
            }
            Ok(())
        }
        ModelsCmd::Path { id } => {
            card(&store, &id, "path")?;
            let path = store.path(&id)?;
            if !store.is_present(&id)? {
                if store.catalog().card(&id)?.is_import() {
                    return Err(strata_store::Error::ImportNotPresent { id }.into());
                }
                anyhow::bail!(
                    "model '{id}' is not downloaded (expected at {}); run `strata models pull {id}`",
                    path.display()
                );
            }
            println!("{}", path.display());
            Ok(())
        }
        ModelsCmd::Import { path, id } => import(&mut store, &path, id),
    }
}

/// `id`'s card, or an error in `strata models CMD`'s own words: these commands take ids only
/// (the store's own message tells `run` and `serve` users to give a path instead).
fn card<'a>(store: &'a Store, id: &str, cmd: &str) -> anyhow::Result<&'a strata_store::ModelCard> {
    match store.catalog().card(id) {
        Ok(card) => Ok(card),
        Err(strata_store::Error::UnknownModel { known, .. }) => anyhow::bail!(
            "`strata models {cmd}` takes a model id, and '{id}' is none (known: {}; \
             `strata models list` shows them); a GGUF file joins the store with \
             `strata models import PATH`",
            known.join(", ")
        ),
        Err(e) => Err(e.into()),
    }
}

/// `strata models import`: checks the id and the file before the store links or copies it, so
/// a refused file leaves nothing behind.
fn import(store: &mut Store, path: &Path, id: Option<String>) -> anyhow::Result<()> {
    let md = std::fs::metadata(path).with_context(|| format!("reading {}", path.display()))?;
    if !md.is_file() {
        anyhow::bail!(
            "{} is not a regular file (expected a .gguf model file)",
            path.display()
        );
    }
    // A part of a split set stands for the whole set, found from its first part: the engine
    // opens the set there, and the header check names a part that is missing or foreign.
    let split = path
        .file_name()
        .and_then(|n| n.to_str())
        .and_then(strata_gguf::split::parse_name)
        .map(|(prefix, _, count)| (prefix.to_string(), count));
    let (first, files) = match &split {
        Some((prefix, count)) => {
            let first = path.with_file_name(strata_gguf::split::part_name(prefix, 1, *count));
            let set = GgufFile::open_header(&first)
                .with_context(|| format!("{} cannot be imported", path.display()))?;
            let files: Vec<PathBuf> = set.paths().into_iter().map(Path::to_path_buf).collect();
            (first, files)
        }
        None => (path.to_path_buf(), vec![path.to_path_buf()]),
    };
    let id = match id {
        Some(id) => {
            check_import_id(&id)?;
            id
        }
        None => {
            // A split set's id is its prefix, without the part numbers.
            let named = match &split {
                Some((prefix, _)) => path.with_file_name(prefix),
                None => path.to_path_buf(),
            };
            let id = default_import_id(&named);
            check_import_id(&id).with_context(|| {
                format!(
                    "no usable id in the file name of {} (give one with --id)",
                    path.display()
                )
            })?;
            id
        }
    };
    let meta = inspect(&first).with_context(|| format!("{} cannot be imported", path.display()))?;
    let imported = store
        .import_files(&files, &id, meta)
        .with_context(|| format!("importing {}", first.display()))?;
    let card = &imported.card;
    let how = match imported.method {
        ImportMethod::AlreadyPresent => {
            println!(
                "{id} is already in the store with the same SHA-256: nothing to do ({})",
                imported.path.display()
            );
            return Ok(());
        }
        ImportMethod::HardLinked => "hard link",
        _ => "copy",
    };
    let parts = match card.file_count() {
        1 => String::new(),
        n => format!(" in {n} parts"),
    };
    println!(
        "imported {} as {id} ({how}): {} {} {} {}{parts}, sha256 {}\n{}",
        first.display(),
        card.architecture,
        card.params,
        card.quant,
        human_size(card.total_size()),
        card.sha256,
        imported.path.display()
    );
    Ok(())
}

/// Loads the file the way `strata run` does (tokenizer, chat template, every weight, a KV
/// cache), so a file that imports is one that runs and an unsupported architecture or tensor
/// type is refused with the engine's own message; then describes it for its card.
///
/// This holds the whole model in memory once, as a run would.
fn inspect(path: &Path) -> anyhow::Result<ImportMeta> {
    let generator = strata_engine::Generator::load(path, 1, Some(1))?;
    drop(generator);
    describe(&GgufFile::open(path)?)
}

/// The card's description of a GGUF file, from its metadata and tensor table.
fn describe(file: &GgufFile) -> anyhow::Result<ImportMeta> {
    let md = file.metadata();
    let architecture = md.get_str("general.architecture")?.to_string();
    let family = md
        .get_str("general.basename")
        .map_or_else(|_| architecture.clone(), str::to_lowercase);
    let context_length = md.get_u32(&format!("{architecture}.context_length"))?;
    let license = md
        .get_str("general.license")
        .unwrap_or("unknown")
        .to_string();
    let elements = file
        .tensors()
        .iter()
        .map(|t| t.dims.iter().product::<u64>())
        .sum();
    Ok(ImportMeta {
        family,
        architecture,
        params: human_count(elements),
        quant: main_matrix_type(file).map_or_else(|| "unknown".to_string(), |t| t.name().into()),
        context_length,
        license,
    })
}

/// The weight format most matrices have (ties: the one covering more elements), which is what
/// a model's quantisation is called by; vectors (norms, biases) are usually F32 and not counted.
fn main_matrix_type(file: &GgufFile) -> Option<GgmlType> {
    let mut by_type: BTreeMap<&'static str, (usize, u64, GgmlType)> = BTreeMap::new();
    for t in file.tensors().iter().filter(|t| t.dims.len() >= 2) {
        let entry = by_type
            .entry(t.ggml_type.name())
            .or_insert((0, 0, t.ggml_type));
        entry.0 += 1;
        entry.1 += t.dims.iter().product::<u64>();
    }
    by_type
        .into_values()
        .max_by_key(|&(count, elements, _)| (count, elements))
        .map(|(_, _, ty)| ty)
}

/// A parameter count as model names write it: `135M`, `1.2B`, `7B`.
fn human_count(n: u64) -> String {
    const UNITS: [(u64, &str); 4] = [
        (1_000_000_000_000, "T"),
        (1_000_000_000, "B"),
        (1_000_000, "M"),
        (1_000, "K"),
    ];
    let Some(&(scale, unit)) = UNITS.iter().find(|(scale, _)| n >= *scale) else {
        return n.to_string();
    };
    let value = n as f64 / scale as f64;
    let text = if value < 10.0 {
        format!("{value:.1}")
    } else {
        format!("{value:.0}")
    };
    format!("{}{unit}", text.strip_suffix(".0").unwrap_or(&text))
}

fn list(store: &Store, json: bool) -> anyhow::Result<()> {
    let models = store.list();
    let found = store.elsewhere().list();
    let mut out = std::io::stdout().lock();
    if json {
        // The store's models, then those other tools downloaded (with their `source`).
        let mut all: Vec<serde_json::Value> = models
            .iter()
            .map(serde_json::to_value)
            .collect::<Result<_, _>>()?;
        for f in &found {
            let mut v = serde_json::to_value(f)?;
            v["present"] = serde_json::Value::Bool(true);
            all.push(v);
        }
        serde_json::to_writer_pretty(&mut out, &all)?;
        writeln!(out)?;
    } else {
        write!(out, "{}", table(&models))?;
        writeln!(
            out,
            "store: {}  (* = default, + = imported)",
            store.root().display()
        )?;
        if !found.is_empty() {
            writeln!(
                out,
                "\ndownloaded by other tools (run in place by these ids):"
            )?;
            write!(out, "{}", found_table(&found))?;
        }
    }
    Ok(())
}

/// The models other tools downloaded: id, tool, size and where the file is.
fn found_table(found: &[strata_store::Found]) -> String {
    let rows: Vec<[String; 4]> = found
        .iter()
        .map(|f| {
            [
                f.id.clone(),
                f.source.to_string(),
                human_size(f.size),
                f.path.display().to_string(),
            ]
        })
        .collect();
    aligned(&["ID", "FROM", "SIZE", "PATH"], &rows)
}

/// The `list` table: one row per model, columns padded to their widest cell.
fn table(models: &[ModelStatus]) -> String {
    let header = ["ID", "FAMILY", "PARAMS", "QUANT", "SIZE", "PRESENT"];
    let rows: Vec<[String; 6]> = models
        .iter()
        .map(|m| {
            let mark = match (m.is_default, m.imported) {
                (true, _) => "*",
                (false, true) => "+",
                (false, false) => "",
            };
            [
                format!("{}{mark}", m.card.id),
                m.card.family.clone(),
                m.card.params.clone(),
                m.card.quant.clone(),
                human_size(m.card.total_size()),
                if m.present { "yes" } else { "no" }.to_string(),
            ]
        })
        .collect();
    aligned(&header, &rows)
}

/// `rows` under `header`, each column padded to its widest cell.
fn aligned<const N: usize>(header: &[&str; N], rows: &[[String; N]]) -> String {
    let mut widths = header.map(str::len);
    for row in rows {
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
    push_row(header);
    for row in rows {
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

/// Checks the files of a hub model in the Hugging Face cache against the hub's hashes: one line
/// per file; an error if any differs.
fn verify_hub(id: &str) -> anyhow::Result<()> {
    let r = strata_hub::HubRef::parse(&id[strata_hub::SCHEME.len()..])
        .map_err(|why| anyhow::anyhow!("{id}: {why}"))?;
    let cache = strata_hub::HubCache::from_env()
        .context("no Hugging Face cache folder (set HF_HUB_CACHE or HF_HOME)")?;
    let mut progress = TerminalProgress::stderr();
    let mut current = String::new();
    let checks = cache.verify(&r, &mut |file, done, total| {
        if current != file {
            current = file.to_string();
            progress.handle(strata_store::PullEvent::Checking { file });
        }
        progress.handle(strata_store::PullEvent::Progress { done, total });
    });
    progress.finish();
    let checks = checks.with_context(|| format!("verifying {id}"))?;
    let mut bad = Vec::new();
    for c in &checks {
        match &c.check {
            strata_hub::Check::Verified { hash } => {
                let kind = if hash.len() == 64 {
                    "sha256"
                } else {
                    "git-sha1"
                };
                println!("ok {} {kind} {hash}", c.path);
            }
            strata_hub::Check::Partial { held } => println!(
                "partial {}: {held} of {} bytes here (a shard); not hashable, as the hub \
                 publishes whole-file hashes only",
                c.path, c.size
            ),
            strata_hub::Check::Mismatch { expected, got } => {
                println!("MISMATCH {} expected {expected} got {got}", c.path);
                bad.push(format!("{} ({})", c.path, c.blob.display()));
            }
        }
    }
    if !bad.is_empty() {
        anyhow::bail!(
            "{id}: {} differ from the hub's hash; delete them and pull again",
            bad.join(", ")
        );
    }
    Ok(())
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
    fn human_counts() {
        assert_eq!(human_count(999), "999");
        assert_eq!(human_count(134_515_008), "135M");
        assert_eq!(human_count(268_098_176), "268M");
        assert_eq!(human_count(1_235_814_400), "1.2B");
        assert_eq!(human_count(8_030_261_248), "8B");
        assert_eq!(human_count(64_000), "64K");
    }

    /// A GGUF with the given metadata and (name, dims, type) tensors, zero-filled.
    fn gguf(kv: &[(&str, &str)], tensors: &[(&str, &[u64], GgmlType)]) -> GgufFile {
        use strata_gguf::{GgufWriter, Value};
        let mut w = GgufWriter::new();
        for (k, v) in kv {
            w.kv(k, Value::String((*v).to_string()));
        }
        w.kv("llama.context_length", Value::U32(4096));
        for (name, dims, ty) in tensors {
            let n: u64 = dims.iter().product();
            let bytes = ty.row_bytes(n as usize).unwrap_or(0);
            w.tensor(name, dims, *ty, vec![0; bytes]);
        }
        GgufFile::from_bytes(w.to_bytes()).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn import_cards_describe_the_file() {
        let file = gguf(
            &[
                ("general.architecture", "llama"),
                ("general.basename", "SmolLM2"),
                ("general.license", "apache-2.0"),
            ],
            &[
                ("token_embd.weight", &[256, 4], GgmlType::Q6K),
                ("blk.0.attn_q.weight", &[256, 2], GgmlType::Q4K),
                ("blk.0.attn_k.weight", &[256, 2], GgmlType::Q4K),
                ("blk.0.attn_norm.weight", &[64], GgmlType::F32),
                ("blk.0.ffn_norm.weight", &[64], GgmlType::F32),
                ("blk.0.ffn_bias", &[64], GgmlType::F32),
            ],
        );
        let meta = describe(&file).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(meta.architecture, "llama");
        assert_eq!(meta.family, "smollm2");
        assert_eq!(meta.license, "apache-2.0");
        assert_eq!(meta.context_length, 4096);
        // The matrices decide, not the many F32 vectors.
        assert_eq!(meta.quant, "Q4_K");
        assert_eq!(meta.params, "2.2K");

        let bare = gguf(&[("general.architecture", "llama")], &[]);
        let meta = describe(&bare).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            (
                meta.family.as_str(),
                meta.license.as_str(),
                meta.quant.as_str()
            ),
            ("llama", "unknown", "unknown")
        );
    }

    #[test]
    fn table_marks_imports() {
        let mut status = Store::new("/nonexistent/strata-test-root").list();
        let mut imported = status[1].clone();
        imported.card.id = "mine".to_string();
        imported.imported = true;
        status.push(imported);
        let text = table(&status);
        assert!(
            text.lines().last().is_some_and(|l| l.starts_with("mine+ ")),
            "{text}"
        );
        assert!(
            text.lines()
                .nth(2)
                .is_some_and(|l| l.starts_with("gemma3-270m ")),
            "{text}"
        );
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
