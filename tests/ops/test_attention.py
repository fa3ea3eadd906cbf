"""Attention: GQA, causal offsets and long key ranges against the reference and torch."""

import numpy as np
import pytest
from conftest import NMSE_LONG, assert_close

import pxvm

from pxvm.backends.webgpu.ops import attention as attention_module

CASES = [  # (Sq, Skv, Hq, Hkv, D)
    (1, 1, 1, 1, 1), (1, 300, 9, 3, 64), (7, 7, 9, 3, 64), (5, 600, 4, 4, 33),
    (33, 33, 2, 1, 256), (3, 1000, 6, 2, 7), (1, 2500, 9, 3, 64), (4, 2049, 3, 1, 200),
    (1, 4000, 2, 1, 256),
]


@pytest.fixture(params=["auto", "one_pass", "split_37", "split_300"])
def key_split(request, monkeypatch):
    """How the GPU splits keys: the default plan, never, or always into ranges of 37 or
    300 keys (shorter than one 256-key chunk, and spanning two)."""
    if request.param == "one_pass":
        monkeypatch.setattr(attention_module, "SPLIT_MAX_TASKS", 0)
    elif request.param.startswith("split"):
        monkeypatch.setattr(attention_module, "SPLIT_MAX_TASKS", 10**9)
        monkeypatch.setattr(attention_module, "SPLIT_MIN_KEYS", 1)
        monkeypatch.setattr(attention_module, "SPLIT_LEN", int(request.param.split("_")[1]))
    return request.param


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("sq,skv,hq,hkv,d", CASES)
def test_attention_matches_reference(gpu_device, rng, key_split, causal, sq, skv, hq, hkv, d):
    if key_split.startswith("split"):
        assert attention_module.split_plan(sq, hq, skv) == -(-skv // attention_module.SPLIT_LEN)
    q = rng.standard_normal((sq, hq, d)).astype(np.float32)
    k = rng.standard_normal((skv, hkv, d)).astype(np.float32)
    v = rng.standard_normal((skv, hkv, d)).astype(np.float32)
    got = pxvm.ops.attention(q, k, v, causal=causal, backend="gpu").numpy()
    assert_close(got, pxvm.ops.attention.reference(q, k, v, causal), NMSE_LONG)


def test_explicit_scale_is_used(gpu_device, rng):
    q = rng.standard_normal((5, 4, 16)).astype(np.float32)
    k = rng.standard_normal((9, 2, 16)).astype(np.float32)
    v = rng.standard_normal((9, 2, 16)).astype(np.float32)
    got = pxvm.ops.attention(q, k, v, causal=True, scale=0.7, backend="gpu").numpy()
    assert_close(got, pxvm.ops.attention.reference(q, k, v, True, 0.7), NMSE_LONG)
    default = pxvm.ops.attention.reference(q, k, v, True)
    assert not np.allclose(got, default, atol=1e-3)  # the scale really changed the result


def test_each_query_sees_exactly_its_causal_prefix(gpu_device, rng):
    # Changing key/value j must change query i's output iff j <= i + Skv - Sq.
    sq, skv, h, d = 3, 8, 1, 4
    q = rng.standard_normal((sq, h, d)).astype(np.float32)
    k = rng.standard_normal((skv, h, d)).astype(np.float32)
    v = rng.standard_normal((skv, h, d)).astype(np.float32)
    base = pxvm.ops.attention(q, k, v, backend="gpu").numpy()
    for j in range(skv):
        v2 = v.copy()
        v2[j] += 10.0
        changed = np.abs(pxvm.ops.attention(q, k, v2, backend="gpu").numpy() - base).max(axis=(1, 2)) > 1e-3
        assert changed.tolist() == [j <= i + skv - sq for i in range(sq)]


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


@pytest.mark.parametrize("shapes,message", [
    (((1, 2, 8), (3, 2, 8), (4, 2, 8)), r"k \(3, 2, 8\) and v \(4, 2, 8\) differ"),
    (((1, 2, 8), (3, 2, 4), (3, 2, 4)), r"head dimension of q \(8\) and k \(4\) differ"),
    (((1, 1, 300), (3, 1, 300), (3, 1, 300)), "head dimension must be 1..256, got 300"),
    (((5, 1, 8), (3, 1, 8), (3, 1, 8)), r"at least as many keys \(3\) as queries \(5\)"),
    (((5, 8), (3, 1, 8), (3, 1, 8)), r"q \(Sq, Hq, D\)"),
])
def test_bad_operands_are_refused_clearly(shapes, message):
    q, k, v = (np.ones(s, np.float32) for s in shapes)
    with pytest.raises(pxvm.ShapeError, match=message):
        pxvm.ops.attention(q, k, v, backend="gpu")


F16_CASES = [  # (Sq, Skv, Hq, Hkv, D): odd head dimensions and counts, packed halves
    (1, 1, 1, 1, 1), (1, 300, 8, 2, 64), (7, 7, 9, 3, 33), (5, 260, 4, 4, 7),
    (33, 40, 4, 1, 128),
]


def _f16_inputs(rng, sq, skv, hq, hkv, d):
    return (rng.standard_normal((sq, hq, d)).astype(np.float16),
            rng.standard_normal((skv, hkv, d)).astype(np.float16),
            rng.standard_normal((skv, hkv, d)).astype(np.float16))


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("sq,skv,hq,hkv,d", F16_CASES)
def test_attention_f16_matches_reference_on_webgpu(gpu_device, rng, causal, sq, skv, hq, hkv, d):
    q, k, v = _f16_inputs(rng, sq, skv, hq, hkv, d)
    got = pxvm.ops.attention_f16(q, k, v, causal=causal, backend="webgpu").numpy()
    assert got.dtype == np.float32 and got.shape == (sq, hq, d)
    assert_close(got, pxvm.ops.attention_f16.reference(q, k, v, causal), NMSE_LONG)


def test_attention_f16_uses_a_given_scale_on_webgpu(gpu_device, rng):
    q, k, v = _f16_inputs(rng, 5, 9, 4, 2, 16)
    got = pxvm.ops.attention_f16(q, k, v, causal=True, scale=0.7, backend="webgpu").numpy()
    assert_close(got, pxvm.ops.attention_f16.reference(q, k, v, True, 0.7), NMSE_LONG)
    assert not np.allclose(got, pxvm.ops.attention_f16.reference(q, k, v, True), atol=1e-3)


@pytest.mark.parametrize("causal", [True, False])
def test_attention_f16_on_numpy_agrees_with_torch_sdpa(rng, causal):
    torch = pytest.importorskip("torch")
    sq, skv, hq, hkv, d = 4, 11, 9, 3, 16
    q, k, v = _f16_inputs(rng, sq, skv, hq, hkv, d)
    got = pxvm.ops.attention_f16(q, k, v, causal=causal, backend="numpy").numpy()
    assert got.dtype == np.float32
    # torch in float64 from the same float16 values
    tq, tk, tv = (torch.tensor(x.astype(np.float64)).permute(1, 0, 2) for x in (q, k, v))
    tk, tv = (t.repeat_interleave(hq // hkv, 0) for t in (tk, tv))
    mask = torch.arange(skv)[None, :] <= torch.arange(sq)[:, None] + (skv - sq)
    expected = torch.nn.functional.scaled_dot_product_attention(
        tq, tk, tv, attn_mask=mask if causal else None)
    assert_close(got, expected.permute(1, 0, 2).numpy(), 1e-12)


def test_attention_f16_takes_float16_only():
    x = np.ones((2, 2, 8), np.float32)
    with pytest.raises(pxvm.ShapeError, match="attention_f16: input q has dtype float32"):
        pxvm.ops.attention_f16(x, x, x, backend="numpy")
