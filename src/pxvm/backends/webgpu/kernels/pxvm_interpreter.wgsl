// The pxVM GPU interpreter (Pixel Protocol v1.2, docs/pixel-protocol.md).
// The image is uploaded as it is: one RGBA pixel = one u32 word (R in the low byte).
// The host validates and decodes the instruction row once and records one dispatch per
// instruction into a single submit, so instruction sequencing is dispatch order; each
// opcode's data-parallel work spreads over many threads. Integer arithmetic is exact
// (u32/i32 wrapping), so results are byte-identical to the CPU executor.

const WG: u32 = 256u;

struct Params {
    width: u32,
    r0: u32,    // first row argument (or matrix A / int32 matrix row)
    r1: u32,    // second (matrix B / bias / params / output row)
    r2: u32,    // third (result row)
    m: u32,     // rows of the result
    k: u32,     // inner dimension
    n: u32,     // columns of the result
    mult: u32,  // REQUANT multiplier
    shift: u32, // REQUANT shift
    zp: i32,    // REQUANT zero point
}

@group(0) @binding(0) var<storage, read_write> img: array<u32>;
@group(0) @binding(1) var<uniform> p: Params;

var<workgroup> red: array<u32, WG>;

fn px(x: u32, y: u32) -> u32 {
    return img[y * p.width + x];
}

// Word index of element `i` of the matrix whose header is at row `row`.
fn elem(row: u32, i: u32) -> u32 {
    let stride = p.width - 1u;
    return (row + i / stride) * p.width + 1u + i % stride;
}

fn r_u8(w: u32) -> u32 { return w & 0xffu; }
fn r_i8(w: u32) -> i32 { return (bitcast<i32>(w << 24u)) >> 24u; }

fn set_r(index: u32, v: u32) {
    img[index] = (img[index] & 0xffffff00u) | (v & 0xffu);
}

fn write_header(row: u32, rows: u32, cols: u32) {
    img[row * p.width] = (cols & 0xffu) | ((cols >> 8u) << 8u) | ((rows & 0xffu) << 16u) | ((rows >> 8u) << 24u);
}

fn thread_index(wid: vec3<u32>, lid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return (wid.y * nwg.x + wid.x) * WG + lid.x;
}

// v1.0 vector length: the first column where both rows' pixels are all zero.
// One workgroup: each thread finds its first such column, then a min-reduction.
fn vector_length(lid: u32, ra: u32, rb: u32) -> u32 {
    var first = p.width;
    for (var x = lid; x < p.width; x = x + WG) {
        if (px(x, ra) == 0u && px(x, rb) == 0u) {
            first = x;
            break;
        }
    }
    red[lid] = first;
    for (var s = WG / 2u; s > 0u; s = s / 2u) {
        workgroupBarrier();
        if (lid < s) { red[lid] = min(red[lid], red[lid + s]); }
    }
    workgroupBarrier();
    let n = red[0];
    workgroupBarrier();
    return n;
}

// OP_DOT_RGB: sum of R products in u32 (wrapping), low 16 bits into pixel (0, r2) R and G.
@compute @workgroup_size(WG)
fn dot(@builtin(local_invocation_id) lid3: vec3<u32>) {
    let lid = lid3.x;
    let n = vector_length(lid, p.r0, p.r1);
    var acc = 0u;
    for (var x = lid; x < n; x = x + WG) {
        acc = acc + r_u8(px(x, p.r0)) * r_u8(px(x, p.r1));
    }
    red[lid] = acc;
    for (var s = WG / 2u; s > 0u; s = s / 2u) {
        workgroupBarrier();
        if (lid < s) { red[lid] = red[lid] + red[lid + s]; }
    }
    workgroupBarrier();
    if (lid == 0u) {
        let i = p.r2 * p.width;
        img[i] = (img[i] & 0xffff0000u) | (red[0] & 0xffffu);
    }
}

// OP_ADD: R of row r2 = min(R(a) + R(b), 255) over the vector length.
@compute @workgroup_size(WG)
fn add(@builtin(local_invocation_id) lid3: vec3<u32>) {
    let lid = lid3.x;
    let n = vector_length(lid, p.r0, p.r1);
    // All reads of the length scan happen before any write (the barrier inside).
    for (var x = lid; x < n; x = x + WG) {
        let s = min(r_u8(px(x, p.r0)) + r_u8(px(x, p.r1)), 255u);
        set_r(p.r2 * p.width + x, s);
    }
}

// OP_MATMUL (SIGNED = false: u8 data, result min(sum, 255) in R) and OP_MATMUL_I8
// (SIGNED = true: int8 data, int32 result in all four channels). One thread per element.
override SIGNED: bool = false;

@compute @workgroup_size(WG)
fn matmul(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
          @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = thread_index(wid, lid, nwg);
    if (t == 0u) { write_header(p.r2, p.m, p.n); }
    if (t >= p.m * p.n) { return; }
    let row = t / p.n;
    let col = t % p.n;
    // Walk both operands by word index instead of calling elem() per step: it saves two
    // integer divisions per multiply-add. A advances one element (one column, wrapping to
    // column 1 of the next row); B advances n elements = whole rows plus a remainder.
    let stride = p.width - 1u;
    let a0 = row * p.k;
    var ay = p.r0 + a0 / stride;
    var ax = 1u + a0 % stride;
    var by = p.r1 + col / stride;
    var bx = 1u + col % stride;
    let b_rows = p.n / stride;
    let b_cols = p.n % stride;
    var acc_s = 0i;
    var acc_u = 0u;
    for (var kk = 0u; kk < p.k; kk = kk + 1u) {
        let wa = img[ay * p.width + ax];
        let wb = img[by * p.width + bx];
        if (SIGNED) {
            acc_s = acc_s + r_i8(wa) * r_i8(wb);
        } else {
            acc_u = acc_u + r_u8(wa) * r_u8(wb);
        }
        ax = ax + 1u;
        if (ax == p.width) { ax = 1u; ay = ay + 1u; }
        by = by + b_rows;
        bx = bx + b_cols;
        if (bx >= p.width) { bx = bx - stride; by = by + 1u; }
    }
    if (SIGNED) {
        img[elem(p.r2, t)] = bitcast<u32>(acc_s);
    } else {
        set_r(elem(p.r2, t), min(acc_u, 255u));
    }
}

// OP_BIAS_I32: int32 matrix at r0 += bias (int32, one per column) at r1, wrapping.
@compute @workgroup_size(WG)
fn bias(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = thread_index(wid, lid, nwg);
    if (t >= p.m * p.n) { return; }
    let i = elem(p.r0, t);
    img[i] = bitcast<u32>(bitcast<i32>(img[i]) + bitcast<i32>(img[elem(p.r1, t % p.n)]));
}

// round_half_away(|v| * mult / 2^shift) in 64-bit arithmetic built from u32 halves,
// saturated to 2^31 (anything that large saturates int8 anyway).
fn scaled_magnitude(v: u32, mult: u32, shift: u32) -> u32 {
    // |v| * mult = hi16 * mult * 2^16 + lo16 * mult, each partial product < 2^32.
    let lo_prod = (v & 0xffffu) * mult;
    let hi_prod = (v >> 16u) * mult;
    var lo = lo_prod + (hi_prod << 16u);
    var hi = (hi_prod >> 16u) + select(0u, 1u, lo < lo_prod);
    if (shift > 0u) {
        let half = 1u << (shift - 1u);
        let before = lo;
        lo = lo + half;
        hi = hi + select(0u, 1u, lo < before);
        if (shift >= 32u) {
            lo = hi >> (shift - 32u);
            hi = 0u;
        } else {
            lo = (lo >> shift) | (hi << (32u - shift));
            hi = hi >> shift;
        }
    }
    if (hi != 0u || lo > 0x80000000u) { return 0x80000000u; }
    return lo;
}

// OP_REQUANT: int8 out = clamp(sign(c) * scaled(|c|) + zp, -128, 127) into R.
@compute @workgroup_size(WG)
fn requant(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
           @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = thread_index(wid, lid, nwg);
    if (t == 0u) { write_header(p.r2, p.m, p.n); }
    if (t >= p.m * p.n) { return; }
    let c = bitcast<i32>(img[elem(p.r0, t)]);
    // abs(-2^31) stays -2^31, whose bits read as u32 are 2^31: the true magnitude.
    let mag = scaled_magnitude(bitcast<u32>(abs(c)), p.mult, p.shift);
    var v: i32;
    if (mag >= 0x80000000u) {
        v = select(-2147483647 - 1, 2147483647, c >= 0);
    } else {
        v = select(-i32(mag), i32(mag), c >= 0);
    }
    let q = clamp(v, -128 - p.zp, 127 - p.zp) + p.zp;  // saturating add of the zero point
    set_r(elem(p.r2, t), bitcast<u32>(q));
}

// OP_RELU_I8: in place, int8 x = max(x, 0).
@compute @workgroup_size(WG)
fn relu_i8(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
           @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = thread_index(wid, lid, nwg);
    if (t >= p.m * p.n) { return; }
    let i = elem(p.r0, t);
    set_r(i, bitcast<u32>(max(r_i8(img[i]), 0i)));
}

// OP_ARGMAX_I32: first index of each row's maximum, as u16 in R and G of the result.
@compute @workgroup_size(WG)
fn argmax(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
          @builtin(num_workgroups) nwg: vec3<u32>) {
    let t = thread_index(wid, lid, nwg);
    if (t == 0u) { write_header(p.r1, p.m, 1u); }
    if (t >= p.m) { return; }
    var best = bitcast<i32>(img[elem(p.r0, t * p.n)]);
    var best_i = 0u;
    for (var j = 1u; j < p.n; j = j + 1u) {
        let v = bitcast<i32>(img[elem(p.r0, t * p.n + j)]);
        if (v > best) {
            best = v;
            best_i = j;
        }
    }
    let i = elem(p.r1, t);
    img[i] = (img[i] & 0xffff0000u) | (best_i & 0xffffu);
}
