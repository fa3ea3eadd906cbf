"""Attention over a KV cache in PTX (pxvm.ops.transformer.attention_cached and
attention_paged on CUDA): T new tokens, each at a position read on the device, so that
one captured decoding step serves every position.

qkv (T, (Hq + 2 Hkv) D) holds each token's query heads, key heads and value heads. The
caches are rows of Hkv heads of D values, float32 or float16 (HALF_CACHE); where the row
of position p is depends on the addressing (ADDRESSING):
- "plain": the caches are (n_ctx, Hkv, D), position p in row p; the S tokens of one
  sequence are at pos .., pos = state[1].
- "ring": the same, row p % n_ctx (a sliding-window layer's cache, big enough that the
  new rows overwrite only keys no new token sees).
- "paged" (attention_paged): the caches are pools of blocks of `block_size` rows; token
  t is sequence token_table[t, 0]'s token at position token_table[t, 1], and position p
  of sequence b is row p % block_size of block blocks[b, p / block_size].
Rotary embedding comes from a host table (positions, D / 2, [cos, sin]); NEOX rotates
pairs (c, c + D/2), else (2c, 2c + 1).

Two kernels, launched in this order on one stream:
- `append` (all but decoding): the new keys (rotated) and values into the caches, a
  thread an element; so `attend` reads every key from the cache, none racing with its
  write. Decoding's `attend` (a single token of each sequence) appends it itself (its
  `appends`).
- `attend`: block (range r, pack, token t) attends with PACK query heads of one KV head
  (grouped-query attention: the pack shares each key and value it reads; a group of more
  heads takes several packs) over keys r * range_len .. (those token t sees: up to its
  own position, its last `window` where window > 0), CHUNK keys a trip with an online
  softmax: SPLIT threads score a key against the pack's queries (staged in shared memory),
  the block takes the chunk's max per head (earlier sums are rescaled to it), then
  threads (value group g, pair of elements e) add up exp(score) * V over the group's
  keys for every head of the pack. With one range it writes the normalised output; with
  several, each range's partial result per head (pxvm.ops.layouts.AttentionPartials'
  record: D sums, max, sum of exps), and the last of a pack's blocks to finish (a count
  per (token, pack), `counts`, zero between launches) merges the records, rescaled to
  their common max.
Tokens at max_keys and beyond (which the host cannot check, as the position lives on
the device) get NaN rows and are not appended.

One module for the kernel family: append, attend and the merge share the cache layout,
the ranges and the partial records, which split across files would have to agree on.
"""

from __future__ import annotations

from .builder import Kernel, Reg, f32
from .elementwise import _exp, _store, _store_half, _unary_math
from .rows import THREADS, WARPS

#: Where a position's cache row is (module docstring).
ADDRESSING = ("plain", "ring", "paged")
#: Query heads of one KV head that a block of `attend` attends with: PACK where the
#: keys are many (each key and value read once for the pack), 1 where they are few (more
#: blocks, each a shorter walk).
PACK = 4
PACKS = (1, PACK)
#: Threads that score a key together (each its share of the row's pieces, adjacent
#: threads adjacent pieces), and the keys a trip of `attend` scores.
SPLIT_LOG2 = 2
SPLIT = 1 << SPLIT_LOG2
CHUNK = THREADS // SPLIT
#: A key row is read in pieces of 16 bytes where D allows (4 bytes otherwise); a thread
#: loads KEY_PIECES of them before their products.
KEY_PIECES = 4
#: Keys of a value group whose loads are issued before their products.
VALUE_UNROLL = 8
#: Ranges whose records a thread of the merge reads before adding them up.
MERGE_UNROLL = 16
#: Registers a thread of `attend` with packs of PACK may use: four blocks a multiprocessor.
MAX_REGISTERS = 64
#: The most key ranges a head's keys may be cut into.
MAX_RANGES = THREADS
#: The largest head dimension (the staged queries' row in shared memory).
MAX_HEAD_DIM = 256
#: The score of a key outside the range: finite, so exp(EMPTY - max) is 0 without inf
#: arithmetic.
EMPTY = -3.0e38


def _name(base: str, neox: bool, addressing: str, half_cache: bool) -> str:
    return (f"{base}_{'neox' if neox else 'interleaved'}"
            f"{'' if addressing == 'plain' else '_' + addressing}"
            f"{'_f16cache' if half_cache else ''}")


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


class Rows:
    """Where positions' rows are (the addressing) for one token: `at` its position,
    `beyond` whether it is at max_keys or past it (a negative position reads as a huge
    unsigned one, beyond too), `row(p)` the cache row of position p of its sequence."""

    def __init__(self, k: Kernel, addressing: str, state: Reg, token: Reg, max_keys: Reg,
                 n_ctx: Reg, blocks: Reg, block_size: Reg, max_blocks: Reg,
                 sequences: Reg):
        self.k, self.addressing, self.n_ctx, self.block_size = k, addressing, n_ctx, block_size
        if addressing == "paged":
            entry = k.element(state, k.op("shl.b32", token, 1), 4)
            seq, self.at = k.load("u32", entry), k.load("u32", f"{entry}+4")
            self.beyond = k.op("or.pred", k.setp("ge.u32", seq, sequences),
                               k.setp("ge.u32", self.at, max_keys))
            # a sequence's row of the block table (the first, for tokens beyond)
            seq = k.op("selp.u32", 0, seq, self.beyond)
            self.table = k.element(blocks, k.op("mul.lo.u32", seq, max_blocks), 4)
        else:
            pos = k.load("u32", f"{state}+4")
            self.at = k.op("add.u32", pos, token)
            self.beyond = k.op("or.pred", k.setp("ge.u32", pos, max_keys),
                               k.setp("ge.u32", self.at, max_keys))

    def row(self, position: Reg) -> Reg:
        k = self.k
        if self.addressing == "ring":
            return k.op("rem.u32", position, self.n_ctx)
        if self.addressing == "paged":
            block = k.load("u32", k.element(self.table,
                                            k.op("div.u32", position, self.block_size), 4))
            return k.op("mad.lo.u32", block, self.block_size,
                        k.op("rem.u32", position, self.block_size))
        return position


#: The parameters after the kernels' own: how rows are found (module docstring).
ROW_PARAMS = [("n_ctx", "u32"), ("max_keys", "u32"), ("blocks", "u64"),
              ("block_size", "u32"), ("max_blocks", "u32"), ("sequences", "u32")]


def _store_cached(k: Kernel, cache: Reg, slot: Reg, value: Reg, half_cache: bool) -> None:
    """Cache element `slot` = value (rounded to float16 in a float16 cache)."""
    if half_cache:
        k.store("b16", k.element(cache, slot, 2), k.op("cvt.rn.f16.f32", value))
    else:
        k.store("f32", k.element(cache, slot, 4), value)


def append(neox: bool, addressing: str, half_cache: bool) -> Kernel:
    """k_cache[row(position), kvh, c] = rotated key element, v_cache[..] = value
    element, a thread an element of the T * Hkv * D (grid-stride)."""
    k = Kernel(_name("cached_append", neox, addressing, half_cache),
               [("qkv", "u64"), ("k_cache", "u64"), ("v_cache", "u64"), ("state", "u64"),
                ("table", "u64"), ("elements", "u32"), ("hq", "u32"), ("hkv", "u32"),
                ("head_dim", "u32"), *ROW_PARAMS])
    (qkv, k_cache, v_cache, state, table, elements, hq, hkv, d, n_ctx, max_keys, blocks,
     block_size, max_blocks, sequences) = k.params()
    half = k.op("shr.u32", d, 1)
    row_len = k.op("mul.lo.u32", k.op("add.u32", hq, k.op("shl.b32", hkv, 1)), d)
    t, stride = k.grid_stride()
    with k.loop(t, elements, stride):
        c = k.op("rem.u32", t, d)
        head_row = k.op("div.u32", t, d)  # token * Hkv + kv head
        kvh = k.op("rem.u32", head_row, hkv)
        token = k.op("div.u32", head_row, hkv)
        rows = Rows(k, addressing, state, token, max_keys, n_ctx, blocks, block_size,
                    max_blocks, sequences)
        with k.if_(k.op("not.pred", rows.beyond)):
            head = k.op("add.u32", hq, kvh)  # the key head's place among the row's heads
            key = k.op("mad.lo.u32", token, row_len, k.op("mul.lo.u32", head, d))
            value = k.op("add.u32", key, k.op("mul.lo.u32", hkv, d))
            slot = k.op("mad.lo.u32", k.op("mad.lo.u32", rows.row(rows.at), hkv, kvh), d, c)
            _store_cached(k, k_cache, slot, rotated(k, qkv, table, key, c, rows.at, half, neox),
                          half_cache)
            _store_cached(k, v_cache, slot,
                          k.load("f32", k.element(qkv, k.op("add.u32", value, c), 4)),
                          half_cache)
    return k


def flash_inputs(neox: bool, half_cache: bool) -> Kernel:
    """A prompt's inputs to the tensor-core attention (ptx.attention.flash_f16,
    positioned), a thread an element, grid-stride: of the S new tokens' qkv, the query
    heads rotated into q16 (S, Hq, D) float16 (NaN rows for tokens at max_keys and
    beyond), the key heads rotated and the value heads into the caches (as `append`).
    A float32 cache's rows are also copied into k16, v16 (max_keys, Hkv, D) float16, the
    new ones and then those of the pos earlier positions; a float16 cache is what
    flash_f16 reads itself (k16, v16 unused). Not for rings or pools."""
    k = Kernel(f"flash_inputs_{'neox' if neox else 'interleaved'}"
               f"{'_f16cache' if half_cache else ''}",
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
    if half_cache:
        total = new
    else:
        old = k.op("mul.lo.u32", k.op("min.u32", pos, max_keys), row_elements)  # of K, of V
        total = k.op("add.u32", new, k.op("shl.b32", old, 1))

    t, stride = k.grid_stride()
    with k.loop(t, total, stride):
        with k.if_(k.setp("lt.u32", t, new)):
            token = k.op("div.u32", t, row_len)
            within = k.op("rem.u32", t, row_len)
            slot, c = k.op("div.u32", within, d), k.op("rem.u32", within, d)
            at = k.op("add.u32", pos, token)
            beyond = k.op("or.pred", k.setp("ge.u32", pos, max_keys),
                          k.setp("ge.u32", at, max_keys))
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
                    _store_cached(k, k_cache, cache_at, key, half_cache)
                    if not half_cache:
                        _store_half(k, k16, cache_at, [key])
                with k.if_(k.op("not.pred", is_key)):
                    value = k.load("f32", k.element(qkv, t, 4))
                    _store_cached(k, v_cache, cache_at, value, half_cache)
                    if not half_cache:
                        _store_half(k, v16, cache_at, [value])
        if not half_cache:
            with k.if_(k.setp("ge.u32", t, new)):  # an earlier position's key or value
                e = k.op("sub.u32", t, new)
                is_key = k.setp("lt.u32", e, old)
                index = k.op("selp.u32", e, k.op("sub.u32", e, old), is_key)
                with k.if_(is_key):
                    _store_half(k, k16, index, [k.load("f32", k.element(k_cache, index, 4))])
                with k.if_(k.op("not.pred", is_key)):
                    _store_half(k, v16, index, [k.load("f32", k.element(v_cache, index, 4))])
    return k


def _range_keys(k: Kernel, at: Reg, begin: Reg, range_len: Reg,
                window: Reg) -> tuple[Reg, Reg]:
    """(first, end) of the keys of the range from `begin` that the token at position
    `at` sees: up to its own, its last `window` where window > 0."""
    seen = k.op("add.u32", at, 1)
    end = k.op("min.u32", k.op("add.u32", begin, range_len), seen)
    windowed = k.op("and.pred", k.setp("ne.u32", window, 0), k.setp("gt.u32", seen, window))
    lowest = k.op("selp.u32", k.op("sub.u32", seen, window), 0, windowed)
    return k.op("max.u32", begin, lowest), end


def _put(k: Kernel, out: Reg, index: Reg, value, half: bool) -> None:
    """Output element `index`: float32, or float16 where `half`."""
    (_store_half if half else _store)(k, out, index, [value])


def _load_piece(k: Kernel, address: Reg, offset: int, vec: int, half_cache: bool,
                space: str, pred: Reg) -> list[Reg]:
    """`vec` cache elements at address + offset bytes as float32 (zeros where `pred`
    fails); `space`: "global", or "" for a generic address."""
    ld = f"ld.{space}" if space else "ld"
    if half_cache:
        words = [k.op("mov.b32", 0) for _ in range(vec // 2)]
        kind = f"v{len(words)}.b32" if len(words) > 1 else "b32"
        regs = f"{{{', '.join(map(str, words))}}}" if len(words) > 1 else str(words[0])
        k.emit(f"@{pred} {ld}.{kind} {regs}, [{address}+{offset}]")
        values = []
        for word in words:
            low, high = k.reg("b16"), k.reg("b16")
            k.emit(f"mov.b32 {{{low}, {high}}}, {word}")
            values += [k.op("cvt.f32.f16", low), k.op("cvt.f32.f16", high)]
        return values
    values = [k.op("mov.f32", f32(0.0)) for _ in range(vec)]
    k.emit(f"@{pred} {ld}.v{vec}.f32 {{{', '.join(map(str, values))}}}, [{address}+{offset}]")
    return values


def _reduce_pack(k: Kernel, values: list[Reg], instr: str, scratch: str) -> list[Reg]:
    """`instr` (max.f32, add.f32) of each of the values (a pack's heads') over the block,
    in every thread: butterflies within warps, then the warps' results through shared
    memory."""
    pack = len(values)
    for offset in (16, 8, 4, 2, 1):
        values = [k.op(instr, v, k.op("shfl.sync.bfly.b32", v, offset, "0x1f", "0xffffffff"))
                  for v in values]
    tid = k.special("%tid.x")
    base = k.op("mov.u32", scratch)
    warp_slot = k.op("mad.lo.u32", k.op("shr.u32", tid, 5), 4 * pack, base)
    with k.if_(k.setp("eq.u32", k.op("and.b32", tid, 31), 0)):
        for j, v in enumerate(values):
            k.store("f32", f"{warp_slot}+{4 * j}", v, space="shared")
    k.emit("bar.sync 0")
    out = [k.tree(instr, [k.load("f32", f"{base}+{4 * (w * pack + j)}", space="shared")
                          for w in range(WARPS)]) for j in range(pack)]
    k.emit("bar.sync 0")  # the scratch is written again by the next reduction
    return out


def attend(neox: bool, addressing: str, half_cache: bool, vec: int, half: bool = False,
           appends: bool = False, pack: int = PACK) -> Kernel:
    """Grid (n_ranges, Hkv * packs, T), THREADS threads: token t's pack of query heads
    over range r's keys (module docstring); a key row read `vec` elements a load.
    `half`: the output in float16 (what a prompt's tensor-core output projection reads).
    `appends` (one token a sequence: decoding's): `append`'s work done here, one launch
    fewer: each block stages the new key (rotated) and value in shared memory, in the
    cache's type, and reads them there; the block of the key's range and of its KV
    head's first pack writes them to the caches (no block of the launch reads that row
    from the cache: no other token of the launch is of its sequence)."""
    k = Kernel(f"{_name('cached_attend', neox, addressing, half_cache)}_v{vec}_p{pack}"
               f"{'_f16' if half else ''}{'_appends' if appends else ''}",
               [("qkv", "u64"), ("k_cache", "u64"), ("v_cache", "u64"), ("state", "u64"),
                ("table", "u64"), ("part", "u64"), ("counts", "u64"), ("out", "u64"),
                ("hq", "u32"), ("hkv", "u32"), ("head_dim", "u32"), ("n_ranges", "u32"),
                ("range_len", "u32"), ("scale", "f32"), ("softcap", "f32"),
                ("window", "u32"), *ROW_PARAMS],
               max_registers=MAX_REGISTERS if pack > 1 else None)
    (qkv, k_cache, v_cache, state, table, part, counts, out, hq, hkv, d, n_ranges,
     range_len, scale, softcap, window, n_ctx, max_keys, blocks, block_size, max_blocks,
     sequences) = k.params()
    esize = 2 if half_cache else 4
    cache_type = "b16" if half_cache else "f32"
    scratch = k.shared("partial", "f32", WARPS * pack, 16)
    query = k.op("mov.u32", k.shared("query", "f32", pack * MAX_HEAD_DIM, 16))
    exps = k.op("mov.u32", k.shared("exps", "f32", pack * CHUNK, 16))
    sums = k.op("mov.u32", k.shared("sums", "f32", pack * 2 * THREADS, 16))
    stats = k.op("mov.u32", k.shared("stats", "f32", 2 * pack, 16))  # maxima, totals
    tid = k.special("%tid.x")
    r, pack_id, token = k.special("%ctaid.x"), k.special("%ctaid.y"), k.special("%ctaid.z")
    one_range = k.setp("eq.u32", n_ranges, 1)
    group = k.op("div.u32", hq, hkv)
    packs = k.op("div.u32", k.op("add.u32", group, pack - 1), pack)
    kvh = k.op("div.u32", pack_id, packs)
    pack_of_group = k.op("rem.u32", pack_id, packs)
    first_head = k.op("mad.lo.u32", kvh, group, k.op("mul.lo.u32", pack_of_group, pack))
    heads = k.op("min.u32", k.op("sub.u32", group, k.op("mul.lo.u32", pack_of_group, pack)),
                 pack)
    begin = k.op("mul.lo.u32", r, range_len)
    row_stride = k.op("mul.lo.u32", k.op("mul.lo.u32", hkv, d), esize)  # bytes between rows
    head_offset = k.op("mul.wide.u32", k.op("mul.lo.u32", kvh, d), esize)
    k_head = k.op("add.u64", k_cache, head_offset)
    pairs = k.op("shr.u32", d, 1)  # value threads a row: two elements each
    groups = k.op("div.u32", THREADS, pairs)
    g = k.op("div.u32", tid, pairs)
    pair = k.op("rem.u32", tid, pairs)
    in_group = k.setp("lt.u32", g, groups)
    pair_bytes = k.op("mul.lo.u32", pair, 2 * esize)
    v_first = k.op("add.u64", k.op("add.u64", v_cache, head_offset),
                   k.op("cvt.u64.u32", pair_bytes))
    k.wait_for_predecessors()
    rows = Rows(k, addressing, state, token, max_keys, n_ctx, blocks, block_size, max_blocks,
                sequences)
    at = rows.at
    first_out = k.op("mul.lo.u32", k.op("mad.lo.u32", token, hq, first_head), d)
    with k.if_(rows.beyond):  # NaN rows, written by the first range's blocks
        with k.if_(k.setp("eq.u32", r, 0)):
            o = k.op("mov.u32", tid)
            with k.loop(o, k.op("mul.lo.u32", heads, d), THREADS):
                _put(k, out, k.op("add.u32", first_out, o), f32(float("nan")), half)
        k.emit("ret")
    with k.if_(k.setp("gt.u32", begin, at)):  # a range past the token's keys: not read
        k.emit("ret")
    c0, end = _range_keys(k, at, begin, range_len, window)

    # the pack's query heads, rotated and scaled, staged in shared memory (rows of
    # MAX_HEAD_DIM = THREADS values, zeros past D and past the pack's heads)
    row_len = k.op("mul.lo.u32", k.op("add.u32", hq, k.op("shl.b32", hkv, 1)), d)
    token_row = k.op("mul.lo.u32", token, row_len)
    half_d = k.op("shr.u32", d, 1)
    within_d = k.setp("lt.u32", tid, d)
    staged = k.op("mad.lo.u32", tid, 4, query)
    for j in range(pack):
        q = k.op("mov.f32", f32(0.0))
        with k.if_(k.op("and.pred", within_d, k.setp("gt.u32", heads, j))):
            base = k.op("mad.lo.u32", k.op("add.u32", first_head, j), d, token_row)
            k.to(q, "mul.f32", rotated(k, qkv, table, base, tid, at, half_d, neox), scale)
        k.store("f32", f"{staged}+{4 * MAX_HEAD_DIM * j}", q, space="shared")
    space = "global"
    if appends:
        space = ""
        new_key = k.op("mov.u32", k.shared("new_key", cache_type, MAX_HEAD_DIM, 16))
        new_value = k.op("mov.u32", k.shared("new_value", cache_type, MAX_HEAD_DIM, 16))
        with k.if_(within_d):
            key_base = k.op("mad.lo.u32", k.op("add.u32", hq, kvh), d, token_row)
            key = rotated(k, qkv, table, key_base, tid, at, half_d, neox)
            value = k.load("f32", k.element(
                qkv, k.op("add.u32", k.op("mad.lo.u32", hkv, d, key_base), tid), 4))
            if half_cache:
                key, value = k.op("cvt.rn.f16.f32", key), k.op("cvt.rn.f16.f32", value)
            k.store(cache_type, k.op("mad.lo.u32", tid, esize, new_key), key, space="shared")
            k.store(cache_type, k.op("mad.lo.u32", tid, esize, new_value), value,
                    space="shared")
            own_range = k.setp("lt.u32", at, k.op("add.u32", begin, range_len))
            with k.if_(k.op("and.pred", k.setp("eq.u32", pack_of_group, 0), own_range)):
                slot = k.op("mad.lo.u32", k.op("mad.lo.u32", rows.row(at), hkv, kvh), d, tid)
                k.store(cache_type, k.element(k_cache, slot, esize), key)
                k.store(cache_type, k.element(v_cache, slot, esize), value)

        def generic(shared_address: Reg) -> Reg:
            return k.op("cvta.shared.u64", k.op("cvt.u64.u32", shared_address))
        new_key_address = generic(new_key)
        new_value_address = k.op("add.u64", generic(new_value),
                                 k.op("cvt.u64.u32", pair_bytes))
    k.emit("bar.sync 0")

    capped = k.setp("gt.f32", softcap, f32(0.0))
    m_run = [k.op("mov.f32", f32(EMPTY)) for _ in range(pack)]  # the range's max score so far
    l_run = [k.op("mov.f32", f32(0.0)) for _ in range(pack)]    # this thread's keys' exps
    acc = [[k.op("mov.f32", f32(0.0)) for _ in range(2)] for _ in range(pack)]  # its pair's sums
    key_slot = k.op("shr.u32", tid, SPLIT_LOG2)  # the chunk's key this thread scores
    key_part = k.op("and.b32", tid, SPLIT - 1)   # .. its pieces part, part + SPLIT, ..
    first_in_key = k.setp("eq.u32", key_part, 0)
    my_exp = k.op("mad.lo.u32", key_slot, 4, exps)
    with k.loop(c0, end, CHUNK):
        n_keys = k.op("min.u32", k.op("sub.u32", end, c0), CHUNK)
        mine = k.setp("lt.u32", key_slot, n_keys)
        dots = [k.op("mov.f32", f32(0.0)) for _ in range(pack)]
        with k.if_(mine):
            position = k.op("add.u32", c0, key_slot)
            key = k.op("add.u64", k_head, k.op("mul.wide.u32", rows.row(position), row_stride))
            if appends:  # the new key from shared memory, through a generic address
                fresh = k.setp("eq.u32", position, at)
                key = k.op("selp.b64", new_key_address, k.op("cvta.global.u64", key), fresh)
            # the SPLIT threads of a key read its row's pieces in turn: adjacent bytes
            c = k.op("mul.lo.u32", key_part, vec)
            with k.loop(c, d, vec * KEY_PIECES * SPLIT):
                key_at = k.op("add.u64", key, k.op("mul.wide.u32", c, esize))
                query_at = k.op("mad.lo.u32", c, 4, query)
                pieces = [_load_piece(k, key_at, i * SPLIT * vec * esize, vec, half_cache, space,
                                      k.setp("lt.u32", k.op("add.u32", c, i * SPLIT * vec), d))
                          for i in range(KEY_PIECES)]
                for i, piece in enumerate(pieces):
                    for j in range(pack):
                        offset = 4 * (j * MAX_HEAD_DIM + i * SPLIT * vec)
                        queries = []
                        for part_at in range(0, vec, 4):
                            queries += k.load_vector("f32", f"{query_at}+{offset + 4 * part_at}",
                                                     min(vec, 4), space="shared")
                        for x, y in zip(piece, queries):
                            k.to(dots[j], "fma.rn.f32", x, y, dots[j])
        scores = []
        for j in range(pack):  # the key's SPLIT partial dot products met by shuffles
            for offset in range(SPLIT_LOG2 - 1, -1, -1):
                k.to(dots[j], "add.f32", dots[j],
                     k.op("shfl.sync.bfly.b32", dots[j], 1 << offset, "0x1f", "0xffffffff"))
            cap = k.op("mul.f32", softcap, _unary_math(
                k, "tanh", k.op("div.rn.f32", dots[j], softcap), softcap, softcap))
            scores.append(k.op("selp.f32", k.op("selp.f32", cap, dots[j], capped), f32(EMPTY),
                               mine))
        tops = _reduce_pack(k, scores, "max.f32", scratch)
        rescale = []
        for j in range(pack):
            top = k.op("max.f32", m_run[j], tops[j])
            rescale.append(_exp(k, k.op("sub.f32", m_run[j], top)))  # 0 at the first chunk
            # a key's exp counted once, by its first thread
            e = k.op("selp.f32", _exp(k, k.op("sub.f32", scores[j], top)), f32(0.0),
                     k.op("and.pred", mine, first_in_key))
            with k.if_(first_in_key):
                k.store("f32", f"{my_exp}+{4 * CHUNK * j}", e, space="shared")
            k.to(l_run[j], "fma.rn.f32", l_run[j], rescale[j], e)
            k.to(m_run[j], "mov.f32", top)
        k.emit("bar.sync 0")
        with k.if_(in_group):
            for j in range(pack):
                for i in range(2):
                    k.to(acc[j][i], "mul.f32", acc[j][i], rescale[j])
            u0 = k.op("mov.u32", g)
            with k.loop(u0, n_keys, k.op("mul.lo.u32", groups, VALUE_UNROLL)):
                batch = []
                for jj in range(VALUE_UNROLL):
                    u = k.op("mad.lo.u32", groups, jj, u0)
                    present = k.setp("lt.u32", u, n_keys)
                    position = k.op("add.u32", c0, k.op("selp.u32", u, 0, present))
                    value_at = k.op("add.u64", v_first,
                                    k.op("mul.wide.u32", rows.row(position), row_stride))
                    if appends:
                        value_at = k.op("selp.b64", new_value_address,
                                        k.op("cvta.global.u64", value_at),
                                        k.setp("eq.u32", position, at))
                    values = _load_piece(k, value_at, 0, 2, half_cache, space, present)
                    weights = []
                    for j in range(pack):
                        w = k.op("mov.f32", f32(0.0))
                        k.to(w, "ld.shared.f32",
                             f"[{k.op('mad.lo.u32', u, 4, exps)}+{4 * CHUNK * j}]", pred=present)
                        weights.append(w)
                    batch.append((values, weights))
                for values, weights in batch:
                    for j in range(pack):
                        for i in range(2):
                            k.to(acc[j][i], "fma.rn.f32", weights[j], values[i], acc[j][i])
        k.emit("bar.sync 0")  # exps is rewritten by the next chunk

    totals = _reduce_pack(k, l_run, "add.f32", scratch)
    with k.if_(in_group):
        for j in range(pack):
            slot = k.op("mad.lo.u32", k.op("mad.lo.u32", k.op("mad.lo.u32", groups, j, g), d,
                                            k.op("shl.b32", pair, 1)), 4, sums)
            k.store_vector("f32", slot, acc[j], space="shared")
    with k.if_(k.setp("eq.u32", tid, 0)):
        for j in range(pack):
            k.store("f32", f"{stats}+{4 * j}", m_run[j], space="shared")
            k.store("f32", f"{stats}+{4 * (pack + j)}", totals[j], space="shared")
    k.emit("bar.sync 0")
    o = k.op("mov.u32", tid)
    with k.loop(o, k.op("mul.lo.u32", heads, d), THREADS):
        j, c = k.op("div.u32", o, d), k.op("rem.u32", o, d)
        value = k.op("mov.f32", f32(0.0))
        u = k.op("mov.u32", 0)
        with k.loop(u, groups, 1):
            slot = k.op("mad.lo.u32", k.op("mad.lo.u32", k.op("mad.lo.u32", groups, j, u), d, c),
                        4, sums)
            k.to(value, "add.f32", value, k.load("f32", slot, space="shared"))
        stat = k.op("mad.lo.u32", j, 4, stats)
        total = k.load("f32", f"{stat}+{4 * pack}", space="shared")
        head_out = k.op("add.u32", first_out, o)
        with k.if_(one_range):
            _put(k, out, head_out, k.op("div.rn.f32", value, total), half)
        with k.if_(k.op("not.pred", one_range)):
            head = k.op("add.u32", k.op("mad.lo.u32", token, hq, first_head), j)
            record = k.op("mul.lo.u32", k.op("mad.lo.u32", head, n_ranges, r),
                          k.op("add.u32", d, 2))
            k.store("f32", k.element(part, k.op("add.u32", record, c), 4), value)
            with k.if_(k.setp("eq.u32", c, 0)):
                tail = k.element(part, k.op("add.u32", record, d), 4)
                k.store("f32", tail, k.load("f32", stat, space="shared"))
                k.store("f32", f"{tail}+4", total)
    with k.if_(k.op("not.pred", one_range)):
        # the last of the pack's ranges to finish merges them all (its count goes back
        # to 0 for the next launch): no second kernel, no second launch
        last = k.op("mov.u32", k.shared("last", "u32", 1, 4))
        k.emit("bar.sync 0")
        used = _ranges_used(k, at, range_len, n_ranges)
        with k.if_(k.setp("eq.u32", tid, 0)):
            count = k.element(counts, k.op("mad.lo.u32", token, k.op("mul.lo.u32", hkv, packs),
                                           pack_id), 4)
            # release: the block's records (ordered before by the barrier) are visible
            # to whoever counts after; acquire: the others' are visible to this block
            done = k.op("atom.acq_rel.gpu.global.add.u32", f"[{count}]", 1)
            is_last = k.setp("eq.u32", k.op("add.u32", done, 1), used)
            with k.if_(is_last):
                k.store("u32", count, 0)
            k.store("u32", last, k.op("selp.u32", 1, 0, is_last), space="shared")
        k.emit("bar.sync 0")
        merges = k.setp("ne.u32", k.load("u32", last, space="shared"), 0)
        with k.if_(merges):  # the block's threads all, or none
            _merge(k, part, out, k.op("mad.lo.u32", token, hq, first_head), heads, tid, d,
                   n_ranges, used, half, pack)
    return k


def _ranges_used(k: Kernel, at: Reg, range_len: Reg, n_ranges: Reg) -> Reg:
    """The ranges holding keys of the token at position `at` (later ones return early)."""
    return k.op("min.u32", k.op("add.u32", k.op("div.u32", at, range_len), 1), n_ranges)


def _merge(k: Kernel, part: Reg, out: Reg, first: Reg, heads: Reg, tid: Reg, d: Reg,
           n_ranges: Reg, used: Reg, half: bool, pack: int) -> None:
    """The output of query heads first .. first + heads - 1 (out's rows, float16 where
    `half`) from their `used` ranges' records (D sums, max, sum of exps:
    AttentionPartials'), rescaled to their common max: the block's threads in `pack`
    groups, a head each, a thread its pairs of elements e, e + 2 THREADS / pack, .. over
    MERGE_UNROLL ranges a trip (each range's pair of sums and its max and sum of exps
    loaded together), combined online (rescaled to the largest max so far). Records are
    read through L2 (.cg): other blocks wrote them during this launch."""
    per_head = THREADS // pack
    j = k.op("div.u32", tid, per_head)
    with k.if_(k.setp("lt.u32", j, heads)):
        head = k.op("add.u32", first, j)
        stride_bytes = k.op("mul.lo.u32", k.op("add.u32", d, 2), 4)
        records = k.op("add.u64", part, k.op("mul.wide.u32", k.op("mul.lo.u32", head, n_ranges),
                                              stride_bytes))
        tail_bytes = k.op("cvt.u64.u32", k.op("mul.lo.u32", d, 4))
        e = k.op("shl.b32", k.op("rem.u32", tid, per_head), 1)  # the pair's first element
        with k.loop(e, d, 2 * per_head):
            top = k.op("mov.f32", f32(EMPTY))  # the largest max so far
            acc = [k.op("mov.f32", f32(0.0)) for _ in range(2)]  # the pair's sums, relative to it
            total = k.op("mov.f32", f32(0.0))  # the sums of exps, the same
            pair_bytes = k.op("cvt.u64.u32", k.op("mul.lo.u32", e, 4))
            r = k.op("mov.u32", 0)
            with k.loop(r, used, MERGE_UNROLL):
                loaded = []
                for u in range(MERGE_UNROLL):
                    present = k.setp("lt.u32", k.op("add.u32", r, u), used)
                    record = k.op("add.u64", records,
                                  k.op("mul.wide.u32", k.op("add.u32", r, u), stride_bytes))
                    sums = [k.op("mov.f32", f32(0.0)) for _ in range(2)]
                    top_r, sum_r = k.op("mov.f32", f32(EMPTY)), k.op("mov.f32", f32(0.0))
                    k.emit(f"@{present} ld.global.cg.v2.f32 {{{sums[0]}, {sums[1]}}}, "
                           f"[{k.op('add.u64', record, pair_bytes)}]")
                    k.emit(f"@{present} ld.global.cg.v2.f32 {{{top_r}, {sum_r}}}, "
                           f"[{k.op('add.u64', record, tail_bytes)}]")
                    loaded.append((sums, top_r, sum_r))
                for sums, top_r, sum_r in loaded:  # records without keys add nothing
                    larger = k.op("max.f32", top, top_r)
                    old = _exp(k, k.op("sub.f32", top, larger))
                    new = _exp(k, k.op("sub.f32", top_r, larger))
                    for i in range(2):
                        k.to(acc[i], "fma.rn.f32", sums[i], new, k.op("mul.f32", acc[i], old))
                    k.to(total, "fma.rn.f32", sum_r, new, k.op("mul.f32", total, old))
                    k.to(top, "mov.f32", larger)
            at = k.op("mad.lo.u32", head, d, e)
            for i in range(2):
                _put(k, out, k.op("add.u32", at, i), k.op("div.rn.f32", acc[i], total), half)


def piece_vecs(half_cache: bool) -> tuple[int, ...]:
    """The elements a load of a key row can take, largest first (16 bytes, 4 bytes)."""
    return (8, 2) if half_cache else (4, 2)


def variants():
    for neox in (False, True):
        for addressing in ADDRESSING:
            for half_cache in (False, True):
                yield append, (neox, addressing, half_cache)
                for vec in piece_vecs(half_cache):
                    for pack in PACKS:
                        yield attend, (neox, addressing, half_cache, vec, False, False, pack)
                        yield attend, (neox, addressing, half_cache, vec, True, False, pack)
                        yield attend, (neox, addressing, half_cache, vec, False, True, pack)
        for half_cache in (False, True):
            yield flash_inputs, (neox, half_cache)


__all__ = ["ADDRESSING", "CHUNK", "EMPTY", "MAX_RANGES", "PACK", "PACKS", "append", "attend",
           "flash_inputs", "piece_vecs", "variants"]
