// kforge's web GUI (Note [Web GUI] in search_daemon/daemon/gui_api.cc): plain JavaScript, no build
// step, nothing fetched from elsewhere. Three views, chosen by the URL's hash:
//   #/                         overview: the daemon, its workers, processes and signatures, searches
//   #/search/<id>              a search's tree, live
//   #/candidate/<id>/<node>    one candidate: outcome, logs, timings, source, diff, plan, conversation
//   #/cache                    the cache's entries; disable, enable, pin, unpin with the token
//   #/charts                   best speedup over time per signature; the active kernels' roofline
// Live updates come from /api/events (server-sent events); EventSource reconnects by itself and
// sends the last event number it saw, so a reconnecting page gets what it missed ("reset": too
// much was missed, reload the view).
"use strict";

const view = document.getElementById("view");
const live = document.getElementById("live");

function esc(s) {
  return String(s === undefined || s === null ? "" : s).replace(/[&<>"']/g,
    (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
}

async function api(path) {
  const r = await fetch(path, {cache: "no-store"});
  const body = await r.text();
  let j;
  try { j = JSON.parse(body); } catch (e) { throw new Error(path + ": not JSON (" + r.status + ")"); }
  if (!r.ok) throw new Error(j.error || (path + ": HTTP " + r.status));
  return j;
}

function fmtTime(ns) {
  if (!ns) return "";
  if (ns >= 1e6) return (ns / 1e6).toFixed(3) + " ms";
  if (ns >= 1e3) return (ns / 1e3).toFixed(2) + " us";
  return ns.toFixed(0) + " ns";
}
function fmtX(x) { return x ? x.toFixed(2) + "x" : ""; }
function fmtBw(bytesPerNs) { return bytesPerNs ? (bytesPerNs).toFixed(1) + " GB/s" : ""; }

// Where an entry runs (the status document's in_process rows): "pid 12 active, 2.1 us vs 3.0 us".
function inProcessText(rows) {
  return rows.map((w) => `pid ${esc(w.pid)} ${esc(w.state)}` +
    (w.entry_median_ns ? `, ${fmtTime(w.entry_median_ns)} vs PyTorch ${fmtTime(w.pytorch_median_ns)}` : "") +
    (w.active_calls ? `, ${esc(w.active_calls)} calls served` : "")).join("<br>");
}
function pct(x) { return (100 * (x || 0)).toFixed(1) + "%"; }

// ---- overview ---------------------------------------------------------------------------------

async function showOverview() {
  const [st, searches] = await Promise.all([api("/api/status"), api("/api/searches")]);
  const d = st.daemon || {};
  let h = `<h1>kforged ${esc(d.version)} <span class="muted">pid ${esc(d.pid)}, up ${Math.round(d.uptime_s || 0)} s,
    strategy ${esc(d.strategy)}</span></h1>`;
  const b = st.budgets || {};
  h += `<p class="muted">evaluations ${esc(b.evaluations_total)} of ${esc(b.max_evaluations_total)};
    per signature ${esc(b.max_evaluations_per_signature)} evaluations or ${esc(b.max_seconds_per_signature)} s</p>`;
  h += `<div class="grid"><div><h2>Workers</h2><table id="slots"><tr><th>device</th><th>state</th><th>model</th>
    <th class="num">jobs</th><th class="num">restarts</th><th>serving pids</th></tr>`;
  for (const s of st.slots || []) {
    h += `<tr><td>${esc(s.device)}</td><td>${esc(s.state)}</td><td>${esc(s.model || s.arch)}</td>
      <td class="num">${esc(s.jobs)}</td><td class="num">${esc(s.restarts)}</td><td>${esc((s.serving_pids || []).join(", "))}</td></tr>`;
  }
  h += `</table></div><div><h2>Processes</h2><table id="processes"><tr><th class="num">pid</th><th>attached</th>
    <th>torch</th><th>GPUs</th><th class="num">signatures</th><th class="num">reports</th><th>kernels</th>
    <th class="num" title="active calls x (PyTorch's median - the kernel's), both timed in that process's trial">time saved (est.)</th></tr>`;
  for (const p of st.processes || []) {
    const kernels = Object.entries(p.kernels || {}).map(([state, n]) => `${n} ${esc(state)}`).join(", ");
    h += `<tr data-pid="${esc(p.pid)}"><td class="num">${esc(p.pid)}</td><td>${p.attached ? "yes" : "gone " + esc(p.goodbye)}</td>
      <td>${esc(p.torch)}</td><td>${esc((p.gpus || []).join(", "))}</td><td class="num">${esc(p.signatures)}</td>
      <td class="num">${esc(p.reports)}</td><td>${kernels || '<span class="muted">none</span>'}</td>
      <td class="num saved">${p.saved_ns ? fmtTime(p.saved_ns) : "-"}</td></tr>`;
  }
  h += `</table></div></div>`;
  h += `<h2>Hot signatures</h2><table id="signatures"><tr><th>signature</th><th>state</th><th class="num">time share</th>
    <th class="num">calls</th><th class="num">mean</th><th class="num">evaluations</th><th class="num">best</th><th>in processes</th><th>search</th></tr>`;
  for (const s of st.signatures || []) {
    const searched = searches.some((x) => x.id === s.id);
    h += `<tr data-signature="${esc(s.id)}"><td><code>${esc(s.signature)}</code></td><td>${esc(s.state)}${s.note ? ` <span class="muted">${esc(s.note)}</span>` : ""}</td>
      <td class="num">${pct(s.time_share)}</td><td class="num">${esc(s.calls)}</td><td class="num">${fmtTime(s.mean_ns)}</td>
      <td class="num">${esc(s.evaluations)}</td><td class="num">${fmtX(s.best_speedup)}</td>
      <td>${inProcessText(s.in_process || []) || '<span class="muted">PyTorch\'s kernel</span>'}</td>
      <td>${searched ? `<a href="#/search/${esc(s.id)}">tree</a>` : ""}</td></tr>`;
  }
  h += `</table>`;
  h += `<h2>Searches</h2><table id="searches"><tr><th>signature</th><th>strategy</th><th class="num">nodes</th>
    <th class="num">evaluated</th><th class="num">in flight</th><th class="num">best</th><th>state</th></tr>`;
  for (const s of searches) {
    if (s.error) { h += `<tr><td colspan="7" class="error">${esc(s.id)}: ${esc(s.error)}</td></tr>`; continue; }
    h += `<tr><td><a href="#/search/${esc(s.id)}"><code>${esc(s.signature)}</code></a></td><td>${esc(s.strategy)}</td>
      <td class="num">${esc(s.nodes)}</td><td class="num">${esc(s.evaluated)}</td><td class="num">${esc(s.in_flight)}</td>
      <td class="num">${fmtX(s.best_speedup)} <span class="muted">${esc(s.best_label)}</span></td>
      <td>${s.done ? "done: " + esc(s.done_reason) : "searching"}</td></tr>`;
  }
  h += `</table>`;
  view.innerHTML = h;
}

// ---- search tree ------------------------------------------------------------------------------

// A tidy layout: leaves left to right in id order, each parent centred over its children.
function layout(nodes) {
  const kids = new Map(nodes.map((n) => [n.id, []]));
  for (const n of nodes) if (n.id !== 0) kids.get(n.parent).push(n.id);
  const pos = new Map();
  let next = 0;
  let depthMax = 0;
  const place = (id, depth) => {
    depthMax = Math.max(depthMax, depth);
    const c = kids.get(id);
    if (c.length === 0) { pos.set(id, {x: next++, y: depth}); return; }
    for (const k of c) place(k, depth + 1);
    pos.set(id, {x: (pos.get(c[0]).x + pos.get(c[c.length - 1]).x) / 2, y: depth});
  };
  place(0, 0);
  return {pos, width: Math.max(1, next), depth: depthMax};
}

async function showTree(id) {
  const t = await api("/api/tree/" + id);
  const {pos, width, depth} = layout(t.nodes);
  const dx = 34, dy = 70, pad = 24;
  const W = Math.max(600, width * dx + 2 * pad), H = (depth + 1) * dy + 2 * pad;
  const byId = new Map(t.nodes.map((n) => [n.id, n]));
  const xy = (n) => [pad + pos.get(n.id).x * dx + dx / 2, pad + pos.get(n.id).y * dy + 10];
  let svg = `<svg class="tree" id="tree" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}">`;
  for (const n of t.nodes) {
    if (n.id === 0) continue;
    const [x1, y1] = xy(byId.get(n.parent)), [x2, y2] = xy(n);
    svg += `<line x1="${x1}" y1="${y1}" x2="${x2}" y2="${y2}" class="${n.on_best_path ? "best" : ""}"/>`;
  }
  for (const n of t.nodes) {
    const [x, y] = xy(n);
    const r = 6 + 2 * Math.sqrt(n.visits || 0);
    const cls = `n-${n.status}${n.improves ? " improves" : ""}${n.best ? " best" : ""}`;
    const title = `${n.id}: ${n.label} (${n.proposer}) ${n.status}${n.speedup ? " " + n.speedup.toFixed(2) + "x" : ""}`;
    svg += `<circle id="node-${n.id}" data-node="${n.id}" data-status="${esc(n.status)}" cx="${x}" cy="${y}" r="${r.toFixed(1)}"
      class="${cls}"><title>${esc(title)}</title></circle>`;
  }
  svg += `</svg>`;
  let h = `<h1>Search of <code>${esc(t.signature)}</code></h1>
    <p class="muted">${esc(t.strategy)}; ${t.evaluated} evaluated of ${t.nodes.length - 1} nodes;
    ${t.done ? "done: " + esc(t.done_reason) : "searching"}${t.best_node !== undefined ? `; best: <a href="#/candidate/${id}/${t.best_node}">node ${t.best_node}</a>` : ""}</p>
    <p class="legend"><span>circle size: visits (evaluations below)</span><span style="color:#16a34a">faster</span>
    <span style="color:#5b7ea6">measured, not faster</span><span style="color:#dc2626">failed</span>
    <span style="color:#d97706">in flight</span><span>pending</span><span style="color:#c8a400">path to the best</span></p>` + svg;
  if (!t.done) {
    h += `<p>${tokenBox()} <button id="stop-search">stop this search</button>
      <span class="muted">(its evaluations in flight finish; it is not resumed or searched again)</span></p><p id="action-result"></p>`;
  }
  h += `<h2>Nodes</h2><table id="nodes"><tr><th class="num">id</th><th class="num">parent</th><th>proposer</th><th>label</th>
    <th>status</th><th class="num">speedup</th><th class="num">visits</th><th class="num">mean reward</th></tr>`;
  for (const n of t.nodes) {
    if (n.id === 0) continue;
    h += `<tr data-node="${n.id}"><td class="num"><a href="#/candidate/${id}/${n.id}">${n.id}</a></td><td class="num">${n.parent}</td>
      <td>${esc(n.proposer)}</td><td><a href="#/candidate/${id}/${n.id}">${esc(n.label)}</a></td>
      <td class="status s-${esc(n.status)}${n.improves ? " improves" : ""}">${esc(n.status)}</td>
      <td class="num">${n.speedup ? n.speedup.toFixed(3) + "x" : ""}</td><td class="num">${n.visits}</td>
      <td class="num">${n.visits ? n.mean_reward.toFixed(3) : ""}</td></tr>`;
  }
  h += `</table>`;
  view.innerHTML = h;
  for (const c of view.querySelectorAll("circle[data-node]")) {
    if (c.dataset.node !== "0") c.addEventListener("click", () => { location.hash = `#/candidate/${id}/${c.dataset.node}`; });
  }
  wireTokenBox();
  const stop = document.getElementById("stop-search");
  if (stop) {
    stop.addEventListener("click", async () => {
      const j = await post(`/api/search/${id}/stop`);
      const out = document.getElementById("action-result");
      if (j.error) { out.className = "error"; out.textContent = "stop: " + j.error; return; }
      out.className = "";
      out.textContent = "stopping: the evaluations in flight finish first";
    });
  }
}

// ---- candidate --------------------------------------------------------------------------------

const KEYWORDS = new Set("if else for while do return break continue switch case default static const extern inline struct union typedef sizeof goto __global__ __device__ __shared__ __restrict__ __syncthreads unsigned signed volatile template typename".split(" "));
const TYPES = new Set("void char short int long float double bool half int64_t int32_t uint32_t uint64_t size_t float2 float4 __half __nv_bfloat16 kf_acc".split(" "));

// C/CUDA highlighting: comments, numbers, keywords, types; everything escaped first.
function highlight(src) {
  const out = [];
  const re = /(\/\/[^\n]*|\/\*[\s\S]*?\*\/)|(\b\d[\d.]*[fFuUlL]*\b)|([A-Za-z_]\w*)|([^A-Za-z_\d\/]+|\/)/g;
  let m;
  while ((m = re.exec(src)) !== null) {
    if (m[1]) out.push(`<span class="cm">${esc(m[1])}</span>`);
    else if (m[2]) out.push(`<span class="nu">${esc(m[2])}</span>`);
    else if (m[3]) out.push(KEYWORDS.has(m[3]) ? `<span class="kw">${m[3]}</span>` : TYPES.has(m[3]) ? `<span class="ty">${m[3]}</span>` : m[3]);
    else out.push(esc(m[4]));
  }
  return out.join("");
}

// A line diff (longest common subsequence), as "+"/"-"/" " lines.
function diff(a, b) {
  const x = a.split("\n"), y = b.split("\n");
  if (x.length * y.length > 4e6) return [{op: " ", text: "(too long to diff)"}];
  const L = Array.from({length: x.length + 1}, () => new Int32Array(y.length + 1));
  for (let i = x.length - 1; i >= 0; --i)
    for (let j = y.length - 1; j >= 0; --j) L[i][j] = x[i] === y[j] ? L[i + 1][j + 1] + 1 : Math.max(L[i + 1][j], L[i][j + 1]);
  const out = [];
  let i = 0, j = 0;
  while (i < x.length && j < y.length) {
    if (x[i] === y[j]) { out.push({op: " ", text: x[i]}); ++i; ++j; }
    else if (L[i + 1][j] >= L[i][j + 1]) out.push({op: "-", text: x[i++]});
    else out.push({op: "+", text: y[j++]});
  }
  while (i < x.length) out.push({op: "-", text: x[i++]});
  while (j < y.length) out.push({op: "+", text: y[j++]});
  return out;
}

async function showCandidate(id, node) {
  const [c, st] = await Promise.all([api(`/api/candidate/${id}/${node}`), api("/api/status")]);
  const o = c.outcome;
  // The copy bandwidth this daemon's workers measured on the candidate's kind of device.
  const copy = Math.max(0, ...(st.slots || []).filter((s) => (c.backend === "cpu") === (s.device === "cpu"))
    .map((s) => s.bandwidth_bytes_per_s || 0)) / 1e9;   // bytes per ns
  let h = `<p><a href="#/search/${id}">&larr; the search of <code>${esc(c.signature)}</code></a></p>
    <h1>Node ${c.id}: ${esc(c.label)}</h1>
    <p class="muted">proposer ${esc(c.proposer)}, prior ${c.prior.toFixed(2)}, parent
    ${c.parent ? `<a href="#/candidate/${id}/${c.parent}">node ${c.parent}</a>` : "PyTorch's kernel (the root)"}
    (${esc(c.parent_label)}), kernel ${esc(c.kernel_id)}</p>`;
  h += `<h2>Outcome</h2>`;
  if (!o) {
    h += `<p id="outcome" class="status s-${esc(c.status)}">${esc(c.status)}</p>`;
  } else {
    h += `<table id="outcome"><tr><th>status</th><td class="status s-${esc(o.status)}${o.improves ? " improves" : ""}">${esc(o.status)}</td></tr>`;
    if (o.message) h += `<tr><th>message</th><td>${esc(o.message)}</td></tr>`;
    if (o.failed_check) h += `<tr><th>failed check</th><td id="failed-check">${esc(o.failed_check)}</td></tr>`;
    if (o.baseline_ns) {
      h += `<tr><th>PyTorch</th><td>${fmtTime(o.baseline_ns)} <span class="muted">spread ${pct(o.baseline_spread)}</span></td></tr>
        <tr><th>this kernel</th><td>${fmtTime(o.candidate_ns)} <span class="muted">spread ${pct(o.candidate_spread)}</span></td></tr>
        <tr><th>speedup</th><td>${o.speedup.toFixed(3)}x <span class="muted">noise band ${pct(o.noise_band)},
          ${o.significant ? "significant" : "not significant"}</span></td></tr>`;
      if (c.op_bytes && o.candidate_ns) {
        const k = c.op_bytes / o.candidate_ns, t = c.op_bytes / o.baseline_ns;
        h += `<tr><th>bandwidth</th><td id="bandwidth">${fmtBw(k)}${copy ? ` = ${pct(k / copy)} of the copy bandwidth (${fmtBw(copy)})` : ""}
          <span class="muted">PyTorch ${fmtBw(t)}${copy ? ` = ${pct(t / copy)}` : ""}; ${(c.op_bytes / 1048576).toFixed(2)} MiB,
          every input read once and every output written once</span></td></tr>`;
      }
    }
    if (o.torch_max_abs_error) {
      h += `<tr><th>PyTorch's own error</th><td>max abs ${o.torch_max_abs_error.toExponential(3)}, rel ${o.torch_rel_error.toExponential(3)}
        <span class="muted">(against float64; the bound is twice this plus the floor)</span></td></tr>`;
    }
    if (o.implausible) h += `<tr><th>timing not believed</th><td>${esc(o.implausible)}</td></tr>`;
    if (o.shared_gpu_pids && o.shared_gpu_pids.length) h += `<tr><th>GPU shared with</th><td>${esc(o.shared_gpu_pids.join(", "))}</td></tr>`;
    h += `<tr><th>reward</th><td>${o.reward.toFixed(3)}</td></tr></table>`;
    if (o.build_log) h += `<h2>Compile log</h2><pre id="build-log">${esc(o.build_log)}</pre>`;
  }
  h += `<h2>Source <span class="muted">(${esc(c.language)}; entry ${esc(c.entry_points.join(", "))}${c.compile_options.length ? "; options " + esc(c.compile_options.join(" ")) : ""})</span></h2>
    <pre id="source">${highlight(c.source)}</pre>`;
  if (c.parent_source) {
    const d = diff(c.parent_source, c.source);
    h += `<h2>Diff against node ${c.parent}</h2><pre id="diff" class="diff">${d.map((l) =>
      l.op === "+" ? `<span class="add">+ ${esc(l.text)}</span>` : l.op === "-" ? `<span class="del">- ${esc(l.text)}</span>` : `  ${esc(l.text)}\n`).join("")}</pre>`;
  } else {
    h += `<h2>Diff</h2><p id="diff" class="muted">A first candidate: its parent is PyTorch's own kernel, which has no source here.</p>`;
  }
  h += `<h2>Launch plan</h2><pre id="plan">${esc(JSON.stringify(c.plan, null, 2))}</pre>`;
  if (c.origin && typeof c.origin === "object") {
    const og = c.origin;
    h += `<h2>Written by ${esc(og.model)} <span class="muted">(${esc(og.api)}, ${esc(og.prompt_kind)} prompt,
      ${esc(og.format_repairs)} format repairs)</span></h2>`;
    for (const m of og.messages || []) h += `<h3 class="muted">${esc(m.role)}</h3><pre>${esc(m.content)}</pre>`;
  }
  view.innerHTML = h;
}

// ---- cache ------------------------------------------------------------------------------------

// Note [GUI token] (gui_api.cc): the actions need the token the daemon writes to
// <state_dir>/gui-token; the page keeps a pasted one in this tab only.
function token() { return sessionStorage.getItem("kforge-token") || ""; }
function tokenBox() {
  return `Token for actions: <input id="token" type="password" size="40" placeholder="contents of <state_dir>/gui-token"
      value="${esc(token())}"> <span class="muted">(kept in this tab only)</span>`;
}
function wireTokenBox() {
  const t = document.getElementById("token");
  if (t) t.addEventListener("change", (ev) => sessionStorage.setItem("kforge-token", ev.target.value.trim()));
}
// A state-changing request with the token: the answer's JSON, or {error}.
async function post(path) {
  const r = await fetch(path, {method: "POST", headers: {"X-Kforge-Token": token()}});
  let j = {};
  try { j = await r.json(); } catch (e) { j = {error: "HTTP " + r.status}; }
  if (!r.ok && !j.error) j.error = "HTTP " + r.status;
  return j;
}

async function act(key, action) {
  const out = document.getElementById("action-result");
  const j = await post(`/api/cache/${key}/${action}`);
  if (j.error) { out.className = "error"; out.textContent = `${action}: ${j.error}`; return; }
  await showCache();
  const o = document.getElementById("action-result");
  o.className = "";
  o.textContent = `${action}: entry ${key} is ${j.state}${j.pinned ? ", pinned" : ""}`;
}

async function showCache() {
  const [c, st] = await Promise.all([api("/api/cache"), api("/api/status")]);
  // Where each entry runs, as the processes report it (the status document's in_process rows).
  const where = new Map();
  for (const s of st.signatures || []) {
    for (const w of s.in_process || []) {
      if (!where.has(w.entry)) where.set(w.entry, []);
      where.get(w.entry).push(w);
    }
  }
  let h = `<h1>Cache <span class="muted">${esc(c.root)}</span></h1>
    <p>${tokenBox()}</p><p id="action-result"></p>`;
  if (c.error) h += `<p class="error">${esc(c.error)}</p>`;
  h += `<table id="entries"><tr><th>signature</th><th>state</th><th class="num">speedup</th><th class="num">PyTorch</th>
    <th class="num">kernel</th><th>proposer</th><th class="num">size</th><th>in-process</th><th>actions</th></tr>`;
  for (const e of c.entries) {
    const noWin = [inProcessText(where.get(e.key) || [])].concat((e.no_win || []).map((w) => esc(w.text)))
      .filter((x) => x).join("<br>");
    h += `<tr data-key="${esc(e.key)}"><td><code>${esc(e.signature)}</code><br><span class="muted">${esc(e.key)}</span></td>
      <td class="entry-state">${esc(e.state)}${e.pinned ? ", pinned" : ""}${e.reason ? `<br><span class="muted">${esc(e.reason)}</span>` : ""}</td>
      <td class="num">${fmtX(e.speedup)}</td><td class="num">${fmtTime(e.baseline_ns)}</td><td class="num">${fmtTime(e.candidate_ns)}</td>
      <td>${esc(e.proposer)}</td><td class="num">${(e.bytes / 1024).toFixed(1)} KiB</td><td class="in-process">${noWin || '<span class="muted">not loaded by an attached process; no no-win record</span>'}</td>
      <td>${["disable", "enable", "pin", "unpin"].map((a) => `<button data-action="${a}">${a}</button>`).join(" ")}</td></tr>`;
  }
  h += `</table>`;
  for (const u of c.unreadable || []) h += `<p class="error">${esc(u.key)}: ${esc(u.error)}</p>`;
  view.innerHTML = h;
  wireTokenBox();
  for (const b of view.querySelectorAll("button[data-action]")) {
    b.addEventListener("click", () => act(b.closest("tr").dataset.key, b.dataset.action));
  }
}

// ---- charts -----------------------------------------------------------------------------------

const PALETTE = ["#2563eb", "#16a34a", "#dc2626", "#d97706", "#7c3aed", "#0891b2", "#be185d", "#4d7c0f", "#9333ea", "#475569"];

// Best speedup over time, one step line per search: it starts at 1x (PyTorch's kernel) and steps up
// at each evaluation that beat the best. Time since the search began where the journal has it,
// else the evaluation's rank.
function progressChart(series) {
  const byTime = series.every((s) => s.points.every((p) => p.t_s !== null) && (s.points.length === 0 || s.last_t_s !== null));
  const xOf = (p) => byTime ? p.t_s : p.evaluation;
  const end = (s) => byTime ? (s.last_t_s || 0) : s.evaluated;
  const xMax = Math.max(1, ...series.map(end), ...series.flatMap((s) => s.points.map(xOf)));
  const yMax = Math.max(1.2, ...series.flatMap((s) => s.points.map((p) => p.speedup))) * 1.08;
  const W = 760, H = 300, L = 52, R = 16, T = 12, B = 40;
  const X = (x) => L + (W - L - R) * x / xMax, Y = (y) => T + (H - T - B) * (1 - (y - 1) / (yMax - 1));
  let svg = `<svg id="progress-chart" class="chart" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}">`;
  for (let k = 0; k <= 4; ++k) {
    const y = 1 + (yMax - 1) * k / 4;
    svg += `<line class="grid" x1="${L}" x2="${W - R}" y1="${Y(y)}" y2="${Y(y)}"/><text x="${L - 6}" y="${Y(y) + 4}" text-anchor="end">${y.toFixed(2)}x</text>`;
  }
  for (let k = 0; k <= 5; ++k) {
    const x = xMax * k / 5;
    svg += `<text x="${X(x)}" y="${H - B + 16}" text-anchor="middle">${byTime ? x.toFixed(0) + " s" : x.toFixed(0)}</text>`;
  }
  svg += `<text x="${(L + W - R) / 2}" y="${H - 4}" text-anchor="middle">${byTime ? "time since the search began" : "evaluations"}</text>`;
  series.forEach((s, i) => {
    let d = `M${X(0)},${Y(1)}`, y = 1;
    for (const p of s.points) { d += ` H${X(xOf(p))} V${Y(p.speedup)}`; y = p.speedup; }
    d += ` H${X(Math.max(end(s), s.points.length ? xOf(s.points[s.points.length - 1]) : 0))}`;
    svg += `<path class="series" data-search="${esc(s.id)}" d="${d}" stroke="${PALETTE[i % PALETTE.length]}"><title>${esc(s.signature)}: best ${y.toFixed(3)}x</title></path>`;
    for (const p of s.points) svg += `<circle cx="${X(xOf(p))}" cy="${Y(p.speedup)}" r="3" fill="${PALETTE[i % PALETTE.length]}"><title>${esc(p.label)}: ${p.speedup.toFixed(3)}x</title></circle>`;
  });
  return svg + `</svg>`;
}

// Each active entry's achieved bandwidth (the catalog's fewest bytes over its measured time) as a
// share of the copy bandwidth its device measured, beside PyTorch's kernel's on the same bytes.
function rooflineChart(rows) {
  const W = 760, rowH = 34, L = 250, R = 70, H = 30 + rows.length * rowH;
  const X = (f) => L + (W - L - R) * Math.min(1, f);
  let svg = `<svg id="roofline-chart" class="chart" width="${W}" height="${H}" viewBox="0 0 ${W} ${H}">`;
  for (let k = 0; k <= 4; ++k) svg += `<line class="grid" x1="${X(k / 4)}" x2="${X(k / 4)}" y1="14" y2="${H - 4}"/><text x="${X(k / 4)}" y="11" text-anchor="middle">${25 * k}%</text>`;
  rows.forEach((r, i) => {
    const y = 18 + i * rowH;
    svg += `<text x="${L - 8}" y="${y + 14}" text-anchor="end">${esc(r.label)}</text>`;
    svg += `<rect class="torch" x="${L}" y="${y + 2}" width="${X(r.torch) - L}" height="9"><title>PyTorch ${pct(r.torch)}</title></rect>`;
    svg += `<rect class="kforge" x="${L}" y="${y + 13}" width="${X(r.kforge) - L}" height="11"><title>kforge ${pct(r.kforge)}</title></rect>`;
    svg += `<text x="${X(r.kforge) + 4}" y="${y + 22}">${pct(r.kforge)}</text>`;
  });
  return svg + `</svg>`;
}

async function showCharts() {
  const [progress, c, st] = await Promise.all([api("/api/progress"), api("/api/cache"), api("/api/status")]);
  let h = `<h1>Charts</h1><h2>Best speedup over time, per signature</h2>`;
  if (progress.length === 0) {
    h += `<p class="muted">No search has run yet.</p>`;
  } else {
    h += progressChart(progress);
    h += `<p class="legend">${progress.map((s, i) => `<span><span style="color:${PALETTE[i % PALETTE.length]}">&#9632;</span>
      <a href="#/search/${esc(s.id)}"><code>${esc(s.op)}</code></a> ${s.points.length ? s.points[s.points.length - 1].speedup.toFixed(2) + "x" : "no win yet"}
      <span class="muted">(${esc(s.evaluated)} evaluated)</span></span>`).join("")}</p>`;
  }
  h += `<h2>Roofline: active kernels' bandwidth as a share of the device's copy bandwidth</h2>`;
  const bw = new Map();
  for (const s of st.slots || []) if (s.bandwidth_bytes_per_s) bw.set(s.arch, s.bandwidth_bytes_per_s);
  const rows = [], unknown = [];
  for (const e of c.entries || []) {
    if (e.state !== "active" || !e.op_bytes || !e.candidate_ns) continue;
    const copy = bw.get(e.arch);
    if (!copy) { unknown.push(e); continue; }
    const perNs = copy / 1e9;   // bytes per ns
    const args = e.signature.replace(/^[^(]*/, "");
    rows.push({label: `${e.op.replace(/^aten::/, "")} ${args.length > 30 ? args.slice(0, 29) + "\u2026" : args}`, key: e.key,
      kforge: e.op_bytes / e.candidate_ns / perNs, torch: e.baseline_ns ? e.op_bytes / e.baseline_ns / perNs : 0,
      gbs: e.op_bytes / e.candidate_ns, copy: copy / 1e9});
  }
  if (rows.length) {
    h += rooflineChart(rows) + `<p class="legend"><span><span style="color:#98a2b3">&#9632;</span> PyTorch's kernel</span>
      <span><span style="color:#2563eb">&#9632;</span> the active kernel</span><span class="muted">fewest bytes the operator moves
      (every input read once, every output written once) over the measured time</span></p>`;
    h += `<table id="roofline"><tr><th>entry</th><th class="num">bytes</th><th class="num">kernel</th><th class="num">achieved</th>
      <th class="num">copy bandwidth</th><th class="num">share</th><th class="num">PyTorch's share</th></tr>`;
    for (const r of rows) {
      const e = c.entries.find((x) => x.key === r.key);
      h += `<tr data-key="${esc(r.key)}"><td><code>${esc(e.signature)}</code></td><td class="num">${(e.op_bytes / 1048576).toFixed(2)} MiB</td>
        <td class="num">${fmtTime(e.candidate_ns)}</td><td class="num">${fmtBw(r.gbs)}</td><td class="num">${fmtBw(r.copy)}</td>
        <td class="num">${pct(r.kforge)}</td><td class="num">${pct(r.torch)}</td></tr>`;
    }
    h += `</table>`;
  } else {
    h += `<p class="muted" id="roofline-none">No active entry with a measured time on a device whose copy bandwidth this daemon measured.</p>`;
  }
  if (unknown.length) {
    h += `<p class="muted">Not shown, no worker of this daemon measured their device's copy bandwidth: ${unknown.map((e) =>
      `<code>${esc(e.op)}</code> (${esc(e.arch)})`).join(", ")}</p>`;
  }
  view.innerHTML = h;
}

// ---- routing and live updates -----------------------------------------------------------------

let current = {name: "", args: []};

async function route() {
  const parts = location.hash.replace(/^#\/?/, "").split("/").filter((p) => p.length);
  try {
    if (parts[0] === "search" && /^[0-9a-f]{32}$/.test(parts[1] || "")) {
      current = {name: "search", args: [parts[1]]};
      await showTree(parts[1]);
    } else if (parts[0] === "candidate" && /^[0-9a-f]{32}$/.test(parts[1] || "") && /^\d+$/.test(parts[2] || "")) {
      current = {name: "candidate", args: [parts[1], parts[2]]};
      await showCandidate(parts[1], parts[2]);
    } else if (parts[0] === "charts") {
      current = {name: "charts", args: []};
      await showCharts();
    } else if (parts[0] === "cache") {
      current = {name: "cache", args: []};
      await showCache();
    } else {
      current = {name: "overview", args: []};
      await showOverview();
    }
  } catch (e) {
    view.innerHTML = `<p class="error">${esc(e.message)}</p>`;
  }
}

// Re-render the current view at most every 500 ms while events arrive.
let pending = null;
function refreshSoon() {
  if (pending) return;
  pending = setTimeout(() => { pending = null; route(); }, 500);
}

function connect() {
  const es = new EventSource("/api/events");
  es.onopen = () => { live.textContent = "live"; live.className = "live on"; };
  es.onerror = () => { live.textContent = "reconnecting"; live.className = "live off"; };
  es.addEventListener("reset", () => route());
  es.onmessage = (m) => {
    let e;
    try { e = JSON.parse(m.data); } catch (err) { return; }
    if (current.name === "overview" || current.name === "charts" || (current.name === "cache" && e.event === "published")) refreshSoon();
    else if (current.name === "search" && e.signature === current.args[0]) refreshSoon();
    else if (current.name === "candidate" && e.signature === current.args[0] && String(e.node) === current.args[1]) refreshSoon();
  };
}

window.addEventListener("hashchange", route);
route();
connect();
