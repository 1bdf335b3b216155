// miso web page: polls /api/v1/cluster every 2 s and draws it. No external code.
"use strict";
(function () {
  const KEY = "miso-token";
  const $ = (id) => document.getElementById(id);
  let paused = false;
  let timer = null;

  function el(tag, attrs, ...kids) {
    const e = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) {
      if (k === "class") e.className = v;
      else if (k === "text") e.textContent = v;
      else e.setAttribute(k, v);
    }
    for (const k of kids) if (k != null) e.append(k instanceof Node ? k : String(k));
    return e;
  }
  const fmt = (x, d = 2) => (typeof x === "number" ? x.toFixed(d) : "\u2013");

  // `miso web` opens the page as URL/#token=...: a fragment never reaches the server (nor
  // its logs); keep it for this tab and drop it from the address bar and the history
  (function tokenFromFragment() {
    const m = /(?:^#|&)token=([^&]+)/.exec(location.hash || "");
    if (!m) return;
    sessionStorage.setItem(KEY, decodeURIComponent(m[1]));
    history.replaceState(null, "", location.pathname + location.search);
  })();
  function token() { return sessionStorage.getItem(KEY) || ""; }
  function showError(msg) {
    const e = $("error");
    e.textContent = msg || "";
    e.hidden = !msg;
  }

  async function fetchJSON(url) {
    const headers = {};
    if (token()) headers["Authorization"] = "Bearer " + token();
    const r = await fetch(url, { headers, cache: "no-store" });
    if (r.status === 401 || r.status === 403) {
      $("token-form").hidden = false;
      throw new Error(r.status === 401 ? "this page needs an API token" :
        "the token is not allowed to see the cluster");
    }
    if (!r.ok) throw new Error(url + ": HTTP " + r.status);
    return r.json();
  }

  function drawGpus(gpus) {
    const box = $("gpus");
    box.replaceChildren();
    if (!gpus.length) box.append(el("p", { text: "No GPU has joined yet." }));
    for (const g of gpus) {
      const units = g.units || 8;
      const bar = el("div", { class: "units", role: "list",
        "aria-label": `${g.id}: ${g.slices.length} slices over ${units} placement units` });
      bar.style.gridTemplateColumns = `repeat(${units}, 1fr)`;
      const used = new Set();
      for (const s of g.slices) {
        for (let u = s.start; u < s.start + Math.max(1, s.size); u++) used.add(u);
        const mps = s.mps_jobs && s.mps_jobs.length;
        const who = s.job === "other" ? (s.job_name || "another user's job") :
          s.job ? `job ${s.job}` + (s.job_name && s.job_name !== s.job ?
          ` \u00b7 ${s.job_name}` : "") : (mps ? `MPS: ${s.mps_jobs.join(", ")}` : "idle");
        const cls = "slice" + (s.job ? "" : (mps ? " mps" : " empty"));
        const d = el("div", { class: cls, role: "listitem",
          "aria-label": `slice ${s.profile} at unit ${s.start}: ${who}` },
          el("span", { class: "prof", text: s.profile }),
          el("span", { class: "job", text: who }));
        d.title = `${s.profile} @${s.start}, ${s.compute_slices} compute slices, ` +
          `${s.memory_gib} GiB: ${who}`;
        d.style.gridColumn = `${s.start + 1} / span ${Math.max(1, s.size)}`;
        d.style.gridRow = "1";
        bar.append(d);
      }
      for (let u = 0; u < units; u++) {
        if (used.has(u)) continue;
        const f = el("div", { class: "unit-free", "aria-hidden": "true" });
        f.style.gridColumn = `${u + 1} / span 1`;
        f.style.gridRow = "1";
        bar.append(f);
      }
      const phase = g.phase || "idle";
      const card = el("article", { class: "gpu", "aria-label": `GPU ${g.id}, ${phase}` },
        el("h3", {}, el("span", { text: `${g.id} \u00b7 ${g.model}` }),
          el("span", { class: "phase " + phase, text: phase })),
        bar,
        el("div", { class: "meta", text: `${g.jobs.length} job(s)` +
          (g.pending_plan ? ` \u00b7 plan ${g.pending_plan} in progress` : "") }));
      box.append(card);
    }
  }

  function drawJobs(jobs) {
    const tb = $("jobs").querySelector("tbody");
    tb.replaceChildren();
    const order = { running: 0, profiling: 1, checkpointing: 2, queued: 3 };
    const rows = [...jobs].sort((a, b) => (order[a.state] ?? 9) - (order[b.state] ?? 9) ||
      String(a.id).localeCompare(String(b.id), undefined, { numeric: true }));
    for (const j of rows) {
      const pct = j.progress == null ? null : Math.round(j.progress * 100);
      const prog = pct == null ? el("span", { text: "\u2013" }) :
        el("span", {}, el("progress", { max: "100", value: String(pct),
          "aria-label": `job ${j.id} progress ${pct} %` }), ` ${pct} %`);
      const sp = j.speed || {};
      // one unit per column: iterations per second; speed relative to the full GPU
      const rate = j.rate != null && (j.state === "running" || j.state === "profiling")
        ? fmt(j.rate, 1) : "\u2013";
      const rel = (sp.observed != null || sp.predicted != null)
        ? `${fmt(sp.observed)} / ${fmt(sp.predicted)}` + (sp.profile ? ` on ${sp.profile}` : "")
        : "\u2013";
      const ended = j.state === "failed" || j.state === "cancelled" || j.state === "finished";
      const why = j.wait_reason ? (/^waiting\b/i.test(j.wait_reason) ? j.wait_reason :
        `waiting: ${j.wait_reason}`) :
        (ended && j.reason ? `${j.state}: ${j.reason}` : "");
      tb.append(el("tr", {},
        el("td", { text: j.id }), el("td", { text: j.name || "" }),
        el("td", { text: j.owner || "" }),
        el("td", { class: "state-" + j.state, text: j.state }),
        el("td", { text: (j.gpu || "\u2013") + (j.slice ? " \u00b7 " + j.slice : "") }),
        el("td", { class: "nowrap" }, prog), el("td", { class: "num", text: rate }),
        el("td", { text: rel }),
        el("td", { class: "num", text: String(j.restarts ?? 0) }),
        el("td", { text: why })));
    }
  }

  function drawOwners(owners) {
    $("owners-section").hidden = !owners;
    if (!owners) return;
    const tb = $("owners").querySelector("tbody");
    tb.replaceChildren();
    const pct = (x) => `${Math.round(100 * (x || 0))} %`;
    const lim = (x) => (x == null ? "\u2013" : String(x));
    for (const o of owners) {
      const others = o.owner === "others" && o.owners != null;
      tb.append(el("tr", {},
        el("td", { text: others ? `others (${o.owners})` : o.owner }),
        el("td", { class: "num", text: pct(o.usage_share) }),
        el("td", { class: "num", text: pct(o.share) + (others ? "" : ` (${fmt(o.weight, 2)})`) }),
        el("td", { class: "num", text: fmt(o.in_use, 2) }),
        el("td", { text: others ? "\u2013" : `${lim(o.max_in_use)} / ${lim(o.max_queued)}` }),
        el("td", { class: "num", text: String(o.queued ?? 0) }),
        el("td", { class: "num", text: String(o.running ?? 0) })));
    }
  }

  function drawQueue(queue) {
    const q = $("queue");
    q.replaceChildren();
    $("queue-empty").hidden = queue.length > 0;
    q.hidden = !queue.length;
    for (const e of queue)
      q.append(el("li", { text: `job ${e.id} (${e.name || ""}${e.owner ? ", " + e.owner : ""})` +
        ` waiting ${fmt(e.waited_s, 0)} s: ${e.reason}` }));
  }

  function drawDecisions(recs) {
    const box = $("decisions");
    const open = new Set([...box.querySelectorAll("details[open]")].map((d) => d.dataset.seq));
    const seen = Number(box.dataset.seen || 0);
    box.replaceChildren();
    const list = [...recs].reverse();
    if (!list.length) box.append(el("p", { text: "No decision yet." }));
    list.forEach((r, i) => {
      const what = r.kind + (r.gpu ? " on " + r.gpu : "") + (r.job ? " for job " + r.job : "");
      const d = el("details", { class: "decision", "data-seq": String(r.seq) },
        el("summary", {}, `t=${fmt(r.time, 1)} s \u00b7 ${what} \u00b7 trigger: ${r.trigger}` +
          (r.expected_gain != null ? ` \u00b7 gain ${fmt(r.expected_gain, 3)}` : "")),
        el("pre", { text: r.text || r.note || "" }));
      // newly arrived decisions (the three newest) open themselves; the others keep the
      // state the reader left them in
      if (open.has(String(r.seq)) || (r.seq > seen && i < 3)) d.open = true;
      box.append(d);
    });
    if (list.length) box.dataset.seen = String(Math.max(seen, ...list.map((r) => r.seq)));
  }

  // ---- plots over time: samples kept in this tab since it opened ----------------------
  const HISTORY = [];
  const MAX_SAMPLES = 450;  // 15 minutes at one update every 2 s
  const COLOURS = ["#1f5fa8", "#b3400a", "#2d7a2d", "#7a2d7a", "#8a6d00", "#00707a",
    "#a8324a", "#4d4d4d"];

  function sample(v) {
    const gpus = {};
    for (const g of v.gpus) {
      const units = g.units || 8;
      let busy = 0;
      for (const s of g.slices) if (s.job || (s.mps_jobs && s.mps_jobs.length)) busy += s.size;
      gpus[g.id] = Math.min(1, busy / units);
    }
    const owners = {};
    if (v.owners) {  // tenancy on: each owner's share of the recent (decayed) GPU time
      for (const o of v.owners) {
        const name = o.owner === "others" && o.owners != null ? `others (${o.owners})` : o.owner;
        owners[name] = o.usage_share || 0;
      }
    } else {  // else: each owner's share of the placement units in use now
      const ownerOf = Object.fromEntries(v.jobs.map((j) => [j.id, j.owner || "?"]));
      let total = 0;
      for (const g of v.gpus) for (const s of g.slices) {
        if (!s.job) continue;
        const who = s.job === "other" ? "other users" : (ownerOf[s.job] || "?");
        owners[who] = (owners[who] || 0) + s.size;
        total += s.size;
      }
      for (const k of Object.keys(owners)) owners[k] /= total || 1;
    }
    const queued = v.counts ? v.counts.queued : v.queue.length;
    if (HISTORY.length && HISTORY[HISTORY.length - 1].t === v.time) return;
    HISTORY.push({ t: v.time, gpus, queued, owners, tenancy: !!v.owners });
    if (HISTORY.length > MAX_SAMPLES) HISTORY.shift();
  }

  const SVG = "http://www.w3.org/2000/svg";
  function svgEl(tag, attrs) {
    const e = document.createElementNS(SVG, tag);
    for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
    return e;
  }

  // One line chart: series {name: [values per sample]}, y from 0 to yMax.
  function chart(title, series, yMax, fmtY) {
    const W = 300, H = 100, L = 34, B = 14;
    const svg = svgEl("svg", { viewBox: `0 0 ${W} ${H}`, role: "img",
      preserveAspectRatio: "none" });
    const n = Math.max(0, ...Object.values(series).map((v) => v.length));
    const x = (i) => L + (n <= 1 ? 0 : (i * (W - L - 4)) / (n - 1));
    const y = (val) => H - B - (Math.min(val, yMax) / (yMax || 1)) * (H - B - 6);
    svg.append(svgEl("line", { x1: L, y1: H - B, x2: W - 2, y2: H - B, stroke: "#888" }));
    svg.append(svgEl("line", { x1: L, y1: 4, x2: L, y2: H - B, stroke: "#888" }));
    for (const [val, label] of [[0, fmtY(0)], [yMax, fmtY(yMax)]]) {
      const t = svgEl("text", { x: L - 3, y: y(val) + 3, "text-anchor": "end",
        "font-size": "9", fill: "#333" });
      t.textContent = label;
      svg.append(t);
    }
    const legend = el("ul", { class: "legend" });
    const words = [];
    Object.entries(series).forEach(([name, vals], k) => {
      const colour = COLOURS[k % COLOURS.length];
      const pts = vals.map((val, i) => (val == null ? null : `${x(i).toFixed(1)},${y(val).toFixed(1)}`))
        .filter((p) => p).join(" ");
      if (pts) svg.append(svgEl("polyline", { points: pts, fill: "none", stroke: colour,
        "stroke-width": "1.8", "vector-effect": "non-scaling-stroke" }));
      const last = vals[vals.length - 1];
      const sw = el("span", { class: "swatch" });
      sw.style.background = colour;
      legend.append(el("li", {}, sw, `${name}: ${last == null ? "\u2013" : fmtY(last)}`));
      words.push(`${name} ${last == null ? "none" : fmtY(last)}`);
    });
    svg.setAttribute("aria-label", `${title}, last ${n} updates; now ${words.join(", ")}`);
    return el("figure", { class: "plot" }, el("h3", { text: title }), svg, legend);
  }

  function drawPlots() {
    const box = $("plots");
    box.replaceChildren();
    if (!HISTORY.length) return;
    const pct = (f) => `${Math.round(100 * f)}%`;
    const gpuIds = [...new Set(HISTORY.flatMap((h) => Object.keys(h.gpus)))];
    const gpuSeries = Object.fromEntries(gpuIds.map((g) => [g,
      HISTORY.map((h) => (g in h.gpus ? h.gpus[g] : null))]));
    box.append(chart("GPU utilisation (busy placement units)", gpuSeries, 1, pct));
    const qs = HISTORY.map((h) => h.queued);
    box.append(chart("Queue length (jobs waiting)", { queued: qs },
      Math.max(1, ...qs), (v) => String(Math.round(v))));
    const owners = [...new Set(HISTORY.flatMap((h) => Object.keys(h.owners)))];
    if (owners.length) {
      box.append(chart(HISTORY[HISTORY.length - 1].tenancy ?
        "Each owner's share of recent GPU time" : "Each owner's share of the GPUs in use",
      Object.fromEntries(
        owners.map((o) => [o, HISTORY.map((h) => (o in h.owners ? h.owners[o] : null))])),
      1, pct));
    }
  }

  // Services (`miso serve`): a table and three plots over time, when the head runs a router
  const SVC_HISTORY = [];
  function drawServices(v) {
    $("services-section").hidden = !v;
    if (!v) return;
    const tb = $("services").querySelector("tbody");
    tb.replaceChildren();
    const list = v.services || [];
    $("services-none").hidden = list.length > 0;
    for (const s of list) {
      const over = s.p99_ms != null && s.p99_ms > s.slo_p99_ms;
      const slices = (s.slices || []).join(", ");
      tb.append(el("tr", {},
        el("td", { text: s.name }), el("td", {}, el("code", { text: s.url })),
        el("td", { class: "num", text: fmt(s.rate, 1) }),
        el("td", { text: `${s.ready_replicas} of ${(s.replicas || []).length}` +
          (slices ? ` (${slices})` : "") }),
        el("td", { class: over ? "num miss" : "num",
          text: `${fmt(s.p50_ms, 1)} / ${fmt(s.p99_ms, 1)} (${fmt(s.slo_p99_ms, 0)})` +
            (over ? " over the SLO" : "") }),
        el("td", { class: "num", text: s.attainment == null ? "\u2013" :
          `${(100 * s.attainment).toFixed(1)} %` }),
        el("td", { text: s.why || "" })));
    }
    const o = v.others || {};
    $("services-others").hidden = !o.services;
    $("services-others").textContent = o.services ?
      `Other owners run ${o.services} service(s) with ${o.replicas} replica(s).` : "";
    const t = Date.now();
    SVC_HISTORY.push({ t, s: Object.fromEntries(list.map((x) => [x.name, x])) });
    if (SVC_HISTORY.length > MAX_SAMPLES) SVC_HISTORY.shift();
    const box = $("service-plots");
    box.replaceChildren();
    const names = [...new Set(SVC_HISTORY.flatMap((h) => Object.keys(h.s)))].slice(0, 4);
    if (!names.length) return;
    const field = (name, f) => SVC_HISTORY.map((h) => (name in h.s ? h.s[name][f] ?? null : null));
    const num = (d) => (x) => x.toFixed(d);
    const rates = Object.fromEntries(names.map((n) => [n, field(n, "rate")]));
    box.append(chart("Request rate (requests/s, last 10 s)", rates,
      Math.max(1, ...Object.values(rates).flat().filter((x) => x != null)), num(1)));
    const reps = Object.fromEntries(names.map((n) => [n, field(n, "ready_replicas")]));
    box.append(chart("Ready replicas", reps,
      Math.max(1, ...Object.values(reps).flat().filter((x) => x != null)), num(0)));
    const lat = {};
    for (const n of names) {
      lat[`${n} p99`] = field(n, "p99_ms");
      lat[`${n} SLO`] = field(n, "slo_p99_ms");
    }
    box.append(chart("p99 latency vs SLO (ms, last 10 s)", lat,
      Math.max(1, ...Object.values(lat).flat().filter((x) => x != null)), num(0)));
  }

  async function refreshServices() {
    let v = null;
    try {
      v = await fetchJSON("api/v1/services");
    } catch (e) {  // no router on this head (404), or not allowed: no section
      v = null;
    }
    drawServices(v);
  }

  async function refresh() {
    if (paused) return;
    try {
      const v = await fetchJSON("api/v1/cluster");
      showError("");
      $("token-form").hidden = true;
      // the cluster's counts (every user's jobs), not only the reader's
      const c = v.counts || { running: v.jobs.filter((j) => j.state === "running").length,
        queued: v.queue.length };
      $("summary").textContent = `policy ${v.policy || "?"} \u00b7 ${v.gpus.length} GPUs \u00b7 ` +
        `${c.running} running \u00b7 ${c.queued} queued \u00b7 t=${fmt(v.time, 0)} s`;
      drawGpus(v.gpus);
      drawJobs(v.jobs);
      drawOwners(v.owners);
      drawQueue(v.queue);
      drawDecisions(v.decisions);
      sample(v);
      drawPlots();
      await refreshServices();
    } catch (e) {
      showError(e.message);
    }
  }

  function schedule() {
    clearInterval(timer);
    timer = setInterval(refresh, 2000);
  }

  $("token-form").addEventListener("submit", (ev) => {
    ev.preventDefault();
    sessionStorage.setItem(KEY, $("token").value.trim());
    $("token").value = "";
    refresh();
  });
  $("forget").addEventListener("click", () => {
    sessionStorage.removeItem(KEY);
    $("token-form").hidden = false;
    $("token").focus();
  });
  $("pause").addEventListener("click", (ev) => {
    paused = !paused;
    ev.target.setAttribute("aria-pressed", String(paused));
    ev.target.textContent = paused ? "Resume updates" : "Pause updates";
    if (!paused) refresh();
  });
  refresh();
  schedule();
})();
