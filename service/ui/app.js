// The trainjobs dashboard: plain JavaScript, no build step, nothing loaded from elsewhere. It calls the
// same /v1 API as the CLI, with the API key kept in this tab's sessionStorage.
"use strict";

const KEY = "trainjobs.apiKey";
// The job-state groups, as trainjobs/states.py names them: /ui/states.js serves them from there.
const TERMINAL = new Set(JOB_STATES.TERMINAL);
const CANCELLABLE = new Set(JOB_STATES.CANCELLABLE);
const $ = (sel) => document.querySelector(sel);
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
let page = null; // {stop()} of the page on screen

function key() { return sessionStorage.getItem(KEY); }

async function api(path, options = {}) {
  const headers = Object.assign({ Authorization: `Bearer ${key()}` }, options.headers || {});
  const response = await fetch(path, Object.assign({}, options, { headers }));
  if (response.status === 401) { signOut("That API key was refused."); throw new Error("unauthorized"); }
  if (!response.ok) {
    let message = `${response.status} ${response.statusText}`;
    try { message = (await response.json()).error.message; } catch (e) { /* not our error body */ }
    throw new Error(message);
  }
  return response;
}

// Server-sent events over fetch (EventSource cannot send an Authorization header). Reconnects with
// Last-Event-ID after a dropped connection; returns once the server sends `end` or `error` (the key
// was revoked, or the job wrote more than the API reads), or `signal` aborts. `cursor`: where to start.
async function follow(path, onEvent, signal, cursor = null) {
  while (!signal.aborted) {
    try {
      const headers = { Accept: "text/event-stream" };
      if (cursor) headers["Last-Event-ID"] = cursor;
      const response = await api(path, { headers, signal });
      const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value;
        let cut;
        while ((cut = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, cut);
          buffer = buffer.slice(cut + 2);
          let name = "message", data = "";
          for (const line of block.split("\n")) {
            if (line.startsWith(":")) continue; // keep-alive
            const at = line.indexOf(":");
            const field = at < 0 ? line : line.slice(0, at);
            const value = at < 0 ? "" : line.slice(at + 1).replace(/^ /, "");
            if (field === "event") name = value;
            else if (field === "data") data += value;
            else if (field === "id") cursor = value;
          }
          if (data) onEvent(name, JSON.parse(data));
          if (name === "error" && data && JSON.parse(data).code === "key_revoked") signOut("That API key was revoked.");
          if (name === "end" || name === "error") return;
        }
      }
    } catch (e) {
      if (signal.aborted) return;
    }
    await sleep(2000);
  }
}

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v; else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else node.setAttribute(k, v);
  }
  for (const child of children) node.append(child instanceof Node ? child : String(child ?? ""));
  return node;
}

function show(id) {
  for (const section of document.querySelectorAll("main > section")) section.hidden = section.id !== id;
  $("#signout").hidden = id === "signin";
}

function signOut(message) {
  sessionStorage.removeItem(KEY);
  if (page) page.stop();
  page = null;
  $("#signin-error").textContent = message || "";
  show("signin");
}

const fmt = {
  time: (t) => (t ? new Date(t).toLocaleString() : ""),
  age(t) {
    const s = Math.max(0, (Date.now() - new Date(t)) / 1000);
    return s < 90 ? `${Math.round(s)}s` : s < 5400 ? `${Math.round(s / 60)}m` : s < 172800 ? `${Math.round(s / 3600)}h` : `${Math.round(s / 86400)}d`;
  },
  num: (v) => (typeof v !== "number" ? (v ?? "") : Math.abs(v) >= 1000 ? v.toFixed(0) : Math.abs(v) >= 1 ? v.toFixed(2) : v.toPrecision(3)),
  accelerator(spec) {
    const a = spec.accelerator || {};
    return [a.type, a.replicas || a.count ? `×${a.replicas || a.count}` : ""].filter(Boolean).join(" ");
  },
  valMetric(metrics) {
    if (!metrics) return "";
    for (const k of ["val_accuracy", "val_r2", "val_loss", "accuracy", "r2", "loss"]) if (k in metrics) return `${k} ${fmt.num(metrics[k])}`;
    return "";
  },
};

// --- jobs list ----------------------------------------------------------------------------------

function jobsPage() {
  show("jobs");
  let stopped = false;
  async function refresh() {
    const query = new URLSearchParams({ limit: "100" });
    if ($("#filter-status").value) query.append("status", $("#filter-status").value);
    for (const item of $("#filter-labels").value.split(",").map((s) => s.trim()).filter(Boolean)) query.append("label", item);
    try {
      const { jobs } = await (await api(`/v1/jobs?${query}`)).json();
      $("#jobs-error").textContent = "";
      const body = $("#jobs-table tbody");
      body.replaceChildren(...jobs.map((j) => el("tr", { "data-job": j.id, onclick: () => (location.hash = `#/jobs/${j.id}`) },
        el("td", {}, j.name), el("td", { class: "muted" }, j.id.slice(0, 8)),
        el("td", {}, el("span", { class: `status ${j.status}` }, j.status)),
        el("td", {}, fmt.accelerator(j.spec)),
        el("td", {}, j.progress == null ? "" : `${Math.round(j.progress * 100)}%`),
        el("td", { title: fmt.time(j.created_at) }, `${fmt.age(j.created_at)} ago`),
        el("td", {}, fmt.valMetric(j.metrics)),
        el("td", { class: "muted" }, Object.entries(j.labels || {}).map(([k, v]) => `${k}=${v}`).join(", ")))));
      $("#jobs-table").hidden = jobs.length === 0;
      $("#jobs-empty").hidden = jobs.length !== 0;
    } catch (e) {
      $("#jobs-error").textContent = e.message;
    }
  }
  $("#filters").onsubmit = (event) => { event.preventDefault(); refresh(); };
  (async () => { while (!stopped) { await refresh(); await sleep(3000); } })();
  return { stop() { stopped = true; } };
}

// --- one job ------------------------------------------------------------------------------------

function chart(canvas, series, points) {
  // series: [{key, label, color}]; points: epoch entries. Lines by hand on a canvas.
  const ctx = canvas.getContext("2d"), W = canvas.width, H = canvas.height, L = 48, R = 12, T = 10, B = 28;
  ctx.clearRect(0, 0, W, H);
  ctx.font = "11px system-ui, sans-serif";
  const xs = points.map((p, i) => p.epoch ?? i + 1);
  const values = series.flatMap((s) => points.map((p) => p[s.key]).filter((v) => typeof v === "number"));
  canvas.dataset.points = String(points.length);
  if (!values.length) { ctx.fillStyle = "#6b7385"; ctx.fillText("no epochs yet", L, H / 2); return; }
  let lo = Math.min(...values), hi = Math.max(...values);
  if (hi === lo) { hi += Math.abs(hi) * 0.05 || 1; lo -= Math.abs(lo) * 0.05 || 0; }
  const x0 = Math.min(...xs), x1 = Math.max(...xs, x0 + 1);
  const X = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R), Y = (v) => T + (1 - (v - lo) / (hi - lo)) * (H - T - B);
  ctx.strokeStyle = "#dde1e8"; ctx.fillStyle = "#6b7385"; ctx.lineWidth = 1;
  for (let i = 0; i <= 4; i++) {
    const v = lo + ((hi - lo) * i) / 4, y = Y(v);
    ctx.beginPath(); ctx.moveTo(L, y); ctx.lineTo(W - R, y); ctx.stroke();
    ctx.fillText(fmt.num(v), 2, y + 4);
  }
  ctx.fillText(`epoch ${x0}`, L, H - 8); ctx.fillText(`${x1}`, W - R - 16, H - 8);
  series.filter((s) => points.some((p) => typeof p[s.key] === "number")).forEach((s, n) => {
    const pts = points.filter((p) => typeof p[s.key] === "number");
    ctx.strokeStyle = ctx.fillStyle = s.color; ctx.lineWidth = 2;
    ctx.beginPath();
    pts.forEach((p, i) => (i ? ctx.lineTo(X(p.epoch), Y(p[s.key])) : ctx.moveTo(X(p.epoch), Y(p[s.key]))));
    ctx.stroke();
    for (const p of pts) { ctx.beginPath(); ctx.arc(X(p.epoch), Y(p[s.key]), 2.5, 0, 7); ctx.fill(); }
    ctx.fillText(s.label, L + 8 + n * 90, T + 10);
  });
}

const CHARTS = {
  "#chart-loss": [{ key: "loss", label: "loss", color: "#2f6fde" }, { key: "val_loss", label: "val_loss", color: "#e08a1e" }],
  "#chart-accuracy": [{ key: "accuracy", label: "accuracy", color: "#2f6fde" }, { key: "val_accuracy", label: "val_accuracy", color: "#e08a1e" },
    { key: "r2", label: "r2", color: "#7a4fd0" }, { key: "val_r2", label: "val_r2", color: "#c23b32" }],
  "#chart-speed": [{ key: "examples_per_sec", label: "examples/s", color: "#2a9d57" }],
  "#chart-input": [{ key: "input_wait_fraction", label: "input wait", color: "#c23b32" }],
};
const RUNTIME = [["strategy", "strategy"], ["replicas", "replicas"], ["precision", "precision"],
  ["global_batch_size", "global batch"], ["learning_rate", "learning rate"], ["steps_per_execution", "steps per execution"],
  ["entrypoint", "program"], ["install_s", "requirements installed (s)"], ["notes", "notes"]];

function jobPage(id) {
  show("job");
  const abort = new AbortController();
  const epochs = [];
  let job = null;
  for (const sel of ["#job-name", "#job-status", "#job-id", "#job-error", "#log-state"]) $(sel).textContent = "";
  for (const sel of ["#timeline", "#runtime", "#artifacts", "#log"]) $(sel).replaceChildren();
  const draw = () => { for (const [sel, series] of Object.entries(CHARTS)) chart($(sel), series, epochs); };
  draw();

  async function load() {
    try {
      job = await (await api(`/v1/jobs/${id}`)).json();
      const { events } = await (await api(`/v1/jobs/${id}/events`)).json();
      $("#job-name").textContent = job.name;
      $("#job-status").textContent = job.status;
      $("#job-status").className = `status ${job.status}`;
      $("#job-id").textContent = `${job.id} · ${fmt.accelerator(job.spec)} · attempt ${job.attempt}` +
        (job.wait_reason ? ` · waiting: ${job.wait_reason}` : "");
      $("#job-error").textContent = job.error || "";
      $("#cancel").disabled = !CANCELLABLE.has(job.status);
      $("#timeline").replaceChildren(...events.map((e) => el("li", {}, el("b", {}, e.to_status), ` ${fmt.time(e.at)} `,
        el("span", { class: "muted" }, e.reason))));
      const runtime = job.runtime || {};
      $("#runtime").replaceChildren(...RUNTIME.filter(([k]) => k in runtime).map(([k, label]) =>
        el("tr", {}, el("td", {}, label), el("td", {}, Array.isArray(runtime[k]) ? runtime[k].join("; ") || "none" : runtime[k]))));
      if (!Object.keys(runtime).length) $("#runtime").append(el("tr", {}, el("td", {}, "chosen when the job starts")));
      if (TERMINAL.has(job.status)) await artifacts();
      else $("#artifacts").replaceChildren(el("li", { class: "muted" }, "listed here when the job succeeds"));
    } catch (e) {
      if (!abort.signal.aborted) $("#job-error").textContent = e.message;
    }
  }

  async function artifacts() {
    const { artifacts } = await (await api(`/v1/jobs/${id}/artifacts`)).json();
    $("#artifacts").replaceChildren(...(artifacts.length ? artifacts.map((a) => el("li", {},
      el("a", { href: a.download_url, onclick: (event) => download(event, a) }, a.path), ` (${a.size} bytes)`))
      : [el("li", { class: "muted" }, "none (artifacts are kept when a job succeeds)")]));
  }

  async function download(event, a) {
    if (!a.download_url.startsWith("/")) return; // a signed URL needs no key
    event.preventDefault(); // an API link does: fetch it with the key, hand the bytes to the browser
    const blob = await (await api(a.download_url)).blob();
    const link = el("a", { href: URL.createObjectURL(blob), download: a.path.split("/").pop() });
    link.click();
    URL.revokeObjectURL(link.href);
  }

  $("#cancel").onclick = async () => {
    if (!confirm(`Cancel job ${job ? job.name : id}? Its machine is deleted.`)) return;
    $("#cancel").disabled = true;
    try { await api(`/v1/jobs/${id}/cancel`, { method: "POST" }); } catch (e) { $("#job-error").textContent = e.message; }
    load();
  };

  const log = $("#log");
  load();
  let reloaded = 0;
  follow(`/v1/jobs/${id}/metrics?follow=true`, (name, data) => {
    if (name === "status" || name === "end") { load(); return; }
    if (name !== "metric") return;
    epochs.push(data);
    draw();
    // The row's progress and runtime move with the epochs (the runtime is recorded once the job runs).
    if (Date.now() - reloaded > 2000) { reloaded = Date.now(); load(); }
  }, abort.signal);
  $("#log-state").textContent = "(live)";
  // The last lines first (one page, however long the log), then the stream from where they end:
  // the stream from the start would replay the whole log a page at a time.
  followLog(id, log, abort.signal);
  return { stop() { abort.abort(); } };
}

async function followLog(id, log, signal) {
  let cursor = null;
  try {
    const last = await (await api(`/v1/jobs/${id}/logs?tail=2000`, { signal })).json();
    log.append(last.text);
    log.scrollTop = log.scrollHeight;
    cursor = last.end_cursor;
  } catch (e) {
    if (signal.aborted) return;
  }
  follow(`/v1/jobs/${id}/logs?follow=true`, (name, data) => {
    if (name === "log") {
      const atBottom = log.scrollTop + log.clientHeight >= log.scrollHeight - 4;
      log.append(data.line + "\n");
      while (log.childNodes.length > 2000) log.firstChild.remove();
      if (atBottom) log.scrollTop = log.scrollHeight;
    } else if (name === "end") $("#log-state").textContent = `(ended: ${data.status})`;
    else if (name === "error") $("#log-state").textContent = `(stopped: ${data.message})`;
  }, signal, cursor);
}

// --- routing ------------------------------------------------------------------------------------

function route() {
  if (page) page.stop();
  page = null;
  if (!key()) { show("signin"); return; }
  const match = location.hash.match(/^#\/jobs\/([0-9a-f-]{36})$/);
  page = match ? jobPage(match[1]) : jobsPage();
}

$("#signin-form").onsubmit = async (event) => {
  event.preventDefault();
  sessionStorage.setItem(KEY, $("#key").value.trim());
  $("#key").value = "";
  try {
    await api("/v1/jobs?limit=1");
    $("#signin-error").textContent = "";
    route();
  } catch (e) {
    if (e.message !== "unauthorized") signOut(e.message);
  }
};
$("#signout").onclick = () => signOut("");
// The status filter offers every status, in the order a job goes through them.
$("#filter-status").append(...JOB_STATES.STATUSES.map((s) => el("option", {}, s)));
window.addEventListener("hashchange", route);
route();
