// The models view: what this node's store knows, whether each fits the cluster, the planner's
// preview for each strategy, load and unload, and the instances' state as it changes.

import * as api from "./api.js";
import { h, put, redraw, table, bytes } from "./dom.js";
import { instancesTable, names } from "./cluster.js";

const STRATEGIES = ["auto", "single", "tensor", "pipeline", "expert"];
let root, catalog = [], catalogError = "", loadedAt = 0;
let selected = null;          // model id whose preview is open
let previews = {};            // strategy -> { placement, model } | { error }
let message = { text: "", cls: "" };
let previewDirty = false;
let shown = ["auto"];          // strategies the preview lists     // the preview is redrawn only when it changes (it holds a form)
let previewFor = "";           // the cluster the open preview was planned for (see `planned`)
let planning = false;          // a preview's plans are in flight

export function mount(el) {
  root = el;
  put(el,
    h("div", { id: "models-message", class: "message", role: "status" }),
    h("h2", {}, "Instances"),
    h("div", { id: "models-instances" }),
    h("h2", {}, "Models"),
    h("div", { id: "get-model" }),
    h("div", { id: "catalog" }),
    h("div", { id: "preview" }));
}

function say(text, cls = "") {
  message = { text, cls };
  if (root) {
    const el = root.querySelector("#models-message");
    put(el, text);
    el.className = `message ${cls}`;
  }
}

async function refreshCatalog(ctx) {
  loadedAt = Date.now();
  try {
    catalog = (await api.call("/v1/cluster/models")).models || [];
    catalogError = "";
  } catch (e) {
    catalogError = e.message;
  }
  update(ctx);
}

/** Fetches `ref` (a catalog id or `hf:OWNER/REPO[:QUANT]`) into this node's store through
 * Ollama's pull, saying each file's progress, then lists it. */
async function pull(ctx, ref) {
  say(`Pulling ${ref}…`);
  let failed = null;
  try {
    await api.lines("/api/pull", { model: ref }, (l) => {
      if (l.error) failed = l.error;
      else if (l.total) say(`Pulling ${ref}: ${l.digest} ${Math.floor((100 * l.completed) / l.total)} % of ${bytes(l.total)}`);
      else if (l.status && l.status !== "success") say(`Pulling ${ref}: ${l.status}`);
    });
  } catch (e) {
    failed = e.message;
  }
  if (failed) say(`Pulling ${ref} failed: ${failed}`, "bad");
  else say(`${ref} is on this node.`, "ok");
  await refreshCatalog(ctx);
}

/** The form that fetches a model by reference, or previews its placement directly (a node
 * that places a hub model fetches only its shard). Admins only: it changes the nodes' disks. */
function getModelForm(ctx) {
  if (!ctx.whoami.admin) return null;
  const ref = h("input", { id: "model-ref", type: "text", placeholder: "hf:owner/repo:Q4_K_M or a catalog id", "aria-label": "model reference", size: 36 });
  const value = () => ref.value.trim();
  return h("form", { class: "row get-model", onsubmit: (ev) => { ev.preventDefault(); if (value()) pull(ctx, value()); } },
    ref,
    h("button", { type: "submit", id: "pull-button" }, "Pull"),
    h("button", { type: "button", class: "secondary", id: "place-ref-button", onclick: () => { if (value()) preview(ctx, value()); } }, "Place…"));
}

function offered(status) {
  return (status?.members || []).reduce((n, m) => n + (m.state && !m.state.draining ? m.state.profile.memory_available : 0), 0);
}

function fit(model, status) {
  const room = offered(status);
  if (model.size <= room) return h("span", { class: "state ok", title: "weights against the memory the nodes offer; the preview adds the KV cache" }, `fits (${bytes(model.size)} of ${bytes(room)})`);
  return h("span", { class: "state bad" }, `does not fit this cluster (missing ${bytes(model.size - room)})`);
}

async function plan(id, strategy) {
  const body = { model: id, dry_run: true };
  if (strategy !== "auto") body.strategy = strategy;
  try { previews[strategy] = await api.call("/v1/cluster/load", { method: "POST", body }); }
  catch (e) { previews[strategy] = { error: e.message }; }
}

/** What a preview depends on: the nodes that can take a share (their state known, not
 * draining) and the links measured between them. A node that has just joined publishes its
 * state, and its links are probed, a moment after it shows up. */
function planned(ctx) {
  const nodes = eligible(ctx).map((m) => m.id).sort();
  return `${nodes.join(",")}/${(ctx.status?.topology?.links || []).length}`;
}

/** Members that can take a share: their state known, not draining. */
function eligible(ctx) {
  return (ctx.status?.members || []).filter((m) => m.state && !m.state.draining);
}

/** The planner's answer for each strategy that can apply (the automatic choice first: it says
 * whether the model is a mixture, which is what `expert` needs); planned again by `update`
 * when the cluster it was planned for changes. */
async function preview(ctx, id) {
  selected = id;
  previews = {};
  previewDirty = true;
  planning = true;
  previewFor = planned(ctx);
  try {
    update(ctx);
    await plans(ctx, id);
  } finally {
    planning = false;
  }
}

async function plans(ctx, id) {
  await plan(id, "auto");
  const nodes = eligible(ctx).length;
  const moe = previews.auto?.model?.moe;
  const rest = ["single"];
  if (nodes > 1) rest.push("tensor", "pipeline");
  if (nodes > 1 && moe) rest.push("expert");
  shown = ["auto", ...rest];
  if (selected === id) { previewDirty = true; update(ctx); }
  await Promise.all(rest.map((s) => plan(id, s)));
  if (selected === id) { previewDirty = true; update(ctx); }
}

async function load(ctx, id, strategy, context, parallel) {
  const body = { model: id };
  if (strategy !== "auto") body.strategy = strategy;
  if (context) body.context = Number(context);
  if (parallel) body.parallel = Number(parallel);
  say(`Loading ${id}…`);
  try {
    const spec = await api.call("/v1/cluster/load", { method: "POST", body });
    say(`${id} placed as ${spec.id} (${spec.placement?.strategy || "not placed"}); its state follows below.`, "ok");
  } catch (e) {
    say(`Loading ${id} failed: ${e.message}`, "bad");
  }
  ctx.refresh();
}

async function unload(ctx, instance) {
  say(`Unloading ${instance}…`);
  try {
    await api.call("/v1/cluster/unload", { method: "POST", body: { instance } });
    say(`${instance} unloaded.`, "ok");
  } catch (e) {
    say(`Unloading ${instance} failed: ${e.message}`, "bad");
  }
  ctx.refresh();
}

function previewPanel(ctx) {
  if (!selected) return null;
  const nameOf = names(ctx.status);
  const model = catalog.find((m) => m.id === selected);
  const strategy = h("select", { id: "load-strategy", "aria-label": "strategy" }, STRATEGIES.map((s) => h("option", { value: s }, s)));
  const context = h("input", { id: "load-context", type: "number", min: 16, placeholder: "context (default)", "aria-label": "context" });
  const parallel = h("input", { id: "load-parallel", type: "number", min: 1, max: 256, placeholder: "parallel (4)", "aria-label": "parallel sequences" });
  const auto = previews.auto?.placement?.strategy;
  return h("div", { class: "panel preview", dataset: { model: selected } },
    h("h2", {}, `Placement preview: ${selected}`),
    model && !model.present ? h("p", { class: "muted" }, "Not on this node yet: loading it fetches it (from a peer that has it, else a download).") : null,
    table("plans", ["strategy", "nodes (share)", "predicted decode", "why"], shown.map((s) => {
      const p = previews[s];
      if (!p) return { attrs: { dataset: { strategy: s } }, cells: [s, h("td", { colspan: 3, class: "muted" }, "planning…")] };
      if (p.error) return { attrs: { dataset: { strategy: s } }, cells: [s, h("td", { colspan: 3, class: "error" }, p.error)] };
      const pl = p.placement;
      return {
        attrs: { dataset: { strategy: s }, class: s !== "auto" && pl.strategy === auto ? "chosen" : "" },
        cells: [
          s === "auto" ? `auto → ${pl.strategy}` : s,
          pl.nodes.map((n, i) => `${nameOf.get(n) || n} ${(100 * pl.weights[i]).toFixed(0)} %`).join(", "),
          h("td", { class: "num" }, `${pl.predicted_decode_tok_s.toFixed(1)} tok/s`),
          h("small", {}, pl.explanation.replace(/\b[0-9a-f]{16}\b/g, (id) => nameOf.get(id) || id)),
        ],
      };
    })),
    ctx.whoami.admin
      ? h("form", { class: "row load-form", onsubmit: (ev) => { ev.preventDefault(); load(ctx, selected, strategy.value, context.value, parallel.value); } },
        strategy, context, parallel, h("button", { type: "submit", id: "load-button" }, `Load ${selected}`))
      : h("p", { class: "muted" }, "Loading needs an admin key."));
}

export function update(ctx) {
  if (!root) return;
  if (ctx.single) {
    put(root, h("div", { class: "panel" }, h("h2", {}, "Served model"),
      h("p", {}, ctx.models.join(", ") || "none"),
      h("p", { class: "muted" }, h("code", {}, "strata serve"), " serves the models it was started with; on a cluster of ", h("code", {}, "strata node"), "s, models are placed, loaded and unloaded here.")));
    return;
  }
  // Every 15 s, or every 2 s while the last try failed (a key just given, a node restarting).
  if (Date.now() - loadedAt > (catalogError ? 2000 : 15000)) refreshCatalog(ctx);
  const el = root.querySelector("#models-message");
  put(el, message.text);
  el.className = `message ${message.cls}`;
  const members = (ctx.status?.members || []).map((m) => [m.id, m.state?.profile?.name, m.state?.extra?.hosted]);
  redraw(root.querySelector("#models-instances"), [ctx.status?.instances, members, ctx.whoami.admin], () => instancesTable(ctx.status, ctx.whoami.admin
    ? (spec) => h("button", { type: "button", class: "small secondary", dataset: { unload: spec.id }, onclick: () => unload(ctx, spec.id) }, "Unload")
    : null));
  redraw(root.querySelector("#get-model"), [ctx.whoami.admin], () => getModelForm(ctx));
  const room = Math.round(offered(ctx.status) / 1e8);
  redraw(root.querySelector("#catalog"), [catalog, catalogError, selected, room, ctx.whoami.admin], () => catalogError ? h("p", { class: "error" }, catalogError) :
    table("catalog", ["model", "family", "quant", "size", "context", "on this node", "fits", ""], catalog.map((m) => ({
      attrs: { dataset: { model: m.id }, class: m.id === selected ? "selected" : "" },
      cells: [
        [h("strong", {}, m.id), m.default ? h("span", { class: "badge subtle" }, "default") : null, m.imported ? h("span", { class: "badge subtle" }, "imported") : null,
          h("small", { class: "muted" }, m.description)],
        `${m.family} ${m.params}`,
        m.quant,
        h("td", { class: "num" }, bytes(m.size)),
        h("td", { class: "num" }, m.context_length),
        m.present ? "yes" : "no",
        fit(m, ctx.status),
        ctx.whoami.admin
          ? h("button", { type: "button", class: "small", dataset: { preview: m.id }, onclick: () => preview(ctx, m.id) }, "Place…")
          : null,
      ],
    }))));
  if (selected && !planning && planned(ctx) !== previewFor) preview(ctx, selected);
  if (previewDirty) {
    previewDirty = false;
    const form = root.querySelector(".load-form");
    const kept = form && [...form.querySelectorAll("select, input")].map((e) => e.value);
    put(root.querySelector("#preview"), previewPanel(ctx));
    const again = root.querySelector(".load-form");
    if (kept && again) [...again.querySelectorAll("select, input")].forEach((e, i) => { e.value = kept[i]; });
  }
}
