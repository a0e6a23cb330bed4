// Switchboard's web console: reads /api/status every couple of seconds and calls
// services over /{workspace}/services/..., with the token the viewer signed in
// with (this tab's sessionStorage, sent as Authorization: Bearer). Everything a
// client registered (ids, names, descriptions) is shown as text, never as HTML.
"use strict";

const POLL_MS = 1500; // a change shows within 2 s (the rates are sampled every 2 s)
const TOKEN_KEY = "switchboard.token";
const $ = (id) => document.getElementById(id);

let token = sessionStorage.getItem(TOKEN_KEY) || "";
let lastStatus = null;
let selected = null; // {workspace, service, functions}

function el(tag, props = {}, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props)) {
    if (key === "class") node.className = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else if (value !== undefined && value !== null) node.setAttribute(key, value);
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function authHeaders() {
  return token ? { Authorization: `Bearer ${token}` } : {};
}

function banner(text) {
  const node = $("banner");
  node.hidden = !text;
  node.textContent = text || "";
}

function age(seconds) {
  if (seconds === null || seconds === undefined) return "?";
  if (seconds < 120) return `${Math.round(seconds)}s`;
  if (seconds < 7200) return `${Math.floor(seconds / 60)}m`;
  return `${Math.floor(seconds / 3600)}h`;
}

function figure(value) {
  if (value === null || value === undefined) return "–";
  if (value >= 100) return Math.round(value).toLocaleString();
  return (Math.round(value * 10) / 10).toString();
}

// -- charts -------------------------------------------------------------------

function drawChart(canvas, values, color) {
  const ratio = window.devicePixelRatio || 1;
  const width = canvas.clientWidth || canvas.width;
  const height = canvas.clientHeight || canvas.height;
  canvas.width = width * ratio;
  canvas.height = height * ratio;
  const ctx = canvas.getContext("2d");
  ctx.scale(ratio, ratio);
  ctx.clearRect(0, 0, width, height);
  ctx.strokeStyle = "#e2e5eb";
  ctx.lineWidth = 1;
  for (const y of [0.5, height / 2, height - 0.5]) {
    ctx.beginPath(); ctx.moveTo(0, y); ctx.lineTo(width, y); ctx.stroke();
  }
  if (values.length < 2) return;
  const top = Math.max(1, ...values) * 1.15;
  const step = width / (values.length - 1);
  const point = (v, i) => [i * step, height - 2 - (v / top) * (height - 6)];
  ctx.beginPath();
  values.forEach((v, i) => { const [x, y] = point(v, i); i ? ctx.lineTo(x, y) : ctx.moveTo(x, y); });
  ctx.strokeStyle = color;
  ctx.lineWidth = 1.8;
  ctx.stroke();
  ctx.lineTo(width, height); ctx.lineTo(0, height); ctx.closePath();
  ctx.fillStyle = color + "22";
  ctx.fill();
  ctx.fillStyle = "#6b7385";
  ctx.font = "10px system-ui, sans-serif";
  ctx.fillText(`max ${figure(Math.max(...values))}`, 4, 11);
}

const COLORS = { messages_per_second: "#2f6fde", calls_in_flight: "#1f9d55", errors_per_second: "#d64545" };

function renderCharts(history) {
  for (const fig of document.querySelectorAll(".chart")) {
    const series = fig.dataset.series;
    const values = history.map((sample) => sample[series] || 0);
    fig.querySelector(".now").textContent = values.length ? figure(values[values.length - 1]) : "–";
    drawChart(fig.querySelector("canvas"), values, COLORS[series]);
  }
}

// -- tables -------------------------------------------------------------------

function renderReplicas(replicas) {
  const body = $("replicas").querySelector("tbody");
  body.replaceChildren(...replicas.map((r) => {
    const subs = r.subscriptions || {};
    const healthy = subs.confirmed === subs.desired;
    return el("tr", { "data-replica": r.id },
      el("td", {}, el("code", {}, r.id), r.self ? el("span", { class: "muted" }, " (this one)") : null),
      el("td", {}, r.address || ""),
      el("td", { class: "num" }, age(r.age_seconds)),
      el("td", { class: "num" }, figure(r.clients)),
      el("td", {}, r.leader ? "leader" : (replicas.length === 1 ? "–" : "")),
      el("td", { class: healthy ? "num ok" : "num bad" },
        subs.desired === null || subs.desired === undefined ? "– (embedded)" : `${figure(subs.confirmed)}/${figure(subs.desired)}`),
      el("td", { class: r.bus === "ok" ? "ok" : "bad" }, r.bus || "?"),
      el("td", { class: "num" }, figure((r.rates || {}).messages_per_second)),
    );
  }));
}

function serviceRow(workspace, service) {
  const fns = service.functions.map((fn) =>
    el("button", { type: "button", title: `call ${fn}`, onclick: () => selectFunction(workspace, service, fn) }, fn));
  return el("tr", { "data-service": service.id },
    el("td", {}, el("code", {}, `${service.client}:${service.service}`),
      service.description ? el("div", { class: "muted" }, service.description) : null),
    el("td", {}, el("span", { class: `vis ${service.visibility}` }, service.visibility)),
    el("td", {}, el("div", { class: "fns" }, fns.length ? fns : el("span", { class: "muted" }, "no functions"))),
  );
}

function renderWorkspaces(workspaces) {
  $("ws-count").textContent = `(${workspaces.length})`;
  const cards = workspaces.map((ws) => {
    const clients = ws.clients === null
      ? el("p", { class: "muted" }, "clients: not shown without read permission")
      : el("ul", { class: "clients" }, ws.clients.length
        ? ws.clients.map((c) => el("li", { "data-client": c.id }, c.id.split("/")[1]))
        : el("li", {}, "none"));
    const services = ws.services.length
      ? el("table", {}, el("thead", {}, el("tr", {}, el("th", {}, "service"), el("th", {}, "visibility"), el("th", {}, "functions"))),
        el("tbody", {}, ws.services.map((s) => serviceRow(ws.id, s))))
      : el("p", { class: "muted" }, "no services");
    return el("div", { class: "card ws", "data-workspace": ws.id },
      el("h3", {}, el("code", {}, ws.id), ws.readable ? el("span", { class: "muted" }, "readable") : el("span", { class: "muted" }, "public services only")),
      clients, services);
  });
  $("workspaces").replaceChildren(...(cards.length ? cards : [el("p", { class: "muted" }, "nothing to show to this viewer")]));
}

function renderViewer(viewer, server) {
  $("server").textContent = `${server.id} · ${server.public_base_url} · ${server.phase}`;
  const badge = $("viewer");
  badge.textContent = viewer.anonymous ? "anonymous" : viewer.id;
  badge.title = viewer.anonymous ? "no token: what anonymous may see" : `may read: ${viewer.workspaces.join(", ")}`;
  badge.className = viewer.anonymous ? "badge" : "badge signed";
  $("signout").hidden = !token;
  $("token").hidden = !!token;
  $("signin-button").hidden = !!token;
}

// -- calling ------------------------------------------------------------------

function selectFunction(workspace, service, fn) {
  selected = { workspace, service };
  $("call-hint").hidden = true;
  $("call-form").hidden = false;
  $("call-service").textContent = service.id;
  const select = $("call-function");
  select.replaceChildren(...service.functions.map((name) => el("option", { value: name }, name)));
  select.value = fn;
  $("call-result").textContent = "";
  $("call-result").className = "result";
}

// The path of a call, each part one encoded segment; null if a part would be a dot
// segment, which the browser resolves ("%2e%2e" too) and would send the viewer's
// token elsewhere. Names come from whoever registered the service.
function callPath(workspace, serviceId, fn) {
  const parts = fn.split("."); // nested functions are dotted, as the hub reads them
  const segments = [workspace, serviceId, fn];
  if (parts.some((part) => part === "") || segments.some((s) => s === "." || s === "..")) return null;
  const path = `/${encodeURIComponent(workspace)}/services/${encodeURIComponent(serviceId)}/` +
    parts.map(encodeURIComponent).join(".");
  return new URL(path, location.href).pathname === path ? path : null;
}

async function callSelected(event) {
  event.preventDefault();
  const result = $("call-result");
  let args;
  try {
    args = JSON.parse($("call-args").value || "{}");
    if (args === null || typeof args !== "object" || Array.isArray(args)) throw new Error("an object of keyword arguments, e.g. {\"a\": 1}");
  } catch (error) {
    result.className = "result error";
    result.textContent = `arguments: ${error.message}`;
    return;
  }
  const { workspace, service } = selected;
  const fn = $("call-function").value;
  const path = callPath(workspace, `${service.client}:${service.service}`, fn);
  if (path === null) {
    result.className = "result error";
    result.textContent = `${fn} cannot be called over HTTP: no URL path can name it (a part of it is empty, "." or "..")`;
    return;
  }
  result.className = "result";
  result.textContent = "calling…";
  try {
    const response = await fetch(path, {
      method: "POST", headers: { "Content-Type": "application/json", ...authHeaders() }, body: JSON.stringify(args),
    });
    const body = await response.json().catch(() => null);
    if (!response.ok) {
      result.className = "result error";
      result.textContent = `${response.status}: ${body && body.detail ? body.detail : response.statusText}`;
      return;
    }
    result.textContent = JSON.stringify(body, null, 2);
  } catch (error) {
    result.className = "result error";
    result.textContent = String(error);
  }
}

// -- the loop -----------------------------------------------------------------

async function refresh() {
  try {
    const response = await fetch("/api/status", { headers: authHeaders(), cache: "no-store" });
    const body = await response.json();
    if (!response.ok) {
      banner(`${response.status}: ${body.detail || response.statusText}${token ? " (sign out to continue anonymously)" : ""}`);
      return;
    }
    banner("");
    lastStatus = body;
    renderViewer(body.viewer, body.server);
    renderCharts(body.rates.history);
    renderReplicas(body.replicas);
    renderWorkspaces(body.workspaces);
    $("updated").textContent = `updated ${new Date(body.time * 1000).toLocaleTimeString()}`;
    document.body.dataset.updated = String(body.time);
  } catch (error) {
    banner(`hub unreachable: ${error.message}`);
  }
}

async function loop() {
  await refresh();
  setTimeout(loop, POLL_MS);
}

window.addEventListener("DOMContentLoaded", () => {
  $("signin").addEventListener("submit", (event) => {
    event.preventDefault();
    token = $("token").value.trim();
    $("token").value = "";
    if (token) sessionStorage.setItem(TOKEN_KEY, token);
    refresh();
  });
  $("signout").addEventListener("click", () => {
    token = "";
    sessionStorage.removeItem(TOKEN_KEY);
    refresh();
  });
  $("call-form").addEventListener("submit", callSelected);
  window.addEventListener("resize", () => lastStatus && renderCharts(lastStatus.rates.history));
  loop();
});
