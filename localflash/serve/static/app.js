// localflash chat page: the conversation, settings, the server (POST /v1/chat/completions streamed,
// GET /v1/localflash/info for the model card) and the figures. A reply's tokens and how each was
// made: reply.js; Markdown: markdown.js.
import { esc, markdown } from "./markdown.js";
import { Reply, bump, chartSVG, pct, renderReply as render, splitThink } from "./reply.js";

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

function renderReply(r) {
  const s = state.settings;
  render(r, { showThinking: s.show_thinking, noDrafts: s.drafting && state.info && state.info.draft_max ? "no drafts" : "drafting off" });
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
    ["context", `${i.n_ctx.toLocaleString("en")} tokens${i.slots.parallel > 1 ? " a slot" : ""}`],
    ["slots", `${i.slots.parallel} decoded together, ${i.slots.queue} may wait`],
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
    reasoning_format: "none", // the page splits <think> itself, so the tokens' chars line up with the text
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
    const at = state.turns.indexOf(turn);
    if (state.busy || at < 0) return;
    for (const t of state.turns.splice(at)) t.el.remove();
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
  // read on submit (Enter), which runs before the dialog closes; its "close" event is queued and can reach
  // the page after the next keystroke, and it still covers Esc
  $("settings-form").addEventListener("submit", readSettings);
  $("settings").addEventListener("close", () => {
    readSettings();
    // back to the message box from where the dialog returned focus, never from an edit begun since
    if ([null, document.body, $("settings-btn")].includes(document.activeElement)) input.focus();
  });
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

init(); // a module runs after the document is parsed
window.localflashPage = { markdown, esc, splitThink, Reply, renderReply, state }; // for the browser test and the curious
