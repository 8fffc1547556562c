// Small DOM helpers: every element is built with createElement and text nodes, never by
// parsing strings as HTML, so nothing a model or a peer sends can become markup.

const SVG = "http://www.w3.org/2000/svg";

function fill(el, attrs, children) {
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on") && typeof v === "function") el.addEventListener(k.slice(2), v);
    else if (k === "class") el.setAttribute("class", Array.isArray(v) ? v.filter(Boolean).join(" ") : v);
    else if (k === "dataset") Object.assign(el.dataset, v);
    else if (k === "value" || k === "checked" || k === "disabled" || k === "selected") el[k] = v;
    else el.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

/** An HTML element: h("div", {class: "x"}, "text", child, [more]). */
export function h(tag, attrs, ...children) {
  return fill(document.createElement(tag), attrs, children);
}

/** An SVG element. */
export function s(tag, attrs, ...children) {
  return fill(document.createElementNS(SVG, tag), attrs, children);
}

/** Replaces el's children. */
export function put(el, ...children) {
  el.replaceChildren();
  return fill(el, {}, children);
}

export function bytes(n) {
  if (!Number.isFinite(n)) return "?";
  const units = ["B", "KB", "MB", "GB", "TB"];
  let i = 0;
  while (Math.abs(n) >= 1000 && i < units.length - 1) { n /= 1000; i++; }
  return `${n >= 100 || i === 0 ? n.toFixed(0) : n.toFixed(1)} ${units[i]}`;
}

export function seconds(s) {
  if (!Number.isFinite(s)) return "?";
  if (s < 1e-3) return `${(s * 1e6).toFixed(0)} µs`;
  if (s < 1) return `${(s * 1e3).toFixed(s < 0.01 ? 2 : 0)} ms`;
  return `${s.toFixed(1)} s`;
}

export function bandwidth(bytesPerSecond) {
  const bits = bytesPerSecond * 8;
  if (bits >= 1e9) return `${(bits / 1e9).toFixed(1)} Gbit/s`;
  return `${(bits / 1e6).toFixed(0)} Mbit/s`;
}

export function ago(ms) {
  const s = Math.max(0, (Date.now() - ms) / 1000);
  if (s < 60) return `${s.toFixed(0)} s ago`;
  if (s < 3600) return `${(s / 60).toFixed(0)} min ago`;
  return `${(s / 3600).toFixed(1)} h ago`;
}

export function clock(ms) {
  return new Date(ms).toLocaleTimeString();
}

const drawn = new WeakMap();
/**
 * Redraws el with build() only when key (any JSON-able value) differs from the last drawing's,
 * so buttons and inputs are not replaced under the user's pointer on every poll.
 */
export function redraw(el, key, build) {
  const k = JSON.stringify(key);
  if (drawn.get(el) === k) return;
  drawn.set(el, k);
  put(el, build());
}

/**
 * A table from header texts and rows of cells; every cell carries its column's header as
 * `data-label`, which narrow screens show beside the cell when rows become stacked cards.
 * A row is { attrs, cells } or just an array of cells; a cell is a <td> or anything `h` takes.
 */
export function table(cls, headers, rows) {
  return h("table", { class: cls },
    h("thead", {}, h("tr", {}, headers.map((t) => h("th", {}, t)))),
    h("tbody", {}, rows.map((r) => {
      const { attrs, cells } = Array.isArray(r) ? { attrs: {}, cells: r } : r;
      return h("tr", attrs, cells.map((c, i) => {
        // Several parts go in one box, so the stacked layout keeps them together.
        const td = c instanceof Element && c.tagName === "TD" ? c : h("td", {}, Array.isArray(c) ? h("div", {}, c) : c);
        if (headers[i]) td.dataset.label = headers[i];
        return td;
      }));
    })));
}
