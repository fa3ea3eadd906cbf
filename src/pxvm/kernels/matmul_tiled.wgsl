// Register-blocked matrix product C (M, N) = A (M, K) @ B.
// A 256-thread workgroup computes a 64x64 tile of C; each thread owns a 4x4 block held
// in four vec4 accumulators (unrolled: private arrays indexed in loops spill to slow
// memory on some GPUs). Tiles of A and B, BK = 16 deep, are staged in workgroup memory
// as vec4s so the inner loop does two vector loads per 16 multiply-adds.
// Out-of-range rows/columns/depth load as zero and are not stored, so any M, N, K work.
// TRANSPOSE_B = true reads B as (N, K).

override TRANSPOSE_B: bool = false;
const TILE: u32 = 64u;
const BK: u32 = 16u;

struct Params {
    M: u32,
    N: u32,
    K: u32,
}

@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> c: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

// a_tile[k * 16 + r] holds rows 4r..4r+3 of column k of the A tile; b_tile likewise
// holds columns 4c..4c+3 of row k of the B tile.
var<workgroup> a_tile: array<vec4<f32>, 256>;
var<workgroup> b_tile: array<vec4<f32>, 256>;

fn load_a(m: u32, k: u32) -> f32 {
    if (m < p.M && k < p.K) { return a[m * p.K + k]; }
    return 0.0;
}

fn load_b(k: u32, n: u32) -> f32 {
    if (k >= p.K || n >= p.N) { return 0.0; }
    if (TRANSPOSE_B) { return b[n * p.K + k]; }
    return b[k * p.N + n];
}

@compute @workgroup_size(16, 16)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let tx = lid.x;
    let ty = lid.y;
    let t = ty * 16u + tx;
    let m0 = wid.y * TILE;
    let n0 = wid.x * TILE;
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    var acc2 = vec4<f32>(0.0);
    var acc3 = vec4<f32>(0.0);

    // Each thread loads 4 elements of each tile per step.
    let ar = t / 4u;          // A tile row 0..63
    let ak = (t % 4u) * 4u;   // A tile depth 0,4,8,12
    for (var k0 = 0u; k0 < p.K; k0 = k0 + BK) {
        for (var j = 0u; j < 4u; j = j + 1u) {
            a_tile[(ak + j) * 16u + ar / 4u][ar % 4u] = load_a(m0 + ar, k0 + ak + j);
        }
        if (TRANSPOSE_B) {
            // B is (N, K): walk along K for coalesced reads.
            let bn = t / 4u;
            let bk = (t % 4u) * 4u;
            for (var j = 0u; j < 4u; j = j + 1u) {
                b_tile[(bk + j) * 16u + bn / 4u][bn % 4u] = load_b(k0 + bk + j, n0 + bn);
            }
        } else {
            let bk = t / 16u;
            let bc = (t % 16u) * 4u;
            b_tile[bk * 16u + bc / 4u] = vec4<f32>(
                load_b(k0 + bk, n0 + bc), load_b(k0 + bk, n0 + bc + 1u),
                load_b(k0 + bk, n0 + bc + 2u), load_b(k0 + bk, n0 + bc + 3u));
        }
        workgroupBarrier();
        for (var k = 0u; k < BK; k = k + 1u) {
            let av = a_tile[k * 16u + ty];
            let bv = b_tile[k * 16u + tx];
            acc0 = acc0 + av.x * bv;
            acc1 = acc1 + av.y * bv;
            acc2 = acc2 + av.z * bv;
            acc3 = acc3 + av.w * bv;
        }
        workgroupBarrier();
    }

    let row = m0 + ty * 4u;
    let col = n0 + tx * 4u;
    store_row(row, col, acc0);
    store_row(row + 1u, col, acc1);
    store_row(row + 2u, col, acc2);
    store_row(row + 3u, col, acc3);
}

fn store_row(m: u32, n: u32, v: vec4<f32>) {
    if (m >= p.M) { return; }
    let base = m * p.N;
    if (n < p.N) { c[base + n] = v.x; }
    if (n + 1u < p.N) { c[base + n + 1u] = v.y; }
    if (n + 2u < p.N) { c[base + n + 2u] = v.z; }
    if (n + 3u < p.N) { c[base + n + 3u] = v.w; }
}
