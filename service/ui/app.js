// The trainjobs dashboard: plain JavaScript, no build step, nothing loaded from elsewhere. It calls the
// same /v1 API as the CLI, with the API key kept in this tab's sessionStorage.
"use strict";

const KEY = "trainjobs.apiKey";
// The job-state groups, as trainjobs/states.py names them: /ui/states.js serves them from there.
const TERMINAL = new Set(JOB_STATES.TERMINAL);
const CANCELLABLE = new Set(JOB_STATES.CANCELLABLE);
// A sweep's and its trials', as /ui/sweep-states.js serves them from the same module.
const SWEEP_TERMINAL = new Set(SWEEP_STATES.TERMINAL);
const SWEEP_CANCELLABLE = new Set(SWEEP_STATES.CANCELLABLE);
const TRIAL = SWEEP_STATES.TRIAL;
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

const NAV = { jobs: "jobs", job: "jobs", sweeps: "sweeps", sweep: "sweeps" }; // section -> its entry in #nav

function show(id) {
  for (const section of document.querySelectorAll("main > section")) section.hidden = section.id !== id;
  $("#signout").hidden = $("#nav").hidden = id === "signin";
  for (const link of document.querySelectorAll("#nav a")) link.classList.toggle("here", link.dataset.nav === NAV[id]);
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
  usd: (v) => (v > 0 && v < 0.005 ? "< $0.01" : `$${(v ?? 0).toFixed(2)}`),
  params: (params) => Object.entries(params || {}).map(([k, v]) => `${k}=${fmt.num(v)}`).join(", "),
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

function chart(canvas, series, points, { x = "epoch", xLabel = "epoch", empty = null } = {}) {
  // series: [{key, label, color, line, dots, ring, dash}]; points: entries with an `x` (epoch unless
  // told) and a value per series key. Lines by hand on a canvas: each series a line through dots unless
  // `line: false` or `dots: false`; `ring`: hollow dots, `dash`: a dashed line.
  const ctx = canvas.getContext("2d"), W = canvas.width, H = canvas.height, L = 48, R = 12, T = 22, B = 28;
  ctx.clearRect(0, 0, W, H);
  ctx.font = "11px system-ui, sans-serif";
  const xs = points.map((p, i) => p[x] ?? i + 1);
  const values = series.flatMap((s) => points.map((p) => p[s.key]).filter((v) => typeof v === "number"));
  const drawn = series.filter((s) => points.some((p) => typeof p[s.key] === "number"));
  // What was drawn, as attributes a test can wait on (the page's CSP refuses evaluated strings).
  canvas.dataset.points = String(points.length);
  canvas.dataset.lines = String(drawn.filter((s) => s.line !== false).length);
  canvas.dataset.rings = String(drawn.filter((s) => s.ring).reduce((n, s) => n + points.filter((p) => typeof p[s.key] === "number").length, 0));
  if (!values.length) { ctx.fillStyle = "#6b7385"; ctx.fillText(empty || `no ${xLabel}s yet`, L, H / 2); return; }
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
  ctx.fillText(`${xLabel} ${x0}`, L, H - 8); ctx.fillText(`${x1}`, W - R - 16, H - 8);
  let legend = L + 8;
  for (const s of drawn) {
    const pts = points.filter((p) => typeof p[s.key] === "number");
    ctx.strokeStyle = ctx.fillStyle = s.color; ctx.lineWidth = 2;
    if (s.line !== false) {
      ctx.setLineDash(s.dash ? [5, 4] : []);
      ctx.beginPath();
      pts.forEach((p, i) => (i ? ctx.lineTo(X(p[x]), Y(p[s.key])) : ctx.moveTo(X(p[x]), Y(p[s.key]))));
      ctx.stroke();
      ctx.setLineDash([]);
    }
    if (s.dots !== false) {
      for (const p of pts) {
        ctx.beginPath(); ctx.arc(X(p[x]), Y(p[s.key]), s.ring ? 4 : 2.5, 0, 7);
        if (s.ring) { ctx.lineWidth = 1.5; ctx.stroke(); } else ctx.fill();
      }
    }
    // The legend in one row, as far as it fits (a sweep may draw a line for each of many trials).
    const width = ctx.measureText(s.label).width;
    if (legend + width <= W - R) ctx.fillText(s.label, legend, 12); // above the plot, clear of its lines
    legend += Math.max(width + 16, 60);
  }
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

// The final metrics' comparison of the exported models (agent/optimization.py: summary), one row each.
const MODEL_FIELDS = new Set(["name", "format", "quantization", "bytes", "gzip_bytes", "params", "sparsity",
  "latency_ms_1", "latency_ms_32"]);
const bytes = (n) => (typeof n !== "number" ? "" : n < 1024 ? `${n} B` : n < 1048576 ? `${(n / 1024).toFixed(1)} KiB`
  : `${(n / 1048576).toFixed(1)} MiB`);
const ms = (v) => (typeof v === "number" ? `${v.toPrecision(3)} ms` : "");

function modelsTable(rows) {
  const scores = Object.keys(rows[0]).filter((k) => !MODEL_FIELDS.has(k));
  const head = ["model", "quantization", ...scores, "size", "gzip", "params", "sparsity", "1 example", "32 examples"];
  $("#models thead").replaceChildren(el("tr", {}, ...head.map((h) => el("th", {}, h))));
  $("#models tbody").replaceChildren(...rows.map((r) => el("tr", { "data-model": r.name },
    ...[r.name, r.quantization, ...scores.map((k) => fmt.num(r[k])), bytes(r.bytes), bytes(r.gzip_bytes),
      fmt.num(r.params), typeof r.sparsity === "number" ? `${(r.sparsity * 100).toFixed(1)}%` : "",
      ms(r.latency_ms_1), ms(r.latency_ms_32)].map((v) => el("td", {}, String(v))))));
}

// Where training time went (agent/step_time.py) and the profiler trace (agent/profiling.py), from the final
// metrics: the training part's four parts with their share, then the pauses and validation on top of it.
const STEP_PARTS = [["compile", "compile_seconds", null], ["input wait", "input_wait_seconds", "input_wait_ms_per_step"],
  ["host", "host_seconds", "host_ms_per_step"], ["device", "device_seconds", "device_ms_per_step"],
  ["= training", "train_seconds", null], ["+ pause", "pause_seconds", null], ["+ validation", "validation_seconds", null]];

function stepTime(metrics, ended) {
  const b = metrics.step_time_breakdown, p = metrics.profile;
  const share = (v) => (typeof v === "number" && b.train_seconds > 0 ? `${Math.round((100 * v) / b.train_seconds)}%` : "");
  $("#step-time tbody").replaceChildren(...(b && typeof b === "object" ? STEP_PARTS.map(([label, k, perStep]) =>
    el("tr", { "data-part": k }, ...[label, fmt.num(b[k]), perStep ? fmt.num(b[perStep]) : "",
      label.startsWith("=") || label.startsWith("+") ? "" : share(b[k])].map((v) => el("td", {}, String(v)))))
    : [el("tr", {}, el("td", { class: "muted" }, ended ? "not measured for this job" : "measured here when the job ends"))]));
  let trace = "";
  if (p && typeof p === "object") {
    trace = `profile: epoch ${p.epoch}, ${p.steps} steps` + (p.error ? `: ${p.error}` : ` in ${fmt.num(p.seconds)} s` +
      (typeof p.overhead_seconds === "number" ? ` (overhead ${fmt.num(p.overhead_seconds)} s)` : "") +
      `: ${(p.files || []).map((f) => `tensorboard/${f}`).join(", ")}`);
  }
  $("#profile").textContent = trace;
}

// The advisor's advice (trainjobs/advice.py): each rule's suggestion, the numbers behind it, its gain.
function adviceItems(advice) {
  if (!Array.isArray(advice) || !advice.length) return [el("li", { class: "muted" }, "none so far")];
  return advice.filter((a) => a && typeof a === "object").map((a) => el("li", { "data-rule": String(a.rule) },
    el("b", {}, String(a.rule)), `: ${a.suggestion}`,
    el("div", { class: "muted" }, Object.entries(a.evidence || {}).map(([k, v]) => `${k} ${v}`).join(", ")),
    el("div", {}, `gain: ${a.expected_gain}`)));
}

// The job's latest metrics as name-value rows: each epoch's while it trains, the final ones once it ends
// (what is shown in a table of its own, the models and the step time, left out); a record as `name value, ...`.
const SHOWN_APART = new Set(["optimization", "step_time_breakdown", "profile"]);
const metricText = (v) => (v !== null && typeof v === "object"
  ? (Array.isArray(v) ? v.map(metricText) : Object.entries(v).map(([k, x]) => `${k} ${metricText(x)}`)).join(", ")
  : typeof v === "number" ? fmt.num(v) : String(v));

function metricsRows(metrics, ended, program) {
  const rows = Object.entries(metrics || {}).filter(([k, v]) => !SHOWN_APART.has(k) && v !== null && v !== undefined);
  if (!rows.length) {
    const none = !ended ? "none yet" : program ? "the program reported none" : "none: the job ended without any";
    return [el("tr", {}, el("td", { class: "muted" }, none))];
  }
  return rows.map(([k, v]) => el("tr", { "data-metric": k }, el("td", {}, k), el("td", {}, metricText(v))));
}

// What the charts say when there is no epoch to draw: a job still going has none yet; one that ended has
// none at all (a program that reports no epochs, as a Vertex AI script need not), and says what it has.
function noEpochs(job, ended) {
  if (!job || !ended || !TERMINAL.has(job.status)) return null;
  const finals = Object.keys(job.metrics || {}).filter((k) => !SHOWN_APART.has(k)).length;
  if (job.spec && job.spec.program) {
    return "the program reported no epochs" + (finals ? `; its ${finals} metric${finals > 1 ? "s are" : " is"} under Metrics` : "");
  }
  return `no epoch finished before the job ${job.status.toLowerCase()}`;
}

function jobPage(id) {
  show("job");
  const abort = new AbortController();
  const epochs = [];
  let job = null, streamEnded = false;
  for (const sel of ["#job-name", "#job-status", "#job-id", "#job-error", "#log-state", "#epochs-note"]) $(sel).textContent = "";
  for (const sel of ["#timeline", "#runtime", "#advice", "#artifacts", "#log", "#job-sweep", "#final-metrics"]) $(sel).replaceChildren();
  const draw = () => {
    const empty = epochs.length ? null : noEpochs(job, streamEnded);
    $("#epochs-note").textContent = empty ? `${empty[0].toUpperCase()}${empty.slice(1)}.` : "";
    $("#epochs-note").hidden = !empty;
    for (const [sel, series] of Object.entries(CHARTS)) chart($(sel), series, epochs, { empty });
  };
  draw();

  async function load() {
    try {
      job = await (await api(`/v1/jobs/${id}`)).json();
      const { events } = await (await api(`/v1/jobs/${id}/events`)).json();
      $("#job-name").textContent = job.name;
      $("#job-status").textContent = job.status;
      $("#job-status").className = `status ${job.status}`;
      $("#job-id").textContent = `${job.id} · ${fmt.accelerator(job.spec)}` + (job.attempt ? ` · attempt ${job.attempt}` : "") +
        (job.wait_reason ? ` · waiting: ${job.wait_reason}` : "");
      $("#job-error").textContent = job.error || "";
      const sweep = (job.labels || {}).sweep; // a sweep's trials are jobs labelled with it (worker/sweeps.py)
      $("#job-sweep").replaceChildren(...(sweep ? [`trial ${job.labels.trial ?? ""} of `,
        el("a", { href: `#/sweeps/${encodeURIComponent(sweep)}` }, `sweep ${sweep.slice(0, 8)}`)] : []));
      $("#cancel").disabled = !CANCELLABLE.has(job.status);
      $("#timeline").replaceChildren(...events.map((e) => el("li", {}, el("b", {}, e.to_status), ` ${fmt.time(e.at)} `,
        el("span", { class: "muted" }, e.reason))));
      const runtime = job.runtime || {};
      $("#runtime").replaceChildren(...RUNTIME.filter(([k]) => k in runtime).map(([k, label]) =>
        el("tr", {}, el("td", {}, label), el("td", {}, Array.isArray(runtime[k]) ? runtime[k].join("; ") || "none" : runtime[k]))));
      if (!Object.keys(runtime).length) $("#runtime").append(el("tr", {}, el("td", {}, "chosen when the job starts")));
      $("#advice").replaceChildren(...adviceItems(job.advice));
      $("#final-metrics").replaceChildren(...metricsRows(job.metrics, TERMINAL.has(job.status), Boolean(job.spec && job.spec.program)));
      if (!epochs.length) draw(); // what the charts say without epochs depends on the job
      const models = (job.metrics || {}).optimization;
      if (Array.isArray(models) && models.length) modelsTable(models);
      else {
        $("#models thead").replaceChildren();
        $("#models tbody").replaceChildren(el("tr", {}, el("td", { class: "muted" }, "compared here when the job succeeds")));
      }
      stepTime(job.metrics || {}, TERMINAL.has(job.status));
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
    if (name === "end") streamEnded = true; // every epoch the job wrote has come
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

// --- sweeps -------------------------------------------------------------------------------------

const doneTrials = (counts) => [TRIAL.COMPLETE, TRIAL.PRUNED, TRIAL.FAIL].reduce((n, s) => n + (counts[s] || 0), 0);
const lastValue = (t) => (t.curve.length ? t.curve[t.curve.length - 1] : null); // [epoch, value]

function sweepsPage() {
  show("sweeps");
  let stopped = false;
  async function refresh() {
    try {
      const { sweeps } = await (await api("/v1/sweeps?limit=100")).json();
      $("#sweeps-error").textContent = "";
      $("#sweeps-table tbody").replaceChildren(...sweeps.map((s) => el("tr", { "data-sweep": s.id, onclick: () => (location.hash = `#/sweeps/${s.id}`) },
        el("td", {}, s.name), el("td", { class: "muted" }, s.id.slice(0, 8)),
        el("td", {}, el("span", { class: `status ${s.status}` }, s.status)),
        el("td", {}, s.best ? `${s.objective.metric} ${fmt.num(s.best.value)}` : ""),
        el("td", {}, `${doneTrials(s.trials)} / ${s.trials.planned}`),
        el("td", {}, fmt.usd(s.cost_usd)),
        el("td", { title: fmt.time(s.created_at) }, `${fmt.age(s.created_at)} ago`))));
      $("#sweeps-table").hidden = sweeps.length === 0;
      $("#sweeps-empty").hidden = sweeps.length !== 0;
    } catch (e) {
      $("#sweeps-error").textContent = e.message;
    }
  }
  (async () => { while (!stopped) { await refresh(); await sleep(3000); } })();
  return { stop() { stopped = true; } };
}

const TRIAL_COLORS = ["#2f6fde", "#e08a1e", "#2a9d57", "#7a4fd0", "#c23b32", "#1b9aaa", "#b5487f", "#8a6d1f"];

function drawTrials(trials, goal) {
  // Objective by trial number: a dot per completed trial, a ring per pruned one at its last reported
  // value, and the best so far as a line.
  const points = [];
  let best = null;
  for (const t of [...trials].sort((a, b) => a.number - b.number)) {
    const last = lastValue(t);
    if (t.state === TRIAL.COMPLETE && typeof t.value === "number") {
      best = best === null ? t.value : (goal === "minimize" ? Math.min : Math.max)(best, t.value);
      points.push({ number: t.number, complete: t.value, best });
    } else if (t.state === TRIAL.PRUNED && last) points.push({ number: t.number, pruned: last[1] });
  }
  chart($("#chart-trials"), [
    { key: "best", label: "best so far", color: "#2a9d57", dots: false },
    { key: "complete", label: "complete", color: "#2f6fde", line: false },
    { key: "pruned", label: "pruned", color: "#e08a1e", line: false, ring: true }], points, { x: "number", xLabel: "trial" });
  // Objective by epoch: every trial's curve, one line each, a pruned trial's dashed.
  const epochs = new Map();
  for (const t of trials) {
    for (const [epoch, value] of t.curve) {
      if (!epochs.has(epoch)) epochs.set(epoch, { epoch });
      epochs.get(epoch)[`t${t.number}`] = value;
    }
  }
  chart($("#chart-curves"), trials.map((t) => ({ key: `t${t.number}`, label: `#${t.number}`,
    color: TRIAL_COLORS[t.number % TRIAL_COLORS.length], dash: t.state === TRIAL.PRUNED })),
  [...epochs.values()].sort((a, b) => a.epoch - b.epoch));
}

function sweepPage(id) {
  show("sweep");
  let stopped = false, sweep = null;
  for (const sel of ["#sweep-name", "#sweep-status", "#sweep-id", "#sweep-note", "#sweep-error"]) $(sel).textContent = "";
  for (const sel of ["#sweep-best", "#sweep-counts", "#trials-table tbody"]) $(sel).replaceChildren();
  $("#sweep-cancel").disabled = true;
  drawTrials([], "maximize");

  async function load() {
    try {
      const found = await (await api(`/v1/sweeps/${id}`)).json();
      const { trials } = await (await api(`/v1/sweeps/${id}/trials`)).json();
      if (stopped) return;
      sweep = found;
      const { metric, goal } = sweep.objective;
      $("#sweep-name").textContent = sweep.name;
      $("#sweep-status").textContent = sweep.status;
      $("#sweep-status").className = `status ${sweep.status}`;
      $("#sweep-id").textContent = `${sweep.id} · ${goal} ${metric} · ${sweep.spec.algorithm} · created ${fmt.time(sweep.created_at)}` +
        (sweep.finished_at ? ` · ended ${fmt.time(sweep.finished_at)}` : "");
      $("#sweep-note").textContent = [sweep.note, sweep.wait_reason ? `waiting: ${sweep.wait_reason}` : ""].filter(Boolean).join(" · ");
      $("#sweep-error").textContent = "";
      $("#sweep-cancel").disabled = !SWEEP_CANCELLABLE.has(sweep.status);
      const b = sweep.best;
      $("#sweep-best").replaceChildren(...(b ? [
        el("p", {}, el("b", { id: "best-value" }, `${metric} ${fmt.num(b.value)}`), ` · trial #${b.number} · `,
          el("a", { id: "best-job", href: `#/jobs/${b.job_id}` }, `job ${b.job_id.slice(0, 8)}`)),
        el("table", { id: "best-params" }, ...Object.entries(b.params).map(([k, v]) => el("tr", {}, el("td", {}, k), el("td", {}, fmt.num(v)))))]
        : [el("p", { class: "muted" }, "none yet: the first trial to complete is the best so far")]));
      $("#sweep-counts").replaceChildren(
        ...Object.values(TRIAL).map((s) => el("tr", {}, el("td", {}, s), el("td", {}, sweep.trials[s] || 0))),
        el("tr", {}, el("td", {}, "planned (at most)"), el("td", {}, sweep.trials.planned)),
        el("tr", {}, el("td", {}, "cost"), el("td", {}, fmt.usd(sweep.cost_usd))),
        el("tr", {}, el("td", {}, "accelerator seconds"), el("td", {}, fmt.num(sweep.accelerator_seconds))));
      drawTrials(trials, goal);
      $("#trials-table tbody").replaceChildren(...trials.map((t) => {
        const last = lastValue(t);
        return el("tr", { "data-trial": t.number, onclick: () => (location.hash = `#/jobs/${t.job_id}`) },
          el("td", {}, t.number), el("td", {}, el("span", { class: `status ${t.state}` }, t.state)),
          el("td", {}, typeof t.value === "number" ? fmt.num(t.value) : last ? el("span", { class: "muted" }, `${fmt.num(last[1])} at epoch ${last[0]}`) : ""),
          el("td", {}, fmt.params(t.params)),
          el("td", {}, el("a", { href: `#/jobs/${t.job_id}` }, t.job_status), " ",
            el("span", { class: "muted" }, [t.job_error, t.wait_reason ? `waiting: ${t.wait_reason}` : ""].filter(Boolean).join(" · "))),
          el("td", {}, fmt.usd(t.cost_usd)));
      }));
    } catch (e) {
      if (!stopped) $("#sweep-error").textContent = e.message;
    }
  }

  $("#sweep-cancel").onclick = async () => {
    if (!confirm(`Cancel sweep ${sweep ? sweep.name : id}? Its running trials' jobs are cancelled.`)) return;
    $("#sweep-cancel").disabled = true;
    try { await api(`/v1/sweeps/${id}/cancel`, { method: "POST" }); } catch (e) { $("#sweep-error").textContent = e.message; }
    load();
  };

  // A sweep has no stream of its own: it is read again every few seconds until it ends (a trial's
  // epochs stream on its job's page).
  (async () => {
    while (!stopped) {
      await load();
      if (sweep && SWEEP_TERMINAL.has(sweep.status)) break;
      await sleep(3000);
    }
  })();
  return { stop() { stopped = true; } };
}

// --- routing ------------------------------------------------------------------------------------

function route() {
  if (page) page.stop();
  page = null;
  if (!key()) { show("signin"); return; }
  const match = location.hash.match(/^#\/(jobs|sweeps)\/([0-9a-f-]{36})$/);
  if (match) page = match[1] === "jobs" ? jobPage(match[2]) : sweepPage(match[2]);
  else page = location.hash.startsWith("#/sweeps") ? sweepsPage() : jobsPage();
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
