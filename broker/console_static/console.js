// Brook console: polls the broker's JSON endpoints and renders them. Every value is written
// with textContent (never innerHTML): topic and group names come from clients.
"use strict";

const POLL_MS = 2000;
const HISTORY = 60;
const history = { messages_in: [], bytes_in: [], bytes_out: [] };
let lastSample = null;

function el(tag, text, cls) {
  const e = document.createElement(tag);
  if (text !== undefined && text !== null) e.textContent = String(text);
  if (cls) e.className = cls;
  return e;
}

function row(cells, attrs) {
  const tr = document.createElement("tr");
  for (const [k, v] of Object.entries(attrs || {})) tr.dataset[k] = String(v);
  tr.append(...cells);
  return tr;
}

function cell(text, cls, name) {
  const td = el("td", text, cls);
  if (name) td.dataset.name = name;
  return td;
}

function fill(tableId, rows) {
  const body = document.querySelector(`#${tableId} tbody`);
  body.replaceChildren(...rows);
}

function list(values) { return (values || []).join(","); }

function card(label, value, good) {
  const c = el("div", null, "card");
  c.dataset.check = label;
  c.appendChild(el("div", label, "muted"));
  c.appendChild(el("div", value, "value " + (good ? "ok" : "bad")));
  return c;
}

function renderOverview(o) {
  document.getElementById("cluster").textContent = `cluster ${o.cluster_id} · controller ${o.controller_id} · metadata v${o.metadata_version}`;
  document.getElementById("served-by").textContent = o.served_by;
  document.getElementById("viewer").textContent = o.viewer;
  const h = o.health;
  document.getElementById("health").replaceChildren(
    card("status", h.healthy ? "healthy" : "UNHEALTHY", h.healthy),
    card("offline partitions", h.offline_partitions, h.offline_partitions === 0),
    card("under-replicated", h.under_replicated_partitions, h.under_replicated_partitions === 0),
    card("under min ISR", h.under_min_isr_partitions, h.under_min_isr_partitions === 0),
    card("fenced brokers", h.fenced_brokers.length ? list(h.fenced_brokers) : "none", h.fenced_brokers.length === 0));
  document.getElementById("notes").replaceChildren(...(o.notes || []).map(n => el("li", n)));
  const q = o.quorum || {};
  fill("quorum", q.error ? [row([cell(q.error, "bad")])] : (q.voters || []).map(v => row([
    cell(v.node_id, null, "voter"), cell(v.raft_address), cell(v.is_leader ? "leader" : "follower", null, "role"),
    cell(v.lag < 0 ? "?" : v.lag, null, "lag"), cell(v.last_contact_ms_ago < 0 ? "-" : `${v.last_contact_ms_ago} ms ago`)],
    { voter: v.node_id })));
  fill("brokers", o.brokers.map(b => row([
    cell(b.node_id, null, "id"), cell(b.address), cell(b.rack || "-"),
    cell(b.fenced ? "fenced" : "active", b.fenced ? "bad" : "ok", "state")], { broker: b.node_id })));
  const parts = [];
  for (const t of o.topics) {
    for (const p of t.partitions) {
      parts.push(row([
        cell(t.name, null, "topic"), cell(p.partition, null, "partition"),
        cell(p.leader < 0 ? "none" : p.leader, p.leader < 0 ? "bad" : null, "leader"), cell(p.leader_epoch, null, "epoch"),
        cell(list(p.replicas), null, "replicas"),
        cell(list(p.isr), p.isr.length < p.replicas.length ? "bad" : null, "isr"),
        cell(p.high_watermark === null ? "-" : p.high_watermark, null, "hw")], { topic: t.name, partition: p.partition }));
    }
  }
  fill("partitions", parts);
  fill("groups", o.groups.map(g => row([
    cell(g.group_id, null, "group"), cell(g.state, null, "state"), cell(g.members, null, "members"),
    cell(g.lag, g.lag > 0 ? "bad" : "ok", "lag")], { group: g.group_id })));
  const gp = [];
  for (const g of o.groups) {
    for (const p of g.partitions) {
      gp.push(row([cell(g.group_id), cell(`${p.topic}-${p.partition}`), cell(p.committed, null, "committed"),
                   cell(p.end, null, "end"), cell(p.lag, null, "lag")], { group: g.group_id, tp: `${p.topic}-${p.partition}` }));
    }
  }
  fill("group-partitions", gp);
}

function drawChart(key) {
  const svg = document.getElementById(`chart-${key}`);
  const values = history[key];
  const max = Math.max(1, ...values);
  const points = values.map((v, i) => `${(i * 300) / (HISTORY - 1)},${80 - (v / max) * 76}`).join(" ");
  const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
  line.setAttribute("points", points);
  svg.replaceChildren(line);
  const last = values.length ? values[values.length - 1] : 0;
  document.getElementById(`rate-${key}`).textContent = `(${Math.round(last).toLocaleString()})`;
}

function renderThroughput(s) {
  document.getElementById("throughput-node").textContent = `(broker ${s.node_id})`;
  if (lastSample) {
    const dt = (s.time_ms - lastSample.time_ms) / 1000;
    if (dt > 0) {
      for (const key of Object.keys(history)) {
        const rate = Math.max(0, (s.total[key] - lastSample.total[key]) / dt);
        history[key].push(rate);
        if (history[key].length > HISTORY) history[key].shift();
      }
    }
  }
  lastSample = s;
  for (const key of Object.keys(history)) drawChart(key);
}

async function getJson(path) {
  const r = await fetch(path, { cache: "no-store" });
  if (!r.ok) throw new Error(`${path}: HTTP ${r.status}`);
  return r.json();
}

async function poll() {
  const status = document.getElementById("status");
  try {
    const [overview, throughput] = await Promise.all([getJson("/api/overview"), getJson("/api/throughput")]);
    renderOverview(overview);
    renderThroughput(throughput);
    status.textContent = `updated ${new Date().toLocaleTimeString()}`;
    document.body.dataset.ready = "true";
  } catch (err) {
    status.textContent = `error: ${err.message}`;
  }
  setTimeout(poll, POLL_MS);
}

poll();
