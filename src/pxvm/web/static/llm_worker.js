// The language model's worker: loads a GGUF (the server's, a dropped file or a same-origin
// URL; downloads cached with the Cache API), asks the server for the plan pxvm's own Model
// records for it (pxvm/web/llm_plans.py), uploads the file's quantized tensors to this
// browser's GPU and runs the plan's prompt pieces and decoding steps with the .wgsl
// files pxvm uses natively. Nothing here knows a layer: buffers, kernels, override
// constants, parameter blocks and workgroup counts all come from the plan.
//
// Messages in: {id, type: "open" | "load" | "generate" | "chat", ...}; out: {id, type:
// "done" | "error", ...} and, while working, {id, type: "progress" | "text"}; at any time
// {type: "lost"} (the device is gone: nothing runs until the page is reloaded) and {type:
// "gpu-error"} (the first GPU error no error scope caught).

import { Gpu } from "./gpu.js";
import { GGUFError, readHeader, vectorTensors } from "./gguf.js";

const CACHE = "pxvm-models-v1";
// prompt pieces' plans kept, with their buffers (a chat's next turn is a new length)
const PROMPTS_KEPT = 4;
const WANTED_LIMITS = ["maxStorageBufferBindingSize", "maxBufferSize", "maxStorageBuffersPerShaderStage",
  "maxComputeWorkgroupStorageSize", "maxComputeInvocationsPerWorkgroup", "maxComputeWorkgroupSizeX",
  "maxComputeWorkgroupSizeY", "maxComputeWorkgroupSizeZ", "maxComputeWorkgroupsPerDimension"];

let session = "";
let device = null;
let gpu = null;
let features = [];
let software = false;
let lost = null;  // why the device was lost, once it was
let model = null;
let lostWatch = Promise.resolve();

const post = (msg) => self.postMessage(msg);

self.onmessage = async (event) => {
  const msg = event.data;
  try {
    const result = await HANDLERS[msg.type](msg);
    post({ id: msg.id, type: "done", ...result });
  } catch (e) {
    // a loss fails the work in flight (mapAsync rejects with a DOMException) before
    // device.lost settles: a moment for it, so the error says what happened
    if (device && !lost && e instanceof DOMException) {
      await Promise.race([lostWatch, new Promise((r) => { setTimeout(r, 200); })]);
    }
    post({ id: msg.id, type: "error", message: lost ? lostMessage() : e.message });
  }
};

function lostMessage() {
  return `the GPU device was lost (${lost}): the browser's GPU process was reset or the GPU ` +
    "stopped answering, and the model's weights on it are gone; reload the page to start again";
}

// Before any work: a lost device would fail it with a less clear message.
function usable() {
  if (lost) throw new Error(lostMessage());
  if (!device) throw new Error("no WebGPU device: open it first");
}

const HANDLERS = {
  open: async (msg) => { session = msg.session; return openDevice(msg.declineSubgroups); },
  load: async (msg) => loadModel(msg),
  generate: async (msg) => generate(msg),
  chat: async (msg) => chat(msg),
};

// ---- the device ----------------------------------------------------------------------------
async function openDevice(declineSubgroups) {
  if (!("gpu" in navigator)) {
    throw new Error("WebGPU is not available: this browser offers no navigator.gpu (use a recent " +
      "Chrome, Edge or Chromium; on Linux start it with --enable-unsafe-webgpu)");
  }
  const adapter = await navigator.gpu.requestAdapter();
  if (!adapter) throw new Error("WebGPU is not available: no WebGPU adapter was found (the GPU may be blocklisted; on Linux start Chromium with --enable-unsafe-webgpu)");
  const requiredLimits = {};
  for (const key of WANTED_LIMITS) if (adapter.limits[key] !== undefined) requiredLimits[key] = adapter.limits[key];
  // subgroups where granted (the plan then takes the *_subgroups.wgsl variants); the plan
  // never needs shader-f16: its kernels read float16 KV caches as packed u32
  features = adapter.features.has("subgroups") && !declineSubgroups ? ["subgroups"] : [];
  device = await adapter.requestDevice({ requiredLimits, requiredFeatures: features });
  lost = null;
  lostWatch = device.lost.then((info) => {
    lost = `${info.reason}${info.message ? `: ${info.message}` : ""}`;
    post({ type: "lost", message: lostMessage() });
  });
  let reported = false;
  device.onuncapturederror = (event) => {
    if (reported || lost) return;  // the first only: later ones mostly follow from it
    reported = true;
    post({ type: "gpu-error", message: `a GPU error no check expected (${event.error.constructor.name}: ` +
      `${event.error.message.trim()}); answers from now on may be wrong: reload the page` });
  };
  gpu = new Gpu(device);
  const info = adapter.info || {};
  // a CPU rasteriser: the plan takes the kernels' variants with fewer barriers, as pxvm's
  // native backend does on one (on SwiftShader the others run many times slower)
  software = Boolean(adapter.isFallbackAdapter || info.isFallbackAdapter ||
    /swiftshader|llvmpipe|lavapipe/i.test(`${info.vendor} ${info.architecture} ${info.description}`));
  return { features, software, adapter: [info.vendor, info.architecture, info.description].filter(Boolean).join(" ") || "WebGPU adapter",
    limits: Object.fromEntries(WANTED_LIMITS.map((k) => [k, device.limits[k]])) };
}

// ---- the file ------------------------------------------------------------------------------
// A reader(offset, length) -> Uint8Array of the model's bytes and their size.
async function fileSource(msg) {
  const src = msg.source;
  if (src.kind === "file") {
    const file = src.file;
    return { name: file.name, size: file.size,
      read: async (o, n) => new Uint8Array(await file.slice(o, o + n).arrayBuffer()) };
  }
  const url = new URL(src.url, self.location.href);
  if (url.origin !== self.location.origin) {
    throw new Error(`${src.url} is not of this page's origin (${self.location.origin}); download it and drop the file instead`);
  }
  const bytes = await download(msg.id, url.href, src.version || "");
  return { name: src.name || decodeURIComponent(url.pathname.split("/").pop()), size: bytes.length,
    read: async (o, n) => bytes.subarray(o, o + n) };
}

// The bytes at `url`, from the Cache API when cached, else downloaded with progress and cached.
async function download(id, url, version) {
  const key = `${url}${url.includes("?") ? "&" : "?"}pxvm-cache=${encodeURIComponent(version)}`;
  let cache = null;
  try { cache = await caches.open(CACHE); } catch { cache = null; }  // no Cache API: no cache
  const hit = cache && await cache.match(key);
  if (hit) {
    post({ id, type: "progress", stage: "cached", done: 1, total: 1 });
    return new Uint8Array(await hit.arrayBuffer());
  }
  const response = await fetch(url, { headers: { "X-Pxvm-Session": session } });
  if (!response.ok) {
    const body = await response.json().catch(() => ({}));
    throw new Error(`cannot download ${url}: HTTP ${response.status}${body.error ? `: ${body.error}` : ""}`);
  }
  const total = Number(response.headers.get("content-length") || 0);
  const reader = response.body.getReader();
  const parts = [];
  let done = 0;
  for (;;) {
    const { done: end, value } = await reader.read();
    if (end) break;
    parts.push(value);
    done += value.length;
    post({ id, type: "progress", stage: "download", done, total });
  }
  const bytes = new Uint8Array(done);
  let at = 0;
  for (const p of parts) { bytes.set(p, at); at += p.length; }
  if (cache) {
    try { await cache.put(key, new Response(bytes)); } catch (e) {
      post({ id, type: "progress", stage: "not cached", message: `not cached: ${e.message}` });
    }
  }
  return bytes;
}

// ---- loading -------------------------------------------------------------------------------
async function loadModel(msg) {
  usable();
  dropModel();
  const source = await fileSource(msg);
  const header = await readHeader(source.read, source.size, source.name).catch((e) => {
    throw e instanceof GGUFError ? e : new Error(`cannot read ${source.name}: ${e.message}`);
  });
  const vectors = vectorTensors(header);
  const head = await source.read(0, header.dataOffset);
  const body = new Uint8Array(header.dataOffset + vectors.reduce((a, t) => a + t.nBytes, 0));
  body.set(head);
  let at = header.dataOffset;
  for (const t of vectors) { body.set(await source.read(t.offset, t.nBytes), at); at += t.nBytes; }
  const limits = device.limits;
  const binding = Math.min(limits.maxStorageBufferBindingSize, limits.maxBufferSize);
  const query = new URLSearchParams({ size: source.size, features: features.join(","),
    max_binding: binding, software: software ? 1 : 0, name: source.name });
  post({ id: msg.id, type: "progress", stage: "plan", done: 0, total: 1 });
  const plan = await api(`/api/llm/load?${query}`, body);
  checkLimits(plan.buffers, plan.dispatches);
  model = { plan, header, source, buffers: [], sizes: [], prompts: new Map(), steps: [] };
  await createBuffers(msg.id, plan.buffers, 0);
  model.source = null;  // the weights are on the GPU: the file's bytes may go
  for (const s of plan.steps) {
    model.steps.push({ bound: s.bound, prepared: await prepare(plan.dispatches.slice(s.dispatches[0], s.dispatches[1])) });
  }
  return { name: source.name, architecture: plan.architecture, layers: plan.layers,
    context: plan.context_length, vocab: plan.vocab_size, dispatchesPerToken: model.steps[0].prepared.steps.length };
}

function dropModel() {
  if (!model) return;
  for (const key of [...model.prompts.keys()]) dropPrompt(key);
  for (const s of model.steps) s.prepared.uniforms.destroy();
  for (const b of model.buffers) b?.destroy();
  model = null;
}

async function api(url, body) {
  const init = { method: "POST", headers: { "X-Pxvm-Session": session } };
  if (body !== undefined) {
    init.body = body instanceof Uint8Array ? body : JSON.stringify(body);
  }
  const r = await fetch(url, init);
  const answer = await r.json().catch(() => ({ error: `HTTP ${r.status}` }));
  if (r.status === 413) {  // the header and vectors of a model with a very large vocabulary
    throw new Error(`the model's header and vectors are too large for the server's requests (${answer.error}); the page runs models with smaller headers`);
  }
  if (!r.ok) throw new Error(answer.error || `HTTP ${r.status}`);
  return answer;
}

// Each buffer and dispatch within the device's limits, or the limit named.
function checkLimits(buffers, dispatches) {
  const lim = device.limits;
  for (const b of buffers) {
    for (const key of ["maxBufferSize", "maxStorageBufferBindingSize"]) {
      if (b.size > lim[key]) {
        throw new Error(`the model needs a buffer of ${b.size.toLocaleString("en-US")} bytes, over this ` +
          `device's ${key} of ${lim[key].toLocaleString("en-US")}; choose a smaller model`);
      }
    }
  }
  for (const d of dispatches) {
    if (d.bindings.length > lim.maxStorageBuffersPerShaderStage) {
      throw new Error(`kernel ${d.kernel} binds ${d.bindings.length} storage buffers, over this device's ` +
        `maxStorageBuffersPerShaderStage of ${lim.maxStorageBuffersPerShaderStage}`);
    }
    if (Math.max(...d.groups) > lim.maxComputeWorkgroupsPerDimension) {
      throw new Error(`kernel ${d.kernel} needs ${Math.max(...d.groups)} workgroups in a dimension, over ` +
        `this device's maxComputeWorkgroupsPerDimension of ${lim.maxComputeWorkgroupsPerDimension}`);
    }
  }
}

function decodeBase64(text) {
  const raw = atob(text);
  const out = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) out[i] = raw.charCodeAt(i);
  return out;
}

// The plan's buffers from index `first` on: weights assembled from the file's byte
// ranges, data written, the rest left as WebGPU creates them (zeros).
async function createBuffers(id, list, first, target = model) {
  const usage = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST;
  const weightBytes = list.reduce((a, b) => a + (b.kind === "weight" ? b.nbytes : 0), 0);
  let uploaded = 0;
  device.pushErrorScope("out-of-memory");
  device.pushErrorScope("validation");
  for (let i = 0; i < list.length; i++) {
    const b = list[i];
    const buffer = device.createBuffer({ size: b.size, usage });
    target.buffers[first + i] = buffer;
    target.sizes[first + i] = b.size;
    if (b.kind === "data") {
      const bytes = new Uint8Array(b.size);
      bytes.set(decodeBase64(b.data));
      device.queue.writeBuffer(buffer, 0, bytes);
    } else if (b.kind === "weight") {
      const bytes = new Uint8Array(b.size);  // a multiple of 4, as writeBuffer wants
      let at = 0;
      for (const [name, start, length] of b.segments) {
        const t = model.header.tensors.get(name);
        if (!model.source) throw new Error("a prompt's plan names weights the model's plan did not");
        if (!t || start + length > t.nBytes) throw new Error(`the plan names bytes of tensor ${name} the file does not have`);
        bytes.set(await model.source.read(t.offset + start, length), at);
        at += length;
      }
      device.queue.writeBuffer(buffer, 0, bytes);
      uploaded += b.nbytes;
      post({ id, type: "progress", stage: "upload", done: uploaded, total: weightBytes });
    }
  }
  const invalid = await device.popErrorScope();
  const oom = await device.popErrorScope();
  if (oom) throw new Error(`the GPU ran out of memory uploading the model (${oom.message}); choose a smaller model`);
  if (invalid) throw new Error(`WebGPU validation: ${invalid.message}`);
}

// Pipelines and bind groups of a list of dispatches, ready to encode any number of times.
async function prepare(dispatches, target = model) {
  const slot = model.plan.uniform_size;
  const size = Math.max(slot, dispatches.length * slot);
  const uniforms = device.createBuffer({ size, usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST });
  const bytes = new Uint8Array(size);
  const steps = [];
  device.pushErrorScope("validation");
  for (let i = 0; i < dispatches.length; i++) {
    const d = dispatches[i];
    const { pipe, layout } = await gpu.pipeline(d.kernel, d.entry, d.constants);
    const entries = d.bindings.map((index, binding) => ({ binding,
      resource: { buffer: target.buffers[index], offset: 0, size: target.sizes[index] } }));
    if (d.params !== null) {
      bytes.set(decodeBase64(d.params), i * slot);
      entries.push({ binding: d.bindings.length, resource: { buffer: uniforms, offset: i * slot, size: slot } });
    }
    steps.push({ pipe, group: device.createBindGroup({ layout, entries }), groups: d.groups });
  }
  device.queue.writeBuffer(uniforms, 0, bytes);
  const error = await device.popErrorScope();
  if (error) throw new Error(`WebGPU validation: ${error.message}`);
  return { steps, uniforms };
}

function encodeRuns(encoder, prepared, runs) {
  const pass = encoder.beginComputePass();
  for (let r = 0; r < runs; r++) {
    for (const s of prepared.steps) {
      pass.setPipeline(s.pipe);
      pass.setBindGroup(0, s.group);
      pass.dispatchWorkgroups(s.groups[0], s.groups[1], s.groups[2]);
    }
  }
  pass.end();
}

async function readBack(encoder, buffer, nbytes) {
  const size = Math.ceil(nbytes / 4) * 4;
  const staging = device.createBuffer({ size, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
  encoder.copyBufferToBuffer(buffer, 0, staging, 0, size);
  device.queue.submit([encoder.finish()]);
  await staging.mapAsync(GPUMapMode.READ);
  const copy = staging.getMappedRange().slice(0);
  staging.unmap();
  staging.destroy();
  if (lost) throw new Error("the device was lost");
  return copy;
}

// ---- running -------------------------------------------------------------------------------
// The last token's logits of a prompt of `ids` run from `position` (pieces of the plan's
// longest prompt, each its own plan: model.py's Model._prompt).
async function prompt(ids, position) {
  const most = model.plan.max_prompt_tokens;
  let logits = null;
  for (let start = 0; start < ids.length; start += most) {
    const piece = ids.slice(start, start + most);
    const at = position + start;
    const key = `${piece.length}@${at}`;
    let entry = model.prompts.get(key);
    if (entry) {
      model.prompts.delete(key);  // re-inserted below: the most recently used last
    } else {
      const plan = await api(`/api/llm/prompt?model=${model.plan.model}&tokens=${piece.length}&position=${at}`);
      checkLimits(plan.buffers, plan.dispatches);
      // the piece's own buffers after the model's (the server numbers them from first_buffer)
      const target = { buffers: model.buffers.slice(0, plan.first_buffer), sizes: model.sizes.slice(0, plan.first_buffer) };
      entry = { plan, target };
      while (model.prompts.size >= PROMPTS_KEPT) dropPrompt(model.prompts.keys().next().value);
      await createBuffers(null, plan.buffers, plan.first_buffer, target);
      entry.prepared = await prepare(plan.dispatches, target);
    }
    model.prompts.set(key, entry);
    const own = entry.target.buffers;
    device.queue.writeBuffer(own[entry.plan.tokens], 0, new Int32Array(piece));
    device.queue.writeBuffer(own[entry.plan.state], 0, new Int32Array([piece[piece.length - 1], at]));
    const encoder = device.createCommandEncoder();
    encodeRuns(encoder, entry.prepared, 1);
    logits = new Float32Array(await readBack(encoder, own[entry.plan.logits], 4 * model.plan.vocab_size));
  }
  return logits;
}

// A prompt piece's plan kept no more: its own buffers and parameter blocks freed.
function dropPrompt(key) {
  const entry = model.prompts.get(key);
  model.prompts.delete(key);
  for (const b of entry.target.buffers.slice(entry.plan.first_buffer)) b?.destroy();
  entry.prepared?.uniforms.destroy();
}

function argmax(values) {
  let best = 0;
  for (let i = 1; i < values.length; i++) if (values[i] > values[best]) best = i;
  return best;
}

// Feed `token` at `position`, then each token the step draws (the argmax): calls
// `each(tokens)` with every submit's tokens until it returns false or n tokens came.
// Steps chain on the GPU through the state, so later submits are queued before the
// oldest is read (decode.py's SUBMITS_IN_FLIGHT); stopping early wastes those.
async function decode(token, position, n, each) {
  const p = model.plan;
  const state = new Int32Array(2 + p.state_history);
  state[0] = token;
  state[1] = position;
  device.queue.writeBuffer(model.buffers[p.state], 0, state);
  device.queue.writeBuffer(model.buffers[p.sampler], 0, new Float32Array([0, 0, position]));
  const stateBytes = 4 * (2 + p.state_history);
  const inFlight = [];
  let at = position;
  const submitNext = () => {
    const step = model.steps.find((s) => s.bound > at);
    if (!step) throw new Error(`position ${at} is past the page's context of ${p.context_length}`);
    const runs = Math.min(p.steps_per_submit, p.state_history, position + n - at, step.bound - at);
    const encoder = device.createCommandEncoder();
    encodeRuns(encoder, step.prepared, runs);
    const staging = device.createBuffer({ size: stateBytes, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
    encoder.copyBufferToBuffer(model.buffers[p.state], 0, staging, 0, stateBytes);
    device.queue.submit([encoder.finish()]);
    inFlight.push({ first: at, runs, staging, mapped: staging.mapAsync(GPUMapMode.READ) });
    at += runs;
  };
  try {
    for (;;) {
      while (at < position + n && inFlight.length < p.submits_in_flight) submitNext();
      if (!inFlight.length) break;
      const s = inFlight.shift();
      await s.mapped;
      if (lost) throw new Error("the device was lost");
      const history = new Int32Array(s.staging.getMappedRange().slice(0)).subarray(2);
      s.staging.destroy();
      const tokens = [];
      for (let q = s.first; q < s.first + s.runs; q++) tokens.push(history[q % p.state_history]);
      if ((await each(tokens)) === false) break;
    }
  } finally {
    for (const s of inFlight) s.mapped.then(() => s.staging.destroy(), () => s.staging.destroy());
  }
}

// Greedy tokens after the prompt `ids` (from position 0), as pxvm's generate draws them:
// the first from the prompt's logits, the rest from decoding steps; with the prompt's logits.
async function generate(msg) {
  usable();
  if (!model) throw new Error("no model loaded");
  const t0 = performance.now();
  const logits = await prompt(msg.ids, 0);
  const t1 = performance.now();
  const tokens = [argmax(logits)];
  if (msg.n > 1) {
    await decode(tokens[0], msg.ids.length, msg.n - 1, (more) => { tokens.push(...more); });
  }
  const t2 = performance.now();
  return { tokens, logits: Array.from(logits), prefillSeconds: (t1 - t0) / 1000,
    decodeSeconds: (t2 - t1) / 1000 };
}

// A chat turn: the messages rendered and encoded by the server (the file's template and
// tokenizer), the answer streamed as "text" messages with tokens/s, until a stop token.
async function chat(msg) {
  usable();
  if (!model) throw new Error("no model loaded");
  const p = model.plan;
  const { ids } = await api(`/api/llm/encode?model=${p.model}`, { messages: msg.messages });
  if (ids.length >= p.context_length) throw new Error(`the prompt is ${ids.length} tokens, over the page's context of ${p.context_length}`);
  const max = Math.min(msg.maxTokens, p.context_length - ids.length);
  const t0 = performance.now();
  const logits = await prompt(ids, 0);
  const t1 = performance.now();
  const prefill = ids.length / ((t1 - t0) / 1000);
  const stops = new Set(p.stop_ids);
  const answer = [];
  let stopped = false;
  const show = async (tokens) => {
    for (const t of tokens) {
      if (stops.has(t)) { stopped = true; break; }
      answer.push(t);
    }
    const { text } = await api(`/api/llm/decode?model=${p.model}`, { ids: answer });
    const seconds = (performance.now() - t1) / 1000;
    post({ id: msg.id, type: "text", text, tokens: answer.length, decodeTokensPerSecond: answer.length > 1 ? (answer.length - 1) / seconds : 0, prefillTokensPerSecond: prefill });
    return !stopped && answer.length < max;
  };
  if (await show([argmax(logits)])) {
    await decode(answer[answer.length - 1], ids.length, max - 1, show);
  }
  const { text } = await api(`/api/llm/decode?model=${p.model}`, { ids: answer });
  const seconds = (performance.now() - t1) / 1000;
  return { text, tokens: answer, promptTokens: ids.length, prefillTokensPerSecond: prefill,
    decodeTokensPerSecond: answer.length > 1 ? (answer.length - 1) / seconds : 0 };
}

// For tests: the device, to lose it (destroy()) or make an error no scope catches. Only a
// debugger or browser automation reaches a worker's global scope; the page's scripts talk
// to the worker through HANDLERS alone, so no page can call this.
self.pxvmTestDevice = () => device;
