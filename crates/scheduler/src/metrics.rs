//! Prometheus metrics of the API server, served at `GET /metrics` in the text format.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::{Arc, Mutex, PoisonError};

/// Labels of the request counter.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct RequestLabels {
    /// The route (`/v1/chat/completions`, …; `other` for unknown paths).
    pub endpoint: String,
    /// The HTTP status answered.
    pub status: u16,
}

/// Labels of the speculative decoding counters.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct DraftLabels {
    /// Where the drafts came from (`ngram`).
    pub source: String,
}

/// Every metric the server keeps.
#[derive(Debug)]
pub struct Metrics {
    /// The registry these metrics are in (with every other model's, when several are served).
    registry: Arc<Mutex<Registry>>,
    /// Requests by endpoint and status.
    pub requests: Family<RequestLabels, Counter>,
    /// Prompt tokens processed.
    pub prompt_tokens: Counter,
    /// Tokens generated.
    pub completion_tokens: Counter,
    /// Time from admission to the first generated token.
    pub ttft: Histogram,
    /// Time between consecutive generated tokens of a sequence.
    pub inter_token: Histogram,
    /// Requests waiting for a batch slot.
    pub queue_depth: Gauge,
    /// Sequences being generated.
    pub active_sequences: Gauge,
    /// Panics caught on the engine thread (each failed the requests in flight).
    pub engine_panics: Counter,
    /// Prompt tokens restored from the prefix cache instead of computed.
    pub cached_tokens: Counter,
    /// Bytes of keys and values the prefix cache holds.
    pub prefix_cache_bytes: Gauge,
    /// Blocks the prefix cache holds.
    pub prefix_cache_blocks: Gauge,
    /// Blocks dropped from the prefix cache to stay within its budget.
    pub prefix_cache_evictions: Gauge,
    /// Finished calls or JSON answers that break a schema keyword the grammar cannot enforce.
    pub schema_violations: Counter,
    /// Bytes of keys and values running sequences computed themselves.
    pub kv_own_bytes: Gauge,
    /// Bytes of the shared prefix blocks running sequences read in place, each counted once.
    pub kv_shared_bytes: Gauge,
    /// Bytes private copies of those blocks would have taken (one per reading sequence).
    pub kv_shared_read_bytes: Gauge,
    /// Tokens drafted for speculative decoding, by source.
    pub drafted_tokens: Family<DraftLabels, Counter>,
    /// Drafted tokens the model accepted, by source (the acceptance rate is this over
    /// `drafted_tokens`).
    pub accepted_tokens: Family<DraftLabels, Counter>,
    /// Verification passes (decode steps that scored drafts).
    pub verify_passes: Counter,
}

impl Default for Metrics {
    fn default() -> Self {
        Metrics::new()
    }
}

impl Metrics {
    /// A fresh set of metrics, registered under the `strata_` prefix.
    pub fn new() -> Metrics {
        Metrics::register(&Metrics::registry(), None)
    }

    /// An empty registry of strata's metrics, for [`Metrics::register`].
    pub fn registry() -> Arc<Mutex<Registry>> {
        Arc::new(Mutex::new(Registry::with_prefix("strata")))
    }

    /// A set of metrics in `shared`, labelled `model="ID"` when a model id is given (several
    /// models behind one address report into one registry).
    pub fn register(shared: &Arc<Mutex<Registry>>, model: Option<&str>) -> Metrics {
        let mut root = shared.lock().unwrap_or_else(PoisonError::into_inner);
        let registry = match model {
            Some(id) => root.sub_registry_with_label(("model".into(), id.to_string().into())),
            None => &mut *root,
        };
        let requests = Family::<RequestLabels, Counter>::default();
        registry.register(
            "http_requests",
            "HTTP requests by endpoint and status",
            requests.clone(),
        );
        let prompt_tokens = Counter::default();
        registry.register(
            "prompt_tokens",
            "Prompt tokens processed",
            prompt_tokens.clone(),
        );
        let completion_tokens = Counter::default();
        registry.register(
            "completion_tokens",
            "Tokens generated",
            completion_tokens.clone(),
        );
        let ttft = Histogram::new(exponential_buckets(0.005, 2.0, 14));
        registry.register(
            "time_to_first_token_seconds",
            "Seconds from a request's arrival to its first generated token",
            ttft.clone(),
        );
        let inter_token = Histogram::new(exponential_buckets(0.001, 2.0, 14));
        registry.register(
            "inter_token_latency_seconds",
            "Seconds between consecutive generated tokens of one sequence",
            inter_token.clone(),
        );
        let queue_depth = Gauge::default();
        registry.register(
            "queue_depth",
            "Requests waiting for a batch slot",
            queue_depth.clone(),
        );
        let active_sequences = Gauge::default();
        registry.register(
            "active_sequences",
            "Sequences being generated",
            active_sequences.clone(),
        );
        let engine_panics = Counter::default();
        registry.register(
            "engine_panics",
            "Panics caught on the engine thread; each failed the requests in flight",
            engine_panics.clone(),
        );
        let cached_tokens = Counter::default();
        registry.register(
            "cached_prompt_tokens",
            "Prompt tokens restored from the prefix cache instead of computed",
            cached_tokens.clone(),
        );
        let prefix_cache_bytes = Gauge::default();
        registry.register(
            "prefix_cache_bytes",
            "Bytes of keys and values held by the prefix cache",
            prefix_cache_bytes.clone(),
        );
        let prefix_cache_blocks = Gauge::default();
        registry.register(
            "prefix_cache_blocks",
            "Blocks of 256 prompt positions held by the prefix cache",
            prefix_cache_blocks.clone(),
        );
        let prefix_cache_evictions = Gauge::default();
        registry.register(
            "prefix_cache_evictions",
            "Blocks dropped from the prefix cache to stay within its budget, since start",
            prefix_cache_evictions.clone(),
        );
        let kv_own_bytes = Gauge::default();
        registry.register(
            "kv_own_bytes",
            "Bytes of keys and values running sequences computed themselves",
            kv_own_bytes.clone(),
        );
        let kv_shared_bytes = Gauge::default();
        registry.register(
            "kv_shared_bytes",
            "Bytes of prompt-prefix blocks running sequences read in place, each block counted once",
            kv_shared_bytes.clone(),
        );
        let kv_shared_read_bytes = Gauge::default();
        registry.register(
            "kv_shared_read_bytes",
            "Bytes private copies of the shared prefix blocks would take, one per reading sequence",
            kv_shared_read_bytes.clone(),
        );
        let schema_violations = Counter::default();
        registry.register(
            "schema_violations",
            "Finished tool calls or JSON answers that break a schema keyword the grammar cannot enforce",
            schema_violations.clone(),
        );
        let drafted_tokens = Family::<DraftLabels, Counter>::default();
        registry.register(
            "speculative_drafted_tokens",
            "Tokens drafted for speculative decoding, by source",
            drafted_tokens.clone(),
        );
        let accepted_tokens = Family::<DraftLabels, Counter>::default();
        registry.register(
            "speculative_accepted_tokens",
            "Drafted tokens the model accepted, by source",
            accepted_tokens.clone(),
        );
        let verify_passes = Counter::default();
        registry.register(
            "speculative_verify_passes",
            "Decode steps that scored speculative drafts",
            verify_passes.clone(),
        );
        drop(root);
        Metrics {
            drafted_tokens,
            accepted_tokens,
            verify_passes,
            schema_violations,
            registry: Arc::clone(shared),
            engine_panics,
            cached_tokens,
            prefix_cache_bytes,
            prefix_cache_blocks,
            prefix_cache_evictions,
            kv_own_bytes,
            kv_shared_bytes,
            kv_shared_read_bytes,
            requests,
            prompt_tokens,
            completion_tokens,
            ttft,
            inter_token,
            queue_depth,
            active_sequences,
        }
    }

    /// Shows what the prefix cache holds.
    pub fn show_prefix_cache(&self, s: &strata_engine::prefix::PrefixStats) {
        let g = |x: u64| i64::try_from(x).unwrap_or(i64::MAX);
        self.prefix_cache_bytes.set(g(s.bytes as u64));
        self.prefix_cache_blocks.set(g(s.blocks as u64));
        self.prefix_cache_evictions.set(g(s.evicted));
    }

    /// Shows what the running sequences' caches hold.
    pub fn show_kv(&self, s: &strata_engine::prefix::KvStats) {
        let g = |x: usize| i64::try_from(x).unwrap_or(i64::MAX);
        self.kv_own_bytes.set(g(s.own_bytes));
        self.kv_shared_bytes.set(g(s.shared_bytes));
        self.kv_shared_read_bytes.set(g(s.shared_read_bytes));
    }

    /// Counts one answered request.
    pub fn count_request(&self, endpoint: &str, status: u16) {
        self.requests
            .get_or_create(&RequestLabels {
                endpoint: endpoint.to_string(),
                status,
            })
            .inc();
    }

    /// The text exposition.
    pub fn render(&self) -> String {
        let mut out = String::new();
        // Writing into a String cannot fail.
        let registry = self.registry.lock().unwrap_or_else(PoisonError::into_inner);
        let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
        out
    }
}
