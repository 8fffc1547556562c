//! Tests of importing local files: link and copy, ids, conflicts, re-imports, the import cards
//! a store reads back (and the broken ones it skips), removal, and installing a peer's copy.

#![allow(clippy::unwrap_used)]

use std::io::Read;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;

use super::{ImportMeta, ImportMethod, check_import_id, default_import_id};
use crate::card::ModelCard;
use crate::catalog::Catalog;
use crate::error::Error;
use crate::store::Store;
use crate::testutil::{TestFetcher, build_wheel, bytes, card, entries};

struct Fixture {
    dir: tempfile::TempDir,
    root: PathBuf,
}

impl Fixture {
    /// A store root and a place for source files, in one temp directory (one file system, so
    /// hard links work).
    fn new() -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("home");
        Fixture { dir, root }
    }

    /// A store with only the built-in catalog (and whatever was imported under the root).
    fn store(&self) -> Store {
        Store::new(&self.root)
    }

    /// Writes a source file `name` with `content` and returns its path.
    fn source(&self, name: &str, content: &[u8]) -> PathBuf {
        let path = self.dir.path().join("src").join(name);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(&path, content).unwrap();
        path
    }
}

fn meta() -> ImportMeta {
    ImportMeta {
        family: "smollm2".to_string(),
        architecture: "llama".to_string(),
        params: "135M".to_string(),
        quant: "Q8_0".to_string(),
        context_length: 2048,
        license: "unknown".to_string(),
    }
}

/// A peer that has `files` (file k's bytes at index k): the `open` of
/// [`Store::install_import`].
fn serve(files: Vec<Vec<u8>>) -> impl FnMut(usize) -> std::io::Result<Box<dyn Read>> {
    move |k| match files.get(k) {
        Some(b) => Ok(Box::new(std::io::Cursor::new(b.clone()))),
        None => Err(std::io::Error::other(format!("no file {k}"))),
    }
}

fn assert_tmp_empty(root: &Path) {
    assert_eq!(entries(&root.join("tmp")), Vec::<PathBuf>::new());
}

#[test]
fn import_hard_links_on_one_file_system_and_writes_a_card() {
    let fx = Fixture::new();
    let content = bytes(3000, 1);
    let src = fx.source("Tiny-Model.Q8_0.gguf", &content);
    let mut store = fx.store();

    let imported = store
        .import(&src, &default_import_id(&src), meta())
        .unwrap();
    assert_eq!(imported.method, ImportMethod::HardLinked);
    assert_eq!(imported.card.id, "tiny-model.q8_0");
    assert_eq!(
        imported.path,
        fx.root.join("models/tiny-model.q8_0/Tiny-Model.Q8_0.gguf")
    );
    assert_eq!(std::fs::read(&imported.path).unwrap(), content);
    #[cfg(unix)]
    {
        use std::os::unix::fs::MetadataExt;
        let (a, b) = (
            std::fs::metadata(&src).unwrap(),
            std::fs::metadata(&imported.path).unwrap(),
        );
        assert_eq!((a.dev(), a.ino()), (b.dev(), b.ino()), "not a hard link");
    }

    // The card beside the file says what it is and where it came from.
    let card = &imported.card;
    let expected = card_of(&content);
    assert_eq!((card.size, card.sha256.as_str()), (3000, expected.as_str()));
    assert_eq!(card.file_name, "Tiny-Model.Q8_0.gguf");
    assert_eq!(card.architecture, "llama");
    assert_eq!(card.quant, "Q8_0");
    assert_eq!(card.context_length, 2048);
    let from = src.display().to_string();
    assert_eq!(card.source.imported_from.as_deref(), Some(from.as_str()));
    assert_eq!(card.description, format!("imported from {from}"));
    assert!(card.source.parts.is_empty());
    let on_disk = fx.root.join("models/tiny-model.q8_0/card.toml");
    let text = std::fs::read_to_string(on_disk).unwrap();
    assert_eq!(&ModelCard::from_toml(&text, "t").unwrap(), card);
    assert!(!text.contains("parts"), "{text}");

    // This store and a new one both know it now, and it resolves by id.
    assert_eq!(store.catalog().get("tiny-model.q8_0"), Some(card));
    let again = fx.store();
    assert_eq!(
        again.resolve("tiny-model.q8_0").unwrap().path,
        imported.path
    );
    assert_eq!(again.verify("tiny-model.q8_0").unwrap(), imported.path);
    assert_tmp_empty(&fx.root);
}

fn card_of(content: &[u8]) -> String {
    card("x", &[("p", "m")], content).sha256
}

#[test]
fn import_copies_when_it_cannot_link() {
    let fx = Fixture::new();
    let content = bytes(2_500_000, 2);
    let src = fx.source("big.gguf", &content);
    let mut store = fx.store();
    store.link_imports = false;

    let imported = store.import(&src, "big", meta()).unwrap();
    assert_eq!(imported.method, ImportMethod::Copied);
    assert_eq!(std::fs::read(&imported.path).unwrap(), content);
    assert_eq!(imported.card.sha256, card_of(&content));
    #[cfg(unix)]
    {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let (a, b) = (
            std::fs::metadata(&src).unwrap(),
            std::fs::metadata(&imported.path).unwrap(),
        );
        assert_ne!(a.ino(), b.ino(), "a copy, not a link");
        assert_eq!(
            b.permissions().mode() & 0o444,
            0o444,
            "readable like a pull"
        );
    }
    // The original can go: the store has its own bytes.
    std::fs::remove_file(&src).unwrap();
    assert!(fx.store().verify("big").is_ok());
    assert_tmp_empty(&fx.root);
}

#[test]
fn default_ids_come_from_the_file_name() {
    let id = |name: &str| default_import_id(Path::new("/some/dir").join(name).as_path());
    assert_eq!(
        id("SmolLM2-135M-Instruct.Q4_1.gguf"),
        "smollm2-135m-instruct.q4_1"
    );
    assert_eq!(id("My Model (v2).GGUF"), "my-model--v2-");
    assert_eq!(id("naïve.gguf"), "na-ve");
    assert_eq!(id("model"), "model");
    assert_eq!(id("x.gguf.gguf"), "x.gguf");
    for good in [
        "smollm2-135m-instruct.q4_1",
        "my-model--v2-",
        "na-ve",
        "model",
    ] {
        check_import_id(good).unwrap();
    }
    // Derived ids that cannot name a model are refused with the reason.
    for bad in ["x.gguf", ".hidden", "-x", "", "Upper", "a~b", "a/b"] {
        let err = check_import_id(bad).unwrap_err();
        assert!(matches!(err, Error::InvalidImportId { .. }), "{bad}: {err}");
        assert!(err.to_string().contains("choose another id"), "{err}");
    }
}

#[test]
fn import_refuses_bad_ids_and_missing_files_before_touching_the_store() {
    let fx = Fixture::new();
    let src = fx.source(".hidden.gguf", b"GGUF....");
    let mut store = fx.store();
    let err = store
        .import(&src, &default_import_id(&src), meta())
        .unwrap_err();
    assert!(matches!(err, Error::InvalidImportId { .. }), "{err}");
    let err = store
        .import(&fx.dir.path().join("nope.gguf"), "nope", meta())
        .unwrap_err();
    assert!(matches!(err, Error::LocalFileMissing { .. }), "{err}");
    let err = store.import(fx.dir.path(), "dir", meta()).unwrap_err();
    assert!(matches!(err, Error::NotAFile { .. }), "{err}");
    // Metadata the card cannot hold is refused before anything is copied.
    let src = fx.source("ok.gguf", b"GGUF....");
    let mut bad = meta();
    bad.context_length = 0;
    let err = store.import(&src, "ok", bad).unwrap_err();
    assert!(err.to_string().contains("context_length"), "{err}");
    assert!(!fx.root.exists(), "{:?}", entries(&fx.root));
}

#[test]
fn import_over_a_taken_id_is_refused_unless_it_is_the_same_file() {
    let fx = Fixture::new();
    let mut store = fx.store();

    // A built-in id, a different file (sizes differ: refused before any copy).
    let src = fx.source("other.gguf", &bytes(100, 3));
    let err = store
        .import(&src, "smollm2-135m-instruct", meta())
        .unwrap_err();
    assert!(matches!(err, Error::ImportConflict { .. }), "{err}");
    assert!(
        err.to_string().contains("a built-in catalog model"),
        "{err}"
    );
    assert!(!fx.root.exists());

    // An imported id, a different file of the same size (refused once hashed).
    let first = fx.source("first.gguf", &bytes(100, 4));
    store.import(&first, "mine", meta()).unwrap();
    let err = store.import(&src, "mine", meta()).unwrap_err();
    assert!(matches!(err, Error::ImportConflict { .. }), "{err}");
    assert!(err.to_string().contains("an imported model"), "{err}");
    // The same holds for a store that only reads the import from disk.
    let err = fx.store().import(&src, "mine", meta()).unwrap_err();
    assert!(matches!(err, Error::ImportConflict { .. }), "{err}");
    assert_eq!(
        std::fs::read(fx.root.join("models/mine/first.gguf")).unwrap(),
        bytes(100, 4)
    );
    assert_tmp_empty(&fx.root);
}

#[test]
fn reimporting_the_same_file_is_a_no_op() {
    let fx = Fixture::new();
    let content = bytes(500, 5);
    let src = fx.source("same.gguf", &content);
    let mut store = fx.store();
    let first = store.import(&src, "same", meta()).unwrap();
    let card_file = fx.root.join("models/same/card.toml");
    let text = std::fs::read_to_string(&card_file).unwrap();

    // Same bytes under another name and other metadata: still the same model.
    let copy = fx.source("elsewhere/renamed.gguf", &content);
    let mut other = meta();
    other.quant = "F32".to_string();
    for mut s in [store.clone(), fx.store()] {
        let again = s.import(&copy, "same", other.clone()).unwrap();
        assert_eq!(again.method, ImportMethod::AlreadyPresent);
        assert_eq!(again.card, first.card);
        assert_eq!(again.path, first.path);
    }
    assert_eq!(std::fs::read_to_string(&card_file).unwrap(), text);
    assert_eq!(
        entries(&fx.root.join("models/same")),
        [PathBuf::from("card.toml"), PathBuf::from("same.gguf")]
    );
    assert_tmp_empty(&fx.root);
}

#[test]
fn importing_a_catalog_models_own_file_installs_it() {
    let fx = Fixture::new();
    let content = bytes(700, 6);
    let tiny = card("tiny", &[("tiny-model", "t/tiny.gguf")], &content);
    let mut store = fx
        .store()
        .with_catalog(Catalog::from_cards(vec![tiny.clone()]).unwrap());
    let src = fx.source("downloaded-by-hand.gguf", &content);

    let imported = store.import(&src, "tiny", meta()).unwrap();
    assert_eq!(imported.card, tiny, "the catalog card stays");
    assert_eq!(imported.path, fx.root.join("models/tiny/tiny.gguf"));
    assert!(store.is_present("tiny").unwrap());
    assert!(!fx.root.join("models/tiny/card.toml").exists());
    let again = store.import(&src, "tiny", meta()).unwrap();
    assert_eq!(again.method, ImportMethod::AlreadyPresent);
}

#[test]
fn list_shows_imports_after_the_catalog_and_marks_them() {
    let fx = Fixture::new();
    let mut store = fx.store();
    for (name, seed) in [("zeta.gguf", 1), ("alpha.gguf", 2)] {
        let src = fx.source(name, &bytes(64, seed));
        store
            .import(&src, &default_import_id(&src), meta())
            .unwrap();
    }
    let listed = fx.store().list();
    let ids: Vec<&str> = listed.iter().map(|m| m.card.id.as_str()).collect();
    assert_eq!(
        ids,
        ["smollm2-135m-instruct", "gemma3-270m", "alpha", "zeta"]
    );
    let flags: Vec<(bool, bool)> = listed.iter().map(|m| (m.imported, m.present)).collect();
    assert_eq!(flags[2..], [(true, true), (true, true)]);
    assert!(!listed[0].imported);

    let json = serde_json::to_value(&listed).unwrap();
    assert_eq!(json[0]["imported"], false);
    assert_eq!(json[2]["imported"], true);
    assert_eq!(json[2]["size"], 64);
    assert_eq!(json[2]["sha256"], card_of(&bytes(64, 2)));
    assert!(json[2]["source"]["imported_from"].is_string());
    assert!(json[2]["source"].get("parts").is_none());
}

#[test]
fn broken_import_cards_are_skipped_not_fatal() {
    let fx = Fixture::new();
    let mut store = fx.store();
    let src = fx.source("good.gguf", &bytes(64, 7));
    let good = store.import(&src, "good", meta()).unwrap().card;
    let good_text = std::fs::read_to_string(fx.root.join("models/good/card.toml")).unwrap();
    let put = |dir: &str, text: &str| {
        let d = fx.root.join("models").join(dir);
        std::fs::create_dir_all(&d).unwrap();
        std::fs::write(d.join("card.toml"), text).unwrap();
    };
    put("garbage", "this is = = not toml");
    put("truncated", &good_text[..good_text.len() / 2]);
    // A valid card in the wrong directory would point at another model's files.
    put("elsewhere", &good_text);
    // A catalog-style card (download parts) has no business in the store.
    let mut catalog_style = good.clone();
    catalog_style.id = "parts".to_string();
    catalog_style.source = card("parts", &[("p", "p/x.gguf")], b"x").source;
    put("parts", &toml::to_string(&catalog_style).unwrap());
    // An import that takes a built-in id loses to the built-in card.
    let mut shadow = good.clone();
    shadow.id = "gemma3-270m".to_string();
    put("gemma3-270m", &toml::to_string(&shadow).unwrap());
    // Directories of pulled catalog models have no card, and stray files are ignored.
    std::fs::create_dir_all(fx.root.join("models/smollm2-135m-instruct")).unwrap();
    std::fs::write(fx.root.join("models/stray-file"), b"x").unwrap();

    let store = fx.store();
    let imports: Vec<&str> = store
        .catalog()
        .cards()
        .iter()
        .filter(|c| c.is_import())
        .map(|c| c.id.as_str())
        .collect();
    assert_eq!(imports, ["good"]);
    assert!(!store.catalog().get("gemma3-270m").unwrap().is_import());
    // A broken card does not stop a new import from replacing it.
    let mut store = store;
    let src = fx.source("garbage.gguf", &bytes(64, 8));
    let fixed = store.import(&src, "garbage", meta()).unwrap();
    assert_eq!(fixed.method, ImportMethod::HardLinked);
    assert!(fx.store().catalog().get("garbage").is_some());
}

#[test]
fn a_missing_import_is_a_clear_error_and_never_pulled() {
    let fx = Fixture::new();
    let wheels = fx.dir.path().join("wheels");
    std::fs::create_dir_all(&wheels).unwrap();
    let content = bytes(64, 9);
    // A wheel that would satisfy a pull, to show none is attempted.
    build_wheel(&wheels, "gone", "1.0.0", &[("gone.gguf", &content)]);
    let fetcher = TestFetcher::new(&wheels);
    let calls = fetcher.calls.clone();
    let mut store = fx.store().with_fetcher(fetcher);
    let src = fx.source("gone.gguf", &content);
    let imported = store.import(&src, "gone", meta()).unwrap();
    std::fs::remove_file(&imported.path).unwrap();
    std::fs::remove_file(&src).unwrap();

    let expected =
        "imported model 'gone' is not on this node; import it or load it from a peer that has it";
    let store = fx.store().with_fetcher(TestFetcher::new(&wheels));
    for err in [
        store.ensure("gone").unwrap_err(),
        store.resolve("gone").unwrap_err(),
        store.pull(&imported.card, &mut |_| {}).unwrap_err(),
    ] {
        assert!(matches!(err, Error::ImportNotPresent { .. }), "{err}");
        assert_eq!(err.to_string(), expected);
    }
    assert_eq!(calls.load(Ordering::SeqCst), 0);
    assert!(
        !store
            .list()
            .iter()
            .any(|m| m.card.id == "gone" && m.present)
    );
}

#[test]
fn remove_deletes_an_imports_file_and_card() {
    let fx = Fixture::new();
    let mut store = fx.store();
    let src = fx.source("bye.gguf", &bytes(64, 10));
    store.import(&src, "bye", meta()).unwrap();
    assert!(store.remove("bye").unwrap());
    assert!(!fx.root.join("models/bye").exists());
    assert!(fx.store().catalog().get("bye").is_none());
    // The original is the user's: a hard link's removal leaves it.
    assert!(src.is_file());
}

#[test]
fn install_import_takes_a_peers_copy_and_keeps_its_card() {
    let fx = Fixture::new();
    let content = bytes(5000, 11);
    // Node A imports; node B gets the card and the bytes.
    let a_root = fx.dir.path().join("node-a");
    let mut a = Store::new(&a_root);
    let src = fx.source("shared.gguf", &content);
    let card = a.import(&src, "shared", meta()).unwrap().card;

    let mut b = fx.store();
    let origin = Path::new("node a");
    // Wrong bytes: refused, nothing installed, no card.
    let err = b
        .install_import(
            &card,
            &mut serve(vec![bytes(5000, 12)]),
            origin,
            &mut |_| {},
        )
        .unwrap_err();
    assert!(matches!(err, Error::HashMismatch { .. }), "{err}");
    assert!(!fx.root.join("models/shared/card.toml").exists());
    assert!(!fx.root.join("models/shared/shared.gguf").exists());

    let path = b
        .install_import(
            &card,
            &mut serve(vec![content.clone()]),
            origin,
            &mut |_| {},
        )
        .unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), content);
    let b_again = fx.store();
    assert_eq!(b_again.catalog().get("shared"), Some(&card));
    assert!(b_again.is_present("shared").unwrap());
    assert_tmp_empty(&fx.root);

    // A catalog card is not an import; an id taken by another file is refused.
    let tiny = b_again.catalog().cards()[0].clone();
    let err = b
        .install_import(
            &tiny,
            &mut serve(vec![content.clone()]),
            origin,
            &mut |_| {},
        )
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::InvalidCard {
                field: "source.imported_from",
                ..
            }
        ),
        "{err}"
    );
    let mut other = card.clone();
    other.sha256 = "ab".repeat(32);
    let err = b
        .install_import(
            &other,
            &mut serve(vec![content.clone()]),
            origin,
            &mut |_| {},
        )
        .unwrap_err();
    assert!(matches!(err, Error::ImportConflict { .. }), "{err}");
}

/// Three parts of a split GGUF, by llama.cpp's names, in a source directory.
fn split_set(fx: &Fixture) -> (Vec<PathBuf>, Vec<Vec<u8>>) {
    let contents: Vec<Vec<u8>> = (0..3u8)
        .map(|k| bytes(3000 + 100 * k as usize, 40 + k))
        .collect();
    let paths = contents
        .iter()
        .enumerate()
        .map(|(k, c)| fx.source(&format!("big-{:05}-of-00003.gguf", k + 1), c))
        .collect();
    (paths, contents)
}

#[test]
fn a_split_set_imports_under_one_id_with_every_part_pinned() {
    let fx = Fixture::new();
    let (paths, contents) = split_set(&fx);
    let mut store = fx.store();
    let imported = store.import_files(&paths, "big", meta()).unwrap();
    assert_eq!(imported.method, ImportMethod::HardLinked);
    let card = &imported.card;
    assert_eq!(card.file_name, "big-00001-of-00003.gguf");
    assert_eq!(card.file_count(), 3);
    assert_eq!(
        card.total_size(),
        contents.iter().map(|c| c.len() as u64).sum::<u64>()
    );
    assert_eq!(
        imported.path,
        fx.root.join("models/big/big-00001-of-00003.gguf")
    );
    for (k, c) in contents.iter().enumerate() {
        let one = card.file_card(k).unwrap();
        let path = fx.root.join("models/big").join(&one.file_name);
        assert_eq!(std::fs::read(&path).unwrap(), *c, "part {}", k + 1);
        assert_eq!(one.size, c.len() as u64);
    }
    assert!(card.file_card(3).is_none());
    // The card reads back, verifies, and every part counts for presence.
    let again = fx.store();
    assert_eq!(again.catalog().get("big"), Some(card));
    assert!(again.is_present("big").unwrap());
    again.verify("big").unwrap();
    assert_eq!(
        store.import_files(&paths, "big", meta()).unwrap().method,
        ImportMethod::AlreadyPresent
    );

    // A damaged later part is what verify names, and a missing one makes the model absent.
    let third = fx.root.join("models/big/big-00003-of-00003.gguf");
    std::fs::remove_file(&third).unwrap();
    std::fs::write(&third, bytes(3200, 99)).unwrap();
    let err = again.verify("big").unwrap_err();
    assert!(matches!(err, Error::HashMismatch { .. }), "{err}");
    std::fs::remove_file(&third).unwrap();
    assert!(!fx.store().is_present("big").unwrap());
    // Re-importing the same set fills the gap; a set with other bytes is refused.
    let mut s = fx.store();
    assert_ne!(
        s.import_files(&paths, "big", meta()).unwrap().method,
        ImportMethod::AlreadyPresent
    );
    s.verify("big").unwrap();
    let mut swapped = paths.clone();
    swapped.swap(0, 1);
    let err = s.import_files(&swapped, "big", meta()).unwrap_err();
    assert!(matches!(err, Error::ImportConflict { .. }), "{err}");
    let err = s.import_files(&paths[..2], "big", meta()).unwrap_err();
    assert!(matches!(err, Error::ImportConflict { .. }), "{err}");

    // Removal takes every part and the card.
    assert!(s.remove("big").unwrap());
    assert_eq!(entries(&fx.root.join("models")), Vec::<PathBuf>::new());
    assert_tmp_empty(&fx.root);
}

#[test]
fn a_peer_copy_of_a_split_import_fetches_each_missing_part() {
    let fx = Fixture::new();
    let (paths, contents) = split_set(&fx);
    let mut a = Store::new(fx.dir.path().join("node-a"));
    let card = a.import_files(&paths, "big", meta()).unwrap().card;

    let mut b = fx.store();
    let origin = Path::new("node a");
    // The second part's bytes are wrong: refused, and no card is written.
    let mut bad = contents.clone();
    bad[1] = bytes(contents[1].len(), 7);
    let err = b
        .install_import(&card, &mut serve(bad), origin, &mut |_| {})
        .unwrap_err();
    assert!(matches!(err, Error::HashMismatch { .. }), "{err}");
    assert!(!fx.root.join("models/big/card.toml").exists());
    // The good first part stays; the next copy asks only for what is missing.
    let mut asked = Vec::new();
    let mut peer = serve(contents.clone());
    let path = b
        .install_import(
            &card,
            &mut |k| {
                asked.push(k);
                peer(k)
            },
            origin,
            &mut |_| {},
        )
        .unwrap();
    assert_eq!(asked, vec![1, 2]);
    assert_eq!(path, fx.root.join("models/big/big-00001-of-00003.gguf"));
    let b = fx.store();
    assert_eq!(b.catalog().get("big"), Some(&card));
    b.verify("big").unwrap();
    assert_tmp_empty(&fx.root);
}

#[test]
fn split_cards_are_checked_file_by_file() {
    let fx = Fixture::new();
    let (paths, _) = split_set(&fx);
    let card = fx.store().import_files(&paths, "big", meta()).unwrap().card;
    let field = |c: &ModelCard| match c.validate("test") {
        Err(Error::InvalidCard { field, .. }) => field,
        other => panic!("expected InvalidCard, got {other:?}"),
    };
    let mut c = card.clone();
    c.more_files[0].file_name = "../x.gguf".into();
    assert_eq!(field(&c), "more_files.file_name");
    let mut c = card.clone();
    c.more_files[1].file_name = c.file_name.clone();
    assert_eq!(field(&c), "more_files.file_name");
    let mut c = card.clone();
    c.more_files[0].file_name = "card.toml".into();
    assert_eq!(field(&c), "more_files.file_name");
    let mut c = card.clone();
    c.more_files[0].sha256 = "x".into();
    assert_eq!(field(&c), "more_files.sha256");
    let mut c = card.clone();
    c.more_files[0].size = 0;
    assert_eq!(field(&c), "more_files.size");
    // A catalog card (with download parts) is one file.
    let mut c = card.clone();
    c.source = fx.store().catalog().cards()[0].source.clone();
    assert_eq!(field(&c), "more_files");
}
