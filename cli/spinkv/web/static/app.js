// The chat page: UI only. The model runs in worker.js.
const $ = (id) => document.getElementById(id);
const worker = new Worker("/static/worker.js", { type: "module" });
const pending = new Map();
let nextId = 1;
let onEvent = () => {};

function request(type, args = {}) {
  const id = nextId++;
  worker.postMessage({ id, type, ...args });
  return new Promise((resolve, reject) => pending.set(id, { resolve, reject }));
}

worker.onmessage = ({ data }) => {
  if (data.event) return onEvent(data);
  const waiter = pending.get(data.id);
  if (!waiter) return;
  pending.delete(data.id);
  if (data.ok) waiter.resolve(data.result);
  else {
    const error = new Error(data.error);
    error.kind = data.kind;
    error.fields = data.fields;
    waiter.reject(error);
  }
};
worker.onerror = (e) => setStatus("error", `worker failed: ${e.message}`);

// ---- state -----------------------------------------------------------------------------
const state = {
  messages: [], // [{role, content}] without the system prompt (as the CLI's transcript)
  created: null,
  busy: false,
  ready: false,
  manifest: null,
  load: null,
  presets: [],
  turns: [],
};
window.spinkv = { state, request, saveAs: (name) => save(name), open: (name, source) => openSession(name, source) }; // for tests and the curious

function setStatus(kind, text) {
  $("status").className = `status ${kind}`;
  $("status-text").textContent = text;
}

function fmtBytes(n) {
  if (n == null) return "–";
  const units = ["B", "KiB", "MiB", "GiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(i === 0 ? 0 : 1)} ${units[i]}`;
}
const fmtMs = (ms) => (ms == null ? "–" : ms >= 1000 ? `${(ms / 1000).toFixed(2)} s` : `${ms.toFixed(ms < 10 ? 1 : 0)} ms`);
const fmtRate = (r) => (r ? `${r.toFixed(1)} tok/s` : "–");
const esc = (s) => String(s).replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c]);

// ---- messages --------------------------------------------------------------------------
function addMessage(role, text = "") {
  $("empty")?.remove();
  const row = document.createElement("div");
  row.className = `msg ${role}`;
  row.innerHTML = `<div class="who">${role === "user" ? "You" : "AI"}</div><div><div class="body"></div><div class="meta"></div></div>`;
  row.querySelector(".body").textContent = text;
  $("messages").appendChild(row);
  row.scrollIntoView({ block: "end" });
  return row;
}

function renderConversation() {
  $("messages").innerHTML = "";
  for (const m of state.messages) addMessage(m.role, m.content);
}

function conversation() {
  const system = $("system").value.trim();
  return (system ? [{ role: "system", content: system }] : []).concat(state.messages);
}

function sampling() {
  const temperature = Number($("temperature").value) || 0;
  const seed = $("seed").value === "" ? null : Number($("seed").value);
  return temperature > 0
    ? { temperature, top_k: 40, top_p: 0.9, repetition_penalty: 1.1, repeat_last_n: 64, seed }
    : { temperature: 0 };
}

function timingLine(turn) {
  const t = turn.timings;
  return [
    `tokenize ${fmtMs(turn.tokenize_ms)}`,
    `prefill ${t.prefill_tokens} tok ${fmtMs(t.prefill_ms)} (${fmtRate(t.prefill_tok_per_s)})`,
    `first token ${fmtMs(turn.first_token_ms)}`,
    `decode ${t.decode_tokens} tok ${fmtMs(t.decode_ms)} (${fmtRate(t.decode_tok_per_s)})`,
    `sampling ${fmtMs(t.sample_ms)}`,
    turn.cached_tokens ? `${turn.cached_tokens} cached` : null,
    "simd128 · 1 thread",
  ].filter(Boolean).join(" · ");
}

async function send(text) {
  if (!state.ready || state.busy || !text.trim()) return;
  state.busy = true;
  setBusy(true);
  state.messages.push({ role: "user", content: text });
  addMessage("user", text);
  const row = addMessage("assistant");
  row.classList.add("streaming");
  const body = row.querySelector(".body");
  let reply = "";
  onEvent = (e) => {
    if (e.event === "piece") {
      reply += e.piece;
      body.textContent = reply;
      row.scrollIntoView({ block: "end" });
    }
  };
  try {
    const turn = await request("chat", {
      messages: conversation(),
      sampling: sampling(),
      max_tokens: Number($("max-tokens").value) || 512,
    });
    reply = turn.text;
    body.textContent = reply;
    state.messages.push({ role: "assistant", content: reply });
    state.turns.push(turn);
    const why = { stop: "", length: " · stopped at max tokens", context: " · context full", interrupted: " · stopped" }[turn.reason] ?? "";
    row.querySelector(".meta").textContent = `${turn.completion_tokens} tokens${why}`;
    $("timing").textContent = timingLine(turn);
    showStats(turn.stats);
    state.created ??= new Date().toISOString();
  } catch (e) {
    row.classList.add("error");
    body.textContent = `error: ${e.message}`;
    state.messages.pop();
  } finally {
    row.classList.remove("streaming");
    state.busy = false;
    setBusy(false);
    onEvent = () => {};
  }
}

function setBusy(busy) {
  $("send").classList.toggle("hidden", busy);
  $("stop").classList.toggle("hidden", !busy);
  $("input").disabled = !state.ready;
  setStatus(busy ? "busy" : "ready", busy ? "generating" : "ready");
}

// ---- stats -----------------------------------------------------------------------------
function table(rows) {
  return `<table>${rows.map(([k, v]) => `<tr><th>${esc(k)}</th><td>${esc(v)}</td></tr>`).join("")}</table>`;
}

function showStats(s) {
  if (!s) return;
  const parts = [];
  const turn = s.last_turn && s.last_turn.timings ? s.last_turn : null;
  if (turn) {
    const t = turn.timings;
    parts.push("<h4>Last reply</h4>" + table([
      ["tokenize", fmtMs(turn.tokenize_ms)],
      ["prefill", `${t.prefill_tokens} tok · ${fmtMs(t.prefill_ms)} · ${fmtRate(t.prefill_tok_per_s)}`],
      ["first token", fmtMs(turn.first_token_ms)],
      ["decode", `${t.decode_tokens} tok · ${fmtMs(t.decode_ms)} · ${fmtRate(t.decode_tok_per_s)}`],
      ["sampling", fmtMs(t.sample_ms)],
      ["attention / matmul / other", `${fmtMs(t.attention_ms)} / ${fmtMs(t.matmul_ms)} / ${fmtMs(t.other_ms)}`],
    ]));
  }
  if (s.cache) {
    const c = s.cache;
    parts.push("<h4>KV cache</h4>" + table([
      ["codec", c.codec],
      ["tokens (cached / max)", `${s.session.cache_len} / ${s.session.max_context}${s.session.retired_tokens ? ` · ${s.session.retired_tokens} slid out` : ""}${s.session.context_start ? ` · fed from message ${s.session.context_start + 1}` : ""}`],
      ["compressed / fp16 tokens (per layer)", `${c.total.compressed_tokens / c.layers.length} / ${c.total.fp16_tokens / c.layers.length}`],
      ["payload K + V", fmtBytes(c.total.k_payload_bytes + c.total.v_payload_bytes)],
      ["norms + headers", fmtBytes(c.total.norm_bytes + c.total.header_bytes)],
      ["recent window", fmtBytes(c.total.window_bytes)],
      ["allocated (used pages)", fmtBytes(c.total.allocated_bytes)],
      ["pool (reserved)", fmtBytes(c.pool_bytes)],
      ["bits / channel", c.total.bits_per_channel ? c.total.bits_per_channel.toFixed(2) : "–"],
      ["vs fp16", c.total.compression_vs_fp16 ? `${c.total.compression_vs_fp16.toFixed(2)}×` : "–"],
    ]));
  }
  const m = s.memory;
  parts.push("<h4>Wasm memory</h4>" + table([
    ["pages (64 KiB)", `${m.pages} (${fmtBytes(m.bytes)})`],
    ["peak pages", m.peak_pages],
    ["growth events (all)", m.growth_events],
    ["growth since warm-up", m.growth_since_mark],
    ["growth during decode", m.growth_during_decode],
  ]));
  if (state.load) {
    parts.push("<h4>Model</h4>" + table([
      ["weights", `${fmtBytes(state.load.load.file_bytes)} ${state.load.load.dtype}`],
      ["download", fmtMs(state.load.times.download_ms)],
      ["load + checks", fmtMs(state.load.load.load_ms)],
      ["content hash", fmtMs(state.load.load.hash_ms)],
      ["page → ready", fmtMs(state.load.times.total_ms)],
    ]));
  }
  $("stats").innerHTML = parts.join("");
}

async function refreshStats() {
  if (state.ready) showStats(await request("stats"));
}

// ---- sessions --------------------------------------------------------------------------
function transcript() {
  const now = new Date().toISOString();
  return JSON.stringify({
    format: "spinkv-transcript",
    version: 1,
    kind: "chat",
    model: { name: state.manifest.name, path: `browser:${state.manifest.name}` },
    kv: { preset: $("preset").value },
    system: $("system").value.trim() || null,
    messages: state.messages,
    sampling: sampling(),
    max_tokens: Number($("max-tokens").value) || 512,
    created: state.created ?? now,
    updated: now,
  });
}

function note(text, kind = "") {
  $("session-note").className = `note ${kind}`;
  $("session-note").textContent = text;
}

async function refreshSessions() {
  const mine = await request("list");
  $("session-list").innerHTML = mine.length ? "" : '<li class="muted">none yet</li>';
  for (const s of mine) {
    const li = document.createElement("li");
    li.innerHTML = `<span title="${esc(s.name)}">${esc(s.name)} <span class="muted small">${fmtBytes(s.bytes)}</span></span>`;
    for (const [label, action] of [["Open", () => openSession(s.name, "browser")], ["To CLI", () => toCli(s.name)], ["Download", () => download(s.name)], ["✕", () => remove(s.name)]]) {
      const b = document.createElement("button");
      b.textContent = label;
      b.onclick = action;
      li.appendChild(b);
    }
    $("session-list").appendChild(li);
  }
  const store = await (await fetch("/api/sessions")).json();
  $("store-list").innerHTML = store.length ? "" : '<li class="muted">none</li>';
  for (const s of store) {
    const li = document.createElement("li");
    li.innerHTML = `<span>${esc(s.name)} <span class="muted small">${fmtBytes(s.bytes)}</span></span>`;
    const b = document.createElement("button");
    b.textContent = "Open";
    b.onclick = () => openSession(s.name, "store");
    li.appendChild(b);
    $("store-list").appendChild(li);
  }
}

function applyTranscript(t) {
  state.messages = (t.messages || []).map((m) => ({ role: m.role, content: m.content }));
  $("system").value = t.system || "";
  if (t.kv?.preset) $("preset").value = t.kv.preset;
  if (t.max_tokens) $("max-tokens").value = t.max_tokens;
  state.created = t.created || null;
  renderConversation();
}

async function openSession(name, source, bytes) {
  if (state.busy) return;
  try {
    const out = await request("restore", { name, source, bytes });
    applyTranscript(out.transcript);
    showStats(out.stats);
    if (out.reused) note(`${name}: conversation and KV cache restored (${out.stats.session.tokens} tokens); the next turn continues it`, "ok");
    else note(`${name}: conversation restored, KV cache refused — ${out.refused.error}${out.refused.fields.length ? ` (differing: ${out.refused.fields.join(", ")})` : ""}; the next turn recomputes it`, "error");
    return { reused: out.reused, refused: out.refused, tokens: out.stats.session.tokens, messages: state.messages.length };
  } catch (e) {
    note(`cannot open ${name}: ${e.message}`, "error");
    return { error: e.message };
  }
}

async function save(given) {
  const name = (given ?? $("session-name").value).trim();
  if (!/^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$/.test(name)) return note("a session name is letters, digits, '.', '_' or '-'", "error");
  try {
    const out = await request("save", { name, transcript: transcript() });
    note(`saved ${name}: ${fmtBytes(out.bytes)}, ${out.tokens} tokens`, "ok");
    refreshSessions();
    return out;
  } catch (e) {
    note(`cannot save: ${e.message}`, "error");
    return { error: e.message };
  }
}

async function toCli(name) {
  try {
    const out = await request("export", { name, target: "store" });
    note(`copied to the CLI's store: spinkv chat --session ${out.name}`, "ok");
    refreshSessions();
  } catch (e) {
    note(`cannot export: ${e.message}`, "error");
  }
}

async function download(name) {
  const out = await request("export", { name, target: "file" });
  const a = document.createElement("a");
  a.href = URL.createObjectURL(new Blob([out.bytes]));
  a.download = `${name}.spkv`;
  a.click();
}

async function remove(name) {
  await request("delete", { name });
  refreshSessions();
}

// ---- start -----------------------------------------------------------------------------
async function newChat() {
  if (state.busy) return;
  await request("session", { kv: { preset: $("preset").value } });
  state.messages = [];
  state.created = null;
  renderConversation();
  $("timing").textContent = "";
  refreshStats();
}

async function start() {
  setStatus("", "loading");
  $("progress").classList.remove("hidden");
  onEvent = (e) => {
    if (e.event === "progress") {
      const pct = e.total ? (100 * e.done) / e.total : 0;
      $("progress-bar").style.width = `${pct}%`;
      $("progress-text").textContent = `${e.text} · ${fmtBytes(e.done)} / ${fmtBytes(e.total)}`;
    }
  };
  try {
    const loaded = await request("init");
    state.load = loaded;
    state.manifest = loaded.manifest;
    $("model-name").textContent = `${loaded.manifest.name} · ${fmtBytes(loaded.load.file_bytes)} ${loaded.load.dtype} · ${loaded.load.n_layers} layers`;
    for (const p of loaded.info.presets) {
      const o = document.createElement("option");
      o.value = o.textContent = p;
      $("preset").appendChild(o);
    }
    $("preset").value = loaded.info.default_preset;
    await request("session", { kv: { preset: $("preset").value } });
    state.ready = true;
    $("progress").classList.add("hidden");
    $("input").disabled = false;
    $("send").disabled = false;
    setStatus("ready", `ready in ${fmtMs(loaded.times.total_ms)}`);
    refreshStats();
    refreshSessions();
    $("input").focus();
  } catch (e) {
    setStatus("error", "failed");
    $("progress-text").textContent = `error: ${e.message}`;
  }
}

$("composer").onsubmit = (e) => {
  e.preventDefault();
  const text = $("input").value;
  $("input").value = "";
  send(text);
};
$("input").onkeydown = (e) => {
  if (e.key === "Enter" && !e.shiftKey) {
    e.preventDefault();
    $("composer").requestSubmit();
  }
};
$("stop").onclick = () => worker.postMessage({ type: "stop" });
$("new-chat").onclick = newChat;
$("preset").onchange = newChat;
$("save-session").onclick = () => save();
$("import-file").onchange = async (e) => {
  const file = e.target.files[0];
  if (file) openSession(file.name.replace(/\.spkv$/, ""), "file", await file.arrayBuffer());
};
for (const b of document.querySelectorAll(".suggestion")) b.onclick = () => send(b.textContent);
$("bench").onclick = async () => {
  if (state.busy) return;
  state.busy = true;
  $("bench").disabled = true;
  $("bench-out").innerHTML = '<p class="muted">running…</p>';
  const rows = [];
  try {
    for (const kv of ["fp16", "turbo"]) {
      const out = await request("bench", { kv, depths: [512, 4096], n: 32 });
      for (const r of out.rows) rows.push([`${kv} @ ${r.depth}`, fmtRate(r.decode_tok_per_s)]);
      $("bench-out").innerHTML = table(rows);
    }
  } catch (e) {
    $("bench-out").textContent = `error: ${e.message}`;
  } finally {
    state.busy = false;
    $("bench").disabled = false;
  }
};

start();
