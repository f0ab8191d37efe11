// The browser runtime's memory discipline over a long chat, in node (driven by
// benches/web_memory.py):  node web_memory.mjs MODULE.wasm MANIFEST.json MODEL_DIR PLAN.json
//
// PLAN: {kv, target_tokens, reply_tokens, paragraphs: [text...]}. A chat in the model's own
// template: each user turn is the next paragraph (the conversation so far plus the user turn
// are the turn's tokens, as the page sends them), each reply greedy up to reply_tokens. Turn 1
// is the warm-up, then `mark`; the chat goes on until the session holds target_tokens. One
// JSON line per turn on stdout, then {"done": ...} with the memory figures.
import { closeSync, openSync, readFileSync, readSync } from "node:fs";
import { join } from "node:path";
import { fileURLToPath } from "node:url";

const here = fileURLToPath(new URL(".", import.meta.url));
const { SpinKV } = await import(join(here, "..", "cli", "spinkv", "web", "static", "spinkv.js"));
const [wasmPath, manifestPath, modelDir, planPath] = process.argv.slice(2);
const manifest = JSON.parse(readFileSync(manifestPath, "utf8"));
const plan = JSON.parse(readFileSync(planPath, "utf8"));
const rt = await SpinKV.instantiate(readFileSync(wasmPath), { log: (l) => console.error(l) });

const files = {};
for (const f of manifest.files) {
  const handle = rt.newBuffer(f.bytes);
  const fd = openSync(join(modelDir, f.name), "r");
  for (let off = 0; off < f.bytes; ) {
    const n = readSync(fd, rt.bytes(handle), off, Math.min(1 << 24, f.bytes - off), off);
    if (n === 0) throw new Error(`${f.name} ended early`);
    off += n;
  }
  closeSync(fd);
  files[f.name] = handle;
}
const started = performance.now();
const loaded = rt.call("load", { ...manifest, files });
const session = rt.call("session", { kv: plan.kv });
const emit = (record) => console.log(JSON.stringify(record));
emit({ loaded: { load_ms: loaded.load_ms, memory: loaded.memory }, session });

const end = "<|im_end|>\n";
let tokens = 0;
let turn = 0;
let paragraph = 0;
while (tokens < plan.target_tokens) {
  const text = plan.paragraphs[paragraph++ % plan.paragraphs.length];
  // The first turn is the rendered chat; later ones close the last reply and add a user turn
  // (a reply that stopped on <|im_end|> did not feed it, as the native TextStream does not).
  const append =
    turn === 0
      ? rt.call("render", { messages: [{ role: "user", content: text }] }).text
      : `${end}<|im_start|>user\n${text}${end}<|im_start|>assistant\n`;
  const ids = rt.call("tokenize", { text: append }).ids;
  const room = plan.target_tokens - tokens;
  if (turn > 0 && ids.length + 1 > room) break;
  const t0 = performance.now();
  const args = { max_tokens: Math.max(1, Math.min(plan.reply_tokens, room - ids.length)) };
  rt.call("turn", turn === 0 ? { ...args, prompt_ids: ids } : { ...args, append_ids: ids });
  const prefillMs = performance.now() - t0;
  let result;
  for (;;) {
    const step = rt.call("step");
    if (step.done) {
      result = step.turn;
      break;
    }
  }
  const stats = rt.call("stats");
  tokens = stats.session.tokens;
  turn += 1;
  emit({
    turn,
    tokens,
    user_tokens: ids.length,
    reply_tokens: result.completion_tokens,
    prefill_ms: prefillMs,
    total_ms: result.total_ms,
    decode_tok_per_s: result.timings.decode_tok_per_s,
    cache_bytes: stats.cache.pool_bytes,
    memory: stats.memory,
  });
  if (turn === 1) rt.call("mark");
}
const stats = rt.call("stats");
emit({ done: { tokens, turns: turn, wall_s: (performance.now() - started) / 1000, memory: stats.memory, codec: stats.cache.codec } });
