// Multi-head attention with grouped-query heads and a causal mask. Keys are visited in
// chunks of 256 with an online softmax (running max and sum, rescaling the partial
// output), so any number of keys fits in fixed workgroup memory. q (Sq, Hq, D), k and v
// (Skv, Hkv, D), out (Sq, Hq, D); query head h reads kv head h / (Hq / Hkv). With
// CAUSAL, query i sees keys j <= i + Skv - Sq.
// `main`: one workgroup per (query row, query head) walks all of its keys.
// `split_keys` + `combine`: for few queries over many keys (decoding with a long KV
// cache), where one workgroup per (query, head) would leave most of the GPU idle: each
// workgroup handles one range of `split_len` keys and stores its unnormalised output
// with its running max and sum in `part`; `combine` merges the ranges of each
// (query, head) by rescaling them to a common max.

override CAUSAL: bool = true;
const WG: u32 = 256u;

struct Params {
    sq: u32,
    skv: u32,
    hq: u32,
    hkv: u32,
    d: u32,
    scale: f32,
    n_split: u32,    // key ranges per (query, head) (split_keys/combine only)
    split_len: u32,  // keys per range
}

@group(0) @binding(0) var<storage, read> q: array<f32>;
@group(0) @binding(1) var<storage, read> k: array<f32>;
@group(0) @binding(2) var<storage, read> v: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
// part[(task * n_split + r) * (d + 2) + ...]: d output sums, then max, then sum of
// exponentials of range r; `main` is given a one-element stand-in.
@group(0) @binding(4) var<storage, read_write> part: array<f32>;
@group(0) @binding(5) var<uniform> p: Params;

// Score of an empty key range: finite, so exp(EMPTY - m) is 0 without inf arithmetic.
const EMPTY: f32 = -3.0e38;

var<workgroup> q_row: array<f32, WG>;
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

struct Partial {
    m: f32,    // running max of the scores
    l: f32,    // sum of exp(score - m)
    acc: f32,  // sum of exp(score - m) * v[d] for d = this thread's index (when < D)
}

fn n_keys_of(i: u32) -> u32 {
    if (CAUSAL) { return i + p.skv - p.sq + 1u; }
    return p.skv;
}

// Online softmax over keys [begin, end) for query row i, head h; begin < end. Must be
// called by the whole workgroup (it contains barriers).
fn attend(lid: u32, i: u32, h: u32, begin: u32, end: u32) -> Partial {
    let kvh = h / (p.hq / p.hkv);
    if (lid < p.d) { q_row[lid] = q[(i * p.hq + h) * p.d + lid]; }
    workgroupBarrier();

    var m = EMPTY;
    var l = 0.0;
    var acc = 0.0;
    for (var start = begin; start < end; start = start + WG) {
        let j = start + lid;
        var s = EMPTY;
        if (j < end) {
            let kb = (j * p.hkv + kvh) * p.d;
            var dotp = 0.0;
            for (var e = 0u; e < p.d; e = e + 1u) { dotp = dotp + q_row[e] * k[kb + e]; }
            s = dotp * p.scale;
        }
        let m_new = max(m, reduce(lid, s, true));
        var pj = 0.0;
        if (j < end) { pj = exp(s - m_new); }
        probs[lid] = pj;
        let correction = exp(m - m_new);
        l = l * correction + reduce(lid, pj, false);
        acc = acc * correction;
        let count = min(WG, end - start);
        if (lid < p.d) {
            for (var jj = 0u; jj < count; jj = jj + 1u) {
                acc = acc + probs[jj] * v[((start + jj) * p.hkv + kvh) * p.d + lid];
            }
        }
        m = m_new;
        workgroupBarrier();  // probs is rewritten by the next chunk
    }
    return Partial(m, l, acc);
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let task = wid.y * nwg.x + wid.x;
    if (task >= p.sq * p.hq) { return; }  // uniform per workgroup
    let lid = lid3.x;
    let i = task / p.hq;
    let h = task % p.hq;
    let r = attend(lid, i, h, 0u, n_keys_of(i));
    if (lid < p.d) { out[(i * p.hq + h) * p.d + lid] = r.acc / r.l; }
}

@compute @workgroup_size(WG)
fn split_keys(@builtin(workgroup_id) wid: vec3<u32>,
              @builtin(local_invocation_id) lid3: vec3<u32>,
              @builtin(num_workgroups) nwg: vec3<u32>) {
    let linear = wid.y * nwg.x + wid.x;
    if (linear >= p.sq * p.hq * p.n_split) { return; }  // uniform per workgroup
    let lid = lid3.x;
    let task = linear / p.n_split;
    let key_range = linear % p.n_split;
    let i = task / p.hq;
    let h = task % p.hq;
    let begin = key_range * p.split_len;
    let end = min(begin + p.split_len, n_keys_of(i));
    var r = Partial(EMPTY, 0.0, 0.0);
    if (begin < end) {  // uniform: causal rows may end before this range
        r = attend(lid, i, h, begin, end);
    }
    let base = linear * (p.d + 2u);
    if (lid < p.d) { part[base + lid] = r.acc; }
    if (lid == 0u) {
        part[base + p.d] = r.m;
        part[base + p.d + 1u] = r.l;
    }
}

@compute @workgroup_size(WG)
fn combine(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>,
           @builtin(num_workgroups) nwg: vec3<u32>) {
    let task = wid.y * nwg.x + wid.x;
    let lid = lid3.x;
    if (task >= p.sq * p.hq || lid >= p.d) { return; }
    let stride = p.d + 2u;
    let first = task * p.n_split;
    var m = EMPTY;
    for (var r = 0u; r < p.n_split; r = r + 1u) {
        m = max(m, part[(first + r) * stride + p.d]);
    }
    var l = 0.0;
    var acc = 0.0;
    for (var r = 0u; r < p.n_split; r = r + 1u) {
        let base = (first + r) * stride;
        let w = exp(part[base + p.d] - m);
        l = l + w * part[base + p.d + 1u];
        acc = acc + w * part[base + lid];
    }
    out[task * p.d + lid] = acc / l;
}
