// Matrix product C (M, N) = A (M, K) @ B, the simple kernels:
// `main`: one output per thread in 16x16 workgroups.
// `gemv`: one workgroup per output element, its threads splitting K and reducing in
//         workgroup memory: the fast path for M = 1 (matrix-vector), where a whole
//         workgroup per output keeps every core busy.
// TRANSPOSE_B = true reads B as (N, K) (the layout of LLM weight matrices).

override TRANSPOSE_B: bool = false;
const WG: u32 = 256u;

struct Params {
    M: u32,
    N: u32,
    K: u32,
}

@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> c: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

var<workgroup> partial: array<f32, WG>;

fn b_at(k: u32, n: u32) -> f32 {
    if (TRANSPOSE_B) { return b[n * p.K + k]; }
    return b[k * p.N + n];
}

@compute @workgroup_size(16, 16)
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {
    let n = gid.x;
    let m = gid.y;
    if (m >= p.M || n >= p.N) { return; }
    var acc = 0.0;
    for (var k = 0u; k < p.K; k = k + 1u) {
        acc = acc + a[m * p.K + k] * b_at(k, n);
    }
    c[m * p.N + n] = acc;
}

@compute @workgroup_size(WG)
fn gemv(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let out_index = wid.y * nwg.x + wid.x;
    if (out_index >= p.M * p.N) { return; }
    let lid = lid3.x;
    let m = out_index / p.N;
    let n = out_index % p.N;
    var acc = 0.0;
    for (var k = lid; k < p.K; k = k + WG) {
        acc = acc + a[m * p.K + k] * b_at(k, n);
    }
    partial[lid] = acc;
    for (var s = WG / 2u; s > 0u; s = s / 2u) {
        workgroupBarrier();
        if (lid < s) { partial[lid] = partial[lid] + partial[lid + s]; }
    }
    if (lid == 0u) { c[out_index] = partial[0]; }
}
