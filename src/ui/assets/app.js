// The Flotilla dashboard: the fleet bar, the Microservice matrix and a
// detail view, kept live by the replica's event stream. Every value from
// a cluster is set as text (textContent), never parsed as markup.
"use strict";

const $ = (id) => document.getElementById(id);

const model = {
  clusters: [],          // fleet bar entries, sorted by name
  rows: new Map(),       // "ns/name" -> row
  dirty: new Set(),
  columns: [],
  synced: false,
};
const perf = { firstRender: null, events: 0, bytes: 0, lastUpdateBytes: 0, resets: 0 };
window.flotilla = perf;

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else e.setAttribute(k, v === true ? "" : String(v));
  }
  for (const c of children) {
    if (c === null || c === undefined) continue;
    e.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return e;
}

function when(iso) {
  if (!iso) return "never";
  const d = new Date(iso);
  return isNaN(d) ? String(iso) : d.toLocaleTimeString();
}

// ---- filters, carried in the URL so a link reproduces the view

const FILTERS = ["ns", "selector", "cluster", "state", "q"];

function readFilters() {
  const p = new URLSearchParams(location.search);
  const f = {};
  for (const k of FILTERS) f[k] = p.get(k) || "";
  f.detail = p.get("detail") || "";
  return f;
}

function writeFilters(f) {
  const p = new URLSearchParams();
  for (const k of [...FILTERS, "detail"]) if (f[k]) p.set(k, f[k]);
  const s = p.toString();
  history.replaceState(null, "", s ? "?" + s : location.pathname);
}

let filters = readFilters();

// A label selector as kubectl reads it: k=v, k==v, k!=v, k, !k.
function parseSelector(text) {
  const terms = [];
  for (const raw of text.split(",")) {
    const t = raw.trim();
    if (!t) continue;
    let m;
    if ((m = t.match(/^([^=!\s]+)\s*!=\s*(\S*)$/))) terms.push({ k: m[1], op: "!=", v: m[2] });
    else if ((m = t.match(/^([^=!\s]+)\s*==?\s*(\S*)$/))) terms.push({ k: m[1], op: "=", v: m[2] });
    else if ((m = t.match(/^!([^=!\s]+)$/))) terms.push({ k: m[1], op: "!" });
    else if ((m = t.match(/^([^=!\s]+)$/))) terms.push({ k: m[1], op: "exists" });
    else throw new Error("cannot read the label selector term " + JSON.stringify(t));
  }
  return terms;
}

function selectorMatches(terms, labels) {
  return terms.every((t) => {
    const has = Object.prototype.hasOwnProperty.call(labels, t.k);
    if (t.op === "=") return has && labels[t.k] === t.v;
    if (t.op === "!=") return !has || labels[t.k] !== t.v;
    if (t.op === "!") return !has;
    return has;
  });
}

let selector = [];

function applyFilterInputs() {
  for (const k of FILTERS) $("f-" + k).value = filters[k];
}

function onFilterInput() {
  for (const k of FILTERS) filters[k] = $("f-" + k).value.trim();
  writeFilters(filters);
  try {
    selector = parseSelector(filters.selector);
    $("f-error").textContent = "";
  } catch (e) {
    selector = [];
    $("f-error").textContent = e.message;
  }
  renderAll();
}

function visibleColumns() {
  return filters.cluster ? model.columns.filter((c) => c === filters.cluster) : model.columns;
}

function rowVisible(row) {
  if (filters.ns && row.namespace !== filters.ns) return false;
  if (filters.q && !row.name.toLowerCase().includes(filters.q.toLowerCase())) return false;
  if (!selectorMatches(selector, row.labels || {})) return false;
  const cells = row.cells.filter((c) => visibleColumns().includes(c.cluster));
  if (filters.cluster && cells.length === 0) return false;
  if (filters.state && !cells.some((c) => c.state === filters.state)) return false;
  return true;
}

// ---- the fleet bar

function renderClusters() {
  const ul = $("clusters");
  ul.replaceChildren(...model.clusters.map((c) => {
    const labels = Object.entries(c.labels || {}).map(([k, v]) => k + "=" + v).join(", ");
    return el("li", { "data-cluster": c.name, "data-reach": c.reach, "data-last-seen": c.lastSeen },
      el("span", { class: "name", text: c.name }), " ",
      el("span", { class: "reach", text: c.reach }),
      el("span", { class: "meta", text: "leader " + (c.leader || "none") + " · epoch " + (c.epoch ?? "–") }),
      c.lastSeen ? el("span", { class: "meta", text: "last seen " + when(c.lastSeen) }) : null,
      labels ? el("span", { class: "meta labels", text: labels }) : null,
      c.reason ? el("span", { class: "meta", text: c.reason }) : null);
  }));
  const select = $("f-cluster");
  const current = filters.cluster;
  select.replaceChildren(el("option", { value: "", text: "all" }),
    ...model.clusters.map((c) => el("option", { value: c.name, text: c.name })));
  select.value = current;
}

function updateColumns() {
  const names = new Set(model.clusters.map((c) => c.name));
  for (const row of model.rows.values()) for (const c of row.cells) names.add(c.cluster);
  const columns = [...names].sort();
  if (columns.join("\n") !== model.columns.join("\n")) {
    model.columns = columns;
    return true;
  }
  return false;
}

// ---- the matrix

const rowElements = new Map();

function cellElement(row, cluster, c, col) {
  const key = row.namespace + "/" + row.name;
  const attrs = { role: "gridcell", tabindex: -1, "data-key": key, "data-cluster": cluster, "aria-colindex": col };
  if (!c) return el("td", { ...attrs, class: "cell absent", "data-state": "Absent" }, el("span", { class: "meta", text: "—" }));
  const gens = "gen " + c.observedGeneration + "/" + c.generation;
  const ready = c.desired === null || c.desired === undefined ? "no Deployment" : "ready " + c.ready + "/" + c.desired;
  return el("td", { ...attrs, class: "cell state-" + c.state, "data-state": c.state, "data-last-seen": c.lastSeen, title: c.reason },
    el("span", { class: "state", text: c.state }),
    c.deleting ? el("span", { class: "meta", text: "deleting" }) : null,
    el("span", { class: "meta gens", text: gens }),
    el("span", { class: "meta image", text: c.image }),
    el("span", { class: "meta ready", text: ready }),
    c.lastSeen ? el("span", { class: "meta", text: "last seen " + when(c.lastSeen) }) : null);
}

function rowElement(row, index) {
  const key = row.namespace + "/" + row.name;
  const open = el("button", { type: "button", "data-open": key, tabindex: -1, text: row.namespace + "/" + row.name });
  const tr = el("tr", { role: "row", "data-key": key, "aria-rowindex": index + 2 },
    el("th", { scope: "row", class: "row-name", role: "rowheader" }, open));
  const byCluster = new Map(row.cells.map((c) => [c.cluster, c]));
  visibleColumns().forEach((cluster, i) => tr.append(cellElement(row, cluster, byCluster.get(cluster), i + 2)));
  tr.hidden = !rowVisible(row);
  return tr;
}

function renderHead() {
  $("matrix-head").replaceChildren(el("th", { scope: "col", role: "columnheader", text: "Microservice" }),
    ...visibleColumns().map((c) => el("th", { scope: "col", role: "columnheader", text: c })));
}

function sortedKeys() {
  return [...model.rows.keys()].sort();
}

function renderAll() {
  updateColumns();
  renderHead();
  rowElements.clear();
  const rows = sortedKeys().map((k, i) => {
    const tr = rowElement(model.rows.get(k), i);
    rowElements.set(k, tr);
    return tr;
  });
  $("matrix-body").replaceChildren(...rows);
  model.dirty.clear();
  afterRender();
}

function renderDirty() {
  if (updateColumns()) return renderAll();
  const body = $("matrix-body");
  let added = false;
  for (const key of model.dirty) {
    const row = model.rows.get(key);
    const old = rowElements.get(key);
    if (!row) {
      if (old) old.remove();
      rowElements.delete(key);
      continue;
    }
    const tr = rowElement(row, 0);
    if (old) {
      // Keep the keyboard where it was: the same cell of the new row.
      const at = (e) => (e ? [...e.parentElement.children].indexOf(e) : -1);
      const focused = old.contains(document.activeElement) ? at(document.activeElement.closest("td, th")) : -1;
      const roving = at(old.querySelector('[tabindex="0"]'));
      old.replaceWith(tr);
      if (roving >= 0 && tr.children[roving]) tr.children[roving].tabIndex = 0;
      if (focused >= 0 && tr.children[focused]) tr.children[focused].focus();
    } else added = true;
    rowElements.set(key, tr);
  }
  model.dirty.clear();
  if (added) body.replaceChildren(...sortedKeys().map((k) => rowElements.get(k)));
  afterRender();
}

function afterRender() {
  const shown = [...rowElements.values()].filter((tr) => !tr.hidden).length;
  $("count").textContent = shown + " of " + model.rows.size + " Microservices";
  const first = $("matrix-body").querySelector("tr:not([hidden]) [tabindex]");
  if (first && !$("matrix").querySelector('[tabindex="0"]')) first.tabIndex = 0;
  if (model.synced && perf.firstRender === null) {
    perf.firstRender = performance.now();
    performance.mark("flotilla-first-render");
  }
}

let scheduled = false;
function schedule() {
  if (scheduled) return;
  scheduled = true;
  requestAnimationFrame(() => {
    scheduled = false;
    if (model.synced) renderDirty();
  });
}

// Arrow keys move between cells; Enter opens the detail view.
function onGridKey(e) {
  const cell = e.target.closest("td, th");
  if (!cell) return;
  const tr = cell.parentElement;
  const rows = [...$("matrix-body").querySelectorAll("tr:not([hidden])")];
  const r = rows.indexOf(tr);
  const c = [...tr.children].indexOf(cell);
  let next = null;
  if (e.key === "ArrowRight") next = tr.children[c + 1];
  else if (e.key === "ArrowLeft") next = tr.children[c - 1];
  else if (e.key === "ArrowDown" && rows[r + 1]) next = rows[r + 1].children[c];
  else if (e.key === "ArrowUp" && rows[r - 1]) next = rows[r - 1].children[c];
  else if (e.key === "Enter") {
    const key = cell.dataset.key || tr.dataset.key;
    if (key) openDetail(key);
    e.preventDefault();
    return;
  } else return;
  e.preventDefault();
  if (next) {
    cell.tabIndex = -1;
    next.tabIndex = 0;
    next.focus();
  }
}

// ---- the detail view

let detailTimer = null;

function openDetail(key) {
  filters.detail = key;
  writeFilters(filters);
  loadDetail();
}

function closeDetail() {
  filters.detail = "";
  writeFilters(filters);
  $("detail").hidden = true;
}

async function loadDetail() {
  const key = filters.detail;
  if (!key) return;
  const [ns, name] = key.split("/");
  const res = await fetch("/api/microservices/" + encodeURIComponent(ns) + "/" + encodeURIComponent(name));
  if (res.status === 401) return showLogin();
  const section = $("detail");
  const opening = section.hidden;
  section.hidden = false;
  if (opening) section.scrollIntoView({ block: "start" });
  $("detail-title").textContent = key;
  if (!res.ok) {
    $("detail-wait").textContent = res.status === 404 ? "not found in any cluster" : "error " + res.status;
    $("detail-clusters").replaceChildren();
    $("detail-warnings").replaceChildren();
    return;
  }
  const d = await res.json();
  $("detail-wait").textContent = "flotilla wait would answer: " + d.wait.verdict +
    (d.wait.failed.length ? " (failed in " + d.wait.failed.join(", ") + ")" : "") + " — " + d.wait.summary;
  $("detail-clusters").replaceChildren(...d.clusters.map((c) => el("div", { class: "detail-cluster", "data-cluster": c.cluster },
    el("h3", { text: c.cluster + ": " + c.state + " — generation " + c.generation + ", observed " + c.observedGeneration }),
    c.message ? el("p", { class: "muted", text: c.message }) : null,
    el("table", { class: "conditions" },
      el("thead", {}, el("tr", {}, ...["Type", "Status", "Reason", "Message", "observedGeneration", "Last transition"]
        .map((h) => el("th", { scope: "col", text: h })))),
      el("tbody", {}, ...c.conditions.map((x) => el("tr", { "data-type": x.type },
        el("td", { text: x.type }), el("td", { text: x.status }), el("td", { text: x.reason }),
        el("td", { text: x.message }), el("td", { class: "observed", text: x.observedGeneration ?? "" }),
        el("td", { text: when(x.lastTransitionTime) }))))))));
  renderDns(d.dns);
  const warnings = d.warnings || [];
  $("detail-warnings").replaceChildren(...(warnings.length ? warnings.map((w) =>
    el("li", { "data-reason": w.reason }, when(w.time) + " · " + w.cluster + " · " + w.reason + ": " + w.note)) :
    [el("li", { class: "muted", text: d.warningsError || "none" })]));
}

// The fleet-wide DNS name: which clusters it answers and why (#31).
function renderDns(dns) {
  const box = $("detail-dns");
  box.hidden = !dns;
  if (!dns) return box.replaceChildren();
  if (dns.error) return box.replaceChildren(el("p", { class: "muted", text: "DNS: " + dns.error }));
  box.dataset.degraded = dns.degraded ? "true" : "false";
  box.replaceChildren(
    el("p", { id: "detail-dns-summary", text: "DNS: " + dns.summary + " (" + dns.strategy + ")" }),
    dns.degraded ? el("p", { class: "degraded", text: "FleetDnsDegraded: no cluster is healthy; every record is kept" }) : null,
    el("table", { class: "conditions" },
      el("thead", {}, el("tr", {}, ...["Cluster", "Listed", "Health", "Primary", "Address", "Why"]
        .map((h) => el("th", { scope: "col", text: h })))),
      el("tbody", {}, ...dns.clusters.map((c) => el("tr", { "data-cluster": c.cluster, "data-listed": String(c.listed) },
        el("td", { text: c.cluster }), el("td", { text: c.listed ? "yes" : "no" }), el("td", { text: c.health }),
        el("td", { text: c.primary ? "yes" : "no" }), el("td", { text: c.address || "" }),
        el("td", { text: c.reason }))))));
}

function detailChanged(key) {
  if (key !== filters.detail) return;
  clearTimeout(detailTimer);
  detailTimer = setTimeout(loadDetail, 250);
}

// ---- the rollouts view

const WAVE_WORDS = { Pending: "pending", AwaitingApproval: "awaiting approval", Progressing: "updating", Baking: "baking", Done: "done", Skipped: "skipped (no cluster)", Failed: "failed" };

// "5s", "2m", "1m30s", "500ms" as milliseconds.
function durationMs(text) {
  let total = 0;
  for (const [, n, unit] of String(text || "").matchAll(/(\d+(?:\.\d+)?)(ms|s|m|h)/g)) {
    total += Number(n) * { ms: 1, s: 1000, m: 60000, h: 3600000 }[unit];
  }
  return total;
}

function waveElement(r, w) {
  const st = r.status || {};
  const clusters = (st.clusters || []).filter((c) => w.clusters.includes(c.name));
  const done = clusters.filter((c) => c.state === "Done").length;
  let word = WAVE_WORDS[w.state] || w.state;
  if (w.state === "Baking") {
    const doneAt = Math.max(...clusters.map((c) => Date.parse(c.since) || 0));
    const left = Math.max(0, Math.ceil((durationMs(r.bake) - (Date.now() - doneAt)) / 1000));
    word = "baking, " + left + " s left";
  }
  if (clusters.some((c) => c.state === "Failed")) word = "failed";
  return el("li", { "data-wave": w.name, "data-state": w.state },
    el("span", { class: "wave-name", text: w.name }),
    el("progress", { max: Math.max(1, w.clusters.length), value: done, "aria-label": w.name + ": " + done + " of " + w.clusters.length + " clusters done" }),
    el("span", { class: "wave-state", text: word + " (" + done + "/" + w.clusters.length + ")" }),
    ...clusters.map((c) => el("span", { class: "chip", "data-cluster": c.name, "data-state": c.state, title: c.message || c.reason, text: c.name + ": " + c.state })),
    ...(w.analysis || []).map((c) => el("span", { class: "chip check", "data-check": c.name, "data-state": c.state, title: c.answer || "",
      text: "check " + c.name + ": " + c.state + (c.failures ? ", " + c.failures + " failed" : "") })),
    w.approval ? el("span", { class: "approval", text: "approved by " + w.approval.by + " at " + w.approval.at }) : null,
    approveButton(r, w));
}

// A wave held for approval, for someone who may approve: the button
// approves the revision this page shows, not whatever comes next.
function approveButton(r, w) {
  if (w.state !== "AwaitingApproval" || !mayDo(r).includes("approve")) return null;
  const revision = (r.status || {}).updateRevision;
  const number = (r.history.find((h) => h.name === revision) || {}).number ?? revision;
  const b = el("button", { type: "button", "data-action": "approve", "data-wave": w.name, text: "Approve " + w.name + " for revision " + number });
  b.addEventListener("click", () => edit(r.namespace + "/" + r.name, "approve", { wave: w.name, revision }));
  return b;
}

let session = { write: false, writeConfigured: false };

async function edit(key, action, body) {
  const [ns, name] = key.split("/");
  const res = await fetch("/api/rollouts/" + encodeURIComponent(ns) + "/" + encodeURIComponent(name) + "/" + action, {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify(body || {}),
  });
  let message = action + " " + key + ": ";
  if (res.ok) message += "done";
  else message += ((await res.json().catch(() => ({}))).error || "error " + res.status);
  $("edit-result").textContent = message;
}

// The write token may do everything; a Kubernetes identity what its RBAC
// grants in the rollout's namespace (the server checks again on click).
function mayDo(r) {
  if (session.write) return ["pause", "resume", "undo", "approve"];
  return (session.may || {})[r.namespace] || [];
}

function editButtons(r) {
  const may = mayDo(r);
  if (may.length === 0) return null;
  const key = r.namespace + "/" + r.name;
  const button = (action, label) => {
    if (!may.includes(action)) return null;
    const b = el("button", { type: "button", "data-action": action, text: label });
    b.addEventListener("click", () => edit(key, action));
    return b;
  };
  return el("p", { class: "edits" },
    r.paused ? button("resume", "Resume") : button("pause", "Pause"), " ",
    button("undo", "Undo to the last good revision"));
}

// With numberOfClusters: each cluster's role and why, and the last move.
function placementElement(p) {
  if (!p) return null;
  const moves = p.history || [];
  const last = moves[moves.length - 1];
  return el("div", { class: "placement" },
    el("ul", {}, ...(p.clusters || []).map((c) => el("li", { "data-placed": c.name, "data-role": c.role,
      text: c.name + " · " + c.role + " (" + c.reason + ")" + (c.message ? ": " + c.message : "") +
        (c.unreachableSince ? " · unreachable since " + c.unreachableSince : "") }))),
    last ? el("p", { class: "failover", text: "Last move: " + last.from + " → " + last.to + " (" + last.reason + ") at " + last.time }) : null);
}

function renderRollouts(list) {
  $("unlock").hidden = session.write || !session.writeConfigured;
  $("rollouts-section").hidden = list.length === 0;
  $("rollouts").replaceChildren(...list.map((r) => {
    const st = r.status || {};
    const number = (name) => (r.history.find((h) => h.name === name) || {}).number;
    const rolledBack = (st.conditions || []).find((c) => c.type === "RolledBack" && c.status === "True");
    const phase = st.phase || "Pending";
    const revision = "revision " + (number(st.updateRevision) ?? "–") +
      (st.currentRevision && st.currentRevision !== st.updateRevision ? ", current " + number(st.currentRevision) : "") +
      (st.lastGoodRevision ? ", last good " + number(st.lastGoodRevision) : "");
    return el("article", { class: "rollout", "data-rollout": r.namespace + "/" + r.name, "data-phase": phase },
      el("h3", { text: r.namespace + "/" + r.name }),
      el("p", { class: "phase", text: phase + (r.paused && phase !== "Paused" ? " (paused)" : "") + " · " + revision + " · " + r.image +
        (st.wave ? " · wave " + st.wave : "") }),
      rolledBack ? el("p", { class: "rollback", text: "Rolled back: " + rolledBack.message }) : null,
      editButtons(r),
      el("ol", { class: "waves" }, ...(st.waves || []).map((w) => waveElement(r, w))),
      placementElement(st.placement),
      el("details", {}, el("summary", { text: "History (" + r.history.length + " revisions)" }),
        el("ol", { class: "history" }, ...r.history.map((h) => el("li", { "data-revision": h.number,
          text: "#" + h.number + " " + h.image + (h.name === st.updateRevision ? " (update)" : "") +
            (h.name === st.lastGoodRevision ? " (last good)" : "") })))));
  }));
}

let lastRollouts = [];
setInterval(() => { if (lastRollouts.some((r) => (r.status?.waves || []).some((w) => w.state === "Baking"))) renderRollouts(lastRollouts); }, 1000);

// ---- the live stream

function setLive(state, text) {
  const p = $("live");
  p.dataset.state = state;
  p.textContent = text;
}

function handle(type, data, bytes) {
  perf.events++;
  perf.bytes += bytes;
  switch (type) {
    case "reset":
      perf.resets++;
      model.rows.clear();
      model.synced = false;
      // A stream starts over when what this identity may see or do
      // changed: its buttons are asked for again.
      refreshSession();
      break;
    case "item":
    case "upsert": {
      const key = data.namespace + "/" + data.name;
      model.rows.set(key, data);
      model.dirty.add(key);
      if (type === "upsert") {
        perf.lastUpdateBytes = bytes;
        detailChanged(key);
      }
      break;
    }
    case "delete": {
      const key = data.namespace + "/" + data.name;
      model.rows.delete(key);
      model.dirty.add(key);
      detailChanged(key);
      break;
    }
    case "synced":
      if (!model.synced) {
        model.synced = true;
        renderAll();
      }
      setLive("live", "live");
      break;
    case "clusters":
      model.clusters = data;
      renderClusters();
      break;
    case "rollouts":
      lastRollouts = data;
      renderRollouts(data);
      break;
  }
  if (model.synced) schedule();
}

let source = null;

function connect() {
  source = new EventSource("/api/events");
  for (const type of ["reset", "item", "upsert", "delete", "synced", "clusters", "rollouts", "bookmark"]) {
    source.addEventListener(type, (e) => handle(type, e.data ? JSON.parse(e.data) : {}, e.data.length));
  }
  source.onerror = () => {
    if (source.readyState === EventSource.CLOSED) {
      // Refused outright (e.g. the session ended): ask again.
      source = null;
      setLive("reconnecting", "disconnected; checking the session…");
      setTimeout(start, 2000);
    } else {
      setLive("reconnecting", "reconnecting…");
    }
  };
}

// ---- sign-in

// Signed out: nothing the last identity saw stays in the page.
function forget() {
  if (source) source.close();
  source = null;
  model.rows.clear();
  model.clusters = [];
  model.synced = false;
  lastRollouts = [];
  session = { write: false, writeConfigured: false };
  renderAll();
  renderClusters();
  renderRollouts([]);
  $("who").textContent = "";
}

function showLogin() {
  forget();
  $("fleet").hidden = true;
  $("login").hidden = false;
  setLive("reconnecting", "signed out");
  $("token").focus();
}

async function login(e) {
  e.preventDefault();
  const res = await fetch("/api/login", {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ token: $("token").value }),
  });
  $("token").value = "";
  if (res.ok) {
    $("login-error").textContent = "";
    start();
  } else {
    $("login-error").textContent = res.status === 401 ? "That token was refused." : "Sign-in failed: " + res.status;
  }
}

async function logout() {
  await fetch("/api/logout", { method: "POST", headers: { "content-type": "application/json" }, body: "{}" }).catch(() => null);
  showLogin();
}

async function refreshSession() {
  const res = await fetch("/api/session").catch(() => null);
  if (!res || !res.ok) return;
  session = await res.json().catch(() => session);
  renderRollouts(lastRollouts);
}

async function start() {
  let res;
  try {
    res = await fetch("/api/session");
  } catch (e) {
    setLive("reconnecting", "reconnecting…");
    setTimeout(start, 2000);
    return;
  }
  if (res.status === 401) return showLogin();
  session = await res.json().catch(() => session);
  $("logout").hidden = !session.signedIn;
  $("who").textContent = session.user ? "Signed in as " + session.user : "";
  $("login").hidden = true;
  $("fleet").hidden = false;
  renderRollouts(lastRollouts);
  if (source) return;
  connect();
  if (filters.detail) loadDetail();
}

document.addEventListener("DOMContentLoaded", () => {
  applyFilterInputs();
  try { selector = parseSelector(filters.selector); } catch (e) { $("f-error").textContent = e.message; }
  $("filters").addEventListener("input", onFilterInput);
  $("filters").addEventListener("submit", (e) => e.preventDefault());
  $("login-form").addEventListener("submit", login);
  $("matrix").addEventListener("keydown", onGridKey);
  $("matrix").addEventListener("click", (e) => {
    const b = e.target.closest("[data-open]");
    if (b) openDetail(b.dataset.open);
  });
  $("detail-close").addEventListener("click", closeDetail);
  $("logout").addEventListener("click", logout);
  // The write token, asked for beside the fleet rather than instead of it.
  $("unlock").addEventListener("click", () => {
    $("login").hidden = false;
    $("token").focus();
  });
  start();
});
