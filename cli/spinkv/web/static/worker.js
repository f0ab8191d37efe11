// The model's thread: the wasm runtime, the model download, chat turns, sessions (OPFS) and
// the benchmark. The page talks to it with messages {id, type, ...}; replies carry the same
// id ({id, ok, result} or {id, ok: false, error, kind, fields}); streamed tokens and download
// progress come as {event: ...} messages.
import { SpinKV, SpinKVError } from "./spinkv.js";

let rt = null;
let manifest = null;
let stopRequested = false;
const loadTimes = {};

const post = (message) => self.postMessage(message);
const event = (name, data = {}) => post({ event: name, ...data });

// Lets queued messages (a stop) run between decode steps without setTimeout's 4 ms clamp.
const channel = new MessageChannel();
const yieldToEvents = () =>
  new Promise((resolve) => {
    channel.port1.onmessage = () => resolve();
    channel.port2.postMessage(0);
  });

async function sessionsDir() {
  const root = await navigator.storage.getDirectory();
  return root.getDirectoryHandle("sessions", { create: true });
}

async function init() {
  const started = performance.now();
  manifest = await (await fetch("/api/manifest")).json();
  event("progress", { text: "loading the runtime", done: 0, total: 1 });
  rt = await SpinKV.instantiate(await fetch("/spinkv_wasm.wasm"), { log: (l) => console.log(l) });
  loadTimes.runtime_ms = performance.now() - started;
  const total = manifest.files.reduce((n, f) => n + f.bytes, 0);
  let before = 0;
  const files = {};
  const downloadStarted = performance.now();
  for (const file of manifest.files) {
    const response = await fetch(`/model/${file.name}`);
    if (!response.ok) throw new Error(`cannot download ${file.name}: HTTP ${response.status}`);
    files[file.name] = await rt.bufferFromResponse(response, file.bytes, (done) =>
      event("progress", { text: `downloading ${manifest.name}`, done: before + done, total }),
    );
    before += file.bytes;
  }
  loadTimes.download_ms = performance.now() - downloadStarted;
  event("progress", { text: "checking the weights", done: total, total });
  const load = rt.call("load", { ...manifest, files });
  loadTimes.load_ms = load.load_ms;
  loadTimes.total_ms = performance.now() - started;
  const info = rt.call("info");
  return { manifest, load, info, times: loadTimes };
}

function newSession({ kv }) {
  const session = rt.call("session", { kv });
  rt.call("mark");
  return session;
}

async function chat({ messages, sampling, max_tokens }) {
  stopRequested = false;
  const start = rt.call("turn", { messages, sampling, max_tokens });
  event("started", { prompt_tokens: start.prompt_tokens, cached_tokens: start.cached_tokens });
  for (;;) {
    await yieldToEvents();
    if (stopRequested) {
      const end = rt.call("stop");
      if (end.piece) event("piece", { piece: end.piece });
      return { ...end.turn, stats: rt.call("stats") };
    }
    const step = rt.call("step");
    if (step.piece) event("piece", { piece: step.piece });
    if (step.done) return { ...step.turn, stats: rt.call("stats") };
  }
}

async function saveSession({ name, transcript }) {
  const saved = rt.call("save", { transcript });
  const bytes = rt.takeBuffer(saved.buffer);
  const dir = await sessionsDir();
  const handle = await dir.getFileHandle(`${name}.spkv`, { create: true });
  const writable = await handle.createWritable();
  await writable.write(bytes);
  await writable.close();
  return { name, bytes: bytes.length, state_digest: saved.state_digest, tokens: saved.tokens };
}

async function listSessions() {
  const dir = await sessionsDir();
  const out = [];
  for await (const [name, handle] of dir.entries()) {
    if (handle.kind === "file" && name.endsWith(".spkv")) {
      const file = await handle.getFile();
      out.push({ name: name.slice(0, -5), bytes: file.size, modified: file.lastModified });
    }
  }
  return out.sort((a, b) => b.modified - a.modified);
}

async function sessionBytes({ name, source }) {
  if (source === "store") {
    const response = await fetch(`/api/sessions/${encodeURIComponent(name)}`);
    if (!response.ok) throw new Error((await response.json()).error);
    return new Uint8Array(await response.arrayBuffer());
  }
  const dir = await sessionsDir();
  const file = await (await dir.getFileHandle(`${name}.spkv`)).getFile();
  return new Uint8Array(await file.arrayBuffer());
}

// Reads the file's transcript for its cache options, starts a session with them, restores.
async function restoreSession({ name, source, bytes }) {
  const data = bytes ? new Uint8Array(bytes) : await sessionBytes({ name, source });
  const handle = rt.bufferFrom(data);
  const origin = `session ${name}`;
  try {
    const header = rt.call("read_session", { buffer: handle, origin });
    let transcript = null;
    try {
      transcript = JSON.parse(header.transcript);
    } catch {
      throw new SpinKVError({ error: `${origin} has a transcript that is not JSON`, kind: "TranscriptError" });
    }
    const kv = transcript.kv || { preset: "turbo" };
    rt.call("session", { kv });
    let reused = true;
    let refused = null;
    try {
      rt.call("restore", { buffer: handle, origin });
    } catch (e) {
      if (!(e instanceof SpinKVError)) throw e;
      // As the CLI does: the conversation comes back, its cache is recomputed next turn.
      reused = false;
      refused = { error: e.message, kind: e.kind, fields: e.fields };
      rt.call("session", { kv });
    }
    rt.call("mark");
    return { transcript, reused, refused, stats: rt.call("stats"), identity: header.identity };
  } finally {
    rt.freeBuffer(handle);
  }
}

async function exportSession({ name, target }) {
  const bytes = await sessionBytes({ name, source: "browser" });
  if (target === "store") {
    const response = await fetch(`/api/sessions/${encodeURIComponent(name)}`, {
      method: "PUT",
      body: bytes,
    });
    const reply = await response.json();
    if (!response.ok) throw new Error(reply.error);
    return reply;
  }
  return { bytes: bytes.buffer };
}

async function deleteSession({ name }) {
  const dir = await sessionsDir();
  await dir.removeEntry(`${name}.spkv`);
  return { name };
}

const handlers = {
  init,
  session: newSession,
  chat,
  stats: () => rt.call("stats"),
  identity: () => rt.call("identity"),
  save: saveSession,
  list: listSessions,
  restore: restoreSession,
  export: exportSession,
  delete: deleteSession,
  bench: ({ kv, depths, n, repeats }) => rt.call("bench", { kv, depths, n, repeats }),
};

self.onmessage = async ({ data }) => {
  if (data.type === "stop") {
    stopRequested = true;
    return;
  }
  const handler = handlers[data.type];
  try {
    if (!handler) throw new Error(`unknown request ${data.type}`);
    post({ id: data.id, ok: true, result: await handler(data) });
  } catch (e) {
    post({
      id: data.id,
      ok: false,
      error: e instanceof WebAssembly.RuntimeError ? `the runtime stopped: ${e.message}` : e.message,
      kind: e.kind || e.name,
      fields: e.fields || [],
    });
  }
};
