"""Attention over a KV cache in PTX (pxvm.ops.transformer.attention_cached on CUDA): S new
tokens at positions pos .. pos + S - 1, pos = state[1] read on the device, so that one
captured decoding step serves every position.

qkv (S, (Hq + 2 Hkv) D) holds each token's query heads, key heads and value heads; the
caches are (n_ctx, Hkv, D), position j in row j (in row j % n_ctx where RING: a
sliding-window layer's cache, big enough that the new rows overwrite only keys no new
token sees). Rotary embedding comes from a host table (positions, D / 2, [cos, sin]);
NEOX rotates pairs (c, c + D/2), else (2c, 2c + 1).

Two kernels, launched in this order on one stream:
- `append` (prompts): the new keys (rotated) and values into the caches, a thread an
  element; so `attend` reads every key from the cache, none racing with its write. A
  single token's (decoding's) `attend` appends it itself (its `appends`).
- `attend`: block (range r, query head h, token i) attends over keys r * range_len ..
  (those token i sees: up to its own position, its last `window` where window > 0),
  CHUNK keys a trip with an online softmax: a thread scores a key (its dot product with
  the staged query), the block takes the chunk's max (earlier sums are rescaled to it),
  then threads (value group g, element d) add up exp(score) * V over the group's keys.
  With one range it writes the normalised output; with several, each range's partial
  result (pxvm.ops.layouts.AttentionPartials' record: D sums, max, sum of exps), and the
  last of a head's blocks to finish (a count per head, `counts`, zero between launches)
  merges the records, rescaled to their common max.
Tokens at max_keys and beyond (which the host cannot check, as the position lives on
the device) get NaN rows and are not appended.

One module for the kernel family: append, attend and the merge share the cache layout,
the ranges and the partial records, which split across files would have to agree on.
"""

from __future__ import annotations

from .builder import Kernel, Reg, f32
from .elementwise import _exp, _store, _store_half, _unary_math
from .rows import THREADS, _block_reduce

#: Keys a trip of `attend` scores: one a thread.
CHUNK = THREADS
#: A key's head elements read per trip of its dot product: all 64 at once (sixteen
#: 16-byte loads in flight) where D is a multiple of 64, 16 where of 16, 4 where of 4,
#: else 2 (D is even).
VECS = (64, 16, 4, 2)
#: Keys of a value group whose loads are issued before their products.
VALUE_UNROLL = 8
#: Ranges whose records a thread of the merge reads before adding them up.
MERGE_UNROLL = 8
#: The most key ranges a head's keys may be cut into (a thread of the merge each).
MAX_RANGES = THREADS
#: The score of a key outside the range: finite, so exp(EMPTY - max) is 0 without inf
#: arithmetic.
EMPTY = -3.0e38


def _name(base: str, neox: bool, ring: bool) -> str:
    return f"{base}_{'neox' if neox else 'interleaved'}{'_ring' if ring else ''}"


def rotated(k: Kernel, qkv: Reg, table: Reg, base: Reg, c: Reg, pos: Reg, half: Reg,
            neox: bool) -> Reg:
    """Element c of the head vector qkv[base .. base + D) rotated to position `pos`."""
    if neox:
        first = k.setp("lt.u32", c, half)
        below = k.op("sub.u32", c, half)
        pair = k.op("selp.u32", c, below, first)
        partner = k.op("selp.u32", k.op("add.u32", c, half), below, first)
    else:
        first = k.setp("eq.u32", k.op("and.b32", c, 1), 0)
        pair = k.op("shr.u32", c, 1)
        partner = k.op("xor.b32", c, 1)
    entry = k.element(table, k.op("mad.lo.u32", pos, half, pair), 8)
    cos, sin = k.load("f32", entry), k.load("f32", f"{entry}+4")
    a = k.load("f32", k.element(qkv, k.op("add.u32", base, c), 4))
    b = k.load("f32", k.element(qkv, k.op("add.u32", base, partner), 4))
    # the pair (x0, x1) becomes (x0 cos - x1 sin, x0 sin + x1 cos); a is this element
    as_first = k.op("sub.f32", k.op("mul.f32", a, cos), k.op("mul.f32", b, sin))
    as_second = k.op("fma.rn.f32", b, sin, k.op("mul.f32", a, cos))
    return k.op("selp.f32", as_first, as_second, first)


def _position(k: Kernel, state: Reg, token: Reg, max_keys: Reg) -> tuple[Reg, Reg]:
    """(token's position pos + token, whether it is beyond max_keys): a negative pos
    reads as a huge unsigned one, beyond too."""
    pos = k.load("u32", f"{state}+4")
    at = k.op("add.u32", pos, token)
    beyond = k.op("or.pred", k.setp("ge.u32", pos, max_keys), k.setp("ge.u32", at, max_keys))
    return at, beyond


def _cache_row(k: Kernel, position: Reg, n_ctx: Reg, ring: bool) -> Reg:
    return k.op("rem.u32", position, n_ctx) if ring else position


def append(neox: bool, ring: bool) -> Kernel:
    """k_cache[row(pos + i), kvh, c] = rotated key element, v_cache[..] = value element,
    a thread an element of the S * Hkv * D (grid-stride)."""
    k = Kernel(_name("cached_append", neox, ring),
               [("qkv", "u64"), ("k_cache", "u64"), ("v_cache", "u64"), ("state", "u64"),
                ("table", "u64"), ("elements", "u32"), ("hq", "u32"), ("hkv", "u32"),
                ("head_dim", "u32"), ("n_ctx", "u32"), ("max_keys", "u32")])
    qkv, k_cache, v_cache, state, table, elements, hq, hkv, d, n_ctx, max_keys = k.params()
    half = k.op("shr.u32", d, 1)
    row_len = k.op("mul.lo.u32", k.op("add.u32", hq, k.op("shl.b32", hkv, 1)), d)
    t, stride = k.grid_stride()
    with k.loop(t, elements, stride):
        c = k.op("rem.u32", t, d)
        head_row = k.op("div.u32", t, d)  # token * Hkv + kv head
        kvh = k.op("rem.u32", head_row, hkv)
        token = k.op("div.u32", head_row, hkv)
        at, beyond = _position(k, state, token, max_keys)
        with k.if_(k.op("not.pred", beyond)):
            head = k.op("add.u32", hq, kvh)  # the key head's place among the row's heads
            key = k.op("mad.lo.u32", token, row_len, k.op("mul.lo.u32", head, d))
            value = k.op("add.u32", key, k.op("mul.lo.u32", hkv, d))
            row = _cache_row(k, at, n_ctx, ring)
            slot = k.op("mad.lo.u32", k.op("mad.lo.u32", row, hkv, kvh), d, c)
            k.store("f32", k.element(k_cache, slot, 4),
                    rotated(k, qkv, table, key, c, at, half, neox))
            k.store("f32", k.element(v_cache, slot, 4),
                    k.load("f32", k.element(qkv, k.op("add.u32", value, c), 4)))
    return k


def flash_inputs(neox: bool) -> Kernel:
    """A prompt's inputs to the tensor-core attention (ptx.attention.flash_f16,
    positioned), a thread an element, grid-stride: of the S new tokens' qkv, the query
    heads rotated into q16 (S, Hq, D) float16 (NaN rows for tokens at max_keys and
    beyond), the key heads rotated and the value heads into the caches (as `append`) and
    into k16, v16 (max_keys, Hkv, D) float16; then the cache rows of the pos earlier
    positions into k16, v16. Not for rings."""
    k = Kernel(f"flash_inputs_{'neox' if neox else 'interleaved'}",
               [("qkv", "u64"), ("k_cache", "u64"), ("v_cache", "u64"), ("state", "u64"),
                ("table", "u64"), ("q16", "u64"), ("k16", "u64"), ("v16", "u64"),
                ("tokens", "u32"), ("hq", "u32"), ("hkv", "u32"), ("head_dim", "u32"),
                ("max_keys", "u32")])
    (qkv, k_cache, v_cache, state, table, q16, k16, v16, tokens, hq, hkv, d,
     max_keys) = k.params()
    half = k.op("shr.u32", d, 1)
    heads = k.op("add.u32", hq, k.op("shl.b32", hkv, 1))
    row_len = k.op("mul.lo.u32", heads, d)
    new = k.op("mul.lo.u32", tokens, row_len)
    pos = k.load("u32", f"{state}+4")
    row_elements = k.op("mul.lo.u32", hkv, d)
    old = k.op("mul.lo.u32", k.op("min.u32", pos, max_keys), row_elements)  # of K, of V
    total = k.op("add.u32", new, k.op("shl.b32", old, 1))

    t, stride = k.grid_stride()
    with k.loop(t, total, stride):
        with k.if_(k.setp("lt.u32", t, new)):
            token = k.op("div.u32", t, row_len)
            within = k.op("rem.u32", t, row_len)
            slot, c = k.op("div.u32", within, d), k.op("rem.u32", within, d)
            at, beyond = _position(k, state, token, max_keys)
            base = k.op("sub.u32", t, c)  # the head's first element in qkv
            with k.if_(k.setp("lt.u32", slot, hq)):  # a query head
                q = rotated(k, qkv, table, base, c, at, half, neox)
                q = k.op("selp.f32", f32(float("nan")), q, beyond)
                _store_half(k, q16, k.op("mad.lo.u32", k.op("mad.lo.u32", token, hq, slot), d, c),
                            [q])
            kv = k.op("sub.u32", slot, hq)
            is_key = k.setp("lt.u32", kv, hkv)
            with k.if_(k.op("and.pred", k.setp("ge.u32", slot, hq), k.op("not.pred", beyond))):
                kvh = k.op("selp.u32", kv, k.op("sub.u32", kv, hkv), is_key)
                cache_at = k.op("mad.lo.u32", k.op("mad.lo.u32", at, hkv, kvh), d, c)
                with k.if_(is_key):
                    key = rotated(k, qkv, table, base, c, at, half, neox)
                    k.store("f32", k.element(k_cache, cache_at, 4), key)
                    _store_half(k, k16, cache_at, [key])
                with k.if_(k.op("not.pred", is_key)):
                    value = k.load("f32", k.element(qkv, t, 4))
                    k.store("f32", k.element(v_cache, cache_at, 4), value)
                    _store_half(k, v16, cache_at, [value])
        with k.if_(k.setp("ge.u32", t, new)):  # an earlier position's key or value
            e = k.op("sub.u32", t, new)
            is_key = k.setp("lt.u32", e, old)
            index = k.op("selp.u32", e, k.op("sub.u32", e, old), is_key)
            with k.if_(is_key):
                _store_half(k, k16, index, [k.load("f32", k.element(k_cache, index, 4))])
            with k.if_(k.op("not.pred", is_key)):
                _store_half(k, v16, index, [k.load("f32", k.element(v_cache, index, 4))])
    return k


def _dot(k: Kernel, key: Reg, query: Reg, d: Reg, vec: int, space: str = "global",
         preloaded: tuple[list[Reg], Reg] | None = None) -> Reg:
    """sum over c < D of key[c] * query[c]: key an address of `space` (global, "":
    generic), query a shared one, `vec` elements a trip. `preloaded`: (registers holding
    the key's first `vec` elements, loaded before the kernel waited; a predicate that
    holds where they are not the key's, which the first trip then loads as the others)."""
    acc = [k.op("mov.f32", f32(0.0)) for _ in range(2)]
    c = k.op("mov.u32", 0)
    with k.loop(c, d, vec):
        offset = k.op("mul.lo.u32", c, 4)
        key_at = k.op("add.u64", key, k.op("cvt.u64.u32", offset))
        query_at = k.op("add.u32", query, offset)
        width = min(vec, 4)
        load = None
        if preloaded is not None:
            load = k.op("or.pred", preloaded[1], k.setp("ne.u32", c, 0))
        for part in range(vec // width):
            where = f"{key_at}+{16 * part}"
            if preloaded is None:
                keys = k.load_vector("f32", where, width, space=space)
            else:  # the same registers: a load left out keeps the preloaded values
                keys = preloaded[0][part * width:(part + 1) * width]
                instr = f"ld.{space}.v{width}.f32" if space else f"ld.v{width}.f32"
                k.emit(f"@{load} {instr} {{{', '.join(map(str, keys))}}}, [{where}]")
            queries = k.load_vector("f32", f"{query_at}+{16 * part}", width, space="shared")
            for e, (x, y) in enumerate(zip(keys, queries)):
                k.to(acc[e % 2], "fma.rn.f32", x, y, acc[e % 2])
    return k.op("add.f32", acc[0], acc[1])


def _range_keys(k: Kernel, at: Reg, begin: Reg, range_len: Reg,
                window: Reg) -> tuple[Reg, Reg]:
    """(first, end) of the keys of the range from `begin` that the token at position
    `at` sees: up to its own, its last `window` where window > 0."""
    seen = k.op("add.u32", at, 1)
    end = k.op("min.u32", k.op("add.u32", begin, range_len), seen)
    windowed = k.op("and.pred", k.setp("ne.u32", window, 0), k.setp("gt.u32", seen, window))
    lowest = k.op("selp.u32", k.op("sub.u32", seen, window), 0, windowed)
    return k.op("max.u32", begin, lowest), end


def _key_address(k: Kernel, k_head: Reg, position: Reg, n_ctx: Reg, row_stride: Reg,
                 ring: bool) -> Reg:
    """The address of the key at `position` in its KV head's cache rows (k_head)."""
    row = _cache_row(k, position, n_ctx, ring)
    return k.op("add.u64", k_head, k.op("mul.wide.u32", row, row_stride))


def _value_addresses(k: Kernel, v_first: Reg, key_first: Reg, u: Reg, n_ctx: Reg,
                     row_stride: Reg, ring: bool) -> tuple[Reg, Reg]:
    """(position of key key_first + u, the address of its V element in the cache)."""
    key = k.op("add.u32", key_first, u)
    row = _cache_row(k, key, n_ctx, ring)
    return key, k.op("add.u64", v_first, k.op("mul.wide.u32", row, row_stride))


def _weighted_values(k: Kernel, v_first: Reg, key_first: Reg, g: Reg, groups: Reg,
                     n_keys: Reg, exps: Reg, n_ctx: Reg, row_stride: Reg, ring: bool,
                     new: tuple[Reg, Reg] | None = None,
                     preloaded: tuple[list[Reg], Reg] | None = None) -> Reg:
    """sum over u = g, g + groups, .. < n_keys of exps[u] (shared) * V element of key
    key_first + u (v_first: the element's address in the cache row of position 0;
    row_stride: bytes between cache rows), in batches of VALUE_UNROLL keys whose loads
    are issued before their products (predicated on the key being one of n_keys).
    `new`: (position, generic address of its element): that key's value is read there,
    not from the cache. `preloaded`: (the first batch's values, loaded before the kernel
    waited, the new key's excepted; a predicate that holds where they are not this
    chunk's): the first batch loads only the new key's then."""
    def weight(u: Reg, present: Reg) -> Reg:
        w = k.op("mov.f32", f32(0.0))  # keys past the chunk: no exps entry to read
        return k.to(w, "ld.shared.f32", f"[{k.op('mad.lo.u32', u, 4, exps)}]", pred=present)

    total = k.op("mov.f32", f32(0.0))
    b = k.op("mov.u32", g)  # the batch's first key
    with k.loop(b, n_keys, k.op("mul.lo.u32", groups, VALUE_UNROLL)):
        batch = []
        reload = None
        if preloaded is not None:
            reload = k.op("or.pred", preloaded[1], k.setp("ne.u32", b, g))
        for j in range(VALUE_UNROLL):
            u = k.op("mad.lo.u32", groups, j, b)
            in_chunk = present = k.setp("lt.u32", u, n_keys)
            key, cached = _value_addresses(k, v_first, key_first, u, n_ctx, row_stride, ring)
            value = preloaded[0][j] if preloaded is not None else k.op("mov.f32", f32(0.0))
            fresh = None
            if new is None:
                address, space = cached, "global"
            else:
                at, staged = new
                fresh = k.setp("eq.u32", key, at)
                address = k.op("selp.b64", staged, k.op("cvta.global.u64", cached), fresh)
                space = ""
            if reload is not None:  # the preloaded batch loads the new key's value only
                present = k.op("and.pred", present,
                               reload if fresh is None else k.op("or.pred", reload, fresh))
            k.to(value, f"ld.{space}.f32" if space else "ld.f32", f"[{address}]", pred=present)
            batch.append((u, in_chunk, value))
        for u, present, value in batch:
            k.to(total, "fma.rn.f32", weight(u, present), value, total)
    return total


def _early_loads(k: Kernel, state: Reg, token: Reg, begin: Reg, range_len: Reg,
                 window: Reg, tid: Reg, n_ctx: Reg, ring: bool,
                 key_row: tuple[Reg, Reg], value_group: tuple[Reg, Reg, Reg], vec: int):
    """The range's first chunk of keys and values, loaded into registers before the
    kernel waits for its predecessor (no predecessor writes a cache row but the new
    token's, which is left out): thread t the first `vec` elements of key t, thread
    (g, e) element e of the first batch of its value group's keys (_weighted_values').
    The position is read through L2 (.cg), so that no copy of it stays in L1 for the
    read after the wait. Returns (the key registers, the value registers, the first
    key's position, the token's position as read)."""
    k_head, row_stride = key_row
    v_first, g, groups = value_group
    at = k.op("add.u32", k.op("ld.global.cg.u32", f"[{state}+4]"), token)
    first, end = _range_keys(k, at, begin, range_len, window)
    n_keys = k.op("selp.u32", k.op("min.u32", k.op("sub.u32", end, first), CHUNK), 0,
                  k.setp("gt.u32", end, first))
    keys = [k.op("mov.f32", f32(0.0)) for _ in range(vec)]
    position = k.op("add.u32", first, tid)
    mine = k.op("and.pred", k.setp("lt.u32", tid, n_keys), k.setp("ne.u32", position, at))
    key = _key_address(k, k_head, position, n_ctx, row_stride, ring)
    width = min(vec, 4)
    for part in range(vec // width):
        regs = ", ".join(map(str, keys[part * width:(part + 1) * width]))
        k.emit(f"@{mine} ld.global.cg.v{width}.f32 {{{regs}}}, [{key}+{16 * part}]")
    values = []
    in_group = k.setp("lt.u32", g, groups)
    for j in range(VALUE_UNROLL):
        u = k.op("mad.lo.u32", groups, j, g)
        key_position, cached = _value_addresses(k, v_first, first, u, n_ctx, row_stride, ring)
        present = k.op("and.pred", k.op("and.pred", in_group, k.setp("lt.u32", u, n_keys)),
                       k.setp("ne.u32", key_position, at))
        values.append(k.to(k.op("mov.f32", f32(0.0)), "ld.global.cg.f32", f"[{cached}]",
                           pred=present))
    return keys, values, first, at


def _put(k: Kernel, out: Reg, index: Reg, value, half: bool) -> None:
    """Output element `index`: float32, or float16 where `half`."""
    (_store_half if half else _store)(k, out, index, [value])


def attend(neox: bool, ring: bool, vec: int, half: bool = False,
           appends: bool = False, early: bool = False) -> Kernel:
    """Grid (n_ranges, Hq, S), THREADS threads: token i's query head h over range r's
    keys (module docstring); D elements of a key read `vec` a trip. `half`: the output
    in float16 (what a prompt's tensor-core output projection reads). `appends` (one
    token: decoding): `append`'s work done here, one launch fewer: each block stages the
    new key (rotated) and value in shared memory and reads them there, and the block of
    the key's range and of its KV head's first query head writes them to the caches (no
    block of the launch reads that row from the cache). `early` (with `appends`, for
    sm_90): the range's first keys and values are loaded before the kernel waits for its
    predecessor (the QKV product, in decoding's graphs: _early_loads)."""
    if early and not appends:
        raise ValueError("early loads are for decoding's attention (appends)")
    k = Kernel(f"{_name('cached_attend', neox, ring)}_v{vec}{'_f16' if half else ''}"
               f"{'_appends' if appends else ''}{'_early' if early else ''}",
               [("qkv", "u64"), ("k_cache", "u64"), ("v_cache", "u64"), ("state", "u64"),
                ("table", "u64"), ("part", "u64"), ("counts", "u64"), ("out", "u64"),
                ("hq", "u32"), ("hkv", "u32"), ("head_dim", "u32"), ("n_ctx", "u32"),
                ("n_ranges", "u32"), ("range_len", "u32"), ("max_keys", "u32"),
                ("scale", "f32"), ("softcap", "f32"), ("window", "u32")],
               arch="sm_90" if early else None)
    (qkv, k_cache, v_cache, state, table, part, counts, out, hq, hkv, d, n_ctx, n_ranges,
     range_len, max_keys, scale, softcap, window) = k.params()
    scratch = k.shared("partial", "f32", THREADS // 32, 16)
    query = k.op("mov.u32", k.shared("query", "f32", THREADS, 16))
    exps = k.op("mov.u32", k.shared("exps", "f32", CHUNK, 16))
    sums = k.op("mov.u32", k.shared("sums", "f32", THREADS, 16))
    tid = k.special("%tid.x")
    r, h, token = k.special("%ctaid.x"), k.special("%ctaid.y"), k.special("%ctaid.z")
    one_range = k.setp("eq.u32", n_ranges, 1)
    head = k.op("mad.lo.u32", token, hq, h)
    head_out = k.op("mad.lo.u32", head, d, tid)
    begin = k.op("mul.lo.u32", r, range_len)
    # where the KV head's keys and this thread's value elements are in the caches
    kvh = k.op("div.u32", h, k.op("div.u32", hq, hkv))
    row_stride = k.op("mul.lo.u32", k.op("mul.lo.u32", hkv, d), 4)  # bytes between rows
    head_offset = k.op("mul.wide.u32", k.op("mul.lo.u32", kvh, d), 4)
    k_head = k.op("add.u64", k_cache, head_offset)
    groups = k.op("max.u32", k.op("div.u32", THREADS, d), 1)  # value groups of D threads
    g = k.op("div.u32", tid, d)
    element = k.op("rem.u32", tid, d)
    in_group = k.setp("lt.u32", g, groups)
    v_first = k.op("add.u64", k.op("add.u64", v_cache, head_offset),
                   k.op("mul.wide.u32", element, 4))
    if early:
        early_keys, early_values, early_first, early_at = _early_loads(
            k, state, token, begin, range_len, window, tid, n_ctx, ring,
            (k_head, row_stride), (v_first, g, groups), vec)
    k.wait_for_predecessors()
    at, beyond = _position(k, state, token, max_keys)
    with k.if_(beyond):  # NaN rows, written by the first range's block
        with k.if_(k.op("and.pred", k.setp("eq.u32", r, 0), k.setp("lt.u32", tid, d))):
            _put(k, out, head_out, f32(float("nan")), half)
        k.emit("ret")
    with k.if_(k.setp("gt.u32", begin, at)):  # a range past the token's keys: not read
        k.emit("ret")
    c0, end = _range_keys(k, at, begin, range_len, window)

    # the query head, rotated and scaled, staged in shared memory
    row_len = k.op("mul.lo.u32", k.op("add.u32", hq, k.op("shl.b32", hkv, 1)), d)
    with k.if_(k.setp("lt.u32", tid, d)):
        base = k.op("mad.lo.u32", token, row_len, k.op("mul.lo.u32", h, d))
        q = rotated(k, qkv, table, base, tid, at, k.op("shr.u32", d, 1), neox)
        k.store("f32", k.op("mad.lo.u32", tid, 4, query), k.op("mul.f32", q, scale),
                space="shared")
    new = None
    if appends:
        new_key = k.op("mov.u32", k.shared("new_key", "f32", THREADS, 16))
        new_value = k.op("mov.u32", k.shared("new_value", "f32", THREADS, 16))
        with k.if_(k.setp("lt.u32", tid, d)):
            key_base = k.op("mad.lo.u32", token, row_len,
                            k.op("mul.lo.u32", k.op("add.u32", hq, kvh), d))
            key = rotated(k, qkv, table, key_base, tid, at, k.op("shr.u32", d, 1), neox)
            value = k.load("f32", k.element(
                qkv, k.op("add.u32", k.op("mad.lo.u32", hkv, d, key_base), tid), 4))
            k.store("f32", k.op("mad.lo.u32", tid, 4, new_key), key, space="shared")
            k.store("f32", k.op("mad.lo.u32", tid, 4, new_value), value, space="shared")
            first_of_group = k.setp("eq.u32", k.op("rem.u32", h, k.op("div.u32", hq, hkv)), 0)
            own_range = k.setp("lt.u32", at, k.op("add.u32", begin, range_len))
            with k.if_(k.op("and.pred", first_of_group, own_range)):
                slot = k.op("mad.lo.u32", k.op("mad.lo.u32", _cache_row(k, at, n_ctx, ring),
                                                hkv, kvh), d, tid)
                k.store("f32", k.element(k_cache, slot, 4), key)
                k.store("f32", k.element(v_cache, slot, 4), value)

        def generic(shared_address: Reg) -> Reg:
            return k.op("cvta.shared.u64", k.op("cvt.u64.u32", shared_address))
        new_key_address = generic(new_key)
        new = (at, generic(k.op("mad.lo.u32", k.op("rem.u32", tid, d), 4, new_value)))
    k.emit("bar.sync 0")

    capped = k.setp("gt.f32", softcap, f32(0.0))

    m_run = k.op("mov.f32", f32(EMPTY))  # the range's max score so far
    l_run = k.op("mov.f32", f32(0.0))    # this thread's keys' exps, relative to m_run
    acc = k.op("mov.f32", f32(0.0))      # element `element` of group g's sum, the same
    with k.loop(c0, end, CHUNK):
        n_keys = k.op("min.u32", k.op("sub.u32", end, c0), CHUNK)
        mine = k.setp("lt.u32", tid, n_keys)
        if early:  # the registers hold this chunk's keys and values where it is the first
            # (and the position read before the wait is the one read after)
            later = k.op("or.pred", k.setp("ne.u32", c0, early_first),
                         k.setp("ne.u32", early_at, at))
        score = k.op("mov.f32", f32(EMPTY))
        with k.if_(mine):
            position = k.op("add.u32", c0, tid)
            key = _key_address(k, k_head, position, n_ctx, row_stride, ring)
            if appends:  # the new key from shared memory, through a generic address
                fresh = k.setp("eq.u32", position, at)
                key = k.op("selp.b64", new_key_address, k.op("cvta.global.u64", key), fresh)
                dot = _dot(k, key, query, d, vec, space="",
                           preloaded=(early_keys, k.op("or.pred", later, fresh))
                           if early else None)
            else:
                dot = _dot(k, key, query, d, vec)
            cap = k.op("mul.f32", softcap, _unary_math(k, "tanh", k.op("div.rn.f32", dot, softcap),
                                                       softcap, softcap))
            k.to(score, "selp.f32", cap, dot, capped)
        top = k.op("max.f32", m_run, _block_reduce(k, score, "max.f32", scratch))
        rescale = _exp(k, k.op("sub.f32", m_run, top))  # 0 at the first chunk
        e = k.op("selp.f32", _exp(k, k.op("sub.f32", score, top)), f32(0.0), mine)
        k.store("f32", k.op("mad.lo.u32", tid, 4, exps), e, space="shared")
        k.to(l_run, "fma.rn.f32", l_run, rescale, e)
        k.to(m_run, "mov.f32", top)
        k.emit("bar.sync 0")
        with k.if_(in_group):
            weighted = _weighted_values(k, v_first, c0, g, groups, n_keys, exps, n_ctx,
                                        row_stride, ring, new,
                                        (early_values, later) if early else None)
            k.to(acc, "fma.rn.f32", acc, rescale, weighted)
        k.emit("bar.sync 0")  # exps is rewritten by the next chunk

    total = _block_reduce(k, l_run, "add.f32", scratch)
    k.store("f32", k.op("mad.lo.u32", tid, 4, sums), k.op("selp.f32", acc, f32(0.0), in_group),
            space="shared")
    k.emit("bar.sync 0")
    with k.if_(k.setp("lt.u32", tid, d)):
        value = k.op("mov.f32", f32(0.0))
        u = k.op("mov.u32", 0)
        with k.loop(u, groups, 1):
            slot = k.op("mad.lo.u32", k.op("mad.lo.u32", u, d, tid), 4, sums)
            k.to(value, "add.f32", value, k.load("f32", slot, space="shared"))
        with k.if_(one_range):
            _put(k, out, head_out, k.op("div.rn.f32", value, total), half)
        with k.if_(k.op("not.pred", one_range)):
            record = k.op("mul.lo.u32", k.op("mad.lo.u32", head, n_ranges, r),
                          k.op("add.u32", d, 2))
            k.store("f32", k.element(part, k.op("add.u32", record, tid), 4), value)
            with k.if_(k.setp("eq.u32", tid, 0)):
                tail = k.element(part, k.op("add.u32", record, d), 4)
                k.store("f32", tail, m_run)
                k.store("f32", f"{tail}+4", total)
    with k.if_(k.op("not.pred", one_range)):
        # the last of the head's ranges to finish merges them all (its count goes back
        # to 0 for the next launch): no second kernel, no second launch
        last = k.op("mov.u32", k.shared("last", "u32", 1, 4))
        k.emit("bar.sync 0")
        with k.if_(k.setp("eq.u32", tid, 0)):
            count = k.element(counts, head, 4)
            # release: the block's records (ordered before by the barrier) are visible
            # to whoever counts after; acquire: the others' are visible to this block
            done = k.op("atom.acq_rel.gpu.global.add.u32", f"[{count}]", 1)
            used = _ranges_used(k, at, range_len, n_ranges)
            is_last = k.setp("eq.u32", k.op("add.u32", done, 1), used)
            with k.if_(is_last):
                k.store("u32", count, 0)
            k.store("u32", last, k.op("selp.u32", 1, 0, is_last), space="shared")
        k.emit("bar.sync 0")
        merges = k.setp("ne.u32", k.load("u32", last, space="shared"), 0)
        with k.if_(merges):  # the block's threads all, or none
            _merge(k, part, out, head_out, head, tid, d, n_ranges,
                   _ranges_used(k, at, range_len, n_ranges), half)
    return k


def _ranges_used(k: Kernel, at: Reg, range_len: Reg, n_ranges: Reg) -> Reg:
    """The ranges holding keys of the token at position `at` (later ones return early)."""
    return k.op("min.u32", k.op("add.u32", k.op("div.u32", at, range_len), 1), n_ranges)


def _merge(k: Kernel, part: Reg, out: Reg, head_out: Reg, head: Reg, tid: Reg, d: Reg,
           n_ranges: Reg, used: Reg, half: bool) -> None:
    """A head's output (element e: out's element head_out, float16 where `half`) from
    its `used` ranges' records (D sums, max, sum of exps: AttentionPartials'), rescaled
    to their common max, by every thread of the block in one trip to L2 where it can:
    the block's THREADS / D groups of D threads take every groups-th range, a thread its
    element of MERGE_UNROLL ranges a trip (their sums, maxima and sums of exps loaded
    together), combined online (rescaled to the largest max so far); then the groups'
    results meet in shared memory. Records are read through L2 (.cg): other blocks wrote
    them during this launch."""
    stride_bytes = k.op("mul.lo.u32", k.op("add.u32", d, 2), 4)
    first = k.op("add.u64", part, k.op("mul.wide.u32", k.op("mul.lo.u32", head, n_ranges),
                                        stride_bytes))
    d_bytes = k.op("cvt.u64.u32", k.op("mul.lo.u32", d, 4))
    groups = k.op("max.u32", k.op("div.u32", THREADS, d), 1)
    g = k.op("div.u32", tid, d)
    element_bytes = k.op("cvt.u64.u32", k.op("mul.lo.u32", k.op("rem.u32", tid, d), 4))
    top = k.op("mov.f32", f32(EMPTY))  # this thread's largest max so far
    acc = k.op("mov.f32", f32(0.0))    # its element's sums, relative to top
    total = k.op("mov.f32", f32(0.0))  # its sums of exps, the same
    # a thread past the last whole group (THREADS not a multiple of D) takes no range
    r = k.op("selp.u32", g, used, k.setp("lt.u32", g, groups))
    with k.loop(r, used, k.op("mul.lo.u32", groups, MERGE_UNROLL)):
        loaded = []
        for j in range(MERGE_UNROLL):
            rj = k.op("mad.lo.u32", groups, j, r)
            present = k.setp("lt.u32", rj, used)
            record = k.op("add.u64", first, k.op("mul.wide.u32", rj, stride_bytes))
            tail = k.op("add.u64", record, d_bytes)
            value, top_r, sum_r = (k.op("mov.f32", f32(0.0)), k.op("mov.f32", f32(EMPTY)),
                                   k.op("mov.f32", f32(0.0)))
            k.to(value, "ld.global.cg.f32", f"[{k.op('add.u64', record, element_bytes)}]",
                 pred=present)
            k.to(top_r, "ld.global.cg.f32", f"[{tail}]", pred=present)
            k.to(sum_r, "ld.global.cg.f32", f"[{tail}+4]", pred=present)
            loaded.append((value, top_r, sum_r))
        for value, top_r, sum_r in loaded:
            _rescaled_add(k, (top, acc, total), (top_r, value, sum_r))
    partials = [k.op("mov.u32", k.shared(name, "f32", THREADS, 16))
                for name in ("merge_top", "merge_acc", "merge_total")]
    for array, v in zip(partials, (top, acc, total)):
        k.store("f32", k.op("mad.lo.u32", tid, 4, array), v, space="shared")
    k.emit("bar.sync 0")
    with k.if_(k.setp("lt.u32", tid, d)):  # thread e adds element e of every group
        u = k.op("mov.u32", 1)
        with k.loop(u, groups, 1):
            slot = k.op("mul.lo.u32", k.op("mad.lo.u32", u, d, tid), 4)
            other = [k.load("f32", k.op("add.u32", array, slot), space="shared")
                     for array in partials]
            _rescaled_add(k, (top, acc, total), other)
        _put(k, out, head_out, k.op("div.rn.f32", acc, total), half)


def _rescaled_add(k: Kernel, running: tuple[Reg, Reg, Reg], record) -> None:
    """(max, sums, sum of exps) running += record, both rescaled to their larger max
    (records without keys, max EMPTY and sums 0, add nothing)."""
    top, acc, total = running
    top_r, value, sum_r = record
    larger = k.op("max.f32", top, top_r)
    old = _exp(k, k.op("sub.f32", top, larger))
    new = _exp(k, k.op("sub.f32", top_r, larger))
    k.to(acc, "fma.rn.f32", value, new, k.op("mul.f32", acc, old))
    k.to(total, "fma.rn.f32", sum_r, new, k.op("mul.f32", total, old))
    k.to(top, "mov.f32", larger)


def variants():
    for neox in (False, True):
        for ring in (False, True):
            yield append, (neox, ring)
            for vec in VECS:
                for half, appends in ((False, False), (True, False), (False, True)):
                    yield attend, (neox, ring, vec, half, appends)
                yield attend, (neox, ring, vec, False, True, True)  # decoding's on sm_90
        yield flash_inputs, (neox,)


__all__ = ["CHUNK", "EMPTY", "MAX_RANGES", "VECS", "append", "attend", "flash_inputs",
           "variants"]
