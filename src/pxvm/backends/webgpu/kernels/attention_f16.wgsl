// attention.wgsl's `main` for float16 q, k and v, read two values a u32 word and unpacked
// with unpack2x16float (core WGSL: no shader-f16 needed), computed and written in f32:
// the portable kernel of ops.attention_f16 (CUDA's runs on tensor cores). One workgroup
// per (query row, query head) walks its keys in chunks of 256 with an online softmax.
// q (Sq, Hq, D), k and v (Skv, Hkv, D), out (Sq, Hq, D) f32; query head h reads kv head
// h / (Hq / Hkv). With CAUSAL, query i sees keys j <= i + Skv - Sq.

override CAUSAL: bool = true;
const WG: u32 = 256u;

struct Params {
    sq: u32,
    skv: u32,
    hq: u32,
    hkv: u32,
    d: u32,
    scale: f32,
    n_split: u32,    // unused here (attention.wgsl's key ranges)
    split_len: u32,  // unused here
}

@group(0) @binding(0) var<storage, read> q: array<u32>;
@group(0) @binding(1) var<storage, read> k: array<u32>;
@group(0) @binding(2) var<storage, read> v: array<u32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<uniform> p: Params;

// Score of a key past the row's end: finite, so exp(EMPTY - m) is 0 without inf arithmetic.
const EMPTY: f32 = -3.0e38;

var<workgroup> q_row: array<f32, WG>;
var<workgroup> probs: array<f32, WG>;
var<workgroup> scratch: array<f32, WG>;

fn half_at(i: u32, word: u32) -> f32 {
    let pair = unpack2x16float(word);
    return select(pair.x, pair.y, (i & 1u) == 1u);
}

fn q_at(i: u32) -> f32 { return half_at(i, q[i >> 1u]); }
fn k_at(i: u32) -> f32 { return half_at(i, k[i >> 1u]); }
fn v_at(i: u32) -> f32 { return half_at(i, v[i >> 1u]); }

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

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let task = wid.y * nwg.x + wid.x;
    if (task >= p.sq * p.hq) { return; }  // uniform per workgroup
    let lid = lid3.x;
    let i = task / p.hq;
    let h = task % p.hq;
    let kvh = h / (p.hq / p.hkv);
    var end = p.skv;
    if (CAUSAL) { end = i + p.skv - p.sq + 1u; }
    if (lid < p.d) { q_row[lid] = q_at(task * p.d + lid); }
    workgroupBarrier();

    var m = EMPTY;
    var l = 0.0;
    var acc = 0.0;
    for (var start = 0u; start < end; start = start + WG) {
        let j = start + lid;
        var s = EMPTY;
        if (j < end) {
            let kb = (j * p.hkv + kvh) * p.d;
            var dotp = 0.0;
            for (var e = 0u; e < p.d; e = e + 1u) { dotp = dotp + q_row[e] * k_at(kb + e); }
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
                acc = acc + probs[jj] * v_at(((start + jj) * p.hkv + kvh) * p.d + lid);
            }
        }
        m = m_new;
        workgroupBarrier();  // probs is rewritten by the next chunk
    }
    if (lid < p.d) { out[task * p.d + lid] = acc / l; }
}
