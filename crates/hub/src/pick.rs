//! Which GGUF of a repository a reference means.
//!
//! A repository (on the hub, in its cache, in LM Studio's folder) usually holds one model in
//! several quantisations, and a large model's quantisation is a split set of parts. A reference
//! names one by its quantisation tag (`:Q4_K_M`, any case), by a file path, or by nothing when
//! there is only one. The same rules apply to a remote file listing and to a folder on disk, so
//! `hf:owner/repo:Q4_K_M` means the same file before and after it is downloaded.

/// What a reference asks for among a repository's GGUFs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Pick {
    /// The only GGUF model, or the one whose name carries this quantisation tag.
    Quant(Option<String>),
    /// A file by its path in the repository (a split set's part names the whole set).
    File(String),
}

/// One model among a repository's GGUFs: a file, or every part of a split set.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Model {
    /// The first (or only) file, relative to the repository.
    pub first: String,
    /// Its quantisation tag as the name writes it, if any.
    pub quant: Option<String>,
    /// All its files, relative, in part order.
    pub files: Vec<String>,
    /// The number of parts its names announce (1 for a single file).
    pub parts: u32,
}

/// Whether a repository path is a GGUF file.
pub fn is_gguf(path: &str) -> bool {
    path.to_ascii_lowercase().ends_with(".gguf")
}

/// The models among `files` (relative paths of GGUFs, any order): split sets grouped under
/// their first part, sorted by first file.
pub fn models(files: &[String]) -> Vec<Model> {
    let mut sorted: Vec<&String> = files.iter().filter(|f| is_gguf(f)).collect();
    sorted.sort();
    let mut out: Vec<Model> = Vec::new();
    let mut orphans = Vec::new();
    for f in sorted.iter().copied() {
        let name = f.rsplit('/').next().unwrap_or(f);
        match strata_gguf::split::parse_name(name) {
            Some((prefix, 1, count)) => out.push(Model {
                first: f.clone(),
                quant: quant_tag(prefix),
                files: vec![f.clone()],
                parts: count,
            }),
            Some(_) => orphans.push(f),
            None => out.push(Model {
                first: f.clone(),
                quant: quant_tag(name.trim_end_matches(".gguf").trim_end_matches(".GGUF")),
                files: vec![f.clone()],
                parts: 1,
            }),
        }
    }
    for f in orphans {
        let name = f.rsplit('/').next().unwrap_or(f);
        let dir = &f[..f.len() - name.len()];
        let Some((prefix, _, count)) = strata_gguf::split::parse_name(name) else {
            continue;
        };
        let first = out.iter_mut().find(|m| {
            m.parts == count
                && m.first.len() > dir.len()
                && m.first.starts_with(dir)
                && !m.first[dir.len()..].contains('/')
                && strata_gguf::split::parse_name(&m.first[dir.len()..])
                    .is_some_and(|(p, _, _)| p == prefix)
        });
        if let Some(m) = first {
            m.files.push(f.clone());
        }
    }
    out
}

/// The GGUF files under `dir` (relative paths, sorted), following links (the hub cache's
/// snapshots are links to blobs) up to four folders deep.
pub fn ggufs_in(dir: &std::path::Path) -> Vec<String> {
    fn walk(dir: &std::path::Path, rel: &str, out: &mut Vec<String>, depth: usize) {
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
            } else if is_gguf(&name) && p.is_file() {
                out.push(r);
            }
        }
    }
    let mut out = Vec::new();
    walk(dir, "", &mut out, 0);
    out.sort();
    out
}

/// The file of folder `dir` that `pick` names (the first part of a split set), checking that
/// every part is there; `what` names the folder's model in messages.
pub fn find_in(
    dir: &std::path::Path,
    pick: &Pick,
    what: &str,
) -> Result<std::path::PathBuf, String> {
    let all = models(&ggufs_in(dir));
    let model = choose(&all, pick, what)?;
    let missing = missing_parts(model);
    if !missing.is_empty() {
        return Err(format!(
            "{what}: the split set {} lacks {}",
            model.first,
            missing.join(", ")
        ));
    }
    Ok(dir.join(&model.first))
}

/// The quantisation names llama.cpp and the usual publishers write into file names.
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
pub fn quant_tag(stem: &str) -> Option<String> {
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

/// The model of `all` that `pick` asks for, or a one-line reason naming the choices; `what`
/// names the repository in messages (`owner/repo@main`).
pub fn choose<'a>(all: &'a [Model], pick: &Pick, what: &str) -> Result<&'a Model, String> {
    if let Pick::File(f) = pick {
        return all
            .iter()
            .find(|m| m.first == *f)
            .or_else(|| all.iter().find(|m| m.files.contains(f)))
            .ok_or_else(|| format!("{what} has no GGUF file {f}"));
    }
    let quant = match pick {
        Pick::Quant(q) => q.as_deref(),
        Pick::File(_) => None,
    };
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
        ([one], _) => Ok(one),
        ([], Some(q)) => Err(format!("{what} has no {q} GGUF (it has: {})", tags())),
        (_, Some(q)) => Err(format!(
            "{what} has several {q} GGUFs: {}; name one as {}/FILE.gguf",
            chosen
                .iter()
                .map(|m| m.first.as_str())
                .collect::<Vec<_>>()
                .join(", "),
            what.split('@').next().unwrap_or(what)
        )),
        (_, None) => Err(format!(
            "{what} has several GGUFs; add one of their quantisation tags (:{})",
            tags().replace(", ", ", :")
        )),
    }
}

/// The parts a split set's names announce but `model` lacks, as file names; empty when whole.
pub fn missing_parts(model: &Model) -> Vec<String> {
    if model.parts <= 1 {
        return Vec::new();
    }
    let have: Vec<u32> = model
        .files
        .iter()
        .filter_map(|f| strata_gguf::split::parse_name(f.rsplit('/').next().unwrap_or(f)))
        .map(|(_, no, _)| no)
        .collect();
    let name = model.first.rsplit('/').next().unwrap_or(&model.first);
    let Some((prefix, _, count)) = strata_gguf::split::parse_name(name) else {
        return Vec::new();
    };
    (1..=count)
        .filter(|n| !have.contains(n))
        .map(|n| strata_gguf::split::part_name(prefix, n, count))
        .collect()
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn names(v: &[&str]) -> Vec<String> {
        v.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn quantisation_tags_are_read_from_names_as_llama_cpp_writes_them() {
        for (name, tag) in [
            ("Qwen3-8B-Q4_K_M", Some("Q4_K_M")),
            ("qwen3-8b-q4_k_m", Some("q4_k_m")),
            ("model.Q8_0", Some("Q8_0")),
            ("DeepSeek-V3.1-UD-Q4_K_XL", Some("Q4_K_XL")),
            ("Llama-3.2-1B-Instruct-IQ4_XS", Some("IQ4_XS")),
            ("gemma-3-270m-it-BF16", Some("BF16")),
            ("model-f16", Some("f16")),
            ("notaquant-BQ4_0X", None),
            ("plain", None),
        ] {
            assert_eq!(quant_tag(name).as_deref(), tag, "{name}");
        }
    }

    #[test]
    fn split_sets_group_under_their_first_part_in_folders_too() {
        let all = models(&names(&[
            "Q8_0/M-Q8_0-00002-of-00002.gguf",
            "M-Q4_K_M.gguf",
            "Q8_0/M-Q8_0-00001-of-00002.gguf",
            "README.md",
            "M-Q2_K-00002-of-00003.gguf",
        ]));
        assert_eq!(all.len(), 2, "{all:?}");
        assert_eq!(all[1].first, "Q8_0/M-Q8_0-00001-of-00002.gguf");
        assert_eq!(all[1].files.len(), 2);
        assert_eq!(all[1].quant.as_deref(), Some("Q8_0"));
        let q8 = choose(&all, &Pick::Quant(Some("q8_0".into())), "o/r@main").unwrap();
        assert!(missing_parts(q8).is_empty());
        let by_part = Pick::File("Q8_0/M-Q8_0-00002-of-00002.gguf".into());
        assert_eq!(choose(&all, &by_part, "o/r").unwrap().first, q8.first);
    }

    #[test]
    fn a_missing_part_is_named() {
        let all = models(&names(&["M-00001-of-00003.gguf", "M-00003-of-00003.gguf"]));
        assert_eq!(missing_parts(&all[0]), vec!["M-00002-of-00003.gguf"]);
    }

    #[test]
    fn unclear_choices_list_what_the_repository_has() {
        let all = models(&names(&["a-Q4_K_M.gguf", "a-Q8_0.gguf"]));
        let e = choose(&all, &Pick::Quant(None), "o/r@main").unwrap_err();
        assert!(e.contains(":Q4_K_M, :Q8_0"), "{e}");
        let e = choose(&all, &Pick::Quant(Some("IQ4_XS".into())), "o/r").unwrap_err();
        assert!(e.contains("no IQ4_XS") && e.contains("Q4_K_M, Q8_0"), "{e}");
        assert!(
            choose(&[], &Pick::Quant(None), "o/r")
                .unwrap_err()
                .contains("no GGUF")
        );
    }
}
