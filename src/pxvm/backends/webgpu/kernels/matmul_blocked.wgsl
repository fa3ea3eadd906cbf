// Register-blocked matrix product C (M, N) f32 = A (M, K) @ B, B (K, N) or, with
// TRANSPOSE_B, B (N, K): ops.matmul's fast kernel, and ops.matmul_f16's tiled kernel for
// devices without shader-f16 (float16 operands unpacked to f32 as they are stored into
// workgroup memory, so the inner loop is this same f32 one).
//
// A workgroup of WX x WY threads computes a (8 WY) x (8 WX) tile of C, each thread an
// 8 x 8 block of it in sixteen vec4 accumulators (unrolled variables: private arrays
// indexed in loops can spill). A thread's rows are 8 consecutive ones; its columns two
// quads 4 WX apart, so that neighbouring threads read neighbouring vec4s of the B slice
// (no bank conflicts). K advances BK values a slice through workgroup memory, A's and B's
// slices stored k-major: a thread reads its 8 rows and 8 columns of one k as four vec4s
// for 64 multiply-adds. Two slices live in workgroup memory: a thread stores slice s into
// one half, fetches slice s + 1 from memory into registers, then multiplies slice s, so
// one barrier a slice suffices and the loads are in flight during the arithmetic.
// Out-of-range rows, columns and depth load as zeros and are not stored: any M, N, K.
//
// Shapes (override constants): WX, WY in {8, 16}, BK a multiple of 4 with 2 BK / WX and
// 2 BK / WY in {1, 2}: each thread moves one or two runs of 4 values of each operand a
// slice (backends/webgpu/ops/matmul.py BLOCKED_SHAPES lists them).
//
// The entry points differ only in how a thread fetches a run of 4 values (along K for A
// and for B^T, along N for B):
//   main          f32, one guarded load a value (any shape)
//   main_vec4     f32, one 16-byte load a run (K % 4 == 0, and N % 4 == 0 unless
//                 TRANSPOSE_B: a run is then wholly in or out of bounds)
//   main_f16      float16 pairs in u32 words, unpacked with unpack2x16float (any shape;
//                 core WGSL, no shader-f16)
//   main_f16_vec  float16, one 8-byte load a run (main_vec4's alignment)
// Each operand is declared at its binding under the types of these views; an entry point
// uses one of them, and a binding is never declared twice for one entry point.

override TRANSPOSE_B: bool = false;
override WX: u32 = 16u;  // threads along a tile's columns: 8 WX columns
override WY: u32 = 16u;  // threads along its rows: 8 WY rows
override BK: u32 = 8u;   // K values a slice

struct Params {
    M: u32,
    N: u32,
    K: u32,
}

@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(0) var<storage, read> a_vec4: array<vec4<f32>>;
@group(0) @binding(0) var<storage, read> a_f16: array<u32>;
@group(0) @binding(0) var<storage, read> a_f16_vec: array<vec2<u32>>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(1) var<storage, read> b_vec4: array<vec4<f32>>;
@group(0) @binding(1) var<storage, read> b_f16: array<u32>;
@group(0) @binding(1) var<storage, read> b_f16_vec: array<vec2<u32>>;
@group(0) @binding(2) var<storage, read_write> c: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

// Two slices of each operand, k-major: a_tile[s * BK + k][q] holds rows 4q..4q+3 of the
// tile at depth k of slice buffer s; b_tile likewise columns 4q..4q+3. Rows have room for
// the widest shape (WX, WY <= 16): a constant size, so that with the depth unrolled
// and s a constant (the main loop takes two slices an iteration) only the loop-invariant
// quad index remains to be bounds-checked, not every load of the inner loop.
const QUADS: u32 = 32u;
var<workgroup> a_tile: array<array<vec4<f32>, QUADS>, 2u * BK>;
var<workgroup> b_tile: array<array<vec4<f32>, QUADS>, 2u * BK>;

// This thread's state, shared by the helpers below (one invocation's own variables).
var<private> tx: u32;
var<private> ty: u32;
var<private> m0: u32;          // the tile's first row and column
var<private> n0: u32;
var<private> a_run0: vec2<u32>;  // where this thread's runs sit in a slice:
var<private> a_run1: vec2<u32>;  // (row, k) of A's, (k, column) of B's
var<private> b_run0: vec2<u32>;
var<private> b_run1: vec2<u32>;
var<private> a_next0: vec4<f32>;  // the next slice's runs, fetched ahead
var<private> a_next1: vec4<f32>;
var<private> b_next0: vec4<f32>;
var<private> b_next1: vec4<f32>;
// acc<i><h>: row 8 ty + i, columns 4 tx + 4 WX h .. +3
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

// Run i of thread t along K: (row or column of the tile, k offset); 4 values along K.
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
        // 4 values along N: (k, column offset)
        let run0 = t;
        let run1 = t + WX * WY;
        b_run0 = vec2<u32>(run0 / (2u * WX), (run0 % (2u * WX)) * 4u);
        b_run1 = vec2<u32>(run1 / (2u * WX), (run1 % (2u * WX)) * 4u);
    }
}

// Bounds of a run: A[m, k..k+3]; B's run at (k, n), along K (B^T: B[n, k..k+3]) or
// along N (B[k, n..n+3]): which of its 4 values lie inside the matrix.
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

// Element index of a B run's first value (its others follow it).
fn b_index(k: u32, n: u32) -> u32 {
    if (TRANSPOSE_B) { return n * p.K + k; }
    return k * p.N + n;
}

// ---- fetching a run: one function per view of the operands --------------------------

fn a_run_f32(m: u32, k: u32) -> vec4<f32> {
    let ok = a_lanes(m, k);
    let i = m * p.K + k;
    var v = vec4<f32>(0.0);
    if (ok.x) { v.x = a[i]; }
    if (ok.y) { v.y = a[i + 1u]; }
    if (ok.z) { v.z = a[i + 2u]; }
    if (ok.w) { v.w = a[i + 3u]; }
    return v;
}

fn b_run_f32(k: u32, n: u32) -> vec4<f32> {
    let ok = b_lanes(k, n);
    let i = b_index(k, n);
    var v = vec4<f32>(0.0);
    if (ok.x) { v.x = b[i]; }
    if (ok.y) { v.y = b[i + 1u]; }
    if (ok.z) { v.z = b[i + 2u]; }
    if (ok.w) { v.w = b[i + 3u]; }
    return v;
}

// Aligned views: a run is wholly inside or outside the matrix, and starts at a
// multiple of 4 elements.
fn a_run_vec4(m: u32, k: u32) -> vec4<f32> {
    if (m < p.M && k < p.K) { return a_vec4[(m * p.K + k) / 4u]; }
    return vec4<f32>(0.0);
}

fn b_run_vec4(k: u32, n: u32) -> vec4<f32> {
    if (b_lanes(k, n).x) { return b_vec4[b_index(k, n) / 4u]; }
    return vec4<f32>(0.0);
}

fn half_at(word: u32, i: u32) -> f32 {
    let pair = unpack2x16float(word);
    return select(pair.x, pair.y, (i & 1u) == 1u);
}

fn a_run_f16(m: u32, k: u32) -> vec4<f32> {
    let ok = a_lanes(m, k);
    let i = m * p.K + k;
    var v = vec4<f32>(0.0);
    if (ok.x) { v.x = half_at(a_f16[i >> 1u], i); }
    if (ok.y) { v.y = half_at(a_f16[(i + 1u) >> 1u], i + 1u); }
    if (ok.z) { v.z = half_at(a_f16[(i + 2u) >> 1u], i + 2u); }
    if (ok.w) { v.w = half_at(a_f16[(i + 3u) >> 1u], i + 3u); }
    return v;
}

fn b_run_f16(k: u32, n: u32) -> vec4<f32> {
    let ok = b_lanes(k, n);
    let i = b_index(k, n);
    var v = vec4<f32>(0.0);
    if (ok.x) { v.x = half_at(b_f16[i >> 1u], i); }
    if (ok.y) { v.y = half_at(b_f16[(i + 1u) >> 1u], i + 1u); }
    if (ok.z) { v.z = half_at(b_f16[(i + 2u) >> 1u], i + 2u); }
    if (ok.w) { v.w = half_at(b_f16[(i + 3u) >> 1u], i + 3u); }
    return v;
}

fn unpack4(words: vec2<u32>) -> vec4<f32> {
    return vec4<f32>(unpack2x16float(words.x), unpack2x16float(words.y));
}

fn a_run_f16_vec(m: u32, k: u32) -> vec4<f32> {
    if (m < p.M && k < p.K) { return unpack4(a_f16_vec[(m * p.K + k) / 4u]); }
    return vec4<f32>(0.0);
}

fn b_run_f16_vec(k: u32, n: u32) -> vec4<f32> {
    if (b_lanes(k, n).x) { return unpack4(b_f16_vec[b_index(k, n) / 4u]); }
    return vec4<f32>(0.0);
}

// ---- the shared steps -----------------------------------------------------------------

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
fn stash_k_run(s: u32, run: vec2<u32>, v: vec4<f32>, into_a: bool) {
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
        acc00 = fma(vec4<f32>(a_lo.x), b0, acc00);
        acc01 = fma(vec4<f32>(a_lo.x), b1, acc01);
        acc10 = fma(vec4<f32>(a_lo.y), b0, acc10);
        acc11 = fma(vec4<f32>(a_lo.y), b1, acc11);
        acc20 = fma(vec4<f32>(a_lo.z), b0, acc20);
        acc21 = fma(vec4<f32>(a_lo.z), b1, acc21);
        acc30 = fma(vec4<f32>(a_lo.w), b0, acc30);
        acc31 = fma(vec4<f32>(a_lo.w), b1, acc31);
        acc40 = fma(vec4<f32>(a_hi.x), b0, acc40);
        acc41 = fma(vec4<f32>(a_hi.x), b1, acc41);
        acc50 = fma(vec4<f32>(a_hi.y), b0, acc50);
        acc51 = fma(vec4<f32>(a_hi.y), b1, acc51);
        acc60 = fma(vec4<f32>(a_hi.z), b0, acc60);
        acc61 = fma(vec4<f32>(a_hi.z), b1, acc61);
        acc70 = fma(vec4<f32>(a_hi.w), b0, acc70);
        acc71 = fma(vec4<f32>(a_hi.w), b1, acc71);
    }
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

// ---- entry points: the same loop, each with its own fetch -------------------------------
// Slice j of K goes into buffer j % 2; the barrier after storing it also orders the
// previous multiply (of the other buffer) before the next store into that buffer.

@compute @workgroup_size(WX, WY)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    begin(wid, lid);
    fetch_f32(0u);
    for (var k0 = 0u; k0 < p.K; k0 = k0 + 2u * BK) {
        stash(0u);
        workgroupBarrier();
        fetch_f32(k0 + BK);
        multiply(0u);
        if (k0 + BK >= p.K) { break; }
        stash(1u);
        workgroupBarrier();
        fetch_f32(k0 + 2u * BK);
        multiply(1u);
    }
    finish();
}

fn fetch_f32(k0: u32) {
    a_next0 = a_run_f32(m0 + a_run0.x, k0 + a_run0.y);
    if (two_a_runs()) { a_next1 = a_run_f32(m0 + a_run1.x, k0 + a_run1.y); }
    b_next0 = b_run_f32(k0 + b_run0.x, n0 + b_run0.y);
    if (two_b_runs()) { b_next1 = b_run_f32(k0 + b_run1.x, n0 + b_run1.y); }
}

@compute @workgroup_size(WX, WY)
fn main_vec4(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    begin(wid, lid);
    fetch_vec4(0u);
    for (var k0 = 0u; k0 < p.K; k0 = k0 + 2u * BK) {
        stash(0u);
        workgroupBarrier();
        fetch_vec4(k0 + BK);
        multiply(0u);
        if (k0 + BK >= p.K) { break; }
        stash(1u);
        workgroupBarrier();
        fetch_vec4(k0 + 2u * BK);
        multiply(1u);
    }
    finish();
}

fn fetch_vec4(k0: u32) {
    a_next0 = a_run_vec4(m0 + a_run0.x, k0 + a_run0.y);
    if (two_a_runs()) { a_next1 = a_run_vec4(m0 + a_run1.x, k0 + a_run1.y); }
    b_next0 = b_run_vec4(k0 + b_run0.x, n0 + b_run0.y);
    if (two_b_runs()) { b_next1 = b_run_vec4(k0 + b_run1.x, n0 + b_run1.y); }
}

@compute @workgroup_size(WX, WY)
fn main_f16(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    begin(wid, lid);
    fetch_f16(0u);
    for (var k0 = 0u; k0 < p.K; k0 = k0 + 2u * BK) {
        stash(0u);
        workgroupBarrier();
        fetch_f16(k0 + BK);
        multiply(0u);
        if (k0 + BK >= p.K) { break; }
        stash(1u);
        workgroupBarrier();
        fetch_f16(k0 + 2u * BK);
        multiply(1u);
    }
    finish();
}

fn fetch_f16(k0: u32) {
    a_next0 = a_run_f16(m0 + a_run0.x, k0 + a_run0.y);
    if (two_a_runs()) { a_next1 = a_run_f16(m0 + a_run1.x, k0 + a_run1.y); }
    b_next0 = b_run_f16(k0 + b_run0.x, n0 + b_run0.y);
    if (two_b_runs()) { b_next1 = b_run_f16(k0 + b_run1.x, n0 + b_run1.y); }
}

@compute @workgroup_size(WX, WY)
fn main_f16_vec(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>) {
    begin(wid, lid);
    fetch_f16_vec(0u);
    for (var k0 = 0u; k0 < p.K; k0 = k0 + 2u * BK) {
        stash(0u);
        workgroupBarrier();
        fetch_f16_vec(k0 + BK);
        multiply(0u);
        if (k0 + BK >= p.K) { break; }
        stash(1u);
        workgroupBarrier();
        fetch_f16_vec(k0 + 2u * BK);
        multiply(1u);
    }
    finish();
}

fn fetch_f16_vec(k0: u32) {
    a_next0 = a_run_f16_vec(m0 + a_run0.x, k0 + a_run0.y);
    if (two_a_runs()) { a_next1 = a_run_f16_vec(m0 + a_run1.x, k0 + a_run1.y); }
    b_next0 = b_run_f16_vec(k0 + b_run0.x, n0 + b_run0.y);
    if (two_b_runs()) { b_next1 = b_run_f16_vec(k0 + b_run1.x, n0 + b_run1.y); }
}
