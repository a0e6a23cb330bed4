// The JavaScript side of test_js_balanced.py, in Node: `node node_balanced.mjs '<JSON>'`, with
// SB_JS_MODULES naming the node_modules that scripts/js-deps filled (.cache/js).
//   {"role": "caller", "connect": {...}, "modes": [...], "calls": n}: looks `calc` up once per
//     mode and calls `who()` n times through each handle; prints `RESULT {mode: [answers]}`.
//   {"role": "instance", "connect": {...}}: registers `calc` (who, and `get`, declared idempotent,
//     which answers only once released); prints `READY`, `STARTED` when a `get` runs; a line
//     `leave` on stdin disconnects it cleanly.
import { createRequire } from "node:module";
import path from "node:path";
import readline from "node:readline";
import { pathToFileURL } from "node:url";

const modules = process.env.SB_JS_MODULES;
const { hyphaWebsocketClient: hypha } = await import(
  pathToFileURL(path.join(modules, "hypha-rpc", "index.mjs")).href
);
globalThis.WebSocket ??= createRequire(path.join(modules, "noop.js"))("ws");

const job = JSON.parse(process.argv[2] || "{}");
try {
  const server = await hypha.connectToServer({ method_timeout: 20, ...job.connect });
  if (job.role === "caller") {
    const answers = {};
    for (const mode of job.modes) {
      const calc = await server.getService("calc", { mode });
      answers[mode] = [];
      for (let i = 0; i < job.calls; i++) answers[mode].push(await calc.who());
    }
    console.log(`RESULT ${JSON.stringify(answers)}`);
    await server.disconnect();
    process.exit(0);
  }
  await server.registerService({
    id: "calc",
    config: { idempotent: ["get"] },
    who: () => "js",
    get: () => {
      console.log("STARTED");
      return new Promise(() => {}); // answers never: the call fails over when this instance leaves
    },
  });
  console.log("READY");
  const lines = readline.createInterface({ input: process.stdin });
  lines.on("line", async (line) => {
    if (line.trim() === "leave") {
      await server.disconnect();
      console.log("LEFT");
    }
  });
} catch (error) {
  console.log(`FAILED ${error && error.stack ? error.stack : error}`);
  process.exit(2);
}
