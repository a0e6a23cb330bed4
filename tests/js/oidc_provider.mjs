// A certified OpenID Connect provider (npm oidc-provider) on loopback for the sign-in tests:
// `node oidc_provider.mjs '{"port": 0, "clients": [...]}'`, with SB_JS_MODULES naming .cache/js/node_modules.
// Its development login form takes any login (the subject) and password. Prints `READY <issuer>`.
import path from "node:path";
import { pathToFileURL } from "node:url";

const modules = process.env.SB_JS_MODULES;
const { default: Provider } = await import(
  pathToFileURL(path.join(modules, "oidc-provider", "lib", "index.js")).href
);
const config = JSON.parse(process.argv[2] || "{}");

const server = (await import("node:http")).createServer();
await new Promise((resolve) => server.listen(config.port || 0, "127.0.0.1", resolve));
const issuer = `http://127.0.0.1:${server.address().port}`;

const provider = new Provider(issuer, {
  clients: config.clients,
  pkce: { required: () => true },
  conformIdTokenClaims: false, // the ID token carries the profile and email the scopes grant
  claims: { openid: ["sub"], email: ["email", "email_verified"], profile: ["name"] },
  findAccount: async (ctx, sub) => ({
    accountId: sub,
    claims: async () => ({ sub, email: `${sub}@example.org`, email_verified: true, name: `User ${sub}` }),
  }),
  ttl: { IdToken: 600, AccessToken: 600, AuthorizationCode: 60 },
});
provider.on("server_error", (ctx, err) => console.error("server_error", err));
server.on("request", provider.callback());
console.log(`READY ${issuer}`);
process.stdin.resume();
process.stdin.on("end", () => process.exit(0));
