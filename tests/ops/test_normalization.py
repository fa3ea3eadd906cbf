"""Softmax, log_softmax, rmsnorm, layer_norm and rope against their numpy references."""

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import pxvm
from conftest import NMSE_F16, ODD_SIZES, assert_close

ROW_SHAPES = [(n,) for n in ODD_SIZES] + [(7, 33), (2, 3, 257), (70001, 3), (3, 5000)]


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
@pytest.mark.parametrize("shape", ROW_SHAPES)
def test_softmax_family_matches_reference(gpu_device, rng, name, shape):
    x = (rng.standard_normal(shape) * 10).astype(np.float32)
    op = getattr(pxvm.ops, name)
    assert_close(op(x, backend="gpu").numpy(), op.reference(x), NMSE_F16)


def test_softmax_is_stable_for_huge_logits(gpu_device, rng):
    x = (rng.standard_normal((5, 33)) * 1e4).astype(np.float32)
    got = pxvm.ops.softmax(x, backend="gpu").numpy()
    assert np.all(np.isfinite(got))
    assert_close(got, pxvm.ops.softmax.reference(x), NMSE_F16)


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_softmax_family_nan_and_inf_rows_agree_with_reference(gpu_device, rng, name):
    # Special values sit after the first element so the kernel must keep a NaN (or +inf)
    # already found while later, ordinary values arrive.
    x = rng.standard_normal((4, 300)).astype(np.float32)
    x[0, 5] = np.nan
    x[1, 299] = np.nan
    x[2, 100] = -np.inf
    op = getattr(pxvm.ops, name)
    with np.errstate(invalid="ignore"):
        expected = op.reference(x)
    assert_close(op(x, backend="gpu").numpy(), expected, NMSE_F16)


@settings(max_examples=25, deadline=None)
@given(rows=st.integers(1, 300), cols=st.integers(1, 700), seed=st.integers(0, 2**32 - 1))
def test_softmax_property_rows_sum_to_one(gpu_device, rows, cols, seed):
    x = (np.random.default_rng(seed).standard_normal((rows, cols)) * 5).astype(np.float32)
    got = pxvm.ops.softmax(x, backend="gpu").numpy()
    assert_close(got, pxvm.ops.softmax.reference(x), NMSE_F16)
    np.testing.assert_allclose(got.sum(axis=-1), 1.0, rtol=1e-5)


@pytest.mark.parametrize("shape", [(1,), (7,), (33, 257), (5, 3, 576), (70001, 3)])
def test_rmsnorm_and_layer_norm_match_reference(gpu_device, rng, shape):
    x = (rng.standard_normal(shape) * 3 + 1).astype(np.float32)
    w = rng.standard_normal(shape[-1]).astype(np.float32)
    b = rng.standard_normal(shape[-1]).astype(np.float32)
    assert_close(pxvm.ops.rmsnorm(x, w, 1e-5, backend="gpu").numpy(),
                 pxvm.ops.rmsnorm.reference(x, w, 1e-5), NMSE_F16)
    assert_close(pxvm.ops.layer_norm(x, w, b, backend="gpu").numpy(),
                 pxvm.ops.layer_norm.reference(x, w, b), NMSE_F16)


def test_layer_norm_reference_agrees_with_torch(rng):
    torch = pytest.importorskip("torch")
    x = rng.standard_normal((7, 33)).astype(np.float32)
    w, b = rng.standard_normal(33).astype(np.float32), rng.standard_normal(33).astype(np.float32)
    expected = torch.nn.functional.layer_norm(torch.tensor(x), (33,), torch.tensor(w), torch.tensor(b)).numpy()
    assert_close(pxvm.ops.layer_norm.reference(x, w, b), expected, 1e-10)


@pytest.mark.parametrize("style", ["interleaved", "neox"])
@pytest.mark.parametrize("seq,heads,dim,offset", [(1, 1, 2, 0), (7, 9, 64, 0), (1, 3, 64, 8191),
                                                  (33, 2, 18, 5000), (257, 1, 32, 3)])
def test_rope_matches_reference_even_at_large_positions(gpu_device, rng, style, seq, heads, dim, offset):
    x = rng.standard_normal((seq, heads, dim)).astype(np.float32)
    got = pxvm.ops.rope(x, offset, 100000.0, style, backend="gpu").numpy()
    assert_close(got, pxvm.ops.rope.reference(x, offset, 100000.0, style), NMSE_F16)


def test_rope_neox_reference_agrees_with_rotate_half_formula(rng):
    x = rng.standard_normal((5, 2, 8))
    pos = np.arange(3, 8)[:, None, None]
    inv = 10000.0 ** (-np.arange(0, 8, 2) / 8)
    ang = np.concatenate([pos * inv, pos * inv], axis=-1)
    rotated = np.concatenate([-x[..., 4:], x[..., :4]], axis=-1)
    expected = x * np.cos(ang) + rotated * np.sin(ang)
    assert_close(pxvm.ops.rope.reference(x, 3, 10000.0, "neox"), expected, 1e-12)


def test_shape_errors_name_both_sizes():
    x = np.ones((4, 10), np.float32)
    with pytest.raises(pxvm.ShapeError, match=r"shape \(10,\).*got \(9,\)"):
        pxvm.ops.rmsnorm(x, np.ones(9, np.float32), backend="cpu")
    with pytest.raises(pxvm.ShapeError, match="even head_dim"):
        pxvm.ops.rope(np.ones((2, 2, 5), np.float32), backend="gpu")
