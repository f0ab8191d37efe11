// Runs the wasm runtime in node on a model directory, for tests and `spinkv bench --isa
// simd128`:  node runtime.mjs MODULE.wasm MANIFEST.json MODEL_DIR < calls.json
//
// calls.json is a list of runtime calls ({"op": ..., ...}, see crates/spinkv-wasm/src/engine.rs)
// plus four done here:
//   {"op": "load"}                      read MODEL_DIR's files into wasm buffers and load them
//   {"op": "chat", messages|prompt_ids, sampling, max_tokens}   turn + steps until done
//   {"op": "save_file", "path", "transcript"}   save the session into a file
//   {"op": "restore_file", "path"} / {"op": "read_file", "path"}  a session file from disk
// One JSON line per call on stdout: {"ok": true, "result": ...} or {"ok": false, "error",
// "kind", "fields"}. Exit status 1 when a call failed, unless it said "expect_error": true.
//
// With --serve (after MODEL_DIR) the calls come one JSON line at a time on stdin and each is
// answered before the next is read (`spinkv bench --isa simd128` times the runtime this way).
import { closeSync, openSync, readFileSync, readSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { createInterface } from "node:readline";
import { SpinKV, SpinKVError } from "../../cli/spinkv/web/static/spinkv.js";

const [wasmPath, manifestPath, modelDir, mode] = process.argv.slice(2);
if (!wasmPath || !manifestPath || !modelDir) {
  console.error("usage: node runtime.mjs MODULE.wasm MANIFEST.json MODEL_DIR [--serve] < calls");
  process.exit(2);
}
const manifest = JSON.parse(readFileSync(manifestPath, "utf8"));
const serve = mode === "--serve";
const calls = serve ? [] : JSON.parse(readFileSync(0, "utf8"));
const rt = await SpinKV.instantiate(readFileSync(wasmPath), {
  log: (line) => console.error(line),
});

function fileIntoBuffer(path, size) {
  const handle = rt.newBuffer(size);
  const fd = openSync(path, "r");
  let offset = 0;
  while (offset < size) {
    const view = rt.bytes(handle);
    const n = readSync(fd, view, offset, Math.min(1 << 24, size - offset), offset);
    if (n === 0) throw new Error(`${path} ended after ${offset} of ${size} bytes`);
    offset += n;
  }
  closeSync(fd);
  return handle;
}

function run(call) {
  const { op, ...args } = call;
  if (op === "load") {
    const files = {};
    for (const f of manifest.files) files[f.name] = fileIntoBuffer(join(modelDir, f.name), f.bytes);
    return rt.call("load", { ...manifest, files });
  }
  if (op === "chat") {
    const started = rt.call("turn", args);
    const pieces = [];
    for (;;) {
      const step = rt.call("step");
      if (step.piece) pieces.push(step.piece);
      if (step.done) return { ...started, pieces, ...step.turn };
    }
  }
  if (op === "save_file") {
    const saved = rt.call("save", { transcript: args.transcript ?? "{}" });
    writeFileSync(args.path, rt.takeBuffer(saved.buffer));
    return saved;
  }
  if (op === "restore_file" || op === "read_file") {
    const handle = rt.bufferFrom(readFileSync(args.path));
    try {
      const what = op === "restore_file" ? "restore" : "read_session";
      return rt.call(what, { buffer: handle, origin: `session file ${args.path}` });
    } finally {
      rt.freeBuffer(handle);
    }
  }
  return rt.call(op, args);
}

/** Runs one call; returns its reply line and whether it failed unexpectedly. */
function answer(call) {
  try {
    return [JSON.stringify({ ok: true, result: run(call) }), false];
  } catch (e) {
    if (!(e instanceof SpinKVError)) throw e;
    const reply = { ok: false, error: e.message, kind: e.kind, fields: e.fields };
    return [JSON.stringify(reply), !call.expect_error];
  }
}

let status = 0;
if (serve) {
  for await (const line of createInterface({ input: process.stdin, crlfDelay: Infinity })) {
    if (!line.trim()) continue;
    process.stdout.write(answer(JSON.parse(line))[0] + "\n");
  }
} else {
  for (const call of calls) {
    const [reply, failed] = answer(call);
    console.log(reply);
    if (failed) status = 1;
  }
}
process.exit(status);
