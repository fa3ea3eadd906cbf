"""Attention on the CUDA backend: the fused tensor-core kernel of `attention_f16` (every
variant of pxvm.backends.cuda.ptx.attention.SHAPES) and the float32 `attention`, against the
float64 reference on fresh random inputs: one query and many, query and key counts that
fill no tile, grouped-query heads of groups 1, 4 and 8, with and without the causal mask;
outputs poisoned before each run (conftest). Skipped, saying why, without a driver."""

from __future__ import annotations


import numpy as np
import pytest
from conftest import NMSE_LONG, assert_close

import pxvm
from pxvm.backends.cuda.ptx import attention as ptx_attention
from pxvm.ops.registry import MissingKernelError

from pxvm.backends.cuda.ops import attention as cuda_attention

#: float16 inputs, float32 accumulation, P rounded to float16 for P V
NMSE_F16_ATTENTION = 5e-4

F16_SIZES = [  # (Sq, Skv, Hq, Hkv)
    (1, 1, 4, 4), (1, 300, 8, 1), (17, 17, 8, 2), (100, 257, 8, 1), (257, 257, 4, 4),
    (200, 1000, 8, 2), (300, 17, 4, 1),  # more queries than keys: without the mask only
]


def _inputs(rng, sq, skv, hq, hkv, d, dtype, magnitude=1.0):
    q = (rng.standard_normal((sq, hq, d)) * magnitude).astype(dtype)
    k = (rng.standard_normal((skv, hkv, d)) * magnitude).astype(dtype)
    v = rng.standard_normal((skv, hkv, d)).astype(dtype)
    return q, k, v


@pytest.mark.parametrize("shape", ptx_attention.SHAPES, ids=lambda s: "d{}_n{}_w{}".format(*s))
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("sq,skv,hq,hkv", F16_SIZES)
def test_fused_f16_attention_matches_the_reference(cuda_device, rng, forced, shape, causal,
                                                   sq, skv, hq, hkv):
    if causal and sq > skv:
        pytest.skip("causal attention needs at least as many keys as queries")
    d = shape[0]
    forced(cuda_attention.shape_tuned(d), shape)
    q, k, v = _inputs(rng, sq, skv, hq, hkv, d, np.float16)
    got = pxvm.ops.attention_f16(q, k, v, causal=causal, backend="cuda").numpy()
    assert got.dtype == np.float32 and got.shape == (sq, hq, d)
    assert_close(got, pxvm.ops.attention_f16.reference(q, k, v, causal), NMSE_F16_ATTENTION)


@pytest.mark.parametrize("d", sorted(ptx_attention.DEFAULT))
def test_fused_f16_attention_takes_large_scores_and_a_given_scale(cuda_device, rng, d):
    # scores in the hundreds: the online softmax must subtract each row's running max
    q, k, v = _inputs(rng, 130, 200, 8, 2, d, np.float16, magnitude=4.0)
    for scale in (None, 0.3):
        got = pxvm.ops.attention_f16(q, k, v, scale=scale, backend="cuda").numpy()
        assert_close(got, pxvm.ops.attention_f16.reference(q, k, v, True, scale),
                     NMSE_F16_ATTENTION)


def test_fused_f16_attention_sees_exactly_each_causal_prefix(cuda_device, rng):
    # changing value j must change query i's output iff j <= i + Skv - Sq, across tiles
    sq, skv, d = 70, 140, 64
    q, k, v = _inputs(rng, sq, skv, 1, 1, d, np.float16)
    base = pxvm.ops.attention_f16(q, k, v, backend="cuda").numpy()
    for j in (0, 63, 64, 69, 70, 71, 127, 128, 139):
        v2 = v.copy()
        v2[j] += np.float16(50.0)
        changed = np.abs(pxvm.ops.attention_f16(q, k, v2, backend="cuda").numpy()
                         - base).max(axis=(1, 2)) > 1e-3
        assert changed.tolist() == [j <= i + skv - sq for i in range(sq)], j


def test_fused_f16_attention_says_what_it_does_not_take(cuda_device):
    x = np.ones((3, 2, 96), np.float16)
    with pytest.raises(MissingKernelError, match="attention_f16 on CUDA takes head dimensions"):
        pxvm.ops.attention_f16(x, x, x, backend="cuda")
    x = np.ones((3, 2, 64), np.float16)
    with pytest.raises(MissingKernelError, match="takes a positive scale, not -0.5"):
        pxvm.ops.attention_f16(x, x, x, scale=-0.5, backend="cuda")


def test_f32_attention_takes_a_negative_scale(cuda_device, rng):
    q, k, v = _inputs(rng, 9, 20, 4, 2, 16, np.float32)
    got = pxvm.ops.attention(q, k, v, causal=True, scale=-0.4, backend="cuda").numpy()
    assert_close(got, pxvm.ops.attention.reference(q, k, v, True, -0.4), NMSE_LONG)


F32_CASES = [  # (Sq, Skv, Hq, Hkv, D): odd head dimensions too
    (1, 1, 1, 1, 1), (1, 300, 9, 3, 64), (7, 7, 9, 3, 64), (5, 600, 4, 4, 33),
    (33, 33, 2, 1, 256), (3, 1000, 6, 2, 7), (17, 100, 8, 1, 128), (4, 2049, 3, 1, 200),
    (40, 17, 4, 2, 16),
]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("sq,skv,hq,hkv,d", F32_CASES)
def test_f32_attention_matches_the_reference(cuda_device, rng, causal, sq, skv, hq, hkv, d):
    if causal and sq > skv:
        pytest.skip("causal attention needs at least as many keys as queries")
    q, k, v = _inputs(rng, sq, skv, hq, hkv, d, np.float32)
    got = pxvm.ops.attention(q, k, v, causal=causal, backend="cuda").numpy()
    assert got.shape == (sq, hq, d)
    assert_close(got, pxvm.ops.attention.reference(q, k, v, causal), NMSE_LONG)


def test_f32_attention_uses_a_given_scale(cuda_device, rng):
    q, k, v = _inputs(rng, 5, 9, 4, 2, 16, np.float32)
    got = pxvm.ops.attention(q, k, v, causal=True, scale=0.7, backend="cuda").numpy()
    assert_close(got, pxvm.ops.attention.reference(q, k, v, True, 0.7), NMSE_LONG)
    assert not np.allclose(got, pxvm.ops.attention.reference(q, k, v, True), atol=1e-3)


def test_attention_runs_inside_a_batch(cuda_device, rng):
    q, k, v = _inputs(rng, 64, 64, 4, 1, 128, np.float16)
    with pxvm.Batch(cuda_device) as batch:
        out = pxvm.ops.attention_f16(q, k, v)
        wide = pxvm.ops.attention(q.astype(np.float32), k.astype(np.float32),
                                  v.astype(np.float32))
    batch.execute()
    expected = pxvm.ops.attention_f16.reference(q, k, v, True)
    assert_close(batch.read(out), expected, NMSE_F16_ATTENTION)
    assert_close(batch.read(wide), expected, NMSE_LONG)
