// Matrix products with GGUF-quantized weights, dequantized inside the kernel.
// The weight W (N rows of K values, the GGUF layout: each row is K/32 blocks) stays in its
// raw block bytes, read through an array<u32>; blocks are 18, 20 or 34 bytes, so bytes
// are addressed individually. FORMAT: 0 = F32, 1 = F16, 2 = Q4_0, 3 = Q4_1, 8 = Q8_0
// (GGML's type numbers).
// `matmul`: y (M, N) = x (M, K) @ W^T. A workgroup owns ROWS_PER_WG output columns n of
// one row m; the 256 / ROWS_PER_WG threads of each column split its blocks and reduce.
// `embed`: y (S, K) = rows ids[s] of W, dequantized (the embedding lookup).

override FORMAT: u32 = 3u;
const WG: u32 = 256u;
const LANES: u32 = 32u;                // threads per output column
const ROWS_PER_WG: u32 = WG / LANES;   // output columns per workgroup

struct Params {
    M: u32,
    N: u32,
    K: u32,
    row_bytes: u32,  // bytes of one weight row
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<storage, read> ids: array<i32>;
@group(0) @binding(4) var<uniform> p: Params;

var<workgroup> partial: array<f32, WG>;

fn byte_at(i: u32) -> u32 {
    return (w[i >> 2u] >> ((i & 3u) * 8u)) & 0xffu;
}

fn half_at(i: u32) -> f32 {
    return unpack2x16float(byte_at(i) | (byte_at(i + 1u) << 8u)).x;
}

fn block_values() -> u32 {
    if (FORMAT == 0u || FORMAT == 1u) { return 1u; }
    return 32u;
}

fn block_bytes() -> u32 {
    switch FORMAT {
        case 0u: { return 4u; }
        case 1u: { return 2u; }
        case 2u: { return 18u; }
        case 3u: { return 20u; }
        default: { return 34u; }  // Q8_0
    }
}

// Value j (0..31) of the block starting at byte `b`, given the block's scale terms.
fn dequant(b: u32, j: u32, d: f32, m: f32) -> f32 {
    switch FORMAT {
        case 0u: { return bitcast<f32>(byte_at(b) | (byte_at(b + 1u) << 8u) | (byte_at(b + 2u) << 16u) | (byte_at(b + 3u) << 24u)); }
        case 1u: { return half_at(b); }
        case 2u: {
            // Q4_0: f16 d, then 16 bytes; value j < 16 is byte j's low nibble, j >= 16 the
            // high nibble of byte j - 16; w = d * (q - 8).
            let q = (byte_at(b + 2u + (j & 15u)) >> ((j >> 4u) * 4u)) & 15u;
            return d * (f32(q) - 8.0);
        }
        case 3u: {
            // Q4_1: f16 d, f16 m, then 16 bytes of nibbles as Q4_0; w = d * q + m.
            let q = (byte_at(b + 4u + (j & 15u)) >> ((j >> 4u) * 4u)) & 15u;
            return d * f32(q) + m;
        }
        default: {
            // Q8_0: f16 d, then 32 int8; w = d * q.
            let q = i32(byte_at(b + 2u + j) << 24u) >> 24u;
            return d * f32(q);
        }
    }
}

fn scale_d(b: u32) -> f32 {
    if (FORMAT <= 1u) { return 1.0; }
    return half_at(b);
}

fn scale_m(b: u32) -> f32 {
    if (FORMAT == 3u) { return half_at(b + 2u); }
    return 0.0;
}

// Dot product of x row m with weight row n, over this lane's share of the blocks.
fn lane_dot(m: u32, n: u32, lane: u32) -> f32 {
    let per_block = block_values();
    let n_blocks = p.K / per_block;
    let bb = block_bytes();
    let row_base = n * p.row_bytes;
    let x_base = m * p.K;
    var acc = 0.0;
    for (var blk = lane; blk < n_blocks; blk = blk + LANES) {
        let b = row_base + blk * bb;
        let d = scale_d(b);
        let mm = scale_m(b);
        let k0 = blk * per_block;
        for (var j = 0u; j < per_block; j = j + 1u) {
            acc = acc + dequant(b, j, d, mm) * x[x_base + k0 + j];
        }
    }
    return acc;
}

@compute @workgroup_size(WG)
fn matmul(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>) {
    let lid = lid3.x;
    let col = lid / LANES;
    let lane = lid % LANES;
    let n = wid.x * ROWS_PER_WG + col;
    let m = wid.y;
    var acc = 0.0;
    if (n < p.N) { acc = lane_dot(m, n, lane); }
    partial[lid] = acc;
    for (var s = LANES / 2u; s > 0u; s = s / 2u) {
        workgroupBarrier();
        if (lane < s) { partial[lid] = partial[lid] + partial[lid + s]; }
    }
    if (lane == 0u && n < p.N) { y[m * p.N + n] = partial[lid]; }
}

@compute @workgroup_size(WG)
fn embed(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>) {
    let s = wid.y;
    let k = wid.x * WG + lid3.x;
    if (k >= p.K) { return; }
    let n = u32(ids[s]);
    let per_block = block_values();
    let b = n * p.row_bytes + (k / per_block) * block_bytes();
    y[s * p.K + k] = dequant(b, k % per_block, scale_d(b), scale_m(b));
}
