// The chat view: streamed answers from /v1/chat/completions with stop, time to first token and
// tokens per second per answer, tool calls and JSON shown as such, and conversations kept in
// this browser (localStorage) across reloads.

import * as api from "./api.js";
import { h, put, redraw } from "./dom.js";
import { render } from "./markdown.js";

const STORE = "strata.chats";
const SETTINGS = "strata.chatSettings";
let root;
let chats = load(STORE, []);
let currentId = chats[0]?.id || null;
let settings = load(SETTINGS, { model: "", system: "", temperature: 0.7, top_p: 0.95, max_tokens: 512, json: false, tools: "" });
let running = null; // AbortController of the answer being streamed

function load(key, fallback) {
  try { return JSON.parse(localStorage.getItem(key)) ?? fallback; } catch { return fallback; }
}
function save() {
  try {
    localStorage.setItem(STORE, JSON.stringify(chats));
    localStorage.setItem(SETTINGS, JSON.stringify(settings));
  } catch { /* storage full or disabled: the chat still works for this page */ }
}
function chat() { return chats.find((c) => c.id === currentId); }
function newChat() {
  const c = { id: `c${Date.now().toString(36)}${Math.random().toString(36).slice(2, 6)}`, title: "New chat", messages: [], created: Date.now() };
  chats.unshift(c);
  currentId = c.id;
  save();
  return c;
}

export function mount(el) {
  root = el;
  const num = (id, label, min, max, step) => h("label", {}, label,
    h("input", { id, type: "number", min, max, step, value: settings[id.replace("set-", "").replace("-", "_")] }));
  put(el,
    h("div", { class: "chat" },
      h("aside", { class: "chat-list" },
        h("button", { type: "button", id: "new-chat", onclick: () => { newChat(); draw(); } }, "New chat"),
        h("ul", { id: "chats" })),
      h("div", { class: "chat-main" },
        h("div", { class: "chat-settings" },
          h("label", {}, "Model ", h("select", { id: "chat-model", "aria-label": "model" })),
          num("set-temperature", "Temperature ", 0, 2, 0.1),
          num("set-top-p", "Top p ", 0.01, 1, 0.01),
          num("set-max-tokens", "Max tokens ", 1, 32768, 1),
          h("label", { class: "check" }, h("input", { id: "set-json", type: "checkbox", checked: settings.json }), " JSON output"),
          h("details", {}, h("summary", {}, "System prompt and tools"),
            h("label", { class: "block" }, "System prompt", h("textarea", { id: "set-system", rows: 3, value: settings.system })),
            h("label", { class: "block" }, "Tools (OpenAI `tools` array, JSON)", h("textarea", { id: "set-tools", rows: 4, spellcheck: "false", value: settings.tools, placeholder: '[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}]' })))),
        h("ol", { id: "messages", class: "messages", "aria-live": "polite" }),
        h("form", { id: "composer", class: "composer", onsubmit: (ev) => { ev.preventDefault(); send(); } },
          h("textarea", { id: "prompt", rows: 2, placeholder: "Message (Enter sends, Shift+Enter for a new line)", "aria-label": "message",
            onkeydown: (ev) => { if (ev.key === "Enter" && !ev.shiftKey && !ev.isComposing) { ev.preventDefault(); send(); } } }),
          h("button", { type: "submit", id: "send" }, "Send"),
          h("button", { type: "button", id: "stop", class: "secondary", disabled: true, onclick: () => running?.abort() }, "Stop")))));
  const bind = (id, key, conv = (v) => v) => el.querySelector(`#${id}`).addEventListener("change", (ev) => {
    settings[key] = ev.target.type === "checkbox" ? ev.target.checked : conv(ev.target.value);
    save();
  });
  bind("set-temperature", "temperature", Number);
  bind("set-top-p", "top_p", Number);
  bind("set-max-tokens", "max_tokens", Number);
  bind("set-json", "json");
  bind("set-system", "system");
  bind("set-tools", "tools");
  bind("chat-model", "model");
  draw();
}

function drawList() {
  put(root.querySelector("#chats"), chats.map((c) => h("li", { class: c.id === currentId ? "active" : "" },
    h("button", { type: "button", class: "link", onclick: () => { currentId = c.id; draw(); } }, c.title),
    h("button", { type: "button", class: "link delete", title: "delete", "aria-label": `delete ${c.title}`,
      onclick: () => { chats = chats.filter((x) => x !== c); if (currentId === c.id) currentId = chats[0]?.id || null; save(); draw(); } }, "×"))));
}

function toolCall(tc) {
  let args = tc.function?.arguments ?? "";
  try { args = JSON.stringify(JSON.parse(args), null, 2); } catch { /* still streaming */ }
  return h("div", { class: "tool-call" }, h("div", { class: "tool-name" }, `tool call: ${tc.function?.name || "?"}`), h("pre", {}, h("code", {}, args)));
}

function body(m) {
  if (m.role !== "assistant") return h("div", { class: "text" }, m.content);
  const parts = [];
  if (m.content) {
    let json = null;
    if (m.json) { try { json = JSON.stringify(JSON.parse(m.content), null, 2); } catch { /* partial */ } }
    parts.push(json ? h("pre", { class: "json" }, h("code", {}, json)) : render(m.content));
  }
  for (const tc of m.tool_calls || []) parts.push(toolCall(tc));
  if (m.error) parts.push(h("p", { class: "error" }, m.error));
  return h("div", { class: "text" }, parts);
}

function stats(m) {
  if (!m.stats) return null;
  const s = m.stats;
  const bits = [];
  if (s.ttft_ms !== undefined) bits.push(`TTFT ${s.ttft_ms.toFixed(0)} ms`);
  if (s.tok_s !== undefined) bits.push(`${s.tok_s.toFixed(1)} tok/s`);
  if (s.tokens !== undefined) bits.push(`${s.tokens} tokens`);
  if (s.finish) bits.push(s.finish);
  return h("div", { class: "stats" }, bits.join(" · "));
}

function messageEl(m) {
  return h("li", { class: ["msg", m.role] }, h("div", { class: "role" }, m.role), body(m), stats(m));
}

function draw() {
  if (!root) return;
  drawList();
  const c = chat();
  put(root.querySelector("#messages"), c ? c.messages.map(messageEl) : h("li", { class: "muted empty" }, "Ask something to start a conversation."));
}

function toolsParam() {
  if (!settings.tools.trim()) return undefined;
  const t = JSON.parse(settings.tools);
  if (!Array.isArray(t)) throw new Error("tools must be a JSON array");
  return t;
}

async function send() {
  const input = root.querySelector("#prompt");
  const text = input.value.trim();
  if (!text || running) return;
  let tools;
  try { tools = toolsParam(); } catch (e) { alertIn(`Tools: ${e.message}`); return; }
  const c = chat() || newChat();
  if (!c.messages.length) c.title = text.slice(0, 40);
  c.messages.push({ role: "user", content: text });
  const answer = { role: "assistant", content: "", tool_calls: [], json: settings.json };
  c.messages.push(answer);
  input.value = "";
  save();
  draw();
  const messages = [];
  if (settings.system.trim()) messages.push({ role: "system", content: settings.system });
  for (const m of c.messages.slice(0, -1)) {
    if (m.role === "assistant") {
      const msg = { role: "assistant", content: m.content || "" };
      if (m.tool_calls?.length) msg.tool_calls = m.tool_calls;
      messages.push(msg);
      for (const tc of m.tool_calls || []) messages.push({ role: "tool", tool_call_id: tc.id, content: "(no tool ran: the dashboard shows calls, it does not execute them)" });
    } else messages.push({ role: m.role, content: m.content });
  }
  const req = {
    model: root.querySelector("#chat-model").value || undefined,
    messages, stream: true, stream_options: { include_usage: true },
    temperature: settings.temperature, top_p: settings.top_p, max_tokens: settings.max_tokens,
  };
  if (settings.json) req.response_format = { type: "json_object" };
  if (tools) req.tools = tools;
  running = new AbortController();
  root.querySelector("#send").disabled = true;
  root.querySelector("#stop").disabled = false;
  const t0 = performance.now();
  let first = 0, chunks = 0;
  try {
    await api.stream("/v1/chat/completions", req, (chunk) => {
      if (chunk.usage) answer.usage = chunk.usage;
      for (const ch of chunk.choices || []) {
        const d = ch.delta || {};
        if (d.content) {
          if (!first) first = performance.now();
          answer.content += d.content;
          chunks++;
        }
        for (const tc of d.tool_calls || []) {
          if (!first) first = performance.now();
          const slot = answer.tool_calls[tc.index ?? 0] ||= { id: tc.id, type: "function", function: { name: "", arguments: "" } };
          if (tc.id) slot.id = tc.id;
          if (tc.function?.name) slot.function.name += tc.function.name;
          if (tc.function?.arguments) slot.function.arguments += tc.function.arguments;
          chunks++;
        }
        if (ch.finish_reason) answer.finish = ch.finish_reason;
      }
      answer.stats = live(t0, first, answer.usage?.completion_tokens ?? chunks, answer.finish);
      draft(answer);
    }, running.signal);
  } catch (e) {
    if (e.name === "AbortError") answer.finish = "stopped";
    else answer.error = e.message;
  } finally {
    running = null;
    answer.stats = live(t0, first, answer.usage?.completion_tokens ?? chunks, answer.finish);
    save();
    draw();
    root.querySelector("#send").disabled = false;
    root.querySelector("#stop").disabled = true;
  }
}

/** Redraws the last message (the answer being streamed) at most once a frame. */
let frame = 0;
function draft(answer) {
  if (frame) return;
  frame = requestAnimationFrame(() => {
    frame = 0;
    const last = root.querySelector("#messages").lastElementChild;
    if (last) last.replaceWith(messageEl(answer));
  });
}

function live(t0, first, tokens, finish) {
  const now = performance.now();
  const st = { tokens, finish };
  if (first) {
    st.ttft_ms = first - t0;
    const gen = (now - first) / 1000;
    if (tokens > 1 && gen > 0) st.tok_s = (tokens - 1) / gen;
  }
  return st;
}

function alertIn(text) {
  const list = root.querySelector("#messages");
  list.append(h("li", { class: "msg error" }, text));
}

export function update(ctx) {
  if (!root) return;
  const ids = [...new Set([...(ctx.models || []), ...((ctx.status?.instances || []).map((i) => i.request.model))])];
  const sel = root.querySelector("#chat-model");
  redraw(sel, ids, () => ids.length ? ids.map((id) => h("option", { value: id }, id)) : h("option", { value: "" }, "(no model is served)"));
  if (settings.model && ids.includes(settings.model)) sel.value = settings.model;
}
