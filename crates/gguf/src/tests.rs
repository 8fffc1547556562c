#![allow(clippy::unwrap_used)]

use super::*;

fn small_file() -> Vec<u8> {
    let mut w = GgufWriter::new();
    w.kv("general.architecture", Value::String("llama".into()))
        .kv("llama.block_count", Value::U32(2))
        .kv(
            "tokenizer.ggml.tokens",
            Value::Array(Array::String(vec!["a".into(), "b".into()])),
        )
        .kv(
            "tokenizer.ggml.token_type",
            Value::Array(Array::I32(vec![1, 3])),
        )
        .tensor("w", &[4, 2], GgmlType::F32, vec![0u8; 32])
        .tensor("q", &[32, 2], GgmlType::Q8_0, vec![1u8; 68]);
    w.to_bytes()
}

#[test]
fn reads_back_what_the_writer_wrote() {
    let f = GgufFile::from_bytes(small_file()).unwrap();
    assert_eq!(f.version(), 3);
    let md = f.metadata();
    assert_eq!(md.get_str("general.architecture").unwrap(), "llama");
    assert_eq!(md.get_u32("llama.block_count").unwrap(), 2);
    assert_eq!(md.get_u64("llama.block_count").unwrap(), 2);
    assert_eq!(
        md.get_str_array("tokenizer.ggml.tokens").unwrap(),
        ["a", "b"]
    );
    assert_eq!(
        md.get_i32_array("tokenizer.ggml.token_type").unwrap(),
        [1, 3]
    );
    let q = f.require_tensor("q").unwrap();
    assert_eq!(q.ggml_type, GgmlType::Q8_0);
    assert_eq!((q.row_len(), q.n_rows(), q.row_bytes()), (32, 2, 34));
    assert!(f.tensor_data(q).iter().all(|&b| b == 1));
}

#[test]
fn typed_getters_name_the_key() {
    let f = GgufFile::from_bytes(small_file()).unwrap();
    let e = f.metadata().get_str("llama.block_count").unwrap_err();
    assert_eq!(
        e.to_string(),
        "metadata key llama.block_count: expected string, found u32"
    );
    let e = f.metadata().get_u32("nope").unwrap_err();
    assert_eq!(e.to_string(), "metadata key nope is missing");
}

#[test]
fn bad_magic_is_reported() {
    let mut b = small_file();
    b[0] = b'X';
    let e = GgufFile::from_bytes(b).unwrap_err();
    assert!(matches!(e, Error::BadMagic { .. }), "{e}");
}

#[test]
fn truncation_anywhere_is_an_error_not_a_panic() {
    let b = small_file();
    for cut in 0..b.len() {
        // Cutting only trailing padding after the last tensor is still a valid file.
        let r = GgufFile::from_bytes(b[..cut].to_vec());
        if cut < b.len() - 28 {
            assert!(r.is_err(), "cut at {cut} accepted");
        }
    }
}

#[test]
fn huge_counts_do_not_allocate() {
    let mut b = small_file();
    // tensor count := u64::MAX
    b[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    let e = GgufFile::from_bytes(b).unwrap_err();
    assert!(matches!(e, Error::ImplausibleCount { .. }), "{e}");
}

#[test]
fn tensor_past_end_names_the_tensor() {
    let mut w = GgufWriter::new();
    w.tensor(
        "blk.3.ffn_up.weight",
        &[32, 4],
        GgmlType::Q4_1,
        vec![0u8; 80],
    );
    let mut b = w.to_bytes();
    b.truncate(b.len() - 20);
    let e = GgufFile::from_bytes(b).unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.starts_with("tensor blk.3.ffn_up.weight: data at"),
        "{msg}"
    );
    assert!(msg.contains("exceeds file size"), "{msg}");
}

#[test]
fn unknown_tensor_type_is_named() {
    let mut w = GgufWriter::new();
    w.tensor("x", &[32], GgmlType::Q8_0, vec![0u8; 34]);
    let mut b = w.to_bytes();
    // The type id sits right after name (8 + 1), n_dims (4) and one dim (8), after the 24-byte
    // preamble.
    let at = 24 + 9 + 4 + 8;
    b[at..at + 4].copy_from_slice(&99u32.to_le_bytes());
    let e = GgufFile::from_bytes(b).unwrap_err();
    assert_eq!(e.to_string(), "tensor x: unsupported tensor type 99");
}

#[test]
fn partial_blocks_are_rejected() {
    let mut w = GgufWriter::new();
    w.tensor("x", &[33], GgmlType::Q8_0, vec![0u8; 68]);
    let e = GgufFile::from_bytes(w.to_bytes()).unwrap_err();
    assert!(matches!(e, Error::BadShape { .. }), "{e}");
}

/// Regression: vocabulary-only files have no tensors and end right after the metadata, without
/// padding to the alignment; llama.cpp accepts them.
#[test]
fn tensorless_file_without_padding_is_accepted() {
    let mut w = GgufWriter::new();
    w.kv("general.architecture", Value::String("llama".into()));
    let mut b = w.to_bytes();
    let unpadded = 24 + 8 + "general.architecture".len() + 4 + 8 + "llama".len();
    b.truncate(unpadded);
    let f = GgufFile::from_bytes(b).unwrap();
    assert!(f.tensors().is_empty());
}

#[test]
fn duplicate_keys_are_rejected() {
    let mut w = GgufWriter::new();
    w.kv("a", Value::U8(1)).kv("a", Value::U8(2));
    let e = GgufFile::from_bytes(w.to_bytes()).unwrap_err();
    assert!(matches!(e, Error::Duplicate { .. }), "{e}");
}

mod mutation {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig { cases: 2000, ..ProptestConfig::default() })]

        /// Any byte flips in a valid file give either a valid file or an error, never a panic,
        /// and every tensor of an accepted file lies inside it.
        #[test]
        fn mutated_small_files_never_panic(
            flips in proptest::collection::vec((any::<proptest::sample::Index>(), any::<u8>()), 1..8),
            cut in any::<proptest::sample::Index>(),
        ) {
            let mut b = small_file();
            for (i, v) in flips {
                let at = i.index(b.len());
                b[at] = v;
            }
            let keep = b.len() - cut.index(b.len() / 4);
            b.truncate(keep);
            if let Ok(f) = GgufFile::from_bytes(b) {
                for t in f.tensors() {
                    prop_assert!(t.offset + t.n_bytes <= f.file_len());
                    prop_assert_eq!(f.tensor_data(t).len() as u64, t.n_bytes);
                }
            }
        }
    }
}

/// A file cut after its header plans (shapes and metadata read) but holds no data; cut
/// inside the header, it is still an error.
#[test]
fn a_header_without_its_tensors_opens_for_planning_only() {
    let b = small_file();
    let whole = GgufFile::from_bytes(b.clone()).unwrap();
    let dir = std::env::temp_dir().join(format!("strata-gguf-header-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("cut.gguf");
    let data = whole.data_offset() as usize;
    std::fs::write(&path, &b[..data]).unwrap();
    assert!(
        GgufFile::open(&path).is_err(),
        "a cut file must not open to run"
    );
    let f = GgufFile::open_header(&path).unwrap();
    assert_eq!(f.metadata().get_u32("llama.block_count").unwrap(), 2);
    let q = f.require_tensor("q").unwrap();
    assert_eq!(q.n_bytes, 68);
    assert!(f.tensor_data(q).is_empty());
    std::fs::write(&path, &b[..data / 2]).unwrap();
    assert!(GgufFile::open_header(&path).is_err());
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn the_header_length_is_known_from_a_prefix() {
    let bytes = small_file();
    let f = GgufFile::from_bytes(bytes.clone()).unwrap();
    let end = f.data_offset();
    assert_eq!(header_len(&bytes).unwrap(), Some(end));
    assert_eq!(header_len(&bytes[..end as usize]).unwrap(), Some(end));
    assert_eq!(header_len(&bytes[..40]).unwrap(), None);
    assert!(header_len(b"not a gguf file at all, clearly").is_err());
}

#[test]
fn a_recording_file_remembers_the_ranges_read() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("m.gguf");
    std::fs::write(&path, small_file()).unwrap();
    let f = GgufFile::open_recording(&path).unwrap();
    assert!(f.reads().is_empty());
    let w = f.require_tensor("w").unwrap().clone();
    let q = f.require_tensor("q").unwrap().clone();
    f.tensor_data(&q);
    f.range(w.offset as usize, 8);
    f.tensor_data(&w);
    // w and q lie end to end (32 bytes, aligned): one merged range.
    assert_eq!(f.reads(), vec![(w.offset, q.offset + q.n_bytes)]);
    assert!(GgufFile::open(&path).unwrap().reads().is_empty());
    assert_eq!(f.part_starts(), vec![0]);
}
