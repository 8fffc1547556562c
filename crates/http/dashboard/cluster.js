// The cluster view: nodes and links as a live graph, a card per node, the instances and a feed
// of events. A node that leaves stays on the page in red (with its instances shown re-placing)
// until it comes back.

import { h, s, put, table, bytes, seconds, bandwidth, ago, clock } from "./dom.js";

/** Nodes seen since the page opened: id -> { profile, goneAt }. */
const known = new Map();
let root;

export function mount(el) {
  root = el;
  put(el,
    h("div", { class: "cluster-top" },
      h("div", { class: "panel graph-panel" },
        h("h2", {}, "Topology"),
        h("div", { id: "graph", class: "graph" })),
      h("div", { class: "panel events-panel" },
        h("h2", {}, "Events"),
        h("ol", { id: "events", class: "events" }))),
    h("h2", {}, "Nodes"),
    h("div", { id: "nodes", class: "cards" }),
    h("h2", {}, "Instances"),
    h("div", { id: "cluster-instances" }));
}

/** Member id -> display name (the node's --name), for every node ever seen. */
export function names(status) {
  const m = new Map();
  for (const [id, k] of known) m.set(id, k.profile.name);
  for (const mem of status?.members || []) if (mem.state) m.set(mem.id, mem.state.profile.name);
  return m;
}

/** What a node hosts, by member id. */
function hostedBy(status) {
  const m = new Map();
  for (const mem of status?.members || []) m.set(mem.id, mem.state?.extra?.hosted || []);
  return m;
}

/**
 * An instance's state as the cluster shows it: { word, cls, detail, arrival } with word one of
 * ready, loading, copying, downloading, re-placing, waiting, failed.
 */
export function instanceState(spec, status) {
  const alive = new Set((status?.members || []).map((m) => m.id));
  const p = spec.placement;
  if (!p) return { word: "waiting", cls: "warn", detail: spec.problem || "not placed" };
  if (p.nodes.some((n) => !alive.has(n))) {
    return { word: "re-placing", cls: "warn", detail: "a node it ran on has left" };
  }
  const hosted = hostedBy(status);
  const ranks = p.nodes.map((n) =>
    (hosted.get(n) || []).find((x) => x.instance === spec.id && x.epoch === spec.epoch));
  const failed = ranks.find((r) => r && r.status.startsWith("failed"));
  if (failed) return { word: "failed", cls: "bad", detail: failed.status.replace(/^failed: /, "") };
  if (ranks.every((r) => r && r.status === "ready")) return { word: "ready", cls: "ok", detail: "" };
  const moving = ranks.find((r) => r && r.arrival);
  if (moving) {
    const a = moving.arrival;
    const word = a.step.startsWith("copying") ? "copying" : a.step.startsWith("download") ? "downloading" : "loading";
    return { word, cls: "warn", detail: a.step, arrival: a };
  }
  if (spec.epoch > 1) return { word: "re-placing", cls: "warn", detail: `placed again (epoch ${spec.epoch}), loading` };
  return { word: "loading", cls: "warn", detail: "ranks starting" };
}

function track(status) {
  const now = Date.now();
  const present = new Set();
  for (const m of status.members) {
    if (!m.state) continue;
    present.add(m.id);
    known.set(m.id, { profile: m.state.profile, goneAt: null });
  }
  for (const [id, k] of known) {
    if (!present.has(id) && !k.goneAt) k.goneAt = now;
    if (k.goneAt && now - k.goneAt > 10 * 60 * 1000) known.delete(id);
  }
}

// The data-plane transport a link's probe took ("tcp" or "shm"), from whichever end reported
// it; undefined when it was measured over the control plane.
function linkVia(status, a, b) {
  for (const m of status.members || []) {
    if (m.id !== a && m.id !== b) continue;
    const l = (m.state?.links || []).find((x) => (x.peer === a || x.peer === b) && x.via);
    if (l) return l.via;
  }
  return undefined;
}

function graph(status, nameOf, width) {
  const nodes = [...known.entries()].sort((a, b) => a[1].profile.name.localeCompare(b[1].profile.name));
  // Drawn at the panel's own width, so names stay legible on a phone.
  const W = Math.max(300, Math.min(900, width || 640)), H = nodes.length > 2 ? 300 : 200, R = 34;
  const cx = W / 2, cy = H / 2, rad = nodes.length <= 1 ? 0 : Math.min(W, H) / 2 - R - 24;
  const at = new Map();
  nodes.forEach(([id], i) => {
    const a = nodes.length === 2 ? Math.PI * i : (2 * Math.PI * i) / nodes.length - Math.PI / 2;
    const spread = nodes.length === 2 ? Math.min(W * 0.3, 220) / Math.max(1, rad) : 1;
    at.set(id, [cx + rad * Math.cos(a) * spread, cy + rad * Math.sin(a)]);
  });
  const svg = s("svg", { viewBox: `0 0 ${W} ${H}`, role: "img", "aria-label": "cluster topology" });
  for (const l of status.topology?.links || []) {
    const a = at.get(l.a), b = at.get(l.b);
    if (!a || !b) continue;
    const [mx, my] = [(a[0] + b[0]) / 2, (a[1] + b[1]) / 2];
    const via = linkVia(status, l.a, l.b);
    svg.append(
      s("line", { x1: a[0], y1: a[1], x2: b[0], y2: b[1], class: "edge" }),
      s("text", { x: mx, y: my - 8, class: "link-label", "text-anchor": "middle", dataset: { a: nameOf.get(l.a), b: nameOf.get(l.b) } },
        seconds(l.latency)),
      s("text", { x: mx, y: my + 12, class: "link-sub", "text-anchor": "middle" },
        bandwidth(l.bandwidth) + (via ? ` over ${via}` : "")));
  }
  for (const [id, k] of nodes) {
    const [x, y] = at.get(id);
    const m = status.members.find((mm) => mm.id === id);
    const cls = ["node", k.goneAt ? "gone" : m?.state?.draining ? "draining" : "up", id === status.leader && !k.goneAt ? "leader" : ""];
    svg.append(s("g", { class: cls, dataset: { node: k.profile.name } },
      s("circle", { cx: x, cy: y, r: R }),
      s("text", { x, y: y + 4, "text-anchor": "middle", class: "node-name" }, k.profile.name),
      s("text", { x, y: y + R + 16, "text-anchor": "middle", class: "node-sub" },
        k.goneAt ? "gone" : id === status.leader ? "leader" : bytes(k.profile.memory_total))));
  }
  return svg;
}

function nodeCard(id, k, status) {
  const m = status.members.find((mm) => mm.id === id);
  const p = k.profile;
  const used = p.memory_total - p.memory_available;
  const limit = p.memory_limit;
  const state = k.goneAt ? "gone" : m?.state?.draining ? "draining" : "up";
  const busy = m?.state?.extra?.cpu_busy;
  const hosted = m?.state?.extra?.hosted || [];
  const bar = h("div", { class: "bar" }, h("span"));
  bar.firstChild.style.width = `${Math.min(100, (100 * used) / Math.max(1, p.memory_total)).toFixed(1)}%`;
  return h("article", { class: ["card", "node-card", state], dataset: { node: p.name } },
    h("header", {},
      h("span", { class: ["dot", state === "up" ? "ok" : state === "gone" ? "bad" : "warn"] }),
      h("strong", {}, p.name),
      id === status.leader && !k.goneAt ? h("span", { class: "badge" }, "leader") : null,
      id === status.me ? h("span", { class: "badge subtle" }, "this node") : null,
      h("span", { class: ["state", state] }, state === "gone" ? `left ${ago(k.goneAt)}` : state)),
    h("dl", {},
      h("dt", {}, "memory"), h("dd", {}, `${bytes(used)} used of ${bytes(p.memory_total)}`, bar,
        limit ? h("small", {}, `limit ${bytes(limit)}, ${bytes(p.memory_available)} offered`) : h("small", {}, `${bytes(p.memory_available)} offered to models`)),
      h("dt", {}, "cores"), h("dd", {}, `${p.cores} (${p.backend})`),
      h("dt", {}, "memory bandwidth"), h("dd", {}, `${(p.mem_bandwidth / 1e9).toFixed(1)} GB/s`),
      h("dt", {}, "compute"), h("dd", {}, `${p.matmul_gflops.toFixed(0)} GFLOP/s`),
      busy !== undefined && busy !== null ? [h("dt", {}, "CPU busy"), h("dd", {}, `${(busy * 100).toFixed(0)} %`)] : null,
      h("dt", {}, "address"), h("dd", {}, p.api_addr),
      h("dt", {}, "ranks"), h("dd", {}, hosted.length ? hosted.map((x) => `${x.instance} rank ${x.rank}: ${x.status}`).join("; ") : "none")));
}

/** The instances table (shared with the models view, which adds actions). */
export function instancesTable(status, actions) {
  const nameOf = names(status);
  const list = status?.instances || [];
  if (!list.length) return h("p", { class: "muted" }, "No instance is loaded.");
  return table("instances", ["instance", "model", "strategy", "nodes (share)", "predicted", "state", ""], list.map((spec) => {
    const st = instanceState(spec, status);
    const p = spec.placement;
    let progress = null;
    if (st.arrival && st.arrival.total) {
      progress = h("progress", { max: st.arrival.total, value: st.arrival.done });
    }
    return {
      attrs: { dataset: { instance: spec.id, state: st.word, epoch: spec.epoch } },
      cells: [
        spec.id,
        spec.request.model,
        p ? p.strategy : "-",
        p ? p.nodes.map((n, i) => `${nameOf.get(n) || n} ${(100 * p.weights[i]).toFixed(0)} %`).join(", ") : "-",
        p ? `${p.predicted_decode_tok_s.toFixed(0)} tok/s` : "-",
        [h("span", { class: ["state", st.cls], title: st.detail }, st.word),
          st.detail ? h("small", {}, st.detail) : spec.epoch > 1 ? h("small", {}, `placed ${spec.epoch - 1} time(s) again after losing a node`) : null, progress],
        actions ? actions(spec) : null,
      ],
    };
  }));
}

export function update(ctx) {
  if (!root) return;
  if (ctx.single) {
    put(root, h("div", { class: "panel" },
      h("h2", {}, "A single server"),
      h("p", {}, "This is ", h("code", {}, "strata serve"), ": one process serving ", ctx.models.join(", ") || "a model",
        ". Start ", h("code", {}, "strata node"), " on each machine to see a cluster here.")));
    return;
  }
  const status = ctx.status;
  if (!status) return;
  track(status);
  const nameOf = names(status);
  const box = root.querySelector("#graph");
  put(box, graph(status, nameOf, box.clientWidth));
  const ids = [...known.keys()].sort((a, b) => known.get(a).profile.name.localeCompare(known.get(b).profile.name));
  put(root.querySelector("#nodes"), ids.map((id) => nodeCard(id, known.get(id), status)));
  put(root.querySelector("#cluster-instances"), instancesTable(status));
  const named = (text) => text.replace(/\b[0-9a-f]{16}\b/g, (id) => nameOf.get(id) || id);
  const events = [...(status.events || [])].sort((a, b) => b.at_ms - a.at_ms).slice(0, 50);
  put(root.querySelector("#events"), events.map((e) =>
    h("li", { class: /left|lost|gone|refus/.test(e.what) ? "bad" : /too slow/.test(e.what) ? "warn" : "" },
      h("time", {}, clock(e.at_ms)), " ", named(e.what))));
}
