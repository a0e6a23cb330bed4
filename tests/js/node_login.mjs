// login.mjs in Node: `node node_login.mjs '<login config as JSON>'`, with SB_JS_MODULES naming .cache/js's
// node_modules. Prints `URL <login_url>`, then `TOKEN <token>` or `ERROR <error>`, and exits.
import { createRequire } from "node:module";
import path from "node:path";
import { pathToFileURL } from "node:url";

import { runLogin } from "./login.mjs";

const modules = process.env.SB_JS_MODULES;
const { hyphaWebsocketClient: hypha } = await import(
  pathToFileURL(path.join(modules, "hypha-rpc", "index.mjs")).href
);
globalThis.WebSocket ??= createRequire(path.join(modules, "noop.js"))("ws");

await runLogin(hypha, JSON.parse(process.argv[2] || "{}"), (kind, value) => {
  console.log(`${kind.toUpperCase()} ${String(value).replaceAll("\n", " | ")}`);
});
process.exit(0);
