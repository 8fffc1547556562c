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

use strata_hub::{HubCache, HubRef, pick};

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
        let r = HubRef::parse(rest)?;
        let Some(hub) = &self.hf_hub else {
            return Err("no Hugging Face cache folder (set HF_HUB_CACHE or HF_HOME)".into());
        };
        HubCache::new(hub).find(&r)
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
        let r = HubRef::parse(rest)
            .ok()
            .filter(|r| r.revision == "main" && !rest.contains('@'))
            .ok_or_else(|| {
                format!("expected lmstudio:PUBLISHER/REPO[:QUANT] or lmstudio:PUBLISHER/REPO/FILE.gguf, got lmstudio:{rest}")
            })?;
        let dirs: Vec<PathBuf> = self
            .lmstudio
            .iter()
            .map(|d| d.join(&r.repo))
            .filter(|d| d.is_dir())
            .collect();
        let Some(dir) = dirs.first() else {
            return Err(format!("{} is not in LM Studio's models folder", r.repo));
        };
        pick::find_in(dir, &r.pick, &r.repo)
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
        let cache = HubCache::new(hub);
        let Some(snap) = cache
            .commit_of(&format!("{owner}/{repo}"), "main")
            .map(|c| cache.snapshot(&format!("{owner}/{repo}"), &c))
        else {
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
    let found = pick::models(&pick::ggufs_in(dir));
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
