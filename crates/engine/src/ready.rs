//! A model made ready to serve text: its engine with the tokenizer and chat template that turn
//! text into its tokens and back.
//!
//! Every front end builds one (the one-shot [`crate::Generator`], the API server, `strata run`,
//! a sharded instance's rank 0 and a cluster node's instances), and all of them build it here,
//! so a template given instead of the file's, or a check of the vocabulary, applies to each
//! alike. The engine is whatever runs the weights: the whole [`Model`] in this process, or the
//! coordinating rank of a sharded one, which only its caller knows how to start.

use std::sync::Arc;

use strata_gguf::GgufFile;
use strata_kernels::attn::Flavour;
use strata_tokenizer::{ChatTemplate, Tokenizer};

use crate::Model;

/// An engine with its model's tokenizer and chat template.
#[derive(Debug)]
pub struct Ready<E> {
    /// What runs the weights.
    pub engine: E,
    /// The model's tokenizer.
    pub tokenizer: Arc<Tokenizer>,
    /// The chat template: the one given, else the file's (`None`: the file has none).
    pub template: Option<ChatTemplate>,
}

impl<E> Ready<E> {
    /// Reads the tokenizer and chat template of `file` (or uses `chat_template`, Jinja source,
    /// with the file's special tokens), then starts the engine with `engine`. The vocabulary
    /// is read first, so a file whose tokenizer is unusable fails before its weights load.
    pub fn open<X>(
        file: &GgufFile,
        chat_template: Option<&str>,
        engine: impl FnOnce(&GgufFile) -> Result<E, X>,
    ) -> Result<Ready<E>, X>
    where
        X: From<strata_tokenizer::Error>,
    {
        let tokenizer = Arc::new(Tokenizer::from_gguf(file.metadata())?);
        let template = match chat_template {
            Some(source) => Some(ChatTemplate::for_model(file.metadata(), source)?),
            None => ChatTemplate::from_gguf(file.metadata())?,
        };
        Ok(Ready {
            engine: engine(file)?,
            tokenizer,
            template,
        })
    }
}

impl Ready<Model> {
    /// The whole model in this process, computing as the llama.cpp build `flavour` names
    /// (this machine's own when `None`).
    pub fn load(
        file: &GgufFile,
        chat_template: Option<&str>,
        flavour: Option<Flavour>,
    ) -> crate::Result<Ready<Model>> {
        Ready::open(file, chat_template, |file| {
            let mut model = Model::load_full(file)?;
            if let Some(f) = flavour {
                model.set_flavour(f);
            }
            Ok(model)
        })
    }
}
