// Full reductions (sum, max, dot) and argmax, as parallel reductions in workgroup memory.
// Pass 1 (`partial`): each of up to MAX_GROUPS workgroups reduces a grid-strided share of
// the input to one value; pass 2 (`finish`): one workgroup reduces those partials.
// OP: 0 = sum, 1 = max, 2 = dot (a * b summed). Argmax keeps (value, index) pairs.

override OP: u32 = 0u;
// argmax_finish for greedy decoding: out_index is the state [token, position, history..];
// write the argmax as the next token, also into history[position % history length], and
// advance the position by one (the history lets several steps in one submit be read
// back with one copy after the last).
override ADVANCE: bool = false;
// Sampling (argmax_rows, then argmax_finish with ADVANCE): `b` / `out` is the sampler
// [temperature, seed, counter]. With temperature > 0 each logit becomes
// logit / temperature + Gumbel noise drawn from hash(seed, counter, index), whose argmax is
// a draw from softmax(logits / temperature) (the Gumbel-max trick); temperature 0 is
// greedy. argmax_finish then advances the counter, so chained steps draw fresh noise.
override SAMPLE: bool = false;
const WG: u32 = 256u;

struct Params {
    n: u32,        // elements (pass 1) or partials (pass 2)
    row_len: u32,  // argmax_rows: length of each row
    n_groups: u32, // pass 1: workgroups launched
    history: u32,  // argmax_finish with ADVANCE: state slots after [token, position]
}

@group(0) @binding(0) var<storage, read> a: array<f32>;
@group(0) @binding(1) var<storage, read> b: array<f32>;
@group(0) @binding(2) var<storage, read_write> out: array<f32>;
@group(0) @binding(3) var<storage, read_write> out_index: array<i32>;
@group(0) @binding(4) var<uniform> p: Params;

var<workgroup> vals: array<f32, WG>;
var<workgroup> idxs: array<i32, WG>;

fn is_nan(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u;
}

fn identity() -> f32 {
    if (OP == 1u) {
        // -inf through a variable: a constant -inf is a compile error in Chromium (Tint).
        var bits = 0xff800000u;
        return bitcast<f32>(bits);
    }
    return 0.0;
}

// max that propagates NaN (numpy semantics), written so no compiler can drop the NaN.
fn combine(x: f32, y: f32) -> f32 {
    if (OP == 1u) {
        if (is_nan(x)) { return x; }
        if (is_nan(y)) { return y; }
        return max(x, y);
    }
    return x + y;
}

fn load(i: u32) -> f32 {
    if (OP == 2u) { return a[i] * b[i]; }
    return a[i];
}

fn tree_reduce(lid: u32) {
    for (var stride = WG / 2u; stride > 0u; stride = stride / 2u) {
        workgroupBarrier();
        if (lid < stride) {
            vals[lid] = combine(vals[lid], vals[lid + stride]);
        }
    }
    workgroupBarrier();
}

@compute @workgroup_size(WG)
fn partial(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>) {
    let lid = lid3.x;
    var acc = identity();
    for (var i = wid.x * WG + lid; i < p.n; i = i + p.n_groups * WG) {
        acc = combine(acc, load(i));
    }
    vals[lid] = acc;
    tree_reduce(lid);
    if (lid == 0u) { out[wid.x] = vals[0]; }
}

@compute @workgroup_size(WG)
fn finish(@builtin(local_invocation_id) lid3: vec3<u32>) {
    let lid = lid3.x;
    var acc = identity();
    for (var i = lid; i < p.n; i = i + WG) {
        acc = combine(acc, a[i]);
    }
    vals[lid] = acc;
    tree_reduce(lid);
    if (lid == 0u) { out[0] = vals[0]; }
}

// (value, index) ordering for argmax: NaN beats everything, then larger value, then the
// smaller index, so the result is numpy's first maximal (or first NaN) position.
fn better(v1: f32, i1: i32, v2: f32, i2: i32) -> bool {
    let n1 = is_nan(v1);
    let n2 = is_nan(v2);
    if (n1 != n2) { return n1; }
    if (!n1 && v1 != v2) { return v1 > v2; }
    return i1 < i2;
}

fn argmax_tree(lid: u32) {
    for (var stride = WG / 2u; stride > 0u; stride = stride / 2u) {
        workgroupBarrier();
        if (lid < stride) {
            let j = lid + stride;
            if (idxs[j] >= 0 && (idxs[lid] < 0 || better(vals[j], idxs[j], vals[lid], idxs[lid]))) {
                vals[lid] = vals[j];
                idxs[lid] = idxs[j];
            }
        }
    }
    workgroupBarrier();
}

// PCG's output hash of one u32 (a counter-based generator: no state to carry).
fn pcg_hash(v: u32) -> u32 {
    let state = v * 747796405u + 2891336453u;
    let word = ((state >> ((state >> 28u) + 4u)) ^ state) * 277803737u;
    return (word >> 22u) ^ word;
}

// Gumbel noise for element i: -log(-log(u)), u in (0, 1) from 24 bits of the hash.
fn gumbel(seed: u32, counter: u32, i: u32) -> f32 {
    let h = pcg_hash(i ^ pcg_hash(counter ^ pcg_hash(seed)));
    let u = (f32(h >> 8u) + 0.5) * (1.0 / 16777216.0);
    return -log(-log(u));
}

// One workgroup per row of length row_len (a flat argmax uses pass 1 over rows of the
// grid-strided kind: rows = 1 chunk per workgroup, then `argmax_finish`).
@compute @workgroup_size(WG)
fn argmax_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>,
               @builtin(num_workgroups) nwg: vec3<u32>) {
    let lid = lid3.x;
    let row = wid.y * nwg.x + wid.x;
    if (row * p.row_len >= p.n) { return; }
    let base = row * p.row_len;
    let len = min(p.row_len, p.n - base);
    var best_v = 0.0;
    var best_i = -1;
    let temperature = select(0.0, b[0], SAMPLE);
    for (var i = lid; i < len; i = i + WG) {
        var v = a[base + i];
        if (temperature > 0.0) {
            v = v / temperature + gumbel(u32(b[1]), u32(b[2]), base + i);
        }
        if (best_i < 0 || better(v, i32(i), best_v, best_i)) {
            best_v = v;
            best_i = i32(i);
        }
    }
    vals[lid] = best_v;
    idxs[lid] = best_i;
    argmax_tree(lid);
    if (lid == 0u) {
        out_index[row] = idxs[0];
        out[row] = vals[0];
    }
}

// Second pass of a long flat argmax: `a` holds each chunk's best value and `b` the
// chunk's best index (an i32 buffer read through the f32 binding and bitcast back);
// chunks are row_len long.
@compute @workgroup_size(WG)
fn argmax_finish(@builtin(local_invocation_id) lid3: vec3<u32>) {
    let lid = lid3.x;
    var best_v = 0.0;
    var best_i = -1;
    for (var c = lid; c < p.n; c = c + WG) {
        let v = a[c];
        let i = i32(c * p.row_len) + bitcast<i32>(b[c]);
        if (best_i < 0 || better(v, i, best_v, best_i)) {
            best_v = v;
            best_i = i;
        }
    }
    vals[lid] = best_v;
    idxs[lid] = best_i;
    argmax_tree(lid);
    if (lid == 0u) {
        let token = idxs[0];
        out_index[0] = token;
        if (ADVANCE) {
            let at = out_index[1];
            if (p.history > 0u) { out_index[2u + u32(at) % p.history] = token; }
            out_index[1] = at + 1;
        }
        if (SAMPLE) { out[2] = out[2] + 1.0; }
    }
}
