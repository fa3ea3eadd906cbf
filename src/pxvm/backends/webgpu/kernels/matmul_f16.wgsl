// C (M, N) f32 = A (M, K) @ B (K, N), or A @ B^T for B (N, K) with TRANSPOSE_B; A and B
// are float16, read two values a u32 word and unpacked with unpack2x16float (core WGSL:
// no shader-f16 needed, so every device runs it), multiplied and summed in f32. One
// output a thread: the portable reference kernel of ops.matmul_f16 (CUDA's runs on
// tensor cores).

override TRANSPOSE_B: bool = false;
const WG: u32 = 64u;

struct Params {
    M: u32,
    N: u32,
    K: u32,
}

@group(0) @binding(0) var<storage, read> a: array<u32>;
@group(0) @binding(1) var<storage, read> b: array<u32>;
@group(0) @binding(2) var<storage, read_write> c: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

fn a_at(i: u32) -> f32 {
    let pair = unpack2x16float(a[i >> 1u]);
    return select(pair.x, pair.y, (i & 1u) == 1u);
}

fn b_at(i: u32) -> f32 {
    let pair = unpack2x16float(b[i >> 1u]);
    return select(pair.x, pair.y, (i & 1u) == 1u);
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let idx = (wid.y * nwg.x + wid.x) * WG + lid.x;
    if (idx >= p.M * p.N) { return; }
    let row = idx / p.N;
    let col = idx % p.N;
    var acc = 0.0;
    for (var k = 0u; k < p.K; k = k + 1u) {
        let bi = select(k * p.N + col, col * p.K + k, TRANSPOSE_B);
        acc = acc + a_at(row * p.K + k) * b_at(bi);
    }
    c[idx] = acc;
}
