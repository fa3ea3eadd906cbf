// Register-blocked matrix product C (M, N) = A (M, K) @ B, two tile shapes:
// `main`: a 256-thread workgroup computes a 64x64 tile of C; each thread owns a 4x4
//         block held in four vec4 accumulators.
// `main_wide`: 64x128 tiles, each thread owning 4x8 outputs in eight vec4 accumulators:
//         twice the arithmetic per workgroup-memory read and a quarter less global
//         traffic, for large matrices.
// Accumulators are unrolled vec4 variables (unrolled: private arrays indexed in loops spill to slow
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
// main_wide's B tile: b_wide[k * 32 + c] holds columns 4c..4c+3 of row k (128 columns).
var<workgroup> b_wide: array<vec4<f32>, 512>;

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

@compute @workgroup_size(16, 16)
fn main_wide(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    let tx = lid.x;
    let ty = lid.y;
    let t = ty * 16u + tx;
    let m0 = wid.y * TILE;
    let n0 = wid.x * (2u * TILE);
    // Thread (tx, ty) owns rows m0 + 4ty .. +3 and two column quads, n0 + 4tx and
    // n0 + 64 + 4tx: neighbouring threads then read neighbouring vec4s of b_wide.
    var acc00 = vec4<f32>(0.0);
    var acc01 = vec4<f32>(0.0);
    var acc10 = vec4<f32>(0.0);
    var acc11 = vec4<f32>(0.0);
    var acc20 = vec4<f32>(0.0);
    var acc21 = vec4<f32>(0.0);
    var acc30 = vec4<f32>(0.0);
    var acc31 = vec4<f32>(0.0);

    let ar = t / 4u;
    let ak = (t % 4u) * 4u;
    for (var k0 = 0u; k0 < p.K; k0 = k0 + BK) {
        for (var j = 0u; j < 4u; j = j + 1u) {
            a_tile[(ak + j) * 16u + ar / 4u][ar % 4u] = load_a(m0 + ar, k0 + ak + j);
        }
        if (TRANSPOSE_B) {
            // 128 columns x 16 depth: two threads per column, 8 consecutive k each.
            let bn = t / 2u;
            let bk = (t % 2u) * 8u;
            for (var j = 0u; j < 8u; j = j + 1u) {
                b_wide[(bk + j) * 32u + bn / 4u][bn % 4u] = load_b(k0 + bk + j, n0 + bn);
            }
        } else {
            let bk = t / 16u;
            let bc = (t % 16u) * 4u;
            b_wide[bk * 32u + bc / 4u] = vec4<f32>(
                load_b(k0 + bk, n0 + bc), load_b(k0 + bk, n0 + bc + 1u),
                load_b(k0 + bk, n0 + bc + 2u), load_b(k0 + bk, n0 + bc + 3u));
            let bc2 = bc + 64u;
            b_wide[bk * 32u + bc2 / 4u] = vec4<f32>(
                load_b(k0 + bk, n0 + bc2), load_b(k0 + bk, n0 + bc2 + 1u),
                load_b(k0 + bk, n0 + bc2 + 2u), load_b(k0 + bk, n0 + bc2 + 3u));
        }
        workgroupBarrier();
        for (var k = 0u; k < BK; k = k + 1u) {
            let av = a_tile[k * 16u + ty];
            let b0 = b_wide[k * 32u + tx];
            let b1 = b_wide[k * 32u + 16u + tx];
            acc00 = acc00 + av.x * b0;
            acc01 = acc01 + av.x * b1;
            acc10 = acc10 + av.y * b0;
            acc11 = acc11 + av.y * b1;
            acc20 = acc20 + av.z * b0;
            acc21 = acc21 + av.z * b1;
            acc30 = acc30 + av.w * b0;
            acc31 = acc31 + av.w * b1;
        }
        workgroupBarrier();
    }

    let row = m0 + ty * 4u;
    let col0 = n0 + tx * 4u;
    let col1 = col0 + 64u;
    store_row(row, col0, acc00);
    store_row(row, col1, acc01);
    store_row(row + 1u, col0, acc10);
    store_row(row + 1u, col1, acc11);
    store_row(row + 2u, col0, acc20);
    store_row(row + 2u, col1, acc21);
    store_row(row + 3u, col0, acc30);
    store_row(row + 3u, col1, acc31);
}
