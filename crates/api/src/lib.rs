//! strata's API server for one or more models: OpenAI's chat completions, completions and
//! Responses, Anthropic's Messages and Ollama's API over the continuous-batching scheduler
//! ([`strata_scheduler`]), behind the HTTP surface it shares with the cluster node
//! ([`strata_http`]).
//!
//! How a request flows, module by module (no module below imports one above it):
//! - `router` ([`router()`]): the routes; `routing` picks the model's router when several
//!   models share an address, and `access` checks keys.
//! - the dialects, one module each: `openai`, `messages` (Anthropic), `responses`, `ollama`.
//!   Each translates its request into OpenAI's chat or completion request and writes the
//!   answer back in its own shape (the `answer::Reply` it implements).
//! - `answer`: submits a prepared request to the scheduler and builds the answer from its
//!   events; `output` reads text, stop sequences and tool calls out of the tokens.
//! - `prepare`: checks a request, renders its chat through the template, tokenises it and
//!   compiles its constraint; `grammar`, `tools` and `call_format` give tool calls in each
//!   model family's syntax and JSON output, constrained by llguidance.
//! - `state` ([`AppState`]): what every handler of one model shares.
#![warn(missing_docs)]

mod access;
mod answer;
pub(crate) mod call_format;
mod embeddings;
pub(crate) mod grammar;
mod harmony;
mod messages;
mod ollama;
mod openai;
pub(crate) mod output;
mod prepare;
pub mod pull;
pub(crate) mod responses;
mod router;
pub(crate) mod routing;
#[cfg(test)]
mod schema_fuzz;
pub(crate) mod schema_limits;
mod state;
pub mod tenancy;
pub mod testkit;
pub(crate) mod tools;
pub mod types;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;

pub use grammar::GrammarError;
pub use router::router;
pub use schema_limits::SchemaError;
pub use state::{AppState, unix_now};
pub use strata_http::{ApiError, Dialect};
/// Prompt tokens a scheduler round (a pipeline's pass) prefills while other sequences are
/// generating; what a prompt arriving among live streams costs depends on it.
pub use strata_scheduler::LIVE_CHUNK;

use strata_engine::{Batch, Ready};
use strata_gguf::GgufFile;
use strata_http::{auth, listen};
use strata_tokenizer::{ChatTemplate, Tokenizer};

/// Why the server cannot start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The model could not be loaded.
    #[error(transparent)]
    Engine(#[from] strata_engine::Error),
    /// The model file is unreadable.
    #[error(transparent)]
    Gguf(#[from] strata_gguf::Error),
    /// The tokenizer or template is unusable.
    #[error(transparent)]
    Tokenizer(#[from] strata_tokenizer::Error),
    /// Grammar support could not be set up for this vocabulary.
    #[error("setting up constrained decoding: {0}")]
    Grammar(#[source] GrammarError),
    /// The engine thread could not start.
    #[error("starting the engine thread: {0}")]
    Thread(#[from] std::io::Error),
    /// A non-loopback address without keys.
    #[error(
        "refusing to serve {0} without API keys: anyone who can reach it could use the model. \
         Give --api-key-file, bind 127.0.0.1, or pass --insecure-no-auth"
    )]
    Unprotected(SocketAddr),
}

/// How to run a single-node server.
#[derive(Debug)]
pub struct ServeOptions {
    /// The GGUF file.
    pub model_path: PathBuf,
    /// The id clients name in `model`.
    pub model_id: String,
    /// Compute threads.
    pub threads: usize,
    /// Sequences decoded together (batch slots).
    pub parallel: usize,
    /// Requests that may wait for a slot before 429.
    pub queue: usize,
    /// Context window per sequence.
    pub n_ctx: Option<usize>,
    /// Keys, stored responses and metrics, shared with the other models served beside it.
    pub shared: Shared,
    /// Largest request body, in bytes.
    pub max_body: usize,
    /// Other names the model answers to.
    pub aliases: Vec<String>,
    /// Sampling settings for requests that do not give them.
    pub defaults: types::SamplingDefaults,
    /// Bytes for the prefix cache's blocks of earlier prompts (0: no prefix cache).
    pub cache_mem: usize,
    /// A chat template's source, used in place of the model's own.
    pub chat_template: Option<String>,
    /// Which llama.cpp build's arithmetic to reproduce (`None`: the one this CPU would get).
    pub flavour: Option<strata_kernels::attn::Flavour>,
    /// How embeddings pool, over what the file says (`None`: the file's `pooling_type`, or
    /// mean for a file that names none).
    pub pooling: Option<strata_engine::embed::Pooling>,
}

/// The prefix cache's default budget: 1 GiB holds about 45,000 prompt positions of the
/// default model (23 KiB each as f16) or 58,000 of Gemma 3 270M.
pub const DEFAULT_CACHE_MEM: usize = 1 << 30;

/// Whether serving `addr` with or without keys is allowed.
pub fn check_bind(
    addr: SocketAddr,
    has_keys: bool,
    insecure_no_auth: bool,
) -> Result<(), StartError> {
    if addr.ip().is_loopback() || has_keys || insecure_no_auth {
        Ok(())
    } else {
        Err(StartError::Unprotected(addr))
    }
}

/// Loads the model and starts the engine thread.
pub fn start(opts: ServeOptions) -> Result<Arc<AppState>, StartError> {
    let file = GgufFile::open(&opts.model_path)?;
    let Ready {
        engine: model,
        tokenizer,
        template,
    } = Ready::load(&file, opts.chat_template.as_deref(), opts.flavour)?;
    let n_ctx = opts
        .n_ctx
        .unwrap_or(model.config().default_context())
        .max(2);
    let mut info = ModelInfo::from_gguf(&file);
    info.embed_with = opts.pooling;
    let batch = Batch::new(model, opts.threads.max(1), opts.parallel.max(1), n_ctx)?
        .with_prefix_cache(opts.cache_mem);
    start_engine(
        Box::new(batch),
        tokenizer,
        template,
        EngineOptions {
            model_id: opts.model_id,
            queue: opts.queue,
            shared: opts.shared,
            max_body: opts.max_body,
            info,
            aliases: opts.aliases,
            defaults: opts.defaults,
        },
    )
}

/// What a model is, as clients that list models want it (Ollama's `details`).
#[derive(Debug, Clone, Default)]
pub struct ModelInfo {
    /// `general.architecture` (`llama`, `qwen2`, …).
    pub arch: String,
    /// Number of weights.
    pub parameters: u64,
    /// The most common weight type by bytes (`Q4_K`, …).
    pub quantization: String,
    /// The file's size in bytes.
    pub size: u64,
    /// The context the model was trained for.
    pub context_length: u64,
    /// The width of its hidden states (an embedding's length).
    pub embedding_length: u64,
    /// The pooling its file sets (`ARCH.pooling_type`): an embedding model.
    pub pooling: Option<strata_engine::embed::Pooling>,
    /// The pooling the server was told to use instead (`strata serve --pooling`).
    pub embed_with: Option<strata_engine::embed::Pooling>,
}

impl ModelInfo {
    /// Reads it off a GGUF file.
    pub fn from_gguf(file: &GgufFile) -> ModelInfo {
        let meta = file.metadata();
        let arch = meta
            .get_str("general.architecture")
            .unwrap_or("unknown")
            .to_string();
        let mut by_type = std::collections::BTreeMap::<String, u64>::new();
        for t in file.tensors() {
            *by_type.entry(t.ggml_type.name().to_string()).or_default() += t.n_bytes;
        }
        ModelInfo {
            parameters: file
                .tensors()
                .iter()
                .map(|t| t.dims.iter().product::<u64>())
                .sum(),
            quantization: by_type
                .into_iter()
                .max_by_key(|(_, n)| *n)
                .map(|(t, _)| t)
                .unwrap_or_default(),
            size: file.file_len(),
            context_length: meta
                .get_u32(&format!("{arch}.context_length"))
                .map(u64::from)
                .unwrap_or(0),
            embedding_length: meta
                .get_u32(&format!("{arch}.embedding_length"))
                .map(u64::from)
                .unwrap_or(0),
            pooling: strata_engine::embed::Pooling::of_file(file),
            embed_with: None,
            arch,
        }
    }
}

/// How to serve an engine that is already loaded.
#[derive(Debug)]
pub struct EngineOptions {
    /// The id clients name in `model`.
    pub model_id: String,
    /// Requests that may wait for a slot before 429.
    pub queue: usize,
    /// Keys, stored responses and metrics, shared with the other models served beside it.
    pub shared: Shared,
    /// Largest request body, in bytes.
    pub max_body: usize,
    /// What the model is.
    pub info: ModelInfo,
    /// Other names the model answers to.
    pub aliases: Vec<String>,
    /// Sampling settings for requests that do not give them.
    pub defaults: types::SamplingDefaults,
}

/// Starts the scheduler over a loaded engine (one process or rank 0 of a sharded instance).
pub fn start_engine(
    engine: Box<dyn strata_engine::Sequences>,
    tokenizer: Arc<Tokenizer>,
    template: Option<ChatTemplate>,
    opts: EngineOptions,
) -> Result<Arc<AppState>, StartError> {
    let n_ctx = engine.n_ctx();
    let format = call_format::CallFormat::detect(template.as_ref().map(ChatTemplate::source));
    let grammars =
        grammar::Grammars::new(Arc::clone(&tokenizer), format).map_err(StartError::Grammar)?;
    let call_markers = format
        .markers()
        .into_iter()
        .filter_map(|m| tokenizer.token_id(m))
        .filter(|&id| tokenizer.is_control(id))
        .collect();
    let max_token_bytes = (0..tokenizer.vocab_size() as u32)
        .map(|id| tokenizer.token_piece(id, true).len())
        .max()
        .unwrap_or(0)
        .max(8);
    let shared = opts.shared;
    let label = shared.several.then_some(opts.model_id.as_str());
    let metrics = Arc::new(strata_scheduler::Metrics::register(&shared.registry, label));
    let scheduler = strata_scheduler::Scheduler::start(
        engine,
        Arc::clone(&tokenizer),
        opts.queue,
        Arc::clone(&metrics),
    )?;
    Ok(Arc::new(AppState {
        model_id: opts.model_id,
        tokenizer,
        template,
        grammars,
        call_markers,
        scheduler,
        n_ctx,
        keys: shared.keys,
        metrics,
        max_body: opts.max_body,
        info: opts.info,
        responses: shared.responses,
        aliases: opts.aliases,
        defaults: opts.defaults,
        created: unix_now(),
        max_token_bytes,
        prepare: shared.prepare,
        served: shared.served,
        shared_prefix_cache: shared.shared_prefix_cache,
    }))
}

/// What the models served behind one address share: the keys (one rate limit per key however
/// many models it uses), stored responses (a conversation may change models), one metrics
/// registry (each model's metrics labelled `model="ID"` when there are several) and the
/// permits for preparing requests (one per core).
#[derive(Debug, Clone)]
pub struct Shared {
    keys: Option<Arc<auth::Keys>>,
    responses: Arc<responses::store::Store>,
    registry: Arc<std::sync::Mutex<prometheus_client::registry::Registry>>,
    prepare: Arc<tokio::sync::Semaphore>,
    several: bool,
    /// Every model name answered at this address (the other models of a server, a cluster's
    /// other instances), for "not found" errors to name; kept up to date by whoever routes.
    served: ServedNames,
    /// One prefix-cache partition for all keys ([`tenancy`]).
    shared_prefix_cache: bool,
}

/// The model names answered at one address, shared by the APIs behind it (their "not found"
/// errors list them) and kept up to date by whoever routes between them.
#[derive(Debug, Clone, Default)]
pub struct ServedNames(Arc<std::sync::RwLock<Vec<String>>>);

impl ServedNames {
    /// Names every model answered (ids and aliases).
    pub fn set(&self, names: Vec<String>) {
        let mut list = self
            .0
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if *list != names {
            *list = names;
        }
    }

    /// The names.
    pub fn get(&self) -> Vec<String> {
        self.0
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

impl Shared {
    /// For `models` models served together, with these keys.
    pub fn new(keys: Option<auth::Keys>, models: usize) -> Shared {
        Shared {
            keys: keys.map(Arc::new),
            responses: Arc::default(),
            registry: strata_scheduler::Metrics::registry(),
            prepare: Arc::new(tokio::sync::Semaphore::new(
                std::thread::available_parallelism().map_or(1, |n| n.get()),
            )),
            several: models > 1,
            served: ServedNames::default(),
            shared_prefix_cache: false,
        }
    }

    /// Lets every key's requests reuse each other's cached prompt blocks (a single-tenant
    /// server); by default each key's are its own ([`tenancy`]).
    pub fn with_shared_prefix_cache(mut self, shared: bool) -> Shared {
        self.shared_prefix_cache = shared;
        self
    }

    /// Names every model answered at this address (ids and aliases), for a request naming
    /// another to be told what there is.
    pub fn set_served(&self, names: Vec<String>) {
        self.served.set(names);
    }

    /// The same, with the list of names answered kept in `served` (shared with whoever routes).
    pub fn with_served(mut self, served: ServedNames) -> Shared {
        self.served = served;
        self
    }

    /// Whether requests need a key.
    pub fn has_keys(&self) -> bool {
        self.keys.is_some()
    }
}

/// Serves `models` on `listener` until `shutdown` resolves, each request going to the model it
/// names.
pub async fn serve(
    listener: tokio::net::TcpListener,
    models: Vec<Arc<AppState>>,
    http: &listen::HttpOptions,
    shutdown: impl std::future::Future<Output = ()> + Send,
) -> std::io::Result<()> {
    // A model's routes count the requests that reach them; the first model's metrics count
    // those refused before any did (the browser checks, a body deadline).
    let mut http = http.clone();
    if let Some(first) = models.first() {
        let metrics = Arc::clone(&first.metrics);
        http.access.observers.push(Arc::new(move |r| {
            if r.fields.model.is_none() {
                metrics.count_request(access::endpoint(r.path), r.status);
            }
        }));
    }
    listen::serve(listener, routing::router(models), &http, shutdown).await
}
