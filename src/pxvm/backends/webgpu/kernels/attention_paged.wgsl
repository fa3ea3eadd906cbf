// Causal attention of a batch of tokens of different sequences over a paged KV cache
// (continuous batching): attention_cached.wgsl's design with each token's own sequence
// and position. qkv (T, (Hq + 2 Hkv) D) holds each token's query heads, key heads and
// value heads; token t is sequence tokens[2t]'s token at position tokens[2t + 1].
// Position j of sequence b lives in row j % block_size of pool block
// blocks[b * max_blocks + j / block_size]; pools are (n_blocks, block_size, Hkv, D).
// `append`: one thread per word of the new rows writes every token's rotated key and its
// value into its pool row. A dispatch of its own, before `split`, so that `split` reads
// every key, the batch's own included, from the pools (dispatches of one pass see
// earlier ones' writes).
// `split`: workgroup (range r, query head h, token t) takes keys first + r * range_len ..
// + range_len - 1 of those token t sees (first: its oldest, 0 or its window's), CHUNK keys
// a trip with an online softmax, as attention_cached.wgsl's `split`: the chunk's pool rows
// are looked up once into `chunk_rows`, KEY_LANES threads share a key's dot product
// (two keys a slot, their loads in flight together), value groups share the weighted
// sum of values. It stores the range's unnormalised output, max and sum of exponentials
// in `part`; with one range (n_ranges = 1) the normalised output instead.
// `combine`: workgroup (h, t) merges token t's ranges by rescaling them to a common max.
// Table entries outside the tables or the pools (the caller's to avoid) are never
// followed: such a token writes nothing, its rows read row 0 instead, and its output is
// NaN.
// NEOX = false rotates pairs (2c, 2c+1) (GGUF llama), true rotates (c, c + D/2).
// F16_CACHE: the pools hold float16 values, two a u32 word (pack2x16float, the first in
// the low half; core WGSL), as attention_cached.wgsl's caches; the math is f32.

override NEOX: bool = false;
override F16_CACHE: bool = false;
override HEAD_DIM: u32 = 64u;  // even, at most MAX_D
// Float16 keys read eight values (a vec4<u32>) a load: rows of whole such groups; else a
// word (two values) a load.
override KEY_OCTETS: bool = F16_CACHE && HEAD_DIM % 8u == 0u;
override PART_STRIDE: u32;     // the partial results' layout (ops/layouts.py)
override PART_MAX: u32;
override PART_SUM: u32;
const WG: u32 = 256u;          // `append`'s, `split`'s and `combine`'s threads; >= MAX_D
const KEY_LANES: u32 = 8u;     // threads per key's dot product
const SLOTS: u32 = WG / KEY_LANES;
const CHUNK: u32 = 2u * SLOTS; // keys per trip of `split` (two per slot)
const MAX_D: u32 = 256u;

struct Params {
    t: u32,          // tokens (rows of qkv and of the token table)
    hq: u32,
    hkv: u32,
    block_size: u32, // rows of a pool block
    n_blocks: u32,   // blocks of the pools
    seqs: u32,       // sequences of the block table (its rows)
    max_blocks: u32, // blocks a sequence at most (the block table's columns)
    n_ranges: u32,   // key ranges a token in the grid (and in `part`)
    range_len: u32,  // keys a range, a multiple of CHUNK
    scale: f32,
    softcap: f32,    // scores become softcap * tanh(score / softcap); 0: not capped
    window: u32,     // a token sees its last `window` keys (itself included); 0: all
}

@group(0) @binding(0) var<storage, read> qkv: array<f32>;
// The pools as 16-byte units of four words (a word a float32 value, or two float16
// values), as attention_cached.wgsl's caches.
@group(0) @binding(1) var<storage, read_write> k_pool: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> v_pool: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> tokens: array<i32>;  // (T, [sequence, position])
@group(0) @binding(4) var<storage, read> blocks: array<i32>;  // (seqs, max_blocks)
@group(0) @binding(5) var<storage, read> cos_sin: array<vec2<f32>>;
// The ranges' partial results, records of PART_STRIDE floats at
// part[((t * hq + h) * n_ranges + r) * PART_STRIDE]: HEAD_DIM output sums, the max score
// at PART_MAX, the sum of exps at PART_SUM (NaN where a key's block was outside the pool).
@group(0) @binding(6) var<storage, read_write> part: array<f32>;
@group(0) @binding(7) var<storage, read_write> out: array<f32>;
@group(0) @binding(8) var<uniform> p: Params;

// Score of a key outside the range: finite, so exp(EMPTY - m) is 0 without inf arithmetic.
const EMPTY: f32 = -3.0e38;
// A row's element offset that says "no pool row" (a block outside the pool)
const NO_ROW: u32 = 0xffffffffu;

var<workgroup> q_row: array<f32, MAX_D>;
var<workgroup> scratch: array<f32, WG>;
var<workgroup> weights: array<f32, WG>;
var<workgroup> key_parts: array<f32, CHUNK * KEY_LANES>;  // [key * KEY_LANES + lane]
var<workgroup> exps: array<f32, WG>;
var<workgroup> chunk_rows: array<u32, CHUNK>;  // the chunk's keys' first elements

// Max or sum of x over the `size` threads of the workgroup.
fn reduce(lid: u32, x: f32, take_max: bool, size: u32) -> f32 {
    scratch[lid] = x;
    for (var s = size / 2u; s > 0u; s = s / 2u) {
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

fn row_len() -> u32 {
    return (p.hq + 2u * p.hkv) * HEAD_DIM;
}

// Whether token t's sequence and position are inside the block table.
fn in_table(t: u32) -> bool {
    let seq = tokens[2u * t];
    let pos = tokens[2u * t + 1u];
    return seq >= 0 && u32(seq) < p.seqs && pos >= 0 && u32(pos) < p.max_blocks * p.block_size;
}

// The first element of kv head kvh's row of sequence seq's position j, or NO_ROW where
// its block is outside the pool (seq and j inside the table).
fn row_start(seq: u32, j: u32, kvh: u32) -> u32 {
    let block = blocks[seq * p.max_blocks + j / p.block_size];
    if (block < 0 || u32(block) >= p.n_blocks) { return NO_ROW; }
    return ((u32(block) * p.block_size + j % p.block_size) * p.hkv + kvh) * HEAD_DIM;
}

// The first position token at `at` sees.
fn first_key(at: u32) -> u32 {
    if (p.window > 0u && at + 1u > p.window) { return at + 1u - p.window; }
    return 0u;
}

// Threads that share one output element's sum: size / HEAD_DIM groups of HEAD_DIM
// threads (1 if HEAD_DIM > size) in a workgroup of `size`.
fn value_groups(size: u32) -> u32 {
    return max(1u, size / HEAD_DIM);
}

// Element c's sum over the `groups` partial sums the value groups left in scratch.
fn group_sum(c: u32, groups: u32) -> f32 {
    var sum = 0.0;
    for (var u = 0u; u < groups; u = u + 1u) { sum = sum + scratch[u * HEAD_DIM + c]; }
    return sum;
}

// Element c of the head vector qkv[base .. base + HEAD_DIM) rotated to position `pos`.
fn rotated(base: u32, c: u32, pos: u32) -> f32 {
    let half = HEAD_DIM / 2u;
    var i = c >> 1u;
    var first = (c & 1u) == 0u;
    var partner = c ^ 1u;
    if (NEOX) {
        first = c < half;
        i = select(c - half, c, first);
        partner = select(c - half, c + half, first);
    }
    let cs = cos_sin[pos * half + i];
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
    if (e >= p.t * p.hkv * HEAD_DIM / per_word) { return; }
    let c = (e * per_word) % HEAD_DIM;
    let kvh = (e * per_word / HEAD_DIM) % p.hkv;
    let t = e * per_word / (HEAD_DIM * p.hkv);
    if (!in_table(t)) { return; }  // `split` answers NaN for it
    let at = u32(tokens[2u * t + 1u]);
    let start = row_start(u32(tokens[2u * t]), at, kvh);
    if (start == NO_ROW) { return; }
    let k_off = t * row_len() + (p.hq + kvh) * HEAD_DIM;
    let v_off = k_off + p.hkv * HEAD_DIM;
    let w = (start + c) / per_word;
    if (F16_CACHE) {
        k_pool[w / 4u][w % 4u] = pack2x16float(vec2<f32>(rotated(k_off, c, at),
                                                         rotated(k_off, c + 1u, at)));
        v_pool[w / 4u][w % 4u] = pack2x16float(vec2<f32>(qkv[v_off + c], qkv[v_off + c + 1u]));
    } else {
        k_pool[w / 4u][w % 4u] = bitcast<u32>(rotated(k_off, c, at));
        v_pool[w / 4u][w % 4u] = bitcast<u32>(qkv[v_off + c]);
    }
}

@compute @workgroup_size(WG)
fn split(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>) {
    let lid = lid3.x;
    let r = wid.x;
    let h = wid.y;
    let t = wid.z;
    let nan = bitcast<f32>(0x7fc00000u | (p.hq & 0u));  // not a constant: WGSL forbids NaN ones
    if (!in_table(t)) {  // the same for the whole workgroup; `combine` answers NaN too
        if (p.n_ranges == 1u && lid < HEAD_DIM) { out[(t * p.hq + h) * HEAD_DIM + lid] = nan; }
        return;
    }
    let seq = u32(tokens[2u * t]);
    let at = u32(tokens[2u * t + 1u]);
    let begin = first_key(at) + r * p.range_len;
    if (begin > at) { return; }        // `combine` reads no such range
    let end = min(begin + p.range_len, at + 1u);
    let kvh = h / (p.hq / p.hkv);
    for (var c = lid; c < HEAD_DIM; c = c + WG) {
        q_row[c] = rotated(t * row_len() + h * HEAD_DIM, c, at) * p.scale;
    }

    let lane = lid % KEY_LANES;
    let slot = lid / KEY_LANES;
    let groups = value_groups(WG);
    let g = lid / HEAD_DIM;
    var lost = false;    // whether a key this thread looked up had no pool row
    var m_run = EMPTY;   // the range's max score so far
    var l_run = 0.0;     // thread lid's key's exps so far, relative to m_run
    var acc = 0.0;       // element lid % HEAD_DIM of value group g's sum, relative to m_run
    for (var c0 = begin; c0 < end; c0 = c0 + CHUNK) {
        let n_keys = min(CHUNK, end - c0);
        if (lid < n_keys) {
            let start = row_start(seq, c0 + lid, kvh);
            lost = lost || start == NO_ROW;
            chunk_rows[lid] = select(start, kvh * HEAD_DIM, start == NO_ROW);  // row 0's
        }
        workgroupBarrier();
        // Partial scores of keys slot and slot + SLOTS (both at once where both are in
        // the chunk: sixteen loads in flight).
        if (slot + SLOTS < n_keys) {
            let parts = key_parts_of(chunk_rows[slot], chunk_rows[slot + SLOTS], lane);
            key_parts[slot * KEY_LANES + lane] = parts.x;
            key_parts[(slot + SLOTS) * KEY_LANES + lane] = parts.y;
        } else if (slot < n_keys) {
            let row = chunk_rows[slot];
            key_parts[slot * KEY_LANES + lane] = key_parts_of(row, row, lane).x;
        }
        workgroupBarrier();
        var sc = EMPTY;
        if (lid < n_keys) {
            sc = 0.0;
            for (var u = 0u; u < KEY_LANES; u = u + 1u) {
                sc = sc + key_parts[lid * KEY_LANES + u];
            }
            // tanh of a clamped argument: some drivers compute it as a ratio of exps, NaN
            // for large ones (tanh(15) is 1 in f32 already).
            if (p.softcap > 0.0) { sc = p.softcap * tanh(clamp(sc / p.softcap, -15.0, 15.0)); }
        }
        // Online softmax: the chunk's max joins the range's, earlier sums are rescaled.
        let m = max(m_run, reduce(lid, sc, true, CHUNK));
        let rescale = exp(m_run - m);  // 0 for the first chunk (m_run = EMPTY)
        let e = select(0.0, exp(sc - m), lid < n_keys);
        exps[lid] = e;
        l_run = l_run * rescale + e;
        m_run = m;
        workgroupBarrier();
        if (g < groups) {
            acc = acc * rescale + weighted_values(lid % HEAD_DIM, g, groups, n_keys);
        }
        workgroupBarrier();  // chunk_rows, key_parts and exps are rewritten by the next chunk
    }
    let l = reduce(lid, l_run, false, CHUNK);
    let unreadable = reduce(lid, select(0.0, 1.0, lost), true, WG) > 0.0;
    scratch[lid] = acc;
    workgroupBarrier();
    let base = ((t * p.hq + h) * p.n_ranges + r) * PART_STRIDE;
    if (lid < HEAD_DIM) {
        let sum = group_sum(lid, groups);
        if (p.n_ranges == 1u) {
            out[(t * p.hq + h) * HEAD_DIM + lid] = select(sum / l, nan, unreadable);
        } else {
            part[base + lid] = sum;
        }
    }
    if (p.n_ranges > 1u && lid == 0u) {
        part[base + PART_MAX] = m_run;
        part[base + PART_SUM] = select(l, nan, unreadable);
    }
}

@compute @workgroup_size(WG)
fn combine(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>) {
    let lid = lid3.x;
    let h = wid.x;
    let t = wid.y;
    let nan = bitcast<f32>(0x7fc00000u | (p.hq & 0u));
    if (!in_table(t)) {
        if (lid < HEAD_DIM) { out[(t * p.hq + h) * HEAD_DIM + lid] = nan; }
        return;
    }
    let at = u32(tokens[2u * t + 1u]);
    let n_used = min((at - first_key(at)) / p.range_len + 1u, p.n_ranges);
    let first = (t * p.hq + h) * p.n_ranges;
    let stride = PART_STRIDE;
    var mx = EMPTY;
    for (var r = lid; r < n_used; r = r + WG) {
        mx = max(mx, part[(first + r) * stride + PART_MAX]);
    }
    mx = reduce(lid, mx, true, WG);
    // Ranges' weights relative to the common max, computed once (n_used <= WG: the host
    // grids at most CACHED_MAX_RANGES ranges).
    var total = 0.0;
    for (var r = lid; r < n_used; r = r + WG) {
        let b = (first + r) * stride;
        weights[r] = exp(part[b + PART_MAX] - mx);
        total = total + weights[r] * part[b + PART_SUM];
    }
    total = reduce(lid, total, false, WG);  // its barriers publish `weights` too
    let groups = value_groups(WG);
    let g = lid / HEAD_DIM;
    var acc = 0.0;
    if (g < groups) {
        for (var r = g; r < n_used; r = r + groups) {
            acc = acc + weights[r] * part[(first + r) * stride + lid % HEAD_DIM];
        }
    }
    scratch[lid] = acc;
    workgroupBarrier();
    if (lid < HEAD_DIM) {
        out[(t * p.hq + h) * HEAD_DIM + lid] = group_sum(lid, groups) / total;
    }
}

// Sum of exps[u] * V element c of the chunk's keys u = g, g + groups, .. < n_keys
// (their rows in chunk_rows), eight loads in flight a trip.
fn weighted_values(c: u32, g: u32, groups: u32, n_keys: u32) -> f32 {
    var a = vec4<f32>(0.0);
    var b = vec4<f32>(0.0);
    var u = g;
    for (; u + 7u * groups < n_keys; u = u + 8u * groups) {
        let u4 = u + 4u * groups;
        a = a + vec4<f32>(exps[u], exps[u + groups], exps[u + 2u * groups],
                          exps[u + 3u * groups])
              * vec4<f32>(value_at(chunk_rows[u] + c), value_at(chunk_rows[u + groups] + c),
                          value_at(chunk_rows[u + 2u * groups] + c),
                          value_at(chunk_rows[u + 3u * groups] + c));
        b = b + vec4<f32>(exps[u4], exps[u4 + groups], exps[u4 + 2u * groups],
                          exps[u4 + 3u * groups])
              * vec4<f32>(value_at(chunk_rows[u4] + c), value_at(chunk_rows[u4 + groups] + c),
                          value_at(chunk_rows[u4 + 2u * groups] + c),
                          value_at(chunk_rows[u4 + 3u * groups] + c));
    }
    let ab = a + b;
    var sum = ab.x + ab.y + ab.z + ab.w;
    for (; u < n_keys; u = u + groups) { sum = sum + exps[u] * value_at(chunk_rows[u] + c); }
    return sum;
}

// Value of half (e % 2) of a word of two float16 values.
fn half_of(word: u32, e: u32) -> f32 {
    let pair = unpack2x16float(word);
    return select(pair.x, pair.y, (e & 1u) == 1u);
}

// Element e of the key pool, as f32.
fn key_at(e: u32) -> f32 {
    if (F16_CACHE) {
        let w = e / 2u;
        return half_of(k_pool[w / 4u][w % 4u], e);
    }
    return bitcast<f32>(k_pool[e / 4u][e % 4u]);
}

// Element e of the value pool, as f32.
fn value_at(e: u32) -> f32 {
    if (F16_CACHE) {
        let w = e / 2u;
        return half_of(v_pool[w / 4u][w % 4u], e);
    }
    return bitcast<f32>(v_pool[e / 4u][e % 4u]);
}

// Lane `lane`'s parts of the scores of the two keys whose rows start at elements kb and
// kb2: of elements lane, lane + KEY_LANES, .. (float32: all sixteen loads in flight at
// once), or of float16 groups of eight (KEY_OCTETS) or pairs.
fn key_parts_of(kb: u32, kb2: u32, lane: u32) -> vec2<f32> {
    if (KEY_OCTETS) { return half_key_parts(kb / 8u, kb2 / 8u, lane); }
    if (F16_CACHE) { return half_pair_key_parts(kb / 2u, kb2 / 2u, lane); }
    var a = vec4<f32>(0.0);
    var b = vec4<f32>(0.0);
    var a2 = vec4<f32>(0.0);
    var b2 = vec4<f32>(0.0);
    var c = lane;
    let L = KEY_LANES;
    for (; c + 7u * L < HEAD_DIM; c = c + 8u * L) {
        let qa = vec4<f32>(q_row[c], q_row[c + L], q_row[c + 2u * L], q_row[c + 3u * L]);
        let qb = vec4<f32>(q_row[c + 4u * L], q_row[c + 5u * L], q_row[c + 6u * L],
                           q_row[c + 7u * L]);
        a = a + qa * vec4<f32>(key_at(kb + c), key_at(kb + c + L), key_at(kb + c + 2u * L),
                               key_at(kb + c + 3u * L));
        b = b + qb * vec4<f32>(key_at(kb + c + 4u * L), key_at(kb + c + 5u * L),
                               key_at(kb + c + 6u * L), key_at(kb + c + 7u * L));
        a2 = a2 + qa * vec4<f32>(key_at(kb2 + c), key_at(kb2 + c + L),
                                 key_at(kb2 + c + 2u * L), key_at(kb2 + c + 3u * L));
        b2 = b2 + qb * vec4<f32>(key_at(kb2 + c + 4u * L), key_at(kb2 + c + 5u * L),
                                 key_at(kb2 + c + 6u * L), key_at(kb2 + c + 7u * L));
    }
    for (; c < HEAD_DIM; c = c + L) {
        a.x = a.x + q_row[c] * key_at(kb + c);
        a2.x = a2.x + q_row[c] * key_at(kb2 + c);
    }
    let ab = a + b;
    let ab2 = a2 + b2;
    return vec2<f32>(ab.x + ab.y + ab.z + ab.w, ab2.x + ab2.y + ab2.z + ab2.w);
}

// key_parts_of float16 keys whose rows start at units u and u2 (of eight values): lane
// takes units lane, lane + KEY_LANES, .., a vec4<u32> load each.
fn half_key_parts(u: u32, u2: u32, lane: u32) -> vec2<f32> {
    var a = vec4<f32>(0.0);
    var b = vec4<f32>(0.0);
    for (var o = lane; o < HEAD_DIM / 8u; o = o + KEY_LANES) {
        let k = k_pool[u + o];
        let k2 = k_pool[u2 + o];
        let c = 8u * o;
        let q0 = vec4<f32>(q_row[c], q_row[c + 1u], q_row[c + 2u], q_row[c + 3u]);
        let q1 = vec4<f32>(q_row[c + 4u], q_row[c + 5u], q_row[c + 6u], q_row[c + 7u]);
        a = a + q0 * vec4<f32>(unpack2x16float(k.x), unpack2x16float(k.y))
              + q1 * vec4<f32>(unpack2x16float(k.z), unpack2x16float(k.w));
        b = b + q0 * vec4<f32>(unpack2x16float(k2.x), unpack2x16float(k2.y))
              + q1 * vec4<f32>(unpack2x16float(k2.z), unpack2x16float(k2.w));
    }
    return vec2<f32>(a.x + a.y + a.z + a.w, b.x + b.y + b.z + b.w);
}

// key_parts_of float16 keys whose rows start at words w and w2 (rows not of whole
// units): lane takes words lane, lane + KEY_LANES, .., two values a load.
fn half_pair_key_parts(w: u32, w2: u32, lane: u32) -> vec2<f32> {
    var a = vec2<f32>(0.0);
    var b = vec2<f32>(0.0);
    for (var o = lane; o < HEAD_DIM / 2u; o = o + KEY_LANES) {
        let q = vec2<f32>(q_row[2u * o], q_row[2u * o + 1u]);
        let x = w + o;
        let x2 = w2 + o;
        a = a + q * unpack2x16float(k_pool[x / 4u][x % 4u]);
        b = b + q * unpack2x16float(k_pool[x2 / 4u][x2 % 4u]);
    }
    return vec2<f32>(a.x + a.y, b.x + b.y);
}
