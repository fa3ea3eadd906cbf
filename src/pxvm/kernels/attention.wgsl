// Multi-head attention with grouped-query heads and a causal mask, one workgroup per
// (query row, query head). Keys are visited in chunks of 256 with an online softmax
// (running max and sum, rescaling the partial output), so any number of keys fits in
// fixed workgroup memory. q (Sq, Hq, D), k and v (Skv, Hkv, D), out (Sq, Hq, D); query
// head h reads kv head h / (Hq / Hkv). With CAUSAL, query i sees keys j <= i + Skv - Sq.

override CAUSAL: bool = true;
const WG: u32 = 256u;

struct Params {
    sq: u32,
    skv: u32,
    hq: u32,
    hkv: u32,
    d: u32,
    scale: f32,
}

@group(0) @binding(0) var<storage, read> q: array<f32>;
@group(0) @binding(1) var<storage, read> k: array<f32>;
@group(0) @binding(2) var<storage, read> v: array<f32>;
@group(0) @binding(3) var<storage, read_write> out: array<f32>;
@group(0) @binding(4) var<uniform> p: Params;

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

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let task = wid.y * nwg.x + wid.x;
    if (task >= p.sq * p.hq) { return; }  // uniform per workgroup
    let lid = lid3.x;
    let i = task / p.hq;
    let h = task % p.hq;
    let kvh = h / (p.hq / p.hkv);
    var n_keys = p.skv;
    if (CAUSAL) { n_keys = i + p.skv - p.sq + 1u; }

    if (lid < p.d) { q_row[lid] = q[(i * p.hq + h) * p.d + lid]; }
    workgroupBarrier();

    let neg_inf = bitcast<f32>(0xff800000u);
    var m = neg_inf;
    var l = 0.0;
    var acc = 0.0;  // output dimension `lid` (when lid < d)
    for (var start = 0u; start < n_keys; start = start + WG) {
        let j = start + lid;
        var s = neg_inf;
        if (j < n_keys) {
            let kb = (j * p.hkv + kvh) * p.d;
            var dotp = 0.0;
            for (var e = 0u; e < p.d; e = e + 1u) { dotp = dotp + q_row[e] * k[kb + e]; }
            s = dotp * p.scale;
        }
        let m_new = max(m, reduce(lid, s, true));
        var pj = 0.0;
        if (j < n_keys) { pj = exp(s - m_new); }
        probs[lid] = pj;
        let correction = exp(m - m_new);
        l = l * correction + reduce(lid, pj, false);
        acc = acc * correction;
        let count = min(WG, n_keys - start);
        if (lid < p.d) {
            for (var jj = 0u; jj < count; jj = jj + 1u) {
                acc = acc + probs[jj] * v[((start + jj) * p.hkv + kvh) * p.d + lid];
            }
        }
        m = m_new;
        workgroupBarrier();  // probs is rewritten by the next chunk
    }
    if (lid < p.d) { out[(i * p.hq + h) * p.d + lid] = acc / l; }
}
