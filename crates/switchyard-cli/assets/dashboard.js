// The Switchyard dashboard: an operations console over the JSON API, with no build
// step. Views by URL hash: overview (#), jobs (#jobs?queue=&state=&q=&page=), dead
// letters (#dead), workers (#workers) and one job (#job/ID, followed live over
// Server-Sent Events). Every value from the server goes in as text, never as HTML.
"use strict";

const $ = (id) => document.getElementById(id);
const STATES = ["pending", "running", "retrying", "completed", "failed", "dead", "cancelled"];
const FINAL = new Set(["completed", "failed", "dead", "cancelled"]);
const PAGE = 25;

// ---- small helpers ---------------------------------------------------------------

function cell(text, cls) {
  const td = document.createElement("td");
  td.textContent = text ?? "";
  if (cls) td.className = cls;
  return td;
}

function age(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  if (seconds < 1) return Math.round(seconds * 1000) + " ms";
  if (seconds < 120) return seconds.toFixed(1) + " s";
  if (seconds < 7200) return Math.round(seconds / 60) + " min";
  return Math.round(seconds / 3600) + " h";
}

// Today's times as a time of day; older ones with their date.
function when(text) {
  if (!text) return "";
  const d = new Date(text);
  if (isNaN(d)) return text;
  const today = new Date().toDateString() === d.toDateString();
  return today ? d.toLocaleTimeString() : d.toLocaleDateString() + " " + d.toLocaleTimeString();
}

function ago(text) {
  const t = Date.parse(text);
  return isNaN(t) ? "" : age(Math.max(0, (Date.now() - t) / 1000)) + " ago";
}

const ms = (from, to) => { const a = Date.parse(from), b = Date.parse(to); return isNaN(a) || isNaN(b) ? "" : Math.max(0, b - a) + " ms"; };

const pretty = (value) => (value == null ? "" : JSON.stringify(value, null, 2));

// A long id shortened, the whole one on hover, with a button that copies it.
function idCell(id, href) {
  const td = document.createElement("td");
  td.className = "id";
  const label = id.length > 16 ? id.slice(0, 8) + "…" + id.slice(-4) : id;
  const text = href ? document.createElement("a") : document.createElement("span");
  if (href) text.href = href;
  text.textContent = label;
  text.title = id;
  const copy = document.createElement("button");
  copy.type = "button";
  copy.className = "copy";
  copy.textContent = "copy";
  copy.title = "Copy " + id;
  copy.addEventListener("click", () => copyText(id, copy));
  td.append(text, copy);
  return td;
}

async function copyText(text, button) {
  try {
    await navigator.clipboard.writeText(text);
    button.textContent = "copied";
  } catch (e) {
    button.textContent = "copy failed";
  }
  setTimeout(() => { button.textContent = "copy"; }, 1200);
}

async function getJson(path) {
  const response = await fetch(path, { headers: { Accept: "application/json" } });
  const body = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

async function postJson(path, body) {
  const headers = { "Content-Type": "application/json", Accept: "application/json" };
  const token = $("token").value || sessionStorage.getItem("switchyard-token");
  if (token) headers.Authorization = "Bearer " + token;
  const response = await fetch(path, { method: "POST", headers, body: JSON.stringify(body) });
  const answer = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(answer.error || response.statusText);
  return answer;
}

function problem(message) {
  $("problem").hidden = !message;
  $("problem").textContent = message || "";
}

function fillQueues(select, names) {
  const chosen = select.value;
  const want = ["", ...names];
  const have = [...select.options].map((o) => o.value);
  if (want.join("\n") === have.join("\n")) return;
  select.replaceChildren();
  for (const name of want) {
    const o = document.createElement("option");
    o.value = name;
    o.textContent = name || "all queues";
    select.append(o);
  }
  select.value = want.includes(chosen) ? chosen : "";
}

// ---- overview --------------------------------------------------------------------

let statusStore = true;
let holders = false;
let queueNames = [];

function renderStats(stats) {
  $("transport").textContent = stats.transport;
  $("token-box").hidden = !stats.token_required;
  statusStore = stats.status_store;
  holders = stats.holders;
  queueNames = stats.queues.map((q) => q.queue).sort();
  const body = $("queues").tBodies[0];
  body.replaceChildren();
  let dead = 0;
  for (const q of stats.queues) {
    const tr = document.createElement("tr");
    tr.dataset.queue = q.queue;
    const name = document.createElement("td");
    name.className = "nowrap";
    const link = document.createElement("a");
    link.href = "#jobs?queue=" + encodeURIComponent(q.queue);
    link.textContent = q.queue;
    name.append(link);
    tr.append(
      name,
      cell(q.ready, "num ready"),
      cell(q.reserved, "num reserved"),
      cell(q.delayed, "num delayed"),
      cell(q.dead, "num dead"),
      cell(age(q.oldest_ready_age_seconds ?? q.oldest_ready_age), "num age"),
    );
    body.append(tr);
    dead += q.dead;
  }
  $("no-queues").hidden = stats.queues.length > 0;
  $("dead-count").hidden = dead === 0;
  $("dead-count").textContent = String(dead);
  renderChart(stats);
}

// Bars of completed and failed jobs per second for each interval, with a rate axis
// and a time axis.
function renderChart(stats) {
  const svg = $("chart");
  svg.replaceChildren();
  const ns = "http://www.w3.org/2000/svg";
  const add = (name, attrs, text) => {
    const el = document.createElementNS(ns, name);
    for (const [k, v] of Object.entries(attrs)) el.setAttribute(k, String(v));
    if (text !== undefined) el.textContent = text;
    svg.append(el);
    return el;
  };
  const [W, H, left, right, top, bottom] = [640, 220, 48, 10, 10, 26];
  const plotW = W - left - right, plotH = H - top - bottom;
  const seconds = stats.bucket_seconds;
  const slots = Math.round(stats.window_seconds / seconds);
  const bucket = seconds * 1000;
  const now = Date.now();
  const start = Math.floor(now / bucket) * bucket - (slots - 1) * bucket;
  const ok = new Array(slots).fill(0), bad = new Array(slots).fill(0);
  for (const p of stats.throughput || []) {
    const i = Math.round((Date.parse(p.at) - start) / bucket);
    if (i >= 0 && i < slots) { ok[i] += p.completed; bad[i] += p.failed; }
  }
  const rates = ok.map((v, i) => Math.max(v, bad[i]) / seconds);
  const peak = Math.max(...rates);
  const step = niceStep(peak / 4);
  const yMax = Math.max(step * 4, step);
  for (let k = 0; k <= 4; k++) {
    const v = step * k;
    if (v > yMax + 1e-9) break;
    const y = top + plotH - (v / yMax) * plotH;
    add("line", { x1: left, x2: W - right, y1: y, y2: y, class: k === 0 ? "axis" : "grid" });
    add("text", { x: left - 6, y: y + 4, "text-anchor": "end" }, formatRate(v));
  }
  add("text", { x: 4, y: top + 8 }, "jobs/s");
  add("line", { x1: left, x2: left, y1: top, y2: top + plotH, class: "axis" });
  const w = plotW / slots;
  for (let i = 0; i < slots; i++) {
    const x = left + i * w;
    for (const [value, cls, dx] of [[ok[i], "ok", 1], [bad[i], "bad", w / 2]]) {
      if (value <= 0) continue;
      const h = (value / seconds / yMax) * plotH;
      const r = add("rect", { x: x + dx, width: Math.max(1, w / 2 - 1.5), y: top + plotH - h, height: h, class: cls });
      const title = document.createElementNS(ns, "title");
      title.textContent = value + (cls === "ok" ? " completed" : " failed or dead") + " in " + seconds + " s";
      r.append(title);
    }
  }
  const minutes = Math.round(stats.window_seconds / 60);
  for (let m = 0; m <= minutes; m++) {
    const x = left + plotW - (m * 60 / stats.window_seconds) * plotW;
    add("line", { x1: x, x2: x, y1: top + plotH, y2: top + plotH + 4, class: "axis" });
    add("text", { x, y: H - 8, "text-anchor": m === 0 ? "end" : "middle" }, m === 0 ? "now" : "−" + m + " min");
  }
  if (!stats.status_store) {
    $("rate").textContent = "(needs the status store)";
    return;
  }
  const lastMinute = ok.slice(-6).reduce((a, b) => a + b, 0) + bad.slice(-6).reduce((a, b) => a + b, 0);
  $("rate").textContent = "· " + (lastMinute / 60).toFixed(1) + " jobs/s over the last minute";
}

function niceStep(x) {
  if (!(x > 0)) return 1;
  const p = Math.pow(10, Math.floor(Math.log10(x)));
  for (const m of [1, 2, 5, 10]) if (m * p >= x) return m * p;
  return 10 * p;
}

function formatRate(v) {
  return v >= 10 ? String(Math.round(v)) : String(Math.round(v * 100) / 100);
}

// ---- jobs ------------------------------------------------------------------------

function jobsQuery() {
  const params = new URLSearchParams(location.hash.split("?")[1] || "");
  return {
    queue: params.get("queue") || "",
    state: params.get("state") || "",
    q: params.get("q") || "",
    page: Math.max(0, Number(params.get("page") || 0) | 0),
  };
}

function jobsHash(q) {
  const params = new URLSearchParams();
  for (const k of ["queue", "state", "q"]) if (q[k]) params.set(k, q[k]);
  if (q.page) params.set("page", String(q.page));
  const text = params.toString();
  return "#jobs" + (text ? "?" + text : "");
}

async function refreshJobs() {
  const q = jobsQuery();
  fillQueues($("jobs-queue"), queueNames);
  $("jobs-queue").value = q.queue;
  if (document.activeElement !== $("jobs-search")) $("jobs-search").value = q.q;
  if (!statusStore) {
    problem("Job lists need the status store (a SQL DATABASE_URL, QUEUE_STATUS=on).");
    return;
  }
  const params = new URLSearchParams({ limit: String(PAGE + 1), offset: String(q.page * PAGE) });
  for (const k of ["queue", "state", "q"]) if (q[k]) params.set(k, q[k]);
  const [jobs, counts] = await Promise.all([getJson("/api/jobs?" + params), getJson("/api/counts")]);
  renderStateTabs(q, counts);
  const shown = jobs.slice(0, PAGE);
  renderJobRows($("joblist"), shown);
  $("no-jobs").hidden = shown.length > 0;
  $("prev").disabled = q.page === 0;
  $("next").disabled = jobs.length <= PAGE;
  $("page-info").textContent = shown.length
    ? "jobs " + (q.page * PAGE + 1) + "–" + (q.page * PAGE + shown.length)
    : "";
}

function renderJobRows(table, jobs) {
  const body = table.tBodies[0];
  body.replaceChildren();
  for (const j of jobs) {
    const tr = document.createElement("tr");
    tr.dataset.id = j.id;
    tr.dataset.state = j.state;
    const state = document.createElement("td");
    const badge = document.createElement("span");
    badge.className = "state state-" + j.state;
    badge.textContent = j.state;
    state.append(badge);
    tr.append(idCell(j.id, "#job/" + j.id), cell(j.queue, "nowrap"), cell(j.kind), state, cell(j.attempts, "num"),
      cell(j.progress + "%", "num"), cell(j.worker || ""), cell(when(j.updated_at), "nowrap"));
    body.append(tr);
  }
}

function renderStateTabs(q, counts) {
  const totals = Object.fromEntries(STATES.map((s) => [s, 0]));
  let all = 0;
  for (const c of counts) {
    if (q.queue && c.queue !== q.queue) continue;
    totals[c.state] = (totals[c.state] || 0) + c.count;
    all += c.count;
  }
  const tabs = $("state-tabs");
  tabs.replaceChildren();
  for (const state of ["", ...STATES]) {
    const b = document.createElement("button");
    b.type = "button";
    b.dataset.state = state || "all";
    b.className = q.state === state ? "active" : "";
    b.append(state || "all");
    const n = document.createElement("span");
    n.className = "n";
    n.textContent = String(state ? totals[state] : all);
    b.append(n);
    b.addEventListener("click", () => { location.hash = jobsHash({ ...q, state, page: 0 }); });
    tabs.append(b);
  }
}

// ---- dead letters ----------------------------------------------------------------

const selected = new Set();
// Payloads the operator opened stay open across the page's redraws.
const openPayloads = new Set();

async function refreshDead() {
  fillQueues($("dead-queue"), queueNames);
  const queue = $("dead-queue").value;
  const letters = await getJson("/api/dead?limit=200" + (queue ? "&queue=" + encodeURIComponent(queue) : ""));
  const present = new Set(letters.map((d) => d.id));
  for (const id of [...selected]) if (!present.has(id)) selected.delete(id);
  const body = $("dead").tBodies[0];
  body.replaceChildren();
  for (const d of letters) {
    const tr = document.createElement("tr");
    tr.dataset.id = d.id;
    tr.className = selected.has(d.id) ? "selected" : "";
    const pick = document.createElement("input");
    pick.type = "checkbox";
    pick.className = "pick";
    pick.checked = selected.has(d.id);
    pick.setAttribute("aria-label", "select " + d.id);
    pick.addEventListener("change", () => {
      if (pick.checked) selected.add(d.id); else selected.delete(d.id);
      tr.className = pick.checked ? "selected" : "";
      updateSelection(letters.length);
    });
    const pickCell = document.createElement("td");
    pickCell.append(pick);
    const error = document.createElement("td");
    error.className = "err";
    error.textContent = (d.last_error || "").split("\n")[0];
    error.title = d.last_error || "";
    const more = document.createElement("details");
    more.open = openPayloads.has(d.id);
    more.addEventListener("toggle", () => {
      if (more.open) openPayloads.add(d.id); else openPayloads.delete(d.id);
    });
    const summary = document.createElement("summary");
    const compact = d.payload === null || d.payload === undefined ? (d.raw || "") : JSON.stringify(d.payload);
    summary.textContent = compact.length > 40 ? compact.slice(0, 40) + "…" : compact;
    const pre = document.createElement("pre");
    pre.textContent = d.payload === null || d.payload === undefined ? (d.raw || "") : pretty(d.payload);
    more.append(summary, pre);
    const payloadCell = document.createElement("td");
    payloadCell.className = "payload";
    payloadCell.append(more);
    const button = document.createElement("button");
    button.type = "button";
    button.className = "replay";
    button.textContent = "Replay";
    button.addEventListener("click", () => act("replay", { id: d.id }, "Replay " + d.id + "?"));
    const actions = document.createElement("td");
    actions.append(button);
    tr.append(pickCell, idCell(d.id, "#job/" + d.id), cell(d.queue, "nowrap"), cell(d.kind), cell(d.reason),
      cell(d.attempts, "num"), error, payloadCell, cell(when(d.dead_at), "nowrap"), actions);
    body.append(tr);
  }
  $("no-dead").hidden = letters.length > 0;
  updateSelection(letters.length);
}

function updateSelection(total) {
  const n = selected.size;
  $("replay-selected").disabled = n === 0;
  $("purge-selected").disabled = n === 0;
  $("replay-selected").textContent = n ? "Replay " + n + " selected" : "Replay selected";
  $("purge-selected").textContent = n ? "Purge " + n + " selected" : "Purge selected";
  $("dead-all").checked = n > 0 && n === total;
}

// Replays or purges after the operator confirms; says what happened.
async function act(verb, body, question) {
  if (!window.confirm(question)) return;
  const queue = $("dead-queue").value;
  if (queue && !body.id && !body.ids) body.queue = queue;
  try {
    const answer = await postJson("/api/dead/" + verb, body);
    const n = verb === "replay" ? answer.replayed : answer.purged;
    const what = body.id ? body.id : n + " dead letter" + (n === 1 ? "" : "s");
    $("dead-message").textContent = (verb === "replay" ? "Replayed " : "Purged ") + what + ".";
    if (body.ids) selected.clear();
    await refreshDead();
  } catch (e) {
    $("dead-message").textContent = (verb === "replay" ? "Replay" : "Purge") + " failed: " + e.message;
  }
}

// ---- flow control ----------------------------------------------------------------

// Paused queues and kinds (each with a Resume button) and the limits' keys.
async function refreshFlow() {
  const flow = await getJson("/api/controls");
  $("flow").hidden = !flow.available;
  if (!flow.available) return;
  const names = $("queue-names");
  names.replaceChildren(...queueNames.map((q) => { const o = document.createElement("option"); o.value = q; return o; }));
  const paused = $("paused").tBodies[0];
  paused.replaceChildren();
  for (const p of flow.paused) {
    const tr = document.createElement("tr");
    const td = document.createElement("td");
    const button = document.createElement("button");
    button.type = "button";
    button.textContent = "Resume";
    button.addEventListener("click", () => control("resume", { queue: p.queue, kind: p.kind }));
    td.append(button);
    tr.append(cell(p.queue, "nowrap"), cell(p.kind || "every kind"), td);
    paused.append(tr);
  }
  $("no-paused").hidden = flow.paused.length > 0;
  const limits = $("limits").tBodies[0];
  limits.replaceChildren();
  for (const l of flow.limits) {
    const tr = document.createElement("tr");
    tr.append(cell(l.queue, "nowrap"), cell(l.key), cell(l.running, "num"), cell(l.concurrency ?? "–", "num"),
      cell(l.rate_per_second === null ? "–" : l.rate_per_second.toFixed(2), "num"),
      cell(l.tokens === null ? "–" : l.tokens.toFixed(1), "num"));
    limits.append(tr);
  }
  $("no-limits").hidden = flow.limits.length > 0;
  const schedules = $("schedules").tBodies[0];
  schedules.replaceChildren();
  for (const s of flow.schedules) {
    const tr = document.createElement("tr");
    const when = s.spec.cron ? s.spec.cron + " (" + (s.spec.timezone || "UTC") + ")" : "every " + s.spec.every;
    const next = s.error ? "cannot fire: " + s.error : s.paused ? "paused" : (s.next_run ? new Date(s.next_run).toLocaleString() : "–");
    tr.append(cell(s.name, "nowrap"), cell(when), cell(s.spec.queue, "nowrap"), cell(s.spec.kind),
      cell(s.spec.catch_up || "latest"), cell(next, "nowrap"));
    schedules.append(tr);
  }
  $("no-schedules").hidden = flow.schedules.length > 0;
}

async function control(verb, body) {
  const what = (body.kind ? "kind " + body.kind + " of " : "") + "queue " + body.queue;
  try {
    await postJson("/api/" + verb, body);
    $("flow-message").textContent = (verb === "pause" ? "Paused " : "Resumed ") + what + ".";
    await refreshFlow();
  } catch (e) {
    $("flow-message").textContent = (verb === "pause" ? "Pause" : "Resume") + " failed: " + e.message;
  }
}

async function cancelJob(id) {
  if (!window.confirm("Cancel job " + id + "? A waiting job never runs; a running one's handler is cancelled.")) return;
  try {
    await postJson("/api/jobs/" + encodeURIComponent(id) + "/cancel", {});
    $("job-cancel-message").textContent = "cancel asked: the worker ends it within a second, and its command within the grace period";
  } catch (e) {
    $("job-cancel-message").textContent = "cancel failed: " + e.message;
  }
}

// ---- workers ---------------------------------------------------------------------

async function refreshWorkers() {
  if (!statusStore) return;
  const workers = await getJson("/api/workers");
  $("worker-count").hidden = workers.length === 0;
  $("worker-count").textContent = String(workers.length);
  if ($("view-workers").hidden) return;
  const body = $("workers").tBodies[0];
  body.replaceChildren();
  for (const w of workers) {
    const tr = document.createElement("tr");
    tr.dataset.pid = String(w.pid);
    tr.dataset.queue = w.queue;
    tr.append(cell(w.host), cell(w.pid, "num"), cell(w.queue), cell(w.concurrency, "num"),
      cell(when(w.started_at)), cell(ago(w.heartbeat_at)), cell(w.jobs_done, "num"));
    body.append(tr);
  }
  $("no-workers").hidden = workers.length > 0;
}

async function refreshHeld() {
  if ($("view-workers").hidden) return;
  const body = $("held").tBodies[0];
  body.replaceChildren();
  if (!holders) {
    $("no-held").hidden = false;
    $("no-held").textContent = "This backend does not say which worker holds which message.";
    return;
  }
  const held = await getJson("/api/held?limit=200");
  for (const h of held) {
    const tr = document.createElement("tr");
    tr.dataset.id = h.id;
    tr.append(idCell(h.id, "#job/" + encodeURIComponent(h.id)), cell(h.queue), cell(h.kind),
      cell(h.holder || ""), cell(ago(h.claimed_at)), cell(when(h.lease_until)),
      cell(h.attempts + 1, "num"), cell(h.started ? "yes" : "claimed ahead"));
    body.append(tr);
  }
  $("no-held").textContent = "No message is held.";
  $("no-held").hidden = held.length > 0;
}

// ---- one job ---------------------------------------------------------------------

let events = null;
let following = null;

function showJob(s) {
  $("job-cancel").hidden = FINAL.has(s.state);
  $("job-state").className = "state state-" + s.state;
  $("job-progress").value = s.progress;
  const text = {
    "job-state": s.state, "job-where": s.queue + " / " + s.kind, "job-attempts": String(s.attempts),
    "job-progress-text": s.progress + "%" + (s.progress_message ? " · " + s.progress_message : ""),
    "job-worker": s.worker || "", "job-created": when(s.created_at), "job-started": when(s.started_at),
    "job-finished": when(s.finished_at), "job-result": pretty(s.result),
    "job-duration": s.started_at ? ms(s.started_at, s.finished_at || new Date().toISOString()) : "",
    "job-error": s.state === "completed" ? "" : (s.last_error || ""),
  };
  for (const [id, t] of Object.entries(text)) $(id).textContent = t;
  if (s.payload !== undefined) $("job-payload").textContent = pretty(s.payload);
}

// The job's attempts and location (which the event stream does not carry).
let logTimer = null;
async function loadJobView(id) {
  try {
    const view = await getJson("/api/jobs/" + encodeURIComponent(id) + "/view");
    if (following !== id) return;
    $("job-location").textContent = view.location;
    $("job-held").textContent = view.held ? (view.held.holder || "") + " until " + when(view.held.lease_until) : "";
    $("job-checkpoint").textContent = view.checkpoint == null ? "" : pretty(view.checkpoint);
    $("job-output").textContent = view.logs.map((l) => "── attempt " + l.attempt + " ──\n" + l.lines).join("");
    if (view.status) showJob(view.status);
    else if (view.dead_letter) {
      const d = view.dead_letter;
      $("job-state").textContent = "dead";
      $("job-state").className = "state state-dead";
      $("job-where").textContent = d.queue + " / " + d.kind;
      $("job-attempts").textContent = String(d.attempts);
      $("job-error").textContent = d.last_error || "";
    }
    if (!view.status) $("job-payload").textContent = pretty(view.payload);
    const body = $("attempts").tBodies[0];
    body.replaceChildren();
    for (const a of view.attempts) {
      const tr = document.createElement("tr");
      tr.dataset.attempt = String(a.attempt);
      const error = document.createElement("td"), pre = document.createElement("pre");
      pre.textContent = a.error || "";
      error.append(pre);
      tr.append(cell(a.attempt, "num"), cell(a.state), cell(a.worker || ""), cell(when(a.started_at)),
        cell(when(a.ended_at)), cell(a.started_at ? ms(a.started_at, a.ended_at) : "", "num"), error);
      body.append(tr);
    }
    $("no-attempts").hidden = view.attempts.length > 0;
  } catch (e) {
    problem("Job " + id + ": " + e.message);
  }
}

function follow(id) {
  if (following === id) return;
  if (events) events.close();
  following = id;
  $("job-id").textContent = id;
  $("job-log").replaceChildren();
  ["job-state", "job-result", "job-error", "job-where", "job-attempts", "job-progress-text", "job-location", "job-worker",
    "job-created", "job-started", "job-finished", "job-duration", "job-payload", "job-checkpoint", "job-output",
  ].forEach((f) => { $(f).textContent = ""; });
  $("attempts").tBodies[0].replaceChildren();
  delete document.body.dataset.lastEventAt;
  loadJobView(id);
  if (!statusStore) return;
  // Log lines come with no status event: read them again while the job runs.
  clearInterval(logTimer);
  logTimer = setInterval(() => following === id && events && !FINAL.has($("job-state").textContent) && loadJobView(id), 3000);
  events = new EventSource("/api/jobs/" + encodeURIComponent(id) + "/events");
  events.addEventListener("status", (message) => {
    const s = JSON.parse(message.data);
    // When the page got it, for the browser test's latency figure; not shown.
    document.body.dataset.lastEventAt = String(Date.now());
    showJob(s);
    const li = document.createElement("li");
    li.dataset.state = s.state;
    li.dataset.version = String(s.version);
    li.textContent = new Date().toLocaleTimeString() + " · " + s.state + " · attempt " + s.attempts + " · " + s.progress + "%" +
      (s.progress_message ? " · " + s.progress_message : "");
    $("job-log").append(li);
    if (s.state === "retrying" || s.state === "completed" || s.state === "failed" || s.state === "dead") {
      loadJobView(id);
    }
    if (s.state === "completed" || s.state === "failed" || s.state === "dead") {
      // The server ends the stream here; closing keeps EventSource from reconnecting.
      events.close();
      events = null;
    }
  });
}

// ---- routing and refresh -----------------------------------------------------------

function view() {
  const h = location.hash;
  if (h.startsWith("#job/")) return "job";
  if (h.startsWith("#jobs")) return "jobs";
  if (h.startsWith("#dead")) return "dead";
  if (h.startsWith("#workers")) return "workers";
  return "overview";
}

function route() {
  const v = view();
  for (const name of ["overview", "jobs", "dead", "workers", "job"]) $("view-" + name).hidden = name !== v;
  for (const a of document.querySelectorAll("header nav a")) a.classList.toggle("active", a.dataset.view === v);
  problem("");
  if (v === "job") {
    follow(decodeURIComponent(location.hash.slice(5)));
  } else {
    if (events) { events.close(); events = null; }
    following = null;
  }
  refresh();
}

let refreshing = false;

async function refresh() {
  if (refreshing) return;
  refreshing = true;
  try {
    renderStats(await getJson("/api/stats"));
    const v = view();
    if (v === "overview" && statusStore) renderJobRows($("recent"), await getJson("/api/jobs?limit=10"));
    if (v === "overview") await refreshFlow();
    if (v === "jobs") await refreshJobs();
    if (v === "dead") await refreshDead();
    await refreshWorkers();
    await refreshHeld();
    $("updated").textContent = "updated " + new Date().toLocaleTimeString();
  } catch (e) {
    $("updated").textContent = "not updated: " + e.message;
  } finally {
    refreshing = false;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("token").addEventListener("change", () => sessionStorage.setItem("switchyard-token", $("token").value));
  $("jobs-queue").addEventListener("change", () => {
    location.hash = jobsHash({ ...jobsQuery(), queue: $("jobs-queue").value, page: 0 });
  });
  $("jobs-search-form").addEventListener("submit", (e) => {
    e.preventDefault();
    location.hash = jobsHash({ ...jobsQuery(), q: $("jobs-search").value.trim(), page: 0 });
  });
  $("prev").addEventListener("click", () => { const q = jobsQuery(); location.hash = jobsHash({ ...q, page: Math.max(0, q.page - 1) }); });
  $("next").addEventListener("click", () => { const q = jobsQuery(); location.hash = jobsHash({ ...q, page: q.page + 1 }); });
  $("dead-queue").addEventListener("change", () => { selected.clear(); refreshDead(); });
  $("dead-all").addEventListener("change", () => {
    for (const box of document.querySelectorAll("#dead tbody input.pick")) {
      box.checked = $("dead-all").checked;
      box.dispatchEvent(new Event("change"));
    }
  });
  $("replay-selected").addEventListener("click", () =>
    act("replay", { ids: [...selected] }, "Replay " + selected.size + " dead letters?"));
  $("purge-selected").addEventListener("click", () =>
    act("purge", { ids: [...selected] }, "Delete " + selected.size + " dead letters for good?"));
  $("replay-all").addEventListener("click", () => {
    const queue = $("dead-queue").value;
    act("replay", { all: true }, "Replay every dead letter" + (queue ? " of " + queue : " of every queue") + "?");
  });
  $("purge-older").addEventListener("click", () => {
    const age = $("purge-age").value.trim();
    act("purge", { older_than: age }, "Delete the dead letters dead for more than " + age + " for good?");
  });
  $("job-copy").addEventListener("click", () => copyText($("job-id").textContent, $("job-copy")));
  $("job-cancel").addEventListener("click", () => cancelJob($("job-id").textContent));
  $("pause-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const kind = $("pause-kind").value.trim();
    control("pause", { queue: $("pause-queue").value.trim(), kind: kind || null });
  });
  window.addEventListener("hashchange", route);
  route();
  setInterval(() => { if (view() !== "job") refresh(); }, 1000);
});
