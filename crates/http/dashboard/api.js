// Calls to the node's API with the key the user gave (kept in this browser's localStorage).

const KEY = "strata.apiKey";

export class ApiError extends Error {
  constructor(status, message) {
    super(message);
    this.status = status;
  }
}

const listeners = new Set();
/** Called with no arguments whenever a call is refused for want of a (valid) key. */
export function onAuthNeeded(fn) { listeners.add(fn); }

export function key() { return localStorage.getItem(KEY) || ""; }
export function setKey(k) {
  if (k) localStorage.setItem(KEY, k); else localStorage.removeItem(KEY);
}

function headers(json) {
  const h = {};
  if (json) h["Content-Type"] = "application/json";
  const k = key();
  if (k) h["Authorization"] = `Bearer ${k}`;
  return h;
}

/** The error of a refused call; `sent` is the key the call carried. */
async function failure(resp, sent) {
  let msg = `${resp.status} ${resp.statusText}`;
  try {
    const body = await resp.json();
    msg = body?.error?.message || body?.error || msg;
  } catch { /* not JSON */ }
  // A refusal of a call made with another key (one in flight while the user entered a new key)
  // says nothing about the key now in use: asking again would reopen the prompt over it.
  if (resp.status === 401 && sent === key()) listeners.forEach((f) => f());
  return new ApiError(resp.status, String(msg));
}

/** GET or POST JSON; resolves to the parsed answer, rejects with ApiError. */
export async function call(path, { method = "GET", body, signal } = {}) {
  const sent = key();
  const resp = await fetch(path, {
    method,
    headers: headers(body !== undefined),
    body: body === undefined ? undefined : JSON.stringify(body),
    signal,
    cache: "no-store",
  });
  if (!resp.ok) throw await failure(resp, sent);
  const type = resp.headers.get("content-type") || "";
  return type.includes("json") ? resp.json() : resp.text();
}

/** POSTs body and yields the answer's text as it arrives; rejects with ApiError when the
 * server refuses the request. */
async function* chunks(path, body, signal) {
  const sent = key();
  const resp = await fetch(path, {
    method: "POST",
    headers: headers(true),
    body: JSON.stringify(body),
    signal,
  });
  if (!resp.ok) throw await failure(resp, sent);
  const reader = resp.body.getReader();
  const decoder = new TextDecoder();
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    yield decoder.decode(value, { stream: true });
  }
}

/**
 * POSTs body and calls onData with each server-sent event's parsed data until the stream ends
 * (or `[DONE]`). Rejects with ApiError when the server refuses the request.
 */
export async function stream(path, body, onData, signal) {
  let buf = "";
  for await (const text of chunks(path, body, signal)) {
    buf += text;
    let cut;
    while ((cut = buf.indexOf("\n\n")) >= 0) {
      const event = buf.slice(0, cut);
      buf = buf.slice(cut + 2);
      const data = event
        .split("\n")
        .filter((l) => l.startsWith("data:"))
        .map((l) => l.slice(5).trimStart())
        .join("\n");
      if (!data) continue;
      if (data === "[DONE]") return;
      onData(JSON.parse(data));
    }
  }
}

/**
 * POSTs body and calls onLine with each parsed line of an NDJSON answer (Ollama's progress
 * lines) until it ends. Rejects with ApiError when the server refuses the request.
 */
export async function lines(path, body, onLine, signal) {
  let buf = "";
  for await (const text of chunks(path, body, signal)) {
    buf += text;
    let cut;
    while ((cut = buf.indexOf("\n")) >= 0) {
      const line = buf.slice(0, cut).trim();
      buf = buf.slice(cut + 1);
      if (line) onLine(JSON.parse(line));
    }
  }
  if (buf.trim()) onLine(JSON.parse(buf));
}
