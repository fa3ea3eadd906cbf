// C (M, N) f32 = A (M, K) @ B, B (K, N) or, with TRANSPOSE_B, B (N, K), of float16 A and B,
// multiplying in f16 (shader-f16): ops.matmul_f16's kernel where the device offers it.
// matmul_blocked.wgsl's tiling (read it first: the same workgroup shapes, WX x WY threads
// each computing 8 x 8 outputs, two K slices of BK in workgroup memory), with f16 tiles
// (half the bytes from memory and workgroup memory) and f16 arithmetic: a thread's 64
// sums are sixteen vec4<f16>, each fma a pair of packed half multiply-adds on GPUs that
// have them. Every HALF_STEPS values of K (a multiple of BK) the f16 sums are added into
// f32 accumulators and restarted, so rounding and range are f16's over HALF_STEPS
// products only. Random normal inputs of scale 0.01 to 10 give an NMSE of ~8e-7 at
// HALF_STEPS 32 (~1.5e-6 at 64), whatever K; it grows as the partial sums reach f16's
// subnormals (below 6e-5: ~4e-6 at scale 0.003) and they overflow past 65504, so inputs
// far from unit scale want the f32-product kernel (ops/matmul.py's F16_KERNEL_TUNED "blocked").
//   main      one guarded f16 load a value (any shape)
//   main_vec  one 8-byte load a run of 4 (K % 4 == 0, and N % 4 == 0 unless TRANSPOSE_B)

enable f16;

override TRANSPOSE_B: bool = false;
override WX: u32 = 16u;  // threads along a tile's columns: 8 WX columns
override WY: u32 = 16u;  // threads along its rows: 8 WY rows
override BK: u32 = 16u;  // K values a slice
override HALF_STEPS: u32 = 32u;  // K values summed in f16 between f32 additions

struct Params {
    M: u32,
    N: u32,
    K: u32,
}

@group(0) @binding(0) var<storage, read> a: array<f16>;
@group(0) @binding(0) var<storage, read> a_vec: array<vec4<f16>>;
@group(0) @binding(1) var<storage, read> b: array<f16>;
@group(0) @binding(1) var<storage, read> b_vec: array<vec4<f16>>;
@group(0) @binding(2) var<storage, read_write> c: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

// matmul_blocked.wgsl's layout: a_tile[s * BK + k][q], rows 4q..4q+3 at depth k of slice
// buffer s (QUADS: room for the widest shape)
const QUADS: u32 = 32u;
var<workgroup> a_tile: array<array<vec4<f16>, QUADS>, 2u * BK>;
var<workgroup> b_tile: array<array<vec4<f16>, QUADS>, 2u * BK>;

var<private> tx: u32;
var<private> ty: u32;
var<private> m0: u32;
var<private> n0: u32;
var<private> a_run0: vec2<u32>;
var<private> a_run1: vec2<u32>;
var<private> b_run0: vec2<u32>;
var<private> b_run1: vec2<u32>;
var<private> a_next0: vec4<f16>;
var<private> a_next1: vec4<f16>;
var<private> b_next0: vec4<f16>;
var<private> b_next1: vec4<f16>;
// h<i><j>: the f16 sums of row 8 ty + i, columns 4 tx + 4 WX j .. +3 since the last flush
var<private> h00: vec4<f16>;
var<private> h01: vec4<f16>;
var<private> h10: vec4<f16>;
var<private> h11: vec4<f16>;
var<private> h20: vec4<f16>;
var<private> h21: vec4<f16>;
var<private> h30: vec4<f16>;
var<private> h31: vec4<f16>;
var<private> h40: vec4<f16>;
var<private> h41: vec4<f16>;
var<private> h50: vec4<f16>;
var<private> h51: vec4<f16>;
var<private> h60: vec4<f16>;
var<private> h61: vec4<f16>;
var<private> h70: vec4<f16>;
var<private> h71: vec4<f16>;
// acc<i><j>: the f32 totals of the same outputs
var<private> acc00: vec4<f32>;
var<private> acc01: vec4<f32>;
var<private> acc10: vec4<f32>;
var<private> acc11: vec4<f32>;
var<private> acc20: vec4<f32>;
var<private> acc21: vec4<f32>;
var<private> acc30: vec4<f32>;
var<private> acc31: vec4<f32>;
var<private> acc40: vec4<f32>;
var<private> acc41: vec4<f32>;
var<private> acc50: vec4<f32>;
var<private> acc51: vec4<f32>;
var<private> acc60: vec4<f32>;
var<private> acc61: vec4<f32>;
var<private> acc70: vec4<f32>;
var<private> acc71: vec4<f32>;

fn two_a_runs() -> bool { return 2u * BK > WX; }
fn two_b_runs() -> bool { return 2u * BK > WY; }

fn k_run(t: u32, i: u32) -> vec2<u32> {
    let run = t + i * WX * WY;
    return vec2<u32>(run / (BK / 4u), (run % (BK / 4u)) * 4u);
}

fn begin(wid: vec3<u32>, lid: vec3<u32>) {
    tx = lid.x;
    ty = lid.y;
    m0 = wid.y * 8u * WY;
    n0 = wid.x * 8u * WX;
    let t = ty * WX + tx;
    a_run0 = k_run(t, 0u);
    a_run1 = k_run(t, 1u);
    if (TRANSPOSE_B) {
        b_run0 = k_run(t, 0u).yx;
        b_run1 = k_run(t, 1u).yx;
    } else {
        let run0 = t;
        let run1 = t + WX * WY;
        b_run0 = vec2<u32>(run0 / (2u * WX), (run0 % (2u * WX)) * 4u);
        b_run1 = vec2<u32>(run1 / (2u * WX), (run1 % (2u * WX)) * 4u);
    }
}

fn a_lanes(m: u32, k: u32) -> vec4<bool> {
    return (vec4<u32>(k) + vec4<u32>(0u, 1u, 2u, 3u) < vec4<u32>(p.K)) & vec4<bool>(m < p.M);
}

fn b_lanes(k: u32, n: u32) -> vec4<bool> {
    let step = vec4<u32>(0u, 1u, 2u, 3u);
    if (TRANSPOSE_B) {
        return (vec4<u32>(k) + step < vec4<u32>(p.K)) & vec4<bool>(n < p.N);
    }
    return (vec4<u32>(n) + step < vec4<u32>(p.N)) & vec4<bool>(k < p.K);
}

fn b_index(k: u32, n: u32) -> u32 {
    if (TRANSPOSE_B) { return n * p.K + k; }
    return k * p.N + n;
}

fn a_run_any(m: u32, k: u32) -> vec4<f16> {
    let ok = a_lanes(m, k);
    let i = m * p.K + k;
    var v = vec4<f16>(0.0h);
    if (ok.x) { v.x = a[i]; }
    if (ok.y) { v.y = a[i + 1u]; }
    if (ok.z) { v.z = a[i + 2u]; }
    if (ok.w) { v.w = a[i + 3u]; }
    return v;
}

fn b_run_any(k: u32, n: u32) -> vec4<f16> {
    let ok = b_lanes(k, n);
    let i = b_index(k, n);
    var v = vec4<f16>(0.0h);
    if (ok.x) { v.x = b[i]; }
    if (ok.y) { v.y = b[i + 1u]; }
    if (ok.z) { v.z = b[i + 2u]; }
    if (ok.w) { v.w = b[i + 3u]; }
    return v;
}

fn a_run_vec(m: u32, k: u32) -> vec4<f16> {
    if (m < p.M && k < p.K) { return a_vec[(m * p.K + k) / 4u]; }
    return vec4<f16>(0.0h);
}

fn b_run_vec(k: u32, n: u32) -> vec4<f16> {
    if (b_lanes(k, n).x) { return b_vec[b_index(k, n) / 4u]; }
    return vec4<f16>(0.0h);
}

fn stash(s: u32) {
    stash_k_run(s, a_run0, a_next0, true);
    if (two_a_runs()) { stash_k_run(s, a_run1, a_next1, true); }
    if (TRANSPOSE_B) {
        stash_k_run(s, b_run0.yx, b_next0, false);
        if (two_b_runs()) { stash_k_run(s, b_run1.yx, b_next1, false); }
    } else {
        b_tile[s * BK + b_run0.x][b_run0.y / 4u] = b_next0;
        if (two_b_runs()) { b_tile[s * BK + b_run1.x][b_run1.y / 4u] = b_next1; }
    }
}

// A run along K (row or column `run.x` of the tile, depth run.y..+3) goes to four depths.
fn stash_k_run(s: u32, run: vec2<u32>, v: vec4<f16>, into_a: bool) {
    let k = s * BK + run.y;
    let quad = run.x / 4u;
    let lane = run.x % 4u;
    if (into_a) {
        a_tile[k][quad][lane] = v.x;
        a_tile[k + 1u][quad][lane] = v.y;
        a_tile[k + 2u][quad][lane] = v.z;
        a_tile[k + 3u][quad][lane] = v.w;
    } else {
        b_tile[k][quad][lane] = v.x;
        b_tile[k + 1u][quad][lane] = v.y;
        b_tile[k + 2u][quad][lane] = v.z;
        b_tile[k + 3u][quad][lane] = v.w;
    }
}

fn multiply(s: u32) {
    for (var k = s * BK; k < s * BK + BK; k = k + 1u) {
        let a_lo = a_tile[k][2u * ty];
        let a_hi = a_tile[k][2u * ty + 1u];
        let b0 = b_tile[k][tx];
        let b1 = b_tile[k][tx + WX];
        h00 = fma(vec4<f16>(a_lo.x), b0, h00);
        h01 = fma(vec4<f16>(a_lo.x), b1, h01);
        h10 = fma(vec4<f16>(a_lo.y), b0, h10);
        h11 = fma(vec4<f16>(a_lo.y), b1, h11);
        h20 = fma(vec4<f16>(a_lo.z), b0, h20);
        h21 = fma(vec4<f16>(a_lo.z), b1, h21);
        h30 = fma(vec4<f16>(a_lo.w), b0, h30);
        h31 = fma(vec4<f16>(a_lo.w), b1, h31);
        h40 = fma(vec4<f16>(a_hi.x), b0, h40);
        h41 = fma(vec4<f16>(a_hi.x), b1, h41);
        h50 = fma(vec4<f16>(a_hi.y), b0, h50);
        h51 = fma(vec4<f16>(a_hi.y), b1, h51);
        h60 = fma(vec4<f16>(a_hi.z), b0, h60);
        h61 = fma(vec4<f16>(a_hi.z), b1, h61);
        h70 = fma(vec4<f16>(a_hi.w), b0, h70);
        h71 = fma(vec4<f16>(a_hi.w), b1, h71);
    }
}

// The f16 sums into the f32 totals; the f16 ones start again from zero.
fn flush() {
    acc00 = acc00 + vec4<f32>(h00);
    acc01 = acc01 + vec4<f32>(h01);
    acc10 = acc10 + vec4<f32>(h10);
    acc11 = acc11 + vec4<f32>(h11);
    acc20 = acc20 + vec4<f32>(h20);
    acc21 = acc21 + vec4<f32>(h21);
    acc30 = acc30 + vec4<f32>(h30);
    acc31 = acc31 + vec4<f32>(h31);
    acc40 = acc40 + vec4<f32>(h40);
    acc41 = acc41 + vec4<f32>(h41);
    acc50 = acc50 + vec4<f32>(h50);
    acc51 = acc51 + vec4<f32>(h51);
    acc60 = acc60 + vec4<f32>(h60);
    acc61 = acc61 + vec4<f32>(h61);
    acc70 = acc70 + vec4<f32>(h70);
    acc71 = acc71 + vec4<f32>(h71);
    let zero = vec4<f16>(0.0h);
    h00 = zero;
    h01 = zero;
    h10 = zero;
    h11 = zero;
    h20 = zero;
    h21 = zero;
    h30 = zero;
    h31 = zero;
    h40 = zero;
    h41 = zero;
    h50 = zero;
    h51 = zero;
    h60 = zero;
    h61 = zero;
    h70 = zero;
    h71 = zero;
}

// After the slice ending at K offset `end`: flush every HALF_STEPS values and at the end.
fn flush_after(end: u32) {
    if (end % HALF_STEPS == 0u || end >= p.K) { flush(); }
}

fn store4(m: u32, n: u32, v: vec4<f32>) {
    let i = m * p.N + n;
    if (n < p.N) { c[i] = v.x; }
    if (n + 1u < p.N) { c[i + 1u] = v.y; }
    if (n + 2u < p.N) { c[i + 2u] = v.z; }
    if (n + 3u < p.N) { c[i + 3u] = v.w; }
}

fn store_row(i: u32, lo: vec4<f32>, hi: vec4<f32>) {
    let m = m0 + 8u * ty + i;
    if (m >= p.M) { return; }
    let n = n0 + 4u * tx;
    store4(m, n, lo);
    store4(m, n + 4u * WX, hi);
}

fn finish() {
    store_row(0u, acc00, acc01);
    store_row(1u, acc10, acc11);
    store_row(2u, acc20, acc21);
    store_row(3u, acc30, acc31);
    store_row(4u, acc40, acc41);
    store_row(5u, acc50, acc51);
    store_row(6u, acc60, acc61);
    store_row(7u, acc70, acc71);
}

@compute @workgroup_size(WX, WY)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    begin(wid, lid);
    fetch_any(0u);
    for (var k0 = 0u; k0 < p.K; k0 = k0 + 2u * BK) {
        stash(0u);
        workgroupBarrier();
        fetch_any(k0 + BK);
        multiply(0u);
        flush_after(k0 + BK);
        if (k0 + BK >= p.K) { break; }
        stash(1u);
        workgroupBarrier();
        fetch_any(k0 + 2u * BK);
        multiply(1u);
        flush_after(k0 + 2u * BK);
    }
    finish();
}

fn fetch_any(k0: u32) {
    a_next0 = a_run_any(m0 + a_run0.x, k0 + a_run0.y);
    if (two_a_runs()) { a_next1 = a_run_any(m0 + a_run1.x, k0 + a_run1.y); }
    b_next0 = b_run_any(k0 + b_run0.x, n0 + b_run0.y);
    if (two_b_runs()) { b_next1 = b_run_any(k0 + b_run1.x, n0 + b_run1.y); }
}

@compute @workgroup_size(WX, WY)
fn main_vec(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    begin(wid, lid);
    fetch_vec(0u);
    for (var k0 = 0u; k0 < p.K; k0 = k0 + 2u * BK) {
        stash(0u);
        workgroupBarrier();
        fetch_vec(k0 + BK);
        multiply(0u);
        flush_after(k0 + BK);
        if (k0 + BK >= p.K) { break; }
        stash(1u);
        workgroupBarrier();
        fetch_vec(k0 + 2u * BK);
        multiply(1u);
        flush_after(k0 + 2u * BK);
    }
    finish();
}

fn fetch_vec(k0: u32) {
    a_next0 = a_run_vec(m0 + a_run0.x, k0 + a_run0.y);
    if (two_a_runs()) { a_next1 = a_run_vec(m0 + a_run1.x, k0 + a_run1.y); }
    b_next0 = b_run_vec(k0 + b_run0.x, n0 + b_run0.y);
    if (two_b_runs()) { b_next1 = b_run_vec(k0 + b_run1.x, n0 + b_run1.y); }
}
