// Causal attention of a prompt's many new tokens over a KV cache, tiled as flash
// attention is: attention_cached's prompt path (ops/transformer.py picks it), with
// attention_cached.wgsl's semantics. qkv (S, (Hq + 2 Hkv) D) holds each new token's query
// heads, key heads and value heads; the tokens sit at positions pos .. pos + S - 1, where
// pos = state[1] is read on the GPU, so one recording serves every position. Caches are
// (n_ctx, Hkv, D), position j in row j (no rings: those take attention_cached.wgsl).
// `append`: one thread per element writes the S tokens' rotated keys and their values
// into the caches at rows pos + i. It is a dispatch of its own, before `tiled`, so that
// `tiled` reads every key from the cache (dispatches of one pass see earlier ones' writes).
// `tiled`: workgroup (b, h) takes a block of QUERY_ROWS tokens of query head h and
// walks the keys they see in tiles of TILE_KEYS keys through workgroup memory, so a key
// is loaded once for all the block's tokens rather than once per token. Per tile:
//   1. the keys into `kv_tile` (loaded a phase earlier: each thread holds its share of
//      the next tile in registers while the arithmetic runs);
//   2. scores = Q K^T, each thread two rows by two keys (of a part of the head when the
//      block has fewer such pairs than threads);
//   3. the online softmax, ROW_THREADS threads a row: the tile's max joins the row's,
//      earlier sums are rescaled, the tile's weights replace its scores; meanwhile the
//      values go into `kv_tile`;
//   4. each thread's output quads: rescaled, plus the weighted values.
// Tiles beyond every token of the block are never visited; inside the tiles, keys a
// token may not see (later ones, or older than its window) weigh 0. The output is
// normalised at the end: no partial results, no merge pass.
// Tokens at or beyond max_keys (the bound the work was recorded for) get NaN, as in
// attention_cached.wgsl.
// NEOX = false rotates pairs (2c, 2c+1) (GGUF llama), true rotates (c, c + D/2).
// F16_CACHE: the caches hold float16 values, two a u32 word (pack2x16float; core WGSL),
// as in attention_cached.wgsl: `append` writes pairs, `tiled` loads eight values (two
// quads) a load and unpacks them into the tiles, whose math is f32 as before.

override NEOX: bool = false;
override F16_CACHE: bool = false;
override HEAD_DIM: u32 = 64u;    // a multiple of 4 (of 8 with F16_CACHE), at most 4 WG
// The tile shape, both even (ops/transformer.py's prompt_tiles chooses it):
// QUERY_ROWS at most WG and at most 4 ROW_GROUPS (four output quads a thread),
// TILE_KEYS * D4 at most 4 WG (four quads of a tile a thread), and the workgroup memory
// below within the device's limit.
override QUERY_ROWS: u32 = 16u;
override TILE_KEYS: u32 = 32u;
const WG: u32 = 128u;

override D4: u32 = HEAD_DIM / 4u;
// A cache row's 16-byte units, what a thread loads at once: quads of float32, or groups
// of eight float16 values (two quads)
override UNITS: u32 = select(D4, HEAD_DIM / 8u, F16_CACHE);
// A tile row's vec4s: one more than the head's, so that the rows neighbouring threads
// read start in different banks.
override ROW4: u32 = D4 + 1u;
// Output layout: thread lid owns element quad lid % D4 of rows lid / D4 + u ROW_GROUPS
// (u < OUT_ROWS, at most 4); all its rows share each value quad it loads.
override ROW_GROUPS: u32 = WG / D4;
override OUT_ROWS: u32 = (QUERY_ROWS + ROW_GROUPS - 1u) / ROW_GROUPS;
// Score layout: (QUERY_ROWS / 2) x (TILE_KEYS / 2) pairs of two rows and two keys; with
// fewer pairs than threads, D_SPLIT threads share a pair, each summing every D_SPLIT-th
// quad of the head, and the softmax adds their parts.
override HALF_ROWS: u32 = QUERY_ROWS / 2u;
override HALF_KEYS: u32 = TILE_KEYS / 2u;
override D_SPLIT: u32 = max(1u, WG / (HALF_ROWS * HALF_KEYS));
// Softmax layout: ROW_THREADS threads share a row's softmax.
override ROW_THREADS: u32 = WG / QUERY_ROWS;

struct Params {
    s: u32,         // new tokens (rows of qkv)
    hq: u32,
    hkv: u32,
    n_ctx: u32,     // rows of the caches
    n_ranges: u32,  // (attention_cached.wgsl's; unused here)
    range_len: u32, // (attention_cached.wgsl's; unused here)
    max_keys: u32,  // the bound the work was recorded for (at most n_ctx)
    scale: f32,
    softcap: f32,   // scores become softcap * tanh(score / softcap); 0: not capped
    window: u32,    // a token sees its last `window` keys (itself included); 0: all
}

// `append` writes the caches a word at a time (an element, or a pair of float16 ones);
// `tiled` reads them a 16-byte unit at a time.
@group(0) @binding(0) var<storage, read> qkv: array<f32>;
@group(0) @binding(1) var<storage, read_write> k_cache: array<u32>;
@group(0) @binding(1) var<storage, read_write> k_units: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> v_cache: array<u32>;
@group(0) @binding(2) var<storage, read_write> v_units: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> state: array<i32>;
@group(0) @binding(4) var<storage, read> cos_sin: array<vec2<f32>>;
@group(0) @binding(5) var<storage, read_write> out: array<vec4<f32>>;
@group(0) @binding(6) var<uniform> p: Params;

// Score of a key out of sight, and a row's max before it saw any: finite, so that the
// rescaling needs no inf arithmetic.
const EMPTY: f32 = -3.0e38;

var<workgroup> q_tile: array<vec4<f32>, QUERY_ROWS * ROW4>;  // rotated, scaled queries
var<workgroup> kv_tile: array<vec4<f32>, TILE_KEYS * ROW4>;  // the tile's keys, then values
// Partial scores [part][row][key]; then, in part 0, the row's weights of the tile's keys.
var<workgroup> scores: array<f32, D_SPLIT * QUERY_ROWS * TILE_KEYS>;
var<workgroup> row_rescale: array<f32, QUERY_ROWS>;  // exp(old max - new max) of each row
// Each softmax thread's max of its keys of a tile; at the end, its sum of weights.
var<workgroup> thread_part: array<f32, WG>;

fn row_len() -> u32 {
    return (p.hq + 2u * p.hkv) * HEAD_DIM;
}

// Element c of the head vector qkv[base .. base + HEAD_DIM) rotated to position `at`.
fn rotated(base: u32, c: u32, at: u32) -> f32 {
    let half = HEAD_DIM / 2u;
    var i = c >> 1u;
    var first = (c & 1u) == 0u;
    var partner = c ^ 1u;
    if (NEOX) {
        first = c < half;
        i = select(c - half, c, first);
        partner = select(c - half, c + half, first);
    }
    let cs = cos_sin[at * half + i];
    let a = qkv[base + c];
    let b = qkv[base + partner];
    if (first) { return a * cs.x - b * cs.y; }
    return b * cs.y + a * cs.x;
}

@compute @workgroup_size(WG)
fn append(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>,
          @builtin(num_workgroups) nwg: vec3<u32>) {
    // thread e writes word e of the new rows: element e, or elements 2e and 2e + 1
    let per_word = select(1u, 2u, F16_CACHE);
    let e = (wid.x + wid.y * nwg.x) * WG + lid3.x;
    if (e >= p.s * p.hkv * HEAD_DIM / per_word) { return; }
    let c = (e * per_word) % HEAD_DIM;
    let kvh = (e * per_word / HEAD_DIM) % p.hkv;
    let i = e * per_word / (HEAD_DIM * p.hkv);
    let at = u32(state[1]) + i;
    if (at >= p.n_ctx) { return; }  // beyond the cache: `tiled` answers NaN for it
    let k_off = i * row_len() + (p.hq + kvh) * HEAD_DIM;
    let v_off = k_off + p.hkv * HEAD_DIM;
    let dst = ((at * p.hkv + kvh) * HEAD_DIM + c) / per_word;
    if (F16_CACHE) {
        k_cache[dst] = pack2x16float(vec2<f32>(rotated(k_off, c, at), rotated(k_off, c + 1u, at)));
        v_cache[dst] = pack2x16float(vec2<f32>(qkv[v_off + c], qkv[v_off + c + 1u]));
    } else {
        k_cache[dst] = bitcast<u32>(rotated(k_off, c, at));
        v_cache[dst] = bitcast<u32>(qkv[v_off + c]);
    }
}

// The first key token `at` sees.
fn lowest_key(at: u32) -> u32 {
    if (p.window > 0u && at + 1u > p.window) { return at + 1u - p.window; }
    return 0u;
}

// Unit e (UNITS a key) of a tile of keys (or values) first .. first + TILE_KEYS - 1 of
// kv head kvh, as loaded: zero beyond the tile, and for keys from `end` on (rows nobody
// wrote may hold anything, and a weight 0 must not meet a NaN).
fn fetch_unit(e: u32, first: u32, end: u32, kvh: u32, values: bool) -> vec4<u32> {
    let k = e / UNITS;
    if (e >= TILE_KEYS * UNITS || first + k >= end) { return vec4<u32>(0u); }
    let at = ((first + k) * p.hkv + kvh) * UNITS + e % UNITS;
    if (values) { return v_units[at]; }
    return k_units[at];
}

// Unit e into the tile as f32 quads: one, or two of float16 values.
fn store_unit(e: u32, unit: vec4<u32>) {
    if (e >= TILE_KEYS * UNITS) { return; }
    let row = (e / UNITS) * ROW4;
    if (F16_CACHE) {
        let quad = 2u * (e % UNITS);
        kv_tile[row + quad] = vec4<f32>(unpack2x16float(unit.x), unpack2x16float(unit.y));
        kv_tile[row + quad + 1u] = vec4<f32>(unpack2x16float(unit.z), unpack2x16float(unit.w));
    } else {
        kv_tile[row + e % UNITS] = bitcast<vec4<f32>>(unit);
    }
}

// Q K^T of the tile: partial scores of rows r, r + HALF_ROWS and keys k, k + HALF_KEYS
// for each pair (r, k) and part this thread takes.
fn tile_scores(lid: u32) {
    for (var slot = lid; slot < D_SPLIT * HALF_ROWS * HALF_KEYS; slot = slot + WG) {
        let part = slot / (HALF_ROWS * HALF_KEYS);
        let pair = slot % (HALF_ROWS * HALF_KEYS);
        let k = pair % HALF_KEYS;  // neighbouring threads: neighbouring keys
        let r = pair / HALF_KEYS;
        var s00 = vec4<f32>(0.0);
        var s01 = vec4<f32>(0.0);
        var s10 = vec4<f32>(0.0);
        var s11 = vec4<f32>(0.0);
        for (var c = part; c < D4; c = c + D_SPLIT) {
            let q0 = q_tile[r * ROW4 + c];
            let q1 = q_tile[(r + HALF_ROWS) * ROW4 + c];
            let k0 = kv_tile[k * ROW4 + c];
            let k1 = kv_tile[(k + HALF_KEYS) * ROW4 + c];
            s00 = s00 + q0 * k0;
            s01 = s01 + q0 * k1;
            s10 = s10 + q1 * k0;
            s11 = s11 + q1 * k1;
        }
        let base = part * QUERY_ROWS * TILE_KEYS;
        scores[base + r * TILE_KEYS + k] = s00.x + s00.y + s00.z + s00.w;
        scores[base + r * TILE_KEYS + k + HALF_KEYS] = s01.x + s01.y + s01.z + s01.w;
        scores[base + (r + HALF_ROWS) * TILE_KEYS + k] = s10.x + s10.y + s10.z + s10.w;
        scores[base + (r + HALF_ROWS) * TILE_KEYS + k + HALF_KEYS] =
            s11.x + s11.y + s11.z + s11.w;
    }
}

@compute @workgroup_size(WG)
fn tiled(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>,
         @builtin(num_workgroups) nwg: vec3<u32>) {
    let lid = lid3.x;
    // The last blocks first: they see the most keys, and should not be the last to start.
    let first_token = (nwg.x - 1u - wid.x) * QUERY_ROWS;
    let h = wid.y;
    let kvh = h / (p.hq / p.hkv);
    let pos0 = u32(state[1]);
    let n_tokens = min(QUERY_ROWS, p.s - first_token);  // the last block may be short
    // The block's keys: from the first token's lowest to the last token's own position;
    // none from max_keys on (tokens that would see them answer NaN).
    let end = min(pos0 + first_token + n_tokens, p.max_keys);
    let begin = lowest_key(pos0 + first_token) / TILE_KEYS * TILE_KEYS;

    // The block's queries, rotated and scaled (rows beyond the prompt as zeros).
    for (var e = lid; e < QUERY_ROWS * D4; e = e + WG) {
        let r = e / D4;
        let c = 4u * (e % D4);
        var quad = vec4<f32>(0.0);
        if (r < n_tokens) {
            let i = first_token + r;
            let at = pos0 + i;
            let base = i * row_len() + h * HEAD_DIM;
            quad = vec4<f32>(rotated(base, c, at), rotated(base, c + 1u, at),
                             rotated(base, c + 2u, at), rotated(base, c + 3u, at)) * p.scale;
        }
        q_tile[r * ROW4 + e % D4] = quad;
    }

    // The softmax state of row soft_row, which ROW_THREADS threads share, each taking
    // the keys soft_part, soft_part + ROW_THREADS, .. of a tile.
    let soft_row = lid / ROW_THREADS;
    let soft_part = lid % ROW_THREADS;
    let softmax = soft_row < QUERY_ROWS;
    let at = pos0 + first_token + soft_row;
    let lowest = lowest_key(at);
    let own_row = soft_row < n_tokens;
    var m_run = EMPTY;  // the row's max score so far
    var l_run = 0.0;    // the sum of exp(score - m_run) of this thread's keys so far

    // Output quad `col` of rows row0 + u ROW_GROUPS, relative to the row's m_run.
    let col = lid % D4;
    let row0 = lid / D4;
    var acc0 = vec4<f32>(0.0);
    var acc1 = vec4<f32>(0.0);
    var acc2 = vec4<f32>(0.0);
    var acc3 = vec4<f32>(0.0);

    // Each thread moves units lid + u WG (u < 4) of a tile: fetched into registers a
    // phase before they are stored, so that the loads are in flight during the arithmetic
    // (the next tile's keys during the weighted values, the values during the scores).
    var k0 = fetch_unit(lid, begin, end, kvh, false);
    var k1 = fetch_unit(lid + WG, begin, end, kvh, false);
    var k2 = fetch_unit(lid + 2u * WG, begin, end, kvh, false);
    var k3 = fetch_unit(lid + 3u * WG, begin, end, kvh, false);
    for (var first = begin; first < end; first = first + TILE_KEYS) {
        workgroupBarrier();  // the previous tile's values and weights are used up
        store_unit(lid, k0);
        store_unit(lid + WG, k1);
        store_unit(lid + 2u * WG, k2);
        store_unit(lid + 3u * WG, k3);
        let v0 = fetch_unit(lid, first, end, kvh, true);
        let v1 = fetch_unit(lid + WG, first, end, kvh, true);
        let v2 = fetch_unit(lid + 2u * WG, first, end, kvh, true);
        let v3 = fetch_unit(lid + 3u * WG, first, end, kvh, true);
        workgroupBarrier();
        tile_scores(lid);
        workgroupBarrier();
        // This thread's keys of the row: scores (parts added, capped; EMPTY where the
        // token does not see the key) and their max ..
        if (softmax) {
            var m = EMPTY;
            for (var k = soft_part; k < TILE_KEYS; k = k + ROW_THREADS) {
                var sc = 0.0;
                for (var part = 0u; part < D_SPLIT; part = part + 1u) {
                    sc = sc + scores[(part * QUERY_ROWS + soft_row) * TILE_KEYS + k];
                }
                // tanh of a clamped argument: some drivers compute it as a ratio of exps,
                // NaN for large ones (tanh(15) is 1 in f32 already).
                if (p.softcap > 0.0) { sc = p.softcap * tanh(clamp(sc / p.softcap, -15.0, 15.0)); }
                let j = first + k;
                sc = select(EMPTY, sc, own_row && j <= at && j >= lowest);
                scores[soft_row * TILE_KEYS + k] = sc;
                m = max(m, sc);
            }
            thread_part[lid] = m;
        }
        store_unit(lid, v0);  // the keys are used up
        store_unit(lid + WG, v1);
        store_unit(lid + 2u * WG, v2);
        store_unit(lid + 3u * WG, v3);
        let next = first + TILE_KEYS;
        k0 = fetch_unit(lid, next, end, kvh, false);
        k1 = fetch_unit(lid + WG, next, end, kvh, false);
        k2 = fetch_unit(lid + 2u * WG, next, end, kvh, false);
        k3 = fetch_unit(lid + 3u * WG, next, end, kvh, false);
        workgroupBarrier();
        // .. then the row's new max (the tile's joins it), its keys' weights relative to
        // it, and the rescaling of what came before.
        if (softmax) {
            var m = m_run;
            for (var t = 0u; t < ROW_THREADS; t = t + 1u) {
                m = max(m, thread_part[soft_row * ROW_THREADS + t]);
            }
            let rescale = exp(m_run - m);  // 0 when the row sees its first keys
            var l = 0.0;
            for (var k = soft_part; k < TILE_KEYS; k = k + ROW_THREADS) {
                let sc = scores[soft_row * TILE_KEYS + k];
                let w = select(0.0, exp(sc - m), sc > EMPTY);
                scores[soft_row * TILE_KEYS + k] = w;
                l = l + w;
            }
            l_run = l_run * rescale + l;
            m_run = m;
            if (soft_part == 0u) { row_rescale[soft_row] = rescale; }
        }
        workgroupBarrier();
        if (row0 < ROW_GROUPS) {
            // Rows beyond the block take row 0's weights (never stored); the tests of
            // OUT_ROWS, a constant, leave only the accumulators in use.
            let r0 = block_row(row0);
            let r1 = block_row(row0 + ROW_GROUPS);
            let r2 = block_row(row0 + 2u * ROW_GROUPS);
            let r3 = block_row(row0 + 3u * ROW_GROUPS);
            acc0 = acc0 * row_rescale[r0];
            if (OUT_ROWS > 1u) { acc1 = acc1 * row_rescale[r1]; }
            if (OUT_ROWS > 2u) { acc2 = acc2 * row_rescale[r2]; }
            if (OUT_ROWS > 3u) { acc3 = acc3 * row_rescale[r3]; }
            for (var k = 0u; k < TILE_KEYS; k = k + 1u) {
                let v = kv_tile[k * ROW4 + col];
                acc0 = acc0 + scores[r0 * TILE_KEYS + k] * v;
                if (OUT_ROWS > 1u) { acc1 = acc1 + scores[r1 * TILE_KEYS + k] * v; }
                if (OUT_ROWS > 2u) { acc2 = acc2 + scores[r2 * TILE_KEYS + k] * v; }
                if (OUT_ROWS > 3u) { acc3 = acc3 + scores[r3 * TILE_KEYS + k] * v; }
            }
        }
    }

    if (softmax) { thread_part[lid] = l_run; }  // (the maxes were read before a barrier)
    workgroupBarrier();
    // Tokens beyond the recorded bound never saw all their keys: NaN (not a constant:
    // WGSL forbids constant NaN).
    let nan = bitcast<f32>(0x7fc00000u | (p.hq & 0u));
    if (row0 < ROW_GROUPS) {
        store_row(row0, acc0, first_token, n_tokens, pos0, h, col, nan);
        store_row(row0 + ROW_GROUPS, acc1, first_token, n_tokens, pos0, h, col, nan);
        store_row(row0 + 2u * ROW_GROUPS, acc2, first_token, n_tokens, pos0, h, col, nan);
        store_row(row0 + 3u * ROW_GROUPS, acc3, first_token, n_tokens, pos0, h, col, nan);
    }
}

fn block_row(r: u32) -> u32 {
    return select(0u, r, r < QUERY_ROWS);
}

// Row r's output quad `col`, normalised (tokens of the block only).
fn store_row(r: u32, acc: vec4<f32>, first_token: u32, n_tokens: u32, pos0: u32, h: u32,
             col: u32, nan: f32) {
    if (r >= n_tokens) { return; }
    let i = first_token + r;
    var total = 0.0;  // the row's sum of weights: its softmax threads' sums
    for (var t = 0u; t < ROW_THREADS; t = t + 1u) {
        total = total + thread_part[r * ROW_THREADS + t];
    }
    let unseen = pos0 + i >= p.max_keys;
    out[(i * p.hq + h) * D4 + col] = select(acc / total, vec4<f32>(nan), unseen);
}
