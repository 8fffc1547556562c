//! The load a run puts on an instance: streaming clients through the OpenAI API, and the
//! requests that load and find the model.

use super::*;

pub(super) fn strategy_choice(s: &str, nodes: usize) -> Result<StrategyChoice> {
    Ok(match s {
        "tensor" => StrategyChoice::Tensor,
        "pipeline" => StrategyChoice::Pipeline,
        "expert" => StrategyChoice::Expert,
        "hybrid" => StrategyChoice::Hybrid {
            tp: (nodes / 2).max(1),
        },
        other => bail!("unknown strategy {other:?} (tensor, pipeline, expert, hybrid)"),
    })
}

/// One streamed request: tokens, time to the first token and the arrival of every chunk.
pub(super) struct Stream {
    pub(super) prompt_tokens: usize,
    pub(super) tokens: usize,
    pub(super) ttft: f64,
    pub(super) arrivals: Vec<f64>,
}

/// Streams one chat completion and times its chunks.
pub(super) fn stream_one(
    url: &str,
    model: &str,
    prompt: &str,
    max_tokens: usize,
    temp: f32,
    seed: u64,
) -> Result<Stream> {
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(1800)))
        .build()
        .into();
    let body = json!({
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": temp,
        "top_k": 40,
        "seed": seed,
        "stream": true,
        "stream_options": {"include_usage": true},
    });
    let t0 = Instant::now();
    let mut resp = agent
        .post(&format!("{url}/v1/chat/completions"))
        .send_json(&body)
        .with_context(|| format!("reaching {url}"))?;
    if !resp.status().is_success() {
        let status = resp.status();
        let text = resp.body_mut().read_to_string().unwrap_or_default();
        bail!("{url}: {status}: {text}");
    }
    let reader = BufReader::new(resp.body_mut().as_reader());
    let mut arrivals = Vec::new();
    let mut tokens = None;
    let mut prompt_tokens = 0;
    for line in reader.lines() {
        let line = line.context("reading the stream")?;
        let Some(data) = line.strip_prefix("data: ") else {
            continue;
        };
        if data == "[DONE]" {
            break;
        }
        let v: serde_json::Value = serde_json::from_str(data).context("a stream chunk")?;
        if let Some(e) = v.get("error") {
            bail!("the stream failed: {e}");
        }
        if let Some(n) = v["usage"]["completion_tokens"].as_u64() {
            tokens = Some(n as usize);
            prompt_tokens = v["usage"]["prompt_tokens"].as_u64().unwrap_or(0) as usize;
        }
        let content = v["choices"].as_array().is_some_and(|c| {
            c.iter().any(|c| {
                c["delta"]["content"]
                    .as_str()
                    .is_some_and(|s| !s.is_empty())
            })
        });
        if content {
            arrivals.push(t0.elapsed().as_secs_f64());
        }
    }
    let end = t0.elapsed().as_secs_f64();
    Ok(Stream {
        prompt_tokens,
        tokens: tokens.context("the stream carried no usage")?,
        ttft: arrivals.first().copied().unwrap_or(end),
        arrivals,
    })
}

pub(super) const TOPICS: [&str; 4] = [
    "Write a long story about a lighthouse keeper.",
    "Explain how a steam engine works, step by step.",
    "Describe a journey across the mountains in winter.",
    "Write a detailed recipe for bread, with every step.",
];

/// `clients` concurrent clients, each making `rounds` requests in a row. Every prompt starts
/// with its own tag, so no request's prompt is served from another's prefix cache.
pub(super) fn level(
    url: &str,
    model: &str,
    a: &ClusterArgs,
    clients: usize,
    tag: &str,
    pids: &[u32],
) -> Result<Level> {
    let (nodes_cpu0, clients_cpu0) = (cpu_of(pids), own_cpu());
    let t0 = Instant::now();
    let results: Vec<Result<Vec<Stream>>> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..clients)
            .map(|c| {
                s.spawn(move || {
                    (0..a.rounds)
                        .map(|r| {
                            let i = c * a.rounds + r;
                            let prompt = format!("[{tag}-{i}] {}", TOPICS[i % TOPICS.len()]);
                            stream_one(url, model, &prompt, a.tokens, a.temperature, i as u64)
                        })
                        .collect()
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| {
                h.join()
                    .unwrap_or_else(|_| Err(anyhow::anyhow!("a client panicked")))
            })
            .collect()
    });
    let wall = t0.elapsed().as_secs_f64();
    let nodes_cores = cpu_of(pids).zip(nodes_cpu0).map(|(b, a)| (b - a) / wall);
    let clients_cores = (own_cpu() - clients_cpu0) / wall;
    let streams: Vec<Stream> = results
        .into_iter()
        .collect::<Result<Vec<_>>>()?
        .into_iter()
        .flatten()
        .collect();
    let tokens: usize = streams.iter().map(|s| s.tokens).sum();
    let per: Vec<f64> = streams
        .iter()
        .filter(|s| s.arrivals.len() > 1)
        .map(|s| {
            let span = s.arrivals[s.arrivals.len() - 1] - s.arrivals[0];
            (s.tokens.saturating_sub(1)) as f64 / span.max(1e-9)
        })
        .collect();
    let mut gaps: Vec<f64> = streams
        .iter()
        .flat_map(|s| s.arrivals.windows(2).map(|w| (w[1] - w[0]) * 1e3))
        .collect();
    gaps.sort_by(f64::total_cmp);
    let ttfts: Vec<f64> = streams.iter().map(|s| s.ttft).collect();
    let steady = steady_rate(&streams, a.rounds);
    Ok(Level {
        clients,
        requests: streams.len(),
        prompt_tokens: streams.iter().map(|s| s.prompt_tokens).sum(),
        tokens,
        aggregate_tok_s: tokens as f64 / wall,
        per_stream_tok_s: if per.is_empty() { 0.0 } else { median(&per) },
        ttft_p50_s: median(&ttfts),
        itl_p50_ms: quantile(&gaps, 0.5),
        itl_p99_ms: quantile(&gaps, 0.99),
        steady_tok_s: steady,
        predicted_steady_tok_s: None,
        predicted_aggregate_tok_s: None,
        predicted_per_stream_tok_s: None,
        vs_one_node: None,
        nodes_cores,
        clients_cores,
    })
}

/// Tokens per second across the streams of the first round while all of them are decoding.
pub(super) fn steady_rate(streams: &[Stream], rounds: usize) -> Option<f64> {
    // Streams are stored client by client, `rounds` each; the first of each started together.
    let first: Vec<&Stream> = streams.iter().step_by(rounds.max(1)).collect();
    let start = first
        .iter()
        .map(|s| s.arrivals.first().copied())
        .try_fold(0.0f64, |m, t| t.map(|t| m.max(t)))?;
    let end = first
        .iter()
        .map(|s| s.arrivals.last().copied())
        .try_fold(f64::INFINITY, |m, t| t.map(|t| m.min(t)))?;
    if end - start < 1e-3 {
        return None;
    }
    let tokens = first
        .iter()
        .map(|s| {
            s.arrivals
                .iter()
                .filter(|&&t| t > start && t <= end)
                .count()
        })
        .sum::<usize>();
    Some(tokens as f64 / (end - start))
}

/// The `q` quantile of sorted values (nearest rank); 0 when empty.
pub(super) fn quantile(sorted: &[f64], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let i = ((sorted.len() as f64 * q).ceil() as usize).clamp(1, sorted.len()) - 1;
    sorted[i]
}

/// Prompt tokens per second of one long prompt (one token generated).
pub(super) fn prefill(url: &str, model: &str, words: usize, tag: &str) -> Result<(usize, f64)> {
    let text: String = (0..words)
        .map(|i| {
            [
                "river", "stone", "lamp", "north", "green", "bridge", "salt", "window",
            ][i % 8]
        })
        .collect::<Vec<_>>()
        .join(" ");
    let prompt = format!("[{tag}] Summarise: {text}");
    let agent: ureq::Agent = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(Duration::from_secs(1800)))
        .build()
        .into();
    let t0 = Instant::now();
    let mut resp = agent
        .post(&format!("{url}/v1/chat/completions"))
        .send_json(json!({
            "model": model,
            "messages": [{"role": "user", "content": prompt}],
            "max_tokens": 1,
            "temperature": 0,
        }))
        .with_context(|| format!("reaching {url}"))?;
    let secs = t0.elapsed().as_secs_f64();
    let status = resp.status();
    let v: serde_json::Value =
        serde_json::from_str(&resp.body_mut().read_to_string()?).context("the prefill answer")?;
    if !status.is_success() {
        bail!("{url}: {status}: {v}");
    }
    let n = v["usage"]["prompt_tokens"]
        .as_u64()
        .context("no prompt_tokens")? as usize;
    Ok((n, n as f64 / secs))
}

/// Loads the model, waits until it serves, and returns its spec.
pub(super) fn load(node: &NodeAddr, req: &LoadRequest) -> Result<InstanceSpec> {
    let spec: InstanceSpec = serde_json::from_value(ask_load(node, req)?)?;
    strata::cmd_cluster::wait_ready(node, &spec.id, Duration::from_secs(900))?;
    Ok(spec)
}

/// The strategy the planner picks by itself (a dry run).
pub(super) fn planner_pick(node: &NodeAddr, req: &LoadRequest) -> Result<StrategyChoice> {
    let dry = LoadRequest {
        strategy: None,
        dry_run: true,
        ..req.clone()
    };
    let v = ask_load(node, &dry)?;
    let p: strata_cluster::Placement = serde_json::from_value(v["placement"].clone())?;
    Ok(p.strategy)
}

pub(super) fn ask_load(node: &NodeAddr, req: &LoadRequest) -> Result<serde_json::Value> {
    let body = serde_json::to_value(req)?;
    let mut last = None;
    // A node that joined a moment ago may not have published everything yet.
    for _ in 0..5 {
        match node.call::<serde_json::Value>("POST", "/v1/cluster/load", Some(&body)) {
            Ok(v) => return Ok(v),
            Err(e) => last = Some(e),
        }
        std::thread::sleep(Duration::from_secs(2));
    }
    Err(last.unwrap_or_else(|| anyhow::anyhow!("load failed")))
}

/// What every load of the run asks for: one slot per client of the largest level.
pub(super) fn load_request(a: &ClusterArgs, model: &str) -> LoadRequest {
    LoadRequest {
        model: model.to_string(),
        strategy: None,
        nodes: None,
        context: Some(a.ctx_size),
        dry_run: false,
        parallel: Some(a.streams.iter().copied().max().unwrap_or(1)),
        cache_mem: None,
    }
}

pub(super) fn models(url: &str) -> Result<Vec<String>> {
    let v: serde_json::Value = NodeAddr::at(url).call("GET", "/v1/models", None)?;
    Ok(v["data"]
        .as_array()
        .map(|d| {
            d.iter()
                .filter_map(|m| m["id"].as_str().map(str::to_string))
                .collect()
        })
        .unwrap_or_default())
}

/// The id the loaded instance answers to.
pub(super) fn served_model(url: &str) -> Result<String> {
    models(url)?
        .into_iter()
        .next()
        .context("the node serves no model after loading")
}
