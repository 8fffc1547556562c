//! Feeds arbitrary bytes through every stage a model file goes through: the GGUF reader, the
//! tokenizer and chat template from its metadata, the model configuration, the shard loader and
//! one forward step. Any panic, out-of-bounds access or abort is a bug; errors are fine.
#![no_main]

use libfuzzer_sys::fuzz_target;
use strata_engine::{Model, NoComm, Scratch, StageInput};
use strata_gguf::GgufFile;
use strata_kernels::ThreadPool;
use strata_tokenizer::{ChatTemplate, Tokenizer};

fuzz_target!(|data: &[u8]| {
    let Ok(file) = GgufFile::from_bytes(data.to_vec()) else {
        return;
    };
    for t in file.tensors() {
        let _ = file.tensor_data(t);
    }
    if let Ok(tok) = Tokenizer::from_gguf(file.metadata()) {
        let _ = tok.encode("Hello <|im_start|>world 123", true);
    }
    let _ = ChatTemplate::from_gguf(file.metadata());
    let Ok(model) = Model::load_full(&file) else {
        return;
    };
    let Ok(mut cache) = model.new_cache(8) else {
        return;
    };
    let pool = ThreadPool::new(1);
    let mut scratch = Scratch::default();
    let _ = model.forward(&pool, &mut cache, &mut scratch, StageInput::Tokens(&[0, 1]), &mut NoComm);
});
