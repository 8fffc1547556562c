//! `strata run` (one prompt, streamed) and `strata chat` (an interactive multi-turn REPL).
//!
//! Both resolve the model through the store (pulling the default model on first use), build the
//! prompt (chat template unless `--raw`), and stream text to stdout as tokens arrive.

use std::io::{BufRead, Write};
use std::path::PathBuf;

use anyhow::{Context, Result, bail};
use clap::Args;
use strata_engine::{Batch, GenerateRequest, GenerationStats, SamplingParams, Sequences};
use strata_kernels::attn::Flavour;
use strata_store::{Store, TerminalProgress};
use strata_tokenizer::{ChatMessage, ChatTemplate, Tokenizer};

/// Options shared by `run` and `chat`.
#[derive(Debug, Args)]
pub(crate) struct ModelOpts {
    /// Model id from the catalog (`strata models list`) or a path to a GGUF file.
    #[arg(long, short = 'm', default_value = strata_store::DEFAULT_MODEL_ID)]
    model: String,
    /// Compute threads (default: all cores).
    #[arg(long, short = 't', value_parser = crate::args::at_least_one)]
    threads: Option<usize>,
    /// Context size in tokens (default: the model's, at most 8192).
    #[arg(long, value_parser = crate::args::at_least_one)]
    ctx_size: Option<usize>,
    /// System prompt (chat template only).
    #[arg(long)]
    system: Option<String>,
    /// Chat template to use instead of the model's (or for a model without one): a built-in
    /// (`chatml`, `gemma`) or a Jinja file.
    #[arg(long, value_name = "NAME|FILE")]
    chat_template: Option<String>,
    /// Most tokens to generate.
    #[arg(long, short = 'n', default_value_t = 256, value_parser = crate::args::at_least_one)]
    max_tokens: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    /// Keep only the K most likely tokens (0 = off).
    #[arg(long, default_value_t = 0, value_parser = crate::args::count)]
    top_k: usize,
    /// Nucleus sampling threshold (1 = off).
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Minimum probability relative to the best token (0 = off).
    #[arg(long, default_value_t = 0.0)]
    min_p: f32,
    /// Repetition penalty over the last 64 tokens (1 = off).
    #[arg(long, default_value_t = 1.0)]
    repeat_penalty: f32,
    /// Presence penalty (0 = off).
    #[arg(long, default_value_t = 0.0)]
    presence_penalty: f32,
    /// Frequency penalty (0 = off).
    #[arg(long, default_value_t = 0.0)]
    frequency_penalty: f32,
    /// Keep generating after the model's end-of-generation token.
    #[arg(long)]
    ignore_eos: bool,
    /// Random seed for sampling.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Which llama.cpp build to reproduce bit for bit: `native` (the build llama.cpp makes on
    /// this CPU), `avx512`, `avx2` or `neon` (aarch64 for plain NEON); their matrix and
    /// attention sums and exponentials differ.
    #[arg(long, value_enum, default_value_t = Numerics::Native)]
    numerics: Numerics,
    /// Speculative decoding: `ngram` drafts tokens from text the sequence already holds (the
    /// prompt and the answer so far) and verifies them in one pass; the output is the same.
    #[arg(long, value_enum, default_value_t = Speculate::Off)]
    speculate: Speculate,
    #[command(flatten)]
    shard: crate::cmd_shard::ShardOpts,
}

/// `--speculate`.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub(crate) enum Speculate {
    /// One token per step.
    Off,
    /// Prompt lookup: what followed the latest earlier occurrence of the last tokens.
    Ngram,
    /// Prompt lookup and the server's recent answers (`strata serve`); here, as `ngram`.
    Suffix,
}

impl Speculate {
    pub(crate) fn speculation(self) -> strata_engine::speculate::Speculation {
        use strata_engine::speculate::Speculation;
        match self {
            Speculate::Off => Speculation::Off,
            Speculate::Ngram => Speculation::Ngram,
            Speculate::Suffix => Speculation::Suffix,
        }
    }
}

/// `--numerics`.
#[derive(Clone, Copy, Debug, clap::ValueEnum)]
pub(crate) enum Numerics {
    /// As llama.cpp builds itself for this CPU.
    Native,
    /// An AVX-512 build.
    Avx512,
    /// An AVX2 build without AVX-512.
    Avx2,
    /// An aarch64 build for plain NEON (`-march=armv8-a`).
    Neon,
}

impl Numerics {
    pub(crate) fn flavour(self) -> Flavour {
        match self {
            Numerics::Native => Flavour::native(),
            Numerics::Avx512 => Flavour::Avx512,
            Numerics::Avx2 => Flavour::Avx2,
            Numerics::Neon => Flavour::Neon,
        }
    }
}

/// `strata run`.
#[derive(Debug, Args)]
pub(crate) struct RunArgs {
    #[command(flatten)]
    opts: ModelOpts,
    /// Tokenise the prompt as is, without the chat template.
    #[arg(long)]
    raw: bool,
    /// Print one JSON object of timings on the last line of stderr.
    #[arg(long)]
    stats_json: bool,
    /// Read the prompt from this file instead.
    #[arg(long, short = 'f', conflicts_with = "prompt")]
    file: Option<PathBuf>,
    /// The prompt (`-` reads it from standard input).
    prompt: Option<String>,
}

impl RunArgs {
    /// The prompt text from the argument, `-f FILE` or standard input; never empty.
    fn prompt_text(&self) -> Result<String> {
        let text = match (&self.prompt, &self.file) {
            (_, Some(path)) => std::fs::read_to_string(path)
                .with_context(|| format!("reading the prompt from {}", path.display()))?,
            (Some(p), None) if p == "-" => {
                let mut s = String::new();
                std::io::Read::read_to_string(&mut std::io::stdin(), &mut s)
                    .context("reading the prompt from standard input")?;
                s
            }
            (Some(p), None) => p.clone(),
            (None, None) => {
                bail!("no prompt: give it as an argument, with -f FILE, or as - for standard input")
            }
        };
        if text.trim().is_empty() {
            bail!("the prompt is empty");
        }
        Ok(text)
    }
}

/// `strata chat`.
#[derive(Debug, Args)]
pub(crate) struct ChatArgs {
    #[command(flatten)]
    opts: ModelOpts,
}

impl ModelOpts {
    /// Checks every option that needs no model, so a mistake is reported in one line naming
    /// the flag before anything is fetched or loaded.
    fn check(&self) -> Result<()> {
        self.sampling()?;
        if self.max_tokens == 0 {
            bail!("--max-tokens must be at least 1");
        }
        if self.threads == Some(0) {
            bail!("--threads must be at least 1");
        }
        if self.ctx_size == Some(0) {
            bail!("--ctx-size must be at least 1");
        }
        if let Some(spec) = &self.chat_template {
            template_source(spec)?;
        }
        Ok(())
    }

    fn sampling(&self) -> Result<SamplingParams> {
        let p = SamplingParams {
            temperature: self.temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            repeat_penalty: self.repeat_penalty,
            presence_penalty: self.presence_penalty,
            frequency_penalty: self.frequency_penalty,
            seed: self.seed,
            ..SamplingParams::default()
        };
        // The engine names the API's fields (`top_p`); the command line names its flags.
        p.validate().map_err(|e| match e.split_once(' ') {
            Some((field, rest)) => anyhow::anyhow!("--{} {rest}", field.replace('_', "-")),
            None => anyhow::Error::msg(e),
        })?;
        Ok(p)
    }

    /// Loads the model in this process, or starts a sharded instance with `--ranks N`.
    fn load_backend(&self) -> Result<Backend> {
        let template = self
            .chat_template
            .as_deref()
            .map(template_source)
            .transpose()?;
        let template = template.as_deref();
        if self.shard.ranks <= 1 {
            if self.shard.listen.is_some() {
                bail!("--listen needs --ranks of 2 or more");
            }
            return self.load(template);
        }
        if self.threads.is_some() {
            bail!("with --ranks, set threads with --threads-per-rank");
        }
        let path = resolve_model(&self.model)?;
        let mut session = crate::cmd_shard::launch(
            &path,
            &self.shard,
            self.ctx_size,
            1,
            self.numerics.flavour(),
            template,
        )?;
        Ok(Backend {
            tokenizer: std::sync::Arc::clone(&session.tokenizer),
            template: session.template.take(),
            engine: Engine::Sharded(Box::new(session)),
        })
    }

    /// The whole model in this process: a one-slot batch.
    fn load(&self, chat_template: Option<&str>) -> Result<Backend> {
        let path = resolve_model(&self.model)?;
        let threads = match self.threads {
            Some(0) => bail!("--threads must be at least 1"),
            Some(t) => t,
            None => std::thread::available_parallelism().map_or(1, |n| n.get()),
        };
        let loaded = (|| -> Result<Backend> {
            let file = strata_gguf::GgufFile::open(&path)?;
            let strata_engine::Ready {
                engine: model,
                tokenizer,
                template,
            } = strata_engine::Ready::load(&file, chat_template, Some(self.numerics.flavour()))?;
            let n_ctx = self
                .ctx_size
                .unwrap_or(model.config().default_context())
                .max(1);
            Ok(Backend {
                engine: Engine::Local(Box::new(Batch::new(model, threads, 1, n_ctx)?)),
                tokenizer,
                template,
            })
        })();
        loaded.with_context(|| format!("loading {}", path.display()))
    }
}

/// The source of `--chat-template SPEC`: a built-in template's, or a file's; compiled once to
/// report a mistake in it before any model is loaded.
pub(crate) fn template_source(spec: &str) -> Result<String> {
    let source = match ChatTemplate::builtin(spec) {
        Some(s) => s.to_string(),
        None => std::fs::read_to_string(spec).with_context(|| {
            let names: Vec<&str> = strata_tokenizer::BUILTIN_TEMPLATES
                .iter()
                .map(|(n, _)| *n)
                .collect();
            format!(
                "--chat-template {spec:?} is neither a built-in template ({}) nor a readable file",
                names.join(", ")
            )
        })?,
    };
    ChatTemplate::new(source.as_str(), "", "")
        .with_context(|| format!("--chat-template {spec:?} is not a valid Jinja template"))?;
    Ok(source)
}

pub fn resolve_model(spec: &str) -> Result<PathBuf> {
    let store = Store::from_env()?;
    let mut progress = TerminalProgress::stderr();
    let resolved = store.resolve_with(spec, &mut |ev| progress.handle(ev));
    progress.finish();
    Ok(resolved?.path)
}

/// The model a command talks to, its tokenizer and chat template.
pub(crate) struct Backend {
    engine: Engine,
    tokenizer: std::sync::Arc<Tokenizer>,
    template: Option<ChatTemplate>,
}

/// Where the sequence runs: a one-slot batch in this process, or rank 0 of a sharded
/// instance (whose workers are shut down and reaped at the end).
enum Engine {
    Local(Box<Batch>),
    Sharded(Box<crate::cmd_shard::Session>),
}

impl Backend {
    fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    fn template(&self) -> Option<&ChatTemplate> {
        self.template.as_ref()
    }

    fn generate(
        &mut self,
        req: &GenerateRequest,
        on_token: &mut dyn FnMut(u32) -> bool,
    ) -> Result<GenerationStats> {
        let engine: &mut dyn Sequences = match &mut self.engine {
            Engine::Local(b) => &mut **b,
            Engine::Sharded(s) => &mut s.engine,
        };
        let tok = &self.tokenizer;
        Ok(strata_engine::generate(
            engine,
            &|t| tok.is_eog(t),
            req,
            on_token,
        )?)
    }

    /// Ends the run: shuts sharded ranks down, or (after `err`) reaps them and says how they
    /// ended.
    fn finish(self, err: Option<anyhow::Error>) -> Result<()> {
        match (self.engine, err) {
            (Engine::Local(_), None) => Ok(()),
            (Engine::Local(_), Some(e)) => Err(e),
            (Engine::Sharded(s), None) => s.close(),
            (Engine::Sharded(s), Some(e)) => Err(s.fail(e)),
        }
    }
}

/// Generates from `prompt` tokens, streaming text to stdout (`printed` says whether any was).
fn stream(
    g: &mut Backend,
    prompt: Vec<u32>,
    opts: &ModelOpts,
    printed: &mut bool,
) -> Result<(String, GenerationStats)> {
    let req = GenerateRequest {
        prompt,
        max_tokens: opts.max_tokens,
        sampling: opts.sampling()?,
        ignore_eos: opts.ignore_eos,
        speculation: opts.speculate.speculation(),
    };
    let mut ids = Vec::new();
    let mut out = std::io::stdout().lock();
    let mut text = String::new();
    let mut io_err = None;
    let stats = {
        let tok = std::sync::Arc::clone(&g.tokenizer);
        let mut dec = tok.stream_decoder(false);
        let stats = g.generate(&req, &mut |id| {
            ids.push(id);
            if let Some(piece) = dec.push(id) {
                text.push_str(&piece);
                *printed = true;
                if let Err(e) = out.write_all(piece.as_bytes()).and_then(|()| out.flush()) {
                    io_err = Some(e);
                    return false;
                }
            }
            true
        })?;
        if let Some(rest) = dec.finish() {
            text.push_str(&rest);
            out.write_all(rest.as_bytes())?;
        }
        stats
    };
    if let Some(e) = io_err {
        return Err(e).context("writing to stdout");
    }
    Ok((text, stats))
}

pub(crate) fn run(args: RunArgs) -> Result<()> {
    args.opts.check()?;
    let prompt = args.prompt_text()?;
    let mut g = args.opts.load_backend()?;
    let result = run_on(&mut g, &args, &prompt);
    g.finish(result.err())
}

fn run_on(g: &mut Backend, args: &RunArgs, prompt_text: &str) -> Result<()> {
    let prompt = if args.raw {
        g.tokenizer().encode_prompt(prompt_text, false)?
    } else {
        let Some(tpl) = g.template() else {
            bail!("the model has no chat template; use --raw to send the prompt as is");
        };
        let mut msgs = Vec::new();
        if let Some(s) = &args.opts.system {
            msgs.push(ChatMessage::new("system", s.clone()));
        }
        msgs.push(ChatMessage::new("user", prompt_text.to_string()));
        let text = tpl.render(&msgs, true)?;
        g.tokenizer().encode_prompt(&text, true)?
    };
    let mut printed = false;
    let stats = match stream(g, prompt, &args.opts, &mut printed) {
        Ok((_, stats)) => stats,
        Err(e) if printed => {
            // Whatever was streamed is not a complete answer: end the line and say so.
            println!();
            return Err(e.context("generation failed; the output above is incomplete"));
        }
        Err(e) => return Err(e.context("generation failed")),
    };
    println!();
    if args.stats_json {
        let mut v = serde_json::to_value(&stats)?;
        if let Some(obj) = v.as_object_mut() {
            obj.insert(
                "peak_rss_mb".into(),
                serde_json::to_value(crate::cmd_shard::peak_rss_mb(None))?,
            );
        }
        if let (Engine::Sharded(s), Some(obj)) = (&g.engine, v.as_object_mut()) {
            let mut rss = vec![crate::cmd_shard::peak_rss_mb(None)];
            rss.extend(s.workers.peak_rss_mb());
            obj.insert("rank_peak_rss_mb".into(), serde_json::to_value(rss)?);
            let plan = s.engine.rank().plan();
            obj.insert("ranks".into(), plan.world().into());
            obj.insert("strategy".into(), serde_json::to_value(plan.strategy)?);
            obj.insert(
                "transport".into(),
                s.engine.rank().comm().transport().into(),
            );
            obj.insert("comm".into(), serde_json::to_value(s.engine.last_comm())?);
        }
        eprintln!("{}", serde_json::to_string(&v)?);
    }
    Ok(())
}

pub(crate) fn chat(args: ChatArgs) -> Result<()> {
    args.opts.check()?;
    let mut g = args.opts.load_backend()?;
    let result = chat_on(&mut g, &args);
    g.finish(result.err())
}

fn chat_on(g: &mut Backend, args: &ChatArgs) -> Result<()> {
    if g.template().is_none() {
        bail!("the model has no chat template, so it cannot chat; try `strata run --raw`");
    }
    let mut msgs = Vec::new();
    if let Some(s) = &args.opts.system {
        msgs.push(ChatMessage::new("system", s.clone()));
    }
    eprintln!(
        "strata chat: type a message and press Enter; /reset clears the history, /exit or Ctrl-D quits."
    );
    let stdin = std::io::stdin();
    let mut line = String::new();
    loop {
        eprint!("> ");
        line.clear();
        if stdin.lock().read_line(&mut line)? == 0 {
            eprintln!();
            return Ok(());
        }
        let input = line.trim();
        match input {
            "" => continue,
            "/exit" | "/quit" => return Ok(()),
            "/reset" => {
                msgs.retain(|m: &ChatMessage| m.role == "system");
                continue;
            }
            _ => {}
        }
        msgs.push(ChatMessage::new("user", input.to_string()));
        let text = g
            .template()
            .map(|t| t.render(&msgs, true))
            .transpose()?
            .unwrap_or_default();
        let prompt = g.tokenizer().encode_prompt(&text, true)?;
        match stream(g, prompt, &args.opts, &mut false) {
            Ok((reply, _)) => {
                println!();
                msgs.push(ChatMessage::new("assistant", reply));
            }
            Err(e) => {
                // Drop the turn that failed (e.g. the conversation outgrew the context).
                msgs.pop();
                eprintln!("error: {e:#}");
            }
        }
    }
}
