"""The fused products of pxvm.ops.transformer (rmsnorm_matmul_quant, matmul_quant_add,
rmsnorm_glu_quant) on WebGPU (pxvm.backends.webgpu.ops.quantized's `product`): against an
independent float64 numpy computation for every weight format, lane count and tile
shape, equality with the unfused ops they replace, and clear errors for bad operands.
The attention ops are in tests/ops/test_transformer_attention.py."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import NMSE_ELEMENTWISE, assert_close

import pxvm
from pxvm.backends.webgpu.ops import quantized
from pxvm.core import tuning
from pxvm.core.errors import ShapeError
from pxvm.ops import transformer

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "llm"))
from gguf_blocks import FORMATS, dequantize, quantize, random_blocks, row_bytes  # noqa: E402

QTYPES = ["F32", "F16", "BF16", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q2_K", "Q3_K", "Q4_K",
          "Q5_K", "Q6_K"]
K_TYPES = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
EPS = 1e-5
# The products are f32 sums of the same dequantized weights the float64 expectation uses:
# their error is f32 rounding (about 1e-12 measured), so the tightest threshold applies:
# x rounded to f16 on the way would already cost about 1e-7, one wrong column of 37
# about 3e-2.
TOLERANCE = NMSE_ELEMENTWISE
# Fused against unfused GPU ops: the same f32 arithmetic in a different order (the fused
# kernels scale by 1/rms after the dot product, the unfused before it), about 1e-12
# measured; a wrong gain, row or residual costs far more than 1e-10.
REORDERED = 1e-10


def _k_for(qtype: str) -> int:
    """K a multiple of the block size but not a power of two (F32/F16: an odd K)."""
    return {"F32": 75, "F16": 75}.get(qtype, 768 if qtype in K_TYPES else 96)


def _weight(rng, qtype: str, n: int, k: int) -> np.ndarray:
    if qtype in K_TYPES:
        return random_blocks(n, k, qtype, rng, k ** -0.5)
    return quantize(rng.standard_normal((n, k)).astype(np.float32) * k ** -0.5, qtype)


def _x(rng, m: int, k: int) -> np.ndarray:
    """Rows of very different sizes, so that a norm taken over the wrong row, or without
    eps (the first row's mean square, ~1e-6, is below EPS), shows."""
    scales = np.array([1e-3, 1.0, 30.0, 0.2, 5.0])[np.arange(m) % 5]
    return (rng.standard_normal((m, k)) * scales[:, None]).astype(np.float32)


def _gain(rng, k: int) -> np.ndarray:
    return (1.0 + 0.5 * rng.standard_normal(k)).astype(np.float32)


def _rmsnorm64(x, gain):
    x = np.asarray(x, np.float64)
    return x / np.sqrt(np.mean(x * x, axis=1, keepdims=True) + EPS) * np.asarray(gain, np.float64)


def _product64(h, w, qtype, k):
    return np.asarray(h, np.float64) @ dequantize(w, qtype, k).astype(np.float64).T


def _silu64(v):
    return v / (1.0 + np.exp(-v))


def _gelu_tanh64(v):
    return 0.5 * v * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (v + 0.044715 * v**3)))


def _case(name, rng, qtype, m, n, k=None, activation="silu"):
    """(args, params, float64 expectation) of op `name` for an (M, K) x and N outputs
    (`activation`: rmsnorm_glu_quant's)."""
    k = k or _k_for(qtype)
    x = _x(rng, m, k)
    params = {"qtype": qtype, "k": k}
    if name == "matmul_quant_add":
        w = _weight(rng, qtype, n, k)
        res = rng.standard_normal((m, n)).astype(np.float32)
        return (x, w, res), params, res.astype(np.float64) + _product64(x, w, qtype, k)
    gain = _gain(rng, k)
    params["eps"] = EPS
    h = _rmsnorm64(x, gain)
    if name == "rmsnorm_matmul_quant":
        w = _weight(rng, qtype, n, k)
        return (x, gain, w), params, _product64(h, w, qtype, k)
    w = _weight(rng, qtype, 2 * n, k)  # gate rows, then up rows
    both = _product64(h, w, qtype, k)
    params["activation"] = activation
    act = _silu64 if activation == "silu" else _gelu_tanh64
    return (x, gain, w), params, act(both[:, :n]) * both[:, n:]


FUSED = ("rmsnorm_matmul_quant", "matmul_quant_add", "rmsnorm_glu_quant")


def _gpu(op, *args, lanes=None, **params) -> np.ndarray:
    """op on WebGPU, its row kernel's lanes (threads a column) forced unless None."""
    with tuning.forcing(quantized.LANES_TUNED, lanes):
        return op(*args, backend="gpu", **params).numpy()


@pytest.mark.parametrize("lanes", [1, 32])
@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("name", FUSED)
def test_fused_product_on_gpu_matches_float64(name, qtype, lanes, rng, gpu_device):
    args, params, expected = _case(name, rng, qtype, m=3, n=37)
    got = _gpu(pxvm.ops.REGISTRY[name], *args, lanes=lanes, **params)
    assert got.shape == (3, 37) and got.dtype == np.float32
    assert_close(got, expected, TOLERANCE)


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("name", FUSED)
def test_fused_product_reference_matches_float64(name, qtype, rng):
    args, params, expected = _case(name, rng, qtype, m=3, n=37)
    got = pxvm.ops.REGISTRY[name](*args, backend="cpu", **params).numpy()
    assert got.shape == (3, 37)
    assert_close(got, expected, TOLERANCE)


@pytest.mark.parametrize("lanes", [None, 1, 4, 8, 32, 64, 256])
@pytest.mark.parametrize("name", FUSED)
def test_fused_product_one_row_over_several_workgroups(name, lanes, rng, gpu_device,
                                                        subgroups):
    # Decoding's shape: M = 1, and N = 300 columns span two workgroups even at one lane
    # (256 columns each), the second only partly used; by subgroups and by barriers.
    args, params, expected = _case(name, rng, "Q4_0", m=1, n=300)
    got = _gpu(pxvm.ops.REGISTRY[name], *args, lanes=lanes, **params)
    assert_close(got, expected, TOLERANCE)


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("name", FUSED)
def test_fused_product_of_many_rows_is_tiled_and_matches_float64(name, qtype, rng, gpu_device,
                                                                 product_entries):
    # A prompt's rows (37: no whole 64-row tile) take matmul_tiled with the norm, the
    # residual or SwiGLU fused in; 50 outputs fill no whole tile either.
    args, params, expected = _case(name, rng, qtype, m=37, n=50)
    got = pxvm.ops.REGISTRY[name](*args, backend="gpu", **params).numpy()
    assert product_entries == ["matmul_tiled"]
    assert got.shape == (37, 50)
    assert_close(got, expected, TOLERANCE)


@pytest.mark.parametrize("qtype", ["Q4_1", "Q8_0", "Q6_K", "F32"])
def test_rmsnorm_glu_quant_tiled_with_gelu_matches_float64_geglu(qtype, rng, gpu_device,
                                                                  product_entries):
    args, params, expected = _case("rmsnorm_glu_quant", rng, qtype, m=40, n=37,
                                   activation="gelu_tanh")
    got = transformer.rmsnorm_glu_quant(*args, backend="gpu", **params).numpy()
    assert product_entries == ["matmul_tiled"]
    assert_close(got, expected, TOLERANCE)


@pytest.mark.parametrize("shape", quantized.TILE_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("name,qtype", [("rmsnorm_glu_quant", "Q4_K"),
                                        ("matmul_quant_add", "Q5_1"),
                                        ("rmsnorm_matmul_quant", "Q4_0")])
def test_fused_product_tiled_in_every_tile_shape(name, qtype, shape, rng, gpu_device,
                                                 product_entries):
    # M one past a whole number of tiles of every height; N = 70 outputs end inside a tile
    # of every width (a GLU tile is half as many outputs wide as its W rows: 16 to 64).
    args, params, expected = _case(name, rng, qtype, m=129, n=70)
    with tuning.forcing(quantized.TILED_TUNED, shape):
        got = pxvm.ops.REGISTRY[name](*args, backend="gpu", **params).numpy()
    assert product_entries == ["matmul_tiled"]
    assert_close(got, expected, TOLERANCE)


def test_fused_product_tiled_equals_the_row_kernel(rng, gpu_device, product_entries):
    # The same rows through both kernels (forced lanes keep the row kernel): the same sums
    # in another order.
    (x, gain, w), params, _ = _case("rmsnorm_glu_quant", rng, "Q4_K", m=33, n=37)
    tiled = transformer.rmsnorm_glu_quant(x, gain, w, backend="gpu", **params).numpy()
    rows = _gpu(transformer.rmsnorm_glu_quant, x, gain, w, lanes=8, **params)
    assert product_entries == ["matmul_tiled", "matmul"]
    assert_close(tiled, rows, REORDERED)


# Rows of about 3100 values: every lane count walks many blocks per lane, wider than one
# workgroup even at 1 lane (the reductions' and the norm's strided loops all repeat).
LONG_K = {"F32": 3073, "Q4_1": 3104, "Q8_0": 3104, "Q6_K": 3328}


@pytest.mark.parametrize("lanes", [1, 8, 32, 64])
@pytest.mark.parametrize("qtype", list(LONG_K))
@pytest.mark.parametrize("name", FUSED)
def test_fused_product_with_long_rows(name, qtype, lanes, rng, gpu_device):
    args, params, expected = _case(name, rng, qtype, m=2, n=19, k=LONG_K[qtype])
    got = _gpu(pxvm.ops.REGISTRY[name], *args, lanes=lanes, **params)
    assert_close(got, expected, TOLERANCE)


@pytest.mark.parametrize("shape", [(32, 1), (128, 4)])
@pytest.mark.parametrize("qtype", quantized.MATVEC_TYPES)
@pytest.mark.parametrize("name", FUSED)
def test_fused_product_in_matvec_matches_float64(name, qtype, shape, rng, gpu_device,
                                                 subgroups, product_entries):
    # Decoding's kernel for these types (forced: lavapipe takes `matmul` by itself), its
    # norm, residual and GLU: one row of x (a decoding step's) and two.
    for m in (1, 2):
        product_entries.clear()
        args, params, expected = _case(name, rng, qtype, m=m, n=37)
        with tuning.forcing(quantized.MATVEC_TUNED, shape):
            got = pxvm.ops.REGISTRY[name](*args, backend="gpu", **params).numpy()
        assert product_entries == ["matvec"]
        assert got.shape == (m, 37)
        assert_close(got, expected, TOLERANCE)


@pytest.mark.parametrize("qtype", ["Q4_K", "Q8_0"])
def test_geglu_in_matvec_matches_float64(qtype, rng, gpu_device, product_entries):
    args, params, expected = _case("rmsnorm_glu_quant", rng, qtype, m=1, n=37,
                                   activation="gelu_tanh")
    with tuning.forcing(quantized.MATVEC_TUNED, (64, 2)):
        got = transformer.rmsnorm_glu_quant(*args, backend="gpu", **params).numpy()
    assert product_entries == ["matvec"]
    assert_close(got, expected, TOLERANCE)


@pytest.mark.parametrize("lanes", [1, 32])
@pytest.mark.parametrize("qtype", ["Q4_1", "Q4_K"])
def test_rmsnorm_matmul_quant_equals_rmsnorm_then_matmul_quant(qtype, lanes, rng, gpu_device):
    (x, gain, w), params, _ = _case("rmsnorm_matmul_quant", rng, qtype, m=3, n=37)
    ops = pxvm.ops
    h = ops.rmsnorm(x, gain, eps=EPS, backend="gpu")
    unfused = _gpu(ops.matmul_quant, h, w, lanes=lanes, qtype=qtype, k=params["k"])
    fused = _gpu(transformer.rmsnorm_matmul_quant, x, gain, w, lanes=lanes, **params)
    assert_close(fused, unfused, REORDERED)


@pytest.mark.parametrize("lanes", [1, 32])
@pytest.mark.parametrize("qtype", ["Q8_0", "Q6_K"])
def test_matmul_quant_add_equals_matmul_quant_then_add(qtype, lanes, rng, gpu_device):
    (x, w, res), params, _ = _case("matmul_quant_add", rng, qtype, m=3, n=37)
    ops = pxvm.ops
    with tuning.forcing(quantized.LANES_TUNED, lanes):
        product = ops.matmul_quant(x, w, backend="gpu", **params)
    unfused = ops.add(product, res).numpy()
    fused = _gpu(transformer.matmul_quant_add, x, w, res, lanes=lanes, **params)
    assert_close(fused, unfused, 1e-12)


@pytest.mark.parametrize("lanes", [1, 32])
@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_K"])
def test_rmsnorm_glu_quant_equals_norm_two_products_silu_and_mul(qtype, lanes, rng,
                                                                    gpu_device):
    (x, gain, w), params, _ = _case("rmsnorm_glu_quant", rng, qtype, m=3, n=37)
    ops, k = pxvm.ops, params["k"]
    h = ops.rmsnorm(x, gain, eps=EPS, backend="gpu")
    with tuning.forcing(quantized.LANES_TUNED, lanes):
        gate = ops.matmul_quant(h, np.ascontiguousarray(w[:37]), qtype=qtype, k=k)
        up = ops.matmul_quant(h, np.ascontiguousarray(w[37:]), qtype=qtype, k=k)
    unfused = ops.mul(ops.silu(gate), up).numpy()
    fused = _gpu(transformer.rmsnorm_glu_quant, x, gain, w, lanes=lanes, **params)
    assert_close(fused, unfused, REORDERED)


@pytest.mark.parametrize("backend", ["gpu", "cpu", "numpy"])
@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K"])
def test_rmsnorm_glu_quant_with_gelu_matches_float64_geglu(qtype, backend, rng, request):
    if backend == "gpu":
        request.getfixturevalue("gpu_device")
    args, params, expected = _case("rmsnorm_glu_quant", rng, qtype, m=3, n=37,
                                   activation="gelu_tanh")
    got = transformer.rmsnorm_glu_quant(*args, backend=backend, **params).numpy()
    assert_close(got, expected, TOLERANCE)
    silu_got = transformer.rmsnorm_glu_quant(*args, backend=backend,
                                             **{**params, "activation": "silu"}).numpy()
    assert np.abs(got - silu_got).max() > 1e-2  # the activation really changed it


def test_rmsnorm_glu_quant_takes_gate_rows_first(rng, gpu_device):
    # Swapping the gate and up halves of W must change the result (silu is not symmetric).
    (x, gain, w), params, expected = _case("rmsnorm_glu_quant", rng, "Q8_0", m=2, n=5)
    swapped = np.concatenate([w[5:], w[:5]])
    got = transformer.rmsnorm_glu_quant(x, gain, swapped, backend="gpu", **params).numpy()
    assert np.abs(got - expected).max() > 1e-3


def test_rmsnorm_matmul_quant_uses_its_eps(rng, gpu_device):
    # Row 0 of x has a mean square ~1e-6: eps = 1e-5 against 1e-9 changes it a lot.
    (x, gain, w), params, expected = _case("rmsnorm_matmul_quant", rng, "Q4_1", m=2, n=37)
    params["eps"] = 1e-9
    got = transformer.rmsnorm_matmul_quant(x, gain, w, backend="gpu", **params).numpy()
    assert np.abs(got[0] - expected[0]).max() > 1e-2 * np.abs(got[0]).max()
    assert_close(got[1], expected[1], TOLERANCE)


def _bad_cases():
    k = 96
    x = np.ones((3, k), np.float32)
    gain = np.ones(k, np.float32)
    w = np.full((37, row_bytes("Q4_1", k)), 17, np.uint8)
    w_even = np.full((38, row_bytes("Q4_1", k)), 17, np.uint8)
    p = {"qtype": "Q4_1", "k": k}
    return [
        ("rmsnorm_matmul_quant", (x, gain[:-1], w), p,
         r"gain must have shape \(96,\), got \(95,\)"),
        ("rmsnorm_matmul_quant", (x[:, :64], gain, w), p, r"x must be \(M, 96\), got \(3, 64\)"),
        ("rmsnorm_matmul_quant", (x, gain, w[:, :-1]), p, r"Q4_1 weight of K=96 needs \(N, 60\)"),
        ("matmul_quant_add", (x, w, np.ones((3, 37), np.float32)), {"qtype": "Q4_1", "k": 100},
         "Q4_1 rows need K divisible by 32, got K=100"),
        ("rmsnorm_matmul_quant", (x, gain, w), {"qtype": "Q8_1", "k": k},
         "unsupported weight type 'Q8_1'"),
        ("matmul_quant_add", (x, w, np.ones((3, 36), np.float32)), p,
         r"residual must have shape \(3, 37\), got \(3, 36\)"),
        ("matmul_quant_add", (x, w, np.ones((37,), np.float32)), p, "residual must have shape"),
        ("rmsnorm_glu_quant", (x, gain, w), p, "even row count.*got 37 rows"),
        ("rmsnorm_glu_quant", (x, gain[:50], w_even), p, r"gain must have shape \(96,\)"),
        ("rmsnorm_glu_quant", (x.astype(np.int32), gain, w_even), p,
         "rmsnorm_glu_quant: input x has dtype int32"),
        # Each input is checked against its own role, not against every allowed dtype.
        ("rmsnorm_matmul_quant", (x, gain, w.astype(np.float32)), p,
         "rmsnorm_matmul_quant: input w has dtype float32, expected uint8"),
        ("matmul_quant_add", (x, w, np.ones((3, 37), np.uint8)), p,
         "matmul_quant_add: input residual has dtype uint8, expected float32"),
        ("rmsnorm_glu_quant", (x, gain.astype(np.uint8), w_even), p,
         "rmsnorm_glu_quant: input gain has dtype uint8"),
        ("matmul_quant", (x, w.astype(np.float32)), p, "matmul_quant: input w has dtype float32"),
    ]


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
@pytest.mark.parametrize("name,args,params,message", _bad_cases())
def test_fused_product_refuses_bad_operands_clearly(name, args, params, message, backend,
                                                    request):
    if backend == "gpu":
        request.getfixturevalue("gpu_device")
    with pytest.raises(ShapeError, match=message):
        pxvm.ops.REGISTRY[name](*args, backend=backend, **params)
