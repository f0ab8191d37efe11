// Drives the chat page in headless Chromium over the DevTools protocol (node 20+: run with
// --experimental-websocket). Used by tests/test_web.py:
//
//   node --experimental-websocket e2e.mjs CHROMIUM URL OUTDIR QUESTION FOLLOW_UP
//
// Loads the page, waits for the model, asks QUESTION, screenshots, saves the session in the
// browser (OPFS), reloads the page, restores the session and asks FOLLOW_UP, screenshots
// again. Prints one JSON object: {load_ms, first, second, restored, stats, screenshots}.
// With QUESTION "--bench", the remaining arguments are bench calls ({"kv", "depths", "n"}) run
// in the page's worker instead: {load_ms, bench: [...]}.
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";

const [chromium, url, outDir, question, followUp] = process.argv.slice(2);
const profile = mkdtempSync(join(tmpdir(), "spinkv-chromium-"));
const browser = spawn(
  chromium,
  [
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--no-first-run",
    "--remote-debugging-port=0",
    `--user-data-dir=${profile}`,
    "--window-size=1400,900",
    "about:blank",
  ],
  { stdio: ["ignore", "ignore", "pipe"] },
);

function fail(message) {
  console.log(JSON.stringify({ error: message }));
  browser.kill();
  rmSync(profile, { recursive: true, force: true });
  process.exit(1);
}
setTimeout(() => fail("timed out after 20 minutes"), 20 * 60 * 1000).unref();

const wsUrl = await new Promise((resolve, reject) => {
  let text = "";
  browser.stderr.on("data", (chunk) => {
    text += chunk;
    const match = text.match(/DevTools listening on (ws:\/\/\S+)/);
    if (match) resolve(match[1]);
  });
  browser.on("exit", (code) => reject(new Error(`chromium exited (${code}): ${text.slice(-500)}`)));
}).catch((e) => fail(e.message));

const ws = new WebSocket(wsUrl);
await new Promise((resolve) => ws.addEventListener("open", resolve));
let nextId = 1;
const waiting = new Map();
const consoleLines = [];
ws.addEventListener("message", ({ data }) => {
  const msg = JSON.parse(data);
  if (msg.id && waiting.has(msg.id)) {
    const { resolve, reject } = waiting.get(msg.id);
    waiting.delete(msg.id);
    if (msg.error) reject(new Error(msg.error.message));
    else resolve(msg.result);
  } else if (msg.method === "Runtime.exceptionThrown") {
    consoleLines.push(`exception: ${msg.params.exceptionDetails.text} ${msg.params.exceptionDetails.exception?.description ?? ""}`);
  } else if (msg.method === "Runtime.consoleAPICalled") {
    consoleLines.push(msg.params.args.map((a) => a.value ?? a.description).join(" "));
  }
});
function send(method, params = {}, sessionId) {
  const id = nextId++;
  ws.send(JSON.stringify({ id, method, params, ...(sessionId ? { sessionId } : {}) }));
  return new Promise((resolve, reject) => waiting.set(id, { resolve, reject }));
}

const { targetId } = await send("Target.createTarget", { url: "about:blank" });
const { sessionId } = await send("Target.attachToTarget", { targetId, flatten: true });
const page = (method, params) => send(method, params, sessionId);
await page("Runtime.enable");
await page("Page.enable");
await page("Emulation.setDeviceMetricsOverride", { width: 1400, height: 900, deviceScaleFactor: 1, mobile: false });

async function evaluate(expression) {
  const out = await page("Runtime.evaluate", { expression, awaitPromise: true, returnByValue: true });
  if (out.exceptionDetails) throw new Error(`${expression}: ${out.exceptionDetails.exception?.description ?? out.exceptionDetails.text}`);
  return out.result.value;
}

async function waitFor(expression, what, seconds = 600) {
  const deadline = Date.now() + seconds * 1000;
  while (Date.now() < deadline) {
    try {
      const value = await evaluate(expression);
      if (value) return value;
    } catch {
      // the page may be reloading
    }
    await new Promise((r) => setTimeout(r, 200));
  }
  fail(`timed out waiting for ${what}; page console: ${consoleLines.slice(-5).join(" | ")}; status: ${await evaluate("document.getElementById('status-text')?.textContent").catch(() => "?")}`);
}

async function screenshot(name) {
  const { data } = await page("Page.captureScreenshot", { format: "png" });
  const path = join(outDir, name);
  writeFileSync(path, Buffer.from(data, "base64"));
  return path;
}

async function loadPage() {
  const started = Date.now();
  await page("Page.navigate", { url });
  await waitFor("window.spinkv && window.spinkv.state.ready", "the model to load");
  return Date.now() - started;
}

async function ask(text) {
  const before = await evaluate("window.spinkv.state.turns.length");
  await evaluate(`(() => { const i = document.getElementById('input'); i.value = ${JSON.stringify(text)}; document.getElementById('composer').requestSubmit(); return true; })()`);
  await waitFor(`window.spinkv.state.turns.length > ${before} && !window.spinkv.state.busy`, `the reply to ${JSON.stringify(text)}`);
  return evaluate("(() => { const t = window.spinkv.state.turns.at(-1); return {text: t.text, token_ids: t.token_ids, reason: t.reason, prompt_tokens: t.prompt_tokens, cached_tokens: t.cached_tokens, first_token_ms: t.first_token_ms, timings: t.timings}; })()");
}

const screenshots = [];
const loadMs = await loadPage();
if (question === "--bench") {
  // node e2e.mjs CHROMIUM URL OUTDIR --bench '{"kv": ..., "depths": [...], "n": N}'...
  const rows = [];
  for (const spec of process.argv.slice(6)) {
    rows.push({ ...JSON.parse(spec), result: await evaluate(`window.spinkv.request('bench', ${spec})`) });
  }
  console.log(JSON.stringify({ load_ms: loadMs, bench: rows, user_agent: await evaluate("navigator.userAgent") }));
  browser.kill();
  rmSync(profile, { recursive: true, force: true });
  process.exit(0);
}
const first = await ask(question);
screenshots.push(await screenshot("chat.png"));
const saved = await evaluate("window.spinkv.saveAs('e2e')");
const reloadMs = await loadPage();
const restored = await evaluate("window.spinkv.open('e2e', 'browser')");
const second = await ask(followUp);
const stats = await evaluate("window.spinkv.request('stats')");
screenshots.push(await screenshot("resumed.png"));
console.log(JSON.stringify({ load_ms: loadMs, reload_ms: reloadMs, first, saved, restored, second, stats, screenshots, console: consoleLines.slice(-20) }));
ws.close();
browser.kill();
rmSync(profile, { recursive: true, force: true });
process.exit(0);
