// Runs spinkv-wasm's exports in node: `node run.mjs MODULE.wasm [parity|bench]...`.
// Exit status 1 when any parity check fails.
import { readFileSync } from "node:fs";

const [file, ...what] = process.argv.slice(2);
if (!file) {
  console.error("usage: node run.mjs MODULE.wasm [parity] [bench]");
  process.exit(2);
}
let memory;
const decoder = new TextDecoder();
const env = {
  log: (ptr, len) => console.log(decoder.decode(new Uint8Array(memory.buffer, ptr, len))),
  now: () => performance.now(),
  // Used only by a module built with the runtime feature.
  random_u32: () => crypto.getRandomValues(new Uint32Array(1))[0] | 0,
};
const { instance } = await WebAssembly.instantiate(readFileSync(file), { env });
memory = instance.exports.memory;
let status = 0;
for (const step of what.length ? what : ["parity"]) {
  if (step === "parity") {
    const failures = instance.exports.parity();
    console.log(failures === 0 ? "wasm parity: all checks match" : `wasm parity: ${failures} FAILED`);
    if (failures !== 0) status = 1;
  } else if (step === "bench") {
    instance.exports.bench();
  } else {
    console.error(`unknown step ${step}`);
    status = 2;
  }
}
process.exit(status);
