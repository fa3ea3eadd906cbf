// Matrix product C (M, N) = A (M, K) @ B, the simple kernels:
// `main`: one output per thread in 16x16 workgroups.
// `gemv`: 32 threads per output element (8 outputs per 256-thread workgroup), splitting
//         K and reducing in workgroup memory: the path for M = 1 (matrix-vector), where
//         one thread per output would leave most of a GPU idle. With TRANSPOSE_B each
//         group of 32 reads one contiguous row of B. (A whole workgroup per output gives
//         each thread only 2-3 products at LLM sizes, K = 576, before an 8-level
//         barrier reduction.)
// TRANSPOSE_B = true reads B as (N, K) (the layout of LLM weight matrices).

override TRANSPOSE_B: bool = false;
const WG: u32 = 256u;
const LANES: u32 = 32u;
const ROWS_PER_WG: u32 = WG / LANES;

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
    let lid = lid3.x;
    let lane = lid % LANES;
    let out_index = (wid.y * nwg.x + wid.x) * ROWS_PER_WG + lid / LANES;
    // No early return: every thread must reach the barriers below.
    let valid = out_index < p.M * p.N;
    var acc = 0.0;
    if (valid) {
        let m = out_index / p.N;
        let n = out_index % p.N;
        for (var k = lane; k < p.K; k = k + LANES) {
            acc = acc + a[m * p.K + k] * b_at(k, n);
        }
    }
    partial[lid] = acc;
    for (var s = LANES / 2u; s > 0u; s = s / 2u) {
        workgroupBarrier();
        if (lane < s) { partial[lid] = partial[lid] + partial[lid + s]; }
    }
    if (valid && lane == 0u) { c[out_index] = partial[lid]; }
}
