// Run agent.mjs in Node: `node node_agent.mjs '<connect config as JSON>'`, with
// SB_JS_MODULES naming the node_modules that scripts/js-deps filled (.cache/js).
// Prints one line `READY {"workspace": ..., "clientId": ...}` (or `FAILED <error>`)
// and then serves until stdin closes or the process is killed.
import { createRequire } from "node:module";
import path from "node:path";
import { pathToFileURL } from "node:url";

import { startAgent } from "./agent.mjs";

const modules = process.env.SB_JS_MODULES;
const { hyphaWebsocketClient: hypha } = await import(
  pathToFileURL(path.join(modules, "hypha-rpc", "index.mjs")).href
);
// Node 20 has no WebSocket of its own; the client reads the global one
globalThis.WebSocket ??= createRequire(path.join(modules, "noop.js"))("ws");

const config = JSON.parse(process.argv[2] || "{}");
try {
  const agent = await startAgent(hypha, config);
  console.log(`READY ${JSON.stringify({ workspace: agent.workspace, clientId: agent.clientId })}`);
} catch (error) {
  console.log(`FAILED ${error && error.stack ? error.stack : error}`);
  process.exit(2);
}
process.stdin.resume();
process.stdin.on("end", () => process.exit(0));
