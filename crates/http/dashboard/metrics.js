// The metrics view: live tokens per second, queue depth and active sequences from the served
// instance's /metrics (Prometheus text), and each node's load from the cluster status.

import * as api from "./api.js";
import { h, s, put, table } from "./dom.js";

const KEEP = 120;               // samples kept (one a second: two minutes)
const history = [];             // { t, gen, prompt, queue, active, ttftSum, ttftCount }
let root, timer = null, error = "";

/** name -> value for unlabelled samples, and name{labels} -> value for the rest. */
export function parse(text) {
  const out = new Map();
  for (const line of text.split("\n")) {
    if (!line || line.startsWith("#")) continue;
    const m = line.match(/^([a-zA-Z_:][\w:]*)(\{[^}]*\})?\s+(\S+)/);
    if (m) out.set(m[1] + (m[2] || ""), Number(m[3]));
  }
  return out;
}

let ctxRef = null;

async function sample() {
  if (ctxRef && !ctxRef.serving()) {
    error = "No instance is serving yet: load a model.";
    return;
  }
  try {
    const m = parse(await api.call("/metrics"));
    history.push({
      t: performance.now() / 1000,
      gen: m.get("strata_completion_tokens_total") ?? 0,
      prompt: m.get("strata_prompt_tokens_total") ?? 0,
      queue: m.get("strata_queue_depth") ?? 0,
      active: m.get("strata_active_sequences") ?? 0,
      ttftSum: m.get("strata_time_to_first_token_seconds_sum") ?? 0,
      ttftCount: m.get("strata_time_to_first_token_seconds_count") ?? 0,
      cached: m.get("strata_cached_prompt_tokens_total") ?? 0,
    });
    while (history.length > KEEP) history.shift();
    error = "";
  } catch (e) {
    error = e.status === 503 ? "No instance is serving yet: load a model." : e.message;
  }
}

function rates(key) {
  const out = [];
  for (let i = 1; i < history.length; i++) {
    const dt = history[i].t - history[i - 1].t;
    out.push(dt > 0 ? Math.max(0, history[i][key] - history[i - 1][key]) / dt : 0);
  }
  return out;
}

function spark(values, label, unit) {
  const W = 320, H = 70;
  const peak = values.length ? Math.max(...values) : 0;
  const max = Math.max(1, peak);
  // The chart spans at least 30 s, growing to the whole history kept.
  const span = Math.max(30, values.length) - 1;
  const pts = values.map((v, i) => `${(W * i) / span},${H - (H - 6) * (v / max) - 3}`).join(" ");
  const last = values.length ? values[values.length - 1] : 0;
  return h("div", { class: "panel metric", dataset: { metric: label } },
    h("div", { class: "metric-head" }, h("span", {}, label), h("strong", { class: "metric-value" }, `${last.toFixed(last < 10 ? 1 : 0)} ${unit}`)),
    s("svg", { viewBox: `0 0 ${W} ${H}`, class: "spark", role: "img", "aria-label": `${label} over the last two minutes` },
      s("polyline", { points: pts, class: "line" })),
    h("small", { class: "muted" }, `peak ${peak.toFixed(1)} ${unit} in the last ${values.length} s`));
}

export function mount(el, ctx) {
  root = el;
  ctxRef = ctx;
  put(el, h("p", { id: "metrics-error", class: "error" }), h("div", { id: "metric-cards", class: "metrics" }), h("h2", {}, "Nodes"), h("div", { id: "node-load" }));
  // Metrics are sampled whether or not the view is shown, so the charts have a history.
  if (!timer) timer = setInterval(sample, 1000);
  sample();
}

export const always = false;

export function update(ctx) {
  if (!root) return;
  put(root.querySelector("#metrics-error"), error);
  const gen = rates("gen"), prompt = rates("prompt");
  const gauge = (k) => history.map((x) => x[k]);
  const last = history[history.length - 1];
  const first = history[0];
  const ttft = last && first && last.ttftCount > first.ttftCount
    ? (1000 * (last.ttftSum - first.ttftSum)) / (last.ttftCount - first.ttftCount) : null;
  put(root.querySelector("#metric-cards"),
    spark(gen, "generated tokens/s", "tok/s"),
    spark(prompt, "prompt tokens/s", "tok/s"),
    spark(gauge("active"), "active sequences", ""),
    spark(gauge("queue"), "queue depth", ""),
    h("div", { class: "panel metric" },
      h("div", { class: "metric-head" }, h("span", {}, "mean time to first token"), h("strong", {}, ttft === null ? "–" : `${ttft.toFixed(0)} ms`)),
      h("small", { class: "muted" }, `requests answered in the last ${history.length} s: ${last && first ? last.ttftCount - first.ttftCount : 0}; prompt tokens from the prefix cache in all: ${last ? last.cached : 0}`)));
  const members = ctx.status?.members || [];
  put(root.querySelector("#node-load"), ctx.single ? h("p", { class: "muted" }, "A single ", h("code", {}, "strata serve"), " process.") :
    table("load", ["node", "CPU busy", "memory offered", "ranks"], members.filter((m) => m.state).map((m) => {
      const busy = m.state.extra?.cpu_busy;
      const bar = h("div", { class: "bar" }, h("span"));
      bar.firstChild.style.width = `${((busy || 0) * 100).toFixed(0)}%`;
      return {
        attrs: { dataset: { node: m.state.profile.name } },
        cells: [
          m.state.profile.name,
          [busy === null || busy === undefined ? "–" : `${(busy * 100).toFixed(0)} %`, bar],
          h("td", { class: "num" }, `${(m.state.profile.memory_available / 1e9).toFixed(1)} GB`),
          (m.state.extra?.hosted || []).map((x) => `${x.instance}#${x.rank} ${x.status}`).join(", ") || "none",
        ],
      };
    })));
}
