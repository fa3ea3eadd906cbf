"""The attention half of pxvm.ops.transformer: attention_cached (RoPE, KV append and
causal attention over a cache in one step, the position read from a state tensor on the
device) and attention_cached_matmul_quant_add (the same with the output projection and
residual), the GPU and the numpy backend against an independent float64 computation
written here. The GPU's paths: `split` (one range, or ranges merged by `combine` or by the
output projection) and, for prompts, the tiled attention_prompt.wgsl; float32 and float16
caches. The fused products are in test_transformer_products.py."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import NMSE_ELEMENTWISE, assert_close

import pxvm
from pxvm.batch import Graph
from pxvm.backends.webgpu.ops import quantized as webgpu_quantized
from pxvm.backends.webgpu.ops import transformer as webgpu_transformer
from pxvm.backends.webgpu.runtime import load_wgsl
from pxvm.core import tuning
from pxvm.core.errors import ShapeError
from pxvm.ops import transformer
from pxvm.ops.transformer import attention_cached, attention_cached_matmul_quant_add

sys.path.insert(0, str(Path(__file__).parent.parent / "llm"))
from gguf_blocks import dequantize, quantize  # noqa: E402

# attention_cached in f32 against float64: measured NMSE ~1e-13, so the tightest
# threshold; a key seen or missed at one of 300 positions costs far more.
TOL = NMSE_ELEMENTWISE


def _rotate(x, positions, theta, style, freq_factors=None, attn_factor=1.0):
    """Rotary embedding in float64 of x (S, H, D) at the given positions; pair i turns
    freq_factors[i] times slower, and the result is scaled by attn_factor."""
    x = np.asarray(x, np.float64)
    d = x.shape[-1]
    inv_freq = theta ** (-np.arange(0, d, 2, dtype=np.float64) / d)
    if freq_factors is not None:
        inv_freq = inv_freq / np.asarray(freq_factors, np.float64)
    ang = np.asarray(positions, np.float64)[:, None, None] * inv_freq[None, None, :]
    c, s = np.cos(ang) * attn_factor, np.sin(ang) * attn_factor
    if style == "neox":
        a, b = x[..., : d // 2], x[..., d // 2:]
        return np.concatenate([a * c - b * s, a * s + b * c], axis=-1)
    a, b = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2], out[..., 1::2] = a * c - b * s, a * s + b * c
    return out


def expected_step(qkv, k_cache, v_cache, pos, hq, theta=10000.0, style="interleaved",
                  scale=None, freq_factors=None, attn_factor=1.0, softcap=0.0, window=0):
    """(output (S, Hq*D), new k cache, new v cache) in float64, written out plainly. Into
    float16 caches the new keys (rotated in float32, as kernels do) and values go rounded
    to float16, and the attention reads those."""
    s = qkv.shape[0]
    n_ctx, hkv, d = k_cache.shape
    scale = d ** -0.5 if scale is None else scale
    qkv = np.asarray(qkv, np.float64)
    q = qkv[:, : hq * d].reshape(s, hq, d)
    k = qkv[:, hq * d: (hq + hkv) * d].reshape(s, hkv, d)
    v = qkv[:, (hq + hkv) * d:].reshape(s, hkv, d)
    positions = np.arange(pos, pos + s)
    q = _rotate(q, positions, theta, style, freq_factors, attn_factor)
    k_new = np.asarray(k_cache, np.float64).copy()
    v_new = np.asarray(v_cache, np.float64).copy()
    k_new[pos: pos + s] = _rotate(k, positions, theta, style, freq_factors, attn_factor)
    v_new[pos: pos + s] = v
    if np.dtype(k_cache.dtype) == np.float16:  # the new rows as stored
        rows = slice(pos, pos + s)
        k_new[rows] = k_new[rows].astype(np.float32).astype(np.float16)
        v_new[rows] = v_new[rows].astype(np.float32).astype(np.float16)
    out = np.empty((s, hq, d))
    for i in range(s):
        seen = pos + i + 1  # token i sees cache rows 0 ..= its own position
        first = max(0, seen - window) if window else 0  # .. its last `window` of them
        for h in range(hq):
            kvh = h // (hq // hkv)
            scores = k_new[first:seen, kvh] @ q[i, h] * scale
            if softcap:
                scores = softcap * np.tanh(scores / softcap)
            p = np.exp(scores - scores.max())
            out[i, h] = (p / p.sum()) @ v_new[first:seen, kvh]
    return out.reshape(s, hq * d), k_new, v_new


def _case(rng, hq, hkv, d, n_ctx, s, cache=np.float32):
    kc = rng.standard_normal((n_ctx, hkv, d)).astype(cache)
    vc = rng.standard_normal((n_ctx, hkv, d)).astype(cache)
    qkv = rng.standard_normal((s, (hq + 2 * hkv) * d)).astype(np.float32)
    return qkv, kc, vc


def _state(rng, pos, extra=()):
    return np.array([rng.integers(0, 1000), pos, *extra], np.int32)


def _run(backend, qkv, kc, vc, state, **params):
    """Run the op on `backend` with caches resident there; (out, k cache, v cache, state)."""
    be = pxvm.get_backend(backend)
    k_t, v_t, st = be.from_numpy(kc), be.from_numpy(vc), be.from_numpy(state)
    out = attention_cached(qkv, k_t, v_t, st, backend=backend, **params).numpy()
    return out, k_t.numpy(), v_t.numpy(), st.numpy()


def _check(got, kc, vc, expected, pos, s):
    out, k_new, v_new, _ = got
    exp_out, exp_k, exp_v = expected
    assert out.shape == exp_out.shape and out.dtype == np.float32
    assert_close(out, exp_out, TOL)
    assert_close(k_new[pos: pos + s], exp_k[pos: pos + s], TOL)      # rotated keys
    np.testing.assert_array_equal(v_new[pos: pos + s], exp_v[pos: pos + s].astype(kc.dtype))
    assert k_new.dtype == v_new.dtype == kc.dtype
    untouched = np.ones(kc.shape[0], bool)
    untouched[pos: pos + s] = False
    np.testing.assert_array_equal(k_new[untouched], kc[untouched])
    np.testing.assert_array_equal(v_new[untouched], vc[untouched])


CASES = [  # (hq, hkv, d, n_ctx, pos, s, max_keys)
    (6, 2, 16, 320, 0, 1, None),      # decode: the first token
    (6, 2, 16, 320, 63, 1, None),     # last key of the first 64-key chunk
    (6, 2, 16, 320, 64, 1, None),     # first key of the second
    (6, 2, 64, 320, 127, 1, None),
    (6, 2, 64, 320, 128, 1, None),
    (6, 2, 64, 320, 300, 1, None),    # five ranges
    (3, 3, 48, 320, 300, 1, None),    # MHA; 48 does not divide the workgroup
    (4, 1, 96, 200, 150, 1, None),    # MQA; two value groups
    (2, 2, 256, 64, 63, 1, None),     # head dim 256 (one value group), the cache's last row
    (1, 1, 2, 40, 33, 1, None),       # the smallest head
    (2, 1, 16, 1100, 1050, 1, None),  # 128-key ranges: two chunks each
    (1, 1, 8, 2100, 2000, 1, None),   # 192-key ranges: three chunks each
    (6, 2, 16, 160, 0, 5, None),      # prefill from 0
    (6, 2, 16, 160, 7, 5, None),      # prefill after a cached prefix
    (3, 3, 32, 160, 0, 140, None),    # long prefill: new keys span several chunks
    (6, 2, 16, 160, 7, 140, None),
    (6, 2, 16, 300, 60, 1, 96),       # max_keys: a grid over part of the cache
    (6, 2, 16, 300, 60, 5, 65),       # max_keys one past the last position
    (6, 2, 16, 300, 7, 140, 147),
    (6, 2, 64, 300, 255, 1, 256),     # the last key one range covers
    (3, 1, 128, 256, 200, 1, None),   # two value groups over 201 keys
]


def _take(kernels, monkeypatch):
    """Make attention_cached take `kernels`: "one range" (`split` alone, forced for every
    bound), "ranges" (`split` over chunk-aligned ranges, then `combine`, for bounds of
    more than CACHED_ONE_RANGE_MAX_KEYS keys; ranges are whole chunks, so a bound of one
    chunk is one range on either path), both for any number of new tokens, or "tiled"
    (attention_prompt.wgsl, forced for every number of new tokens where
    prompt_tiled_takes allows it)."""
    if kernels == "one range":
        monkeypatch.setattr(webgpu_transformer, "CACHED_ONE_RANGE_MAX_KEYS", 10**9)
    if kernels == "tiled":
        monkeypatch.setattr(webgpu_transformer, "PROMPT_TILED_MIN_TOKENS", 1)
    else:
        monkeypatch.setattr(webgpu_transformer, "PROMPT_TILED_MIN_TOKENS", 10**9)


def _ranges_taken(kernels, bound):
    """Check that `kernels` really takes its path for `bound` keys."""
    if kernels == "tiled":
        return
    n_ranges = webgpu_transformer.cached_key_ranges(bound)[0]
    one_chunk = bound <= webgpu_transformer.CACHED_CHUNK
    assert (n_ranges == 1) == (kernels == "one range" or one_chunk), (kernels, bound, n_ranges)


APPEND, TILED = ("attention_prompt.wgsl", "append"), ("attention_prompt.wgsl", "tiled")


def _entries(kernels, bound, tokens, head_dim, ring=False, subgroups=False):
    """The (kernel file, entry point) dispatches `kernels` records for attention_cached,
    `split` and `combine` in their subgroup variant where `subgroups`."""
    if kernels == "tiled" and webgpu_transformer.prompt_tiled_takes(tokens, head_dim, ring):
        return [APPEND, TILED]
    cached = webgpu_transformer.CACHED_SUBGROUP_KERNEL if subgroups else webgpu_transformer.CACHED_KERNEL
    split, combine = (cached, "split"), (cached, "combine")
    return [split] if webgpu_transformer.cached_key_ranges(bound)[0] == 1 else [split, combine]


@pytest.fixture(params=["one range", "ranges", "tiled"])
def path(request, monkeypatch):
    _take(request.param, monkeypatch)
    return request.param


# Every case through one range, through ranges + combine and tiled.
PATH_CASES = [pytest.param(path, *case, id=f"{path}-{'-'.join(map(str, case))}")
              for case in CASES for path in ("one range", "ranges", "tiled")]


@pytest.mark.parametrize("style", ["interleaved", "neox"])
@pytest.mark.parametrize("kernels,hq,hkv,d,n_ctx,pos,s,max_keys", PATH_CASES)
def test_attention_cached_gpu_matches_float64_and_appends_only_its_rows(
        kernels, hq, hkv, d, n_ctx, pos, s, max_keys, style, rng, gpu_device, monkeypatch,
        dispatched, subgroups):
    _take(kernels, monkeypatch)
    _ranges_taken(kernels, max_keys or n_ctx)
    qkv, kc, vc = _case(rng, hq, hkv, d, n_ctx, s)
    state = _state(rng, pos, extra=(12345,))
    got = _run("gpu", qkv, kc, vc, state, n_heads=hq, style=style, max_keys=max_keys)
    assert dispatched == _entries(kernels, max_keys or n_ctx, s, d, subgroups=subgroups)
    _check(got, kc, vc, expected_step(qkv, kc, vc, pos, hq, style=style), pos, s)
    np.testing.assert_array_equal(got[3], state)  # the op only reads the state


# Float16 caches: keys read eight values a load (heads of whole eights) or a pair
# (heads of 2, 12, 20), one range and several, decoding and prompts (tiled where the head
# is of whole eights, else `split`)
HALF_CASES = [  # (hq, hkv, d, n_ctx, pos, s, max_keys)
    (6, 2, 16, 320, 63, 1, None),
    (6, 2, 64, 320, 300, 1, None),    # five ranges
    (3, 3, 48, 320, 300, 1, None),
    (4, 1, 96, 200, 150, 1, None),
    (2, 2, 256, 64, 63, 1, None),
    (1, 1, 2, 40, 33, 1, None),       # the smallest head: a word a row
    (3, 1, 12, 320, 290, 2, None),
    (6, 2, 16, 160, 7, 140, None),    # long prefill
    (3, 3, 20, 160, 7, 40, None),
    (6, 2, 16, 300, 60, 5, 65),       # max_keys one past the last position
]
HALF_PATH_CASES = [pytest.param(path, *case, id=f"{path}-{'-'.join(map(str, case))}")
                   for case in HALF_CASES for path in ("one range", "ranges", "tiled")]


@pytest.mark.parametrize("kernels,hq,hkv,d,n_ctx,pos,s,max_keys", HALF_PATH_CASES)
def test_float16_caches_on_the_gpu_match_float64_of_their_values(
        kernels, hq, hkv, d, n_ctx, pos, s, max_keys, rng, gpu_device, monkeypatch,
        dispatched, subgroups):
    _take(kernels, monkeypatch)
    qkv, kc, vc = _case(rng, hq, hkv, d, n_ctx, s, np.float16)
    state = _state(rng, pos)
    got = _run("gpu", qkv, kc, vc, state, n_heads=hq, style="neox", max_keys=max_keys)
    tiled = kernels == "tiled" and webgpu_transformer.prompt_tiled_takes(s, d, False, True)
    assert (dispatched == [APPEND, TILED]) == tiled
    _check(got, kc, vc, expected_step(qkv, kc, vc, pos, hq, style="neox"), pos, s)
    # the same over float32 caches of the same values differs by the new rows' rounding
    wide = _run("gpu", qkv, kc.astype(np.float32), vc.astype(np.float32), state, n_heads=hq,
                style="neox", max_keys=max_keys)
    assert_close(got[0], wide[0], 1e-5)
    assert_close(got[1].astype(np.float32), wide[1], 1e-6)


# Prompts long enough for the tiled attention by default (PROMPT_TILED_MIN_TOKENS): odd
# lengths (a short last block of tokens), from position 0 and after a cached prefix,
# GQA and not, the head sizes of the model families and an odd one
TILED_CASES = [  # (hq, hkv, d, n_ctx, pos, s, max_keys)
    (9, 3, 64, 96, 0, 70, None),      # SmolLM2's heads, a prompt from 0
    (9, 3, 64, 160, 45, 37, None),    # .. after 45 cached keys
    (4, 4, 128, 160, 45, 70, None),   # MHA, head size 128
    (2, 1, 256, 96, 45, 37, None),    # MQA, head size 256
    (6, 2, 40, 120, 13, 37, None),    # head size 40 (not a power of two)
    (4, 2, 64, 300, 10, 70, 100),     # max_keys: work recorded for part of the cache
]


@pytest.mark.parametrize("cache", [np.float32, np.float16])
@pytest.mark.parametrize("style", ["interleaved", "neox"])
@pytest.mark.parametrize("hq,hkv,d,n_ctx,pos,s,max_keys", TILED_CASES)
def test_a_prompt_takes_the_tiled_attention_and_matches_float64(
        hq, hkv, d, n_ctx, pos, s, max_keys, style, cache, rng, gpu_device, dispatched):
    assert s >= webgpu_transformer.PROMPT_TILED_MIN_TOKENS
    qkv, kc, vc = _case(rng, hq, hkv, d, n_ctx, s, cache)
    state = _state(rng, pos, extra=(12345,))
    got = _run("gpu", qkv, kc, vc, state, n_heads=hq, style=style, max_keys=max_keys)
    assert dispatched == [APPEND, TILED]
    _check(got, kc, vc, expected_step(qkv, kc, vc, pos, hq, style=style), pos, s)
    np.testing.assert_array_equal(got[3], state)


def test_prompt_tiles_fit_the_kernel_and_workgroup_memory():
    # attention_prompt.wgsl's limits on its tile shape (its comments), for every head
    # size it takes; and where the tiled path applies
    wg = webgpu_transformer.PROMPT_WG
    for d in range(4, 257, 4):
        rows, keys = webgpu_transformer.prompt_tiles(d)
        quads = d // 4
        assert rows % 2 == 0 and keys % 2 == 0 and rows <= wg, d
        assert rows <= 4 * (wg // quads) and keys * quads <= 4 * wg, d
        assert webgpu_transformer.prompt_tile_bytes(d, rows, keys) <= webgpu_transformer.PROMPT_WORKGROUP_BYTES
    assert webgpu_transformer.prompt_tiles(64) == (16, 32)
    assert webgpu_transformer.prompt_tiles(64, budget=1 << 15)[0] == 32  # more memory, more rows
    least = webgpu_transformer.PROMPT_TILED_MIN_TOKENS
    assert webgpu_transformer.prompt_tiled_takes(least, 64, ring=False)
    assert not webgpu_transformer.prompt_tiled_takes(least - 1, 64, ring=False)
    assert not webgpu_transformer.prompt_tiled_takes(least, 64, ring=True)   # rings: `split`
    assert not webgpu_transformer.prompt_tiled_takes(least, 18, ring=False)  # not whole quads
    assert webgpu_transformer.prompt_tiled_takes(least, 12, ring=False)
    # float16 rows are loaded eight values at a time
    assert webgpu_transformer.prompt_tiled_takes(least, 40, ring=False, half=True)
    assert not webgpu_transformer.prompt_tiled_takes(least, 12, ring=False, half=True)


@pytest.mark.parametrize("style", ["interleaved", "neox"])
@pytest.mark.parametrize("hq,hkv,d,n_ctx,pos,s", [(6, 2, 16, 64, 40, 1), (3, 3, 8, 64, 7, 5)])
def test_attention_cached_reference_matches_float64(hq, hkv, d, n_ctx, pos, s, style, rng):
    qkv, kc, vc = _case(rng, hq, hkv, d, n_ctx, s)
    got = _run("cpu", qkv, kc, vc, _state(rng, pos), n_heads=hq, style=style)
    _check(got, kc, vc, expected_step(qkv, kc, vc, pos, hq, style=style), pos, s)


@pytest.mark.parametrize("hq,hkv,d,n_ctx,pos,s", [(6, 2, 16, 64, 40, 1), (3, 3, 8, 64, 7, 5)])
def test_the_float16_reference_is_the_float32_one_over_the_rounded_caches(hq, hkv, d, n_ctx,
                                                                         pos, s, rng):
    # Rounding is the only difference: a float16 cache gets the rows the float32 reference
    # writes, rounded to float16 (to nearest even), and its output is the float32
    # attention over the caches so rounded.
    qkv, kc, vc = _case(rng, hq, hkv, d, n_ctx, s, np.float16)
    state = _state(rng, pos)
    out, k16, v16, _ = _run("numpy", qkv, kc, vc, state, n_heads=hq)
    wide, k32, v32, _ = _run("numpy", qkv, kc.astype(np.float32), vc.astype(np.float32),
                             state, n_heads=hq)
    assert k16.dtype == v16.dtype == np.float16
    np.testing.assert_array_equal(k16, k32.astype(np.float16))
    np.testing.assert_array_equal(v16, v32.astype(np.float16))
    q = pxvm.ops.rope(qkv[:, : hq * d].reshape(s, hq, d), pos_offset=pos, backend="numpy")
    rounded = pxvm.ops.attention(q, k16[: pos + s].astype(np.float32),
                                 v16[: pos + s].astype(np.float32), backend="numpy")
    np.testing.assert_array_equal(out, rounded.numpy().reshape(s, hq * d))
    assert 0 < np.abs(out - wide).max() < 1e-2  # the rounding changed it, a little


@pytest.mark.parametrize("s", [1, 4, 40])  # 40: the tiled attention
def test_attention_cached_uses_theta_and_scale(s, rng, gpu_device):
    hq, hkv, d, pos = 4, 2, 32, 50
    qkv, kc, vc = _case(rng, hq, hkv, d, 96, s)
    params = {"n_heads": hq, "theta": 500000.0, "scale": 0.3}
    got = _run("gpu", qkv, kc, vc, _state(rng, pos), **params)
    _check(got, kc, vc, expected_step(qkv, kc, vc, pos, hq, 500000.0, scale=0.3), pos, s)
    default = expected_step(qkv, kc, vc, pos, hq)[0]
    assert np.abs(got[0] - default).max() > 1e-2  # the parameters really changed it


# Windows ending inside a chunk, on a chunk's edge, covering whole ranges before the
# token's own; prompts whose first tokens see more keys than the window
WINDOW_CASES = [  # (hq, hkv, d, n_ctx, pos, s, window)
    (4, 2, 16, 320, 300, 1, 5),
    (4, 2, 16, 320, 300, 1, 64),
    (4, 2, 16, 320, 300, 1, 237),
    (4, 2, 16, 320, 200, 1, 400),     # wider than the context: every key
    (3, 1, 32, 160, 7, 30, 9),        # a prompt after a prefix
    (2, 2, 8, 160, 0, 140, 70),       # a long prompt from 0
]


# The GPU's paths (one range; ranges + combine), the host backends' one
BACKEND_PATHS = [("gpu", "one range"), ("gpu", "ranges"), ("cpu", "one range"),
                 ("numpy", "one range")]


@pytest.mark.parametrize("cache", [np.float32, np.float16])
@pytest.mark.parametrize("backend,kernels", BACKEND_PATHS + [("gpu", "tiled")])
@pytest.mark.parametrize("hq,hkv,d,n_ctx,pos,s,window", WINDOW_CASES)
def test_attention_cached_sliding_window_softcap_and_scaled_rope_match_float64(
        backend, kernels, hq, hkv, d, n_ctx, pos, s, window, cache, rng, monkeypatch,
        request):
    if backend == "gpu":
        request.getfixturevalue("gpu_device")
    _take(kernels, monkeypatch)
    qkv, kc, vc = _case(rng, hq, hkv, d, n_ctx, s, cache)
    qkv *= 3.0  # scores large enough for the cap to matter
    params = {"freq_factors": tuple(1.0 + 7.0 * rng.random(d // 2)),
              "attn_factor": 1.15, "softcap": 4.0, "window": window}
    got = _run(backend, qkv, kc, vc, _state(rng, pos), n_heads=hq, style="neox", **params)
    expected = expected_step(qkv, kc, vc, pos, hq, style="neox", **params)
    _check(got, kc, vc, expected, pos, s)
    plain = expected_step(qkv, kc, vc, pos, hq, style="neox")[0]
    assert np.abs(got[0] - plain).max() > 1e-2  # the parameters really changed it


RING_CASES = [  # (hq, hkv, d, ring rows, pos, s, window)
    (4, 2, 16, 64, 300, 1, 40),      # decoding, the ring wrapped several times
    (4, 2, 16, 64, 130, 1, 64),      # a window as long as the ring
    (3, 1, 32, 128, 500, 30, 90),    # a prompt's pass: window + 30 - 1 = 119 rows needed
    (2, 2, 8, 64, 0, 40, 20),        # from position 0, not wrapped yet
    (4, 2, 16, 192, 1000, 1, 150),   # ranges of 64 keys over 1,000 positions
]


@pytest.mark.parametrize("cache", [np.float32, np.float16])
@pytest.mark.parametrize("backend,kernels", BACKEND_PATHS)
@pytest.mark.parametrize("hq,hkv,d,rows,pos,s,window", RING_CASES)
def test_a_ring_cache_of_the_window_attends_as_a_full_cache_would(
        backend, kernels, hq, hkv, d, rows, pos, s, window, cache, rng, monkeypatch, request):
    if backend == "gpu":
        request.getfixturevalue("gpu_device")
    _take(kernels, monkeypatch)
    assert transformer.cached_rows(window, s, 10**6) <= rows
    qkv, full_k, full_v = _case(rng, hq, hkv, d, pos + s, s, cache)
    ring_k = rng.standard_normal((rows, hkv, d)).astype(cache)  # rows never written
    ring_v = rng.standard_normal((rows, hkv, d)).astype(cache)
    for j in range(max(0, pos - rows), pos):  # the positions a ring holds before the pass
        ring_k[j % rows], ring_v[j % rows] = full_k[j], full_v[j]
    got = _run(backend, qkv, ring_k, ring_v, _state(rng, pos), n_heads=hq, style="neox",
               window=window, max_keys=max(pos + s, rows + 64))
    out, k_full, v_full = expected_step(qkv, full_k, full_v, pos, hq, style="neox",
                                        window=window)
    assert_close(got[0], out, TOL)
    new_rows = np.arange(pos, pos + s) % rows
    assert_close(got[1][new_rows], k_full[pos: pos + s], TOL)
    np.testing.assert_array_equal(got[2][new_rows], v_full[pos: pos + s].astype(cache))


def test_a_ring_cache_too_small_for_the_window_and_the_pass_is_refused(rng):
    qkv, kc, vc = _case(rng, 4, 2, 16, 64, 30)
    with pytest.raises(ShapeError, match=r"at least window \+ new tokens - 1 = 69 rows"):
        attention_cached(qkv, kc, vc, _state(rng, 100), n_heads=4, window=40, max_keys=200,
                         backend="numpy")
    with pytest.raises(ShapeError, match=r"max_keys must be in 30..64 \(beyond the cache only "
                                         r"with a window\), got 200"):
        attention_cached(qkv, kc, vc, _state(rng, 100), n_heads=4, max_keys=200,
                         backend="numpy")


@pytest.mark.parametrize("backend", ["gpu", "cpu"])
@pytest.mark.parametrize("pos,s,window", [(290, 1, 40), (290, 1, 200), (5, 2, 3)])
def test_attention_cached_matmul_quant_add_takes_the_window_and_cap(backend, pos, s, window,
                                                                     rng, request):
    if backend == "gpu":
        request.getfixturevalue("gpu_device")
    hq, hkv, d, n_ctx = 4, 2, 16, 300
    inputs, _ = _projected(rng, hq, hkv, d, n_ctx, pos, s, "Q8_0")
    params = {"n_heads": hq, "qtype": "Q8_0", "k": hq * d, "softcap": 3.0, "window": window}
    got = _run_projected(backend, inputs, **params)
    expected = _run_projected("numpy", inputs, **params)
    assert_close(got[0], expected[0], NMSE_ELEMENTWISE * 10)
    plain = _run_projected("numpy", inputs, n_heads=hq, qtype="Q8_0", k=hq * d)
    assert np.abs(got[0] - plain[0]).max() > 1e-2


@pytest.mark.parametrize("style", ["interleaved", "neox"])
@pytest.mark.parametrize("hq,hkv,pos,s", [(6, 2, 40, 1), (3, 3, 9, 5)])
def test_attention_cached_equals_rope_write_rows_and_attention(hq, hkv, pos, s, style, rng,
                                                               gpu_device):
    d, n_ctx = 16, 64
    qkv, kc, vc = _case(rng, hq, hkv, d, n_ctx, s)
    ops, gpu = pxvm.ops, pxvm.get_backend("gpu")
    k_fused, v_fused = gpu.from_numpy(kc), gpu.from_numpy(vc)
    fused = attention_cached(qkv, k_fused, v_fused, _state(rng, pos), n_heads=hq, style=style,
                             backend="gpu").numpy()
    q = ops.rope(qkv[:, : hq * d].reshape(s, hq, d), pos_offset=pos, style=style, backend="gpu")
    k = ops.rope(qkv[:, hq * d: (hq + hkv) * d].reshape(s, hkv, d), pos_offset=pos,
                 style=style, backend="gpu")
    k_old, v_old = gpu.from_numpy(kc), gpu.from_numpy(vc)
    ops.write_rows(k_old, k, start=pos)
    ops.write_rows(v_old, qkv[:, (hq + hkv) * d:].reshape(s, hkv, d), start=pos)
    plain = ops.attention(q, k_old.prefix(pos + s), v_old.prefix(pos + s), causal=True)
    assert_close(fused, plain.numpy().reshape(s, hq * d), TOL)
    assert_close(k_fused.numpy(), k_old.numpy(), TOL)
    np.testing.assert_array_equal(v_fused.numpy(), v_old.numpy())


def test_one_recorded_attention_step_serves_every_position(path, rng, gpu_device):
    # The position lives in the state tensor on the device: a step captured once and
    # submitted again (with host writes of the new token's qkv and of the state in
    # between) must attend at the position of each submit and append there.
    hq, hkv, d, n_ctx = 4, 2, 16, 140
    _ranges_taken(path, n_ctx)
    qkv, kc, vc = _case(rng, hq, hkv, d, n_ctx, 1)
    gpu = pxvm.get_backend("gpu")
    qkv_t, k_t, v_t = gpu.from_numpy(qkv), gpu.from_numpy(kc), gpu.from_numpy(vc)
    state_t = gpu.from_numpy(_state(rng, 0))
    step = Graph(gpu, lambda: {"out": attention_cached(qkv_t, k_t, v_t, state_t, n_heads=hq,
                                                        style="neox")})
    k_ref, v_ref = kc.astype(np.float64), vc.astype(np.float64)
    for pos in (0, 1, 2, 31, 32, 33, 100, 139):
        row = rng.standard_normal(qkv.shape).astype(np.float32)
        qkv_t.write(row)
        state_t.write(np.array([7, pos], np.int32))
        got = step.run("out")["out"]
        expected, k_ref, v_ref = expected_step(row, k_ref, v_ref, pos, hq, style="neox")
        assert_close(got, expected, TOL)
    assert_close(k_t.numpy(), k_ref, TOL)
    np.testing.assert_array_equal(v_t.numpy(), v_ref.astype(np.float32))


def test_one_recorded_prompt_serves_every_position(rng, gpu_device, dispatched):
    # The tiled attention reads the position on the device too: a prompt's pass captured
    # once serves a prompt's pieces at each position.
    hq, hkv, d, n_ctx, s = 6, 2, 32, 160, 40
    qkv, kc, vc = _case(rng, hq, hkv, d, n_ctx, s)
    gpu = pxvm.get_backend("gpu")
    qkv_t, k_t, v_t = gpu.from_numpy(qkv), gpu.from_numpy(kc), gpu.from_numpy(vc)
    state_t = gpu.from_numpy(_state(rng, 0))
    step = Graph(gpu, lambda: {"out": attention_cached(qkv_t, k_t, v_t, state_t, n_heads=hq)})
    k_ref, v_ref = kc.astype(np.float64), vc.astype(np.float64)
    for pos in (0, 40, 80, 120):
        piece = rng.standard_normal(qkv.shape).astype(np.float32)
        qkv_t.write(piece)
        state_t.write(np.array([7, pos], np.int32))
        got = step.run("out")["out"]
        expected, k_ref, v_ref = expected_step(piece, k_ref, v_ref, pos, hq)
        assert_close(got, expected, TOL)
    assert dispatched == [APPEND, TILED]  # recorded once
    assert_close(k_t.numpy(), k_ref, TOL)
    np.testing.assert_array_equal(v_t.numpy(), v_ref.astype(np.float32))


def _bad_operands():
    rng = np.random.default_rng(0)
    qkv, kc, vc = _case(rng, 4, 2, 16, 20, 2)
    st = np.array([0, 3], np.int32)
    odd = np.ones((20, 2, 15), np.float32)
    return [
        ((qkv[:, :-1], kc, vc, st), {}, r"qkv must be \(S, 128\) for 4 query heads and 2 "
                                        r"key/value heads of 16, got \(2, 127\)"),
        ((qkv[0], kc, vc, st), {}, r"qkv must be \(S, 128\)"),
        ((qkv, kc, vc, st), {"n_heads": 3}, r"query heads \(3\) must be a multiple of "
                                            r"key/value heads \(2\)"),
        ((np.ones((2, 120), np.float32), odd, odd, st), {},
         "head dimension must be even and at most 256, got 15"),
        ((qkv, kc, vc[:19], st), {}, r"caches must both be \(n_ctx, Hkv, D\), got \(20, 2, 16\) "
                                     r"and \(19, 2, 16\)"),
        ((qkv, kc, vc, st.astype(np.float32)), {}, "attention_cached: input state has dtype "
                                                   "float32, expected int32"),
        ((qkv, kc, vc, st[:1]), {}, "state must be an int32 tensor"),
        ((qkv, kc, vc, st), {"style": "gptj"}, "rope style must be one of .*got 'gptj'"),
        ((qkv, kc, vc, st), {"max_keys": 21}, r"max_keys must be in 2..20 \(.*\), got 21"),
        ((qkv, kc, vc, st), {"max_keys": 1}, r"max_keys must be in 2..20 \(.*\), got 1"),
        ((qkv.astype(np.int32), kc, vc, st), {}, "attention_cached: input qkv has dtype "
                                                 "int32, expected float32"),
        ((qkv, kc.astype(np.int32), vc, st), {}, "input k_cache has dtype int32, expected "
                                                 "float32 or float16"),
        ((qkv, kc, vc.astype(np.float16), st), {}, "the caches must have one dtype, got "
                                                   "float32 keys and float16 values"),
    ]


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
@pytest.mark.parametrize("args,params,message", _bad_operands())
def test_attention_cached_refuses_bad_operands_clearly(args, params, message, backend,
                                                       request):
    if backend == "gpu":
        request.getfixturevalue("gpu_device")
    params = {"n_heads": 4, **params}
    with pytest.raises(ShapeError, match=message):
        attention_cached(*args, backend=backend, **params)


@pytest.mark.parametrize("pos,s", [(19, 2), (20, 1), (-1, 1)])
def test_attention_cached_reference_refuses_positions_outside_the_cache(pos, s, rng):
    qkv, kc, vc = _case(rng, 4, 2, 16, 20, s)
    last = pos + s - 1
    with pytest.raises(ShapeError, match=f"positions {pos}..{last} are outside the cache "
                                         "of 20 rows"):
        attention_cached(qkv, kc, vc, np.array([0, pos], np.int32), n_heads=4, backend="numpy")


@pytest.mark.parametrize("max_keys", [32, 96])
def test_positions_beyond_max_keys_are_refused_by_the_reference_and_nan_elsewhere(
        max_keys, path, rng, gpu_device):
    # max_keys records a grid for that many keys (96: two ranges on the "ranges" path); a
    # token 8 positions further has keys beyond it. The reference knows the position and
    # refuses; the GPU and the CPU kernel read it while running (a recorded step) and
    # answer NaN instead of attention over part of the keys.
    _ranges_taken(path, max_keys)
    qkv, kc, vc = _case(rng, 4, 2, 16, 120, 1)
    pos = max_keys + 8
    state = np.array([0, pos], np.int32)
    with pytest.raises(ShapeError, match=f"positions {pos}..{pos} reach beyond "
                                         f"max_keys={max_keys}"):
        attention_cached(qkv, kc.copy(), vc.copy(), state, n_heads=4, max_keys=max_keys,
                         backend="numpy")
    for backend in ("gpu", "cpu"):
        out = attention_cached(qkv, kc, vc, state, n_heads=4, max_keys=max_keys,
                               backend=backend).numpy()
        assert np.isnan(out).all(), backend
        inside = attention_cached(qkv, kc, vc, np.array([0, max_keys - 1], np.int32),
                                  n_heads=4, max_keys=max_keys, backend=backend).numpy()
        assert np.isfinite(inside).all(), backend


def test_a_prompt_reaching_beyond_max_keys_is_nan_only_there(path, rng, gpu_device):
    # Tokens at positions from max_keys on answer NaN, those before it their attention
    # (and their keys and values are appended; the rows beyond the bound hold what a
    # path leaves there).
    hq, hkv, d, n_ctx, pos, s, max_keys = 4, 2, 16, 200, 60, 70, 100
    qkv, kc, vc = _case(rng, hq, hkv, d, n_ctx, s)
    out, k_new, v_new, _ = _run("gpu", qkv, kc, vc, _state(rng, pos), n_heads=hq,
                                max_keys=max_keys)
    expected, k_ref, v_ref = expected_step(qkv, kc, vc, pos, hq)
    inside = max_keys - pos
    assert np.isnan(out[inside:]).all()
    assert_close(out[:inside], expected[:inside], TOL)
    assert_close(k_new[:max_keys], k_ref[:max_keys], TOL)
    np.testing.assert_array_equal(v_new[:max_keys], v_ref[:max_keys].astype(np.float32))


def test_python_constants_match_the_kernels():
    # The host sizes grids and buffers by these; the kernels loop by their own copies.
    def const(kernel, name):
        return int(re.search(rf"const {name}: u32 = (\d+)u;", load_wgsl(kernel)).group(1))

    assert const("attention_cached.wgsl", "WG") // const("attention_cached.wgsl", "KEY_LANES") \
        * 2 == webgpu_transformer.CACHED_CHUNK  # CHUNK = 2 * SLOTS
    assert const(webgpu_transformer.PROMPT_KERNEL, "WG") == webgpu_transformer.PROMPT_WG
    merged = re.search(r"override MERGED_VALUES: u32 = (\d+)u;", load_wgsl("matmul_quant.wgsl"))
    assert int(merged.group(1)) == webgpu_quantized.MAX_MERGED


# ---- attention_cached_matmul_quant_add ------------------------------------------------

PROJECTED_CASES = [  # (hq, hkv, d, n_ctx, pos, s, max_keys, qtype)
    (6, 2, 16, 320, 0, 1, 64, "Q4_1"),     # one range: split, then a plain product
    (6, 2, 16, 320, 200, 1, 256, "Q8_0"),
    (6, 2, 64, 320, 300, 1, None, "Q4_1"),   # five ranges merged by the product
    (4, 2, 48, 320, 299, 1, None, "Q4_0"),  # 48 does not divide the workgroup
    (2, 1, 16, 1100, 1050, 1, None, "Q4_1"),  # 128-key ranges of two chunks
    (6, 2, 16, 400, 7, 140, None, "Q4_1"),    # prefill: 140 rows
    (6, 2, 16, 400, 270, 5, 300, "Q8_0"),
    (32, 8, 128, 320, 300, 1, None, "Q8_0"),   # Llama 3 8B's heads: 4096 values merged
]


def _projected(rng, hq, hkv, d, n_ctx, pos, s, qtype, cache=np.float32, n_out=37):
    qkv, kc, vc = _case(rng, hq, hkv, d, n_ctx, s, cache)
    k = hq * d
    w = quantize((rng.standard_normal((n_out, k)) * k ** -0.5).astype(np.float32), qtype)
    residual = rng.standard_normal((s, n_out)).astype(np.float32)
    state = _state(rng, pos)
    att, k_new, v_new = expected_step(qkv, kc, vc, pos, hq)
    expected = residual + att @ dequantize(w, qtype, k).astype(np.float64).T
    return (qkv, kc, vc, state, w, residual), (expected, k_new, v_new)


def _run_projected(backend, inputs, **params):
    qkv, kc, vc, state, w, residual = inputs
    be = pxvm.get_backend(backend)
    k_t, v_t = be.from_numpy(kc), be.from_numpy(vc)
    out = attention_cached_matmul_quant_add(
        qkv, k_t, v_t, state, w, residual, backend=backend, **params).numpy()
    return out, k_t.numpy(), v_t.numpy()


@pytest.mark.parametrize("merge", ["in the product", "in matvec", "by combine", "none: tiled"])
@pytest.mark.parametrize("hq,hkv,d,n_ctx,pos,s,max_keys,qtype", PROJECTED_CASES)
def test_attention_cached_matmul_quant_add_gpu_matches_float64(
        hq, hkv, d, n_ctx, pos, s, max_keys, qtype, merge, rng, gpu_device, monkeypatch,
        dispatched):
    if merge == "in matvec":  # decoding's product kernel of the types it takes (forced)
        if qtype not in webgpu_quantized.MATVEC_TYPES:
            pytest.skip(f"matvec does not take {qtype}")
        monkeypatch.setattr(webgpu_transformer, "PRODUCT_MERGES_MAX_TOKENS", 1000)
        with tuning.forcing(webgpu_quantized.MATVEC_TUNED, (32, 2)):
            inputs, (expected, k_new, v_new) = _projected(rng, hq, hkv, d, n_ctx, pos, s, qtype)
            out, _, _ = _run_projected("gpu", inputs, n_heads=hq, max_keys=max_keys,
                                       qtype=qtype, k=hq * d)
        assert ("matmul_quant_subgroups.wgsl" if gpu_device.has("subgroup")
                else "matmul_quant.wgsl", "matvec") in dispatched
        assert_close(out, expected, TOL)
        return
    _take("tiled" if merge == "none: tiled" else "ranges", monkeypatch)
    if merge == "by combine":  # as for attention outputs too long to merge in the product
        monkeypatch.setattr(webgpu_transformer, "merged_values", lambda ctx: 0)
    elif merge == "in the product":  # a prompt's tokens too (by default only a decoding
        monkeypatch.setattr(webgpu_transformer, "PRODUCT_MERGES_MAX_TOKENS", 1000)  # step's one)
    inputs, (expected, k_new, v_new) = _projected(rng, hq, hkv, d, n_ctx, pos, s, qtype)
    out, k_got, v_got = _run_projected("gpu", inputs, n_heads=hq, max_keys=max_keys,
                                       qtype=qtype, k=hq * d)
    attention = {entry for entry in dispatched if entry[0].startswith("attention")}
    assert (attention == {APPEND, TILED}) == (merge == "none: tiled"), attention
    if merge == "in the product":  # Llama 3 8B's 4096 values too, where the device holds them
        assert not any(entry == "combine" for _, entry in dispatched), dispatched
    assert out.shape == expected.shape and out.dtype == np.float32
    assert_close(out, expected, TOL)
    assert_close(k_got, k_new, TOL)
    np.testing.assert_array_equal(v_got, v_new.astype(np.float32))


def test_wide_projections_leave_many_ranges_to_the_combine_pass(rng, gpu_device, monkeypatch,
                                                               dispatched):
    # Five ranges into 37 columns: merged by the product within the work bound, by
    # `combine` beyond it (each of a wide projection's workgroups would merge them again).
    inputs, (expected, _, _) = _projected(rng, 6, 2, 64, 320, 300, 1, "Q4_1")
    for bound, combined in ((5 * 37, False), (5 * 37 - 1, True)):
        monkeypatch.setattr(webgpu_transformer, "PRODUCT_MERGES_MAX_WORK", bound)
        dispatched.clear()
        out, _, _ = _run_projected("gpu", inputs, n_heads=6, qtype="Q4_1", k=6 * 64)
        assert any(entry == "combine" for _, entry in dispatched) == combined
        assert_close(out, expected, TOL)


def test_attention_cached_matmul_quant_add_reference_matches_float64(rng):
    inputs, (expected, k_new, v_new) = _projected(rng, 6, 2, 16, 80, 40, 3, "Q4_1")
    out, k_got, _ = _run_projected("cpu", inputs, n_heads=6, qtype="Q4_1", k=96)
    assert_close(out, expected, TOL)
    assert_close(k_got, k_new, TOL)


def test_attention_cached_matmul_quant_add_is_nan_beyond_max_keys_on_gpu(rng, gpu_device):
    # As attention_cached: the merging product reads the position on the device and
    # answers NaN for a token whose keys the recorded grid does not cover.
    inputs, _ = _projected(rng, 6, 2, 16, 400, 300, 1, "Q4_1")
    inputs[3][1] = 350  # position 350 > max_keys 300 (ranges merged by the product)
    out = _run_projected("gpu", inputs, n_heads=6, max_keys=300, qtype="Q4_1", k=96)[0]
    assert np.isnan(out).all()
    inputs[3][1] = 299
    assert np.isfinite(_run_projected("gpu", inputs, n_heads=6, max_keys=300, qtype="Q4_1",
                                      k=96)[0]).all()


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
@pytest.mark.parametrize("change,message", [
    ({"k": 64}, r"K = n_heads \* head dim = 96; got k=64"),
    ({"w": np.zeros((37, 50), np.uint8)}, r"Q4_1 weight of K=96 needs \(N, 60\) bytes, "
                                          r"got \(37, 50\)"),
    ({"residual": np.ones((1, 36), np.float32)},
     r"the residual must have shape \(1, 37\), got \(1, 36\)"),
    ({"n_heads": 4}, r"qkv must be \(S, 128\)"),
])
def test_attention_cached_matmul_quant_add_refuses_bad_operands_clearly(change, message,
                                                                        backend, rng, request):
    if backend == "gpu":
        request.getfixturevalue("gpu_device")
    inputs, _ = _projected(rng, 6, 2, 16, 80, 40, 1, "Q4_1")
    args = dict(zip(("qkv", "k_cache", "v_cache", "state", "w", "residual"), inputs))
    params = {"n_heads": 6, "qtype": "Q4_1", "k": 96}
    for key, value in change.items():
        (args if key in args else params)[key] = value
    with pytest.raises(ShapeError, match=message):
        attention_cached_matmul_quant_add(*args.values(), backend=backend, **params)
