// The dashboard's shell: views by URL fragment, the key prompt, and one poll of the cluster's
// state that every view reads.

import * as api from "./api.js";
import { put } from "./dom.js";
import * as cluster from "./cluster.js";
import * as models from "./models.js";
import * as chat from "./chat.js";
import * as metrics from "./metrics.js";

const views = { cluster, models, chat, metrics };

/** What every view reads: the last cluster status, the key's role, and whether this is a node. */
export const ctx = {
  status: null,       // /v1/cluster/status, or null on a single `strata serve`
  single: false,      // true when this server is `strata serve` (no cluster routes)
  whoami: { keys: false, admin: true },
  models: [],         // ids /v1/models lists
  error: "",
  refresh: () => poll(),
};

function current() {
  const v = location.hash.replace("#", "");
  return views[v] ? v : "cluster";
}

function show() {
  const name = current();
  for (const el of document.querySelectorAll(".view")) el.hidden = el.dataset.view !== name;
  for (const a of document.querySelectorAll("#nav a")) {
    a.classList.toggle("active", a.dataset.view === name);
    if (a.dataset.view === name) a.setAttribute("aria-current", "page");
    else a.removeAttribute("aria-current");
  }
  views[name].update(ctx);
}

/** Whether an instance answers inference here: always on `strata serve`; on a node, once some
 * instance's rank 0 is ready. */
export function serving() {
  if (ctx.single) return true;
  return (ctx.status?.members || []).some((m) =>
    (m.state?.extra?.hosted || []).some((x) => x.rank === 0 && x.status === "ready"));
}
ctx.serving = serving;

let polling = false;
async function poll() {
  if (polling) return;
  polling = true;
  try {
    if (!ctx.single) {
      try {
        ctx.status = await api.call("/v1/cluster/status");
        ctx.error = "";
      } catch (e) {
        if (e.status === 404) { ctx.single = true; ctx.status = null; }
        else throw e;
      }
    }
    // A node answers /v1/models only once an instance serves (503 before): ask only then.
    if (serving()) {
      try {
        const m = await api.call("/v1/models");
        ctx.models = (m.data || []).map((d) => d.id);
      } catch { ctx.models = []; }
    } else ctx.models = [];
    document.getElementById("conn").className = "dot ok";
  } catch (e) {
    ctx.error = e.message;
    document.getElementById("conn").className = "dot bad";
  } finally {
    polling = false;
  }
  for (const [name, v] of Object.entries(views)) if (name === current() || v.always) v.update(ctx);
}

async function who() {
  // `strata serve` answers /health with JSON naming its model; a node with a plain "ok".
  try {
    const health = await api.call("/health");
    ctx.single = typeof health === "object" && health !== null && "model" in health;
  } catch { /* a failed engine answers 503: still a single server */ ctx.single = true; }
  if (ctx.single) {
    ctx.whoami = { keys: !!api.key(), admin: false, name: null };
  } else {
    try { ctx.whoami = await api.call("/v1/cluster/whoami"); }
    catch (e) { if (e.status === 404) ctx.single = true; }
  }
  const w = ctx.whoami;
  put(document.getElementById("whoami"),
    ctx.single ? "strata serve" : w.keys ? `${w.name || "key"} (${w.admin ? "admin" : "client"})` : "no keys");
}

function askKey(message) {
  const d = document.getElementById("key-dialog");
  put(document.getElementById("key-error"), message || "");
  // Several refused calls arrive together: the first opens the prompt, the rest must not
  // clear what the user is typing.
  if (d.open) return;
  document.getElementById("key-input").value = api.key();
  d.showModal();
}

function start() {
  for (const [name, v] of Object.entries(views)) v.mount(document.getElementById(`view-${name}`), ctx);
  document.getElementById("key-button").addEventListener("click", () => askKey(""));
  document.getElementById("key-form").addEventListener("submit", async (ev) => {
    ev.preventDefault();
    api.setKey(document.getElementById("key-input").value.trim());
    document.getElementById("key-dialog").close();
    await who();
    await poll();
  });
  document.getElementById("key-forget").addEventListener("click", () => {
    api.setKey("");
    document.getElementById("key-input").value = "";
  });
  api.onAuthNeeded(() => askKey(api.key() ? "That key was refused." : ""));
  window.addEventListener("hashchange", show);
  show();
  who().then(poll);
  setInterval(poll, 500);
}

start();
