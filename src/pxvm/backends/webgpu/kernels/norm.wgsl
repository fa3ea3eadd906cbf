// Row normalisations over the last axis, one workgroup per row:
// `rmsnorm`: x * inverseSqrt(mean(x^2) + eps) * weight
// `layer_norm`: (x - mean) * inverseSqrt(var + eps) * weight + bias (two-pass variance).

const WG: u32 = 256u;

struct Params {
    rows: u32,
    row_len: u32,
    eps: f32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> weight: array<f32>;
@group(0) @binding(2) var<storage, read> bias: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<uniform> p: Params;

var<workgroup> scratch: array<f32, WG>;

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

fn row_index(wid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return wid.y * nwg.x + wid.x;
}

// 1 / rms of the row at x[base ..] (the whole workgroup calls it).
fn inverse_rms(lid: u32, base: u32) -> f32 {
    var ss = 0.0;
    for (var i = lid; i < p.row_len; i = i + WG) {
        let v = x[base + i];
        ss = ss + v * v;
    }
    return inverseSqrt(reduce_sum(lid, ss) / f32(p.row_len) + p.eps);
}

@compute @workgroup_size(WG)
fn rmsnorm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>,
           @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = row_index(wid, nwg);
    if (row >= p.rows) { return; }
    let lid = lid3.x;
    let base = row * p.row_len;
    let scale = inverse_rms(lid, base);
    for (var i = lid; i < p.row_len; i = i + WG) {
        y[base + i] = x[base + i] * scale * weight[i];
    }
}

@compute @workgroup_size(WG)
fn layer_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>,
              @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = row_index(wid, nwg);
    if (row >= p.rows) { return; }
    let lid = lid3.x;
    let base = row * p.row_len;
    var s = 0.0;
    for (var i = lid; i < p.row_len; i = i + WG) { s = s + x[base + i]; }
    let mean = reduce_sum(lid, s) / f32(p.row_len);
    var v = 0.0;
    for (var i = lid; i < p.row_len; i = i + WG) {
        let d = x[base + i] - mean;
        v = v + d * d;
    }
    let scale = inverseSqrt(reduce_sum(lid, v) / f32(p.row_len) + p.eps);
    for (var i = lid; i < p.row_len; i = i + WG) {
        y[base + i] = (x[base + i] - mean) * scale * weight[i] + bias[i];
    }
}

// `qk_norm`: the rows are the heads of a layer's projected qkv (S tokens x (Q_HEADS +
// 2 KV_HEADS) heads of row_len values): query heads are RMS-normalised and scaled by
// `weight`, key heads by `bias` (the key heads' gain), value heads copied (Qwen3's and
// Gemma 3's QK norm, before RoPE).
override Q_HEADS: u32 = 1u;
override KV_HEADS: u32 = 1u;

@compute @workgroup_size(WG)
fn qk_norm(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>,
           @builtin(num_workgroups) nwg: vec3<u32>) {
    let row = row_index(wid, nwg);
    if (row >= p.rows) { return; }
    let lid = lid3.x;
    let base = row * p.row_len;
    let head = row % (Q_HEADS + 2u * KV_HEADS);
    if (head >= Q_HEADS + KV_HEADS) {  // a value head (the whole workgroup)
        for (var i = lid; i < p.row_len; i = i + WG) { y[base + i] = x[base + i]; }
        return;
    }
    let scale = inverse_rms(lid, base);
    for (var i = lid; i < p.row_len; i = i + WG) {
        y[base + i] = x[base + i] * scale * select(bias[i], weight[i], head < Q_HEADS);
    }
}
