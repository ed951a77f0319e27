// The llmgw console: reads the admin API of the peer that served it, and
// reloads its views whenever that peer's event stream says the replicated
// state or the leadership changed. The token lives in sessionStorage and
// travels only in the Authorization header, never in a URL.
"use strict";

const view = {
  token: sessionStorage.getItem("llmgw-token") || "",
  cluster: null,
  nodes: [],
  replicas: [],
  models: [],
  rollouts: {},
  explain: {},
  // The load history of the model whose page is open, by name.
  load: {},
  keys: [],
  usage: [],
  // Why the views could not be read (cleared by the next good read).
  error: "",
  // What the last action did, or why it was refused (kept until the next).
  notice: { text: "", refused: false },
};

const esc = (value) =>
  String(value ?? "").replace(/[&<>"']/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;" })[c]);

function headers(extra) {
  const out = Object.assign({}, extra || {});
  if (view.token) out.Authorization = "Bearer " + view.token;
  return out;
}

// A read that never answers (a half-open connection to a peer) must not
// hold the console: every reload waits for the one in flight.
const API_TIMEOUT_MS = 30000;

async function api(path, options) {
  const response = await fetch(path, Object.assign({ signal: AbortSignal.timeout(API_TIMEOUT_MS) }, options, {
    headers: headers(options && options.headers),
  }));
  const text = await response.text();
  let body = null;
  try { body = text ? JSON.parse(text) : null; } catch (_) { body = text; }
  if (!response.ok) {
    const message = (body && body.error && body.error.message) || text || response.statusText;
    throw new Error(response.status + ": " + message);
  }
  return body;
}

async function load() {
  try {
    const [cluster, nodes, replicas, models] = await Promise.all([
      api("/api/v1/cluster"), api("/api/v1/nodes"), api("/api/v1/replicas"), api("/api/v1/models"),
    ]);
    Object.assign(view, { cluster, nodes, replicas, models, error: "" });
    const explain = {};
    for (const model of models) {
      const ready = replicas.filter((r) => r.model === model.name && r.state === "ready").length;
      if (ready < (model.replicas ?? 1)) {
        explain[model.name] = await api("/api/v1/models/" + encodeURIComponent(model.name) + "/explain").catch((e) => ({ explanation: e.message }));
      }
    }
    view.explain = explain;
    // Which spec each replica runs, and how a change is rolling out.
    const managed = models.filter((m) => m.profiles);
    const rollouts = await Promise.all(managed.map((m) =>
      api("/api/v1/models/" + encodeURIComponent(m.name) + "/rollout").catch(() => null)));
    view.rollouts = Object.fromEntries(managed.map((m, i) => [m.name, rollouts[i]]));
    // The open model page's last hour, from this peer's own samples.
    const [page, arg] = route();
    if (page === "models" && arg) {
      const name = decodeURIComponent(arg);
      view.load = { [name]: await api("/api/v1/models/" + encodeURIComponent(name) + "/load").catch((e) => ({ error: e.message })) };
    }
    // Keys and their use: a peer from before keys has neither.
    [view.keys, view.usage] = await Promise.all([
      api("/api/v1/keys").catch(() => []), api("/api/v1/usage?days=7").catch(() => []),
    ]);
  } catch (e) {
    view.error = e.message.startsWith("401") ? "This admin API needs a token: enter a read or write token above. " + e.message : e.message;
  }
  render();
}

// Events can come many times a second on a busy fleet, and reading every
// view of a large one takes a while: one load at a time, and the next no
// sooner than the last one took (at least 150 ms), so the console never
// spends more than half its time (or the peer's) reloading.
let pending = null;
let loading = false;
let again = false;
let lastLoadMs = 0;
function reloadSoon() {
  if (loading) { again = true; return; }
  if (!pending) pending = setTimeout(reload, Math.max(150, lastLoadMs));
}
// After the operator acted: at once, unless a load is already running.
function reloadNow() {
  if (loading) { again = true; return; }
  clearTimeout(pending);
  reload();
}
async function reload() {
  pending = null;
  loading = true;
  const started = performance.now();
  try { await load(); } finally {
    lastLoadMs = performance.now() - started;
    loading = false;
    if (again) { again = false; reloadSoon(); }
  }
}

// Server-sent events over fetch, so the token goes in a header. A new
// token restarts the stream at once.
let events = null;
function restartEvents() {
  if (events) events.abort();
}
async function follow() {
  const live = document.getElementById("live");
  for (;;) {
    events = new AbortController();
    try {
      const response = await fetch("/api/v1/events", {
        headers: headers({ Accept: "text/event-stream" }), signal: events.signal,
      });
      if (!response.ok) throw new Error("events: " + response.status);
      live.textContent = "live";
      const reader = response.body.getReader();
      const decoder = new TextDecoder();
      let buffer = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += decoder.decode(value, { stream: true });
        let end;
        while ((end = buffer.indexOf("\n\n")) >= 0) {
          const block = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          const data = block.split("\n").filter((l) => l.startsWith("data:")).map((l) => l.slice(5)).join("\n");
          if (!data) continue;
          const event = JSON.parse(data);
          live.textContent = "live: leader " + (event.leader_id ?? "none") + ", term " + event.term + ", applied " + (event.applied_index ?? "-");
          reloadSoon();
        }
      }
    } catch (e) {
      if (events.signal.aborted) continue;
      live.textContent = "reconnecting (" + e.message + ")";
    }
    await new Promise((resolve) => {
      const timer = setTimeout(resolve, 1000);
      events.signal.addEventListener("abort", () => { clearTimeout(timer); resolve(); });
    });
  }
}

function statusClass(status) {
  if (["ready", "leader", "follower", "voter", "live", "sleeping"].includes(status)) return "ok";
  if (["unreachable", "starting", "loading", "pending", "draining", "candidate", "placed"].includes(status)) return "warn";
  return "bad";
}
const badge = (text) => `<span class="status ${statusClass(text)}">${esc(text)}</span>`;
const ago = (ms) => (ms == null ? "-" : ms < 1000 ? ms + " ms ago" : (ms / 1000).toFixed(1) + " s ago");

function renderCluster() {
  const c = view.cluster;
  if (!c) return "";
  const hashes = new Set(c.peers.map((p) => p.state_hash).filter(Boolean));
  const rows = c.peers.map((p) => `<tr>
      <td>${esc(p.id)}${p.id === c.leader_id ? " (leader)" : ""}</td><td>${badge(p.role)}</td><td>${esc(p.membership)}</td>
      <td>${esc(p.term ?? "-")}</td><td>${esc(p.last_log_index ?? "-")}</td><td>${esc(p.last_applied_index ?? "-")}</td>
      <td class="mono">${esc(p.state_hash ?? "unreachable")}</td><td class="mono">${esc(p.addr)}</td></tr>`).join("");
  return `<h2>Cluster</h2>
    <p>Leader: <strong>${c.leader_id == null ? "none elected" : "peer " + esc(c.leader_id)}</strong>${c.leader_id == null ? "" : c.leader_heard_ms_ago == null ? " (not heard yet)" : " (heard " + ago(c.leader_heard_ms_ago) + ")"}, term ${esc(c.term)}.
      Transport: <strong>${c.insecure ? "INSECURE (plaintext)" : "mTLS"}</strong>.
      State hashes: <strong>${hashes.size <= 1 ? "all equal" : hashes.size + " different (a peer is behind)"}</strong>.
      Leader changes in the last hour (seen by peer ${esc(c.id)}): <strong>${esc(c.leader_changes_last_hour ?? 0)}</strong>.</p>
    <table><caption class="note">Each peer as peer ${esc(c.id)} sees it</caption>
      <thead><tr><th>Peer</th><th>Role</th><th>Membership</th><th>Term</th><th>Last log</th><th>Applied</th><th>State hash</th><th>gRPC</th></tr></thead>
      <tbody>${rows}</tbody></table>`;
}

function leaderNote() {
  const c = view.cluster;
  if (!c || c.leader_id === c.id) return "";
  const leader = c.peers.find((p) => p.id === c.leader_id);
  return leader
    ? `<p class="note">Heartbeats and streams are known to the leader: <a href="${esc(leader.admin)}/ui/${esc(location.hash)}">open peer ${esc(leader.id)}'s console</a>.</p>`
    : "";
}

function renderNodes() {
  const rows = view.nodes.map((n) => `<tr>
      <td><a href="#/nodes/${encodeURIComponent(n.id)}">${esc(n.id)}</a></td><td>${badge(n.status)}</td>
      <td>${n.cordoned ? "cordoned" : ""}${n.draining ? " draining" : ""}</td>
      <td>${n.stream ? (n.stream.connected ? "connected, heartbeat " + ago(n.stream.last_heartbeat_ms_ago) : "not connected") : "-"}</td>
      <td>${esc(n.gpus_used)}/${esc(n.gpus_total)}</td><td>${esc((n.fabrics || []).join(", ") || "-")}</td>
      <td>${esc((n.labels || {}).rack || "-")}</td>
      <td>${n.shards.map((s) => esc(s.model) + " [" + esc(s.gpus.join(",")) + "] " + esc(s.state)).join("<br>")}</td></tr>`).join("");
  return `<h2>Nodes</h2>${leaderNote()}
    <table><thead><tr><th>Node</th><th>Status</th><th>Flags</th><th>Agent stream</th><th>GPUs used</th><th>Fabrics</th><th>Rack</th><th>Shards</th></tr></thead>
    <tbody>${rows || '<tr><td colspan="8">No node has registered yet.</td></tr>'}</tbody></table>`;
}

function gpuGrid(node) {
  const holder = {};
  for (const s of node.shards) for (const g of s.gpus) holder[g] = s;
  return `<div class="gpus" role="list" aria-label="GPUs of ${esc(node.id)}">${node.inventory.gpus.map((g) => {
    const s = holder[g.index];
    return `<div class="gpu${s ? " used" : ""}" role="listitem"><span class="idx">GPU ${esc(g.index)}</span> ${esc(g.model)}<br>
      ${esc(Math.round(g.memory_mb / 1024))} GiB<br>${s ? "holds " + esc(s.model) + " (" + esc(s.state) + ")" : "free"}</div>`;
  }).join("")}</div>`;
}

function linkMatrix(node) {
  const gpus = node.inventory.gpus.map((g) => g.index);
  if (gpus.length < 2) return "";
  const link = (a, b) => (node.inventory.links || []).find((l) => (l.a === a && l.b === b) || (l.a === b && l.b === a));
  const head = gpus.map((g) => `<th scope="col">${esc(g)}</th>`).join("");
  const rows = gpus.map((a) => `<tr><th scope="row">${esc(a)}</th>${gpus.map((b) => {
    if (a === b) return "<td>-</td>";
    const l = link(a, b);
    const text = l ? (l.nvlinks ? "NV" + l.nvlinks : l.kind) : "?";
    return `<td class="${l && l.nvlinks ? "nv" : ""}">${esc(text)}</td>`;
  }).join("")}</tr>`).join("");
  return `<h3>GPU links</h3><table class="matrix" aria-label="How each pair of GPUs is connected: NVn is n NVLinks">
    <thead><tr><th></th>${head}</tr></thead><tbody>${rows}</tbody></table>`;
}

function renderNode(id) {
  const n = view.nodes.find((x) => x.id === id);
  if (!n) return `<p>No node <code>${esc(id)}</code>. <a href="#/nodes">All nodes</a></p>`;
  const left = n.shards.length;
  return `<h2>Node ${esc(n.id)} ${badge(n.status)}</h2>${leaderNote()}
    <p>${esc(n.inventory.hostname)}, ${esc(n.mgmt_addr)}; GPUs from ${esc(n.inventory.gpu_source)};
      fabrics ${esc((n.fabrics || []).join(", ") || "none")}; labels ${esc(JSON.stringify(n.labels || {}))}.
      ${n.cordoned ? "<strong>Cordoned.</strong>" : ""} ${n.draining ? "<strong>Draining: " + left + " shard(s) still on it.</strong>" : ""}</p>
    <div class="actions">
      <button data-action="cordon" data-node="${esc(n.id)}">Cordon</button>
      <button data-action="uncordon" data-node="${esc(n.id)}">Uncordon</button>
      <label>Drain deadline (s) <input id="deadline" type="number" min="1" value="300" size="5"></label>
      <button data-action="drain" data-node="${esc(n.id)}">Drain</button>
    </div>
    <h3>GPUs</h3>${gpuGrid(n)}${linkMatrix(n)}
    <h3>InfiniBand / RoCE ports</h3>
    <table><thead><tr><th>HCA</th><th>Port</th><th>State</th><th>Rate</th></tr></thead><tbody>
    ${(n.inventory.hcas || []).map((h) => `<tr><td>${esc(h.name)} (${esc(h.link_layer)})</td><td>${esc(h.port)}</td><td>${esc(h.state)}</td><td>${esc(h.rate_gbps ?? "")}</td></tr>`).join("") || '<tr><td colspan="4">none</td></tr>'}
    </tbody></table>`;
}

// A model's rollout in words: where it stands, what failed, what blocks it,
// and a rollback button while an earlier launch spec exists.
function rolloutLine(name, rollout) {
  if (!rollout) return "";
  const last = rollout.rollout;
  let text = `<strong>Spec</strong> <span class="mono">${esc(rollout.fingerprint)}</span>: rollout ${esc(rollout.phase.replace("_", " "))}, `
    + `${esc(rollout.updated)} on this spec (${esc(rollout.updated_ready)} ready), ${esc(rollout.outdated)} on an earlier spec.`;
  if (last && last.rollback) text += ` Rolled back: ${esc(last.rollback)}.`;
  if (last && last.failures > 0) text += ` <span class="error">${esc(last.failures)} new replica(s) failed; last: ${esc(last.last_failure || "")}</span>`;
  if (rollout.blocked) text += ` <span class="note">${esc(rollout.blocked)}</span>`;
  const button = rollout.can_roll_back
    ? ` <button data-action="rollback" data-model="${esc(name)}">Roll back</button>` : "";
  return `<p>${text}${button}</p>`;
}

function renderModels() {
  const cards = view.models.map((m) => {
    const replicas = view.replicas.filter((r) => r.model === m.name);
    const ready = replicas.filter((r) => r.state === "ready").length;
    const why = view.explain[m.name];
    const rollout = view.rollouts[m.name];
    const spec = (r) => {
      const seen = rollout && rollout.replicas.find((x) => x.id === r.id);
      if (!seen) return "";
      return `${esc(seen.fingerprint || "-")} ${seen.current ? "(current)" : "<strong>(earlier)</strong>"}`;
    };
    const rows = replicas.map((r) => {
      const failure = r.shards.map((s) => s.last_failure).find(Boolean);
      return `<tr><td class="mono">${esc(r.id)}</td><td>${badge(r.state)}</td><td class="mono">${spec(r)}</td><td>${r.shards.map((s) =>
        `<a href="#/nodes/${encodeURIComponent(s.node)}">${esc(s.node)}</a> GPUs [${esc(s.gpus.join(","))}] :${esc(s.port)} ${esc(s.state)}`).join("<br>")}
        ${failure ? `<details><summary class="error">${esc(failure.message)}</summary><pre>${esc((failure.output_tail || []).join("\n"))}</pre></details>` : ""}</td></tr>`;
    }).join("");
    return `<section class="card" aria-labelledby="model-${esc(m.name)}"><h3 id="model-${esc(m.name)}"><a href="#/models/${encodeURIComponent(m.name)}">${esc(m.name)}</a></h3>
      <p>${esc(ready)} of ${esc(m.replicas ?? 1)} replicas ready. <span class="note">${esc(m.source || "")}</span></p>
      <div class="actions"><label>Replicas <input type="number" min="0" value="${esc(m.replicas ?? 1)}" size="3" data-scale="${esc(m.name)}"></label>
        <button data-action="scale" data-model="${esc(m.name)}">Scale</button></div>
      ${rolloutLine(m.name, rollout)}
      ${why ? `<p><strong>Why not ready:</strong> ${esc(why.explanation || (why.replicas || []).map((r) => r.id + ": " + r.why).join("; ") || "placing")}</p>` : ""}
      <table><thead><tr><th>Replica</th><th>State</th><th>Spec</th><th>Shards</th></tr></thead><tbody>${rows || '<tr><td colspan="4">none</td></tr>'}</tbody></table></section>`;
  }).join("");
  return `<h2>Models and replicas</h2><div class="cards">${cards || "<p>The catalog is empty.</p>"}</div>`;
}

// An SVG line chart of the samples over time: one polyline per series
// (broken where a value is missing), a dashed target line, and a vertical
// mark at each scaling decision with its reason as the tooltip. Colours
// come from classes in style.css: the console's policy forbids inline
// styles.
const CHART = { width: 760, height: 170, left: 52, right: 12, top: 10, bottom: 24 };
function chart(title, unit, series, span, marks, target) {
  const { width, height, left, right, top, bottom } = CHART;
  const values = series.flatMap((s) => s.points.map((p) => p[1]).filter((v) => v != null));
  const highest = Math.max(1, ...values, target == null ? 0 : target * 1.25);
  const x = (at) => left + ((at - span.from) / Math.max(1, span.to - span.from)) * (width - left - right);
  const y = (v) => height - bottom - (v / highest) * (height - top - bottom);
  const lines = series.map((s) => {
    const segments = [[]];
    let previous = null;
    for (const [at, v] of s.points) {
      if (v == null) { if (segments[segments.length - 1].length) segments.push([]); previous = null; continue; }
      // Counts hold until they change: drawn as steps.
      if (s.step && previous != null) segments[segments.length - 1].push(x(at).toFixed(1) + "," + y(previous).toFixed(1));
      segments[segments.length - 1].push(x(at).toFixed(1) + "," + y(v).toFixed(1));
      previous = v;
    }
    return segments.filter((points) => points.length).map((points) =>
      `<polyline class="series ${s.cls}" points="${points.join(" ")}"><title>${esc(s.name)}</title></polyline>`).join("");
  }).join("");
  const targetLine = target == null ? ""
    : `<line class="target" x1="${left}" x2="${width - right}" y1="${y(target).toFixed(1)}" y2="${y(target).toFixed(1)}"><title>target ${esc(target)} ${esc(unit)}</title></line>`;
  const markLines = marks.filter((m) => m.at_ms >= span.from).map((m) =>
    `<line class="mark" x1="${x(m.at_ms).toFixed(1)}" x2="${x(m.at_ms).toFixed(1)}" y1="${top}" y2="${height - bottom}"><title>${esc(clock(m.at_ms) + ": " + m.reason)}</title></line>`).join("");
  const latest = series.map((s) => {
    const last = [...s.points].reverse().find((p) => p[1] != null);
    return `${s.name} ${last ? round(last[1]) : "-"}`;
  }).join(", ");
  const legend = series.map((s) => `<span class="key ${s.cls}">${esc(s.name)}</span>`).join(" ")
    + (target == null ? "" : ` <span class="key target">target ${esc(target)} ${esc(unit)}</span>`);
  return `<figure class="chart"><figcaption><strong>${esc(title)}</strong> (${esc(unit)}) ${legend}</figcaption>
    <svg class="chart" viewBox="0 0 ${width} ${height}" role="img" aria-label="${esc(title + ", latest: " + latest)}">
      <line class="axis" x1="${left}" x2="${left}" y1="${top}" y2="${height - bottom}"></line>
      <line class="axis" x1="${left}" x2="${width - right}" y1="${height - bottom}" y2="${height - bottom}"></line>
      <text class="tick" x="${left - 6}" y="${top + 10}" text-anchor="end">${esc(round(highest))}</text>
      <text class="tick" x="${left - 6}" y="${height - bottom}" text-anchor="end">0</text>
      <text class="tick" x="${left}" y="${height - 6}">${esc(clock(span.from))}</text>
      <text class="tick" x="${width - right}" y="${height - 6}" text-anchor="end">${esc(clock(span.to))}</text>
      ${targetLine}${markLines}${lines}
    </svg></figure>`;
}
const round = (v) => (v >= 10 || Number.isInteger(v) ? Math.round(v) : Math.round(v * 10) / 10);
const clock = (ms) => new Date(ms).toLocaleTimeString();

// A model's page: its last hour of load next to its replicas and the
// decisions that changed them, so a scale-up shows beside its cause.
function renderModelLoad(name) {
  const m = view.models.find((x) => x.name === name);
  if (!m) return `<p>No model <code>${esc(name)}</code> in the catalog. <a href="#/models">All models</a></p>`;
  const load = view.load[name];
  const back = `<p><a href="#/models">All models</a></p>`;
  const head = `<h2>Model ${esc(name)}</h2>${back}`;
  if (!load) return head + "<p>Loading…</p>";
  if (load.error) return head + `<p class="error">${esc(load.error)}</p>`;
  if (!load.autoscaled) {
    return head + `<p>${esc(name)} has a fixed replica count (${esc(m.replicas ?? 1)}): only autoscaled models are sampled. Give it an <code>autoscale</code> section to see its load here.</p>`;
  }
  const samples = load.samples;
  if (!samples.length) return head + `<p>Peer ${esc(load.peer_id)} has no sample of ${esc(name)} yet: it samples once a second.</p>`;
  const to = samples[samples.length - 1].at_ms;
  const span = { from: Math.min(samples[0].at_ms, to - 60 * 1000), to };
  const of = (field) => samples.map((s) => [s.at_ms, s[field]]);
  const t = load.targets;
  const last = samples[samples.length - 1];
  const decisions = [...load.decisions].reverse().map((d) =>
    `<tr><td>${esc(clock(d.at_ms))}</td><td>${esc(d.from)} → ${esc(d.to)}</td><td>${esc(d.reason)}</td></tr>`).join("");
  return `${head}
    <p>Now: ${esc(last.ready)} ready, ${esc(last.starting)} starting, ${esc(last.draining)} draining, ${esc(last.sleeping ?? 0)} asleep, ${esc(last.desired)} wanted.
      Sized for ${esc(t.target_requests_per_replica)} requests a replica. <span class="note">Sampled once a second by peer ${esc(load.peer_id)}
      since ${esc(clock(samples[0].at_ms))}; each peer keeps its own hour.</span></p>
    <div class="charts">
    ${chart("Requests per second", "req/s", [{ name: "first tokens/s", cls: "s1", points: of("requests_per_s") },
      { name: "outstanding", cls: "s2", points: of("outstanding") }], span, load.decisions)}
    ${chart("Time to first token (p90)", "ms", [{ name: "TTFT p90", cls: "s1", points: of("ttft_p90_ms") },
      { name: "queue p90", cls: "s2", points: of("queue_p90_ms") }], span, load.decisions, t.ttft_p90_ms)}
    ${chart("Replicas", "count", [{ name: "ready", cls: "s1", points: of("ready"), step: true },
      { name: "starting", cls: "s2", points: of("starting"), step: true },
      { name: "draining", cls: "s3", points: of("draining"), step: true },
      { name: "asleep", cls: "s5", points: of("sleeping"), step: true },
      { name: "wanted", cls: "s4", points: of("desired"), step: true }], span, load.decisions)}
    </div>
    <h3>Scaling decisions</h3>
    <table><thead><tr><th>When</th><th>Replicas</th><th>Why</th></tr></thead>
      <tbody>${decisions || '<tr><td colspan="3">No change in this window.</td></tr>'}</tbody></table>`;
}

// Keys, the most used today first, with their limits; the week's use by
// day, key and model. A secret is shown once, in the notice of the action
// that created or rotated it.
function renderKeys() {
  const limits = (l) => {
    const parts = [];
    if (!l) return "none";
    if (l.requests_per_minute) parts.push(l.requests_per_minute + " req/min");
    if (l.tokens_per_minute) parts.push(l.tokens_per_minute + " tok/min");
    if (l.max_concurrent_requests) parts.push(l.max_concurrent_requests + " at once");
    if (l.tokens_per_day) parts.push(l.tokens_per_day + " tok/day");
    if (l.tokens_per_month) parts.push(l.tokens_per_month + " tok/month");
    if (l.usd_per_day) parts.push("$" + l.usd_per_day + "/day");
    if (l.usd_per_month) parts.push("$" + l.usd_per_month + "/month");
    return (parts.join(", ") || "none") + (l.shadow && parts.length ? " (shadow mode)" : "");
  };
  const status = (k) => (k.revoked_at_ms ? "revoked" : k.expires_at_ms && k.expires_at_ms <= Date.now() ? "expired" : "live");
  const keys = [...view.keys].sort((a, b) => ((b.spent || {}).day_tokens || 0) - ((a.spent || {}).day_tokens || 0));
  const rows = keys.map((k) => `<tr>
      <td>${esc(k.name)}</td><td>${esc(k.team || "-")}</td><td class="mono">${esc(k.secret_prefix)}…</td>
      <td>${esc((k.models || []).join(", ") || "all")}</td><td>${esc(limits(k.limits))}</td>
      <td>${esc((k.spent || {}).day_tokens || 0)}</td><td>${esc((k.spent || {}).month_tokens || 0)}</td>
      <td>${k.expires_at_ms ? esc(new Date(k.expires_at_ms).toISOString().slice(0, 16).replace("T", " ")) + " UTC" : "never"}</td>
      <td>${badge(status(k))}</td>
      <td>${k.revoked_at_ms ? "" : `<button data-action="rotate-key" data-key="${esc(k.name)}">Rotate</button>
        <button data-action="revoke-key" data-key="${esc(k.name)}">Revoke</button>`}</td></tr>`).join("");
  const used = view.usage.map((u) => `<tr><td>${esc(u.day)}</td><td>${esc(u.key)}</td><td>${esc(u.team || "-")}</td><td>${esc(u.model)}</td>
      <td>${esc(u.completed + u.cancelled + u.failed)}</td><td>${esc(u.prompt_tokens)}</td><td>${esc(u.completion_tokens)}</td>
      <td>${esc(u.cached_tokens)}</td></tr>`).join("");
  return `<h2>API keys</h2>
    <div class="actions" role="group" aria-label="Create a key">
      <label>Name <input id="key-name" size="14"></label>
      <label>Team <input id="key-team" size="10"></label>
      <label>Models <input id="key-models" size="16" placeholder="all"></label>
      <label>Requests/min <input id="key-rpm" type="number" min="0"></label>
      <button data-action="create-key">Create</button>
    </div>
    <table><caption class="note">Most tokens today first. Per-minute limits are shared by the routers by their traffic, budgets hold over all of them, concurrency on each.</caption>
      <thead><tr><th>Key</th><th>Team</th><th>Secret</th><th>Models</th><th>Limits</th><th>Tokens today</th><th>This month</th><th>Expires</th><th>Status</th><th></th></tr></thead>
      <tbody>${rows || '<tr><td colspan="10">No API key yet: routers ask for none until one exists.</td></tr>'}</tbody></table>
    <h3>Use in the last 7 days</h3>
    <table><thead><tr><th>Day (UTC)</th><th>Key</th><th>Team</th><th>Model</th><th>Requests</th><th>Prompt tokens</th><th>Completion tokens</th><th>Cached</th></tr></thead>
      <tbody>${used || '<tr><td colspan="8">No use recorded.</td></tr>'}</tbody></table>`;
}

// The page and its argument, from `#/page/arg`.
function route() {
  return (location.hash.replace(/^#\/?/, "") || "cluster").split("/");
}

let lastHtml = "";
function render() {
  const [page, arg] = route();
  for (const a of document.querySelectorAll("nav a")) {
    if (a.dataset.page === page) a.setAttribute("aria-current", "page"); else a.removeAttribute("aria-current");
  }
  const focused = document.activeElement && document.activeElement.id;
  // What the user typed survives a redraw.
  const key = (input) => input.id || input.dataset.scale;
  const typed = {};
  for (const input of document.querySelectorAll("#main input")) typed[key(input)] = input.value;
  const body = page === "nodes" && arg ? renderNode(decodeURIComponent(arg))
    : page === "nodes" ? renderNodes()
    : page === "models" && arg ? renderModelLoad(decodeURIComponent(arg))
    : page === "models" ? renderModels()
    : page === "keys" ? renderKeys() : renderCluster();
  const banner = (view.error ? `<p class="error" role="alert">${esc(view.error)}</p>` : "")
    + (view.notice.text
      ? `<p class="${view.notice.refused ? "error" : ""}" role="status">${esc(view.notice.text)}</p>` : "");
  const html = banner + body;
  // Unchanged views keep their elements: what the user is typing or about
  // to click stays put.
  if (html === lastHtml) return;
  lastHtml = html;
  document.getElementById("main").innerHTML = html;
  for (const input of document.querySelectorAll("#main input")) {
    if (key(input) in typed) input.value = typed[key(input)];
  }
  if (focused) { const again = document.getElementById(focused); if (again) again.focus(); }
}

async function act(button) {
  const { action, node, model, key } = button.dataset;
  const value = (id) => document.getElementById(id).value.trim();
  const done = (text) => { view.notice = { text, refused: false }; };
  try {
    if (action === "cordon" || action === "uncordon") {
      await api(`/api/v1/nodes/${encodeURIComponent(node)}/${action}`, { method: "POST" });
      done(`${node}: ${action}ed.`);
    } else if (action === "drain") {
      const deadline = Number(document.getElementById("deadline").value) || 300;
      await api(`/api/v1/nodes/${encodeURIComponent(node)}/drain?deadline_s=${deadline}`, { method: "POST" });
      done(`${node}: drain started; each replica moves once its replacement is ready.`);
    } else if (action === "scale") {
      const spec = await api("/api/v1/models/" + encodeURIComponent(model));
      spec.replicas = Number(document.querySelector(`input[data-scale="${CSS.escape(model)}"]`).value);
      await api("/api/v1/models/" + encodeURIComponent(model), {
        method: "PUT", headers: { "Content-Type": "application/json" }, body: JSON.stringify(spec),
      });
      done(`${model}: scaled to ${spec.replicas} replicas.`);
    } else if (action === "rollback") {
      await api("/api/v1/models/" + encodeURIComponent(model) + "/rollback", { method: "POST" });
      done(`${model}: rolling back to its previous launch spec, make-before-break.`);
    } else if (action === "create-key") {
      const limits = {};
      if (Number(value("key-rpm")) > 0) limits.requests_per_minute = Number(value("key-rpm"));
      const models = value("key-models").split(",").map((m) => m.trim()).filter(Boolean);
      const issued = await api("/api/v1/keys", {
        method: "POST", headers: { "Content-Type": "application/json" },
        body: JSON.stringify({ name: value("key-name"), team: value("key-team"), models, limits }),
      });
      for (const id of ["key-name", "key-team", "key-models", "key-rpm"]) document.getElementById(id).value = "";
      done(`Key ${issued.key.name} created. Its secret, shown this once: ${issued.secret}`);
    } else if (action === "rotate-key") {
      const issued = await api(`/api/v1/keys/${encodeURIComponent(key)}/rotate`, { method: "POST" });
      done(`Key ${key} rotated; the old secret is refused from now on. The new one, shown this once: ${issued.secret}`);
    } else if (action === "revoke-key") {
      await api(`/api/v1/keys/${encodeURIComponent(key)}`, { method: "DELETE" });
      done(`Key ${key} revoked: every router refuses it within a second.`);
    }
  } catch (e) {
    view.notice = { text: `${action} refused: ${e.message}`, refused: true };
  }
  reloadNow();
}

document.addEventListener("click", (event) => {
  const button = event.target.closest("button[data-action]");
  if (button) act(button);
});
document.getElementById("token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  view.token = document.getElementById("token").value.trim();
  sessionStorage.setItem("llmgw-token", view.token);
  document.getElementById("token").value = "";
  restartEvents();
  reloadNow();
});
window.addEventListener("hashchange", () => { render(); if (route()[0] === "models" && route()[1]) reloadNow(); });
reloadNow();
follow();
