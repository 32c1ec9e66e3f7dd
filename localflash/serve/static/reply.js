// One assistant reply: its text, its tokens and how each was made (from the `localflash` field of
// the streamed chunks: {"drafted": k, "accepted": m, "chars": [c0, ...], "phase"}; chars[i] is how
// many characters token i added to the text, the first m tokens are accepted drafts), its figures,
// and its HTML (Markdown or token by token, each token a span tinted by how it was made).

import { esc, markdown } from "./markdown.js";

// -- a reply: its text, its tokens and where they came from -----------------------------------------

export class Reply {
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

export function bump(a, i, by = 1) { while (a.length <= i) a.push(0); a[i] += by; }

// a reply's thinking block: <think>…</think> at its start, or up to </think> when the template opened it
export function splitThink(text, preopened = false) {
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

// opts: {showThinking, noDrafts: what the footer says when a reply drafted nothing}
export function renderReply(r, opts) {
  const body = r.el.querySelector(".body");
  const tint = r.tinter();
  let html = "";
  if (r.view === "tokens") {
    html = `<div class="raw">${r.text ? tint(0, r.text.length) : ""}</div>`;
  } else {
    const th = splitThink(r.text, r.preopened);
    let from = 0;
    if (th.think) {
      const open = opts.showThinking ? " open" : "";
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
  r.el.querySelector(".foot").innerHTML = footHTML(r, opts);
}

function footHTML(r, opts) {
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
    parts.push(`<span>${opts.noDrafts}</span>`);
  }
  if (r.usage) parts.push(`<span title="prompt tokens (reused from the cache)">prompt ${r.usage.prompt_tokens} (${r.usage.prompt_tokens_details.cached_tokens} cached)</span>`);
  if (r.state === "stopped") parts.push('<span class="badge">stopped</span>');
  if (r.finish === "length") parts.push('<span class="badge">max tokens</span>');
  let html = `<div class="stats">${parts.join("")}</div>`;
  if (r.drafted && r.tries.length) html += `<div class="mini" title="acceptance by draft position (this reply)">${chartSVG(r.tries, r.hits, true)}<span>by position</span></div>`;
  return html;
}

export const pct = (x) => `${Math.round(100 * x)}%`;

// bars: acceptance at each draft position (hits / tries)
export function chartSVG(tries, hits, mini = false) {
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
