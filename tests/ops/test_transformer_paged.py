"""attention_paged (pxvm.ops.transformer): a batch of sequences' tokens over one pool of
KV blocks through a block table, against the float64 step of attention_cached written out
in test_transformer_attention.py, run per sequence over its blocks gathered into a plain
cache: the numpy reference, the CPU backend's kernel (tasks of key ranges) and WebGPU's
attention_paged.wgsl (one range, or ranges merged by `combine`; with and without
subgroups), float32 and float16 pools, batches mixing a prompt's chunk with decoding
tokens, windows and caps, and table entries outside the pools."""

from __future__ import annotations

import re

import numpy as np
import pytest
from conftest import NMSE_ELEMENTWISE, assert_close
from test_transformer_attention import expected_step

import pxvm
from pxvm.backends.webgpu.ops import transformer as webgpu_transformer
from pxvm.backends.webgpu.runtime import load_wgsl
from pxvm.core.errors import ShapeError
from pxvm.ops.transformer import attention_paged

BACKENDS = ["numpy", "cpu", "gpu"]


@pytest.fixture(params=BACKENDS)
def backend(request):
    """Each backend in turn; the GPU's device picked (or skipped) as the suite does."""
    if request.param == "gpu":
        request.getfixturevalue("gpu_device")
    return request.param


def _batch(rng, lengths, starts, hq=4, hkv=2, d=8, block_size=4, n_blocks=24,
           cache=np.float32, per_seq=None):
    """Sequences b with lengths[b] new tokens from position starts[b], their blocks (of
    `per_seq` a sequence, default as many as the longest needs) a random scattering over
    the pool; (qkv, k pool, v pool, token table, block table)."""
    per_seq = per_seq or -(-max(s + n for s, n in zip(starts, lengths)) // block_size)
    blocks = rng.permutation(n_blocks)[: len(lengths) * per_seq]
    table = blocks.reshape(len(lengths), per_seq).astype(np.int32)
    tokens = np.array([[b, p] for b, (s, n) in enumerate(zip(starts, lengths))
                       for p in range(s, s + n)], np.int32)
    pool = lambda: rng.standard_normal((n_blocks, block_size, hkv, d)).astype(cache)
    qkv = rng.standard_normal((len(tokens), (hq + 2 * hkv) * d)).astype(np.float32)
    return qkv, pool(), pool(), tokens, table


def _run(backend, qkv, kp, vp, tokens, table, **params):
    """The op on `backend` with the pools resident there: (out, k pool, v pool)."""
    be = pxvm.get_backend(backend)
    k_t, v_t = be.from_numpy(kp), be.from_numpy(vp)
    out = attention_paged(qkv, k_t, v_t, tokens, table, backend=backend, **params).numpy()
    return out, k_t.numpy(), v_t.numpy()


def _plain(pool, table_row, block_size):
    """A sequence's rows of the pool as a plain cache (position p in row p)."""
    return np.concatenate([pool[b] for b in table_row])[: len(table_row) * block_size]


def _check_sequences(got, qkv, kp, vp, tokens, table, lengths, starts, block_size, hq,
                     **params):
    """Each sequence's tokens' output and new pool rows against expected_step over its
    blocks as a plain cache; rows of blocks no sequence owns untouched."""
    out, k_pool, v_pool = got
    assert out.shape == (len(tokens), qkv.shape[1] // (hq + 2 * kp.shape[2]) * hq)
    half = kp.dtype == np.float16
    for b, (start, n) in enumerate(zip(starts, lengths)):
        mine = tokens[:, 0] == b
        want, k_want, v_want = expected_step(qkv[mine], _plain(kp, table[b], block_size),
                                             _plain(vp, table[b], block_size), start, hq,
                                             **params)
        assert_close(out[mine], want, 1e-6 if half else NMSE_ELEMENTWISE)
        rows = slice(start, start + n)
        np.testing.assert_allclose(_plain(k_pool, table[b], block_size)[rows], k_want[rows],
                                   rtol=1e-3 if half else 1e-6, atol=1e-6)
        np.testing.assert_array_equal(_plain(v_pool, table[b], block_size)[rows],
                                      v_want[rows].astype(kp.dtype))
    free = np.setdiff1d(np.arange(len(kp)), table)
    np.testing.assert_array_equal(k_pool[free], kp[free])
    np.testing.assert_array_equal(v_pool[free], vp[free])


@pytest.mark.parametrize("cache", [np.float32, np.float16])
@pytest.mark.parametrize("lengths,starts", [((5, 1, 1), (3, 21, 0)), ((1,), (0,)),
                                            ((9, 2), (0, 14))])
def test_each_sequence_gets_its_own_cached_attention(lengths, starts, cache, backend, rng):
    hq, block_size = 4, 4
    qkv, kp, vp, tokens, table = _batch(rng, lengths, starts, hq=hq, cache=cache)
    got = _run(backend, qkv, kp, vp, tokens, table, n_heads=hq)
    _check_sequences(got, qkv, kp, vp, tokens, table, lengths, starts, block_size, hq)


# (lengths, starts, block size, blocks a sequence): a 40-token prompt chunk after a cached
# prefix beside decoding tokens of long sequences (many key ranges on the GPU, several
# on the CPU); decoding alone, one token a sequence deep into its table; the keys of one
# range only (64 positions a table)
MIXED_CASES = [((40, 1, 1, 1), (70, 1100, 640, 5), 16, 80),
               ((1, 1, 1, 1, 1), (1279, 3, 777, 1200, 64), 16, 80),
               ((40, 1), (0, 63), 8, 8)]


@pytest.mark.parametrize("cache", [np.float32, np.float16])
@pytest.mark.parametrize("lengths,starts,block_size,per_seq", MIXED_CASES)
def test_a_prompt_chunk_beside_decoding_tokens_of_long_sequences(
        lengths, starts, block_size, per_seq, cache, backend, rng):
    hq, hkv, d = 6, 2, 16
    qkv, kp, vp, tokens, table = _batch(rng, lengths, starts, hq=hq, hkv=hkv, d=d,
                                        block_size=block_size, cache=cache, per_seq=per_seq,
                                        n_blocks=len(lengths) * per_seq + 7)
    got = _run(backend, qkv, kp, vp, tokens, table, n_heads=hq, style="neox")
    _check_sequences(got, qkv, kp, vp, tokens, table, lengths, starts, block_size, hq,
                     style="neox")


@pytest.mark.parametrize("cache", [np.float32, np.float16])
@pytest.mark.parametrize("hq,hkv,d", [(4, 1, 256), (3, 3, 48), (2, 1, 2), (6, 2, 40)])
def test_every_head_shape_the_op_takes(hq, hkv, d, cache, backend, rng):
    # MQA with the largest head (one value group); MHA with heads not dividing the
    # GPU's workgroup; the smallest head (a float16 word a row); a head of five eights
    lengths, starts = (3, 1, 1), (60, 200, 5)
    qkv, kp, vp, tokens, table = _batch(rng, lengths, starts, hq=hq, hkv=hkv, d=d,
                                        block_size=8, per_seq=26, n_blocks=90, cache=cache)
    got = _run(backend, qkv, kp, vp, tokens, table, n_heads=hq)
    _check_sequences(got, qkv, kp, vp, tokens, table, lengths, starts, 8, hq)


def test_webgpu_merges_key_ranges_with_combine_where_the_table_is_long(
        rng, gpu_device, dispatched, subgroups):
    # tables of 80 blocks of 16: 1280 positions, ranges of 128 keys (cached_key_ranges)
    lengths, starts = (40, 1, 1), (70, 1100, 640)
    qkv, kp, vp, tokens, table = _batch(rng, lengths, starts, d=16, block_size=16,
                                        per_seq=80, n_blocks=250)
    assert webgpu_transformer.paged_key_ranges(80 * 16, 42, 4) == (10, 128)
    got = _run("gpu", qkv, kp, vp, tokens, table, n_heads=4)
    kernel = (webgpu_transformer.PAGED_SUBGROUP_KERNEL if subgroups
              else webgpu_transformer.PAGED_KERNEL)
    assert dispatched == [(kernel, "append"), (kernel, "split"), (kernel, "combine")]
    _check_sequences(got, qkv, kp, vp, tokens, table, lengths, starts, 16, 4)


def test_webgpu_takes_one_range_where_every_token_sees_few_keys(rng, gpu_device, dispatched):
    # a window of 50 bounds the keys a token sees, however long its table
    lengths, starts = (3, 1), (200, 40)
    qkv, kp, vp, tokens, table = _batch(rng, lengths, starts, block_size=8, per_seq=32,
                                        n_blocks=70)
    got = _run("gpu", qkv, kp, vp, tokens, table, n_heads=4, window=50)
    assert [entry for _, entry in dispatched] == ["append", "split"]
    _check_sequences(got, qkv, kp, vp, tokens, table, lengths, starts, 8, 4, window=50)


# (lengths, starts, window): windows shorter than a range, than the prompt chunk, and
# longer than every sequence
WINDOW_CASES = [((40, 1), (30, 900), 100), ((9, 1, 1), (0, 300, 17), 5),
                ((2, 1), (60, 1000), 2000)]


@pytest.mark.parametrize("cache", [np.float32, np.float16])
@pytest.mark.parametrize("lengths,starts,window", WINDOW_CASES)
def test_window_softcap_and_scaled_rope_match_float64(lengths, starts, window, cache,
                                                      backend, rng):
    hq, d, block_size = 4, 16, 16
    qkv, kp, vp, tokens, table = _batch(rng, lengths, starts, d=d, block_size=block_size,
                                        cache=cache, per_seq=64,
                                        n_blocks=len(lengths) * 64 + 5)
    qkv *= 3.0  # scores large enough for the cap to matter
    params = {"freq_factors": tuple(1.0 + 7.0 * rng.random(d // 2)), "attn_factor": 1.15,
              "softcap": 4.0, "window": window, "style": "neox"}
    got = _run(backend, qkv, kp, vp, tokens, table, n_heads=hq, **params)
    _check_sequences(got, qkv, kp, vp, tokens, table, lengths, starts, block_size, hq,
                     **params)
    plain = _run("numpy", qkv, kp, vp, tokens, table, n_heads=hq, style="neox")[0]
    assert np.abs(got[0] - plain).max() > 1e-2  # the parameters really changed it


@pytest.mark.parametrize("backend_name", ["cpu", "gpu"])
def test_kernels_give_nan_rows_and_write_nothing_for_tokens_outside_the_tables(
        backend_name, rng, request):
    # the reference refuses such tables; kernels, which cannot raise where the tables
    # live on the device, answer NaN for those tokens only and write none of their rows
    if backend_name == "gpu":
        request.getfixturevalue("gpu_device")
    qkv, kp, vp, tokens, table = _batch(rng, (1, 1, 1, 1, 1), (5, 6, 7, 8, 9), per_seq=4,
                                        n_blocks=30)
    tokens[1] = (1, 16)         # beyond its table's 16 positions
    tokens[2] = (7, 0)          # a sequence the table lacks
    table[3, 0] = 30            # a block beyond the pool, among the keys token 3 sees
    table[4, 2] = -1            # the block token 4 writes to
    out, k_pool, v_pool = _run(backend_name, qkv, kp, vp, tokens, table, n_heads=4)
    assert np.isnan(out[1:]).all()
    want, _, _ = expected_step(qkv[:1], _plain(kp, table[0], 4), _plain(vp, table[0], 4), 5, 4)
    assert_close(out[:1], want, NMSE_ELEMENTWISE)
    written = np.zeros(kp.shape[:2], bool)
    written[table[0, 1], 1] = True  # token 0's row (position 5)
    written[table[3, 2], 0] = True  # token 3's own row (position 8) is in the pool
    np.testing.assert_array_equal(k_pool[~written], kp[~written])
    np.testing.assert_array_equal(v_pool[~written], vp[~written])


@pytest.mark.parametrize("keys,tokens,heads", [(4096, 64, 32), (4096, 576, 32),
                                               (4096, 4096, 32), (100, 1, 4), (64, 1, 4),
                                               (1280, 42, 4), (32768, 1, 64)])
def test_paged_key_ranges_cover_the_keys_in_chunks_within_the_partials_bound(keys, tokens,
                                                                             heads):
    n_ranges, range_len = webgpu_transformer.paged_key_ranges(keys, tokens, heads)
    assert range_len % webgpu_transformer.CACHED_CHUNK == 0
    assert (n_ranges - 1) * range_len < keys <= n_ranges * range_len  # none empty
    assert n_ranges <= webgpu_transformer.CACHED_MAX_RANGES
    assert n_ranges == 1 or tokens * heads * n_ranges <= webgpu_transformer.PAGED_MAX_PARTIALS
    if tokens * heads * webgpu_transformer.CACHED_MAX_RANGES <= \
            webgpu_transformer.PAGED_MAX_PARTIALS:  # few tokens: attention_cached's ranges
        assert (n_ranges, range_len) == webgpu_transformer.cached_key_ranges(keys)


def test_python_constants_match_the_paged_kernel():
    def const(name):
        return int(re.search(rf"const {name}: u32 = (\d+)u;",
                             load_wgsl(webgpu_transformer.PAGED_KERNEL)).group(1))

    assert const("WG") == webgpu_transformer.PAGED_WG
    # ranges of whole chunks (cached_key_ranges' CACHED_CHUNK)
    assert 2 * const("WG") // const("KEY_LANES") == webgpu_transformer.CACHED_CHUNK


def test_a_shared_prefix_block_serves_two_sequences(backend, rng):
    # sequences 0 and 1 share block table[0, 0] (positions 0..3, a cached prefix) and
    # decode their own next tokens: each equals attention over its own plain cache
    qkv, kp, vp, _, table = _batch(rng, (1, 1), (6, 6))
    table[1, 0] = table[0, 0]
    tokens = np.array([[0, 6], [1, 6]], np.int32)
    out, _, _ = _run(backend, qkv, kp, vp, tokens, table, n_heads=4)
    for b in range(2):
        want, _, _ = expected_step(qkv[b: b + 1], _plain(kp, table[b], 4),
                                   _plain(vp, table[b], 4), 6, 4)
        assert_close(out[b: b + 1], want, NMSE_ELEMENTWISE)


@pytest.mark.parametrize("change,message", [
    (lambda a: a.__setitem__(3, np.array([[0, 40]], np.int32)), "outside the block table"),
    (lambda a: a[4].__setitem__((0, 0), 99), "outside the pool"),
    (lambda a: a.__setitem__(3, np.zeros((2, 2), np.int32)), "token_table must be int32"),
    (lambda a: a.__setitem__(2, a[2][:, :, :, :6].copy()), "pools must both be"),
    (lambda a: a.__setitem__(4, a[4][0]), "block_table must be int32"),
])
def test_bad_tables_are_refused_clearly(change, message, rng):
    args = list(_batch(rng, (1,), (2,)))
    change(args)
    with pytest.raises(ShapeError, match=message):
        attention_paged(*args, n_heads=4, backend="numpy")
