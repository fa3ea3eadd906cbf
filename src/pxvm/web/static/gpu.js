// Replaying pxvm dispatch plans with the browser's WebGPU.
//
// A plan (recorded in Python by pxvm/web/plans.py through the ops' own WebGPU kernels) lists
// buffers, dispatches (kernel file, entry point, override constants, bindings, packed
// uniform bytes, workgroup counts) and which buffer holds the result. Nothing here knows
// any op: it builds exactly what pxvm/backends/webgpu/runtime builds, from the same .wgsl files.

const UNIFORM_SLOT = 256; // bytes per dispatch's parameter block, as in backends/webgpu/runtime/recorder.py

// Same pattern as backends/webgpu/runtime/shaders.py declared_bindings: one explicit layout per file,
// shared by all its entry points, so an entry point need not use every binding.
const BINDING = /@group\(\s*0\s*\)\s*@binding\(\s*(\d+)\s*\)\s*var\s*<\s*(storage|uniform)\s*(?:,\s*(read_write|read))?\s*>/g;

export function declaredBindings(source) {
  const found = new Map();
  for (const m of source.matchAll(BINDING)) {
    const index = Number(m[1]);
    const kind = m[2] === "uniform" ? "uniform" : (m[3] === "read_write" ? "storage" : "read-only-storage");
    if (found.has(index) && found.get(index) !== kind) {
      throw new Error(`binding ${index} is declared with two kinds`);
    }
    found.set(index, kind);
  }
  return [...found.entries()].sort((a, b) => a[0] - b[0]);
}

export function decodeBase64(text) {
  const raw = atob(text);
  const out = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) out[i] = raw.charCodeAt(i);
  return out;
}

const TYPED = { f32: Float32Array, i32: Int32Array, u32: Uint32Array, u8: Uint8Array };

export function typedView(bytes, dtype) {
  const T = TYPED[dtype];
  if (!T) throw new Error(`dtype ${dtype} cannot be compared here`);
  const copy = bytes.slice(0, bytes.length - (bytes.length % T.BYTES_PER_ELEMENT));
  return new T(copy.buffer);
}

// Limits worth raising to what the adapter offers: kernels use up to these.
const WANTED_LIMITS = [
  "maxStorageBufferBindingSize", "maxBufferSize", "maxStorageBuffersPerShaderStage",
  "maxComputeWorkgroupStorageSize", "maxComputeInvocationsPerWorkgroup",
  "maxComputeWorkgroupSizeX", "maxComputeWorkgroupSizeY", "maxComputeWorkgroupSizeZ",
];

const PLAN_FEATURES = ["subgroups"];

export async function openGpu() {
  if (!("gpu" in navigator)) {
    const why = window.isSecureContext
      ? "this browser does not expose navigator.gpu"
      : "the page is not a secure context (open it through http://127.0.0.1 or localhost)";
    return { error: `WebGPU is not available: ${why}.` };
  }
  let adapter = null;
  try {
    adapter = await navigator.gpu.requestAdapter();
  } catch (e) {
    return { error: `requestAdapter() failed: ${e.message}` };
  }
  if (!adapter) {
    return { error: "navigator.gpu exists but no WebGPU adapter was found (the GPU may be blocklisted or disabled)." };
  }
  const requiredLimits = {};
  for (const key of WANTED_LIMITS) {
    if (adapter.limits[key] !== undefined) requiredLimits[key] = adapter.limits[key];
  }
  // Features the ops' kernels use where granted (their browser names; pxvm/web/plans.py
  // BROWSER_FEATURES): the page asks for plans that use them. `?subgroups=0` declines.
  const declined = new URLSearchParams(location.search).get("subgroups") === "0";
  const planFeatures = PLAN_FEATURES.filter((f) => adapter.features.has(f) && !declined);
  const device = await adapter.requestDevice({ requiredLimits, requiredFeatures: planFeatures });
  const info = adapter.info || (adapter.requestAdapterInfo ? await adapter.requestAdapterInfo() : {});
  const limits = {};
  for (const key in adapter.limits) limits[key] = adapter.limits[key];
  const gpu = new Gpu(device);
  device.lost.then((lost) => { gpu.lostReason = `${lost.reason}: ${lost.message}`; });
  return {
    gpu, info: { vendor: info.vendor, architecture: info.architecture, device: info.device,
      description: info.description, fallback: adapter.isFallbackAdapter ?? info.isFallbackAdapter },
    limits, features: [...adapter.features].sort(), planFeatures,
  };
}

export class Gpu {
  constructor(device) {
    this.device = device;
    this.sources = new Map();
    this.layouts = new Map();
    this.modules = new Map();
    this.pipelines = new Map();
    this.lostReason = null;
    this.tail = Promise.resolve();
  }

  // Error scopes are a per-device stack, so two plans in flight at once (the suite, a
  // program, a benchmark) would catch each other's errors: plans run one at a time.
  exclusive(fn) {
    const result = this.tail.then(() => fn());
    this.tail = result.catch(() => {});
    return result;
  }

  async source(kernel) {
    if (!this.sources.has(kernel)) {
      this.sources.set(kernel, fetch(`/kernels/${encodeURIComponent(kernel)}`).then((r) => {
        if (!r.ok) throw new Error(`cannot load kernel ${kernel}: HTTP ${r.status}`);
        return r.text();
      }));
    }
    return this.sources.get(kernel);
  }

  async layout(kernel) {
    if (!this.layouts.has(kernel)) {
      const entries = declaredBindings(await this.source(kernel)).map(([binding, type]) => (
        { binding, visibility: GPUShaderStage.COMPUTE, buffer: { type } }));
      this.layouts.set(kernel, this.device.createBindGroupLayout({ label: kernel, entries }));
    }
    return this.layouts.get(kernel);
  }

  async module(kernel) {
    if (!this.modules.has(kernel)) {
      const code = await this.source(kernel);
      this.device.pushErrorScope("validation"); // reported below with line numbers
      const module = this.device.createShaderModule({ label: kernel, code });
      await this.device.popErrorScope();
      const info = await module.getCompilationInfo();
      const errors = info.messages.filter((m) => m.type === "error");
      if (errors.length) {
        throw new Error(`${kernel} does not compile: ` +
          errors.map((m) => `line ${m.lineNum}: ${m.message}`).join("; "));
      }
      this.modules.set(kernel, module);
    }
    return this.modules.get(kernel);
  }

  async pipeline(kernel, entry, constants) {
    const key = `${kernel}|${entry}|${JSON.stringify(constants)}`;
    if (!this.pipelines.has(key)) {
      const layout = await this.layout(kernel);
      const module = await this.module(kernel);
      const pipe = await this.device.createComputePipelineAsync({
        label: `${kernel}:${entry}`,
        layout: this.device.createPipelineLayout({ bindGroupLayouts: [layout] }),
        compute: { module, entryPoint: entry, constants },
      });
      this.pipelines.set(key, { pipe, layout });
    }
    return this.pipelines.get(key);
  }

  // Buffers, pipelines and bind groups of a plan, ready to encode any number of times.
  async prepare(plan) {
    const dev = this.device;
    const usage = GPUBufferUsage.STORAGE | GPUBufferUsage.COPY_SRC | GPUBufferUsage.COPY_DST;
    dev.pushErrorScope("validation");
    const buffers = plan.buffers.map((b) => {
      const buffer = dev.createBuffer({ size: b.size, usage });
      const bytes = new Uint8Array(b.size);
      if (b.data === null) bytes.fill(0xff); // poison: an unwritten output reads as NaN / -1
      else bytes.set(decodeBase64(b.data));
      dev.queue.writeBuffer(buffer, 0, bytes);
      return buffer;
    });
    const n = plan.dispatches.length;
    const slot = plan.uniform_size || UNIFORM_SLOT;
    const uniforms = dev.createBuffer({ size: Math.max(slot, n * slot),
      usage: GPUBufferUsage.UNIFORM | GPUBufferUsage.COPY_DST });
    const uniformBytes = new Uint8Array(Math.max(slot, n * slot));
    const steps = [];
    for (let i = 0; i < n; i++) {
      const d = plan.dispatches[i];
      const { pipe, layout } = await this.pipeline(d.kernel, d.entry, d.constants);
      const entries = d.bindings.map((index, binding) => ({
        binding, resource: { buffer: buffers[index], offset: 0, size: plan.buffers[index].size } }));
      if (d.params !== null) {
        uniformBytes.set(decodeBase64(d.params), i * slot);
        entries.push({ binding: d.bindings.length,
          resource: { buffer: uniforms, offset: i * slot, size: slot } });
      }
      const group = dev.createBindGroup({ layout, entries });
      steps.push({ pipe, group, groups: d.groups });
    }
    dev.queue.writeBuffer(uniforms, 0, uniformBytes);
    const error = await dev.popErrorScope();
    if (error) throw new Error(`WebGPU validation: ${error.message}`);
    return { plan, buffers, uniforms, steps };
  }

  encode(prepared) {
    const encoder = this.device.createCommandEncoder();
    const pass = encoder.beginComputePass();
    for (const s of prepared.steps) {
      pass.setPipeline(s.pipe);
      pass.setBindGroup(0, s.group);
      pass.dispatchWorkgroups(s.groups[0], s.groups[1], s.groups[2]);
    }
    pass.end();
    return encoder;
  }

  // Runs the plan once (one command buffer, one submit) and returns the result's bytes.
  run(plan) {
    return this.exclusive(() => this.runNow(plan));
  }

  async runNow(plan) {
    const prepared = await this.prepare(plan);
    try {
      const dev = this.device;
      const result = plan.result;
      const size = plan.buffers[result.buffer].size;
      const staging = dev.createBuffer({ size, usage: GPUBufferUsage.MAP_READ | GPUBufferUsage.COPY_DST });
      dev.pushErrorScope("validation");
      const encoder = this.encode(prepared);
      encoder.copyBufferToBuffer(prepared.buffers[result.buffer], 0, staging, 0, size);
      dev.queue.submit([encoder.finish()]);
      const error = await dev.popErrorScope();
      if (error) throw new Error(`WebGPU validation: ${error.message}`);
      await staging.mapAsync(GPUMapMode.READ);
      const bytes = new Uint8Array(staging.getMappedRange().slice(0, result.nbytes));
      staging.unmap();
      staging.destroy();
      if (this.lostReason) throw new Error(`device lost: ${this.lostReason}`);
      return bytes;
    } finally {
      release(prepared);
    }
  }

  // Seconds per run of the plan: the median of `reps` timed submits after one warm-up.
  time(plan, reps) {
    return this.exclusive(() => this.timeNow(plan, reps));
  }

  async timeNow(plan, reps) {
    const prepared = await this.prepare(plan);
    try {
      const q = this.device.queue;
      q.submit([this.encode(prepared).finish()]);
      await q.onSubmittedWorkDone();
      const times = [];
      for (let i = 0; i < reps; i++) {
        const t0 = performance.now();
        q.submit([this.encode(prepared).finish()]);
        await q.onSubmittedWorkDone();
        times.push((performance.now() - t0) / 1000);
      }
      times.sort((a, b) => a - b);
      return times[Math.floor(times.length / 2)];
    } finally {
      release(prepared);
    }
  }
}

function release(prepared) {
  for (const b of prepared.buffers) b.destroy();
  prepared.uniforms.destroy();
}

// The comparison of tests/conftest.py nmse(): NaN and inf positions must agree exactly,
// the rest is sum((a-b)^2) / sum(b^2). Returns { nmse, problem }.
export function compare(actualBytes, expected, exact) {
  const a = typedView(actualBytes, expected.dtype);
  const b = typedView(decodeBase64(expected.data), expected.dtype);
  if (a.length !== b.length) return { nmse: Infinity, problem: `${a.length} values, expected ${b.length}` };
  let num = 0;
  let den = 0;
  for (let i = 0; i < b.length; i++) {
    const x = a[i];
    const y = b[i];
    if (Number.isNaN(x) || Number.isNaN(y) || !Number.isFinite(y) || !Number.isFinite(x)) {
      if (!Object.is(x, y) && !(Number.isNaN(x) && Number.isNaN(y))) {
        return { nmse: Infinity, problem: `element ${i}: got ${x}, expected ${y}` };
      }
      continue;
    }
    if (exact && x !== y) return { nmse: Infinity, problem: `element ${i}: got ${x}, expected ${y} (must be exact)` };
    num += (x - y) * (x - y);
    den += y * y;
  }
  return { nmse: den === 0 ? num : num / den, problem: null };
}
