// Causal attention of new tokens over a KV cache, for llama-style decoding and prefill.
// The S new tokens come as one projected row each: qkv (S, (Hq + 2 Hkv) D) holds the
// query heads, then the key heads, then the value heads. They sit at positions
// pos .. pos + S - 1, where pos = state[1] is read on the GPU, so one recorded step
// serves every position. Rotary embedding is applied here (cos/sin from a host table),
// and the new keys and values are appended to the caches (n_ctx, Hkv, D) by this pass.
// `split`: workgroup (range r, query head h, token i) scores the keys r*WG .. r*WG+WG-1
// that token i may see (keys 0 .. pos + i), one key per thread, and stores its
// unnormalised output with the range's max and sum in `part`. Keys below pos are read
// from the cache; newer ones from qkv, because they are being written in this same pass.
// Ranges beyond the token's position end at once, so the grid may cover the whole cache.
// `combine`: workgroup (h, i) merges the ranges by rescaling them to a common max.
// NEOX = false rotates pairs (2c, 2c+1) (GGUF llama), true rotates (c, c + D/2).

override NEOX: bool = false;
const WG: u32 = 128u;       // threads per workgroup, and keys per range
const MAX_D: u32 = 256u;

struct Params {
    s: u32,         // new tokens (rows of qkv)
    hq: u32,
    hkv: u32,
    d: u32,
    n_ctx: u32,     // rows of the caches
    n_ranges: u32,  // key ranges in the grid (and per token in `part`)
    scale: f32,
}

@group(0) @binding(0) var<storage, read> qkv: array<f32>;
@group(0) @binding(1) var<storage, read_write> k_cache: array<f32>;
@group(0) @binding(2) var<storage, read_write> v_cache: array<f32>;
@group(0) @binding(3) var<storage, read> state: array<i32>;
@group(0) @binding(4) var<storage, read> cos_sin: array<vec2<f32>>;
// part[((i * hq + h) * n_ranges + r) * (d + 2) + ...]: d output sums, max, sum of exps.
@group(0) @binding(5) var<storage, read_write> part: array<f32>;
@group(0) @binding(6) var<storage, read_write> out: array<f32>;
@group(0) @binding(7) var<uniform> p: Params;

// Score of a key outside the range: finite, so exp(EMPTY - m) is 0 without inf arithmetic.
const EMPTY: f32 = -3.0e38;

var<workgroup> q_row: array<f32, MAX_D>;
var<workgroup> probs: array<f32, WG>;
var<workgroup> scratch: array<f32, WG>;

fn reduce(lid: u32, x: f32, take_max: bool) -> f32 {
    scratch[lid] = x;
    for (var s = WG / 2u; s > 0u; s = s / 2u) {
        workgroupBarrier();
        if (lid < s) {
            if (take_max) {
                scratch[lid] = max(scratch[lid], scratch[lid + s]);
            } else {
                scratch[lid] = scratch[lid] + scratch[lid + s];
            }
        }
    }
    workgroupBarrier();
    let r = scratch[0];
    workgroupBarrier();
    return r;
}

fn row_len() -> u32 {
    return (p.hq + 2u * p.hkv) * p.d;
}

// Element c of the head vector qkv[base .. base + d) rotated to position `pos`.
fn rotated(base: u32, c: u32, pos: u32) -> f32 {
    let half = p.d / 2u;
    var i = c >> 1u;
    var first = (c & 1u) == 0u;
    var partner = c ^ 1u;
    if (NEOX) {
        first = c < half;
        i = select(c - half, c, first);
        partner = select(c - half, c + half, first);
    }
    let cs = cos_sin[pos * half + i];
    let a = qkv[base + c];
    let b = qkv[base + partner];
    if (first) { return a * cs.x - b * cs.y; }
    return b * cs.y + a * cs.x;
}

@compute @workgroup_size(WG)
fn split(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>) {
    let lid = lid3.x;
    let r = wid.x;
    let h = wid.y;
    let i = wid.z;
    let pos0 = u32(state[1]);
    let at = pos0 + i;                 // this token's position: it sees keys 0 ..= at
    let begin = r * WG;
    if (begin > at) { return; }        // the same for the whole workgroup
    let end = min(begin + WG, at + 1u);
    let group = p.hq / p.hkv;
    let kvh = h / group;
    let row = row_len();
    let k_off = p.hq * p.d + kvh * p.d;
    let v_off = (p.hq + p.hkv) * p.d + kvh * p.d;

    for (var c = lid; c < p.d; c = c + WG) {
        q_row[c] = rotated(i * row + h * p.d, c, at) * p.scale;
    }
    workgroupBarrier();

    let j = begin + lid;
    var score = EMPTY;
    if (j < end) {
        var acc = 0.0;
        if (j < pos0) {
            let kb = (j * p.hkv + kvh) * p.d;
            for (var c = 0u; c < p.d; c = c + 1u) { acc = acc + q_row[c] * k_cache[kb + c]; }
        } else {
            let kb = (j - pos0) * row + k_off;
            for (var c = 0u; c < p.d; c = c + 1u) { acc = acc + q_row[c] * rotated(kb, c, j); }
        }
        score = acc;
    }
    let m = reduce(lid, score, true);
    let e = select(0.0, exp(score - m), j < end);
    probs[lid] = e;
    let l = reduce(lid, e, false);     // its barriers also publish probs

    let base = ((i * p.hq + h) * p.n_ranges + r) * (p.d + 2u);
    for (var c = lid; c < p.d; c = c + WG) {
        var acc = 0.0;
        for (var t = 0u; t < end - begin; t = t + 1u) {
            let jj = begin + t;
            var val: f32;
            if (jj < pos0) {
                val = v_cache[(jj * p.hkv + kvh) * p.d + c];
            } else {
                val = qkv[(jj - pos0) * row + v_off + c];
            }
            acc = acc + probs[t] * val;
        }
        part[base + c] = acc;
    }
    if (lid == 0u) {
        part[base + p.d] = m;
        part[base + p.d + 1u] = l;
    }
    // Append this token's key and value: once per kv head, by the first query head of
    // its group in the range holding the token's own position. No workgroup of this pass
    // reads cache rows >= pos0, so the writes race with nothing.
    if (h % group == 0u && at < begin + WG && at < p.n_ctx) {
        for (var c = lid; c < p.d; c = c + WG) {
            k_cache[(at * p.hkv + kvh) * p.d + c] = rotated(i * row + k_off, c, at);
            v_cache[(at * p.hkv + kvh) * p.d + c] = qkv[i * row + v_off + c];
        }
    }
}

@compute @workgroup_size(WG)
fn combine(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>) {
    let lid = lid3.x;
    let h = wid.x;
    let i = wid.y;
    let at = u32(state[1]) + i;
    let n_used = min(at / WG + 1u, p.n_ranges);
    let first = (i * p.hq + h) * p.n_ranges;
    let stride = p.d + 2u;
    var mx = EMPTY;
    for (var r = 0u; r < n_used; r = r + 1u) { mx = max(mx, part[(first + r) * stride + p.d]); }
    var total = 0.0;
    for (var r = 0u; r < n_used; r = r + 1u) {
        let b = (first + r) * stride;
        total = total + exp(part[b + p.d] - mx) * part[b + p.d + 1u];
    }
    for (var c = lid; c < p.d; c = c + WG) {
        var acc = 0.0;
        for (var r = 0u; r < n_used; r = r + 1u) {
            let b = (first + r) * stride;
            acc = acc + exp(part[b + p.d] - mx) * part[b + c];
        }
        out[(i * p.hq + h) * p.d + c] = acc / total;
    }
}
