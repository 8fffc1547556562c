//! `strata serve`: the OpenAI-compatible API on one node, with the model loaded in this process.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use clap::Args;
use strata_api::ServeOptions;
use strata_http::auth::Keys;
use strata_http::browser::BrowserPolicy;
use strata_http::listen::{HttpOptions, Limits, default_max_connections};

use crate::cmd_run::resolve_model;

/// Arguments of `strata serve`.
#[derive(Debug, Args)]
pub(crate) struct ServeArgs {
    /// Model id from the catalog (fetched on first use) or a path to a GGUF file; repeat it to
    /// serve several models, each request going to the model it names.
    #[arg(long = "model", value_name = "MODEL", default_value = strata_store::DEFAULT_MODEL_ID)]
    models: Vec<String>,
    /// Address to listen on. Anything but loopback needs --api-key-file or --insecure-no-auth.
    #[arg(long, default_value = "127.0.0.1:8000")]
    api_addr: SocketAddr,
    /// API keys, one per line (`KEY [name=NAME] [rpm=N] [max_concurrent=N]`); clients send
    /// `Authorization: Bearer KEY`.
    #[arg(long)]
    api_key_file: Option<PathBuf>,
    /// Requests per minute per key, for keys without their own `rpm=`.
    #[arg(long)]
    rate_limit: Option<f64>,
    /// Requests in flight at once per key (a stream counts until it ends), for keys without
    /// their own `max_concurrent=`; more get 429 (default: no limit).
    #[arg(long, value_parser = crate::args::at_least_one, value_name = "N")]
    max_concurrent_per_key: Option<usize>,
    /// Serve a non-loopback address without keys.
    #[arg(long)]
    insecure_no_auth: bool,
    /// Run in this process, not as a child that is restarted when it dies of a signal (an
    /// abort, a stack overflow, the OOM killer).
    #[arg(long)]
    pub(crate) no_supervise: bool,
    /// Sequences decoded together in one batch.
    #[arg(long, default_value_t = 8, value_parser = crate::args::at_least_one)]
    parallel: usize,
    /// Requests that may wait for a free sequence slot; more get 429.
    #[arg(long, default_value_t = 64, value_parser = crate::args::at_least_one)]
    queue: usize,
    /// Context window per sequence (default: the model's, at most 8192).
    #[arg(long, value_parser = crate::args::at_least_one)]
    ctx_size: Option<usize>,
    /// Compute threads (default: all cores).
    #[arg(long, value_parser = crate::args::at_least_one)]
    threads: Option<usize>,
    /// Largest request body in bytes.
    #[arg(long, default_value_t = 4 << 20, value_parser = crate::args::at_least_one)]
    max_body: usize,
    /// Another name a model answers to, `NAME=MODEL` (MODEL: a served model's id; `NAME` alone
    /// when one model is served), for clients with hard-coded model names; repeatable.
    #[arg(long = "alias", value_name = "NAME[=MODEL]")]
    aliases: Vec<String>,
    /// Memory for the prefix cache, which keeps the keys and values of earlier prompts so a
    /// prompt starting the same way (an agent's system prompt and tools) skips computing them:
    /// bytes, or with a unit (`512MiB`, `2GiB`); 0 turns it off.
    #[arg(long, value_name = "SIZE", default_value = "1GiB", value_parser = parse_size)]
    cache_mem: usize,
    /// Let every API key's requests reuse each other's cached prompt blocks (a single-tenant
    /// server); by default each key's are its own, since a reused prompt answers sooner and
    /// would tell one client what another sent. `cache_salt` separates requests either way.
    #[arg(long)]
    shared_prefix_cache: bool,
    /// Chat template to use instead of the model's (or for a model without one, such as the
    /// catalog's gemma3-270m): a built-in (`chatml`, `gemma`) or a Jinja file; `MODEL=...` for
    /// one of several models (repeatable).
    #[arg(long = "chat-template", value_name = "[MODEL=]NAME|FILE")]
    chat_templates: Vec<String>,
    /// Which llama.cpp build to reproduce bit for bit, as `strata run --numerics`: `native`,
    /// `avx512`, `avx2` or `neon` (pinning one gives the same greedy answers on every machine).
    #[arg(long, value_enum, default_value_t = crate::cmd_run::Numerics::Native)]
    numerics: crate::cmd_run::Numerics,
    /// How embeddings pool (`mean`, `cls` or `last`), over the file's `pooling_type` (default:
    /// the file's, or mean for a chat model).
    #[arg(long, value_parser = crate::cmd_synth::parse_pooling)]
    pooling: Option<strata_engine::embed::Pooling>,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    pub(crate) http: HttpArgs,
}

/// Sampling for requests that do not say (clients such as Claude Code cannot).
#[derive(Debug, Args)]
pub(crate) struct SamplingArgs {
    /// Temperature for requests without one (0 is greedy; the APIs' own default is 1).
    #[arg(long, value_name = "T")]
    temperature: Option<f32>,
    /// Nucleus sampling for requests without `top_p`.
    #[arg(long, value_name = "P")]
    top_p: Option<f32>,
    /// Top-k for requests without `top_k` (0: off).
    #[arg(long, value_name = "K")]
    top_k: Option<i64>,
    /// Min-p for requests without `min_p`.
    #[arg(long, value_name = "P")]
    min_p: Option<f32>,
    /// Repetition penalty for requests without one (1: off).
    #[arg(long, value_name = "R")]
    repeat_penalty: Option<f32>,
    /// Output limit for requests that set none (default: the room left in the context).
    #[arg(long, value_name = "N")]
    max_tokens: Option<i64>,
    /// Speculative decoding for requests that do not say (`"speculate": true|false` in an
    /// OpenAI request): `ngram` drafts from text the sequence already holds and verifies the
    /// drafts of every stream in one pass; `suffix` also copies from the server's recent
    /// answers (agents repeat themselves across requests). The output is the same.
    #[arg(long, value_enum, default_value_t = crate::cmd_run::Speculate::Off)]
    speculate: crate::cmd_run::Speculate,
}

impl SamplingArgs {
    /// The defaults, checked as a request's would be.
    pub(crate) fn defaults(&self) -> Result<strata_api::types::SamplingDefaults> {
        if let Some(t) = self.temperature
            && !(t.is_finite() && (0.0..=2.0).contains(&t))
        {
            bail!("--temperature must be between 0 and 2 (got {t})");
        }
        if self.top_k.is_some_and(|k| k < 0) {
            bail!("--top-k must be at least 0");
        }
        if self.max_tokens.is_some_and(|n| n < 1) {
            bail!("--max-tokens must be at least 1");
        }
        let check = strata_engine::SamplingParams {
            top_p: self.top_p.unwrap_or(1.0),
            min_p: self.min_p.unwrap_or(0.0),
            repeat_penalty: self.repeat_penalty.unwrap_or(1.0),
            ..strata_engine::SamplingParams::default()
        };
        check
            .validate()
            .map_err(|m| anyhow::anyhow!("--{}", m.replace('_', "-")))?;
        Ok(strata_api::types::SamplingDefaults {
            temperature: self.temperature,
            top_p: self.top_p,
            top_k: self.top_k,
            min_p: self.min_p,
            repetition_penalty: self.repeat_penalty,
            max_tokens: self.max_tokens,
            speculation: self.speculate.speculation(),
        })
    }
}

/// A size in bytes: a number, optionally with a unit (`K`, `M`, `G`, `T`, each optionally
/// followed by `iB` or `B`; all powers of 1024, as memory is counted).
pub(crate) fn parse_size(s: &str) -> std::result::Result<usize, String> {
    let t = s.trim();
    let split = t.find(|c: char| !c.is_ascii_digit()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let n: usize = num
        .parse()
        .map_err(|_| format!("{s:?} is not a size (e.g. 1073741824, 512MiB, 2GiB)"))?;
    let shift = match unit.trim().to_ascii_lowercase().as_str() {
        "" | "b" => 0,
        "k" | "kb" | "kib" => 10,
        "m" | "mb" | "mib" => 20,
        "g" | "gb" | "gib" => 30,
        "t" | "tb" | "tib" => 40,
        other => {
            return Err(format!(
                "{other:?} is not a unit of size (use K, M, G or T)"
            ));
        }
    };
    n.checked_mul(1usize << shift)
        .ok_or_else(|| format!("{s:?} is too large"))
}

/// Each served model's aliases, from the `--alias` flags.
fn aliases(flags: &[String], ids: &[String]) -> Result<Vec<Vec<String>>> {
    let mut out = vec![Vec::new(); ids.len()];
    for a in flags {
        let (name, model) = match a.split_once('=') {
            Some((name, model)) => (name, Some(model)),
            None => (a.as_str(), None),
        };
        if name.is_empty() {
            bail!("--alias {a:?}: the alias is empty");
        }
        let i = match model {
            Some(m) => ids.iter().position(|i| i == m).ok_or_else(|| {
                anyhow::anyhow!(
                    "--alias {a:?}: this server serves {}, not {m:?}",
                    ids.join(", ")
                )
            })?,
            None if ids.len() == 1 => 0,
            None => bail!("--alias {a:?}: name the model, --alias {a}=MODEL"),
        };
        if ids.iter().any(|i| i == name) || out.iter().flatten().any(|x| x == name) {
            bail!("--alias {a:?}: {name:?} already names a served model");
        }
        out[i].push(name.to_string());
    }
    Ok(out)
}

/// Each served model's chat template source (`None`: the model's own), from the
/// `--chat-template` flags.
fn templates(flags: &[String], ids: &[String]) -> Result<Vec<Option<String>>> {
    let mut out: Vec<Option<String>> = vec![None; ids.len()];
    let mut every = None;
    for f in flags {
        // `MODEL=SPEC` for a served MODEL; anything else (a path may hold `=`) is for all.
        let one = f
            .split_once('=')
            .and_then(|(m, spec)| Some((ids.iter().position(|i| i == m)?, spec)));
        match one {
            Some((i, spec)) => out[i] = Some(crate::cmd_run::template_source(spec)?),
            None => every = Some(crate::cmd_run::template_source(f)?),
        }
    }
    Ok(out
        .into_iter()
        .map(|t| t.or_else(|| every.clone()))
        .collect())
}

/// What every HTTP surface (`serve`, `node`) takes: who may reach it from a browser, and how
/// long and how many clients may hold it.
#[derive(Debug, Args)]
pub(crate) struct HttpArgs {
    /// A host name this server is reached by, besides IP addresses, localhost and this machine's
    /// name (requests naming other hosts are refused: a guard against DNS rebinding); repeatable,
    /// `*` allows any.
    #[arg(long = "allow-host", value_name = "NAME")]
    allow_hosts: Vec<String>,
    /// An origin (`scheme://host[:port]`) whose web pages may call this API (CORS); repeatable.
    /// Without it, cross-origin requests that change anything are refused.
    #[arg(long = "cors-origin", value_name = "ORIGIN")]
    cors_origins: Vec<String>,
    /// Most HTTP connections open at once (default: half the descriptor limit); more get 503.
    #[arg(long, value_name = "N", value_parser = crate::args::at_least_one)]
    max_connections: Option<usize>,
    /// Seconds a client may take to send a request's headers (and an idle connection stays open).
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    header_timeout: f64,
    /// Seconds a client may take to send a request's body.
    #[arg(long, value_name = "SECS", default_value_t = 60.0)]
    body_timeout: f64,
    /// Seconds requests in flight may take to finish after Ctrl-C or SIGTERM.
    #[arg(long, value_name = "SECS", default_value_t = 10.0)]
    shutdown_grace: f64,
    /// No access log (by default one line per request: method, route, status, model, key name,
    /// tokens, time to first token, total time).
    #[arg(long)]
    quiet: bool,
    /// How log lines are written: `text`, or `json` (one object per line, for log shippers).
    #[arg(long, value_enum, default_value_t = crate::logging::LogFormat::Text)]
    log_format: crate::logging::LogFormat,
}

impl HttpArgs {
    /// The options, checked.
    pub(crate) fn options(&self) -> Result<HttpOptions> {
        let secs = |flag: &str, v: f64, min: f64| -> Result<std::time::Duration> {
            if !v.is_finite() || v < min || v > 86_400.0 {
                bail!("--{flag} must be between {min} and 86400 seconds (got {v})");
            }
            Ok(std::time::Duration::from_secs_f64(v))
        };
        let browser = BrowserPolicy {
            allow_hosts: self.allow_hosts.clone(),
            cors_origins: self.cors_origins.clone(),
        };
        browser.check().map_err(anyhow::Error::msg)?;
        let max_connections = match self.max_connections {
            Some(0) => bail!("--max-connections must be at least 1"),
            Some(n) => n,
            None => default_max_connections(),
        };
        Ok(HttpOptions {
            browser,
            limits: Limits {
                header_timeout: secs("header-timeout", self.header_timeout, 0.1)?,
                body_timeout: secs("body-timeout", self.body_timeout, 0.1)?,
                max_connections,
                shutdown_grace: secs("shutdown-grace", self.shutdown_grace, 0.0)?,
            },
            access: strata_http::access::AccessOptions {
                quiet: self.quiet,
                observers: Vec::new(),
            },
        })
    }

    /// How log lines are written.
    pub(crate) fn log_format(&self) -> crate::logging::LogFormat {
        self.log_format
    }
}

/// The id clients name: the catalog id, a model another tool downloaded as that tool names it
/// (`qwen3:8b` for `ollama:qwen3:8b`, `owner/repo:Q4_K_M` for `hf:owner/repo:Q4_K_M`), or the
/// file name without `.gguf`.
fn model_id(spec: &str) -> String {
    if let Some(scheme) = strata_store::SCHEMES.iter().find(|s| spec.starts_with(**s)) {
        return spec[scheme.len()..].to_string();
    }
    let p = Path::new(spec);
    if spec.ends_with(".gguf") || p.components().count() > 1 {
        p.file_stem()
            .map_or_else(|| spec.to_string(), |s| s.to_string_lossy().into_owned())
    } else {
        spec.to_string()
    }
}

pub(crate) fn serve(args: ServeArgs) -> Result<()> {
    if args.parallel == 0 || args.queue == 0 {
        bail!("--parallel and --queue must be at least 1");
    }
    if args.ctx_size == Some(0) {
        bail!("--ctx-size must be at least 1");
    }
    if args.max_body == 0 {
        bail!("--max-body must be at least 1 byte");
    }
    let keys = match &args.api_key_file {
        Some(f) => Some(
            Keys::from_file(f, args.rate_limit)?.with_max_concurrent(args.max_concurrent_per_key),
        ),
        None => None,
    };
    strata_api::check_bind(args.api_addr, keys.is_some(), args.insecure_no_auth)?;
    let http = args.http.options()?;
    let ids: Vec<String> = args.models.iter().map(|m| model_id(m)).collect();
    if let Some(twice) = ids
        .iter()
        .enumerate()
        .find(|(i, id)| ids[..*i].contains(id))
    {
        bail!("--model {:?} is given twice", twice.1);
    }
    let templates = templates(&args.chat_templates, &ids)?;
    let mut aliases = aliases(&args.aliases, &ids)?;
    let defaults = args.sampling.defaults()?;
    let threads = match args.threads {
        Some(0) => bail!("--threads must be at least 1"),
        Some(t) => t,
        None => std::thread::available_parallelism().map_or(1, |n| n.get()),
    };
    let paths = args
        .models
        .iter()
        .map(|m| resolve_model(m))
        .collect::<Result<Vec<_>>>()?;
    let shared =
        strata_api::Shared::new(keys, ids.len()).with_shared_prefix_cache(args.shared_prefix_cache);
    let mut states = Vec::new();
    for (i, (path, id)) in paths.iter().zip(&ids).enumerate() {
        let state = strata_api::start(ServeOptions {
            model_path: path.clone(),
            model_id: id.clone(),
            threads,
            parallel: args.parallel,
            queue: args.queue,
            n_ctx: args.ctx_size,
            shared: shared.clone(),
            max_body: args.max_body,
            aliases: std::mem::take(&mut aliases[i]),
            defaults: defaults.clone(),
            cache_mem: args.cache_mem,
            chat_template: templates[i].clone(),
            flavour: Some(args.numerics.flavour()),
            pooling: args.pooling,
        })
        .with_context(|| format!("loading {}", path.display()))?;
        states.push(state);
    }
    shared.set_served(
        states
            .iter()
            .flat_map(|s| std::iter::once(&s.model_id).chain(&s.aliases))
            .cloned()
            .collect(),
    );
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .context("starting the async runtime")?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(args.api_addr)
            .await
            .with_context(|| format!("binding {}", args.api_addr))?;
        let addr = listener.local_addr()?;
        let keys = if shared.has_keys() {
            "API keys required"
        } else {
            "no API keys"
        };
        for state in &states {
            // Scripts and tests read the address from this line: the URL stays a word of its own.
            tracing::info!(
                "serving {} on http://{addr} ({} slots, context {}, {keys})",
                state.model_id,
                args.parallel,
                state.n_ctx,
            );
        }
        strata_api::serve(listener, states, &http, shutdown_signal()).await?;
        tracing::info!("stopped");
        Ok(())
    })
}

pub(crate) async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        let term = async {
            match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
                Ok(mut s) => {
                    s.recv().await;
                }
                Err(_) => std::future::pending::<()>().await,
            }
        };
        tokio::select! {
            _ = ctrl_c => {},
            _ = term => {},
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn model_ids_from_catalog_ids_and_paths() {
        assert_eq!(model_id("smollm2-135m-instruct"), "smollm2-135m-instruct");
        assert_eq!(model_id("./models/tiny.gguf"), "tiny");
        assert_eq!(model_id("/x/y/z.gguf"), "z");
        assert_eq!(model_id("ollama:qwen3:8b"), "qwen3:8b");
        assert_eq!(model_id("hf:owner/repo:Q4_K_M"), "owner/repo:Q4_K_M");
    }

    #[test]
    fn sizes_take_binary_units() {
        assert_eq!(parse_size("0"), Ok(0));
        assert_eq!(parse_size("1024"), Ok(1024));
        assert_eq!(parse_size("512MiB"), Ok(512 << 20));
        assert_eq!(parse_size("2G"), Ok(2 << 30));
        assert_eq!(parse_size(" 3 kb "), Ok(3 << 10));
        assert!(parse_size("").is_err());
        assert!(parse_size("-1").is_err());
        assert!(parse_size("1.5GiB").is_err());
        assert!(parse_size("2PB").is_err());
        assert!(parse_size("99999999999999999999T").is_err());
    }
}
