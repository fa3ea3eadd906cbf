// The pxvm page: WebGPU status, the kernel conformance suite, benchmarks and .pxi programs.
// Every case is a dispatch plan served by `pxvm serve`; gpu.js replays it generically.

import { compare, decodeBase64, openGpu } from "./gpu.js";

const $ = (sel) => document.querySelector(sel);

function el(tag, attrs = {}, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "class") node.className = v;
    else if (k.startsWith("data-")) node.setAttribute(k, v);
    else node[k] = v;
  }
  for (const c of children) node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  return node;
}

// The server starts work (an upload, the native benchmarks) only for requests carrying its
// session token, which /api/info gives to this origin alone: pages of other sites cannot.
async function getJson(url, init = {}) {
  const headers = { ...(init.headers || {}) };
  if (info) headers["X-Pxvm-Session"] = info.session;
  const r = await fetch(url, { ...init, headers });
  const body = await r.json().catch(() => ({ error: `HTTP ${r.status}` }));
  if (!r.ok) throw new Error(body.error || `HTTP ${r.status}`);
  return body;
}

const fmt = (x) => (x === 0 ? "0" : x < 1e-3 ? x.toExponential(2) : x.toPrecision(3));

let gpu = null;
let info = null;
let planQuery = "";  // the device's plan features, asked of every case plan

// ---- WebGPU status ---------------------------------------------------------------------
async function showAdapter() {
  const box = $("#webgpu");
  const opened = await openGpu();
  if (opened.error) {
    box.dataset.state = "missing";
    box.replaceChildren(
      el("p", { class: "bad" }, opened.error),
      el("p", {}, "To enable WebGPU: use a recent Chrome, Edge or Chromium (113+), or Firefox 141+ / Safari 26+; ",
        "on Linux start Chromium with --enable-unsafe-webgpu --enable-features=Vulkan ",
        "(headless, without a GPU: add --use-angle=swiftshader for the SwiftShader CPU adapter); ",
        "check chrome://gpu for \"WebGPU: Hardware accelerated\" and that the GPU is not blocklisted."));
    return false;
  }
  gpu = opened.gpu;
  if (opened.planFeatures.length) planQuery = `?features=${opened.planFeatures.join(",")}`;
  const i = opened.info;
  const rows = [["vendor", i.vendor], ["architecture", i.architecture], ["device", i.device],
    ["description", i.description], ["fallback adapter", i.fallback]]
    .filter(([, v]) => v !== undefined && v !== "");
  const limits = Object.entries(opened.limits).sort((a, b) => a[0].localeCompare(b[0]));
  box.dataset.state = "ok";
  box.replaceChildren(
    el("p", { class: "good" }, "WebGPU adapter found."),
    el("table", { class: "kv" }, ...rows.map(([k, v]) => el("tr", {}, el("th", {}, k), el("td", {}, String(v))))),
    el("p", { id: "plan-features" }, `kernels use: ${opened.planFeatures.join(", ") || "no optional features"}`),
    el("details", {}, el("summary", {}, `limits (${limits.length}) and features (${opened.features.length})`),
      el("table", { class: "kv small" }, ...limits.map(([k, v]) => el("tr", {}, el("th", {}, k), el("td", {}, String(v))))),
      el("p", { class: "small" }, opened.features.join(", "))));
  return true;
}

// ---- conformance -----------------------------------------------------------------------
async function runSuite() {
  const body = $("#suite-rows");
  const summary = $("#suite-summary");
  body.replaceChildren();
  const rows = new Map();
  for (const c of info.cases) {
    const status = el("td", { class: "status" }, "waiting");
    const row = el("tr", { "data-case": c.id, "data-state": "waiting" },
      el("td", {}, c.id), el("td", { class: "shapes" }, ""), el("td", { class: "num" }, ""),
      el("td", { class: "num nmse" }, ""), el("td", { class: "num" }, ""), status);
    rows.set(c.id, row);
    body.append(row);
  }
  for (const op of info.ops_without_case) {
    body.append(el("tr", { "data-case": op, "data-state": "nocase" }, el("td", {}, op),
      el("td", { colSpan: 4 }, "no conformance case in pxvm/ops/cases.py CASES"),
      el("td", { class: "status bad" }, "no case")));
  }
  let passed = 0;
  let failed = 0;
  for (const c of info.cases) {
    const row = rows.get(c.id);
    const cells = row.children;
    cells[5].textContent = "running";
    try {
      const plan = await getJson(`/api/case/${encodeURIComponent(c.id)}${planQuery}`);
      cells[1].textContent = plan.input_shapes.map((s) => `(${s.join(",")})`).join(" ");
      cells[2].textContent = plan.dispatches.length;
      cells[4].textContent = plan.exact ? "exact" : plan.threshold.toExponential(0);
      const bytes = await gpu.run(plan);
      const { nmse, problem } = compare(bytes, plan.expected, plan.exact);
      cells[3].textContent = Number.isFinite(nmse) ? fmt(nmse) : "-";
      const ok = problem === null && nmse <= plan.threshold;
      row.dataset.state = ok ? "pass" : "fail";
      row.dataset.nmse = String(nmse);
      cells[5].textContent = ok ? "pass" : `FAIL ${problem || `NMSE above ${plan.threshold}`}`;
      cells[5].className = `status ${ok ? "good" : "bad"}`;
      if (ok) passed++; else failed++;
    } catch (e) {
      failed++;
      row.dataset.state = "fail";
      cells[5].textContent = `ERROR ${e.message}`;
      cells[5].className = "status bad";
    }
    summary.textContent = `${passed} passed, ${failed} failed of ${info.cases.length}`;
  }
  const missing = info.ops_without_case.length;
  summary.textContent = `${passed} of ${info.cases.length} cases passed` +
    (failed ? `, ${failed} failed` : "") + (missing ? `; ${missing} ops have no case` : "") +
    ` (${new Set(info.cases.map((c) => c.op)).size} ops)`;
  summary.className = failed || missing ? "bad" : "good";
  summary.dataset.state = "done";
}

// ---- benchmarks ------------------------------------------------------------------------
async function runBenchmarks() {
  const button = $("#bench-run");
  const status = $("#bench-status");
  button.disabled = true;
  const reps = Number(new URLSearchParams(location.search).get("reps") || 5);
  const browser = {};
  try {
    const failures = [];
    for (const name of info.benchmarks) {
      status.textContent = `browser: ${name}...`;
      try {
        const plan = await getJson(`/api/bench/${encodeURIComponent(name)}`);
        const seconds = await gpu.time(plan, reps);
        browser[name] = { seconds, gflops: plan.flops / seconds / 1e9, gbs: plan.bytes / seconds / 1e9,
          shapes: plan.input_shapes };
      } catch (e) {
        failures.push(`${name}: ${e.message}`);
      }
      drawBench(browser, null);
    }
    $("#bench-failures").replaceChildren(...failures.map((f) => el("li", { class: "bad" }, f)));
    status.textContent = "native: pxvm measuring the same plans through wgpu...";
    const native = await getJson("/api/bench/native");
    drawBench(browser, native);
    status.textContent = native.error
      ? `native numbers unavailable: ${native.error}`
      : `native: ${native.device}`;
    status.dataset.state = "done";
  } catch (e) {
    status.textContent = `benchmark failed: ${e.message}`;
    status.dataset.state = "error";
  } finally {
    button.disabled = false;
  }
}

function drawBench(browser, native) {
  const names = Object.keys(browser);
  const nat = (native && native.results) || {};
  const table = $("#bench-rows");
  table.replaceChildren(...names.map((n) => el("tr", { "data-bench": n },
    el("td", {}, n), el("td", { class: "shapes" }, browser[n].shapes.map((s) => `(${s.join(",")})`).join(" ")),
    el("td", { class: "num" }, (browser[n].seconds * 1e3).toFixed(2)),
    el("td", { class: "num" }, fmt(browser[n].gflops)), el("td", { class: "num" }, fmt(browser[n].gbs)),
    el("td", { class: "num" }, nat[n] ? fmt(nat[n].gflops) : "-"),
    el("td", { class: "num" }, nat[n] ? fmt(nat[n].gbs) : "-"))));
  const chart = $("#bench-chart");
  chart.replaceChildren(barChart("GFLOP/s", names, browser, nat, "gflops"),
    barChart("GB/s", names, browser, nat, "gbs"));
}

const SVG = "http://www.w3.org/2000/svg";
function svg(tag, attrs, text) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) node.setAttribute(k, v);
  if (text !== undefined) node.textContent = text;
  return node;
}

// Grouped horizontal bars: browser (blue) and native pxvm (orange) per benchmark.
function barChart(title, names, browser, native, key) {
  const rowH = 34;
  const left = 90;
  const width = 420;
  const height = 30 + names.length * rowH + 10;
  const max = Math.max(1e-9, ...names.map((n) => browser[n][key]),
    ...names.filter((n) => native[n]).map((n) => native[n][key]));
  const root = svg("svg", { viewBox: `0 0 ${width} ${height}`, width, height, role: "img",
    "aria-label": `${title} per kernel` });
  root.append(svg("text", { x: 4, y: 16, class: "chart-title" }, `${title}  (browser, native pxvm)`));
  names.forEach((n, i) => {
    const y = 26 + i * rowH;
    root.append(svg("text", { x: 4, y: y + 17, class: "chart-label" }, n));
    const bars = [[browser[n][key], "bar-browser", 0]];
    if (native[n]) bars.push([native[n][key], "bar-native", 14]);
    for (const [value, cls, dy] of bars) {
      const w = Math.max(1, (width - left - 60) * value / max);
      root.append(svg("rect", { x: left, y: y + dy, width: w, height: 12, class: cls }));
      root.append(svg("text", { x: left + w + 4, y: y + dy + 10, class: "chart-value" }, fmt(value)));
    }
  });
  return root;
}

// ---- pxVM programs ---------------------------------------------------------------------
async function runProgram(source, label) {
  const list = $("#program-results");
  const card = el("div", { class: "program", "data-name": label, "data-state": "running" },
    el("h3", {}, label), el("p", { class: "status" }, "recording the plan and the CPU result..."));
  list.prepend(card);
  const status = card.querySelector(".status");
  try {
    const plan = await source();
    status.textContent = `running ${plan.dispatches.length} dispatches on the browser's GPU...`;
    const bytes = await gpu.run(plan);
    const expected = decodeBase64(plan.expected.data);
    const input = decodeBase64(plan.image);
    let differing = 0;
    for (let i = 0; i < expected.length; i++) if (bytes[i] !== expected[i]) differing++;
    const identical = differing === 0 && bytes.length === expected.length;
    card.dataset.state = identical ? "identical" : "differs";
    status.className = `status ${identical ? "good" : "bad"}`;
    status.textContent = identical
      ? `byte-identical to the CPU executor (${expected.length} bytes, ${plan.width}x${plan.height} pixels)`
      : `DIFFERS from the CPU executor in ${differing} of ${expected.length} bytes`;
    card.append(el("p", { class: "small" }, `instructions: ${plan.instructions.join(", ") || "none"}`),
      el("div", { class: "pictures" },
        figure("program", drawPixels(input, null, null, plan.width, plan.height)),
        figure("after, browser GPU (changed pixels outlined)", drawPixels(bytes, input, expected, plan.width, plan.height))));
  } catch (e) {
    card.dataset.state = "error";
    status.className = "status bad";
    status.textContent = `error: ${e.message}`;
  }
}

function figure(caption, canvas) {
  return el("figure", {}, canvas, el("figcaption", {}, caption));
}

// Each pixel a cell in its RGB colour (alpha ignored so data stay visible); pixels the
// program changed get a yellow outline, pixels that disagree with the CPU a red one.
function drawPixels(rgba, before, expected, w, h) {
  const scale = Math.max(2, Math.min(24, Math.floor(420 / Math.max(w, h))));
  const canvas = el("canvas", { width: w * scale, height: h * scale });
  const g = canvas.getContext("2d");
  for (let y = 0; y < h; y++) {
    for (let x = 0; x < w; x++) {
      const o = 4 * (y * w + x);
      g.fillStyle = `rgb(${rgba[o]},${rgba[o + 1]},${rgba[o + 2]})`;
      g.fillRect(x * scale, y * scale, scale, scale);
    }
  }
  if (scale >= 8) {
    g.strokeStyle = "rgba(90,90,90,0.6)";
    g.lineWidth = 1;
    for (let x = 0; x <= w; x++) { g.beginPath(); g.moveTo(x * scale + 0.5, 0); g.lineTo(x * scale + 0.5, h * scale); g.stroke(); }
    for (let y = 0; y <= h; y++) { g.beginPath(); g.moveTo(0, y * scale + 0.5); g.lineTo(w * scale, y * scale + 0.5); g.stroke(); }
  }
  if (scale >= 18) { // small values are near-black: print each nonzero R value
    g.font = `${Math.floor(scale * 0.45)}px monospace`;
    g.textAlign = "center";
    g.textBaseline = "middle";
    for (let y = 1; y < h; y++) {
      for (let x = 0; x < w; x++) {
        const o = 4 * (y * w + x);
        if (rgba[o] || rgba[o + 1] || rgba[o + 2] || rgba[o + 3]) {
          g.fillStyle = rgba[o] + rgba[o + 1] + rgba[o + 2] > 380 ? "#000" : "#eee";
          g.fillText(String(rgba[o]), (x + 0.5) * scale, (y + 0.5) * scale);
        }
      }
    }
  }
  if (before) {
    g.lineWidth = 2;
    for (let i = 0; i < w * h; i++) {
      const o = 4 * i;
      const changed = rgba[o] !== before[o] || rgba[o + 1] !== before[o + 1] || rgba[o + 2] !== before[o + 2] || rgba[o + 3] !== before[o + 3];
      const wrong = expected && (rgba[o] !== expected[o] || rgba[o + 1] !== expected[o + 1] || rgba[o + 2] !== expected[o + 2] || rgba[o + 3] !== expected[o + 3]);
      if (changed || wrong) {
        g.strokeStyle = wrong ? "#ff3030" : "#ffd000";
        g.strokeRect((i % w) * scale + 1, Math.floor(i / w) * scale + 1, scale - 2, scale - 2);
      }
    }
  }
  return canvas;
}

function setUpPrograms() {
  const select = $("#program-select");
  const options = info.examples.map((name) => el("option", { value: `example:${name}` }, name));
  options.push(el("option", { value: "random" }, "random program"));
  select.replaceChildren(...options);
  let randomSeed = 1;
  $("#program-run").addEventListener("click", () => {
    const v = select.value;
    if (v === "random") {
      const seed = randomSeed++;
      runProgram(() => getJson(`/api/program/random?seed=${seed}`), `random program (seed ${seed})`);
    } else {
      const name = v.slice("example:".length);
      runProgram(() => getJson(`/api/program/example/${encodeURIComponent(name)}`), name);
    }
  });
  const drop = $("#program-drop");
  const upload = (file) => {
    if (file.size > info.max_upload) {
      runProgram(() => Promise.reject(new Error(`${file.name} is ${file.size} bytes; the limit is ${info.max_upload}`)), file.name);
      return;
    }
    runProgram(async () => getJson("/api/program/upload", { method: "POST", body: await file.arrayBuffer(),
      headers: { "Content-Type": "image/png" } }), `${file.name} (dropped)`);
  };
  drop.addEventListener("dragover", (e) => { e.preventDefault(); drop.classList.add("over"); });
  drop.addEventListener("dragleave", () => drop.classList.remove("over"));
  drop.addEventListener("drop", (e) => {
    e.preventDefault();
    drop.classList.remove("over");
    for (const f of e.dataTransfer.files) upload(f);
  });
  $("#program-file").addEventListener("change", (e) => { for (const f of e.target.files) upload(f); });
}

// ---- start -----------------------------------------------------------------------------
async function main() {
  info = await getJson("/api/info");
  $("#version").textContent = `pxvm ${info.version}`;
  const ok = await showAdapter();
  $("#bench-run").addEventListener("click", runBenchmarks);
  if (!ok) {
    $("#suite-summary").textContent = "skipped: no WebGPU";
    $("#suite-summary").dataset.state = "no-webgpu";
    return;
  }
  if (info.vm) setUpPrograms();
  else $("#programs").append(el("p", { class: "bad" }, "pxvm.vm is not installed: programs cannot run."));
  await runSuite();
  const params = new URLSearchParams(location.search);
  if (info.vm && info.examples.length) $("#program-run").click();
  if (params.get("bench") === "1") await runBenchmarks();
}

main().catch((e) => {
  $("#suite-summary").textContent = `page error: ${e.message}`;
  $("#suite-summary").dataset.state = "error";
});
