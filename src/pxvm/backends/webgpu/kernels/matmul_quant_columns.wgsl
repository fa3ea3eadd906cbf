// extends matmul_quant.wgsl
// matmul_quant.wgsl's products of one thread a column (LANES 1) reading x from its buffer,
// for CPU drivers: `matmul_columns` below (ops/quantized.py chooses it there; products
// that merge attention's partial results, ATTENTION_PARTS, take matmul_quant.wgsl's
// `matmul`). It reaches no workgroup memory: a WebGPU implementation that zeroes the
// workgroup variables an entry point reaches (Dawn, in browsers) does it as each
// workgroup starts, and SwiftShader has every 4 invocations store all of it and then wait
// as at a barrier, which makes a kernel without barriers run its invocations as
// coroutines (BENCHMARKS.md, issue 40).

fn x_at(m: u32, k: u32) -> f32 {
    return x[m * p.K + k];
}

fn x4(m: u32, k: u32) -> vec4<f32> {
    return x_vec[(m * p.K + k) >> 2u];
}

// One lane a column: its sums are the lane's own.
fn column_sums(lid: u32, lane: u32, acc: vec3<f32>) -> vec3<f32> {
    return acc;
}

// Not for ATTENTION_PARTS (see above): nothing to merge.
fn merge_attention(m: u32, lid: u32, threads: u32) {}

// ---- matmul_columns: COLUMNS output columns a thread -------------------------------------
// ops/quantized.py dispatches this entry point, not `matmul`: for the 32-value formats a
// thread multiplies x's row with COLUMNS rows of W, loading each of x's values once for
// all of them (the other formats: a column at a time, as `matmul`). A browser's WebGPU
// bounds-checks every load, and SwiftShader computes each check's array length with a
// division: loads, not arithmetic, set these products' speed there. Each column's sums
// are `matmul`'s with one lane, term for term in the same order.
const COLUMNS: u32 = 4u;
const COLUMN_THREADS: u32 = WG / COLUMNS;   // a workgroup's WG columns, as `matmul`'s

@compute @workgroup_size(COLUMN_THREADS)
fn matmul_columns(@builtin(workgroup_id) wid: vec3<u32>,
                  @builtin(local_invocation_id) lid3: vec3<u32>) {
    let first = (wid.x * COLUMN_THREADS + lid3.x) * COLUMNS;
    let m = wid.y;
    if (first >= p.N) { return; }
    if (FORMAT != 2u && FORMAT != 3u && FORMAT != 8u) {
        for (var n = first; n < min(first + COLUMNS, p.N); n = n + 1u) {
            store_column(m, n, lane_dot(m, n, 0u));
        }
        return;
    }
    let sums = columns_dot_blocks32(m, first);
    for (var c = 0u; c < COLUMNS; c = c + 1u) {
        if (first + c < p.N) { store_column(m, first + c, vec3<f32>(sums.gate[c], sums.up[c], sums.squares)); }
    }
}

// `matmul`'s output of column n from its sums (the product, the up row's, x's squares).
fn store_column(m: u32, n: u32, sums: vec3<f32>) {
    var scale = 1.0;
    if (NORM) { scale = inverseSqrt(sums.z / f32(p.K) + p.eps); }
    store_output(m * p.N + n, sums.x * scale, sums.y, scale);
}

struct ColumnSums {
    gate: vec4<f32>,   // the products with rows first.. of W (or the only rows)
    up: vec4<f32>,     // the GLU's up rows'
    squares: f32,      // x's sum of squares
}

// lane_dot_blocks32 of one lane for columns first..first + 3 at once (columns past N
// repeat the last row; they are not stored).
fn columns_dot_blocks32(m: u32, first: u32) -> ColumnSums {
    let n_blocks = p.K / 32u;
    let words = select(4u, 8u, FORMAT == 8u);   // quant words per block
    let last = p.N - 1u;
    let rows = min(vec4<u32>(first) + vec4<u32>(0u, 1u, 2u, 3u), vec4<u32>(last)) * p.row_bytes;
    let ups = rows + vec4<u32>(p.N * p.row_bytes);
    let both = EPILOGUE >= 2u;
    var out = ColumnSums(vec4<f32>(0.0), vec4<f32>(0.0), 0.0);
    for (var blk = 0u; blk < n_blocks; blk = blk + 1u) {
        let b = rows + vec4<u32>(blk * BLOCK_BYTES);
        let bu = ups + vec4<u32>(blk * BLOCK_BYTES);
        let k0 = blk * 32u;
        var qx = vec4<f32>(0.0);
        var qu = vec4<f32>(0.0);
        var xs = 0.0;
        for (var i = 0u; i < words; i = i + 1u) {
            let hi = select(16u, 0u, FORMAT == 8u) + 4u * i;
            let ra = x4(m, k0 + 4u * i);
            var rb = vec4<f32>(0.0);
            if (FORMAT != 8u) { rb = x4(m, k0 + hi); }
            out.squares = out.squares + dot(ra, ra) + dot(rb, rb);
            let xa = ra * gain4(k0 + 4u * i);
            let xb = rb * gain4(k0 + hi);
            qx = qx + words_dot(b, i, xa, xb);
            if (both) { qu = qu + words_dot(bu, i, xa, xb); }
            xs = xs + dot(xa + xb, vec4<f32>(1.0));
        }
        let s = scales4(b);
        out.gate = out.gate + s[0] * qx;
        if (FORMAT == 3u) { out.gate = out.gate + s[1] * xs; }
        if (both) {
            let su = scales4(bu);
            out.up = out.up + su[0] * qu;
            if (FORMAT == 3u) { out.up = out.up + su[1] * xs; }
        }
    }
    return out;
}

// word_dot of quant word i of the blocks at bytes b.x..b.w.
fn words_dot(b: vec4<u32>, i: u32, xa: vec4<f32>, xb: vec4<f32>) -> vec4<f32> {
    return vec4<f32>(word_dot(quant_word(b.x, i), xa, xb), word_dot(quant_word(b.y, i), xa, xb),
                     word_dot(quant_word(b.z, i), xa, xb), word_dot(quant_word(b.w, i), xa, xb));
}

// The blocks' scale terms: d of each, then m of each.
fn scales4(b: vec4<u32>) -> array<vec4<f32>, 2> {
    let s0 = block_scales(b.x);
    let s1 = block_scales(b.y);
    let s2 = block_scales(b.z);
    let s3 = block_scales(b.w);
    return array<vec4<f32>, 2>(vec4<f32>(s0.x, s1.x, s2.x, s3.x), vec4<f32>(s0.y, s1.y, s2.y, s3.y));
}
