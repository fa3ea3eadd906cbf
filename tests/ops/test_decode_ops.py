"""The fused ops of a transformer layer and of decoding (quantized products with norm,
residual or SwiGLU, attention over a KV cache, greedy_step, concat_columns): the GPU
against the numpy reference on fresh random inputs, odd shapes, poisoned outputs."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import NMSE_LONG, assert_close

import pxvm
from pxvm.ops.attention import attention_cached_ref
from pxvm.runtime import ShapeError

sys.path.insert(0, str(Path(__file__).parent.parent / "llm"))
from gguf_blocks import quantize, random_blocks  # noqa: E402

FUSED = ("rmsnorm_matmul_quant", "matmul_quant_add", "rmsnorm_swiglu_quant")


def _weight(rng, qtype, n, k):
    if qtype in (12, 14):
        return random_blocks(n, k, qtype, rng, k ** -0.5)
    return quantize(rng.standard_normal((n, k)).astype(np.float32) * k ** -0.5, qtype)


def _args(name, rng, qtype, m=3, n=37, k=None):
    k = k or (512 if qtype in (12, 14) else 96)
    x = rng.standard_normal((m, k)).astype(np.float32)
    gain = (1.0 + 0.3 * rng.standard_normal(k)).astype(np.float32)
    if name == "matmul_quant_add":
        w = _weight(rng, qtype, n, k)
        return (x, w, rng.standard_normal((m, n)).astype(np.float32)), {"qtype": qtype, "k": k}
    rows = 2 * n if name == "rmsnorm_swiglu_quant" else n
    return (x, gain, _weight(rng, qtype, rows, k)), {"qtype": qtype, "k": k, "eps": 1e-5}


@pytest.mark.parametrize("lanes", [1, 32])
@pytest.mark.parametrize("qtype", [0, 1, 2, 3, 8, 12, 14])
@pytest.mark.parametrize("name", FUSED)
def test_fused_quantized_product_matches_reference(name, qtype, lanes, rng, gpu_device):
    args, params = _args(name, rng, qtype)
    op = getattr(pxvm.ops, name)
    got = op(*args, lanes=lanes, backend="gpu", **params).numpy()
    expected = op.reference(*args, **params)
    assert got.shape == expected.shape
    assert_close(got, expected, NMSE_LONG / 50)


def test_fused_products_equal_the_unfused_ops(rng, gpu_device):
    args, params = _args("rmsnorm_swiglu_quant", rng, 3, m=2, n=21)
    x, gain, w = args
    ops = pxvm.ops
    h = ops.rmsnorm(x, gain, eps=1e-5, backend="gpu")
    both = ops.matmul_quant(h, w, qtype=3, k=96).numpy()
    unfused = ops.silu(both[:, :21], backend="gpu").numpy() * both[:, 21:]
    assert_close(ops.rmsnorm_swiglu_quant(*args, backend="gpu", **params).numpy(), unfused, 1e-10)
    res = rng.standard_normal((2, 42)).astype(np.float32)
    added = ops.matmul_quant_add(x, w, res, qtype=3, k=96, backend="gpu").numpy()
    assert_close(added, res + ops.matmul_quant(x, w, qtype=3, k=96, backend="gpu").numpy(), 1e-10)


def test_fused_products_reject_bad_operands(rng):
    (x, gain, w), params = _args("rmsnorm_matmul_quant", rng, 3)
    with pytest.raises(ShapeError, match="gain"):
        pxvm.ops.rmsnorm_matmul_quant(x, gain[:-1], w, backend="cpu", **params)
    with pytest.raises(ShapeError, match="residual"):
        pxvm.ops.matmul_quant_add(x, w, np.ones((3, 5), np.float32), qtype=3, k=96, backend="cpu")
    with pytest.raises(ShapeError, match="even row count"):
        pxvm.ops.rmsnorm_swiglu_quant(x, gain, w, backend="cpu", **params)  # 37 rows


def _cached_case(rng, hq, hkv, d, n_ctx, pos, s):
    kc = rng.standard_normal((n_ctx, hkv, d)).astype(np.float32)
    vc = rng.standard_normal((n_ctx, hkv, d)).astype(np.float32)
    qkv = rng.standard_normal((s, (hq + 2 * hkv) * d)).astype(np.float32)
    return qkv, kc, vc, np.array([rng.integers(0, 100), pos], np.int32)


@pytest.mark.parametrize("hq,hkv,d,n_ctx,pos,s,style", [
    (6, 2, 16, 300, 0, 1, "interleaved"),
    (6, 2, 16, 300, 31, 1, "interleaved"),      # last key of the first 32-key range
    (6, 2, 16, 300, 32, 1, "neox"),             # first key of the second
    (3, 3, 64, 700, 650, 1, "interleaved"),     # MHA, many ranges
    (4, 1, 96, 200, 7, 5, "neox"),              # prefill after a cached prefix
    (2, 2, 8, 4400, 4250, 1, "interleaved"),    # more ranges than the merge's threads
    (4, 2, 256, 80, 0, 37, "interleaved"),      # prefill from 0, head dim above 128
])
def test_attention_cached_matches_reference_and_appends(hq, hkv, d, n_ctx, pos, s, style, rng,
                                                        gpu_device):
    qkv, kc, vc, state = _cached_case(rng, hq, hkv, d, n_ctx, pos, s)
    k_ref, v_ref = kc.copy(), vc.copy()
    expected = attention_cached_ref(qkv, k_ref, v_ref, state, n_heads=hq, style=style)
    gpu = pxvm.backends.get_backend("gpu")
    k_gpu, v_gpu = gpu.from_numpy(kc), gpu.from_numpy(vc)
    got = pxvm.ops.attention_cached(qkv, k_gpu, v_gpu, state, n_heads=hq, style=style,
                                    backend="gpu").numpy()
    assert_close(got, expected, NMSE_LONG / 50)
    k_new, v_new = k_gpu.numpy(), v_gpu.numpy()
    assert_close(k_new[pos:pos + s], k_ref[pos:pos + s], 1e-10)
    assert np.array_equal(v_new[pos:pos + s], v_ref[pos:pos + s])
    untouched = np.ones(n_ctx, bool)
    untouched[pos:pos + s] = False
    assert np.array_equal(k_new[untouched], kc[untouched])
    assert np.array_equal(v_new[untouched], vc[untouched])


def test_attention_cached_equals_rope_write_rows_and_attention(rng, gpu_device):
    hq, hkv, d, pos, s = 4, 2, 16, 9, 3
    qkv, kc, vc, state = _cached_case(rng, hq, hkv, d, 20, pos, s)
    ops, gpu = pxvm.ops, pxvm.backends.get_backend("gpu")
    k_gpu, v_gpu = gpu.from_numpy(kc), gpu.from_numpy(vc)
    fused = ops.attention_cached(qkv, k_gpu, v_gpu, state, n_heads=hq, backend="gpu").numpy()
    q = ops.rope(qkv[:, :hq * d].reshape(s, hq, d), pos_offset=pos, backend="gpu")
    k = ops.rope(qkv[:, hq * d:(hq + hkv) * d].reshape(s, hkv, d), pos_offset=pos, backend="gpu")
    k_old, v_old = gpu.from_numpy(kc), gpu.from_numpy(vc)
    ops.write_rows(k_old, k, start=pos)
    ops.write_rows(v_old, qkv[:, (hq + hkv) * d:].reshape(s, hkv, d), start=pos)
    plain = ops.attention(q, k_old.prefix(pos + s), v_old.prefix(pos + s), causal=True).numpy()
    assert_close(fused, plain.reshape(s, hq * d), 1e-10)


def test_attention_cached_rejects_bad_operands(rng):
    qkv, kc, vc, state = _cached_case(rng, 4, 2, 16, 20, 3, 2)
    run = pxvm.ops.attention_cached
    with pytest.raises(ShapeError, match="qkv must be"):
        run(qkv[:, :-1], kc, vc, state, n_heads=4, backend="cpu")
    with pytest.raises(ShapeError, match="multiple"):
        run(qkv, kc, vc, state, n_heads=3, backend="cpu")
    with pytest.raises(ShapeError, match="int32"):
        run(qkv, kc, vc, state.astype(np.float32), n_heads=4, backend="cpu")
    with pytest.raises(ShapeError, match="outside the cache"):
        run(qkv, kc, vc, np.array([0, 19], np.int32), n_heads=4, backend="cpu")


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_greedy_step_writes_first_argmax_and_advances(backend, rng, request):
    if backend == "gpu":
        request.getfixturevalue("gpu_device")
    logits = rng.standard_normal(9001).astype(np.float32)
    logits[[17, 4242, 8000]] = logits.max() + 1.0   # a tie: the first index wins
    b = pxvm.backends.get_backend(backend)
    state = b.from_numpy(np.array([5, 41], np.int32))
    pxvm.ops.greedy_step(logits, state)
    assert state.numpy().tolist() == [17, 42]


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_concat_columns_joins_side_by_side(backend, rng, request):
    if backend == "gpu":
        request.getfixturevalue("gpu_device")
    a = rng.standard_normal((5, 7)).astype(np.float32)
    c = rng.standard_normal((5, 3)).astype(np.float32)
    got = pxvm.ops.concat_columns(a, c, backend=backend).numpy()
    assert np.array_equal(got, np.concatenate([a, c], axis=1))
    with pytest.raises(ShapeError, match="same rows"):
        pxvm.ops.concat_columns(a, c[:4], backend=backend)
