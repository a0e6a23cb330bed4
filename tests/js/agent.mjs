// The JavaScript side of tests/js: the same code runs in Node (node_agent.mjs) and
// in headless Chromium (agent.html). It connects with the unmodified hypha-rpc
// client and registers a public service "js" that the Python test drives: values
// of every type, callbacks and generators both ways, events, and what it saw.

// Every value type the wire carries, as JavaScript sends it.
export function jsValues() {
  return {
    int: 42,
    negative: -7,
    float: 3.5,
    big: 2 ** 40,
    text: "héllo ✓",
    empty: "",
    yes: true,
    no: false,
    nothing: null,
    list: [1, "two", null, [3]],
    nested: { a: [1, { b: null, c: "d" }], e: { f: { g: 1.25 } } },
    bytes: new Uint8Array([0, 1, 2, 255]),
  };
}

// What arrived, by JavaScript type: lets Python check how its values decode here.
export function describe(value) {
  if (value === null) return "null";
  if (value === undefined) return "undefined";
  if (value instanceof Uint8Array) return `Uint8Array[${Array.from(value).join(",")}]`;
  if (value instanceof ArrayBuffer) return `ArrayBuffer[${new Uint8Array(value).join(",")}]`;
  if (Array.isArray(value)) return value.map(describe);
  if (typeof value === "object") {
    const out = {};
    for (const [k, v] of Object.entries(value)) {
      if (k !== "_rkwargs") out[k] = describe(v);
    }
    return out;
  }
  if (typeof value === "number") return Number.isInteger(value) ? `int:${value}` : `float:${value}`;
  return `${typeof value}:${value}`;
}

async function collect(iterable) {
  const items = [];
  for await (const item of iterable) items.push(item);
  return items;
}

export async function startAgent(hypha, config) {
  const events = [];
  const state = { connected: 0, disconnected: 0 };
  const server = await hypha.connectToServer({ method_timeout: 20, ...config });
  const record = (type) => (message) => {
    events.push({ type, data: message.data ?? null, from: message.from ?? null });
  };
  const service = {
    id: "js",
    config: { visibility: "public" },
    ping: () => "pong",
    echo: (value) => value,
    values: () => jsValues(),
    describe: (value) => describe(value),
    // a Python callback called from JavaScript
    callBack: async (callback, value) => await callback(value),
    // a JavaScript generator consumed by Python
    count: async function* (n) {
      for (let i = 0; i < n; i++) yield i;
    },
    // the reverse of everything above: JavaScript drives a Python service
    usePython: async (serviceId) => {
      const py = await server.getService(serviceId);
      const sent = jsValues();
      const echoed = await py.echo(sent);
      return {
        echoed: describe(echoed),
        seenByPython: await py.describe(sent),
        valuesFromPython: describe(await py.values()),
        callback: await py.apply((x) => x * 2, 21),
        generated: await collect(await py.count(4)),
      };
    },
    subscribe: async (types) => {
      await server.subscribe(types);
      for (const type of types) server.on(type, record(type));
      return true;
    },
    emit: async (type, data) => {
      await server.emit({ type, to: "*", data });
      return true;
    },
    events: () => events,
    info: () => ({ workspace: server.config.workspace, clientId: server.config.client_id, ...state }),
  };
  await server.registerService(service);
  server.rpc.on("connected", () => { state.connected += 1; });
  server.rpc.on("disconnected", () => { state.disconnected += 1; });
  return { server, workspace: server.config.workspace, clientId: server.config.client_id, events };
}
