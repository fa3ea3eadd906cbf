// Matrix products with GGUF-quantized weights, dequantized inside the kernel.
// The weight W (N rows of K values, the GGUF layout: each row is K/32 blocks) stays in its
// raw block bytes, read through an array<u32>; blocks are 18, 20 or 34 bytes, so bytes
// are addressed individually. FORMAT: 0 = F32, 1 = F16, 30 = BF16, 2 = Q4_0, 3 = Q4_1,
// 6 = Q5_0, 7 = Q5_1, 8 = Q8_0, 10 = Q2_K, 11 = Q3_K, 12 = Q4_K, 13 = Q5_K, 14 = Q6_K
// (GGML's type numbers; the K formats are 256-value super-blocks);
// BLOCK_VALUES and BLOCK_BYTES are its block's size (pxvm/ops/quant_types.py, from the
// gguf package); only the layout inside a block is written here.
// `matmul`: y (M, N) = x (M, K) @ W^T. A workgroup owns ROWS_PER_WG output columns n of
// one row m; the LANES threads of each column split its blocks and reduce.
// `matmul_tiled`: the same product (and fusions, except ATTENTION_PARTS) for many rows of x,
// a TILE_M x TILE_N tile of y a workgroup (its section below says how).
// `embed`: y (S, K) = rows ids[s] of W, dequantized (the embedding lookup).
// Fusions for a transformer layer, chosen by constants so that one dispatch replaces
// several small ones: NORM RMS-normalises each x row and scales it by `gain` before the
// product; EPILOGUE 1 adds `res` (a residual), EPILOGUE 2 is SwiGLU: W holds the gate
// rows then the up rows (2N rows) and y = silu(x Wg^T) * (x Wu^T); 3 is GeGLU, the same
// with GELU (tanh form) for silu.
// ATTENTION_PARTS: x holds attention_cached.wgsl's per-range partial results, records of
// PART_STRIDE floats laid out as ops/layouts.py's AttentionPartials says (head_dim
// unnormalised sums, the max score at PART_MAX, the sum of exponentials at PART_SUM),
// and `ids` its state [token, position, ..]. Every workgroup merges
// its token's ranges into the attention output (K = heads * HEAD_DIM values, at most
// MERGED_VALUES) in workgroup memory, then multiplies that: the output projection takes
// attention's merge pass and the wait for it.

override FORMAT: u32 = 3u;
override BLOCK_VALUES: u32;
override BLOCK_BYTES: u32;
const WG: u32 = 256u;
// Threads per output column, a power of two <= WG: many spread a row's blocks for GPUs;
// 1 (no reduction, no barriers) suits CPU drivers such as lavapipe, where each barrier
// costs a switch between all the workgroup's invocations.
override LANES: u32 = 32u;
override ROWS_PER_WG: u32 = WG / LANES;   // output columns per workgroup
override NORM: bool = false;
override EPILOGUE: u32 = 0u;
override ATTENTION_PARTS: bool = false;
override PART_STRIDE: u32 = 0u;   // set with ATTENTION_PARTS
override PART_MAX: u32 = 0u;
override PART_SUM: u32 = 0u;
override MERGED_VALUES: u32 = 2048u;   // ops/quantized.py's merged_values

struct Params {
    M: u32,
    N: u32,
    K: u32,
    row_bytes: u32,  // bytes of one weight row
    eps: f32,        // NORM's epsilon
    head_dim: u32,   // ATTENTION_PARTS: values per head,
    n_ranges: u32,   // key ranges per token and head,
    range_len: u32,  // keys per range,
    max_keys: u32,   // and the keys they cover (within the cache)
    first_row: u32,  // `embed`: the first table row W holds (ids below or past W give 0)
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> w: array<u32>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<storage, read> ids: array<i32>;
// (vec4s: one 16-byte load for 4 gains; the binding covers whole 16-byte units)
@group(0) @binding(4) var<storage, read> gain: array<vec4<f32>>;
@group(0) @binding(5) var<storage, read> res: array<f32>;
// Views of x and W (the buffers of bindings 0 and 1) for loads of 16 bytes:
// WGSL cannot load a vec4 from an array<f32>. (Eight storage buffers: WebGPU's default
// limit a shader stage.)
@group(0) @binding(6) var<storage, read> x_vec: array<vec4<f32>>;
@group(0) @binding(7) var<storage, read> w_vec: array<vec4<u32>>;
@group(0) @binding(8) var<uniform> p: Params;

var<workgroup> partial: array<f32, WG>;
var<workgroup> partial_up: array<f32, WG>;
var<workgroup> squares: array<f32, WG>;
var<workgroup> merged: array<f32, MERGED_VALUES>;

fn byte_at(i: u32) -> u32 {
    return (w[i >> 2u] >> ((i & 3u) * 8u)) & 0xffu;
}

fn half_at(i: u32) -> f32 {
    return unpack2x16float(byte_at(i) | (byte_at(i + 1u) << 8u)).x;
}

// Q4_K's and Q5_K's 6-bit (scale, min) of 32-value sub-block `sub` of the super-block at
// byte `b` (12 bytes from b + 4: the low 6 bits of the first 8 hold sub-blocks 0..3, the
// last 4 bytes and the top bits of the first 8 sub-blocks 4..7).
fn k_scale_min(b: u32, sub: u32) -> vec2<u32> {
    if (sub < 4u) {
        return vec2<u32>(byte_at(b + 4u + sub) & 63u, byte_at(b + 8u + sub) & 63u);
    }
    let hi = byte_at(b + 8u + sub);
    return vec2<u32>((hi & 15u) | ((byte_at(b + sub) >> 6u) << 4u),
                     (hi >> 4u) | ((byte_at(b + 4u + sub) >> 6u) << 4u));
}

// Value j (0..31) of the block starting at byte `b`, given the block's scale terms.
fn dequant(b: u32, j: u32, d: f32, m: f32) -> f32 {
    switch FORMAT {
        case 0u: { return bitcast<f32>(byte_at(b) | (byte_at(b + 1u) << 8u) | (byte_at(b + 2u) << 16u) | (byte_at(b + 3u) << 24u)); }
        case 1u: { return half_at(b); }
        case 30u: { return bitcast<f32>((byte_at(b) | (byte_at(b + 1u) << 8u)) << 16u); }
        case 6u: {
            // Q5_0: f16 d, 4 bytes of fifth bits (bit j of value j), then 16 bytes of
            // nibbles as Q4_0; w = d * (q - 16).
            let low = (byte_at(b + 6u + (j & 15u)) >> ((j >> 4u) * 4u)) & 15u;
            let high = (byte_at(b + 2u + (j >> 3u)) >> (j & 7u)) & 1u;
            return d * (f32(low | (high << 4u)) - 16.0);
        }
        case 7u: {
            // Q5_1: f16 d, f16 m, 4 bytes of fifth bits, 16 bytes of nibbles; w = d * q + m.
            let low = (byte_at(b + 8u + (j & 15u)) >> ((j >> 4u) * 4u)) & 15u;
            let high = (byte_at(b + 4u + (j >> 3u)) >> (j & 7u)) & 1u;
            return d * f32(low | (high << 4u)) + m;
        }
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
        case 10u: {
            // Q2_K: 16 bytes of (4-bit scale, 4-bit min) per 16 values, 64 bytes of 2-bit
            // values (value j: bits 2 ((j >> 5) & 3) of byte 32 (j >> 7) + (j & 31)), f16 d,
            // f16 dmin; w = d * scale * q - dmin * min.
            let sm = byte_at(b + (j >> 4u));
            let q = (byte_at(b + 16u + (j >> 7u) * 32u + (j & 31u)) >> (((j >> 5u) & 3u) * 2u)) & 3u;
            return d * f32(sm & 15u) * f32(q) - m * f32(sm >> 4u);
        }
        case 11u: {
            // Q3_K: 32 bytes of high bits (bit j >> 5 of byte j & 31), 64 bytes of 2-bit
            // values as Q2_K, 12 bytes of 6-bit scales (the low 4 bits of scale i in byte
            // i & 7 from bit 4 (i >> 3), the top 2 in byte 8 + (i & 3) from bit 2 (i >> 2)),
            // f16 d; w = d * (scale - 32) * (q - 4 when the high bit is clear, else q).
            let i = j >> 4u;
            let sc = ((byte_at(b + 96u + (i & 7u)) >> ((i >> 3u) * 4u)) & 15u)
                | (((byte_at(b + 104u + (i & 3u)) >> ((i >> 2u) * 2u)) & 3u) << 4u);
            let q = (byte_at(b + 32u + (j >> 7u) * 32u + (j & 31u)) >> (((j >> 5u) & 3u) * 2u)) & 3u;
            let high = (byte_at(b + (j & 31u)) >> (j >> 5u)) & 1u;
            return d * (f32(sc) - 32.0) * (f32(q) - select(4.0, 0.0, high == 1u));
        }
        case 12u: {
            // Q4_K: f16 d, f16 dmin, 12 bytes of 6-bit (scale, min) pairs for the eight
            // 32-value sub-blocks, then 128 bytes: each 64 values share 32 bytes, the first
            // 32 in the low nibbles; w = d * scale * q - dmin * min.
            let q = (byte_at(b + 16u + (j >> 6u) * 32u + (j & 31u)) >> (((j >> 5u) & 1u) * 4u)) & 15u;
            let sm = k_scale_min(b, j >> 5u);
            return d * f32(sm.x) * f32(q) - m * f32(sm.y);
        }
        case 13u: {
            // Q5_K: Q4_K's, with 32 bytes of fifth bits before the 128 bytes of nibbles:
            // bit i of byte l belongs to value 32 i + l.
            let low = (byte_at(b + 48u + (j >> 6u) * 32u + (j & 31u)) >> (((j >> 5u) & 1u) * 4u)) & 15u;
            let high = (byte_at(b + 16u + (j & 31u)) >> (j >> 5u)) & 1u;
            let sm = k_scale_min(b, j >> 5u);
            return d * f32(sm.x) * f32(low | (high << 4u)) - m * f32(sm.y);
        }
        case 14u: {
            // Q6_K: 128 bytes of low nibbles, 64 bytes of 2-bit high parts, 16 int8 scales
            // (one per 16 values), f16 d; w = d * scale * (q - 32). Each 128-value half uses
            // 64 low bytes and 32 high bytes; its four 32-value parts take the low nibbles of
            // bytes 0..31, 32..63, then the high nibbles, and bit pairs 0..3 of the high bytes.
            let half = j >> 7u;
            let part = (j >> 5u) & 3u;
            let l = j & 31u;
            let lo = (byte_at(b + half * 64u + (part & 1u) * 32u + l) >> ((part >> 1u) * 4u)) & 15u;
            let hi = (byte_at(b + 128u + half * 32u + l) >> (part * 2u)) & 3u;
            let sc = i32(byte_at(b + 192u + half * 8u + part * 2u + (l >> 4u)) << 24u) >> 24u;
            return d * f32(sc) * (f32(lo | (hi << 4u)) - 32.0);
        }
        default: {
            // Q8_0: f16 d, then 32 int8; w = d * q.
            let q = i32(byte_at(b + 2u + j) << 24u) >> 24u;
            return d * f32(q);
        }
    }
}

fn scale_d(b: u32) -> f32 {
    if (FORMAT <= 1u || FORMAT == 30u) { return 1.0; }
    if (FORMAT == 14u) { return half_at(b + 208u); }
    if (FORMAT == 10u) { return half_at(b + 80u); }
    if (FORMAT == 11u) { return half_at(b + 108u); }
    return half_at(b);
}

fn scale_m(b: u32) -> f32 {
    if (FORMAT == 3u || FORMAT == 7u || FORMAT == 12u || FORMAT == 13u) { return half_at(b + 2u); }
    if (FORMAT == 10u) { return half_at(b + 82u); }
    return 0.0;
}

// The 4 bytes starting at even byte i as one word (blocks of 18 and 34 bytes leave their
// quants 2-byte aligned).
fn word_at(i: u32) -> u32 {
    let lo = w[i >> 2u];
    if ((i & 3u) == 0u) { return lo; }
    return (lo >> 16u) | (w[(i >> 2u) + 1u] << 16u);
}

// x[m][k] as read (the attention output when ATTENTION_PARTS). NORM multiplies it by
// gain_at(k) for the product and sums its square for the norm; the norm's 1 / rms, the
// same for the whole row, multiplies the finished sum.
fn x_at(m: u32, k: u32) -> f32 {
    if (ATTENTION_PARTS) { return merged[k]; }
    return x[m * p.K + k];
}

fn gain_at(k: u32) -> f32 {
    if (NORM) { return gain[k >> 2u][k & 3u]; }
    return 1.0;
}

// x's 4 values at k (a multiple of 4, as K is) of row m, one 16-byte load (the merged
// attention output for ATTENTION_PARTS).
fn x4(m: u32, k: u32) -> vec4<f32> {
    if (ATTENTION_PARTS) { return vec4<f32>(merged[k], merged[k + 1u], merged[k + 2u], merged[k + 3u]); }
    return x_vec[(m * p.K + k) >> 2u];
}

fn gain4(k: u32) -> vec4<f32> {
    if (NORM) { return gain[k >> 2u]; }   // k is a multiple of 4
    return vec4<f32>(1.0);
}

fn nibbles_lo(word: u32) -> vec4<f32> {
    return vec4<f32>(f32(word & 15u), f32((word >> 8u) & 15u), f32((word >> 16u) & 15u),
                     f32((word >> 24u) & 15u));
}

fn nibbles_hi(word: u32) -> vec4<f32> {
    return nibbles_lo(word >> 4u);
}

fn int8s(word: u32) -> vec4<f32> {
    return vec4<f32>(f32(i32(word << 24u) >> 24u), f32(i32(word << 16u) >> 24u),
                     f32(i32(word << 8u) >> 24u), f32(i32(word) >> 24u));
}

// Scale terms (d, m) of the 32-value block at byte b. Q4_1's 20-byte blocks are
// word-aligned, so its d and m are one load.
fn block_scales(b: u32) -> vec2<f32> {
    if (FORMAT == 3u) { return unpack2x16float(w[b >> 2u]); }
    return vec2<f32>(half_at(b), 0.0);
}

// Quant word i of the 32-value block at byte b (Q8_0: 4 int8s; Q4_x: 8 nibbles).
fn quant_word(b: u32, i: u32) -> u32 {
    if (FORMAT == 3u) { return w[(b >> 2u) + 1u + i]; }
    return word_at(b + 2u + 4u * i);
}

// Block b's sum of q * x over quant word i, given x's values for that word (xa; xb the
// high nibbles' for Q4_x).
fn word_dot(word: u32, xa: vec4<f32>, xb: vec4<f32>) -> f32 {
    if (FORMAT == 8u) { return dot(int8s(word), xa); }
    // Q4_0: w = d * (q - 8), the offset taken before the sum (no cancellation); Q4_1:
    // w = d * q + m, the m term added per block from sum(x). Word i holds values
    // 4i..4i+3 (low nibbles) and 16+4i..16+4i+3 (high nibbles).
    let offset = vec4<f32>(select(8.0, 0.0, FORMAT == 3u));
    return dot(nibbles_lo(word) - offset, xa) + dot(nibbles_hi(word) - offset, xb);
}

// lane_dot for the 32-value formats, a word (4 or 8 values) at a time: the sum of q * x
// per block, scaled once, instead of dequantizing value by value. A task is `span`
// consecutive quant words of one block. With many lanes a task is one word, so that the
// lanes of a short row (K = 576 is 18 blocks) all work and each walks a short chain of
// loads; a single lane (CPU drivers) takes whole blocks and reads each scale once.
// SwiGLU's up row (n + N) is read in the same trips as the gate row n, sharing x's loads
// (its loads in flight beside the gate's instead of after them); the norm's squares come
// from the product's own x loads (both measured: docs/benchmarks-log.md).
fn lane_dot_blocks32(m: u32, n: u32, lane: u32) -> vec3<f32> {
    let n_blocks = p.K / 32u;
    let bb = BLOCK_BYTES;
    let words = select(4u, 8u, FORMAT == 8u);   // quant words per block
    let span = select(words, 1u, LANES >= 8u);
    let tasks_per_block = words / span;
    let row_base = n * p.row_bytes;
    let up_base = (n + p.N) * p.row_bytes;
    let both = EPILOGUE >= 2u;
    var acc = vec2<f32>(0.0);   // gate (or the only row), up
    var sq = 0.0;
    for (var task = lane; task < n_blocks * tasks_per_block; task = task + LANES) {
        let blk = task / tasks_per_block;
        let w0 = (task % tasks_per_block) * span;
        let b = row_base + blk * bb;
        let bu = up_base + blk * bb;
        let dm = block_scales(b);
        var dmu = vec2<f32>(0.0);
        if (both) { dmu = block_scales(bu); }
        let k0 = blk * 32u;
        var qx = vec2<f32>(0.0);
        var xs = 0.0;
        for (var i = w0; i < w0 + span; i = i + 1u) {
            let word = quant_word(b, i);
            var word_up = 0u;
            if (both) { word_up = quant_word(bu, i); }
            let hi = select(16u, 0u, FORMAT == 8u) + 4u * i;
            let ra = x4(m, k0 + 4u * i);
            var rb = vec4<f32>(0.0);
            if (FORMAT != 8u) { rb = x4(m, k0 + hi); }
            sq = sq + dot(ra, ra) + dot(rb, rb);
            let xa = ra * gain4(k0 + 4u * i);
            let xb = rb * gain4(k0 + hi);
            qx.x = qx.x + word_dot(word, xa, xb);
            if (both) { qx.y = qx.y + word_dot(word_up, xa, xb); }
            xs = xs + dot(xa + xb, vec4<f32>(1.0));
        }
        acc = acc + vec2<f32>(dm.x, dmu.x) * qx;
        if (FORMAT == 3u) { acc = acc + vec2<f32>(dm.y, dmu.y) * xs; }
    }
    return vec3<f32>(acc, sq);
}

// Dot products of x row m with weight row n (and SwiGLU's up row n + N), over this lane's
// share of the blocks, and the sum of squares of the x values it read.
fn lane_dot(m: u32, n: u32, lane: u32) -> vec3<f32> {
    if (FORMAT == 2u || FORMAT == 3u || FORMAT == 8u) { return lane_dot_blocks32(m, n, lane); }
    let per_block = BLOCK_VALUES;
    let n_blocks = p.K / per_block;
    let bb = BLOCK_BYTES;
    let row_base = n * p.row_bytes;
    let up_base = (n + p.N) * p.row_bytes;
    var acc = vec2<f32>(0.0);
    var sq = 0.0;
    for (var blk = lane; blk < n_blocks; blk = blk + LANES) {
        let b = row_base + blk * bb;
        let bu = up_base + blk * bb;
        let k0 = blk * per_block;
        let d = vec2<f32>(scale_d(b), scale_d(bu));
        let mm = vec2<f32>(scale_m(b), scale_m(bu));
        for (var j = 0u; j < per_block; j = j + 1u) {
            let v = x_at(m, k0 + j);
            sq = sq + v * v;
            let xg = v * gain_at(k0 + j);
            acc.x = acc.x + dequant(b, j, d.x, mm.x) * xg;
            if (EPILOGUE >= 2u) { acc.y = acc.y + dequant(bu, j, d.y, mm.y) * xg; }
        }
    }
    return vec3<f32>(acc, sq);
}

// ATTENTION_PARTS: token m's attention output into `merged`. Each thread merges whole
// elements itself (no barriers), four ranges per trip (twelve loads in flight), with an
// online max; ranges beyond the token's last are clamped to it and weigh nothing. A
// token beyond the ranges' keys gets NaN, as attention_cached.wgsl's `combine` does.
fn merge_attention(m: u32, lid: u32, threads: u32) {
    for (var o = lid; o < p.K; o = o + threads) {
        merged[o] = merged_value(m, o);
    }
}

// Element o of token m's attention output, merged from its ranges' partial results.
fn merged_value(m: u32, o: u32) -> f32 {
    let at = u32(ids[1]) + m;
    let used = min(at / p.range_len + 1u, p.n_ranges);
    let unseen = at >= p.max_keys;
    let nan = bitcast<f32>(0x7fc00000u | (p.M & 0u));
    let heads = p.K / p.head_dim;
    let first = (m * heads + o / p.head_dim) * p.n_ranges;
    let c = o % p.head_dim;
    var mx = -3.0e38;
    var total = 0.0;
    var sum = 0.0;
    for (var r = 0u; r < used; r = r + 4u) {
        let live = vec4<bool>(true, r + 1u < used, r + 2u < used, r + 3u < used);
        let b = (first + vec4<u32>(r, min(r + 1u, used - 1u), min(r + 2u, used - 1u),
                                   min(r + 3u, used - 1u))) * PART_STRIDE;
        let ms = select(vec4<f32>(-3.0e38), vec4<f32>(x[b.x + PART_MAX], x[b.y + PART_MAX],
                                                       x[b.z + PART_MAX], x[b.w + PART_MAX]), live);
        let ls = vec4<f32>(x[b.x + PART_SUM], x[b.y + PART_SUM], x[b.z + PART_SUM],
                           x[b.w + PART_SUM]);
        let os = vec4<f32>(x[b.x + c], x[b.y + c], x[b.z + c], x[b.w + c]);
        let new_mx = max(mx, max(max(ms.x, ms.y), max(ms.z, ms.w)));
        let rescale = exp(mx - new_mx);
        let e = exp(ms - vec4<f32>(new_mx));
        total = total * rescale + dot(e, ls);
        sum = sum * rescale + dot(e, os);
        mx = new_mx;
    }
    return select(sum / total, nan, unseen);
}

@compute @workgroup_size(WG)
fn matmul(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>) {
    let lid = lid3.x;
    let col = lid / LANES;
    let lane = lid % LANES;
    let n = wid.x * ROWS_PER_WG + col;
    let m = wid.y;
    if (ATTENTION_PARTS) {
        merge_attention(m, lid, WG);
        workgroupBarrier();
    }
    // NORM: each column's lanes sum the squares of the x values they multiply (together
    // they touch the row once), so the norm's reduction is the product's own tree.
    var acc = vec3<f32>(0.0);
    if (n < p.N) { acc = lane_dot(m, n, lane); }
    let sums = column_sums(lid, lane, acc);
    if (lane == 0u && n < p.N) {
        var scale = 1.0;
        if (NORM) { scale = inverseSqrt(sums.z / f32(p.K) + p.eps); }
        store_output(m * p.N + n, sums.x * scale, sums.y, scale);
    }
}

// The sums of `acc` (a lane's dot with W's row, with the up row, its x's sum of squares)
// over each column's LANES threads, valid in the column's first lane: a tree of
// workgroup barriers (matmul_quant_subgroups.wgsl replaces it by subgroup shuffles).
fn column_sums(lid: u32, lane: u32, acc: vec3<f32>) -> vec3<f32> {
    partial[lid] = acc.x;
    partial_up[lid] = acc.y;
    squares[lid] = acc.z;
    for (var s = LANES / 2u; s > 0u; s = s / 2u) {
        workgroupBarrier();
        if (lane < s) {
            partial[lid] = partial[lid] + partial[lid + s];
            if (EPILOGUE >= 2u) { partial_up[lid] = partial_up[lid] + partial_up[lid + s]; }
            if (NORM) { squares[lid] = squares[lid] + squares[lid + s]; }
        }
    }
    return vec3<f32>(partial[lid], partial_up[lid], squares[lid]);
}

// y[i] from its finished sum v (already times the norm's `scale`) and, for the GLUs, the
// up row's sum `up` (not yet scaled).
fn store_output(i: u32, v: f32, up: f32, scale: f32) {
    switch EPILOGUE {
        case 1u: { y[i] = res[i] + v; }
        case 2u: { y[i] = v / (1.0 + exp(-v)) * up * scale; }
        case 3u: {
            // GELU's tanh form as v * sigmoid(2u): no tanh of a large argument
            let u = 0.7978845608028654 * (v + 0.044715 * v * v * v);
            y[i] = v / (1.0 + exp(-2.0 * u)) * up * scale;
        }
        default: { y[i] = v; }
    }
}

@compute @workgroup_size(WG)
fn embed(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>) {
    let s = wid.y;
    let k = wid.x * WG + lid3.x;
    if (k >= p.K) { return; }
    let n = u32(ids[s]) - p.first_row;  // wraps above N for ids below first_row
    if (n >= p.N) {
        y[s * p.K + k] = 0.0;
        return;
    }
    let per_block = BLOCK_VALUES;
    let b = n * p.row_bytes + (k / per_block) * BLOCK_BYTES;
    y[s * p.K + k] = dequant(b, k % per_block, scale_d(b), scale_m(b));
}

// ---- matvec: products of a few rows (decoding) -----------------------------------------
// For Q4_K, Q6_K and Q8_0 weights (MATVEC_TYPES in ops/quantized.py). A row of W is
// cut into tasks of 32 values: a Q8_0 block, a 16-byte quarter of a Q4_K group (16 values
// of each of two sub-blocks), or 8 values of each of a Q6_K half's four parts. A workgroup
// takes MV_ROWS rows of W and one row m of x; its MV_THREADS threads split the row's tasks,
// and each thread loads x's 32 values of a task once and multiplies them with all
// MV_ROWS rows (the GLU's up rows too), so that x's loads, several times the weight's
// bytes a row, are shared. (Staging x's tiles in workgroup memory, in the order threads
// read them, made every type slower on the H200: docs/benchmarks-log.md.) Quant words
// become floats by their bits (`fields`), not by conversions, which run at a quarter of
// the rate.
// Q4_K's 144-byte blocks are 16-byte aligned, so a task's quants and its block's scales
// are two 16-byte loads; Q6_K's 210-byte and Q8_0's 34-byte ones only 2-byte, read as
// words joined across alignment. Fusions as `matmul`'s: NORM, EPILOGUE, ATTENTION_PARTS.
// x's values and the sums live in unrolled variables (vec4s, module-scope privates): private
// arrays indexed in loops may live in memory instead of registers.

override MV_THREADS: u32 = 128u;   // a power of two, 32..256
override MV_ROWS: u32 = 4u;        // rows of W a workgroup, 1..MV_MAX_ROWS
const MV_MAX_ROWS: u32 = 8u;
// the sums a workgroup reduces: MV_ROWS products, as many up rows, the squares of x
const MV_MAX_SUMS: u32 = 2u * MV_MAX_ROWS + 1u;

var<workgroup> mv_sums: array<f32, MV_MAX_SUMS>;
var<workgroup> mv_tree: array<f32, 256>;
// x's 32 values of the thread's current task, in the order mv_k gives (times gain for NORM)
var<private> xs0: vec4<f32>;
var<private> xs1: vec4<f32>;
var<private> xs2: vec4<f32>;
var<private> xs3: vec4<f32>;
var<private> xs4: vec4<f32>;
var<private> xs5: vec4<f32>;
var<private> xs6: vec4<f32>;
var<private> xs7: vec4<f32>;
// the sums of xs0 + xs1, xs2 + xs3, xs4 + xs5 and xs6 + xs7 (the `fields` sums' offsets)
var<private> xparts: vec4<f32>;

// Four bit fields as floats 1 + f / 2^n: `shifted` holds each field at bits 23 - n..22
// (n its width: `mask` covers them), which become the mantissa of 1.0. A sum of such
// values times x, less the sum of x, is the fields' sum times x over 2^n: one float
// operation a value (the multiply-add) besides the shift and the mask, where converting
// a field to a float costs two.
fn fields(shifted: vec4<u32>, mask: u32) -> vec4<f32> {
    return bitcast<vec4<f32>>((shifted & vec4<u32>(mask)) | vec4<u32>(0x3f800000u));
}

// The float16 at 2-byte aligned byte i.
fn half_at2(i: u32) -> f32 {
    return unpack2x16float(w[i >> 2u] >> ((i & 2u) * 8u)).x;
}

// The 16 bytes at 2-byte aligned byte i as four words: five words loaded whatever the
// alignment (the fifth clamped to the buffer), so that a subgroup's lanes, whose blocks
// alternate in alignment, take one path.
fn words4_at2(i: u32) -> vec4<u32> {
    let a = i >> 2u;
    let v = vec4<u32>(w[a], w[a + 1u], w[a + 2u], w[a + 3u]);
    let next = vec4<u32>(v.yzw, w[min(a + 4u, arrayLength(&w) - 1u)]);
    return select(v, (v >> vec4<u32>(16u)) | (next << vec4<u32>(16u)), (i & 2u) != 0u);
}

// The 8 bytes at 2-byte aligned byte i as two words (as words4_at2).
fn words2_at2(i: u32) -> vec2<u32> {
    let a = i >> 2u;
    let v = vec3<u32>(w[a], w[a + 1u], w[min(a + 2u, arrayLength(&w) - 1u)]);
    return select(v.xy, (v.xy >> vec2<u32>(16u)) | (v.yz << vec2<u32>(16u)), (i & 2u) != 0u);
}

// k of x's value 4 g (g = 0..7: its quads in the task's order) of task t.
fn mv_k(t: u32, g: u32) -> u32 {
    switch FORMAT {
        case 12u: {
            // Q4_K: group (t % 8) / 2 of 64 values, its 16-value half t % 2: quads 0..3 the
            // low nibbles' values, 4..7 the high ones' (32 further)
            let base = (t >> 3u) * 256u + ((t & 7u) >> 1u) * 64u + (t & 1u) * 16u;
            return base + (g & 3u) * 4u + (g >> 2u) * 32u;
        }
        case 14u: {
            // Q6_K: half (t % 8) / 4, its 8 values from l0 = 8 (t % 4) of each of its four
            // 32-value parts: quads 2 part, 2 part + 1
            let base = (t >> 3u) * 256u + ((t & 7u) >> 2u) * 128u + (t & 3u) * 8u;
            return base + (g >> 1u) * 32u + (g & 1u) * 4u;
        }
        default: { return t * 32u + g * 4u; }   // Q8_0: block t
    }
}

// x's 4 values of quad g of task t, times gain for NORM; `squares` gains theirs.
fn mv_quad(m: u32, t: u32, g: u32, squares: ptr<function, f32>) -> vec4<f32> {
    let k = mv_k(t, g);
    let v = x4(m, k);
    *squares = *squares + dot(v, v);
    return v * gain4(k);
}

// xs0..xs7 for task t of x's row m; the sum of their squares (before gain).
fn mv_load_x(m: u32, t: u32) -> f32 {
    var squares = 0.0;
    xs0 = mv_quad(m, t, 0u, &squares);
    xs1 = mv_quad(m, t, 1u, &squares);
    xs2 = mv_quad(m, t, 2u, &squares);
    xs3 = mv_quad(m, t, 3u, &squares);
    xs4 = mv_quad(m, t, 4u, &squares);
    xs5 = mv_quad(m, t, 5u, &squares);
    xs6 = mv_quad(m, t, 6u, &squares);
    xs7 = mv_quad(m, t, 7u, &squares);
    let one = vec4<f32>(1.0);
    xparts = vec4<f32>(dot(xs0 + xs1, one), dot(xs2 + xs3, one), dot(xs4 + xs5, one),
                       dot(xs6 + xs7, one));
    return squares;
}

// Q6_K's part of a task: its 8 values (words `low`'s nibbles at `shift` and `qh`'s 2-bit
// high parts at 2 part) times x's quads xa, xb (which sum to `x_sum`), times the scale.
fn q6_part(low: vec2<u32>, shift: u32, qh: vec2<u32>, part: u32, scale: f32, xa: vec4<f32>,
           xb: vec4<f32>, x_sum: f32) -> f32 {
    let q = ((low >> vec2<u32>(shift)) & vec2<u32>(0x0f0f0f0fu))
        | (((qh >> vec2<u32>(2u * part)) & vec2<u32>(0x03030303u)) << vec2<u32>(4u));
    // 6-bit fields at bits 8i.. to bits 17..22: 1 + q / 64; sum((q - 32) x) = 64 (sum of
    // those times x) - 96 x_sum
    let fa = fields(vec4<u32>(q.x << 17u, q.x << 9u, q.x << 1u, q.x >> 7u), 0x007e0000u);
    let fb = fields(vec4<u32>(q.y << 17u, q.y << 9u, q.y << 1u, q.y >> 7u), 0x007e0000u);
    return scale * (64.0 * (dot(fa, xa) + dot(fb, xb)) - 96.0 * x_sum);
}

// Q4_K's low (lo) and high nibbles of a quant word as 1 + q / 16 (fields).
fn nibbles_lo16(word: u32) -> vec4<f32> {
    return fields(vec4<u32>(word << 19u, word << 11u, word << 3u, word >> 5u), 0x00780000u);
}

fn nibbles_hi16(word: u32) -> vec4<f32> {
    return fields(vec4<u32>(word << 15u, word << 7u, word >> 1u, word >> 9u), 0x00780000u);
}

// Q8_0's bytes xor 128 (q + 128) as 1 + (q + 128) / 256 (fields).
fn bytes256(word: u32) -> vec4<f32> {
    let u = word ^ 0x80808080u;
    return fields(vec4<u32>(u << 15u, u << 7u, u >> 1u, u >> 9u), 0x007f8000u);
}

// Int8 i of the 8 bytes in `pair` as a float.
fn int8_of(pair: vec2<u32>, i: u32) -> f32 {
    let word = select(pair.x, pair.y, i >= 4u);
    return f32(i32(word << (24u - 8u * (i & 3u))) >> 24u);
}

// Task t of W's row at byte row_base: the sum of its 32 values times xs0..xs7.
fn mv_task(row_base: u32, t: u32) -> f32 {
    switch FORMAT {
        case 12u: {
            // Q4_K: head = (d, dmin), 12 bytes of 6-bit (scale, min) pairs; quarter t % 8
            // of the 128 quant bytes: the low nibbles of sub-block 2 j, the high of 2 j + 1
            let b = (row_base + (t >> 3u) * 144u) >> 4u;
            let head = w_vec[b];
            let q = w_vec[b + 1u + (t & 7u)];
            // (scale, min) of sub-blocks 2j and 2j + 1 as byte pairs: bytes 2j, 2j + 1
            // and 2j + 4, 2j + 5 of the 12 for j < 2; else the low and high nibbles of
            // bytes 2j + 4, 2j + 5 with the top two bits of bytes 2j - 4, 2j - 3 and 2j,
            // 2j + 1 (k_scale_min), both made and one selected: a subgroup's lanes take
            // every j
            let j = (t & 7u) >> 1u;
            let shift = 16u * (j & 1u);
            let w0 = head.y >> shift;
            let w1 = head.z >> shift;
            let w2 = head.w >> shift;
            let low_j = j < 2u;
            let scales = select((w2 & 0x0f0fu) | ((w0 >> 2u) & 0x3030u), w0 & 0x3f3fu, low_j);
            let mins = select(((w2 >> 4u) & 0x0f0fu) | ((w1 >> 2u) & 0x3030u), w1 & 0x3f3fu, low_j);
            let dm = unpack2x16float(head.x);
            // sums of (1 + q / 16) x: the q x sums are 16 (that - x's sum)
            let lo = dot(nibbles_lo16(q.x), xs0) + dot(nibbles_lo16(q.y), xs1)
                + dot(nibbles_lo16(q.z), xs2) + dot(nibbles_lo16(q.w), xs3);
            let hi = dot(nibbles_hi16(q.x), xs4) + dot(nibbles_hi16(q.y), xs5)
                + dot(nibbles_hi16(q.z), xs6) + dot(nibbles_hi16(q.w), xs7);
            let sum_lo = xparts.x + xparts.y;
            let sum_hi = xparts.z + xparts.w;
            let sc = vec2<f32>(f32(scales & 255u), f32(scales >> 8u));
            let mn = vec2<f32>(f32(mins & 255u), f32(mins >> 8u));
            return dm.x * 16.0 * (sc.x * (lo - sum_lo) + sc.y * (hi - sum_hi))
                - dm.y * (mn.x * sum_lo + mn.y * sum_hi);
        }
        case 14u: {
            // Q6_K: 128 bytes of low nibbles (half h: bytes 64 h + l, parts 0 and 2; 64 h +
            // 32 + l, parts 1 and 3), 64 of 2-bit high parts (32 h + l: bits 2 part), 16
            // int8 scales (8 h + 2 part + l / 16), f16 d; w = d * scale * (q - 32)
            let b = row_base + (t >> 3u) * 210u;
            let h = (t & 7u) >> 2u;
            let l0 = (t & 3u) * 8u;
            let ql_a = words2_at2(b + h * 64u + l0);
            let ql_b = words2_at2(b + h * 64u + 32u + l0);
            let qh = words2_at2(b + 128u + h * 32u + l0);
            let scales = words2_at2(b + 192u + h * 8u);
            let d = half_at2(b + 208u);
            let at = l0 >> 4u;   // the parts' scales: bytes 2 part + at
            let total = q6_part(ql_a, 0u, qh, 0u, int8_of(scales, at), xs0, xs1, xparts.x)
                + q6_part(ql_b, 0u, qh, 1u, int8_of(scales, 2u + at), xs2, xs3, xparts.y)
                + q6_part(ql_a, 4u, qh, 2u, int8_of(scales, 4u + at), xs4, xs5, xparts.z)
                + q6_part(ql_b, 4u, qh, 3u, int8_of(scales, 6u + at), xs6, xs7, xparts.w);
            return d * total;
        }
        default: {
            // Q8_0: f16 d, 32 int8; sum(q x) = 256 (sum of (1 + (q + 128) / 256) x) - 384
            // (x's sum)
            let b = row_base + t * 34u;
            let d = half_at2(b);
            let q0 = words4_at2(b + 2u);
            let q1 = words4_at2(b + 18u);
            let s = dot(bytes256(q0.x), xs0) + dot(bytes256(q0.y), xs1)
                + dot(bytes256(q0.z), xs2) + dot(bytes256(q0.w), xs3)
                + dot(bytes256(q1.x), xs4) + dot(bytes256(q1.y), xs5)
                + dot(bytes256(q1.z), xs6) + dot(bytes256(q1.w), xs7);
            return d * (256.0 * s - 384.0 * dot(xparts, vec4<f32>(1.0)));
        }
    }
}

// `v` summed over the workgroup's threads into mv_sums[i], with a tree of barriers
// (matmul_quant_subgroups.wgsl sums within subgroups first). Every thread calls it with
// the same i; the sum is there after mv_sums_ready.
fn mv_sum(lid: u32, v: f32, i: u32) {
    mv_tree[lid] = v;
    for (var s = MV_THREADS / 2u; s > 0u; s = s / 2u) {
        workgroupBarrier();
        if (lid < s) { mv_tree[lid] = mv_tree[lid] + mv_tree[lid + s]; }
    }
    workgroupBarrier();
    if (lid == 0u) { mv_sums[i] = mv_tree[0]; }
    workgroupBarrier();
}

fn mv_sums_ready(lid: u32) {}

// Task t of rows n0 + first .. n0 + first + 3 of W (of its up rows: `up`), those below
// MV_ROWS: four sums. Rows past W repeat its last (not stored).
fn mv_rows4(n0: u32, first: u32, t: u32, up: bool) -> vec4<f32> {
    let offset = select(0u, p.N, up);
    var sums = vec4<f32>(0.0);
    sums.x = mv_task((min(n0 + first, p.N - 1u) + offset) * p.row_bytes, t);
    if (first + 1u < MV_ROWS) { sums.y = mv_task((min(n0 + first + 1u, p.N - 1u) + offset) * p.row_bytes, t); }
    if (first + 2u < MV_ROWS) { sums.z = mv_task((min(n0 + first + 2u, p.N - 1u) + offset) * p.row_bytes, t); }
    if (first + 3u < MV_ROWS) { sums.w = mv_task((min(n0 + first + 3u, p.N - 1u) + offset) * p.row_bytes, t); }
    return sums;
}

@compute @workgroup_size(MV_THREADS)
fn matvec(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>) {
    let lid = lid3.x;
    let m = wid.y;
    let n0 = wid.x * MV_ROWS;
    if (ATTENTION_PARTS) {
        merge_attention(m, lid, MV_THREADS);
        workgroupBarrier();
    }
    let glu = EPILOGUE >= 2u;
    // rows 0..3 and 4..7: the products, the GLU's up rows
    var acc_a = vec4<f32>(0.0);
    var acc_b = vec4<f32>(0.0);
    var up_a = vec4<f32>(0.0);
    var up_b = vec4<f32>(0.0);
    var squares = 0.0;
    for (var t = lid; t < p.K / 32u; t = t + MV_THREADS) {
        squares = squares + mv_load_x(m, t);
        acc_a = acc_a + mv_rows4(n0, 0u, t, false);
        if (MV_ROWS > 4u) { acc_b = acc_b + mv_rows4(n0, 4u, t, false); }
        if (glu) {
            up_a = up_a + mv_rows4(n0, 0u, t, true);
            if (MV_ROWS > 4u) { up_b = up_b + mv_rows4(n0, 4u, t, true); }
        }
    }
    for (var r = 0u; r < MV_ROWS; r = r + 1u) {
        mv_sum(lid, select(acc_b[r & 3u], acc_a[r & 3u], r < 4u), r);
        if (glu) { mv_sum(lid, select(up_b[r & 3u], up_a[r & 3u], r < 4u), MV_MAX_ROWS + r); }
    }
    if (NORM) { mv_sum(lid, squares, 2u * MV_MAX_ROWS); }
    mv_sums_ready(lid);
    if (lid < MV_ROWS && n0 + lid < p.N) {
        var scale = 1.0;
        if (NORM) { scale = inverseSqrt(mv_sums[2u * MV_MAX_ROWS] / f32(p.K) + p.eps); }
        store_output(m * p.N + n0 + lid, mv_sums[lid] * scale, mv_sums[MV_MAX_ROWS + lid], scale);
    }
}

// ---- matmul_tiled: products of many rows (prompts) ---------------------------------------
// `matmul` dequantizes every weight block once per row of x; a prompt of hundreds of rows
// makes that the product's whole cost. Here a workgroup computes a TILE_M x TILE_N tile of
// x @ W^T and dequantizes each block once per TILE_M rows: the register-blocked product
// (matmul_blocked.wgsl) with W's slices dequantized as they go into workgroup memory.
// TILE_X x TILE_Y threads each own one quad (4 rows or 4 columns) along each side, two
// along a 128-wide side: (TILE_M / 4 TILE_Y) x (TILE_N / 4 TILE_X) quads of 4 x 4
// outputs in vec4 accumulators, row quads ty and ty + TILE_Y, column quads tx and
// tx + TILE_X, so that neighbouring threads read neighbouring vec4s of W's slice. Tiles
// of 32 (products too small to give every multiprocessor of a large GPU a 64 x 64 tile)
// take fewer threads rather than fewer outputs a thread: the inner loop keeps its 16
// multiply-adds per two vec4 reads. K advances SLICE values at a time: one block of the
// 32-value formats, an eighth of a K super-block. x's slice (times `gain` for NORM) and
// W's are stored depth-major, so a thread reads its 4 rows or 4 columns at one depth as
// one vec4. The next slice is fetched (and dequantized) into registers before the
// current one is multiplied, so its loads are in flight during the arithmetic; one
// buffer of each tile and two barriers a slice keep a 128 x 128 tile within 32 KiB of
// workgroup memory (D3D12's and lavapipe's limit; tiles of 32 and 64 stay within the
// 16 KiB that browsers guarantee). GLU
// epilogues: the tile's columns are gate and up rows in alternating pairs
// (gate o, o + 1, up o, o + 1), so a thread's vec4 holds both halves of two outputs and
// the tile is TILE_N / 2 outputs wide. NORM: each thread sums the squares of the x values
// it fetches; the rows' totals meet in workgroup memory at the end. Rows, columns and
// depth past the matrices (F32/F16/BF16 rows of any K) load as zeros and are not stored.
// Not for ATTENTION_PARTS.

// 32, 64 or 128 each, but not 32 with 128 (its fetch would need more runs or tasks a
// thread than `fetch` has registers for): ops/quantized.py's TILE_SHAPES.
override TILE_M: u32 = 64u;   // rows of x a workgroup
override TILE_N: u32 = 64u;   // rows of W a workgroup
// Threads along the tile's columns and rows, and the workgroup's: derived here only.
override TILE_X: u32 = min(TILE_N / 4u, 16u);
override TILE_Y: u32 = min(TILE_M / 4u, 16u);
override TILE_WG: u32 = TILE_X * TILE_Y;
// Tiles of consecutive columns a workgroup multiplies one after another (ops/quantized.py:
// more than 1 on CPU drivers). A browser's WebGPU zeroes the workgroup memory an entry
// point reaches as each workgroup starts, and on a CPU driver (SwiftShader under Dawn)
// every group of 4 invocations stores all of it: about a third of a 64 x 64 tile's time
// at K = 576, which a run of tiles shares. (Declared with the other constants: naga
// 29 panics on an override declared after the functions.)
override TILE_RUN: u32 = 1u;
const SLICE: u32 = 32u;       // K values a slice
const NO_ROW: u32 = 0xffffffffu;

// x_tile[x_slot(k, q)]: rows 4q..4q+3 of the slice at depth k; w_tile[w_slot(k, q)]
// likewise the columns (rows of W).
var<workgroup> x_tile: array<vec4<f32>, SLICE * TILE_M / 4u>;
var<workgroup> w_tile: array<vec4<f32>, SLICE * TILE_N / 4u>;

// A depth's quads are stored permuted (q xor a function of the depth): `stash` writes a
// run's 4 values one by one down 4 depths, and the 32 threads of a warp write the same
// row quad at 8 depths (x) or two column quads at 4 (W), which unpermuted fall in the same
// few of the 32 banks; permuted they take all 32. The multiply reads one depth at a time,
// where the permutation only reorders neighbouring quads. (Padding each depth by whole
// vec4s, as the vec4 reads need, cannot spread the stores so.)
fn x_slot(k: u32, q: u32) -> u32 {
    return k * (TILE_M / 4u) + (q ^ ((k / 4u) % 8u));
}

fn w_slot(k: u32, q: u32) -> u32 {
    return k * (TILE_N / 4u) + (q ^ (2u * ((k / 4u) % 4u)));
}

// This thread's state (one invocation's own variables, shared by the helpers below).
var<private> lid: u32;
var<private> tx: u32;
var<private> ty: u32;
var<private> m0: u32;   // the tile's first row of x and first output column
var<private> o0: u32;
// The next slice, fetched ahead (`fetch`): x's runs, W's tasks.
var<private> x_next0: vec4<f32>;
var<private> x_next1: vec4<f32>;
var<private> x_next2: vec4<f32>;
var<private> x_next3: vec4<f32>;
var<private> w_next0: SliceValues;
var<private> w_next1: SliceValues;
var<private> x_squares: vec4<f32>;   // NORM: the squares of x run i's values so far
// acc<r><h>: tile row 4 ty + r (r < 4) or 4 (ty + TILE_Y) + r - 4 (r >= 4), column quad
// tx + TILE_X h. Unrolled variables: private arrays indexed in loops can spill.
var<private> acc00: vec4<f32>;
var<private> acc10: vec4<f32>;
var<private> acc20: vec4<f32>;
var<private> acc30: vec4<f32>;
var<private> acc40: vec4<f32>;
var<private> acc50: vec4<f32>;
var<private> acc60: vec4<f32>;
var<private> acc70: vec4<f32>;
var<private> acc01: vec4<f32>;
var<private> acc11: vec4<f32>;
var<private> acc21: vec4<f32>;
var<private> acc31: vec4<f32>;
var<private> acc41: vec4<f32>;
var<private> acc51: vec4<f32>;
var<private> acc61: vec4<f32>;
var<private> acc71: vec4<f32>;

// Bits `mask` of each of a word's 4 bytes (after shifting the word right by the field's
// place in its byte).
fn byte_fields(word: u32, mask: u32) -> vec4<f32> {
    return vec4<f32>((vec4<u32>(word) >> vec4<u32>(0u, 8u, 16u, 24u)) & vec4<u32>(mask));
}

// Bits 0..3 of a word.
fn bits4(word: u32) -> vec4<f32> {
    return vec4<f32>((vec4<u32>(word) >> vec4<u32>(0u, 1u, 2u, 3u)) & vec4<u32>(1u));
}

// Values 4i..4i+3 (lo) and 16+4i..16+4i+3 (hi) of a slice: one quant word holds both
// runs in the 4- and 5-bit formats (low and high nibbles), so every format's task takes
// this pair.
struct SliceValues {
    lo: vec4<f32>,
    hi: vec4<f32>,
}

fn int8_at(i: u32) -> f32 {
    return f32(i32(byte_at(i) << 24u) >> 24u);
}

// Value k of the weight row at byte row_base, given its block's scale terms (0 past K).
fn value_at(row_base: u32, k: u32, d: f32, m: f32) -> f32 {
    if (k >= p.K) { return 0.0; }
    return dequant(row_base + (k / BLOCK_VALUES) * BLOCK_BYTES, k % BLOCK_VALUES, d, m);
}

// SliceValues of the slice of values k0..k0+31 of the weight row at byte row_base: whole
// quant words at a time where the layout allows (each case's layout as in `dequant`),
// else value by value.
fn slice_values(row_base: u32, k0: u32, i: u32) -> SliceValues {
    let b = row_base + (k0 / BLOCK_VALUES) * BLOCK_BYTES;  // the slice's block
    let sub = (k0 % BLOCK_VALUES) / SLICE;                 // K formats: its sub-block
    switch FORMAT {
        case 2u, 3u: {
            let dm = block_scales(b);
            let word = quant_word(b, i);
            if (FORMAT == 3u) {
                return SliceValues(dm.x * nibbles_lo(word) + dm.y, dm.x * nibbles_hi(word) + dm.y);
            }
            return SliceValues(dm.x * (nibbles_lo(word) - 8.0), dm.x * (nibbles_hi(word) - 8.0));
        }
        case 8u: {
            let d = half_at(b);
            return SliceValues(d * int8s(quant_word(b, i)), d * int8s(quant_word(b, i + 4u)));
        }
        case 6u, 7u: {
            // Q5_0 / Q5_1: Q4's nibbles plus a fifth bit, bit j of a word for value j.
            let q5_1 = FORMAT == 7u;
            var dm = vec2<f32>(half_at(b), 0.0);
            if (q5_1) { dm = unpack2x16float(word_at(b)); }
            let fifths = word_at(b + select(2u, 4u, q5_1));
            let word = word_at(b + select(6u, 8u, q5_1) + 4u * i);
            let lo = nibbles_lo(word) + 16.0 * bits4(fifths >> (4u * i));
            let hi = nibbles_hi(word) + 16.0 * bits4(fifths >> (16u + 4u * i));
            if (q5_1) { return SliceValues(dm.x * lo + dm.y, dm.x * hi + dm.y); }
            return SliceValues(dm.x * (lo - 16.0), dm.x * (hi - 16.0));
        }
        case 12u, 13u: {
            // Q4_K / Q5_K: sub-block `sub` takes the low (even sub) or high (odd) nibbles of
            // 32 bytes; Q5_K's fifth bits are bit `sub` of 32 bytes after the scales.
            let dm = unpack2x16float(word_at(b));
            let sm = vec2<f32>(k_scale_min(b, sub));
            let scale = dm.x * sm.x;
            let low = dm.y * sm.y;
            let q5 = FORMAT == 13u;
            let at = b + select(16u, 48u, q5) + (sub >> 1u) * 32u + 4u * i;
            let shift = (sub & 1u) * 4u;
            var lo = byte_fields(word_at(at) >> shift, 15u);
            var hi = byte_fields(word_at(at + 16u) >> shift, 15u);
            if (q5) {
                lo = lo + 16.0 * byte_fields(word_at(b + 16u + 4u * i) >> sub, 1u);
                hi = hi + 16.0 * byte_fields(word_at(b + 32u + 4u * i) >> sub, 1u);
            }
            return SliceValues(scale * lo - low, scale * hi - low);
        }
        case 14u: {
            // Q6_K: sub-block `sub` is part (sub & 3) of half (sub >> 2); a scale per 16.
            let d = half_at(b + 208u);
            let part = sub & 3u;
            let low_at = b + (sub >> 2u) * 64u + (part & 1u) * 32u + 4u * i;
            let high_at = b + 128u + (sub >> 2u) * 32u + 4u * i;
            let low_shift = (part >> 1u) * 4u;
            let scales = b + 192u + (sub >> 2u) * 8u + part * 2u;
            let lo = byte_fields(word_at(low_at) >> low_shift, 15u)
                + 16.0 * byte_fields(word_at(high_at) >> (part * 2u), 3u);
            let hi = byte_fields(word_at(low_at + 16u) >> low_shift, 15u)
                + 16.0 * byte_fields(word_at(high_at + 16u) >> (part * 2u), 3u);
            return SliceValues(d * int8_at(scales) * (lo - 32.0),
                               d * int8_at(scales + 1u) * (hi - 32.0));
        }
        default: {
            // F32, F16, BF16 (blocks of one value, rows of any K), Q2_K, Q3_K.
            let d = scale_d(b);
            let m = scale_m(b);
            var v = SliceValues(vec4<f32>(0.0), vec4<f32>(0.0));
            for (var c = 0u; c < 4u; c = c + 1u) {
                v.lo[c] = value_at(row_base, k0 + 4u * i + c, d, m);
                v.hi[c] = value_at(row_base, k0 + 16u + 4u * i + c, d, m);
            }
            return v;
        }
    }
}

// The row of W in tile column c, NO_ROW past the matrix.
fn weight_row(c: u32) -> u32 {
    if (EPILOGUE >= 2u) {
        // column pairs alternate gate, up: 4q, 4q + 1 gate rows o, o + 1; 4q + 2, 4q + 3
        // their up rows
        let o = o0 + (c / 4u) * 2u + (c & 1u);
        if (o >= p.N) { return NO_ROW; }
        return o + select(0u, p.N, (c & 2u) != 0u);
    }
    let n = o0 + c;
    return select(NO_ROW, n, n < p.N);
}

// x[m][k..k+3] (zeros past M or K).
fn x_run(m: u32, k: u32) -> vec4<f32> {
    if (m >= p.M) { return vec4<f32>(0.0); }
    let i = m * p.K + k;
    if (k + 3u < p.K) { return vec4<f32>(x[i], x[i + 1u], x[i + 2u], x[i + 3u]); }
    let last = m * p.K + p.K - 1u;   // the end of a row of any K
    let v = vec4<f32>(x[min(i, last)], x[min(i + 1u, last)], x[min(i + 2u, last)],
                      x[min(i + 3u, last)]);
    return select(vec4<f32>(0.0), v, vec4<u32>(k) + vec4<u32>(0u, 1u, 2u, 3u) < vec4<u32>(p.K));
}

fn gain_run(k: u32) -> vec4<f32> {
    if (!NORM) { return vec4<f32>(1.0); }
    let last = p.K - 1u;  // past K x is 0: any gain will do
    let at = min(vec4<u32>(k) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(last));
    return vec4<f32>(gain[at.x >> 2u][at.x & 3u], gain[at.y >> 2u][at.y & 3u],
                     gain[at.z >> 2u][at.z & 3u], gain[at.w >> 2u][at.w & 3u]);
}

// x runs and W tasks a thread fetches a slice: 2 or 4, and 1 or 2.
fn x_runs() -> u32 { return 8u * TILE_M / TILE_WG; }
fn w_tasks() -> u32 { return 4u * TILE_N / TILE_WG; }

// Slice k0.. into registers. x: run i (i < x_runs()) of a thread is row
// lid / 8 + (TILE_WG / 8) i at depth 4 (lid % 8): eight threads read a row's 32 values in
// one stretch. W: task j (j < w_tasks()) is tile column (lid + TILE_WG j) / 4, its values
// 4i..4i+3 and 16+4i..16+4i+3 for i = lid % 4: four threads read one block's quant words.
// Each run and task is a call of its own, not a loop: registers, not an indexed array.
fn fetch(k0: u32) {
    let k = k0 + 4u * (lid % 8u);
    let g = gain_run(k);
    x_next0 = fetch_x(0u, k, g);
    x_next1 = fetch_x(1u, k, g);
    if (x_runs() == 4u) {
        x_next2 = fetch_x(2u, k, g);
        x_next3 = fetch_x(3u, k, g);
    }
    w_next0 = fetch_w(0u, k0);
    if (w_tasks() == 2u) { w_next1 = fetch_w(1u, k0); }
}

fn x_row(i: u32) -> u32 {
    return lid / 8u + (TILE_WG / 8u) * i;
}

fn fetch_x(i: u32, k: u32, g: vec4<f32>) -> vec4<f32> {
    let v = x_run(m0 + x_row(i), k);
    if (NORM) { x_squares[i] = x_squares[i] + dot(v, v); }
    return v * g;
}

fn fetch_w(j: u32, k0: u32) -> SliceValues {
    let task = lid + TILE_WG * j;
    let row = weight_row(task / 4u);
    if (row == NO_ROW) { return SliceValues(vec4<f32>(0.0), vec4<f32>(0.0)); }
    return slice_values(row * p.row_bytes, k0, task % 4u);
}

// A run of 4 values along K (depths k..k+3, k a multiple of 4) of tile row r or tile
// column c into its tile.
fn put_x(k: u32, r: u32, v: vec4<f32>) {
    let q = r / 4u;
    x_tile[x_slot(k, q)][r % 4u] = v.x;
    x_tile[x_slot(k + 1u, q)][r % 4u] = v.y;
    x_tile[x_slot(k + 2u, q)][r % 4u] = v.z;
    x_tile[x_slot(k + 3u, q)][r % 4u] = v.w;
}

fn put_w(k: u32, c: u32, v: vec4<f32>) {
    let q = c / 4u;
    w_tile[w_slot(k, q)][c % 4u] = v.x;
    w_tile[w_slot(k + 1u, q)][c % 4u] = v.y;
    w_tile[w_slot(k + 2u, q)][c % 4u] = v.z;
    w_tile[w_slot(k + 3u, q)][c % 4u] = v.w;
}

fn stash_w(j: u32, v: SliceValues) {
    let task = lid + TILE_WG * j;
    put_w(4u * (task % 4u), task / 4u, v.lo);
    put_w(16u + 4u * (task % 4u), task / 4u, v.hi);
}

fn stash() {
    let k = 4u * (lid % 8u);
    put_x(k, x_row(0u), x_next0);
    put_x(k, x_row(1u), x_next1);
    if (x_runs() == 4u) {
        put_x(k, x_row(2u), x_next2);
        put_x(k, x_row(3u), x_next3);
    }
    stash_w(0u, w_next0);
    if (w_tasks() == 2u) { stash_w(1u, w_next1); }
}

fn multiply() {
    for (var k = 0u; k < SLICE; k = k + 1u) {
        let a = x_tile[x_slot(k, ty)];
        let b = w_tile[w_slot(k, tx)];
        acc00 = fma(vec4<f32>(a.x), b, acc00);
        acc10 = fma(vec4<f32>(a.y), b, acc10);
        acc20 = fma(vec4<f32>(a.z), b, acc20);
        acc30 = fma(vec4<f32>(a.w), b, acc30);
        var b_hi = vec4<f32>(0.0);
        if (TILE_N == 128u) {
            b_hi = w_tile[w_slot(k, tx + TILE_X)];
            acc01 = fma(vec4<f32>(a.x), b_hi, acc01);
            acc11 = fma(vec4<f32>(a.y), b_hi, acc11);
            acc21 = fma(vec4<f32>(a.z), b_hi, acc21);
            acc31 = fma(vec4<f32>(a.w), b_hi, acc31);
        }
        if (TILE_M == 128u) {
            let a_hi = x_tile[x_slot(k, ty + TILE_Y)];
            acc40 = fma(vec4<f32>(a_hi.x), b, acc40);
            acc50 = fma(vec4<f32>(a_hi.y), b, acc50);
            acc60 = fma(vec4<f32>(a_hi.z), b, acc60);
            acc70 = fma(vec4<f32>(a_hi.w), b, acc70);
            if (TILE_N == 128u) {
                acc41 = fma(vec4<f32>(a_hi.x), b_hi, acc41);
                acc51 = fma(vec4<f32>(a_hi.y), b_hi, acc51);
                acc61 = fma(vec4<f32>(a_hi.z), b_hi, acc61);
                acc71 = fma(vec4<f32>(a_hi.w), b_hi, acc71);
            }
        }
    }
}

// Output row m's part in column quad q: 4 outputs, or for the GLUs 2 (gate, gate, up, up).
fn store_quad(m: u32, q: u32, v: vec4<f32>, scale: f32) {
    if (EPILOGUE >= 2u) {
        let o = o0 + 2u * q;
        if (o < p.N) { store_output(m * p.N + o, v.x * scale, v.z, scale); }
        if (o + 1u < p.N) { store_output(m * p.N + o + 1u, v.y * scale, v.w, scale); }
        return;
    }
    let n = o0 + 4u * q;
    for (var c = 0u; c < 4u; c = c + 1u) {
        if (n + c < p.N) { store_output(m * p.N + n + c, v[c] * scale, 0.0, scale); }
    }
}

fn store_row(r: u32, lo: vec4<f32>, hi: vec4<f32>, scale: f32) {
    let m = m0 + r;
    if (m >= p.M) { return; }
    store_quad(m, tx, lo, scale);
    if (TILE_N == 128u) { store_quad(m, tx + TILE_X, hi, scale); }
}

fn finish() {
    // 1 / rms of rows 4 ty..4 ty + 3 and 4 (ty + TILE_Y)..
    var scale_lo = vec4<f32>(1.0);
    var scale_hi = vec4<f32>(1.0);
    if (NORM) {
        // The last multiply is done: x_tile takes each run's sum of squares at (depth
        // lid % 8, its row); a row's 8 depths add up to its total.
        workgroupBarrier();
        for (var i = 0u; i < x_runs(); i = i + 1u) {
            let r = x_row(i);
            x_tile[x_slot(lid % 8u, r / 4u)][r % 4u] = x_squares[i];
        }
        workgroupBarrier();
        var sum_lo = vec4<f32>(0.0);
        var sum_hi = vec4<f32>(0.0);
        for (var k = 0u; k < 8u; k = k + 1u) {
            sum_lo = sum_lo + x_tile[x_slot(k, ty)];
            if (TILE_M == 128u) { sum_hi = sum_hi + x_tile[x_slot(k, ty + TILE_Y)]; }
        }
        scale_lo = inverseSqrt(sum_lo / f32(p.K) + vec4<f32>(p.eps));
        scale_hi = inverseSqrt(sum_hi / f32(p.K) + vec4<f32>(p.eps));
    }
    let r = 4u * ty;
    store_row(r, acc00, acc01, scale_lo.x);
    store_row(r + 1u, acc10, acc11, scale_lo.y);
    store_row(r + 2u, acc20, acc21, scale_lo.z);
    store_row(r + 3u, acc30, acc31, scale_lo.w);
    if (TILE_M == 128u) {
        let r_hi = 4u * (ty + TILE_Y);
        store_row(r_hi, acc40, acc41, scale_hi.x);
        store_row(r_hi + 1u, acc50, acc51, scale_hi.y);
        store_row(r_hi + 2u, acc60, acc61, scale_hi.z);
        store_row(r_hi + 3u, acc70, acc71, scale_hi.w);
    }
}

@compute @workgroup_size(TILE_WG)
fn matmul_tiled(@builtin(workgroup_id) wid: vec3<u32>,
                @builtin(local_invocation_id) lid3: vec3<u32>) {
    lid = lid3.x;
    tx = lid % TILE_X;
    ty = lid / TILE_X;
    m0 = wid.y * TILE_M;
    for (var t = 0u; t < TILE_RUN; t = t + 1u) {
        let first = (wid.x * TILE_RUN + t) * select(TILE_N, TILE_N / 2u, EPILOGUE >= 2u);
        if (first >= p.N) { break; }
        o0 = first;
        multiply_tile();
    }
}

// The tile at rows m0.. and output columns o0.. of y.
fn multiply_tile() {
    clear_tile();
    fetch(0u);
    for (var k0 = 0u; k0 < p.K; k0 = k0 + SLICE) {
        workgroupBarrier();   // the previous slice's multiply (tile's finish) is done with the tiles
        stash();
        workgroupBarrier();
        if (k0 + SLICE < p.K) { fetch(k0 + SLICE); }
        multiply();
    }
    finish();
}

fn clear_tile() {
    x_squares = vec4<f32>(0.0);
    acc00 = vec4<f32>(0.0);
    acc10 = vec4<f32>(0.0);
    acc20 = vec4<f32>(0.0);
    acc30 = vec4<f32>(0.0);
    acc40 = vec4<f32>(0.0);
    acc50 = vec4<f32>(0.0);
    acc60 = vec4<f32>(0.0);
    acc70 = vec4<f32>(0.0);
    acc01 = vec4<f32>(0.0);
    acc11 = vec4<f32>(0.0);
    acc21 = vec4<f32>(0.0);
    acc31 = vec4<f32>(0.0);
    acc41 = vec4<f32>(0.0);
    acc51 = vec4<f32>(0.0);
    acc61 = vec4<f32>(0.0);
    acc71 = vec4<f32>(0.0);
}
