// A small Markdown renderer for answers: fenced code, headings, lists, quotes, paragraphs, and
// inline code, bold, italics and links. It builds DOM nodes from the text (no HTML is parsed),
// so whatever a model writes shows as text, never as markup. An unfinished fence (an answer
// still streaming) renders as code so far.

import { h } from "./dom.js";

function inline(text) {
  const out = [];
  // `code`, **bold**, *em* or _em_, [text](http...)
  const re = /(`+)([^`]+?)\1|\*\*([^*]+)\*\*|(?<![\w*])\*([^*\s][^*]*?)\*(?!\w)|(?<!\w)_([^_\s][^_]*?)_(?!\w)|\[([^\]]+)\]\((https?:\/\/[^\s)]+)\)/g;
  let last = 0, m;
  while ((m = re.exec(text))) {
    if (m.index > last) out.push(text.slice(last, m.index));
    if (m[2] !== undefined) out.push(h("code", {}, m[2]));
    else if (m[3] !== undefined) out.push(h("strong", {}, inline(m[3])));
    else if (m[4] !== undefined) out.push(h("em", {}, inline(m[4])));
    else if (m[5] !== undefined) out.push(h("em", {}, inline(m[5])));
    else out.push(h("a", { href: m[7], rel: "noopener noreferrer", target: "_blank" }, m[6]));
    last = re.lastIndex;
  }
  if (last < text.length) out.push(text.slice(last));
  return out;
}

/** The rendering of `text` as a <div class="md">. */
export function render(text) {
  const lines = text.replace(/\r\n/g, "\n").split("\n");
  const blocks = [];
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    const fence = line.match(/^\s*(```|~~~)\s*([\w+#.-]*)/);
    if (fence) {
      const code = [];
      i++;
      while (i < lines.length && !lines[i].trimStart().startsWith(fence[1])) code.push(lines[i++]);
      i++;
      blocks.push(h("pre", { class: "code", dataset: { lang: fence[2] || "" } }, h("code", {}, code.join("\n"))));
      continue;
    }
    const head = line.match(/^(#{1,6})\s+(.*)$/);
    if (head) {
      blocks.push(h(`h${Math.min(6, head[1].length + 2)}`, {}, inline(head[2])));
      i++;
      continue;
    }
    if (/^\s*([-*+]|\d+[.)])\s+/.test(line)) {
      const ordered = /^\s*\d/.test(line);
      const items = [];
      while (i < lines.length && /^\s*([-*+]|\d+[.)])\s+/.test(lines[i])) {
        items.push(h("li", {}, inline(lines[i].replace(/^\s*([-*+]|\d+[.)])\s+/, ""))));
        i++;
      }
      blocks.push(h(ordered ? "ol" : "ul", {}, items));
      continue;
    }
    if (/^\s*>/.test(line)) {
      const quote = [];
      while (i < lines.length && /^\s*>/.test(lines[i])) quote.push(lines[i++].replace(/^\s*>\s?/, ""));
      blocks.push(h("blockquote", {}, inline(quote.join("\n"))));
      continue;
    }
    if (!line.trim()) { i++; continue; }
    const para = [];
    while (i < lines.length && lines[i].trim() && !/^\s*(```|~~~|#{1,6}\s|[-*+]\s|\d+[.)]\s|>)/.test(lines[i])) para.push(lines[i++]);
    if (!para.length) para.push(lines[i++]);
    const parts = [];
    para.forEach((p, k) => { if (k) parts.push(h("br")); parts.push(inline(p)); });
    blocks.push(h("p", {}, parts));
  }
  return h("div", { class: "md" }, blocks);
}
