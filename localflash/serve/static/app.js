// localflash chat page: streams replies from this server's /v1/chat/completions and tints each
// token by how it was made, from the optional `localflash` field of every streamed chunk:
//   {"drafted": k, "accepted": m, "chars": [c0, c1, ...]}
// chars[i] is how many characters (code points) token i added to the reply's text; the first m
// tokens are accepted drafts, the rest the target's own. Model card: GET /v1/localflash/info.
"use strict";

const $ = (id) => document.getElementById(id);
const KEY = "localflash.key";
const DEFAULTS = { system: "", temperature: 0.8, top_p: 0.95, top_k: 40, max_tokens: 1024, drafting: true, thinking: "auto", show_thinking: true };

const state = {
  key: sessionStorage.getItem(KEY) || "",
  info: null,
  settings: { ...DEFAULTS },
  turns: [], // {role, content, el, reply?}
  busy: null, // {ctrl, reply}
  session: newTotals(),
  last: null, // the last finished reply
};

function newTotals() {
  return { replies: 0, tokens: 0, drafted: 0, accepted: 0, committed: 0, cycles: 0, ms: 0, tries: [], hits: [] };
}

// -- escaping and the Markdown renderer ------------------------------------------------------------

const ESC = { "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" };
const esc = (s) => s.replace(/[&<>"']/g, (c) => ESC[c]);

// Markdown of src[a, b) to HTML. Every visible character goes out through tint(start, end), which
// gets offsets into the reply's text, so a token keeps its tint inside code, lists and emphasis.
function markdown(src, a, b, tint) {
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

// -- a reply: its text, its tokens and where they came from -----------------------------------------

class Reply {
  constructor(el) {
    this.el = el;
    this.text = "";
    this.chars = []; // code points per token
    this.drafts = []; // 1: accepted draft token, 0: the target's own
    this.drafted = 0;
    this.accepted = 0;
    this.cycles = 0; // draft–verify cycles (the first token comes from the prompt pass)
    this.committed = 0;
    this.tries = [];
    this.hits = [];
    this.t0 = performance.now();
    this.tFirst = null;
    this.timings = null;
    this.usage = null;
    this.finish = null;
    this.state = "streaming";
    this.view = "md";
    this.error = null;
    this.preopened = null; // the chat template opened the thinking block before the reply began
  }

  add(obj) {
    const lf = obj.localflash;
    const ch = obj.choices && obj.choices[0];
    if (ch && ch.delta && typeof ch.delta.content === "string") this.text += ch.delta.content;
    if (lf) {
      const n = lf.chars.length;
      if (this.preopened === null && n) this.preopened = lf.phase === "think" && !this.text.includes("<think>");
      lf.chars.forEach((c, i) => { this.chars.push(c); this.drafts.push(i < lf.accepted ? 1 : 0); });
      this.drafted += lf.drafted;
      this.accepted += lf.accepted;
      if (n && this.tFirst === null) this.tFirst = performance.now();
      else if (n || lf.drafted) { this.cycles++; this.committed += n; }
      for (let j = 0; j < Math.min(lf.accepted + 1, lf.drafted); j++) {
        bump(this.tries, j);
        if (j < lf.accepted) bump(this.hits, j);
      }
    }
    if (obj.timings) this.timings = obj.timings;
    if (obj.usage) this.usage = obj.usage;
    if (ch && ch.finish_reason) this.finish = ch.finish_reason;
  }

  get tokens() { return this.chars.length; }

  tps() {
    if (this.timings && this.state !== "streaming") return this.timings.predicted_per_second;
    if (this.tFirst === null) return 0;
    const s = (performance.now() - this.tFirst) / 1000;
    return s > 0.05 ? (this.tokens - 1) / s : 0;
  }

  tau() { return this.timings && this.state !== "streaming" ? this.timings.tau : this.cycles ? this.committed / this.cycles : 0; }

  // token k covers text[bounds[k], bounds[k+1]) in UTF-16 units; text past the last token belongs to it
  bounds() {
    const b = [0];
    let j = 0;
    for (const c of this.chars) {
      let left = c;
      while (left > 0 && j < this.text.length) { j += this.text.codePointAt(j) > 0xffff ? 2 : 1; left--; }
      b.push(j);
    }
    b[b.length - 1] = Math.max(b[b.length - 1], this.text.length);
    return b;
  }

  tinter() {
    const b = this.bounds();
    const text = this.text;
    const flags = this.drafts;
    return (x, y) => {
      let lo = 0, hi = b.length - 2;
      if (hi < 0) return esc(text.slice(x, y));
      while (lo < hi) { const mid = (lo + hi + 1) >> 1; if (b[mid] <= x) lo = mid; else hi = mid - 1; }
      let html = "";
      for (let k = lo, p = x; p < y && k < b.length - 1; k++) {
        const q = Math.min(y, b[k + 1]);
        if (q > p) html += `<span class="t${flags[k] ? " d" : ""}" data-i="${k}">${esc(text.slice(p, q))}</span>`;
        p = q;
      }
      const tail = Math.max(x, b[b.length - 1]);
      if (tail < y) html += esc(text.slice(tail, y));
      return html;
    };
  }

  // the answer without a thinking block (what Copy copies and what the history sends)
  answer() { return splitThink(this.text, this.preopened).answer; }
}

function bump(a, i, by = 1) { while (a.length <= i) a.push(0); a[i] += by; }

// a reply's thinking block: <think>…</think> at its start, or up to </think> when the template opened it
function splitThink(text, preopened = false) {
  let start = 0;
  if (!preopened) {
    const open = text.indexOf("<think>");
    if (open < 0 || text.slice(0, open).trim()) return { think: null, answer: text };
    start = open + 7;
  }
  const close = text.indexOf("</think>", start);
  const rest = close < 0 ? text.length : close + 8;
  return { think: [start, close < 0 ? text.length : close], done: close >= 0, rest, answer: close < 0 ? "" : text.slice(rest).replace(/^\s+/, "") };
}

// -- rendering ----------------------------------------------------------------------------------------

function renderReply(r) {
  const body = r.el.querySelector(".body");
  const tint = r.tinter();
  let html = "";
  if (r.view === "tokens") {
    html = `<div class="raw">${r.text ? tint(0, r.text.length) : ""}</div>`;
  } else {
    const th = splitThink(r.text, r.preopened);
    let from = 0;
    if (th.think) {
      const open = state.settings.show_thinking ? " open" : "";
      html += `<details class="think"${open}><summary>${th.done ? "Thought" : "Thinking…"}</summary><div class="md">` +
        markdown(r.text, th.think[0], th.think[1], tint) + "</div></details>";
      from = th.rest;
    }
    html += markdown(r.text, from, r.text.length, tint);
  }
  if (r.state === "streaming") html += '<span class="caret" aria-hidden="true"></span>';
  if (r.error) html += `<div class="err" role="alert">${esc(r.error)}</div>`;
  const details = body.querySelector("details.think");
  const keepOpen = details ? details.open : null;
  body.innerHTML = html;
  if (keepOpen !== null) { const d = body.querySelector("details.think"); if (d) d.open = keepOpen; }
  r.el.dataset.state = r.state;
  r.el.dataset.tokens = r.tokens;
  r.el.dataset.accepted = r.accepted;
  r.el.dataset.drafted = r.drafted;
  r.el.querySelector(".foot").innerHTML = footHTML(r);
}

function footHTML(r) {
  const parts = [];
  const t = r.timings;
  const n = t ? t.predicted_n : r.tokens;
  parts.push(`<span>${n} tok</span>`);
  const tps = r.tps();
  if (tps) parts.push(`<span>${tps.toFixed(1)} tok/s</span>`);
  const drafted = t ? t.draft_n : r.drafted;
  const accepted = t ? t.draft_n_accepted : r.accepted;
  if (drafted) {
    parts.push(`<span>τ ${r.tau().toFixed(2)}</span>`);
    parts.push(`<span class="acc" title="accepted / drafted">${accepted} of ${drafted} drafts accepted (${pct(accepted / drafted)})</span>`);
  } else if (r.state !== "streaming") {
    parts.push(`<span>${state.settings.drafting && state.info && state.info.draft_max ? "no drafts" : "drafting off"}</span>`);
  }
  if (r.usage) parts.push(`<span title="prompt tokens (reused from the cache)">prompt ${r.usage.prompt_tokens} (${r.usage.prompt_tokens_details.cached_tokens} cached)</span>`);
  if (r.state === "stopped") parts.push('<span class="badge">stopped</span>');
  if (r.finish === "length") parts.push('<span class="badge">max tokens</span>');
  let html = `<div class="stats">${parts.join("")}</div>`;
  if (r.drafted && r.tries.length) html += `<div class="mini" title="acceptance by draft position (this reply)">${chartSVG(r.tries, r.hits, true)}<span>by position</span></div>`;
  return html;
}

const pct = (x) => `${Math.round(100 * x)}%`;

// bars: acceptance at each draft position (hits / tries)
function chartSVG(tries, hits, mini = false) {
  const n = Math.max(tries.length, mini ? 1 : 8);
  const W = mini ? Math.max(24, n * 8) : 260, H = mini ? 22 : 104;
  const padB = mini ? 2 : 18, padT = mini ? 2 : 16, padL = mini ? 0 : 26;
  const slot = (W - padL) / n, bw = Math.max(3, slot * 0.68);
  const ch = H - padB - padT;
  let g = "";
  if (!mini) {
    for (const v of [0, 0.5, 1]) {
      const y = padT + ch * (1 - v);
      g += `<line class="grid" x1="${padL}" x2="${W}" y1="${y}" y2="${y}"/><text class="ax" x="${padL - 4}" y="${y + 3}" text-anchor="end">${v * 100}%</text>`;
    }
  }
  for (let j = 0; j < n; j++) {
    const t = tries[j] || 0, h = hits[j] || 0;
    const rate = t ? h / t : 0;
    const x = padL + j * slot + (slot - bw) / 2;
    const bh = Math.max(t ? 1.5 : 0, ch * rate);
    g += `<g><title>position ${j + 1}: ${h} of ${t} accepted${t ? ` (${pct(rate)})` : ""}</title>` +
      `<rect class="chart-track" x="${x}" y="${padT}" width="${bw}" height="${ch}" rx="2"/>` +
      `<rect class="chart-bar" x="${x}" y="${padT + ch - bh}" width="${bw}" height="${bh}" rx="2"/>`;
    if (!mini && (n <= 16 || j % 2 === 0)) g += `<text class="ax" x="${x + bw / 2}" y="${H - 5}" text-anchor="middle">${j + 1}</text>`;
    if (!mini && t && n <= 12) g += `<text class="val" x="${x + bw / 2}" y="${padT + ch - bh - 3}" text-anchor="middle">${Math.round(rate * 100)}</text>`;
    g += "</g>";
  }
  return `<svg viewBox="0 0 ${W} ${H}" width="${mini ? W : "100%"}" height="${H}" role="img" aria-label="acceptance by draft position">${g}</svg>`;
}

function figsHTML(rows) {
  return rows.map(([k, v, title]) => `<div${title ? ` title="${esc(title)}"` : ""}><dt>${k}</dt><dd>${v}</dd></div>`).join("");
}

function renderSide() {
  const r = state.busy ? state.busy.reply : state.last;
  if (r) {
    const t = r.state !== "streaming" ? r.timings : null;
    const drafted = t ? t.draft_n : r.drafted, accepted = t ? t.draft_n_accepted : r.accepted;
    $("reply-figs").innerHTML = figsHTML([
      ["tokens", t ? t.predicted_n : r.tokens],
      ["tok/s", r.tps() ? r.tps().toFixed(1) : "–"],
      ["τ", r.tau() ? r.tau().toFixed(2) : "–", "tokens committed per target pass"],
      ["accepted", drafted ? `${accepted}/${drafted}` : "–", "accepted / drafted tokens"],
      ["acceptance", drafted ? pct(accepted / drafted) : "–"],
      ["longest run", longestRun(r), "longest stretch of accepted draft tokens in a row"],
    ]);
    $("reply-chart").innerHTML = chartSVG(r.tries, r.hits);
  } else {
    $("reply-figs").innerHTML = figsHTML([["tokens", "–"], ["tok/s", "–"], ["τ", "–"], ["accepted", "–"], ["acceptance", "–"], ["longest run", "–"]]);
    $("reply-chart").innerHTML = chartSVG([], []);
  }
  const s = state.session;
  $("session-figs").innerHTML = figsHTML([
    ["replies", s.replies],
    ["tokens", s.tokens],
    ["tok/s", s.ms ? (1000 * s.tokens / s.ms).toFixed(1) : "–", "all replies' tokens / their decode time"],
    ["τ", s.cycles ? (s.committed / s.cycles).toFixed(2) : "–", "tokens committed per target pass"],
    ["accepted", s.drafted ? `${s.accepted}/${s.drafted}` : "–"],
    ["acceptance", s.drafted ? pct(s.accepted / s.drafted) : "–"],
  ]);
  $("session-chart").innerHTML = chartSVG(s.tries, s.hits);
  renderLive();
}

function longestRun(r) {
  let best = 0, cur = 0;
  for (const d of r.drafts) { cur = d ? cur + 1 : 0; best = Math.max(best, cur); }
  return r.tokens ? best : "–";
}

function renderLive() {
  const r = state.busy ? state.busy.reply : null;
  const s = state.session;
  let tps, tau, acc;
  if (r) {
    tps = r.tps(); tau = r.tau(); acc = r.drafted ? r.accepted / r.drafted : null;
  } else {
    tps = s.ms ? 1000 * s.tokens / s.ms : 0; tau = s.cycles ? s.committed / s.cycles : 0; acc = s.drafted ? s.accepted / s.drafted : null;
  }
  $("live-tps").textContent = tps ? tps.toFixed(1) : "–";
  $("live-tau").textContent = tau ? tau.toFixed(2) : "–";
  $("live-acc").textContent = acc === null ? "–" : pct(acc);
  $("live").classList.toggle("on", !!r);
}

function renderModel() {
  const i = state.info;
  if (!i) return;
  $("model-name").textContent = i.id;
  $("model-kind").textContent = i.drafter === "none" ? "plain" : i.drafter;
  document.title = `${i.id} · localflash`;
  const rows = [
    ["model", i.id],
    ["pair", i.pair || "–"],
    ["target", basename(i.target), i.target],
    ["drafter", i.drafter === "none" ? "none (plain decoding)" : i.drafter + (i.drafter_file ? ` · ${basename(i.drafter_file)}` : ""), i.drafter_file || ""],
    ["draft length", i.draft_max ? `≤ ${i.draft_max}, ${i.adaptive ? "adaptive" : "fixed"}` : "–"],
    ["context", `${i.n_ctx.toLocaleString("en")} tokens`],
    ["slots", `${i.slots.decoding} decoding, ${i.slots.queue} may wait`],
    ["threads", i.threads || "auto"],
  ];
  const p = i.plan;
  if (p) {
    rows.push(["KV cache", `${p.type_k}/${p.type_v}`]);
    rows.push(["GPU layers", p.n_gpu_layers]);
    for (const d of p.devices) rows.push([d.name, `${gib(d.used)} of ${gib(d.budget)} GiB`, `layers ${d.layers || "–"}`]);
    rows.push(["host", `${gib(p.host.used)} GiB`, "weights and buffers in host memory"]);
    if (p.drafter) rows.push(["drafter on", p.drafter_device === null ? "host" : `GPU${p.drafter_device}`]);
  }
  $("model-card").innerHTML = rows.map(([k, v, title]) => `<div${title ? ` title="${esc(String(title))}"` : ""}><dt>${esc(k)}</dt><dd>${esc(String(v))}</dd></div>`).join("");
  $("thinking-note").textContent = i.thinking ? "" : "this model has no switch";
  $("set-thinking").disabled = !i.thinking;
  $("set-drafting").disabled = !i.draft_max;
  if (!i.draft_max) $("drafting-note").textContent = "this server decodes without a drafter";
  $("input").placeholder = `Message ${i.id}…`;
}

const basename = (p) => String(p).split(/[\\/]/).pop();
const gib = (b) => (b / 2 ** 30).toFixed(2);

// -- the conversation -------------------------------------------------------------------------------------

function messageEl(role) {
  const el = document.createElement("article");
  el.className = `msg ${role}`;
  el.innerHTML = `<div class="who">${role === "user" ? "You" : "Assistant"}</div><div class="body"></div><div class="foot"></div>` +
    `<div class="tools"></div>`;
  $("log").appendChild(el);
  $("welcome").hidden = true;
  return el;
}

function toolsHTML(turn, isLastUser) {
  const b = [];
  b.push('<button type="button" class="tool copy" title="Copy this message">Copy</button>');
  if (turn.role === "assistant") b.push(`<button type="button" class="tool view" aria-pressed="${turn.reply.view === "tokens"}" title="Show the raw text token by token">Tokens</button>`);
  if (isLastUser) b.push('<button type="button" class="tool edit" title="Edit and send again (↑ in an empty box)">Edit</button>');
  return b.join("");
}

function refreshTools() {
  const lastUser = lastUserIndex();
  state.turns.forEach((turn, k) => { turn.el.querySelector(".tools").innerHTML = toolsHTML(turn, k === lastUser && !state.busy); });
}

function lastUserIndex() {
  for (let k = state.turns.length - 1; k >= 0; k--) if (state.turns[k].role === "user") return k;
  return -1;
}

function addUser(text) {
  const el = messageEl("user");
  el.querySelector(".body").textContent = text;
  state.turns.push({ role: "user", content: text, el });
}

function history() {
  const msgs = [];
  if (state.settings.system.trim()) msgs.push({ role: "system", content: state.settings.system });
  for (const t of state.turns) {
    if (t.role === "user") msgs.push({ role: "user", content: t.content });
    else if (!t.reply.error && t.reply.text) msgs.push({ role: "assistant", content: t.reply.answer() });
  }
  return msgs;
}

function requestBody() {
  const s = state.settings;
  const body = {
    messages: history(), stream: true, stream_options: { include_usage: true },
    temperature: s.temperature, top_p: s.top_p, top_k: s.top_k, max_tokens: s.max_tokens,
  };
  if (!s.drafting) body["speculative.n_max"] = 0; // llama-server's name: no drafting for this request
  if (s.thinking !== "auto" && state.info && state.info.thinking) body.chat_template_kwargs = { enable_thinking: s.thinking === "on" };
  return body;
}

async function send(text) {
  if (state.busy || !text.trim()) return;
  addUser(text);
  const el = messageEl("assistant");
  const reply = new Reply(el);
  const turn = { role: "assistant", reply, el };
  const body = requestBody();
  state.turns.push(turn);
  const ctrl = new AbortController();
  state.busy = { ctrl, reply };
  setBusy(true);
  refreshTools();
  renderReply(reply);
  scrollDown(true);
  let frame = 0;
  const paint = () => { frame = 0; renderReply(reply); renderSide(); scrollDown(); };
  try {
    const resp = await api("/v1/chat/completions", { method: "POST", body: JSON.stringify(body), signal: ctrl.signal });
    if (!resp.ok) throw new Error(await errorText(resp));
    for await (const data of sseData(resp)) {
      if (data === "[DONE]") break;
      const obj = JSON.parse(data);
      if (obj.error) throw new Error(obj.error.message);
      reply.add(obj);
      if (!frame) frame = requestAnimationFrame(paint);
    }
    reply.state = "done";
  } catch (e) {
    if (e.name === "AbortError") reply.state = "stopped";
    else { reply.state = "error"; reply.error = e.message || String(e); }
  }
  if (frame) cancelAnimationFrame(frame);
  state.busy = null;
  if (reply.tokens) { addToSession(reply); state.last = reply; }
  renderReply(reply);
  setBusy(false);
  refreshTools();
  renderSide();
  scrollDown();
}

function addToSession(r) {
  const s = state.session, t = r.timings;
  s.replies++;
  s.tokens += t ? t.predicted_n : r.tokens;
  s.drafted += t ? t.draft_n : r.drafted;
  s.accepted += t ? t.draft_n_accepted : r.accepted;
  s.committed += r.committed;
  s.cycles += r.cycles;
  s.ms += t ? t.predicted_ms : (r.tFirst ? performance.now() - r.tFirst : 0);
  r.tries.forEach((v, j) => bump(s.tries, j, v));
  r.hits.forEach((v, j) => bump(s.hits, j, v));
}

function stop() { if (state.busy) state.busy.ctrl.abort(); }

function clearChat() {
  stop();
  state.turns = [];
  state.last = null;
  $("log").innerHTML = "";
  $("welcome").hidden = false;
  renderSide();
  $("input").focus();
}

function editLast() {
  if (state.busy) return;
  const k = lastUserIndex();
  if (k < 0) return;
  const turn = state.turns[k];
  const body = turn.el.querySelector(".body");
  if (body.querySelector("textarea")) { body.querySelector("textarea").focus(); return; }
  body.innerHTML = '<textarea class="edit-box" rows="2" aria-label="Edit the message"></textarea>' +
    '<div class="edit-actions"><button type="button" class="btn ghost edit-cancel">Cancel</button><button type="button" class="btn primary edit-send">Send</button></div>';
  const ta = body.querySelector("textarea");
  ta.value = turn.content;
  autosize(ta);
  ta.focus();
  ta.setSelectionRange(ta.value.length, ta.value.length);
  const cancel = () => { body.textContent = turn.content; $("input").focus(); };
  const resend = () => {
    const text = ta.value;
    if (!text.trim()) return;
    for (const t of state.turns.splice(k)) t.el.remove();
    send(text);
    $("input").focus();
  };
  body.querySelector(".edit-cancel").onclick = cancel;
  body.querySelector(".edit-send").onclick = resend;
  ta.addEventListener("input", () => autosize(ta));
  ta.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) { e.preventDefault(); resend(); }
    else if (e.key === "Escape") { e.preventDefault(); e.stopPropagation(); cancel(); }
  });
}

// -- the server ---------------------------------------------------------------------------------------------

function api(path, opts = {}) {
  const headers = { "Content-Type": "application/json" };
  if (state.key) headers.Authorization = `Bearer ${state.key}`;
  return fetch(path, { ...opts, headers }).then((resp) => {
    if (resp.status === 401) askKey(state.key ? "The server did not accept that key." : "");
    return resp;
  });
}

async function errorText(resp) {
  try { const j = await resp.json(); return (j.error && j.error.message) || `HTTP ${resp.status}`; } catch { return `HTTP ${resp.status}`; }
}

async function* sseData(resp) {
  const reader = resp.body.getReader();
  const dec = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buf += dec.decode(value, { stream: true });
    let m;
    while ((m = /\r?\n\r?\n/.exec(buf))) {
      const event = buf.slice(0, m.index);
      buf = buf.slice(m.index + m[0].length);
      const data = event.split(/\r?\n/).filter((l) => l.startsWith("data:")).map((l) => l.slice(5).replace(/^ /, "")).join("\n");
      if (data) yield data;
    }
  }
}

async function loadInfo() {
  const resp = await api("/v1/localflash/info");
  if (resp.status === 401) return;
  if (!resp.ok) { $("model-name").textContent = "server error"; return; }
  state.info = await resp.json();
  renderModel();
}

function askKey(message) {
  const dlg = $("keydlg");
  $("key-error").hidden = !message;
  $("key-error").textContent = message || "";
  if (!dlg.open) dlg.showModal();
  $("key-input").focus();
}

// -- settings ---------------------------------------------------------------------------------------------

const NUMS = ["temperature", "top_p", "top_k", "max_tokens"];

function fillSettings() {
  const s = state.settings;
  $("set-system").value = s.system;
  for (const k of NUMS) $(`set-${k}`).value = s[k];
  $("set-drafting").checked = s.drafting && !(state.info && !state.info.draft_max);
  $("set-thinking").value = s.thinking;
  $("set-show_thinking").checked = s.show_thinking;
  if (state.info) $("set-max_tokens").max = state.info.n_ctx;
}

function readSettings() {
  const s = state.settings;
  s.system = $("set-system").value;
  for (const k of NUMS) {
    const el = $(`set-${k}`);
    let v = Number(el.value);
    if (el.value === "" || !Number.isFinite(v)) v = DEFAULTS[k];
    v = Math.min(Number(el.max || Infinity), Math.max(Number(el.min || 0), v));
    s[k] = k === "top_k" || k === "max_tokens" ? Math.round(v) : v;
    if (k === "top_p" && s[k] <= 0) s[k] = 0.01;
  }
  if (!$("set-drafting").disabled) s.drafting = $("set-drafting").checked;
  s.thinking = $("set-thinking").value;
  s.show_thinking = $("set-show_thinking").checked;
  document.body.classList.toggle("no-drafting", !s.drafting);
}

// -- the page ---------------------------------------------------------------------------------------------

function setBusy(on) {
  document.body.classList.toggle("busy", on);
  $("send").title = on ? "Stop (Esc)" : "Send (Enter)";
  $("send").setAttribute("aria-label", on ? "Stop" : "Send");
}

function autosize(ta) {
  ta.style.height = "auto";
  ta.style.height = `${Math.min(ta.scrollHeight, 220)}px`;
}

function scrollDown(force = false) {
  const el = document.scrollingElement;
  const near = el.scrollHeight - el.scrollTop - el.clientHeight < 160;
  if (force || near) el.scrollTop = el.scrollHeight;
}

function toast(msg) {
  const t = $("toast");
  t.textContent = msg;
  t.classList.add("show");
  clearTimeout(toast.timer);
  toast.timer = setTimeout(() => t.classList.remove("show"), 1600);
}

async function copyText(text) {
  try { await navigator.clipboard.writeText(text); } catch {
    const ta = document.createElement("textarea");
    ta.value = text; document.body.appendChild(ta); ta.select(); document.execCommand("copy"); ta.remove();
  }
  toast("Copied");
}

function setSide(open) {
  document.body.classList.toggle("side-open", open);
  $("side-btn").setAttribute("aria-expanded", String(open));
  if (open) $("side-close").focus();
}

function init() {
  const input = $("input");
  $("composer").addEventListener("submit", (e) => {
    e.preventDefault();
    if (state.busy) { stop(); return; }
    const text = input.value;
    if (!text.trim()) return;
    input.value = "";
    autosize(input);
    send(text);
  });
  input.addEventListener("input", () => autosize(input));
  input.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      if (!state.busy) $("composer").requestSubmit();
    } else if (e.key === "ArrowUp" && !input.value) {
      e.preventDefault();
      editLast();
    }
  });
  document.addEventListener("keydown", (e) => {
    if (e.key !== "Escape" || document.querySelector("dialog[open]")) return;
    if (state.busy) { e.preventDefault(); stop(); }
    else if (document.body.classList.contains("side-open")) { setSide(false); $("side-btn").focus(); }
  });
  $("log").addEventListener("click", (e) => {
    const btn = e.target.closest("button");
    if (!btn) return;
    const el = btn.closest(".msg");
    const turn = state.turns.find((t) => t.el === el);
    if (btn.classList.contains("copy-code")) { copyText(btn.closest(".code").querySelector("code").textContent); return; }
    if (!turn) return;
    if (btn.classList.contains("copy")) copyText(turn.role === "user" ? turn.content : turn.reply.answer());
    else if (btn.classList.contains("view")) {
      turn.reply.view = turn.reply.view === "tokens" ? "md" : "tokens";
      btn.setAttribute("aria-pressed", String(turn.reply.view === "tokens"));
      renderReply(turn.reply);
    } else if (btn.classList.contains("edit")) editLast();
  });
  $("suggestions").addEventListener("click", (e) => {
    const b = e.target.closest("button.suggest");
    if (b) send(b.textContent);
  });
  $("clear-btn").onclick = clearChat;
  $("settings-btn").onclick = () => { fillSettings(); $("settings").showModal(); };
  $("settings").addEventListener("close", () => { readSettings(); input.focus(); });
  $("settings-reset").onclick = () => { state.settings = { ...DEFAULTS }; fillSettings(); };
  $("side-btn").onclick = () => setSide(!document.body.classList.contains("side-open"));
  $("model-chip").onclick = () => { setSide(true); $("model-h").scrollIntoView({ block: "nearest" }); };
  $("side-close").onclick = () => { setSide(false); $("side-btn").focus(); };
  $("key-form").addEventListener("submit", () => {
    state.key = $("key-input").value.trim();
    sessionStorage.setItem(KEY, state.key);
    setTimeout(loadInfo, 0);
  });
  $("keydlg").addEventListener("cancel", (e) => e.preventDefault());
  renderSide();
  loadInfo();
  input.focus();
}

document.addEventListener("DOMContentLoaded", init);
window.localflashPage = { markdown, esc, splitThink, Reply, renderReply, state }; // for the browser test and the curious
