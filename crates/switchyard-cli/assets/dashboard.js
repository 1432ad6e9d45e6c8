// The Switchyard dashboard: polls the JSON API, follows one job with Server-Sent
// Events. Every value from the server goes in as text, never as HTML.
"use strict";

const $ = (id) => document.getElementById(id);

function cell(text, cls) {
  const td = document.createElement("td");
  td.textContent = text === null || text === undefined ? "" : String(text);
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

function when(text) {
  if (!text) return "";
  const d = new Date(text);
  return isNaN(d) ? text : d.toLocaleTimeString();
}

async function getJson(path) {
  const response = await fetch(path, { headers: { Accept: "application/json" } });
  const body = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(body.error || response.statusText);
  return body;
}

async function postJson(path, body) {
  const headers = { "Content-Type": "application/json", Accept: "application/json" };
  const token = sessionStorage.getItem("switchyard-token") || $("token").value;
  if (token) headers.Authorization = "Bearer " + token;
  const response = await fetch(path, { method: "POST", headers, body: JSON.stringify(body) });
  const answer = await response.json().catch(() => ({}));
  if (!response.ok) throw new Error(answer.error || response.statusText);
  return answer;
}

function renderQueues(stats) {
  $("transport").textContent = stats.transport;
  $("token-box").hidden = !stats.token_required;
  const body = $("queues").tBodies[0];
  body.replaceChildren();
  for (const q of stats.queues) {
    const tr = document.createElement("tr");
    tr.dataset.queue = q.queue;
    tr.append(
      cell(q.queue),
      cell(q.ready, "num ready"),
      cell(q.reserved, "num reserved"),
      cell(q.delayed, "num delayed"),
      cell(q.dead, "num dead"),
      cell(age(q.oldest_ready_age_seconds ?? q.oldest_ready_age), "num age"),
    );
    body.append(tr);
  }
  $("no-queues").hidden = stats.queues.length > 0;
  renderChart(stats);
  $("updated").textContent = "updated " + new Date().toLocaleTimeString();
}

function renderChart(stats) {
  const svg = $("chart");
  svg.replaceChildren();
  const points = stats.throughput || [];
  const bucket = stats.bucket_seconds * 1000;
  const slots = Math.round(stats.window_seconds / stats.bucket_seconds);
  const now = Date.now();
  const start = Math.floor(now / bucket) * bucket - (slots - 1) * bucket;
  const ok = new Array(slots).fill(0);
  const bad = new Array(slots).fill(0);
  for (const p of points) {
    const i = Math.round((Date.parse(p.at) - start) / bucket);
    if (i >= 0 && i < slots) {
      ok[i] += p.completed;
      bad[i] += p.failed;
    }
  }
  const top = Math.max(1, ...ok.map((v, i) => v + bad[i]));
  const w = 600 / slots;
  const ns = "http://www.w3.org/2000/svg";
  for (let i = 0; i < slots; i++) {
    const hOk = (ok[i] / top) * 115;
    const hBad = (bad[i] / top) * 115;
    for (const [h, y, cls] of [[hOk, 120 - hOk, "ok"], [hBad, 120 - hOk - hBad, "bad"]]) {
      if (h <= 0) continue;
      const r = document.createElementNS(ns, "rect");
      r.setAttribute("x", String(i * w + 1));
      r.setAttribute("width", String(Math.max(1, w - 2)));
      r.setAttribute("y", String(y));
      r.setAttribute("height", String(h));
      r.setAttribute("class", cls);
      svg.append(r);
    }
  }
  if (!stats.status_store) {
    $("rate").textContent = "(needs the status store)";
    return;
  }
  const lastMinute = ok.slice(-6).reduce((a, b) => a + b, 0) + bad.slice(-6).reduce((a, b) => a + b, 0);
  $("rate").textContent = "· " + (lastMinute / 60).toFixed(1) + " jobs/s over the last minute";
}

function renderDead(letters) {
  const body = $("dead").tBodies[0];
  body.replaceChildren();
  for (const d of letters) {
    const tr = document.createElement("tr");
    tr.dataset.id = d.id;
    const button = document.createElement("button");
    button.type = "button";
    button.className = "replay";
    button.dataset.id = d.id;
    button.textContent = "Replay";
    button.addEventListener("click", () => replay(d.id, button));
    const actions = document.createElement("td");
    actions.append(button);
    const error = cell((d.last_error || "").split("\n")[0], "err");
    error.title = d.last_error || "";
    tr.append(cell(d.id), cell(d.queue), cell(d.kind), cell(d.reason), cell(d.attempts, "num"), error, cell(when(d.dead_at)), actions);
    body.append(tr);
  }
  $("no-dead").hidden = letters.length > 0;
}

async function replay(id, button) {
  button.disabled = true;
  try {
    const answer = await postJson("/api/dead/replay", { id });
    $("dead-message").textContent = answer.replayed ? "Replayed " + id + "." : id + " was no longer dead.";
    await refresh();
  } catch (e) {
    $("dead-message").textContent = "Replay failed: " + e.message;
    button.disabled = false;
  }
}

function renderJobs(jobs) {
  const body = $("jobs").tBodies[0];
  body.replaceChildren();
  for (const j of jobs) {
    const tr = document.createElement("tr");
    const link = document.createElement("a");
    link.href = "#job/" + j.id;
    link.textContent = j.id;
    const idCell = document.createElement("td");
    idCell.append(link);
    const state = cell(j.state);
    state.className = "state-" + j.state;
    tr.append(idCell, cell(j.queue), cell(j.kind), state, cell(j.progress + "%", "num"), cell(j.attempts, "num"), cell(when(j.updated_at)));
    body.append(tr);
  }
}

async function refresh() {
  try {
    const stats = await getJson("/api/stats");
    renderQueues(stats);
    renderDead(await getJson("/api/dead?limit=50"));
    if (stats.status_store) renderJobs(await getJson("/api/jobs?limit=15"));
  } catch (e) {
    $("updated").textContent = "not updated: " + e.message;
  }
}

let events = null;

function follow(id) {
  if (events) events.close();
  $("overview").hidden = true;
  $("job").hidden = false;
  $("job-id").textContent = id;
  $("job-log").replaceChildren();
  for (const f of ["job-state", "job-result", "job-error", "job-latency", "job-where", "job-attempts", "job-progress-text"]) {
    $(f).textContent = "";
  }
  $("job-latency").removeAttribute("data-ms");
  events = new EventSource("/api/jobs/" + encodeURIComponent(id) + "/events");
  events.addEventListener("status", (message) => {
    const s = JSON.parse(message.data);
    const received = Date.now();
    $("job-state").textContent = s.state;
    $("job-state").className = "state state-" + s.state;
    $("job-progress").value = s.progress;
    $("job-progress-text").textContent = s.progress + "%" + (s.progress_message ? " · " + s.progress_message : "");
    $("job-where").textContent = s.queue + " / " + s.kind;
    $("job-attempts").textContent = String(s.attempts);
    $("job-result").textContent = s.result === null || s.result === undefined ? "" : JSON.stringify(s.result, null, 2);
    $("job-error").textContent = s.last_error || "";
    const li = document.createElement("li");
    li.dataset.state = s.state;
    li.dataset.version = String(s.version);
    li.textContent = new Date(received).toLocaleTimeString() + " · " + s.state + " · " + s.progress + "%" + (s.progress_message ? " · " + s.progress_message : "");
    $("job-log").append(li);
    if (s.state === "completed" || s.state === "failed" || s.state === "dead") {
      // The server ends the stream here; closing keeps EventSource from reconnecting.
      events.close();
      events = null;
      // How long after the job ended its last event arrived: from the job's own end
      // time when its result carries one (`done_at_ms`), else from the status write.
      const ended = s.result && typeof s.result.done_at_ms === "number" ? s.result.done_at_ms : Date.parse(s.finished_at);
      if (!isNaN(ended)) {
        const ms = received - ended;
        $("job-latency").dataset.ms = String(ms);
        $("job-latency").textContent = ms + " ms after the job ended";
      }
    }
  });
  events.addEventListener("error", () => {
    if (events && events.readyState === EventSource.CLOSED) {
      $("job-latency").textContent = "the event stream failed (is the job recorded?)";
    }
  });
}

function route() {
  const m = location.hash.match(/^#job\/([0-9a-fA-F-]{36})$/);
  if (m) {
    follow(m[1]);
  } else {
    if (events) { events.close(); events = null; }
    $("job").hidden = true;
    $("overview").hidden = false;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  $("token").addEventListener("change", () => sessionStorage.setItem("switchyard-token", $("token").value));
  $("follow-form").addEventListener("submit", (e) => {
    e.preventDefault();
    const id = $("follow-id").value.trim();
    if (id) location.hash = "#job/" + id;
  });
  window.addEventListener("hashchange", route);
  route();
  refresh();
  setInterval(() => { if (!$("overview").hidden) refresh(); }, 1000);
});
