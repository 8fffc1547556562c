//! Every third-party crate in the build comes from the package registry (no git or path
//! sources outside the workspace) under a licence compatible with strata's Apache-2.0: a
//! cargo-deny-style check that needs nothing beyond cargo itself.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::process::Command;

/// Licences (SPDX identifiers) a dependency may be used under.
const ALLOWED: &[&str] = &[
    "MIT",
    "MIT-0",
    "Apache-2.0",
    "Apache-2.0 WITH LLVM-exception",
    "BSD-2-Clause",
    "BSD-3-Clause",
    "ISC",
    "Zlib",
    "Unicode-3.0",
    "Unicode-DFS-2016",
    "CC0-1.0",
    "0BSD",
    "BSL-1.0",
    "Unlicense",
    "MPL-2.0",
    // webpki-roots' CA list (zenoh's QUIC link): a permissive data licence.
    "CDLA-Permissive-2.0",
];

/// Whether an SPDX expression allows use under [`ALLOWED`] licences: every `AND` term needs one
/// allowed alternative among its `OR`s.
fn acceptable(expr: &str) -> bool {
    let flat = expr.replace('/', " OR ").replace(['(', ')'], "");
    flat.split(" AND ").all(|term| {
        term.split(" OR ")
            .map(str::trim)
            .any(|l| ALLOWED.contains(&l))
    })
}

#[test]
fn licence_expressions_are_read_as_spdx() {
    assert!(acceptable("MIT OR Apache-2.0"));
    assert!(acceptable("MIT/Apache-2.0"));
    assert!(acceptable("(MIT OR Apache-2.0) AND Unicode-3.0"));
    assert!(!acceptable("GPL-3.0-only"));
    assert!(!acceptable("MIT AND GPL-3.0-only"));
}

#[test]
fn dependencies_come_from_the_registry_under_permissive_licences() {
    let cargo = std::env::var("CARGO").unwrap_or_else(|_| "cargo".into());
    let manifest = concat!(env!("CARGO_MANIFEST_DIR"), "/../../Cargo.toml");
    // The crates this platform builds (others are never downloaded, so cannot be inspected).
    let rustc = Command::new("rustc")
        .arg("-vV")
        .output()
        .expect("running rustc -vV");
    let host = String::from_utf8_lossy(&rustc.stdout)
        .lines()
        .find_map(|l| l.strip_prefix("host: ").map(str::to_string))
        .expect("rustc -vV names the host");
    let out = Command::new(cargo)
        .args(["metadata", "--format-version", "1", "--locked", "--offline"])
        .args(["--filter-platform", &host])
        .args(["--manifest-path", manifest])
        .output()
        .expect("running cargo metadata");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let meta: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut problems = Vec::new();
    let mut registries = std::collections::BTreeSet::new();
    let mut third_party = 0;
    for p in meta["packages"].as_array().unwrap() {
        let name = format!("{} {}", p["name"], p["version"]);
        let Some(source) = p["source"].as_str() else {
            continue; // a workspace crate
        };
        third_party += 1;
        if !source.starts_with("registry+") && !source.starts_with("sparse+") {
            problems.push(format!("{name}: source {source} is not a package registry"));
        }
        registries.insert(source.to_string());
        match p["license"].as_str() {
            Some(l) if acceptable(l) => {}
            Some(l) => problems.push(format!("{name}: licence {l}")),
            None => problems.push(format!("{name}: no SPDX licence expression")),
        }
    }
    assert!(
        third_party > 20,
        "cargo metadata listed {third_party} dependencies"
    );
    assert_eq!(
        registries.len(),
        1,
        "dependencies from several sources: {registries:?}"
    );
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}
