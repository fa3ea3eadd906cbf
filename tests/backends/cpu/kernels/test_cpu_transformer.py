"""The fast CPU backend's transformer kernels (pxvm.backends.cpu.kernels.transformer) against the
ops' numpy references: rmsnorm, SwiGLU, and attention over a KV cache (grouped-query and
plain heads, both RoPE styles, prompts and single tokens at later positions; float32 and
float16 caches, the latter's conversions exact)."""

from __future__ import annotations

import math

import numba
import numpy as np
import pytest
from conftest import NMSE_ELEMENTWISE, NMSE_LONG, nmse

from pxvm.backends.cpu.kernels import transformer
from pxvm.ops import rmsnorm, silu
from pxvm.ops.transformer import attention_cached
from pxvm.ops.normalization import rope_angles


def test_rmsnorm_matches_the_reference(rng):
    x = (rng.standard_normal((5, 77)) * 30).astype(np.float32)
    gain = rng.standard_normal(77).astype(np.float32)
    out = np.full_like(x, np.nan)
    transformer.rmsnorm(x, gain, 1e-5, out)
    assert nmse(out, rmsnorm.reference(x, gain, 1e-5)) <= NMSE_ELEMENTWISE


def test_swiglu_matches_the_reference(rng):
    both = (rng.standard_normal((3, 2 * 45)) * 4).astype(np.float32)
    out = np.full((3, 45), np.nan, np.float32)
    transformer.glu(both, False, out)
    expected = silu.reference(both[:, :45]) * both[:, 45:]
    assert nmse(out, expected) <= NMSE_ELEMENTWISE


def _rope_table(theta, d, positions):
    ang = rope_angles(positions, d, theta)
    return np.stack([np.cos(ang), np.sin(ang)], axis=-1).astype(np.float32)


@pytest.mark.parametrize("threads", ["the calling thread", "the pool"])
@pytest.mark.parametrize("cache", [np.float32, np.float16])
@pytest.mark.parametrize("style", ["interleaved", "neox"])
@pytest.mark.parametrize("hq,hkv,s,pos", [(4, 2, 7, 0), (3, 3, 1, 0), (4, 1, 1, 37),
                                          (6, 2, 5, 20), (6, 2, 1, 300), (4, 2, 3, 250)])
def test_attention_over_the_cache_matches_the_reference(style, hq, hkv, s, pos, cache, threads,
                                                        rng, monkeypatch):
    # little work runs on the calling thread (SERIAL_KEYS), more on the pool: both forced
    monkeypatch.setattr(transformer, "SERIAL_KEYS", 10**9 if threads == "the calling thread"
                        else -1)
    d, n_ctx, theta = 16, 320, 10000.0
    qkv = rng.standard_normal((s, (hq + 2 * hkv) * d)).astype(np.float32)
    earlier = rng.standard_normal((n_ctx, hkv, d)).astype(cache)  # keys already cached
    state = np.array([0, pos], np.int32)
    ref_k, ref_v = earlier.copy(), earlier[::-1].copy()
    expected = attention_cached.reference(qkv, ref_k, ref_v, state, n_heads=hq, theta=theta,
                                          style=style)
    k_cache, v_cache = earlier.copy(), earlier[::-1].copy()
    out = np.full((s, hq * d), np.nan, np.float32)
    transformer.attention_cached(qkv, k_cache, v_cache, state, _rope_table(theta, d, n_ctx), hq,
                                 style == "neox", np.float32(1 / math.sqrt(d)), np.float32(0), 0,
                                 n_ctx, out)
    assert nmse(out, expected) <= NMSE_LONG / 50
    # the new keys (rotated) and values were written where the reference writes them
    assert nmse(k_cache[: pos + s], ref_k[: pos + s]) <= NMSE_ELEMENTWISE
    np.testing.assert_array_equal(v_cache, ref_v)
    assert k_cache.dtype == v_cache.dtype == cache


@numba.njit
def _converted_halves(bits, out):
    for i in range(bits.size):
        out[i] = transformer._half_to_float(bits[i])


@numba.njit
def _rounded_to_halves(x, out):
    for i in range(x.size):
        out[i] = transformer._float_to_half(x[i])


def test_float16_conversions_are_exact_and_round_to_nearest_even(rng):
    # every float16 to float32; float32 values of every range (subnormal halves, ties,
    # overflow to inf) to float16 as numpy rounds them
    bits = np.arange(1 << 16).astype(np.uint16)
    got = np.full(bits.size, np.nan, np.float32)
    _converted_halves(bits, got)
    expected = bits.view(np.float16).astype(np.float32)
    np.testing.assert_array_equal(got, expected)
    x = np.concatenate([rng.standard_normal(1 << 16).astype(np.float32) * scale
                        for scale in (1.0, 1e-5, 3e-7, 1e4)]
                       + [expected[np.isfinite(expected)] * np.float32(1 + 2**-11),  # ties
                          np.array([65504, 65519.99, 65520, 1e9, -np.inf, 2**-25, 2**-24,
                                    -3 * 2**-26, 0.0, -0.0], np.float32)])
    halves = np.zeros(x.size, np.uint16)
    _rounded_to_halves(x, halves)
    with np.errstate(over="ignore"):
        np.testing.assert_array_equal(halves, x.astype(np.float16).view(np.uint16))


@pytest.mark.parametrize("pos,max_keys", [(60, 64), (-1, 64), (10, 8)])
def test_attention_past_its_bound_answers_nan_rows(pos, max_keys, rng):
    d, hq, hkv, s = 8, 2, 1, 5
    qkv = rng.standard_normal((s, (hq + 2 * hkv) * d)).astype(np.float32)
    cache = np.zeros((64, hkv, d), np.float32)
    out = np.zeros((s, hq * d), np.float32)
    transformer.attention_cached(qkv, cache, cache.copy(), np.array([0, pos], np.int32),
                                 _rope_table(1e4, d, 64), hq, False, np.float32(0.3),
                                 np.float32(0), 0, max_keys, out)
    assert np.isnan(out).all()
