// Causal attention of new tokens over a KV cache, for llama-style decoding and prefill.
// The S new tokens come as one projected row each: qkv (S, (Hq + 2 Hkv) D) holds the
// query heads, then the key heads, then the value heads. They sit at positions
// pos .. pos + S - 1, where pos = state[1] is read on the GPU, so one recorded step
// serves every position. Rotary embedding is applied here (cos/sin from a host table),
// and the new keys and values are appended to the caches (n_ctx, Hkv, D) by this pass.
// `split`: workgroup (range r, query head h, token i) handles keys r*range_len ..
// r*range_len + range_len - 1 that token i may see (keys 0 .. pos + i), CHUNK keys at a
// time with an online softmax (the chunk's max joins the range's and earlier sums are
// rescaled). KEY_LANES threads share each key's dot product, each loading 8 elements of
// two keys at once, and groups of threads share the weighted sum of values, sixteen rows
// per trip: loads in flight, not long chains, set the speed of these small passes
// (docs/benchmarks-log.md: these and 4 or 16 lanes per key measured on the H100). It stores the
// range's unnormalised output, max and sum of exponentials in `part`; with one range
// (n_ranges = 1) it writes the normalised output instead, and no `combine` is needed.
// Keys below pos are read from the cache; newer ones from qkv, because they are being
// written in this same pass. Ranges beyond the token's position end at once, so the grid
// may cover the whole cache.
// `combine`: workgroup (h, i) merges the ranges by rescaling them to a common max.
// (matmul_quant.wgsl can merge the ranges instead, as the input of the output projection.)
// The head size D is the pipeline constant HEAD_DIM, so that loops over a head's
// elements have trip counts the driver knows (faster than D read from the params on the
// H100: docs/benchmarks-log.md).
// NEOX = false rotates pairs (2c, 2c+1) (GGUF llama), true rotates (c, c + D/2).
// F16_CACHE: the caches hold float16 values, two a u32 word (pack2x16float, the first in
// the low half; core WGSL, no shader-f16 needed), else float32 values: half the bytes
// that a decoding step's attention reads. Values are stored rounded to float16 and read
// back to f32 (new tokens' keys and values from qkv too, as they would be read from the
// cache); the math is f32 either way.

override NEOX: bool = false;
override F16_CACHE: bool = false;
// RING: the caches are rings of n_ctx rows (a multiple of CHUNK), position j in row
// j % n_ctx: a sliding-window layer's cache, which holds only its window and one pass's
// new tokens (ops/transformer.py checks it is big enough, so that a pass overwrites
// only keys none of its tokens sees). Chunks start at multiples of CHUNK, so a chunk's
// keys never wrap.
override RING: bool = false;
override HEAD_DIM: u32 = 64u;  // even, at most MAX_D
// Float16 keys read eight values (a vec4<u32>) a load: rows of whole such groups; else a
// word (two values) a load.
override KEY_OCTETS: bool = F16_CACHE && HEAD_DIM % 8u == 0u;
override PART_STRIDE: u32;     // the partial results' layout (see `part` below)
override PART_MAX: u32;
override PART_SUM: u32;
const WG: u32 = 256u;          // `split`'s threads; at least MAX_D
const KEY_LANES: u32 = 8u;     // threads per key's dot product
const SLOTS: u32 = WG / KEY_LANES;
const CHUNK: u32 = 2u * SLOTS; // keys per trip of `split` (two per slot)
// `combine` is wider: its few workgroups (one per head and token) each merge every range
// so far, and more threads make each one's chain of loads shorter.
const COMBINE_WG: u32 = 256u;
const MAX_D: u32 = 256u;

struct Params {
    s: u32,         // new tokens (rows of qkv)
    hq: u32,
    hkv: u32,
    n_ctx: u32,     // rows of the caches
    n_ranges: u32,  // key ranges in the grid (and per token in `part`)
    range_len: u32, // keys per range, a multiple of CHUNK
    max_keys: u32,  // the bound the grid was recorded for (at most n_ctx)
    scale: f32,
    softcap: f32,   // scores become softcap * tanh(score / softcap); 0: not capped
    window: u32,    // a token sees its last `window` keys (itself included); 0: all
}

@group(0) @binding(0) var<storage, read> qkv: array<f32>;
// The caches as 16-byte units of four words (a word a float32 value, or two float16
// values): element e of a cache is word e (float32) or half of word e / 2 (float16), word
// w at [w / 4][w % 4]; bindings cover whole units (runtime/memory.py), so every word is
// in reach.
@group(0) @binding(1) var<storage, read_write> k_cache: array<vec4<u32>>;
@group(0) @binding(2) var<storage, read_write> v_cache: array<vec4<u32>>;
@group(0) @binding(3) var<storage, read> state: array<i32>;
@group(0) @binding(4) var<storage, read> cos_sin: array<vec2<f32>>;
// The ranges' partial results, records of PART_STRIDE floats at
// part[((i * hq + h) * n_ranges + r) * PART_STRIDE]: HEAD_DIM output sums, the max score at
// PART_MAX, the sum of exps at PART_SUM (ops/layouts.py's AttentionPartials, which
// matmul_quant.wgsl reads too).
@group(0) @binding(5) var<storage, read_write> part: array<f32>;
@group(0) @binding(6) var<storage, read_write> out: array<f32>;
@group(0) @binding(7) var<uniform> p: Params;

// Score of a key outside the range: finite, so exp(EMPTY - m) is 0 without inf arithmetic.
const EMPTY: f32 = -3.0e38;

var<workgroup> q_row: array<f32, MAX_D>;
var<workgroup> scratch: array<f32, COMBINE_WG>;
var<workgroup> weights: array<f32, COMBINE_WG>;
var<workgroup> key_parts: array<f32, CHUNK * KEY_LANES>;  // [key * KEY_LANES + lane]
var<workgroup> exps: array<f32, WG>;

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

// The cache row of position j.
fn cache_row(j: u32) -> u32 {
    if (RING) { return j % p.n_ctx; }
    return j;
}

fn row_len() -> u32 {
    return (p.hq + 2u * p.hkv) * HEAD_DIM;
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

// Query head h of token i, rotated to position `at` and scaled, into q_row (threads lid,
// lid + size, ..); the caller publishes it with a barrier.
fn stage_query(lid: u32, size: u32, i: u32, h: u32, at: u32) {
    for (var c = lid; c < HEAD_DIM; c = c + size) {
        q_row[c] = rotated(i * row_len() + h * HEAD_DIM, c, at) * p.scale;
    }
}

// Append token i's key (rotated to `at`) and value of kv head kvh to the caches at row
// `at` (threads lid, lid + size, ..: an element each, a pair of them in a float16 cache).
fn append_key_value(lid: u32, size: u32, i: u32, at: u32, kvh: u32, k_off: u32, v_off: u32) {
    let first = (cache_row(at) * p.hkv + kvh) * HEAD_DIM;  // the row's first element
    let key = i * row_len() + k_off;
    let value = i * row_len() + v_off;
    if (F16_CACHE) {
        for (var c = 2u * lid; c < HEAD_DIM; c = c + 2u * size) {
            let w = (first + c) / 2u;
            k_cache[w / 4u][w % 4u] = pack2x16float(vec2<f32>(rotated(key, c, at),
                                                              rotated(key, c + 1u, at)));
            v_cache[w / 4u][w % 4u] = pack2x16float(vec2<f32>(qkv[value + c],
                                                              qkv[value + c + 1u]));
        }
        return;
    }
    for (var c = lid; c < HEAD_DIM; c = c + size) {
        let e = first + c;
        k_cache[e / 4u][e % 4u] = bitcast<u32>(rotated(key, c, at));
        v_cache[e / 4u][e % 4u] = bitcast<u32>(qkv[value + c]);
    }
}

// x as the cache holds it: rounded to float16 in a float16 cache.
fn stored(x: f32) -> f32 {
    if (F16_CACHE) { return unpack2x16float(pack2x16float(vec2<f32>(x, 0.0))).x; }
    return x;
}

// Value of half (e % 2) of a word of two float16 values.
fn half_of(word: u32, e: u32) -> f32 {
    let pair = unpack2x16float(word);
    return select(pair.x, pair.y, (e & 1u) == 1u);
}

// Element e of the key cache, as f32.
fn key_at(e: u32) -> f32 {
    if (F16_CACHE) {
        let w = e / 2u;
        return half_of(k_cache[w / 4u][w % 4u], e);
    }
    return bitcast<f32>(k_cache[e / 4u][e % 4u]);
}

// Element e of the value cache, as f32.
fn value_at(e: u32) -> f32 {
    if (F16_CACHE) {
        let w = e / 2u;
        return half_of(v_cache[w / 4u][w % 4u], e);
    }
    return bitcast<f32>(v_cache[e / 4u][e % 4u]);
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
fn split(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>) {
    let lid = lid3.x;
    let r = wid.x;
    let h = wid.y;
    let i = wid.z;
    let pos0 = u32(state[1]);
    let at = pos0 + i;                 // this token's position: it sees keys 0 ..= at
    let begin = r * p.range_len;
    if (begin > at) { return; }        // the same for the whole workgroup
    let end = min(begin + p.range_len, at + 1u);
    // Sliding-window attention: keys below `lowest` are out of sight. Whole chunks of them
    // are skipped (a range entirely below it leaves an empty partial: max EMPTY, sum 0),
    // the rest of the first chunk is masked.
    var lowest = 0u;
    if (p.window > 0u && at + 1u > p.window) { lowest = at + 1u - p.window; }
    let start = begin + (max(lowest, begin) - begin) / CHUNK * CHUNK;
    let group = p.hq / p.hkv;
    let kvh = h / group;
    let k_off = p.hq * HEAD_DIM + kvh * HEAD_DIM;
    let v_off = (p.hq + p.hkv) * HEAD_DIM + kvh * HEAD_DIM;

    // Append this token's key and value first: once per kv head, by the first query head
    // of its group in the range holding the token's own position; its loads then overlap
    // the query's. No workgroup of this pass reads cache rows >= pos0 (in a ring, the
    // rows it overwrites hold keys out of every token's window), so the writes race with
    // nothing.
    if (h % group == 0u && at < begin + p.range_len && (RING || at < p.n_ctx)) {
        append_key_value(lid, WG, i, at, kvh, k_off, v_off);
    }
    stage_query(lid, WG, i, h, at);
    workgroupBarrier();

    let lane = lid % KEY_LANES;
    let slot = lid / KEY_LANES;
    let groups = value_groups(WG);
    let g = lid / HEAD_DIM;
    var m_run = EMPTY;   // the range's max score so far
    var l_run = 0.0;     // thread lid's key's exps so far, relative to m_run
    var acc = 0.0;       // element lid % HEAD_DIM of value group g's sum, relative to m_run
    for (var c0 = start; c0 < end; c0 = c0 + CHUNK) {
        let n_keys = min(CHUNK, end - c0);
        // Partial scores of keys c0 + slot and c0 + slot + SLOTS (both from the cache
        // when they are in it: sixteen loads in flight).
        let j = c0 + slot;
        let j2 = j + SLOTS;
        if (slot + SLOTS < n_keys && j2 < pos0) {
            let parts = cached_key_parts((cache_row(j) * p.hkv + kvh) * HEAD_DIM,
                                         (cache_row(j2) * p.hkv + kvh) * HEAD_DIM, lane);
            key_parts[slot * KEY_LANES + lane] = parts.x;
            key_parts[(slot + SLOTS) * KEY_LANES + lane] = parts.y;
        } else {
            if (slot < n_keys) { key_parts[slot * KEY_LANES + lane] = key_part(j, lane, pos0, kvh, k_off); }
            if (slot + SLOTS < n_keys) {
                key_parts[(slot + SLOTS) * KEY_LANES + lane] = key_part(j2, lane, pos0, kvh, k_off);
            }
        }
        workgroupBarrier();
        var sc = EMPTY;
        if (lid < n_keys && c0 + lid >= lowest) {
            sc = 0.0;
            for (var u = 0u; u < KEY_LANES; u = u + 1u) { sc = sc + key_parts[lid * KEY_LANES + u]; }
            // tanh of a clamped argument: some drivers compute it as a ratio of exps, NaN
            // for large ones (tanh(15) is 1 in f32 already).
            if (p.softcap > 0.0) { sc = p.softcap * tanh(clamp(sc / p.softcap, -15.0, 15.0)); }
        }
        // Online softmax: the chunk's max joins the range's, earlier sums are rescaled.
        let m = max(m_run, reduce(lid, sc, true, CHUNK));
        let rescale = exp(m_run - m);  // 0 for the first chunk (m_run = EMPTY)
        let e = select(0.0, exp(sc - m), lid < n_keys && c0 + lid >= lowest);
        exps[lid] = e;
        l_run = l_run * rescale + e;
        m_run = m;
        workgroupBarrier();
        if (g < groups) {
            acc = acc * rescale + weighted_values(lid % HEAD_DIM, g, groups, c0, cache_row(c0),
                                                  n_keys, pos0,
                                                  kvh, v_off);
        }
        workgroupBarrier();  // key_parts and exps are rewritten by the next chunk
    }
    let l = reduce(lid, l_run, false, CHUNK);
    scratch[lid] = acc;
    workgroupBarrier();
    let base = ((i * p.hq + h) * p.n_ranges + r) * PART_STRIDE;
    if (lid < HEAD_DIM) {
        let sum = group_sum(lid, groups);
        if (p.n_ranges == 1u) {
            // One range holds every key: the output itself, no `combine` pass. A token
            // beyond the recorded bound gets NaN, as in `combine`.
            let nan = bitcast<f32>(0x7fc00000u | (p.hq & 0u));
            out[(i * p.hq + h) * HEAD_DIM + lid] = select(sum / l, nan, at >= p.max_keys);
        } else {
            part[base + lid] = sum;
        }
    }
    if (p.n_ranges > 1u && lid == 0u) {
        part[base + PART_MAX] = m_run;
        part[base + PART_SUM] = l;
    }
}

@compute @workgroup_size(COMBINE_WG)
fn combine(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid3: vec3<u32>) {
    let lid = lid3.x;
    let h = wid.x;
    let i = wid.y;
    let at = u32(state[1]) + i;
    // Keys beyond the bound (or the cache) were never seen: say so with NaN rather than
    // return attention over part of them; the host cannot check, as the position lives
    // on the device. (Not a constant: WGSL forbids constant NaN.)
    let unseen = at >= p.max_keys;
    let nan = bitcast<f32>(0x7fc00000u | (p.hq & 0u));
    let n_used = min(at / p.range_len + 1u, p.n_ranges);
    let first = (i * p.hq + h) * p.n_ranges;
    let stride = PART_STRIDE;
    var mx = EMPTY;
    for (var r = lid; r < n_used; r = r + COMBINE_WG) { mx = max(mx, part[(first + r) * stride + PART_MAX]); }
    mx = reduce(lid, mx, true, COMBINE_WG);
    // Ranges' weights relative to the common max, computed once: weights[r] for r < COMBINE_WG.
    for (var r = lid; r < min(n_used, COMBINE_WG); r = r + COMBINE_WG) {
        weights[r] = exp(part[(first + r) * stride + PART_MAX] - mx);
    }
    var total = 0.0;
    for (var r = lid; r < n_used; r = r + COMBINE_WG) {
        let b = (first + r) * stride;
        total = total + exp(part[b + PART_MAX] - mx) * part[b + PART_SUM];
    }
    total = reduce(lid, total, false, COMBINE_WG);
    workgroupBarrier();
    let groups = value_groups(COMBINE_WG);
    let g = lid / HEAD_DIM;
    if (g < groups) {
        for (var c = lid % HEAD_DIM; c < HEAD_DIM; c = c + COMBINE_WG) {
            var a4 = vec4<f32>(0.0);
            var r = g;
            for (; r + 3u * groups < min(n_used, COMBINE_WG); r = r + 4u * groups) {
                let b = (first + r) * stride + c;
                let step = groups * stride;
                a4 = a4 + vec4<f32>(weights[r], weights[r + groups], weights[r + 2u * groups],
                                    weights[r + 3u * groups])
                        * vec4<f32>(part[b], part[b + step], part[b + 2u * step], part[b + 3u * step]);
            }
            var acc = a4.x + a4.y + a4.z + a4.w;
            for (; r < n_used; r = r + groups) {
                let b = (first + r) * stride;
                acc = acc + exp(part[b + PART_MAX] - mx) * part[b + c];
            }
            scratch[lid] = acc;
            if (groups == 1u) { out[(i * p.hq + h) * HEAD_DIM + c] = select(acc / total, nan, unseen); }
        }
    }
    if (groups > 1u) {
        workgroupBarrier();
        if (lid < HEAD_DIM) {
            out[(i * p.hq + h) * HEAD_DIM + lid] = select(group_sum(lid, groups) / total, nan, unseen);
        }
    }
}

fn exps4(u: vec4<u32>) -> vec4<f32> {
    return vec4<f32>(exps[u.x], exps[u.y], exps[u.z], exps[u.w]);
}

// Sum of exps[u] * V of position first + u (cache row first_row + u), element c, over
// u = g, g + groups, .. < n_keys,
// sixteen (then eight) loads in flight per trip while the rows are in the cache (below
// pos0). Rows at pos0 and later come from qkv (new tokens of this pass).
fn weighted_values(c: u32, g: u32, groups: u32, first: u32, first_row: u32, n_keys: u32, pos0: u32,
                   kvh: u32, v_off: u32) -> f32 {
    var a = vec4<f32>(0.0);
    var b = vec4<f32>(0.0);
    var a2 = vec4<f32>(0.0);
    var b2 = vec4<f32>(0.0);
    var u = g;
    let step = groups * p.hkv * HEAD_DIM;
    let cached = min(n_keys, pos0 - min(first, pos0));  // keys of the cache among them
    for (; u + 15u * groups < cached; u = u + 16u * groups) {
        let v0 = ((first_row + u) * p.hkv + kvh) * HEAD_DIM + c;
        let v8 = v0 + 8u * step;
        let u8 = u + 8u * groups;
        a = a + vec4<f32>(exps[u], exps[u + groups], exps[u + 2u * groups], exps[u + 3u * groups])
              * vec4<f32>(value_at(v0), value_at(v0 + step), value_at(v0 + 2u * step),
                          value_at(v0 + 3u * step));
        b = b + vec4<f32>(exps[u + 4u * groups], exps[u + 5u * groups], exps[u + 6u * groups],
                          exps[u + 7u * groups])
              * vec4<f32>(value_at(v0 + 4u * step), value_at(v0 + 5u * step),
                          value_at(v0 + 6u * step), value_at(v0 + 7u * step));
        a2 = a2 + vec4<f32>(exps[u8], exps[u8 + groups], exps[u8 + 2u * groups], exps[u8 + 3u * groups])
              * vec4<f32>(value_at(v8), value_at(v8 + step), value_at(v8 + 2u * step),
                          value_at(v8 + 3u * step));
        b2 = b2 + vec4<f32>(exps[u8 + 4u * groups], exps[u8 + 5u * groups], exps[u8 + 6u * groups],
                          exps[u8 + 7u * groups])
              * vec4<f32>(value_at(v8 + 4u * step), value_at(v8 + 5u * step),
                          value_at(v8 + 6u * step), value_at(v8 + 7u * step));
    }
    // The last cached keys (fewer than sixteen per group): trips of eight loads, clamped
    // to the last cached row and weighted 0 beyond it, instead of a chain of single loads.
    for (; u < cached; u = u + 8u * groups) {
        let u0 = vec4<u32>(u) + vec4<u32>(0u, 1u, 2u, 3u) * groups;  // keys u0, then u4
        let u4 = u0 + vec4<u32>(4u * groups);
        let e0 = select(vec4<f32>(0.0), exps4(min(u0, vec4<u32>(WG - 1u))), u0 < vec4<u32>(cached));
        let e4 = select(vec4<f32>(0.0), exps4(min(u4, vec4<u32>(WG - 1u))), u4 < vec4<u32>(cached));
        let last = vec4<u32>(cached - 1u);
        let r0 = ((first_row + min(u0, last)) * p.hkv + kvh) * HEAD_DIM + c;
        let r4 = ((first_row + min(u4, last)) * p.hkv + kvh) * HEAD_DIM + c;
        a = a + e0 * vec4<f32>(value_at(r0.x), value_at(r0.y), value_at(r0.z), value_at(r0.w));
        b = b + e4 * vec4<f32>(value_at(r4.x), value_at(r4.y), value_at(r4.z), value_at(r4.w));
    }
    let ab = a + b + a2 + b2;
    var sum = ab.x + ab.y + ab.z + ab.w;
    // Keys from this pass's new tokens (at pos0 and later) come from qkv.
    for (u = cached + (g + groups - cached % groups) % groups; u < n_keys; u = u + groups) {
        sum = sum + exps[u] * stored(qkv[(first + u - pos0) * row_len() + v_off + c]);
    }
    return sum;
}

// Lane `lane`'s parts of the scores of the two cached keys whose rows start at elements
// kb and kb2: of elements lane, lane + KEY_LANES, .. (float32: all sixteen loads in
// flight at once), or of float16 groups of eight (KEY_OCTETS) or pairs.
fn cached_key_parts(kb: u32, kb2: u32, lane: u32) -> vec2<f32> {
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

// cached_key_parts of float16 keys whose rows start at units u and u2 (of eight values):
// lane takes units lane, lane + KEY_LANES, .., a vec4<u32> load each (the whole row in
// one load a lane for heads of 64).
fn half_key_parts(u: u32, u2: u32, lane: u32) -> vec2<f32> {
    var a = vec4<f32>(0.0);
    var b = vec4<f32>(0.0);
    for (var o = lane; o < HEAD_DIM / 8u; o = o + KEY_LANES) {
        let k = k_cache[u + o];
        let k2 = k_cache[u2 + o];
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

// cached_key_parts of float16 keys whose rows start at words w and w2 (rows not of whole
// units): lane takes words lane, lane + KEY_LANES, .., two values a load.
fn half_pair_key_parts(w: u32, w2: u32, lane: u32) -> vec2<f32> {
    var a = vec2<f32>(0.0);
    var b = vec2<f32>(0.0);
    for (var o = lane; o < HEAD_DIM / 2u; o = o + KEY_LANES) {
        let q = vec2<f32>(q_row[2u * o], q_row[2u * o + 1u]);
        let x = w + o;
        let x2 = w2 + o;
        a = a + q * unpack2x16float(k_cache[x / 4u][x % 4u]);
        b = b + q * unpack2x16float(k_cache[x2 / 4u][x2 % 4u]);
    }
    return vec2<f32>(a.x + a.y, b.x + b.y);
}

// Lane `lane`'s part of key j's score: from the cache below pos0, else from qkv.
fn key_part(j: u32, lane: u32, pos0: u32, kvh: u32, k_off: u32) -> f32 {
    if (j < pos0) {
        let kb = (cache_row(j) * p.hkv + kvh) * HEAD_DIM;
        return cached_key_parts(kb, kb, lane).x;  // one key: its row twice (cached loads)
    }
    let kb = (j - pos0) * row_len() + k_off;
    var acc = 0.0;
    for (var c = lane; c < HEAD_DIM; c = c + KEY_LANES) { acc = acc + q_row[c] * stored(rotated(kb, c, j)); }
    return acc;
}
