//! What every handler of one model shares: its tokenizer and template, the engine thread,
//! keys, metrics and limits.

use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use strata_http::auth::Keys;
use strata_scheduler::{Metrics, Scheduler};
use strata_tokenizer::{ChatTemplate, Tokenizer};

use crate::ApiError;
use crate::grammar::Grammars;

/// Everything the handlers share.
pub struct AppState {
    /// The model id clients must name.
    pub model_id: String,
    /// The tokenizer.
    pub tokenizer: Arc<Tokenizer>,
    /// The chat template, if the model has one.
    pub template: Option<ChatTemplate>,
    /// Grammar compilation (it knows the model's tool-call syntax).
    pub grammars: Grammars,
    /// Control tokens that are markers of the tool-call syntax (Mistral's `[TOOL_CALLS]`):
    /// control tokens are not decoded as text, but these must reach the call parser.
    pub call_markers: Vec<u32>,
    /// The engine thread.
    pub scheduler: Scheduler,
    /// Context window per sequence.
    pub n_ctx: usize,
    /// Accepted keys (`None`: no authentication).
    pub keys: Option<Arc<Keys>>,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Largest request body accepted, in bytes.
    pub max_body: usize,
    /// When the server started (the model's `created`).
    pub created: u64,
    /// The longest text one token stands for, in bytes: a prompt of `n` bytes has at least
    /// `n / max_token_bytes` tokens, so a prompt that cannot fit is refused before tokenising.
    pub max_token_bytes: usize,
    /// What the model is (Ollama's `/api/show` and `/api/tags` tell it).
    pub info: crate::ModelInfo,
    /// Responses kept for `previous_response_id` and `GET /v1/responses/{id}`.
    pub responses: Arc<crate::responses::store::Store>,
    /// Other names the model answers to (clients with hard-coded model names).
    pub aliases: Vec<String>,
    /// Sampling settings for requests that do not give them.
    pub defaults: crate::types::SamplingDefaults,
    /// Permits for preparing requests (parsing, templating, tokenising, compiling grammars)
    /// off the async workers: one per core, so a burst of huge requests queues here instead
    /// of stalling `/health` and every stream.
    pub prepare: Arc<tokio::sync::Semaphore>,
    /// Every model name answered at this address (see [`crate::Shared::set_served`]).
    pub served: crate::ServedNames,
    /// One prefix-cache partition for every key (`--shared-prefix-cache`; see
    /// [`crate::tenancy`]).
    pub shared_prefix_cache: bool,
}

impl AppState {
    /// The names a "not found" lists: this model's id and aliases, then every other model
    /// answered at this address.
    pub(crate) fn served_names(&self) -> Vec<String> {
        let mut names: Vec<String> = std::iter::once(&self.model_id)
            .chain(&self.aliases)
            .cloned()
            .collect();
        for n in self.served.get() {
            if !names.contains(&n) {
                names.push(n);
            }
        }
        names
    }

    /// Whether requests naming `model` are served here: the model's id or one of its aliases.
    pub fn serves(&self, model: &str) -> bool {
        model == self.model_id || self.aliases.iter().any(|a| a == model)
    }

    /// [`AppState::serves`] as the request's 404.
    pub(crate) fn check_model(&self, model: &str) -> Result<(), ApiError> {
        if self.serves(model) {
            Ok(())
        } else {
            Err(ApiError::model_not_found(model, &self.served_names()))
        }
    }
}

impl std::fmt::Debug for AppState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppState")
            .field("model_id", &self.model_id)
            .field("n_ctx", &self.n_ctx)
            .finish_non_exhaustive()
    }
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}
