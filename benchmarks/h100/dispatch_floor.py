"""Per-dispatch floor on this GPU through wgpu: N dependent/independent dispatches in one pass."""
import sys, time, statistics, numpy as np, wgpu
a = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
print(a.info["device"], "subgroup" in a.features, flush=True)
feats = [f for f in ("timestamp-query", "subgroup", "timestamp-query-inside-passes") if f in a.features]
d = a.request_device_sync(required_features=feats)
SRC = """
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@compute @workgroup_size(256) fn main(@builtin(global_invocation_id) g: vec3<u32>) {
  let i = g.x % 1024u;
  y[g.x] = x[i] + 1.0;
}
"""
SG = """
@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@compute @workgroup_size(256) fn main(@builtin(global_invocation_id) g: vec3<u32>, @builtin(subgroup_size) sz: u32) {
  let s = subgroupAdd(x[g.x % 1024u]);
  y[g.x] = s + f32(sz);
}
"""
def pipe(src):
    m = d.create_shader_module(code=src)
    return d.create_compute_pipeline(layout="auto", compute={"module": m, "entry_point": "main"})
p = pipe(SRC)
if "subgroup" in feats:
    ps = pipe(SG)
    print("subgroup shader compiled", flush=True)
U = wgpu.BufferUsage
bufs = [d.create_buffer(size=4 * 256 * 256, usage=U.STORAGE | U.COPY_SRC | U.COPY_DST) for _ in range(200)]
q = d.create_query_set(type="timestamp", count=2)
res = d.create_buffer(size=16, usage=U.QUERY_RESOLVE | U.COPY_SRC)
rd = d.create_buffer(size=16, usage=U.MAP_READ | U.COPY_DST)
def bg(pp, i, o):
    return d.create_bind_group(layout=pp.get_bind_group_layout(0), entries=[
        {"binding": 0, "resource": {"buffer": bufs[i]}}, {"binding": 1, "resource": {"buffer": bufs[o]}}])
def run(pp, n, wgs, chain):
    groups = [bg(pp, i % 2, 1 - i % 2) if chain else bg(pp, 199, i % 198) for i in range(n)]
    ts = []
    for rep in range(12):
        e = d.create_command_encoder()
        c = e.begin_compute_pass(timestamp_writes={"query_set": q, "beginning_of_pass_write_index": 0, "end_of_pass_write_index": 1})
        c.set_pipeline(pp)
        for g in groups:
            c.set_bind_group(0, g); c.dispatch_workgroups(wgs)
        c.end()
        e.resolve_query_set(q, 0, 2, res, 0); e.copy_buffer_to_buffer(res, 0, rd, 0, 16)
        d.queue.submit([e.finish()])
        rd.map_sync(wgpu.MapMode.READ); t = np.frombuffer(rd.read_mapped(), np.uint64).copy(); rd.unmap()
        ts.append((t[1] - t[0]) * 1e-3)
    return statistics.median(ts[2:])
for chain in (True, False):
    for wgs in (1, 128, 256):
        for n in (1, 46, 184):
            us = run(p, n, wgs, chain)
            print(f"chain={chain} wgs={wgs} n={n}: {us:.1f} us total, {us/n:.2f} us/dispatch", flush=True)
if "subgroup" in feats:
    print("subgroup chain 184x128:", run(ps, 184, 128, True))
