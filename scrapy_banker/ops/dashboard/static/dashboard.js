// scrapy-banker dashboard: polls /api/state and redraws. No library, no network but this server.
// Every value from the fleet is put in the page as text (textContent), never as HTML:
// dead letters hold whatever a stranger queued.
"use strict";

(function () {
  const $ = (id) => document.getElementById(id);
  const SVG = "http://www.w3.org/2000/svg";
  const PALETTE = ["#4c9bff", "#3fb950", "#d29922", "#db61a2", "#a371f7", "#39c5cf", "#f0883e", "#8b949e"];
  const int = new Intl.NumberFormat(undefined, { maximumFractionDigits: 0 });
  const dec1 = new Intl.NumberFormat(undefined, { minimumFractionDigits: 1, maximumFractionDigits: 1 });

  let state = null;          // last good answer of /api/state
  let lastOk = 0;            // Date.now() of that answer
  let failures = 0;          // consecutive failed polls
  let refreshMs = 1000;
  const topicColor = new Map();

  // ---------------------------------------------------------------- helpers
  function h(tag, attrs, ...children) {
    const el = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (v === undefined || v === null || v === false) continue;
      if (k === "class") el.className = v;
      else if (k === "text") el.textContent = v;
      else el.setAttribute(k, v);
    }
    for (const c of children) {
      if (c === null || c === undefined) continue;
      el.append(c instanceof Node ? c : document.createTextNode(String(c)));
    }
    return el;
  }
  function s(tag, attrs, text) {
    const el = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs || {})) el.setAttribute(k, v);
    if (text !== undefined) el.textContent = text;
    return el;
  }
  const num = (v) => (typeof v === "number" && isFinite(v) ? v : null);
  const fmtInt = (v) => (num(v) === null ? "–" : int.format(v));
  function fmtRate(v) {
    if (num(v) === null) return "–";
    return v >= 100 ? int.format(v) : dec1.format(v);
  }
  function fmtAge(sec) {
    if (num(sec) === null) return "–";
    if (sec < 10) return dec1.format(sec) + " s";
    if (sec < 120) return int.format(sec) + " s";
    if (sec < 7200) return int.format(sec / 60) + " min";
    return dec1.format(sec / 3600) + " h";
  }
  function pick(obj, ...names) {
    if (!obj) return undefined;
    for (const n of names) if (obj[n] !== undefined && obj[n] !== null) return obj[n];
    return undefined;
  }
  function colorOf(topic) {
    if (!topicColor.has(topic)) topicColor.set(topic, PALETTE[topicColor.size % PALETTE.length]);
    return topicColor.get(topic);
  }
  function css(name) {
    return getComputedStyle(document.documentElement).getPropertyValue(name).trim();
  }
  function empty(container, text) {
    container.replaceChildren(h("div", { class: "empty", text }));
  }
  function setText(id, text, cls) {
    const el = $(id);
    el.textContent = text;
    if (cls !== undefined) el.className = "value" + (cls ? " " + cls : "");
  }

  // ------------------------------------------------------------ fleet model
  // The read model's JSON, read tolerantly: a field the fleet does not
  // publish (yet) shows as "–", never as an error.
  function nodesOf(fleet) {
    const raw = (fleet && fleet.nodes) || [];
    const list = Array.isArray(raw) ? raw : Object.entries(raw).map(([k, v]) => ({ node: k, ...v }));
    return list.map((n) => {
      const t = n.telemetry || null;
      const f = (t && t.fleet) || {};
      return {
        name: String(pick(n, "node", "name", "id") ?? (t && t.node) ?? "?"),
        alive: pick(n, "alive", "live"),
        age: num(pick(n, "heartbeat_age_s", "heartbeat_age", "age_s")),
        partitions: pick(n, "partitions_owned", "owned_partitions", "partitions") ?? f.partitions_owned,
        capacity: pick(n, "capacity"),
        queued: pick(n, "queued"),
        leased: pick(n, "leased") ?? f.leased,
        dead: pick(n, "dead", "dead_letters"),
        pages: t ? t.pages : undefined,
        inflight: t ? t.inflight : pick(n, "inflight"),
        pendingOps: f.pending_ops,
        connected: f.connected ?? pick(n, "connected"),
        telemetry: t,
      };
    });
  }
  function timeoutOf(st) {
    const f = st.fleet || {};
    return num(pick(f, "node_timeout_s", "node_timeout")) ?? num(st.server && st.server.node_timeout_s) ?? 30;
  }
  function sum(list, key) {
    let total = 0, seen = false;
    for (const x of list) if (num(x[key]) !== null) { total += x[key]; seen = true; }
    return seen ? total : null;
  }

  // -------------------------------------------------------------- render
  const isJobdir = (st) => Boolean(st && st.server && st.server.mode === "jobdir");
  // What the server reads, in the words of the status line.
  const subjectOf = (st) => (isJobdir(st) ? "the JOBDIR" : "the fleet");
  const KPI_LABELS = {
    fleet: { pages: "Pages", rate: "Pages / s", queued: "Queued", leased: "Leased", nodes: "Nodes alive" },
    jobdir: { pages: "Done", rate: "Done / s", queued: "Pending", leased: "Seen", nodes: "Journal written" },
  };

  // Fleet-only and JOBDIR-only cards and labels, for the mode this server is in.
  function showMode(jobdir) {
    document.querySelectorAll(".fleet-only").forEach((el) => { el.hidden = jobdir; });
    document.querySelectorAll(".jobdir-only").forEach((el) => { el.hidden = !jobdir; });
    for (const [k, text] of Object.entries(KPI_LABELS[jobdir ? "jobdir" : "fleet"])) $(`k-${k}-label`).textContent = text;
    $("topics").tHead.rows[0].cells[1].textContent = jobdir ? "Dispatched" : "Pages";
    $("rates-title").textContent = jobdir ? "Requests done / s" : "Pages / s by topic";
    $("slots-hint").textContent = jobdir ? "requests pending" : "in flight vs limit";
    $("dead-where").textContent = jobdir ? "Line" : "Partition";
  }

  function render(st) {
    showMode(isJobdir(st));
    if (isJobdir(st)) {
      renderJobdir(st);
      renderDead(st);
      renderControl(st);
      return;
    }
    const fleet = st.fleet || {};
    const server = st.server || {};
    const nodes = nodesOf(fleet);
    const timeout = timeoutOf(st);
    $("prefix").textContent = server.prefix || fleet.prefix || "fleet";
    document.title = `scrapy-banker · ${server.prefix || "fleet"}`;

    // -- KPIs
    const rates = st.rates || { t: [], series: {} };
    const all = (rates.series && rates.series["*"]) || [];
    const pages = sum(nodes, "pages");
    setText("k-pages", fmtInt(pages));
    $("k-pages-sub").textContent = `${nodes.filter((n) => n.telemetry).length} of ${nodes.length} nodes reporting`;
    const rateNow = all.length ? all[all.length - 1] : null;
    setText("k-rate", fmtRate(rateNow));
    const peak = all.length ? Math.max(...all) : null;
    $("k-rate-sub").textContent = peak !== null ? `peak ${fmtRate(peak)} · ${rates.window_s || 5} s average` : "\u00a0";
    const queued = num(pick(fleet, "queued")) ?? sum(nodes, "queued");
    const leased = num(pick(fleet, "leased")) ?? sum(nodes, "leased");
    const dead = num(pick(fleet, "dead", "dead_letters")) ?? sum(nodes, "dead");
    setText("k-queued", fmtInt(queued));
    const inflight = sum(nodes, "inflight");
    $("k-queued-sub").textContent = inflight !== null ? `${fmtInt(inflight)} downloading now` : "\u00a0";
    setText("k-leased", fmtInt(leased));
    const partitions = num(pick(fleet, "partitions"));
    $("k-leased-sub").textContent = partitions !== null ? `${fmtInt(partitions)} partitions` : "\u00a0";
    setText("k-dead", fmtInt(dead), dead ? "bad" : "");
    $("k-dead-sub").textContent = dead ? "requeue below" : "none";
    const alive = nodes.filter((n) => n.alive !== false && (n.age === null || n.age <= timeout)).length;
    setText("k-nodes", nodes.length ? `${alive} / ${nodes.length}` : "0", alive < nodes.length ? "warn" : "");
    $("k-nodes-sub").textContent = `heartbeat timeout ${fmtAge(timeout)}`;

    renderChart(rates);
    renderTopics(nodes, rates);
    renderSlots(nodes);
    renderNodes(nodes, timeout);
    renderBanker(nodes);
    renderGnp(nodes);
    renderDead(st);
    renderControl(st);
  }

  // ------------------------------------------------------- a single process
  // scrapy banker dashboard --jobdir: the JOBDIR's read model (what
  // scrapy banker status --jobdir shows), the requests done for the rate.
  function renderJobdir(st) {
    const j = st.jobdir || {};
    const server = st.server || {};
    const path = server.jobdir || j.path || "?";
    $("prefix").textContent = `JOBDIR ${path}`;
    document.title = `scrapy-banker · JOBDIR ${path}`;
    const rates = st.rates || { t: [], series: {} };
    const all = (rates.series && rates.series["*"]) || [];
    setText("k-pages", fmtInt(j.done));
    $("k-pages-sub").textContent = "requests done, per the journal";
    setText("k-rate", fmtRate(all.length ? all[all.length - 1] : null));
    const peak = all.length ? Math.max(...all) : null;
    $("k-rate-sub").textContent = peak !== null ? `peak ${fmtRate(peak)} · ${rates.window_s || 5} s average` : "\u00a0";
    setText("k-queued", fmtInt(j.queued));
    const unreadable = num(j.pending) !== null && num(j.queued) !== null ? j.pending - j.queued : 0;
    $("k-queued-sub").textContent = unreadable > 0 ? `${fmtInt(unreadable)} unreadable` : `in ${fmtInt((j.topics || []).length)} topics`;
    setText("k-leased", fmtInt(j.seen));
    $("k-leased-sub").textContent = "fingerprints in the journal";
    setText("k-dead", fmtInt(j.dead_letters), j.dead_letters ? "bad" : "");
    $("k-dead-sub").textContent = j.dead_letters ? "requeue below" : "none";
    const age = num(j.written_at) !== null && num(st.now) !== null ? Math.max(0, st.now - j.written_at) : null;
    // A crawl journals each request it queues or completes: a quiet journal
    // is a crawl idle, paused or stopped (which of them the JOBDIR cannot say).
    const quiet = age === null || age > 10;
    setText("k-nodes", age === null ? "never" : `${fmtAge(age)} ago`, quiet ? "warn" : "");
    $("k-nodes-sub").textContent = age === null ? "no journal yet" : quiet ? "idle, paused or stopped" : "written recently";

    renderChart(rates);
    // Topics: what each holds pending, its time slice and dispatch count at the last compaction.
    const body = $("topics").tBodies[0];
    const topics = (j.topics || []).slice().sort((a, b) => (b.queued || 0) - (a.queued || 0) || String(a.name).localeCompare(String(b.name)));
    if (!topics.length) {
      body.replaceChildren(h("tr", {}, h("td", { colspan: "6", class: "empty", text: "No request pending" })));
    } else {
      body.replaceChildren(...topics.map((t) => h("tr", { "data-topic": t.name },
        h("td", {}, h("span", { class: "swatch" }), String(t.name)),
        h("td", { class: "num", text: fmtInt(t.dispatched) }),
        h("td", { class: "num", text: "–" }),
        h("td", { class: "num", text: fmtInt(t.queued) }),
        h("td", { class: "num", text: "–" }),
        h("td", { class: "num", text: num(t.slice_s) === null ? "–" : dec1.format(t.slice_s) + " s" }))));
      topics.forEach((t, i) => { body.rows[i].querySelector(".swatch").style.background = colorOf(String(t.name)); });
    }
    // Hosts with the most pending requests.
    const box = $("slots");
    const slots = j.top_slots || [];
    if (!slots.length) {
      empty(box, "No request pending");
    } else {
      const most = Math.max(1, ...slots.map((sl) => sl.queued || 0));
      box.replaceChildren(...slots.slice(0, 10).map((sl) => {
        const fill = h("div", { class: "fill" });
        fill.style.width = (100 * (sl.queued || 0)) / most + "%";
        return h("div", { class: "bar-row", "data-host": sl.slot },
          h("div", { class: "what mono", title: sl.slot }, sl.slot),
          h("div", { class: "count" }, h("b", { text: fmtInt(sl.queued) }), " pending"),
          h("div", { class: "track" }, fill));
      }));
    }
    // The JOBDIR's own numbers.
    const dir = j.directory || {};
    const kinds = Object.entries(j.dead_letter_kinds || {}).map(([k, n]) => `${k}: ${fmtInt(n)}`).join(", ");
    const row = (what, value, cls) => h("tr", {}, h("th", { text: what }), h("td", { class: cls || "mono text", text: value }));
    $("jobdir-hint").textContent = "what a resume would replay";
    $("jobdir").tBodies[0].replaceChildren(
      row("Path", path),
      row("Pending", `${fmtInt(j.pending)} in the journal${unreadable > 0 ? `, ${fmtInt(unreadable)} unreadable` : ""}`),
      row("Done", `${fmtInt(j.done)} requests; ${fmtInt(j.seen)} fingerprints seen`),
      row("Directory", num(dir.global_depth) === null ? "–" : `global depth ${fmtInt(dir.global_depth)}, ${fmtInt(dir.buckets)} buckets`),
      row("Dead letters", `${fmtInt(j.dead_letters)}${kinds ? ` (${kinds})` : ""}`, j.dead_letters ? "bad" : ""),
      row("Malformed lines", fmtInt(j.malformed), j.malformed ? "warn" : ""),
      row("Journal written", age === null ? "never" : `${fmtAge(age)} ago`));
  }

  function renderTopics(nodes, rates) {
    const topics = new Map();
    for (const n of nodes) {
      const ts = (n.telemetry && n.telemetry.topics) || {};
      for (const [name, t] of Object.entries(ts)) {
        const acc = topics.get(name) || { pages: 0, queued: 0, inflight: 0, slices: [] };
        acc.pages += t.pages || 0;
        acc.queued += t.queued || 0;
        acc.inflight += t.inflight || 0;
        if (num(t.slice_s) !== null) acc.slices.push(t.slice_s);
        topics.set(name, acc);
      }
    }
    const body = $("topics").tBodies[0];
    if (!topics.size) {
      body.replaceChildren(h("tr", {}, h("td", { colspan: "6", class: "empty", text: "No topic telemetry yet" })));
      return;
    }
    const series = rates.series || {};
    const rows = [...topics.entries()].sort((a, b) => b[1].pages - a[1].pages).map(([name, t]) => {
      const r = series[name] || [];
      const slice = t.slices.length ? Math.max(...t.slices) : null;
      return h("tr", {},
        h("td", {}, h("span", { class: "swatch", style: null }), name),
        h("td", { class: "num", text: fmtInt(t.pages) }),
        h("td", { class: "num", text: fmtRate(r.length ? r[r.length - 1] : null) }),
        h("td", { class: "num", text: fmtInt(t.queued) }),
        h("td", { class: "num", text: fmtInt(t.inflight) }),
        h("td", { class: "num", text: slice === null ? "–" : dec1.format(slice) + " s" }));
    });
    body.replaceChildren(...rows);
    // Swatch colours through the CSSOM (the page's CSP forbids style attributes).
    [...topics.keys()].sort((a, b) => topics.get(b).pages - topics.get(a).pages).forEach((name, i) => {
      body.rows[i].querySelector(".swatch").style.background = colorOf(name);
    });
  }

  // A line per topic, the fleet's total dashed; drawn on a canvas sized to its box.
  function renderChart(rates) {
    const canvas = $("rates");
    const box = canvas.parentElement.getBoundingClientRect();
    const dpr = window.devicePixelRatio || 1;
    const W = Math.max(200, box.width), H = Math.max(120, box.height);
    if (canvas.width !== Math.round(W * dpr) || canvas.height !== Math.round(H * dpr)) {
      canvas.width = Math.round(W * dpr);
      canvas.height = Math.round(H * dpr);
    }
    const g = canvas.getContext("2d");
    g.setTransform(dpr, 0, 0, dpr, 0, 0);
    g.clearRect(0, 0, W, H);
    const ts = rates.t || [];
    const series = rates.series || {};
    const names = Object.keys(series).filter((k) => k !== "*").sort();
    const pad = { l: 44, r: 12, t: 10, b: 22 };
    const pw = W - pad.l - pad.r, ph = H - pad.t - pad.b;
    const muted = css("--muted"), grid = css("--grid");
    g.font = "11px system-ui, sans-serif";
    $("rates-hint").textContent = ts.length ? `${rates.window_s || 5} s average · last ${fmtAge(ts[ts.length - 1] - ts[0])}` : "";
    if (ts.length < 2) {
      g.fillStyle = muted;
      g.textAlign = "center";
      g.fillText(`Waiting for two readings of ${subjectOf(state)}…`, W / 2, H / 2);
      return;
    }
    let ymax = 0;
    for (const k of Object.keys(series)) for (const v of series[k]) ymax = Math.max(ymax, v);
    const step = niceStep(ymax / 4 || 1);
    ymax = Math.max(step, Math.ceil(ymax / step) * step);
    const t0 = ts[0], t1 = ts[ts.length - 1];
    const span = Math.max(1, t1 - t0);
    const x = (t) => pad.l + ((t - t0) / span) * pw;
    const y = (v) => pad.t + ph - (v / ymax) * ph;
    // grid + y labels
    g.strokeStyle = grid; g.lineWidth = 1; g.fillStyle = muted; g.textAlign = "right"; g.textBaseline = "middle";
    for (let v = 0; v <= ymax + 1e-9; v += step) {
      const yy = Math.round(y(v)) + 0.5;
      g.beginPath(); g.moveTo(pad.l, yy); g.lineTo(W - pad.r, yy); g.stroke();
      g.fillText(step >= 1 ? fmtInt(v) : fmtRate(v), pad.l - 6, yy);
    }
    // x labels: clock times at a few round seconds
    g.textAlign = "center"; g.textBaseline = "top";
    const xstep = niceTime(span / 5);
    for (let t = Math.ceil(t0 / xstep) * xstep; t <= t1; t += xstep) {
      const d = new Date(t * 1000);
      const label = d.toLocaleTimeString([], { hour: "2-digit", minute: "2-digit", second: span < 600 ? "2-digit" : undefined });
      g.fillText(label, x(t), H - pad.b + 6);
    }
    const line = (vals, color, width, dash) => {
      g.strokeStyle = color; g.lineWidth = width; g.setLineDash(dash || []);
      g.lineJoin = "round";
      g.beginPath();
      vals.forEach((v, i) => (i ? g.lineTo(x(ts[i]), y(v)) : g.moveTo(x(ts[i]), y(v))));
      g.stroke();
      g.setLineDash([]);
    };
    // Area under the total, faint.
    if (series["*"]) {
      const tot = series["*"];
      g.beginPath();
      g.moveTo(x(ts[0]), y(0));
      tot.forEach((v, i) => g.lineTo(x(ts[i]), y(v)));
      g.lineTo(x(ts[ts.length - 1]), y(0));
      g.closePath();
      g.fillStyle = "rgba(139,148,163,0.10)";
      g.fill();
      if (names.length > 1) line(tot, muted, 1.5, [4, 3]);
    }
    for (const name of names) line(series[name], colorOf(name), 2);
  }
  function niceStep(raw) {
    const p = Math.pow(10, Math.floor(Math.log10(raw)));
    for (const m of [1, 2, 2.5, 5, 10]) if (m * p >= raw) return m * p;
    return 10 * p;
  }
  function niceTime(raw) {
    for (const s of [5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600]) if (s >= raw) return s;
    return 3600;
  }

  function renderSlots(nodes) {
    const box = $("slots");
    const slots = [];
    for (const n of nodes) for (const sl of (n.telemetry && n.telemetry.slots) || []) slots.push({ ...sl, node: n.name });
    slots.sort((a, b) => (b.inflight / (b.limit || 1)) - (a.inflight / (a.limit || 1)) || b.inflight - a.inflight || b.queued - a.queued);
    if (!slots.length) return empty(box, "No host is being downloaded from");
    const rows = slots.slice(0, 10).map((sl) => {
      const limit = Math.max(1, sl.limit || 1);
      const fill = h("div", { class: "fill" + (sl.inflight >= limit ? " full" : "") });
      fill.style.width = Math.min(100, (100 * sl.inflight) / limit) + "%";
      return h("div", { class: "bar-row" },
        h("div", { class: "what mono", title: `${sl.slot} on ${sl.node}` }, sl.slot, h("span", { class: "node", text: sl.node })),
        h("div", { class: "count" }, h("b", { text: `${sl.inflight}/${sl.limit}` }), sl.queued ? ` · ${fmtInt(sl.queued)} queued` : ""),
        h("div", { class: "track" }, fill));
    });
    box.replaceChildren(...rows);
  }

  function renderNodes(nodes, timeout) {
    const body = $("nodes").tBodies[0];
    if (!nodes.length) {
      body.replaceChildren(h("tr", {}, h("td", { colspan: "11", class: "empty", text: "No node registered in this keyspace" })));
      return;
    }
    const rows = nodes.slice().sort((a, b) => a.name.localeCompare(b.name, undefined, { numeric: true })).map((n) => {
      const late = n.alive === false || (n.age !== null && n.age > timeout);
      const status = late ? h("span", { class: "tag late", text: "late" }) : h("span", { class: "tag alive", text: "alive" });
      const conn = n.connected === undefined ? "–" : n.connected ? "connected" : "reconnecting";
      return h("tr", { "data-node": n.name },
        h("td", { class: "mono", text: n.name }),
        h("td", {}, status),
        h("td", { class: "num" + (late ? " bad" : ""), text: fmtAge(n.age) }),
        h("td", { class: "num", text: fmtInt(n.partitions) }),
        h("td", { class: "num", text: fmtInt(n.pages) }),
        h("td", { class: "num", text: fmtInt(n.inflight) }),
        h("td", { class: "num", text: fmtInt(n.queued) }),
        h("td", { class: "num", text: fmtInt(n.leased) }),
        h("td", { class: "num" + (n.dead ? " bad" : ""), text: fmtInt(n.dead) }),
        h("td", { class: "num", text: fmtInt(n.pendingOps) }),
        h("td", { class: n.connected === false ? "warn" : "", text: conn }));
    });
    body.replaceChildren(...rows);
  }

  function renderBanker(nodes) {
    const box = $("banker");
    const acc = { total: {}, available: {}, allocated: {}, need: {}, tasks: 0, parked: 0 };
    let any = false;
    for (const n of nodes) {
      const b = n.telemetry && n.telemetry.banker;
      if (!b) continue;
      any = true;
      for (const k of ["total", "available", "allocated", "need"]) {
        for (const [r, v] of Object.entries(b[k] || {})) acc[k][r] = (acc[k][r] || 0) + v;
      }
      acc.tasks += b.tasks || 0;
      acc.parked += b.parked || 0;
    }
    const names = Object.keys(acc.total).sort();
    if (!any || !names.length) return empty(box, "No BANKER_RESOURCES on any node: admission is off");
    const rows = names.map((r) => {
      const total = Math.max(1, acc.total[r] || 0);
      const alloc = acc.allocated[r] || 0, need = acc.need[r] || 0, avail = acc.available[r] ?? total - alloc;
      const fa = h("div", { class: "fill full" }), fn = h("div", { class: "fill need" });
      fa.style.width = (100 * alloc) / total + "%";
      fn.style.width = (100 * Math.min(need, avail)) / total + "%";
      return h("div", { class: "res" },
        h("div", { class: "head" }, h("span", { class: "name mono", text: r }), h("span", { class: "muted", text: `${fmtInt(avail)} of ${fmtInt(acc.total[r])} available` })),
        h("div", { class: "track" }, fa, fn),
        h("div", { class: "legend" },
          h("span", {}, h("span", { class: "legend-dot dot-alloc" }), "allocated ", h("b", { text: fmtInt(alloc) })),
          h("span", {}, h("span", { class: "legend-dot dot-need" }), "need ", h("b", { text: fmtInt(need) })),
          h("span", {}, h("span", { class: "legend-dot dot-free" }), "available ", h("b", { text: fmtInt(avail) }))));
    });
    rows.push(h("div", { class: "tasks" }, `${fmtInt(acc.tasks)} tasks holding grants · `,
      h("span", { class: acc.parked ? "warn" : "", text: `${fmtInt(acc.parked)} requests parked (unsafe to grant)` })));
    box.replaceChildren(...rows);
  }

  // GNP map: the newest plan any node published; sites as dots, nodes as
  // labelled squares, a line from each site to the node it was placed on.
  function renderGnp(nodes) {
    const svg = $("gnp");
    let plan = null, planT = -1;
    for (const n of nodes) {
      const p = n.telemetry && n.telemetry.placement;
      if (p && Object.keys(p.nodes || {}).length && (n.telemetry.t || 0) > planT) { plan = p; planT = n.telemetry.t || 0; }
    }
    svg.replaceChildren();
    $("gnp-wrap").classList.toggle("no-map", !plan);
    const W = 640, H = plan ? 300 : 110;
    svg.setAttribute("viewBox", `0 0 ${W} ${H}`);
    const muted = css("--muted");
    if (!plan) {
      const mode = nodes.map((n) => n.telemetry && n.telemetry.placement && n.telemetry.placement.mode).find(Boolean);
      $("gnp-hint").textContent = mode ? `mode ${mode}` : "";
      const why = mode && mode !== "hash"
        ? `Placement "${mode}": no plan with coordinates yet (it needs latency measurements)`
        : "No network map: placement is \"hash\" (BANKER_PLACEMENT)";
      svg.append(s("text", { x: W / 2, y: H / 2, "text-anchor": "middle", fill: muted, "font-size": 13 }, why));
      return;
    }
    const pts = [...Object.values(plan.nodes), ...Object.values(plan.sites || {})].filter((c) => c.length >= 2);
    let [x0, x1, y0, y1] = [Infinity, -Infinity, Infinity, -Infinity];
    for (const [a, b] of pts) { x0 = Math.min(x0, a); x1 = Math.max(x1, a); y0 = Math.min(y0, b); y1 = Math.max(y1, b); }
    const pad = 28, sx = (W - 2 * pad) / Math.max(1e-9, x1 - x0), sy = (H - 2 * pad) / Math.max(1e-9, y1 - y0);
    const sc = Math.min(sx, sy);
    const ox = (W - sc * (x1 - x0)) / 2, oy = (H - sc * (y1 - y0)) / 2;
    const X = (c) => ox + (c[0] - x0) * sc, Y = (c) => H - (oy + (c[1] - y0) * sc);
    const nodeNames = Object.keys(plan.nodes).sort();
    const nodeColor = new Map(nodeNames.map((n, i) => [n, PALETTE[i % PALETTE.length]]));
    const sites = Object.entries(plan.sites || {});
    const gl = s("g", { "stroke-width": 1, "stroke-opacity": 0.35 });
    for (const [site, c] of sites) {
      const owner = (plan.assignment || {})[site];
      const nc = owner && plan.nodes[owner];
      if (nc) gl.append(s("line", { x1: X(c), y1: Y(c), x2: X(nc), y2: Y(nc), stroke: nodeColor.get(owner) || muted }));
    }
    svg.append(gl);
    const gs = s("g", {});
    for (const [site, c] of sites) {
      const owner = (plan.assignment || {})[site];
      const dot = s("circle", { cx: X(c), cy: Y(c), r: 3, fill: nodeColor.get(owner) || muted, "fill-opacity": 0.85 });
      dot.append(s("title", {}, owner ? `${site} → ${owner}` : site));
      gs.append(dot);
    }
    svg.append(gs);
    const text = css("--text"), card = css("--card");
    // Nodes the fit put (nearly) on top of each other: each label one line
    // lower than the last one there, so every name stays readable.
    const labels = [];
    for (const name of nodeNames) {
      const c = plan.nodes[name];
      const g = s("g", {});
      let ly = Y(c) + 4;
      while (labels.some(([lx, yy]) => Math.abs(lx - X(c)) < 40 && Math.abs(yy - ly) < 13)) ly += 14;
      labels.push([X(c), ly]);
      g.append(s("rect", { x: X(c) - 7, y: Y(c) - 7, width: 14, height: 14, rx: 3, fill: nodeColor.get(name), stroke: card, "stroke-width": 2 }));
      g.append(s("text", { x: X(c) + 11, y: ly, fill: text, "font-size": 12, "font-weight": 600, stroke: card, "stroke-width": 3, "paint-order": "stroke" }, name));
      svg.append(g);
    }
    $("gnp-hint").textContent = `mode ${plan.mode} · ${fmtInt(sites.length)} sites on ${nodeNames.length} nodes · first two GNP dimensions`;
  }

  function renderDead(st) {
    const list = st.dead_letters || (st.fleet && st.fleet.dead_letters) || [];
    const body = $("dead").tBodies[0];
    const actions = (st.server && st.server.actions) || {};
    const button = $("requeue"), token = $("token"), hint = $("action-hint");
    const jobdir = isJobdir(st);
    const total = num(pick((jobdir ? st.jobdir : st.fleet) || {}, "dead", "dead_letters"));
    $("dead-hint").textContent = list.length ? `showing ${list.length}${total !== null && total > list.length ? " of " + fmtInt(total) : ""}` : "";
    if (!actions.enabled) {
      button.disabled = true;
      token.hidden = true;
      hint.textContent = "Read-only: start the dashboard with -s BANKER_DASHBOARD_TOKEN=… to enable actions";
    } else {
      token.hidden = false;
      button.disabled = !list.length && !(total > 0);
      if (!hint.dataset.sticky) {
        hint.textContent = jobdir
          ? "Requeued into the journal while no crawl runs on the JOBDIR (the next resume fetches them); needs the token (top right)"
          : "Actions need the token the dashboard was started with (top right)";
      }
    }
    if (!list.length) {
      body.replaceChildren(h("tr", {}, h("td", { colspan: "3", class: "empty", text: "No dead letters" })));
      return;
    }
    body.replaceChildren(...list.slice(0, 50).map((d) => {
      let what = pick(d, "url") || "";
      const payload = pick(d, "payload", "raw");
      if (!what && typeof payload === "string") {
        try { what = JSON.parse(payload).url || payload; } catch (e) { what = payload; }
      }
      // A JOBDIR's letter: its line in banker-deadletter.jsonl, when and why.
      const reason = jobdir ? [pick(d, "when"), pick(d, "error")].filter(Boolean).join(": ") : pick(d, "reason");
      return h("tr", {},
        h("td", { class: "num", text: fmtInt(pick(d, "partition", "line")) }),
        h("td", { class: "bad", text: String(reason || "?") }),
        h("td", { class: "mono wrap", text: String(what).slice(0, 200) }));
    }));
  }

  // ---------------------------------------------------------------- control
  // The directives in force, the budget counts and the latest actions, read
  // by the server with the fleet; the form posts to /api/control with the token.
  // The verbs -- what each takes, its help, whether this server can carry it
  // out -- are the server's verb table (server.control_verbs): nothing here
  // names a verb.
  let controlBusy = false;
  let verbOptionsShown = "";  // the table the <select> was last built from

  function controlVerbs() {
    const verbs = state && state.server && state.server.control_verbs;
    return Array.isArray(verbs) ? verbs : [];
  }
  function verbNamed(name) {
    return controlVerbs().find((v) => v.name === name) || null;
  }

  function directiveText(c) {
    const parts = [];
    if (c.paused) parts.push("paused");
    if (num(c.delay) !== null && c.delay > 0) parts.push(`delay ${dec1.format(c.delay)} s`);
    if (num(c.limit) !== null) parts.push(`limit ${fmtInt(c.limit)}`);
    if (num(c.budget) !== null) parts.push(`budget ${fmtInt(c.budget)}`);
    return parts.join(" · ") || "–";
  }
  function actionText(e) {
    if (e.unreadable !== undefined) return `unreadable: ${e.unreadable}`;
    // A verb the table does not have (logged by another version): read from the entry.
    const verb = verbNamed(e.verb);
    if (verb ? verb.takes_urls : Array.isArray(e.urls)) {
      const n = Array.isArray(e.urls) ? e.urls.length : 0;
      return `${e.verb || "?"} ${n} URL(s)${e.topic ? " (topic " + e.topic + ")" : ""}`;
    }
    const takesValue = verb ? verb.takes_value : num(e.value) !== null;
    const value = !takesValue ? "" : num(e.value) !== null ? ` ${e.value}` : " none";
    return `${e.verb || "?"} ${e.target || ""}${value}`;
  }
  function tableRows(id, rows, cols, emptyText) {
    const body = $(id).tBodies[0];
    if (!rows.length) {
      body.replaceChildren(h("tr", {}, h("td", { colspan: String(cols), class: "empty", text: emptyText })));
      return;
    }
    body.replaceChildren(...rows);
  }

  function renderControl(st) {
    updateControlForm();
    updateControlInputs();
    const c = st.control;
    const errorBox = $("control-error");
    if (!c) {
      $("control-version").textContent = "";
      errorBox.hidden = true;
      tableRows("control-directives", [], 2, "No control information");
      tableRows("control-budgets", [], 5, "No budget information");
      tableRows("control-log", [], 3, "No action logged");
      return;
    }
    errorBox.hidden = !c.error;
    errorBox.textContent = c.error ? `Control document: ${c.error}` : "";
    const doc = c.state || {};
    $("control-version").textContent = num(doc.version) !== null ? `version ${fmtInt(doc.version)}` : "";
    // Directives.
    const rows = [];
    for (const [host, hc] of Object.entries(doc.hosts || {}).sort()) {
      rows.push(h("tr", { "data-target": host }, h("td", { class: "mono", text: host }),
        h("td", { class: hc.paused ? "warn" : "", text: directiveText(hc) })));
    }
    for (const [topic, tc] of Object.entries(doc.topics || {}).sort()) {
      rows.push(h("tr", { "data-target": `topic:${topic}` }, h("td", { class: "mono", text: `topic:${topic}` }),
        h("td", { class: tc.paused ? "warn" : "", text: directiveText(tc) })));
    }
    if (num(doc.crawl_budget) !== null) {
      rows.push(h("tr", { "data-target": "crawl" }, h("td", { class: "mono", text: "crawl" }),
        h("td", { text: `budget ${fmtInt(doc.crawl_budget)}` })));
    }
    tableRows("control-directives", rows, 2, "Nothing set: the crawl runs on its settings");
    // Budgets: the crawl's, each topic's, and the hosts with pages charged.
    const counts = c.counts || { hosts: {}, held: {}, topics: {}, crawl: 0 };
    const budgets = c.budgets || { topics: {}, hosts: {} };
    const brows = [];
    const brow = (scope, name, charged, budget, held) => {
      const spent = num(budget) !== null && charged >= budget;
      return h("tr", { "data-scope": scope, "data-name": name },
        h("td", { text: scope }), h("td", { class: "mono", text: name }),
        h("td", { class: "num" + (spent ? " warn" : ""), text: fmtInt(charged) }),
        h("td", { class: "num", text: num(budget) === null ? "none" : fmtInt(budget) }),
        h("td", { class: "num" + (held ? " warn" : ""), text: held ? fmtInt(held) : "" }));
    };
    if (num(budgets.crawl) !== null || counts.crawl > 0) brows.push(brow("crawl", "crawl", counts.crawl || 0, budgets.crawl, counts.held_total || 0));
    const topicNames = new Set([...Object.keys(budgets.topics || {}), ...Object.keys(counts.topics || {})]);
    for (const t of [...topicNames].sort()) brows.push(brow("topic", t, (counts.topics || {})[t] || 0, (budgets.topics || {})[t], 0));
    const hostNames = new Set([...Object.keys(counts.hosts || {}), ...Object.keys(counts.held || {})]);
    const hosts = [...hostNames].sort((a, b) => ((counts.hosts[b] || 0) - (counts.hosts[a] || 0)) || a.localeCompare(b));
    for (const host of hosts.slice(0, 15)) brows.push(brow("host", host, (counts.hosts || {})[host] || 0, (budgets.hosts || {})[host], (counts.held || {})[host] || 0));
    const total = num(counts.hosts_total);
    $("budget-hint").textContent = total !== null && total > 15 ? `${fmtInt(Math.min(15, hosts.length))} of ${fmtInt(total)} hosts` : "";
    tableRows("control-budgets", brows, 5, num(budgets.host_default) !== null || (budgets.host_patterns || []).length
      ? "No page charged yet" : "No budget in force");
    // The log, newest first.
    const lrows = (c.log || []).map((e) => {
      const at = num(e.at) !== null ? new Date(e.at * 1000) : null;
      const today = at && at.toDateString() === new Date().toDateString();
      const when = at ? (today ? at.toLocaleTimeString() : at.toLocaleString()) : "–";
      return h("tr", {}, h("td", { text: when, title: at ? at.toString() : null }),
        h("td", { class: "mono text", text: String(e.who || "?") }),
        h("td", { class: "mono text", text: actionText(e) }));
    });
    tableRows("control-log", lrows, 3, "No action logged");
  }

  function updateControlForm() {
    const actions = (state && state.server && state.server.actions) || {};
    const hint = $("control-hint"), form = $("control-form");
    const token = $("token").value.trim();
    const ready = Boolean(actions.control) && token !== "";
    form.hidden = !ready;
    $("control-fields").disabled = !ready || controlBusy;
    if (hint.dataset.sticky) return;
    if (!actions.control) hint.textContent = "Read-only: start the dashboard with -s BANKER_DASHBOARD_TOKEN=… to steer the crawl";
    else if (!token) hint.textContent = "Type the dashboard token (top right) to steer the crawl";
    else if (isJobdir(state)) hint.textContent = "In force in the crawl on this JOBDIR within a second; the same checks as scrapy banker pause|resume|… --jobdir";
    else hint.textContent = "In force fleet-wide within a heartbeat; the same checks as scrapy banker pause|resume|…";
  }

  function buildVerbOptions(select, verbs) {
    // One option per verb of the table, in its order; those this server cannot
    // carry out (a single process has no queue to purge or inject into) disabled.
    const shown = JSON.stringify(verbs.map((v) => [v.name, v.available, v.help]));
    if (shown === verbOptionsShown) return;
    verbOptionsShown = shown;
    const chosen = select.value;
    select.replaceChildren(...verbs.map((v) => {
      const opt = h("option", { value: v.name, text: v.name,
        title: v.available ? v.help : `${v.help} -- not available here` });
      opt.disabled = opt.hidden = !v.available;
      return opt;
    }));
    const keep = verbs.find((v) => v.name === chosen && v.available) || verbs.find((v) => v.available);
    if (keep) select.value = keep.name;
  }

  function updateControlInputs() {
    const select = $("control-verb");
    buildVerbOptions(select, controlVerbs());
    const verb = verbNamed(select.value);
    const target = $("control-target"), value = $("control-value");
    target.placeholder = verb ? verb.target_hint : "target";
    target.title = verb ? `${verb.name} takes ${verb.usage}` : "";
    select.title = verb ? verb.help : "";
    value.placeholder = verb ? verb.value_hint : "value";
    // The value field carries the verb's value, or the topic of a verb that takes URLs.
    const noValue = Boolean(verb) && !verb.takes_value && !verb.takes_urls;
    value.disabled = noValue;
    if (noValue) value.value = "";
    $("control-force").disabled = !verb || !verb.takes_host;
  }

  async function submitControl(ev) {
    ev.preventDefault();
    if (controlBusy) return;
    const hint = $("control-hint"), token = $("token").value.trim();
    const verb = $("control-verb").value, spec = verbNamed(verb);
    const target = $("control-target").value.trim(), value = $("control-value").value.trim();
    const body = spec && spec.takes_urls
      ? { verb, args: target.split(/\s+/).filter(Boolean), topic: value || null }
      : { verb, args: spec && !spec.takes_value ? [target] : [target, value],
          force: Boolean(spec && spec.takes_host) && $("control-force").checked };
    controlBusy = true;
    hint.dataset.sticky = "1";
    hint.className = "muted";
    hint.textContent = "Sending…";
    updateControlForm();
    try {
      const r = await fetch("/api/control", {
        method: "POST",
        headers: { "Content-Type": "application/json", Authorization: `Bearer ${token}` },
        body: JSON.stringify(body),
      });
      const data = await r.json().catch(() => ({}));
      if (r.ok) {
        let text = `Done: ${data.done} (control version ${fmtInt(data.version)})`;
        if (num(data.purged) !== null) text += ` · ${fmtInt(data.purged)} queued requests dead-lettered`;
        if (num(data.injected) !== null) text += ` · ${fmtInt(data.injected)} queued, ${fmtInt(data.duplicates)} already seen`;
        hint.className = "good";
        hint.textContent = text;
      } else {
        hint.className = "bad";
        hint.textContent = `Refused (${r.status}): ${data.error || r.statusText}`;
      }
    } catch (e) {
      hint.className = "bad";
      hint.textContent = `Failed: ${e}`;
    }
    controlBusy = false;
    updateControlForm();
    setTimeout(() => { delete hint.dataset.sticky; hint.className = "muted"; updateControlForm(); }, 10000);
  }

  // --------------------------------------------------------------- status
  function renderStatus() {
    const pill = $("status-pill"), banner = $("banner");
    const age = (Date.now() - lastOk) / 1000;
    let cls = "live", text = "live", msg = null, warn = false;
    if (!state) { cls = "down"; text = "connecting…"; }
    if (failures >= 2) { cls = "down"; text = "offline"; msg = `The dashboard server does not answer (last answer ${fmtAge(age)} ago): the numbers below are stale.`; }
    else if (state && state.error) {
      cls = "down"; text = isJobdir(state) ? "JOBDIR unreadable" : "Redis unreachable";
      const readAge = state.read_at ? state.now - state.read_at : null;
      msg = `${state.error}${readAge !== null ? ` · showing ${subjectOf(state)} as read ${fmtAge(readAge)} ago` : ""}`;
    } else if (state && state.read_at && state.now - state.read_at > 3 * ((state.server && state.server.refresh_s) || 1) + 2) {
      cls = "stale"; text = "stale"; warn = true;
      msg = `The last read of ${subjectOf(state)} is ${fmtAge(state.now - state.read_at)} old.`;
    }
    pill.className = "pill " + cls;
    pill.textContent = text;
    banner.hidden = !msg;
    banner.className = "banner" + (warn ? " warn" : "");
    banner.textContent = msg || "";
    if (state && state.read_at) {
      const d = new Date(state.read_at * 1000);
      $("updated").textContent = `updated ${d.toLocaleTimeString()}`;
    }
  }

  async function poll() {
    try {
      const r = await fetch("/api/state", { cache: "no-store" });
      if (!r.ok) throw new Error(`HTTP ${r.status}`);
      state = await r.json();
      lastOk = Date.now();
      failures = 0;
      const rs = state.server && state.server.refresh_s;
      refreshMs = Math.min(2000, Math.max(1000, (rs || 1) * 1000));
      render(state);
    } catch (e) {
      failures += 1;
    }
    renderStatus();
    setTimeout(poll, refreshMs);
  }

  // --------------------------------------------------------------- actions
  async function requeue() {
    const hint = $("action-hint"), token = $("token");
    sessionStorage.setItem("banker-token", token.value);
    hint.dataset.sticky = "1";
    hint.textContent = "Requeueing…";
    try {
      const r = await fetch("/api/deadletters/requeue", {
        method: "POST",
        headers: { "Content-Type": "application/json", Authorization: `Bearer ${token.value}` },
        body: JSON.stringify({ count: "all" }),
      });
      const data = await r.json().catch(() => ({}));
      hint.textContent = r.ok ? `Requeued ${fmtInt(data.requeued)} dead letters` : `Refused (${r.status}): ${data.error || r.statusText}`;
    } catch (e) {
      hint.textContent = `Failed: ${e}`;
    }
    setTimeout(() => { delete hint.dataset.sticky; }, 8000);
  }

  function initTheme() {
    const saved = localStorage.getItem("banker-theme");
    const light = saved ? saved === "light" : window.matchMedia("(prefers-color-scheme: light)").matches;
    if (light) document.documentElement.dataset.theme = "light";
    $("theme").addEventListener("click", () => {
      const now = document.documentElement.dataset.theme === "light" ? "dark" : "light";
      if (now === "light") document.documentElement.dataset.theme = "light";
      else delete document.documentElement.dataset.theme;
      localStorage.setItem("banker-theme", now);
      if (state) render(state);
    });
  }

  document.addEventListener("DOMContentLoaded", () => {
    initTheme();
    $("token").value = sessionStorage.getItem("banker-token") || "";
    $("token").addEventListener("input", () => {
      sessionStorage.setItem("banker-token", $("token").value);
      updateControlForm();
    });
    $("requeue").addEventListener("click", requeue);
    $("control-form").addEventListener("submit", submitControl);
    $("control-verb").addEventListener("change", updateControlInputs);
    updateControlInputs();
    window.addEventListener("resize", () => state && renderChart(state.rates || {}));
    setInterval(renderStatus, 1000);
    poll();
  });
})();
