//! Pulls against a local hub that speaks the real one's protocol (`strata-testhub`), with
//! the faults the real one has: cut connections, 429s and 5xx, expired signed URLs,
//! corrupt bytes, gated and private repositories, paginated listings, full disks.

#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::time::Duration;
use strata_hub::{Error, Hub, HubCache, HubEvent, HubRef, RangeSet, Retry, Token, Transfer};
use strata_testhub::{Kind, TestHub};

const SINGLE: usize = 3_000_000;
const PART: usize = 700_000;

/// Bytes that differ everywhere, from a seed.
fn noise(seed: u64, n: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
    (0..n)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

struct Fixture {
    dir: tempfile::TempDir,
    hub: TestHub,
}

impl Fixture {
    fn root(&self) -> PathBuf {
        self.dir.path().join("root")
    }

    fn cache(&self) -> PathBuf {
        self.dir.path().join("cache")
    }

    fn original(&self, repo: &str, path: &str) -> Vec<u8> {
        std::fs::read(self.root().join(repo).join(path)).unwrap()
    }

    /// A client with fast retries and small ranges, so a few MB make many requests.
    fn client(&self, token: Option<&str>) -> Hub {
        Hub::new(
            &self.hub.endpoint(),
            token.and_then(Token::new),
            HubCache::new(self.cache()),
        )
        .with_transfer(Transfer {
            streams: 4,
            chunk: 256 << 10,
        })
        .with_retry(Retry {
            attempts: 5,
            first_wait: Duration::from_millis(10),
            max_wait: Duration::from_millis(50),
        })
    }
}

/// `o/r`: a single-file Q4_K_M, a three-part Q8_0 set in a folder, a README; `o/gated` and
/// `o/secret` with one GGUF each.
fn fixture(configure: impl FnOnce(strata_testhub::Builder) -> strata_testhub::Builder) -> Fixture {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let r = root.join("o/r");
    std::fs::create_dir_all(r.join("q8")).unwrap();
    std::fs::write(r.join("README.md"), "a test model\n").unwrap();
    std::fs::write(r.join("m-Q4_K_M.gguf"), noise(1, SINGLE)).unwrap();
    for i in 1..=3 {
        let name = format!("q8/m-Q8_0-{i:05}-of-00003.gguf");
        std::fs::write(r.join(name), noise(10 + i as u64, PART)).unwrap();
    }
    for (repo, seed) in [("o/gated", 20), ("o/secret", 21)] {
        std::fs::create_dir_all(root.join(repo)).unwrap();
        std::fs::write(root.join(repo).join("g-Q4_0.gguf"), noise(seed, 100_000)).unwrap();
    }
    let b = TestHub::builder(&root)
        .gated("o/gated", &["granted"])
        .private("o/secret", &["granted"])
        .token("plain");
    let hub = configure(b).start().unwrap();
    Fixture { dir, hub }
}

fn reference(s: &str) -> HubRef {
    HubRef::parse(s.strip_prefix("hf:").unwrap()).unwrap()
}

fn pull(hub: &Hub, s: &str) -> strata_hub::Result<strata_hub::Pulled> {
    hub.pull(&reference(s), &mut |_| {})
}

fn assert_same(path: &Path, expected: &[u8]) {
    let got = std::fs::read(path).unwrap();
    assert!(
        got == expected,
        "{} differs from the hub's file",
        path.display()
    );
}

#[test]
fn a_quant_pulls_every_part_of_its_split_set_into_the_hub_cache() {
    let f = fixture(|b| b);
    let hub = f.client(None);
    let mut plan = None;
    let got = hub
        .pull(&reference("hf:o/r:q8_0"), &mut |e| {
            if let HubEvent::Plan {
                files,
                bytes,
                missing,
            } = e
            {
                plan = Some((files, bytes, missing));
            }
        })
        .unwrap();
    let total = 3 * PART as u64;
    assert_eq!(plan, Some((3, total, total)));
    assert_eq!(got.paths.len(), 3);
    assert_eq!((got.size, got.fetched), (total, total));
    let commit = f.hub.commit("o/r").unwrap();
    assert_eq!(got.commit, commit);
    for (i, p) in got.paths.iter().enumerate() {
        let name = format!("q8/m-Q8_0-{:05}-of-00003.gguf", i + 1);
        let snap = f
            .cache()
            .join("models--o--r/snapshots")
            .join(&commit)
            .join(&name);
        assert_eq!(p, &snap);
        assert!(
            std::fs::symlink_metadata(p).unwrap().is_symlink(),
            "snapshots link to blobs"
        );
        assert_same(p, &f.original("o/r", &name));
    }
    let main = std::fs::read_to_string(f.cache().join("models--o--r/refs/main")).unwrap();
    assert_eq!(main.trim(), commit);
    let stats = f.hub.stats();
    assert_eq!(
        stats.cdn_bytes(),
        total,
        "each byte crossed the network once"
    );
    assert!(
        stats.peak_cdn_streams >= 2,
        "ranges ran in parallel: {stats:?}"
    );

    // The cache answers a second pull without a byte from the CDN.
    f.hub.reset().unwrap();
    let again = pull(&hub, "hf:o/r:Q8_0").unwrap();
    assert_eq!(again.fetched, 0);
    assert_eq!(f.hub.stats().cdn_bytes(), 0);
    // And the cache alone finds it, as it does for files other tools downloaded.
    let found = hub.cache().find(&reference("hf:o/r:Q8_0")).unwrap();
    assert_eq!(found, got.paths[0]);
}

#[test]
fn a_path_names_one_file_and_only_a_gguf() {
    let f = fixture(|b| b);
    // A README is not a model; the reference says so rather than downloading it.
    let err = HubRef::parse("o/r/README.md").unwrap_err();
    assert!(err.contains("README.md"), "{err}");
    let got = pull(&f.client(None), "hf:o/r/m-Q4_K_M.gguf").unwrap();
    assert_same(&got.paths[0], &f.original("o/r", "m-Q4_K_M.gguf"));
}

#[test]
fn cut_connections_resume_where_they_stopped() {
    let f = fixture(|b| b);
    f.hub.faults().cut_next(5, 100_000);
    let got = pull(&f.client(None), "hf:o/r:Q4_K_M").unwrap();
    assert_same(&got.paths[0], &f.original("o/r", "m-Q4_K_M.gguf"));
    assert_eq!(got.fetched, SINGLE as u64);
    let stats = f.hub.stats();
    assert_eq!(stats.cuts_served, 5);
    assert_eq!(
        stats.cdn_bytes(),
        SINGLE as u64,
        "resuming asks only for the bytes not yet held"
    );
}

#[test]
fn an_interrupted_download_resumes_from_its_record() {
    let f = fixture(|b| b);
    let hub = f.client(None);
    let r = reference("hf:o/r:Q4_K_M");
    let remote = hub.remote(&r).unwrap();
    let entry = &remote.files[0];
    // What a killed pull leaves: the partial file at full length and the ranges it held.
    let blob = hub.cache().blob("o/r", entry.etag());
    std::fs::create_dir_all(blob.parent().unwrap()).unwrap();
    let partial = PathBuf::from(format!("{}.strata-partial", blob.display()));
    let original = f.original("o/r", "m-Q4_K_M.gguf");
    let held = 1_000_000u64;
    let mut bytes = vec![0u8; SINGLE];
    bytes[..held as usize].copy_from_slice(&original[..held as usize]);
    std::fs::write(&partial, &bytes).unwrap();
    let mut record = RangeSet::new();
    record.insert(0, held);
    record
        .save(Path::new(&format!("{}.ranges", partial.display())))
        .unwrap();

    let got = hub.pull(&r, &mut |_| {}).unwrap();
    assert_same(&got.paths[0], &original);
    assert_eq!(got.fetched, SINGLE as u64 - held);
    assert_eq!(f.hub.stats().cdn_bytes(), SINGLE as u64 - held);
    assert!(!partial.exists(), "the partial file became the blob");
}

#[test]
fn rate_limits_and_server_errors_are_retried() {
    let f = fixture(|b| b.retry_after(0));
    let faults = f.hub.faults();
    faults.fail_next(Kind::Api, 2, 429);
    faults.fail_next(Kind::Resolve, 1, 503);
    faults.fail_next(Kind::Cdn, 2, 502);
    let got = pull(&f.client(None), "hf:o/r:Q4_K_M").unwrap();
    assert_same(&got.paths[0], &f.original("o/r", "m-Q4_K_M.gguf"));
    assert_eq!(f.hub.stats().faults_served, 5);
}

#[test]
fn a_hub_that_keeps_failing_is_reported_after_the_retries() {
    let f = fixture(|b| b);
    f.hub.faults().fail_next(Kind::Api, 100, 503);
    let err = pull(&f.client(None), "hf:o/r:Q4_K_M").unwrap_err();
    assert!(matches!(err, Error::Http { status: 503, .. }), "{err:?}");
    assert_eq!(
        f.hub.stats().faults_served,
        5,
        "five attempts, then the error"
    );
}

#[test]
fn expired_signed_urls_are_renewed_mid_download() {
    let f = fixture(|b| b);
    f.hub.faults().set_stream_rate(4 << 20);
    let mut expired = false;
    let got = f
        .client(None)
        .pull(&reference("hf:o/r:Q4_K_M"), &mut |e| {
            if !expired && matches!(e, HubEvent::File(strata_hub::FileEvent::Downloading { .. })) {
                expired = true;
                f.hub.faults().expire_urls();
            }
        })
        .unwrap();
    assert!(expired);
    assert_same(&got.paths[0], &f.original("o/r", "m-Q4_K_M.gguf"));
    assert!(
        f.hub.stats().requests_of(Kind::Resolve) >= 2,
        "the hub was asked for a fresh URL"
    );
}

#[test]
fn a_corrupt_download_names_the_file_and_keeps_what_was_good() {
    let f = fixture(|b| b);
    let hub = f.client(None);
    let good = pull(&hub, "hf:o/r:Q4_K_M").unwrap();
    f.hub.faults().corrupt_next(1);
    let err = pull(&hub, "hf:o/r:Q8_0").unwrap_err();
    let Error::HashMismatch { file, .. } = &err else {
        panic!("{err:?}");
    };
    assert!(file.starts_with("o/r/q8/m-Q8_0-0000"), "{file}");
    assert!(err.to_string().contains(file.as_str()), "{err}");
    assert_same(&good.paths[0], &f.original("o/r", "m-Q4_K_M.gguf"));
    let leftovers: Vec<_> = std::fs::read_dir(f.cache().join("models--o--r/blobs"))
        .unwrap()
        .filter_map(|e| e.ok())
        .filter(|e| e.file_name().to_string_lossy().contains("strata-partial"))
        .map(|e| e.path())
        .collect();
    assert!(
        leftovers.is_empty(),
        "bad bytes are not kept: {leftovers:?}"
    );
    // The next pull starts the bad file afresh and succeeds.
    let got = pull(&hub, "hf:o/r:Q8_0").unwrap();
    assert_same(
        &got.paths[2],
        &f.original("o/r", "q8/m-Q8_0-00003-of-00003.gguf"),
    );
}

#[test]
fn gated_and_private_repositories_say_what_to_do() {
    let f = fixture(|b| b);
    let err = pull(&f.client(None), "hf:o/gated").unwrap_err();
    assert!(matches!(err, Error::Gated { token: false, .. }), "{err:?}");
    assert!(err.to_string().contains("HF_TOKEN"), "{err}");
    let err = pull(&f.client(Some("plain")), "hf:o/gated").unwrap_err();
    assert!(matches!(err, Error::Gated { token: true, .. }), "{err:?}");
    let err = pull(&f.client(Some("forged")), "hf:o/r:Q4_K_M").unwrap_err();
    assert!(matches!(err, Error::BadToken { .. }), "{err:?}");
    let err = pull(&f.client(None), "hf:o/secret").unwrap_err();
    assert!(
        matches!(err, Error::RepoNotFound { token: false, .. }),
        "{err:?}"
    );

    let got = pull(&f.client(Some("granted")), "hf:o/gated").unwrap();
    assert_same(&got.paths[0], &f.original("o/gated", "g-Q4_0.gguf"));
    let got = pull(&f.client(Some("granted")), "hf:o/secret").unwrap();
    assert_same(&got.paths[0], &f.original("o/secret", "g-Q4_0.gguf"));
    assert!(
        !f.hub.stats().cdn_saw_authorization,
        "the token stays with the hub; the CDN never sees it"
    );
}

#[test]
fn wrong_names_list_what_the_repository_has() {
    let f = fixture(|b| b);
    let hub = f.client(None);
    let err = pull(&hub, "hf:o/r:Q5_K_M").unwrap_err().to_string();
    assert!(err.contains("Q4_K_M") && err.contains("Q8_0"), "{err}");
    let err = pull(&hub, "hf:o/r").unwrap_err().to_string();
    assert!(err.contains("Q4_K_M") && err.contains("Q8_0"), "{err}");
    let err = pull(&hub, "hf:o/r:Q4_K_M@v9").unwrap_err();
    assert!(matches!(err, Error::RevisionNotFound { .. }), "{err:?}");
    let err = pull(&hub, "hf:o/none").unwrap_err();
    assert!(matches!(err, Error::RepoNotFound { .. }), "{err:?}");
    assert_eq!(f.hub.stats().cdn_bytes(), 0);
}

#[test]
fn a_listing_in_pages_is_read_to_the_end() {
    let f = fixture(|b| b.page_size(2));
    let got = pull(&f.client(None), "hf:o/r:Q8_0").unwrap();
    assert_eq!(got.paths.len(), 3);
    assert!(
        f.hub.stats().requests_of(Kind::Api) >= 4,
        "revision + several pages"
    );
}

#[test]
fn a_pinned_commit_is_a_revision() {
    let f = fixture(|b| b);
    let commit = f.hub.commit("o/r").unwrap();
    let got = pull(&f.client(None), &format!("hf:o/r:Q4_K_M@{commit}")).unwrap();
    assert_eq!(got.commit, commit);
}

/// A disk too small for the download is refused before a byte is written.
#[test]
#[ignore = "needs root to mount a small tmpfs"]
fn a_full_disk_is_refused_before_writing() {
    let f = fixture(|b| b);
    let small = f.dir.path().join("small");
    std::fs::create_dir_all(&small).unwrap();
    let ok = std::process::Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=8m", "tmpfs"])
        .arg(&small)
        .status()
        .unwrap();
    assert!(ok.success(), "mount tmpfs");
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = std::process::Command::new("umount").arg(&self.0).status();
        }
    }
    let _guard = Unmount(small.clone());
    // Fill it so that less than the file's size stays free.
    std::fs::write(small.join("filler"), vec![0u8; 6 << 20]).unwrap();
    let hub = Hub::new(&f.hub.endpoint(), None, HubCache::new(small.join("hub")));
    let err = pull(&hub, "hf:o/r:Q4_K_M").unwrap_err();
    let Error::NoSpace { need, free, .. } = &err else {
        panic!("{err:?}");
    };
    assert_eq!(*need, SINGLE as u64);
    assert!(*free < *need, "{err}");
    assert_eq!(f.hub.stats().cdn_bytes(), 0, "nothing was fetched");
    let blobs = small.join("hub/models--o--r/blobs");
    let written: u64 = std::fs::read_dir(&blobs)
        .map(|d| {
            d.filter_map(|e| e.ok()?.metadata().ok())
                .map(|m| m.len())
                .sum()
        })
        .unwrap_or(0);
    assert_eq!(written, 0, "nothing was written");
}

/// A GGUF of two 4 MiB f32 tensors behind a header with a long vocabulary.
fn two_tensor_gguf() -> Vec<u8> {
    use strata_gguf::{Array, GgmlType, GgufWriter, Value};
    let vocab: Vec<String> = (0..60_000).map(|i| format!("token-{i:06}")).collect();
    let mut w = GgufWriter::new();
    w.kv("general.architecture", Value::String("llama".into()))
        .kv("tokenizer.ggml.tokens", Value::Array(Array::String(vocab)))
        .tensor("a", &[1024, 1024], GgmlType::F32, noise(5, 4 << 20))
        .tensor("b", &[1024, 1024], GgmlType::F32, noise(6, 4 << 20));
    w.to_bytes()
}

#[test]
fn a_shard_fetches_the_headers_then_only_its_ranges() {
    let f = fixture(|b| b);
    let bytes = two_tensor_gguf();
    std::fs::create_dir_all(f.root().join("o/t")).unwrap();
    std::fs::write(f.root().join("o/t/t-F32.gguf"), &bytes).unwrap();
    f.hub.reset().unwrap();
    let hub = f.client(None);
    let r = reference("hf:o/t");

    let sparse = hub.headers(&r, &mut |_| {}).unwrap();
    let header = strata_gguf::GgufFile::open_header(&sparse.view).unwrap();
    assert!(!sparse.complete());
    let data = header.data_offset();
    assert!(data > 1 << 20, "the header outgrew the first fetch: {data}");
    // The header, and at most as much again (prefixes grow by doubling until it parses).
    let prefix = sparse.bytes_held();
    assert!(
        prefix >= data && prefix <= 2 * data,
        "{prefix} for a {data}-byte header"
    );
    assert_eq!(f.hub.stats().cdn_bytes(), prefix);

    // Only tensor b.
    let b = header.tensor("b").unwrap().clone();
    let want = vec![vec![(b.offset, b.offset + b.n_bytes)]];
    let got = hub.fetch_ranges(&sparse, &want, &mut |_| {}).unwrap();
    assert_eq!(got.fetched(), b.n_bytes);
    assert_eq!(f.hub.stats().cdn_bytes(), prefix + b.n_bytes);
    let file = strata_gguf::GgufFile::open(&got.view).unwrap();
    assert!(file.tensor_data(&b) == &bytes[b.offset as usize..(b.offset + b.n_bytes) as usize]);
    // Asking again fetches nothing.
    let again = hub.fetch_ranges(&got, &want, &mut |_| {}).unwrap();
    assert_eq!(again.fetched(), 0);
    // Another cache takes b's bytes from this one (as a peer's node does) and then needs
    // nothing more from the hub for them.
    let etag = got.files[0].etag().to_string();
    let (path, have) = hub.cache().holding("o/t", &etag).unwrap().unwrap();
    assert!(have.gaps(b.offset, b.offset + b.n_bytes).is_empty());
    assert!(hub.cache().holding("o/../t", &etag).is_err());
    assert!(hub.cache().holding("o/t", "../../x").is_err());
    let other = Hub::new(
        &f.hub.endpoint(),
        None,
        HubCache::new(f.dir.path().join("other-cache")),
    );
    let theirs = other.headers(&r, &mut |_| {}).unwrap();
    let mut piece = vec![0u8; b.n_bytes as usize];
    std::os::unix::fs::FileExt::read_exact_at(
        &std::fs::File::open(&path).unwrap(),
        &mut piece,
        b.offset,
    )
    .unwrap();
    other.put_range(&theirs, 0, b.offset, &piece).unwrap();
    let before = f.hub.stats().cdn_bytes();
    let theirs = other.fetch_ranges(&theirs, &want, &mut |_| {}).unwrap();
    assert_eq!(theirs.fetched(), 0);
    assert_eq!(f.hub.stats().cdn_bytes(), before);
    let file = strata_gguf::GgufFile::open(&theirs.view).unwrap();
    assert!(file.tensor_data(&b) == &bytes[b.offset as usize..(b.offset + b.n_bytes) as usize]);

    // A file held in part says how much is here; there is no hash to check it against.
    let checks = hub.cache().verify(&r, &mut |_, _, _| {}).unwrap();
    assert_eq!(
        checks[0].check,
        strata_hub::Check::Partial {
            held: prefix + b.n_bytes
        }
    );

    // The whole pull takes only the rest, checks the file and makes it a blob.
    let pulled = pull(&hub, "hf:o/t").unwrap();
    assert_eq!(pulled.fetched, bytes.len() as u64 - prefix - b.n_bytes);
    assert_same(&pulled.paths[0], &bytes);
    let view = hub.headers(&r, &mut |_| {}).unwrap();
    assert!(view.complete());
    assert_same(&view.view, &bytes);
    let checks = hub.cache().verify(&r, &mut |_, _, _| {}).unwrap();
    assert!(matches!(&checks[0].check, strata_hub::Check::Verified { hash } if hash.len() == 64));
    // A flipped byte in the blob is found.
    let blob = checks[0].blob.clone();
    let mut corrupt = bytes.clone();
    corrupt[bytes.len() / 2] ^= 1;
    std::fs::write(&blob, &corrupt).unwrap();
    let checks = hub.cache().verify(&r, &mut |_, _, _| {}).unwrap();
    assert!(matches!(
        checks[0].check,
        strata_hub::Check::Mismatch { .. }
    ));
}

#[test]
fn removing_a_model_keeps_the_rest_of_the_repository() {
    let f = fixture(|b| b);
    let hub = f.client(None);
    let q4 = pull(&hub, "hf:o/r:Q4_K_M").unwrap();
    let q8 = pull(&hub, "hf:o/r:Q8_0").unwrap();
    let gone = hub.cache().remove(&reference("hf:o/r:Q8_0")).unwrap();
    assert_eq!(gone.files, 3);
    assert_eq!(gone.bytes, 3 * PART as u64);
    assert!(
        q8.paths
            .iter()
            .all(|p| std::fs::symlink_metadata(p).is_err())
    );
    assert!(hub.cache().find(&reference("hf:o/r:Q8_0")).is_err());
    assert_same(&q4.paths[0], &f.original("o/r", "m-Q4_K_M.gguf"));
    assert_eq!(
        hub.cache().find(&reference("hf:o/r:Q4_K_M")).unwrap(),
        q4.paths[0]
    );
    // The last model of the snapshot takes the snapshot and its ref with it.
    hub.cache().remove(&reference("hf:o/r:Q4_K_M")).unwrap();
    let repo = f.cache().join("models--o--r");
    assert!(!repo.join("snapshots").join(&q4.commit).exists());
    assert!(!repo.join("refs/main").exists());
    assert_eq!(std::fs::read_dir(repo.join("blobs")).unwrap().count(), 0);
    assert!(hub.cache().remove(&reference("hf:o/r:Q4_K_M")).is_err());
}
