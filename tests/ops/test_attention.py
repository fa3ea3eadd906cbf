"""Attention: GQA, causal offsets and long key ranges against the reference and torch."""

import numpy as np
import pytest

import pxvm
from conftest import NMSE_LONG, assert_close

CASES = [  # (Sq, Skv, Hq, Hkv, D)
    (1, 1, 1, 1, 1), (1, 300, 9, 3, 64), (7, 7, 9, 3, 64), (5, 600, 4, 4, 33),
    (33, 33, 2, 1, 256), (3, 1000, 6, 2, 7),
]


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("sq,skv,hq,hkv,d", CASES)
def test_attention_matches_reference(gpu_device, rng, causal, sq, skv, hq, hkv, d):
    q = rng.standard_normal((sq, hq, d)).astype(np.float32)
    k = rng.standard_normal((skv, hkv, d)).astype(np.float32)
    v = rng.standard_normal((skv, hkv, d)).astype(np.float32)
    got = pxvm.ops.attention(q, k, v, causal=causal, backend="gpu").numpy()
    assert_close(got, pxvm.ops.attention.reference(q, k, v, causal), NMSE_LONG)


def test_attention_reference_agrees_with_torch_sdpa(rng):
    torch = pytest.importorskip("torch")
    sq, skv, hq, hkv, d = 4, 11, 9, 3, 16
    q = rng.standard_normal((sq, hq, d)).astype(np.float32)
    k = rng.standard_normal((skv, hkv, d)).astype(np.float32)
    v = rng.standard_normal((skv, hkv, d)).astype(np.float32)
    tq = torch.tensor(q).permute(1, 0, 2)
    tk = torch.tensor(k).permute(1, 0, 2).repeat_interleave(hq // hkv, 0)
    tv = torch.tensor(v).permute(1, 0, 2).repeat_interleave(hq // hkv, 0)
    mask = torch.arange(skv)[None, :] <= torch.arange(sq)[:, None] + (skv - sq)
    expected = torch.nn.functional.scaled_dot_product_attention(tq, tk, tv, attn_mask=mask)
    assert_close(pxvm.ops.attention.reference(q, k, v), expected.permute(1, 0, 2).numpy(), 1e-10)


def test_heads_must_group_evenly():
    with pytest.raises(pxvm.ShapeError, match=r"query heads \(4\) must be a multiple"):
        pxvm.ops.attention(np.ones((1, 4, 8), np.float32), np.ones((2, 3, 8), np.float32),
                           np.ones((2, 3, 8), np.float32), backend="gpu")
