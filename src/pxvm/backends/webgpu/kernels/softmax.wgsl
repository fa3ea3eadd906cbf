// Row-wise softmax and log_softmax over the last axis, numerically stable: one workgroup
// per row finds the row max, then the sum of exp(x - max), in workgroup memory.
// LOG = true gives log_softmax.

override LOG: bool = false;
const WG: u32 = 256u;

struct Params {
    rows: u32,
    row_len: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read_write> y: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;

var<workgroup> scratch: array<f32, WG>;

fn is_nan(v: f32) -> bool {
    return (bitcast<u32>(v) & 0x7fffffffu) > 0x7f800000u;
}

fn reduce_max(lid: u32, v: f32) -> f32 {
    scratch[lid] = v;
    for (var s = WG / 2u; s > 0u; s = s / 2u) {
        workgroupBarrier();
        if (lid < s) {
            let o = scratch[lid + s];
            // NaN already held must stay: NVIDIA folds `o > NaN` as if NaN did not exist.
            if (!is_nan(scratch[lid]) && (is_nan(o) || o > scratch[lid])) { scratch[lid] = o; }
        }
    }
    workgroupBarrier();
    let r = scratch[0];
    workgroupBarrier();
    return r;
}

fn reduce_sum(lid: u32, v: f32) -> f32 {
    scratch[lid] = v;
    for (var s = WG / 2u; s > 0u; s = s / 2u) {
        workgroupBarrier();
        if (lid < s) { scratch[lid] = scratch[lid] + scratch[lid + s]; }
    }
    workgroupBarrier();
    let r = scratch[0];
    workgroupBarrier();
    return r;
}

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = wid.y * nwg.x + wid.x;
    if (row >= p.rows) { return; }  // uniform per workgroup: barriers stay uniform
    let lid = lid3.x;
    let base = row * p.row_len;
    var neg_inf_bits = 0xff800000u;  // a constant -inf does not compile in Chromium
    var m = bitcast<f32>(neg_inf_bits);
    for (var i = lid; i < p.row_len; i = i + WG) {
        let v = x[base + i];
        if (!is_nan(m) && (is_nan(v) || v > m)) { m = v; }
    }
    m = reduce_max(lid, m);
    var s = 0.0;
    for (var i = lid; i < p.row_len; i = i + WG) {
        s = s + exp(x[base + i] - m);
    }
    s = reduce_sum(lid, s);
    let log_s = log(s);
    for (var i = lid; i < p.row_len; i = i + WG) {
        let d = x[base + i] - m;
        if (LOG) {
            y[base + i] = d - log_s;
        } else {
            y[base + i] = exp(d) / s;
        }
    }
}
