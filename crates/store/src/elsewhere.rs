//! Models other tools already downloaded: the Hugging Face cache, Ollama's store and LM Studio's
//! models folder, listed beside strata's own and run where they are, with no copy.
//!
//! Each is named by an id of its own kind:
//!
//! - `hf:OWNER/REPO[:QUANT][@REVISION]` or `hf:OWNER/REPO/PATH.gguf[@REVISION]`: a file of a
//!   repository in the hub's cache (`$HF_HUB_CACHE`, else `$HF_HOME/hub`, else
//!   `~/.cache/huggingface/hub`), laid out as the hub's own clients lay it
//!   (`models--OWNER--REPO/{refs/REV, snapshots/COMMIT/PATH}`). `QUANT` picks the GGUF whose name
//!   carries that quantisation tag (`Q4_K_M`, `iq4_xs`: any case), every part of a split set
//!   counting as one; without it, the repository's only GGUF.
//! - `ollama:NAME[:TAG]`: the model layer of an Ollama manifest
//!   (`$OLLAMA_MODELS`, else `~/.ollama/models`; `manifests/registry.ollama.ai/library/NAME/TAG`,
//!   the layer's blob under `blobs/sha256-HEX`); `NAME` may carry a namespace (`user/name`),
//!   `TAG` defaults to `latest`.
//! - `lmstudio:PUBLISHER/REPO[:QUANT]` or `lmstudio:PUBLISHER/REPO/FILE.gguf`: LM Studio's
//!   folder (`$LMSTUDIO_MODELS`, else `~/.lmstudio/models`, else `~/.cache/lm-studio/models`),
//!   laid out as `PUBLISHER/REPO/FILE.gguf`.
//!
//! Nothing here writes to those folders; a model found in one is read in place.

use std::path::{Path, PathBuf};

use crate::error::{Error, Result};

/// The id prefixes of models found elsewhere.
pub const SCHEMES: [&str; 3] = ["hf:", "ollama:", "lmstudio:"];

/// Whether `spec` names a model found elsewhere (by one of [`SCHEMES`]).
pub fn is_elsewhere(spec: &str) -> bool {
    SCHEMES.iter().any(|s| spec.starts_with(s))
}

/// A model another tool downloaded, as `strata models list` shows it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Found {
    /// The id it runs by (`hf:owner/repo:Q4_K_M`, `ollama:qwen3:8b`, ...).
    pub id: String,
    /// Which tool's folder holds it: `huggingface`, `ollama` or `lmstudio`.
    pub source: &'static str,
    /// The file to open (the first part of a split set).
    pub path: PathBuf,
    /// Bytes of all its files.
    pub size: u64,
}

/// Where the other tools keep their models.
#[derive(Debug, Clone, Default)]
pub struct Elsewhere {
    /// The Hugging Face hub cache.
    pub hf_hub: Option<PathBuf>,
    /// Ollama's models folder.
    pub ollama: Option<PathBuf>,
    /// LM Studio's models folders, first first.
    pub lmstudio: Vec<PathBuf>,
}

fn env_path(name: &str) -> Option<PathBuf> {
    std::env::var_os(name)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

impl Elsewhere {
    /// The folders the tools use by default, or as their own variables move them.
    pub fn from_env() -> Elsewhere {
        let home = env_path("HOME");
        let at = |rel: &str| home.as_ref().map(|h| h.join(rel));
        Elsewhere {
            hf_hub: env_path("HF_HUB_CACHE")
                .or_else(|| env_path("HF_HOME").map(|h| h.join("hub")))
                .or_else(|| at(".cache/huggingface/hub")),
            ollama: env_path("OLLAMA_MODELS").or_else(|| at(".ollama/models")),
            lmstudio: match env_path("LMSTUDIO_MODELS") {
                Some(p) => vec![p],
                None => [".lmstudio/models", ".cache/lm-studio/models"]
                    .iter()
                    .filter_map(|r| at(r))
                    .collect(),
            },
        }
    }

    /// The file `spec` names, for a spec with one of [`SCHEMES`]; `None` for any other spec.
    pub fn resolve(&self, spec: &str) -> Option<Result<PathBuf>> {
        let fail = |why: String| Error::Elsewhere {
            spec: spec.to_string(),
            why,
        };
        if let Some(rest) = spec.strip_prefix("hf:") {
            return Some(self.hf(rest).map_err(fail));
        }
        if let Some(rest) = spec.strip_prefix("ollama:") {
            return Some(self.ollama(rest).map_err(fail));
        }
        if let Some(rest) = spec.strip_prefix("lmstudio:") {
            return Some(self.lmstudio(rest).map_err(fail));
        }
        None
    }

    fn hf(&self, rest: &str) -> std::result::Result<PathBuf, String> {
        let (rest, rev) = match rest.rsplit_once('@') {
            Some((r, v)) if !v.is_empty() => (r, v),
            _ => (rest, "main"),
        };
        let (repo, pick) = split_repo(rest)?;
        let Some(hub) = &self.hf_hub else {
            return Err("no Hugging Face cache folder (set HF_HUB_CACHE or HF_HOME)".into());
        };
        let dir = hub.join(format!("models--{}", repo.replace('/', "--")));
        let snapshot = hf_snapshot(&dir, rev).ok_or_else(|| {
            format!(
                "{repo}@{rev} is not in the Hugging Face cache at {}; download it first (for \
                 example `huggingface-cli download {repo}`)",
                hub.display()
            )
        })?;
        pick_file(&snapshot, pick, &format!("{repo}@{rev}"))
    }

    fn ollama(&self, rest: &str) -> std::result::Result<PathBuf, String> {
        let Some(root) = &self.ollama else {
            return Err("no Ollama models folder (set OLLAMA_MODELS)".into());
        };
        let (name, tag) = match rest.rsplit_once(':') {
            Some((n, t)) if !t.contains('/') => (n, t),
            _ => (rest, "latest"),
        };
        if name.is_empty() || tag.is_empty() || [name, tag].iter().any(|s| s.contains("..")) {
            return Err("expected ollama:NAME[:TAG]".into());
        }
        let path = match name.matches('/').count() {
            0 => format!("registry.ollama.ai/library/{name}"),
            1 => format!("registry.ollama.ai/{name}"),
            _ => name.to_string(),
        };
        let manifest = root.join("manifests").join(path).join(tag);
        let text = std::fs::read_to_string(&manifest).map_err(|_| {
            format!(
                "{name}:{tag} is not in Ollama's store at {} (`ollama pull {name}:{tag}` gets it)",
                root.display()
            )
        })?;
        let blob = ollama_model_blob(&text)
            .ok_or_else(|| format!("the manifest {} names no model layer", manifest.display()))?;
        let path = root.join("blobs").join(blob.replace(':', "-"));
        if !path.is_file() {
            return Err(format!("its model layer {} is missing", path.display()));
        }
        Ok(path)
    }

    fn lmstudio(&self, rest: &str) -> std::result::Result<PathBuf, String> {
        let (repo, pick) = split_repo(rest)?;
        let dirs: Vec<PathBuf> = self
            .lmstudio
            .iter()
            .map(|d| d.join(&repo))
            .filter(|d| d.is_dir())
            .collect();
        let Some(dir) = dirs.first() else {
            return Err(format!("{repo} is not in LM Studio's models folder"));
        };
        pick_file(dir, pick, &repo)
    }

    /// Every model found in the three folders, by id within each (unreadable entries are
    /// skipped).
    pub fn list(&self) -> Vec<Found> {
        let mut out = Vec::new();
        let mut add = |mut found: Vec<Found>| {
            found.sort_by(|a, b| a.id.cmp(&b.id));
            out.extend(found);
        };
        if let Some(hub) = &self.hf_hub {
            add(list_hf(hub));
        }
        if let Some(root) = &self.ollama {
            add(list_ollama(root));
        }
        for dir in &self.lmstudio {
            add(list_lmstudio(dir));
        }
        out
    }
}

/// What a spec's `OWNER/REPO[:QUANT]` or `OWNER/REPO/PATH.gguf` asks for.
enum Pick<'a> {
    /// The only GGUF, or the one carrying a quantisation tag.
    Quant(Option<&'a str>),
    /// A file by its path in the repository.
    File(&'a str),
}

fn split_repo(rest: &str) -> std::result::Result<(String, Pick<'_>), String> {
    let bad = || "expected OWNER/REPO[:QUANT] or OWNER/REPO/FILE.gguf".to_string();
    let mut it = rest.splitn(3, '/');
    let (Some(owner), Some(repo_q)) = (it.next(), it.next()) else {
        return Err(bad());
    };
    if let Some(file) = it.next() {
        if owner.is_empty()
            || repo_q.is_empty()
            || file.split('/').any(|s| s == ".." || s.is_empty())
        {
            return Err(bad());
        }
        return Ok((format!("{owner}/{repo_q}"), Pick::File(file)));
    }
    let (repo, quant) = match repo_q.split_once(':') {
        Some((r, q)) if !q.is_empty() => (r, Some(q)),
        _ => (repo_q, None),
    };
    let ok = |s: &str| !s.is_empty() && s != ".." && s != ".";
    if !ok(owner) || !ok(repo) {
        return Err(bad());
    }
    Ok((format!("{owner}/{repo}"), Pick::Quant(quant)))
}

/// The snapshot folder of revision `rev` (a ref's name, or a commit) of a cached repository.
fn hf_snapshot(dir: &Path, rev: &str) -> Option<PathBuf> {
    if rev.contains('/') || rev.contains("..") {
        return None;
    }
    let commit = std::fs::read_to_string(dir.join("refs").join(rev))
        .map(|c| c.trim().to_string())
        .unwrap_or_else(|_| rev.to_string());
    let snap = dir.join("snapshots").join(commit);
    snap.is_dir().then_some(snap)
}

/// The GGUF files under `dir` (relative paths, sorted), following the links the hub's cache
/// keeps in snapshots.
fn ggufs(dir: &Path) -> Vec<String> {
    fn walk(dir: &Path, rel: &str, out: &mut Vec<String>, depth: usize) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let r = if rel.is_empty() {
                name.clone()
            } else {
                format!("{rel}/{name}")
            };
            let p = e.path();
            if p.is_dir() && depth < 4 {
                walk(&p, &r, out, depth + 1);
            } else if name.to_ascii_lowercase().ends_with(".gguf") && p.is_file() {
                out.push(r);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, "", &mut out, 0);
    out.sort();
    out
}

/// One model among a folder's GGUFs: a file, or every part of a split set (named by the first).
#[derive(Debug)]
struct Model {
    /// The first (or only) file, relative.
    first: String,
    /// Its quantisation tag as written in the name, if any.
    quant: Option<String>,
    /// All its files, relative.
    files: Vec<String>,
}

/// The models among `files`: split sets grouped, later parts under their first.
fn models(files: &[String]) -> Vec<Model> {
    let mut out: Vec<Model> = Vec::new();
    for f in files {
        let name = f.rsplit('/').next().unwrap_or(f);
        match strata_gguf::split::parse_name(name) {
            Some((prefix, 1, _)) => out.push(Model {
                first: f.clone(),
                quant: quant_tag(prefix),
                files: vec![f.clone()],
            }),
            Some((prefix, _, _)) => {
                let dir = &f[..f.len() - name.len()];
                if let Some(m) = out.iter_mut().find(|m| {
                    m.first.starts_with(dir)
                        && strata_gguf::split::parse_name(m.first.rsplit('/').next().unwrap_or(""))
                            .is_some_and(|(p, _, _)| p == prefix)
                }) {
                    m.files.push(f.clone());
                }
            }
            None => out.push(Model {
                first: f.clone(),
                quant: quant_tag(name.trim_end_matches(".gguf").trim_end_matches(".GGUF")),
                files: vec![f.clone()],
            }),
        }
    }
    out
}

/// The quantisation names llama.cpp writes into file names (upper case).
const QUANTS: &[&str] = &[
    "F32", "F16", "BF16", "Q8_0", "Q8_K_XL", "Q6_K", "Q6_K_XL", "Q5_K_M", "Q5_K_S", "Q5_K_XL",
    "Q5_K", "Q5_1", "Q5_0", "Q4_K_M", "Q4_K_S", "Q4_K_XL", "Q4_K", "Q4_1", "Q4_0", "Q3_K_XL",
    "Q3_K_L", "Q3_K_M", "Q3_K_S", "Q3_K", "Q2_K_XL", "Q2_K_L", "Q2_K_S", "Q2_K", "IQ4_XS",
    "IQ4_NL", "IQ3_XXS", "IQ3_XS", "IQ3_S", "IQ3_M", "IQ2_XXS", "IQ2_XS", "IQ2_S", "IQ2_M",
    "IQ1_S", "IQ1_M", "MXFP4", "TQ1_0", "TQ2_0",
];

/// The quantisation tag a file name (without `.gguf`) carries: a run delimited by `-`, `.`,
/// `_` or the name's ends that is a known quantisation name (`Qwen3-8B-Q4_K_M`, `model.q8_0`,
/// `UD-Q4_K_XL`), the longest when several match, as the name writes it.
pub(crate) fn quant_tag(stem: &str) -> Option<String> {
    let up = stem.to_ascii_uppercase();
    let bytes = up.as_bytes();
    let delimiter = |i: usize| matches!(bytes.get(i), Some(b'-' | b'.' | b'_'));
    let mut best: Option<(usize, usize)> = None;
    for q in QUANTS.iter().copied() {
        for (start, _) in up.match_indices(q) {
            let end = start + q.len();
            let bounded =
                (start == 0 || delimiter(start - 1)) && (end == up.len() || delimiter(end));
            if bounded && best.is_none_or(|(s, e)| q.len() > e - s) {
                best = Some((start, end));
            }
        }
    }
    best.map(|(s, e)| stem[s..e].to_string())
}

/// The file of `dir` that `pick` asks for (see the module docs), `what` naming the folder's
/// model in errors.
fn pick_file(dir: &Path, pick: Pick<'_>, what: &str) -> std::result::Result<PathBuf, String> {
    if let Pick::File(f) = pick {
        let p = dir.join(f);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(format!("{what} has no file {f}"))
        };
    }
    let Pick::Quant(quant) = pick else {
        unreachable!("a file pick returned above")
    };
    let all = models(&ggufs(dir));
    if all.is_empty() {
        return Err(format!("{what} holds no GGUF file"));
    }
    let tags = || {
        all.iter()
            .map(|m| m.quant.clone().unwrap_or_else(|| m.first.clone()))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let chosen: Vec<&Model> = match quant {
        None => all.iter().collect(),
        Some(q) => all
            .iter()
            .filter(|m| {
                m.quant
                    .as_deref()
                    .is_some_and(|t| t.eq_ignore_ascii_case(q))
            })
            .collect(),
    };
    match (chosen.as_slice(), quant) {
        ([one], _) => Ok(dir.join(&one.first)),
        ([], Some(q)) => Err(format!("{what} has no {q} GGUF (it has: {})", tags())),
        (_, Some(q)) => Err(format!(
            "{what} has several {q} GGUFs: {}; name one as {what}/FILE.gguf",
            chosen
                .iter()
                .map(|m| m.first.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )),
        (_, None) => Err(format!(
            "{what} has several GGUFs; add one of their quantisation tags (:{})",
            tags().replace(", ", ", :")
        )),
    }
}

fn size_of(dir: &Path, files: &[String]) -> u64 {
    files
        .iter()
        .filter_map(|f| std::fs::metadata(dir.join(f)).ok())
        .map(|m| m.len())
        .sum()
}

fn list_hf(hub: &Path) -> Vec<Found> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(hub) else {
        return out;
    };
    let mut repos: Vec<PathBuf> = entries.flatten().map(|e| e.path()).collect();
    repos.sort();
    for dir in repos {
        let name = dir.file_name().map(|n| n.to_string_lossy().into_owned());
        let Some(repo) = name.as_deref().and_then(|n| n.strip_prefix("models--")) else {
            continue;
        };
        let Some((owner, repo)) = repo.split_once("--") else {
            continue;
        };
        let Some(snap) = hf_snapshot(&dir, "main") else {
            continue;
        };
        out.extend(repo_models(
            &format!("hf:{owner}/{repo}"),
            "huggingface",
            &snap,
        ));
    }
    out
}

/// The models of a repository-like folder `dir`, each by the id `base` with its quantisation
/// tag (or its file, when several have none): what `hf:` and `lmstudio:` specs name.
fn repo_models(base: &str, source: &'static str, dir: &Path) -> Vec<Found> {
    let found = models(&ggufs(dir));
    let only = found.len() == 1;
    found
        .iter()
        .map(|m| Found {
            id: match (&m.quant, only) {
                (Some(q), _) => format!("{base}:{q}"),
                (None, true) => base.to_string(),
                (None, false) => format!("{base}/{}", m.first),
            },
            source,
            path: dir.join(&m.first),
            size: size_of(dir, &m.files),
        })
        .collect()
}

fn list_ollama(root: &Path) -> Vec<Found> {
    let mut out = Vec::new();
    let base = root.join("manifests");
    // manifests/HOST/NAMESPACE/NAME/TAG
    let mut stack = vec![(base.clone(), 0usize)];
    let mut manifests = Vec::new();
    while let Some((dir, depth)) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if depth < 3 && p.is_dir() {
                stack.push((p, depth + 1));
            } else if depth == 3 && p.is_file() {
                manifests.push(p);
            }
        }
    }
    manifests.sort();
    for m in manifests {
        let Ok(rel) = m.strip_prefix(&base) else {
            continue;
        };
        let parts: Vec<String> = rel
            .components()
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect();
        let [host, ns, name, tag] = parts.as_slice() else {
            continue;
        };
        let Some(blob) = std::fs::read_to_string(&m)
            .ok()
            .and_then(|t| ollama_model_blob(&t))
        else {
            continue;
        };
        let path = root.join("blobs").join(blob.replace(':', "-"));
        let Ok(meta) = std::fs::metadata(&path) else {
            continue;
        };
        let name = match (host.as_str(), ns.as_str()) {
            ("registry.ollama.ai", "library") => name.clone(),
            ("registry.ollama.ai", _) => format!("{ns}/{name}"),
            _ => format!("{host}/{ns}/{name}"),
        };
        out.push(Found {
            id: format!("ollama:{name}:{tag}"),
            source: "ollama",
            path,
            size: meta.len(),
        });
    }
    out
}

fn list_lmstudio(dir: &Path) -> Vec<Found> {
    let mut out = Vec::new();
    let mut repos = Vec::new();
    for publisher in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        for repo in std::fs::read_dir(publisher.path())
            .into_iter()
            .flatten()
            .flatten()
        {
            if repo.path().is_dir() {
                repos.push(repo.path());
            }
        }
    }
    repos.sort();
    for repo in repos {
        let Ok(rel) = repo.strip_prefix(dir) else {
            continue;
        };
        let rel = rel.to_string_lossy().replace('\\', "/");
        out.extend(repo_models(&format!("lmstudio:{rel}"), "lmstudio", &repo));
    }
    out
}

/// The digest (`sha256:HEX`) of the model layer of an Ollama manifest.
fn ollama_model_blob(manifest: &str) -> Option<String> {
    let v: serde_json::Value = serde_json::from_str(manifest).ok()?;
    let layer = v["layers"]
        .as_array()?
        .iter()
        .find(|l| l["mediaType"] == "application/vnd.ollama.image.model")?;
    let d = layer["digest"].as_str()?;
    let hex = d.strip_prefix("sha256:")?;
    (hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit())).then(|| d.to_string())
}

#[cfg(test)]
#[path = "elsewhere_tests.rs"]
mod tests;
