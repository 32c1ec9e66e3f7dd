// The chat page's Markdown renderer (no library): blocks (fences, headings, lists that nest,
// quotes, tables, rules, paragraphs) and inline marks (code, emphasis, links). All text is
// escaped; every visible character goes out through tint(start, end), with offsets into the
// source, so the caller can wrap each token of a reply in its own span.

const ESC = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
export const esc = (s) => s.replace(/[&<>"']/g, (c) => ESC[c]);

// Markdown of src[a, b) to HTML. Every visible character goes out through tint(start, end), which
// gets offsets into the reply's text, so a token keeps its tint inside code, lists and emphasis.
export function markdown(src, a, b, tint) {
  const lines = [];
  for (let s = a; s < b; ) {
    let e = src.indexOf("\n", s);
    if (e < 0 || e > b) e = b;
    lines.push({ s, e, t: src.slice(s, e) });
    s = e + 1;
  }
  return blocks(src, lines, tint);
}

const FENCE = /^ {0,3}(`{3,}|~{3,})\s*([^`\s]*)/;
const HEAD = /^ {0,3}(#{1,6})(\s+|$)/;
const HR = /^ {0,3}([-*_])(\s*\1){2,}\s*$/;
const ITEM = /^( {0,12})([-*+]|\d{1,9}[.)])( +|$)/;
const QUOTE = /^ {0,3}> ?/;
const TABLE_SEP = /^\s*\|?\s*:?-+:?\s*(\|\s*:?-+:?\s*)*\|?\s*$/;
const blank = (t) => /^\s*$/.test(t);
const lead = (t) => t.match(/^ */)[0].length;
const cut = (l, n) => ({ s: l.s + n, e: l.e, t: l.t.slice(n) }); // a line without its first n characters
const startsBlock = (t) => FENCE.test(t) || HEAD.test(t) || HR.test(t) || (ITEM.test(t) && !blank(t.replace(ITEM, ""))) || QUOTE.test(t);

// Block Markdown over lines {s, e, t} (t == src.slice(s, e); indentation already cut where it belongs to a list)
function blocks(src, L, tint) {
  const out = [];
  let i = 0;
  const inline = (ls) => ls.map((l) => inlineRange(src, l.s + lead(l.t), l.e, tint)).join("<br>");
  while (i < L.length) {
    const t = L[i].t;
    if (blank(t)) { i++; continue; }
    let m;
    if ((m = FENCE.exec(t))) {
      const fence = m[1], lang = m[2];
      const closeRe = new RegExp(`^ {0,3}${fence[0] === "`" ? "`" : "~"}{${fence.length},}\\s*$`);
      const open = i++;
      while (i < L.length && !closeRe.test(L[i].t)) i++;
      const body = L.slice(open + 1, i);
      if (i < L.length) i++;
      const code = body.map((l) => (l.e > l.s ? tint(l.s, l.e) : "")).join("\n");
      out.push(`<div class="code"><div class="code-head"><span>${esc(lang || "code")}</span>` +
        `<button type="button" class="copy-code" title="Copy the code">Copy</button></div><pre><code>${code}</code></pre></div>`);
      continue;
    }
    if ((m = HEAD.exec(t))) {
      const text = t.replace(/\s+#+\s*$/, "").replace(/\s+$/, "");
      out.push(`<h${m[1].length}>${inlineRange(src, L[i].s + m[0].length, L[i].s + Math.max(m[0].length, text.length), tint)}</h${m[1].length}>`);
      i++;
      continue;
    }
    if (HR.test(t)) { out.push("<hr>"); i++; continue; }
    if ((m = ITEM.exec(t)) && !blank(t.slice(m[0].length))) {
      const [html, next] = list(src, L, i, tint);
      out.push(html);
      i = next;
      continue;
    }
    if (QUOTE.test(t)) {
      const inner = [];
      while (i < L.length && (m = QUOTE.exec(L[i].t))) inner.push(cut(L[i++], m[0].length));
      out.push(`<blockquote>${blocks(src, inner, tint)}</blockquote>`);
      continue;
    }
    if (t.includes("|") && i + 1 < L.length && TABLE_SEP.test(L[i + 1].t) && L[i + 1].t.includes("-")) {
      const aligns = L[i + 1].t.replace(/^\s*\|?|\|?\s*$/g, "").split("|").map((c) => {
        c = c.trim();
        return c.startsWith(":") && c.endsWith(":") ? "center" : c.endsWith(":") ? "right" : "";
      });
      const head = cells(L[i]);
      i += 2;
      const rows = [];
      while (i < L.length && L[i].t.includes("|") && !blank(L[i].t)) rows.push(cells(L[i++]));
      const cell = (tag, c, j) => `<${tag}${aligns[j] ? ` class="al-${aligns[j]}"` : ""}>${inlineRange(src, c[0], c[1], tint)}</${tag}>`;
      out.push(`<div class="table"><table><thead><tr>${head.map((c, j) => cell("th", c, j)).join("")}</tr></thead><tbody>` +
        rows.map((r) => `<tr>${r.map((c, j) => cell("td", c, j)).join("")}</tr>`).join("") + "</tbody></table></div>");
      continue;
    }
    const para = [L[i++]];
    while (i < L.length && !blank(L[i].t) && !startsBlock(L[i].t)) para.push(L[i++]);
    out.push(`<p>${inline(para)}</p>`);
  }
  return out.join("");
}

// A list from L[i]: each item's lines (its indentation cut) are blocks of their own, so nested lists and code nest.
function list(src, L, i, tint) {
  const first = ITEM.exec(L[i].t);
  const indent = first[1].length, ordered = /\d/.test(first[2]);
  const items = [];
  while (i < L.length) {
    const m = ITEM.exec(L[i].t);
    if (!m || m[1].length !== indent || /\d/.test(m[2]) !== ordered || blank(L[i].t.slice(m[0].length))) break;
    const width = m[0].length;
    const lines = [cut(L[i++], width)];
    while (i < L.length) {
      const t = L[i].t;
      if (blank(t)) {
        let k = i;
        while (k < L.length && blank(L[k].t)) k++;
        if (k < L.length && lead(L[k].t) > indent) { while (i < k) lines.push(cut(L[i], L[i].t.length)), i++; continue; }
        break;
      }
      if (lead(t) > indent) { lines.push(cut(L[i++], Math.min(lead(t), width))); continue; }
      if (ITEM.test(t) || startsBlock(t) || blank(lines[lines.length - 1].t)) break;
      lines.push(L[i++]); // a lazy continuation line
    }
    items.push(`<li>${blocks(src, lines, tint)}</li>`);
  }
  const tag = ordered ? "ol" : "ul";
  const n = parseInt(first[2], 10);
  return [`<${tag}${ordered && n !== 1 ? ` start="${n}"` : ""}>${items.join("")}</${tag}>`, i];
}

function cells(l) {
  const { s, t } = l;
  const res = [];
  let p = t.match(/^\s*\|?/)[0].length;
  const end = t.replace(/\|?\s*$/, "").length;
  while (p <= end) {
    let q = p;
    while (q < end && !(t[q] === "|" && t[q - 1] !== "\\")) q++;
    let x = p, y = q;
    while (x < y && t[x] === " ") x++;
    while (y > x && t[y - 1] === " ") y--;
    res.push([s + x, s + y]);
    if (q >= end) break;
    p = q + 1;
  }
  return res;
}

function inlineRange(src, a, b, tint) {
  let out = "";
  let run = a; // start of the plain text not yet emitted
  const flush = (to) => { if (to > run) out += tint(run, to); };
  let p = a;
  while (p < b) {
    const c = src[p];
    if (c === "\\" && p + 1 < b && /[!-/:-@[-`{-~]/.test(src[p + 1])) {
      flush(p); out += tint(p + 1, p + 2); p += 2; run = p; continue;
    }
    if (c === "`") {
      let n = 1;
      while (src[p + n] === "`") n++;
      const ticks = "`".repeat(n);
      const close = src.indexOf(ticks, p + n);
      if (close >= 0 && close + n <= b && src[close + n] !== "`") {
        let x = p + n, y = close;
        if (y - x >= 2 && src[x] === " " && src[y - 1] === " ") { x++; y--; }
        flush(p);
        out += `<code>${tint(x, y)}</code>`;
        p = close + n; run = p; continue;
      }
      p += n; continue;
    }
    if (c === "*" || c === "_" || c === "~") {
      let n = 1;
      while (src[p + n] === c && n < 3) n++;
      if (c === "~" && n < 2) { p++; continue; }
      const mark = c.repeat(n);
      const after = src[p + n];
      const before = p > a ? src[p - 1] : " ";
      const wordy = c === "_" && /\w/.test(before);
      if (after && !/\s/.test(after) && !wordy) {
        let close = src.indexOf(mark, p + n);
        while (close >= 0 && close < b && (/\s/.test(src[close - 1]) || (c === "_" && /\w/.test(src[close + n] || "")))) close = src.indexOf(mark, close + 1);
        if (close > p + n && close + n <= b) {
          flush(p);
          const inner = inlineRange(src, p + n, close, tint);
          out += c === "~" ? `<del>${inner}</del>` : n === 1 ? `<em>${inner}</em>` : n === 2 ? `<strong>${inner}</strong>` : `<strong><em>${inner}</em></strong>`;
          p = close + n; run = p; continue;
        }
      }
      p += n; continue;
    }
    if (c === "[") {
      const close = findClose(src, p, b);
      if (close > 0 && src[close + 1] === "(") {
        let end = close + 2, depth = 1;
        for (; end < b && depth; end++) depth += src[end] === "(" ? 1 : src[end] === ")" ? -1 : 0;
        end--;
        if (!depth && end < b) {
          const url = src.slice(close + 2, end).trim().split(/\s+/)[0];
          flush(p);
          const inner = inlineRange(src, p + 1, close, tint);
          out += /^(https?:|mailto:)/i.test(url) ? `<a href="${esc(url)}" target="_blank" rel="noopener noreferrer">${inner}</a>` : inner;
          p = end + 1; run = p; continue;
        }
      }
      p++; continue;
    }
    if (c === "h" && (p === a || /[\s(]/.test(src[p - 1]))) {
      const m = /^https?:\/\/[^\s<>()]*[^\s<>().,;:!?'"*_]/.exec(src.slice(p, b));
      if (m) {
        flush(p);
        out += `<a href="${esc(m[0])}" target="_blank" rel="noopener noreferrer">${tint(p, p + m[0].length)}</a>`;
        p += m[0].length; run = p; continue;
      }
    }
    p++;
  }
  flush(b);
  return out;
}

function findClose(src, p, b) {
  let depth = 0;
  for (let q = p; q < b; q++) {
    if (src[q] === "\\") { q++; continue; }
    if (src[q] === "[") depth++;
    else if (src[q] === "]" && --depth === 0) return q;
  }
  return -1;
}
