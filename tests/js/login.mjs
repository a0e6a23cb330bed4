// The JavaScript client's login() as a page or a script calls it, unmodified: `report(kind, value)` is told the
// login_url (`url`), then the token or the error (`token`, `error`). Used by login.html (Chromium) and
// node_login.mjs (Node).
export async function runLogin(hypha, config, report) {
  try {
    const token = await hypha.login({
      ...config,
      login_timeout: 30,
      login_callback: (context) => report("url", context.login_url),
    });
    report("token", token);
  } catch (error) {
    report("error", String((error && error.stack) || error));
  }
}
