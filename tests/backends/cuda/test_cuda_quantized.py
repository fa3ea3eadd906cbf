"""Quantized weights on the CUDA backend (pxvm.backends.cuda.ptx.quantized, dequantize and
quant_blocks; pxvm.ops.quantized): matmul_quant for every GGUF type pxvm reads, on
decoding's matrix-vector kernel (every shape the benchmark sweeps) and on the prompts'
dequantize-then-tensor-core path, and embedding_quant, against float64 or the `gguf`
package's dequantization on fresh random weights of odd shapes, outputs poisoned before
each run (conftest). Skipped, saying why, without a driver."""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import NMSE_ELEMENTWISE, NMSE_LONG, assert_close

import pxvm
from pxvm.batch import Batch
from pxvm.backends.cuda.ptx import quant_blocks
from pxvm.backends.cuda.ptx import quantized as ptx_quantized
from pxvm.backends.cuda.ptx import wgmma_quant as ptx_wgmma_quant
from pxvm.ops import quant_types

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "llm"))
from gguf_blocks import FORMATS, dequantize, quantize, random_blocks  # noqa: E402

from pxvm.backends.cuda import backend as cuda_backend_module  # noqa: E402
from pxvm.backends.cuda.ops import matmul as cuda_matmul  # noqa: E402
from pxvm.backends.cuda.ops import quantized as quantized_module  # noqa: E402


def _matvec(forced, qtype, prefetch, shape=None):
    """The matrix-vector kernel of `qtype` forced to `prefetch` in `shape` (default the
    type's own)."""
    shape = shape or quantized_module.MATVEC_SHAPES.get(qtype, ptx_quantized.DEFAULT_SHAPE)
    forced(quantized_module.matvec_tuned(qtype), (*shape, prefetch))

TYPES = sorted(FORMATS)
K_TYPES = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
FLOATS = ("F32", "F16", "BF16")
# The matrix-vector kernel sums float32 products of the exact weights (about 1e-12 from
# float64): the elementwise bound, which one wrong group of 16 values already breaks. The
# prompts' path rounds x and W to float16 (about 2e-7): the quant tests' bound.
MATVEC_NMSE = NMSE_ELEMENTWISE
PROMPT_NMSE = NMSE_LONG / 50


def _k(qtype: str, blocks: int = 3) -> int:
    """K of several blocks (super-blocks of 256 for the K types)."""
    return blocks * (256 if qtype in K_TYPES else 32)


def _weight(rng, qtype: str, n: int, k: int) -> np.ndarray:
    if qtype in K_TYPES:
        return random_blocks(n, k, qtype, rng, k ** -0.5)
    return quantize(rng.standard_normal((n, k)).astype(np.float32) * k ** -0.5, qtype)


def _expected(x, w, qtype, k):
    return x.astype(np.float64) @ dequantize(w, qtype, k).astype(np.float64).T


def _product(x, w, qtype, k):
    got = pxvm.ops.matmul_quant(x, w, qtype=qtype, k=k, backend="cuda").numpy()
    assert got.shape == (x.shape[0], w.shape[0]) and got.dtype == np.float32
    return got


def _profiled_product(cuda_device, rng, qtype: str, n: int, k: int, m: int):
    """matmul_quant of fresh x (m, k) by a fresh W of n rows in a profiled batch: (the
    product, its float64 expectation, the launches' names)."""
    w = pxvm.tensor(_weight(rng, qtype, n, k), backend="cuda")
    x = rng.standard_normal((m, k)).astype(np.float32)
    with Batch(cuda_device, profile=True) as batch:
        y = pxvm.ops.matmul_quant(batch.upload(x), w, qtype=qtype, k=k)
    batch.execute()
    return (batch.read(y), _expected(x, w.numpy(), qtype, k),
            [name for name, _ in batch.profile])


def test_the_kernels_block_table_agrees_with_quant_types():
    # the kernels keep their own table, of the fields they read
    assert sorted(quant_blocks.FORMATS) == sorted(quant_types.QUANT_TYPES)
    for name, t in quant_types.QUANT_TYPES.items():
        fmt = quant_blocks.FORMATS[name]
        assert fmt.name == t.name
        if fmt.is_float:  # read as blocks of 32 values
            assert fmt.block_bytes == 32 * t.block_bytes and t.block_values == 1
        else:
            assert (fmt.block_values, fmt.block_bytes) == (t.block_values, t.block_bytes)
            assert sum(f.size for f in fmt.fields) == fmt.block_bytes
            assert fmt.planes == (fmt.block_bytes % 16 != 0)


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("m", [1, 3])
def test_matrix_vector_products_match_float64(cuda_device, rng, qtype, m):
    n, k = 37, _k(qtype)  # 37 outputs: not a multiple of any block's
    w = _weight(rng, qtype, n, k)
    x = rng.standard_normal((m, k)).astype(np.float32)
    assert_close(_product(x, w, qtype, k), _expected(x, w, qtype, k), MATVEC_NMSE)


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K"])
@pytest.mark.parametrize("m,n,blocks", [(1, 4096, 16), (2, 11008, 1), (3, 300, 4), (1, 5, 17),
                                          (1, 9, 43)])  # K = 11008: two passes
def test_decoding_shapes(cuda_device, rng, qtype, m, n, blocks):
    k = _k(qtype, blocks if qtype in K_TYPES else 8 * blocks)
    w = _weight(rng, qtype, n, k)
    x = rng.standard_normal((m, k)).astype(np.float32)
    assert_close(_product(x, w, qtype, k), _expected(x, w, qtype, k), MATVEC_NMSE)


@pytest.mark.parametrize("qtype", quant_blocks.FORMATS)
def test_one_block_and_one_row(cuda_device, rng, qtype):
    k = _k(qtype, 1)
    w = _weight(rng, qtype, 1, k)
    x = rng.standard_normal((1, k)).astype(np.float32)
    # one dot product may cancel to near zero, where a relative bound means nothing:
    # bound its error by float32 rounding of the sum of the terms' magnitudes
    magnitude = (np.abs(x) @ np.abs(quant_types.dequantize(w, qtype, k)).T).item()
    np.testing.assert_allclose(_product(x, w, qtype, k), _expected(x, w, qtype, k), rtol=0,
                               atol=1e-5 * magnitude)


@pytest.mark.parametrize("prefetch", ptx_quantized.PREFETCHES)
@pytest.mark.parametrize("shape", ptx_quantized.SHAPES, ids=lambda s: f"r{s[0]}g{s[1]}")
@pytest.mark.parametrize("qtype", ptx_quantized.SWEPT)
def test_every_swept_shape_of_the_kernel(cuda_device, rng, qtype, shape, prefetch,
                                         forced):
    if prefetch == "lines" and shape != ptx_quantized.DEFAULT_SHAPE:
        pytest.skip("line prefetches come in the default shape only")
    if prefetch in ("bulk", "stage", "ring") and cuda_device.device.info.arch != "sm_90":
        pytest.skip("bulk prefetches and copies are Hopper's (sm_90)")
    if not ptx_quantized.ring_takes(*shape, prefetch):
        pytest.skip("a ring stages half of a block's groups at once: two at least")
    _matvec(forced, qtype, prefetch, shape)
    n, k = 45, _k(qtype, 2 if qtype in K_TYPES else 8)  # rows that can be staged
    w = _weight(rng, qtype, n, k)
    x = rng.standard_normal((2, k)).astype(np.float32)
    assert_close(_product(x, w, qtype, k), _expected(x, w, qtype, k), MATVEC_NMSE)


def _product_and_kernels(backend, x, w, qtype, k) -> tuple[np.ndarray, list[str]]:
    """matmul_quant's result, and the names of the kernels it launched."""
    x, w = backend.from_numpy(x), backend.from_numpy(w)
    with Batch(backend, profile=True) as batch:
        got = pxvm.ops.matmul_quant(x, w, qtype=qtype, k=k)
    batch.execute()
    return batch.read(got), [name for name, _ in batch.profile]


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("prefetch", ptx_quantized.STAGING)
@pytest.mark.parametrize("m,n,shape", [(1, 45, (8, 4)), (3, 300, (16, 8)), (2, 5, (4, 4)),
                                       (1, 61, (16, 4))])
def test_products_staged_in_shared_memory_match_float64(cuda_device, rng, qtype, prefetch, m, n,
                                                        shape, forced):
    if cuda_device.device.info.arch != "sm_90":
        pytest.skip("bulk copies into shared memory are Hopper's (sm_90)")
    if not ptx_quantized.ring_takes(*shape, prefetch):
        pytest.skip("a ring stages half of a block's groups at once: two at least")
    _matvec(forced, qtype, prefetch, shape)
    k = 2048  # every plane's rows whole 16-byte chunks, for every type
    assert ptx_quantized.stages(qtype, shape[0], k, prefetch)
    w = _weight(rng, qtype, n, k)
    x = rng.standard_normal((m, k)).astype(np.float32)
    got, launched = _product_and_kernels(cuda_device, x, w, qtype, k)
    assert any(name.startswith("matvec_") and f"_{prefetch}" in name for name in launched), \
        launched
    assert_close(got, _expected(x, w, qtype, k), MATVEC_NMSE)


def test_staged_rows_just_under_48_kib_beside_the_static_shared_memory_launch(cuda_device, rng,
                                                                             forced):
    # Q5_K's 16 staged rows of 4096 (44 KiB) and the 32-row block's 4 KiB of partial sums
    # pass 48 KiB together: the launch must allow the dynamic part explicitly
    if cuda_device.device.info.arch != "sm_90":
        pytest.skip("bulk copies into shared memory are Hopper's (sm_90)")
    _matvec(forced, "Q5_K", "ring", (32, 4))
    k = 4096
    assert ptx_quantized.staged_bytes("Q5_K", 32, k, "ring") == 45056
    w = _weight(rng, "Q5_K", 40, k)
    x = rng.standard_normal((1, k)).astype(np.float32)
    got, launched = _product_and_kernels(cuda_device, x, w, "Q5_K", k)
    assert any("_ring" in name for name in launched), launched
    assert_close(got, _expected(x, w, "Q5_K", k), MATVEC_NMSE)


@pytest.mark.parametrize("n_waves,k,kind", [(1, 4096, "stage"), (2, 4096, "stage"),
                                            (2.1, 4096, "ring"), (1, 11008, "ring")])
def test_weights_that_stream_in_one_wave_of_small_blocks_are_staged_others_ringed(
        cuda_device, rng, n_waves, k, kind):
    # Q4_K's 16-row blocks: 36 KiB at K = 4096, 97 KiB (too large) at K = 11008
    if cuda_device.device.info.arch != "sm_90":
        pytest.skip("bulk copies into shared memory are Hopper's (sm_90)")
    rows = ptx_quantized.STAGED_SHAPE[0]
    n = int(n_waves * cuda_device.device.info.multiprocessors) * rows
    w = _weight(rng, "Q4_K", n, k)
    x = rng.standard_normal((1, k)).astype(np.float32)
    got, launched = _product_and_kernels(cuda_device, x, w, "Q4_K", k)
    kinds = [re.search(r"_g\d+_([a-z]+)", name).group(1) for name in launched
             if name.startswith("matvec_")]
    assert kinds == [kind], launched
    assert_close(got, _expected(x, w, "Q4_K", k), MATVEC_NMSE)


def test_types_slower_ringed_are_not_ringed(cuda_device, rng):
    # Q6_K: rows that could be staged, too many for one wave of blocks (RING_TYPES)
    if cuda_device.device.info.arch != "sm_90":
        pytest.skip("bulk copies into shared memory are Hopper's (sm_90)")
    assert "Q6_K" not in quantized_module.RING_TYPES and ptx_quantized.stages("Q6_K", 16, 4096, "ring")
    n = int(2.1 * cuda_device.device.info.multiprocessors) * 16
    w = _weight(rng, "Q6_K", n, 4096)
    x = rng.standard_normal((1, 4096)).astype(np.float32)
    got, launched = _product_and_kernels(cuda_device, x, w, "Q6_K", 4096)
    assert not any("_ring" in name or "_stage" in name for name in launched), launched
    assert_close(got, _expected(x, w, "Q6_K", 4096), MATVEC_NMSE)


@pytest.mark.parametrize("qtype,k", [("Q8_0", 96), ("Q6_K", 512), ("Q4_0", 64)])
def test_rows_the_bulk_copies_cannot_take_are_read_from_global_memory(cuda_device, rng, qtype,
                                                                      k, forced):
    # a plane's rows that are not whole 16-byte chunks (Q8_0's scales: 2 bytes a block)
    _matvec(forced, qtype, "stage")
    assert not ptx_quantized.stages(qtype, 16, k)
    w = _weight(rng, qtype, 37, k)
    x = rng.standard_normal((2, k)).astype(np.float32)
    got, launched = _product_and_kernels(cuda_device, x, w, qtype, k)
    assert not any("_stage" in name for name in launched), launched
    assert_close(got, _expected(x, w, qtype, k), MATVEC_NMSE)


@pytest.mark.parametrize("qtype", ["Q4_K", "Q8_0", "Q4_0"])
@pytest.mark.parametrize("prefetch", ["none", "stage"])
def test_rows_longer_than_a_block_of_threads_take_several_passes(cuda_device, rng, qtype,
                                                                prefetch, monkeypatch, forced):
    if prefetch == "stage" and cuda_device.device.info.arch != "sm_90":
        pytest.skip("bulk copies into shared memory are Hopper's (sm_90)")
    monkeypatch.setattr(ptx_quantized, "MAX_THREADS", 32)  # 32 units of a row a pass
    _matvec(forced, qtype, prefetch)
    n, k = 9, _k(qtype, 64 if qtype not in K_TYPES else 5)  # K types: 5 super-blocks
    assert k // 32 > 32
    w = _weight(rng, qtype, n, k)
    x = rng.standard_normal((1, k)).astype(np.float32)
    assert_close(_product(x, w, qtype, k), _expected(x, w, qtype, k), MATVEC_NMSE)


def _x_of_wide_range(rng, k: int) -> np.ndarray:
    """Rows of x whose 32-value units (quant_blocks' units) are all zeros, hold one value
    10^4 times the rest, are all tiny (1e-30) or are as usual: the K4 types' products
    take x as integers scaled by each unit's largest value (quant_blocks.int16_x)."""
    x = rng.standard_normal((3, k)).astype(np.float32)
    units = x.reshape(3, -1, 32)
    units[:, 0] = 0.0
    units[:, 1, 5] *= 1e4
    units[:, 2] *= 1e-30
    units[1:, 3] = 0.0
    return x


@pytest.mark.parametrize("qtype", ["Q4_K", "Q5_K"])
@pytest.mark.parametrize("prefetch", ["none", "stage"])
def test_k4_products_keep_x_exact_enough_across_wide_ranges(cuda_device, rng, qtype, prefetch,
                                                             forced):
    if prefetch == "stage" and cuda_device.device.info.arch != "sm_90":
        pytest.skip("bulk copies into shared memory are Hopper's (sm_90)")
    _matvec(forced, qtype, prefetch)
    n, k = 37, _k(qtype, 4)
    w = _weight(rng, qtype, n, k)
    x = _x_of_wide_range(rng, k)
    assert_close(_product(x, w, qtype, k), _expected(x, w, qtype, k), MATVEC_NMSE)


@pytest.mark.parametrize("qtype", ["Q4_K", "Q5_K"])
@pytest.mark.parametrize("bad", [np.inf, np.nan])
def test_k4_products_of_non_finite_x_are_not_finite(cuda_device, rng, qtype, bad):
    n, k = 9, _k(qtype, 2)
    w = _weight(rng, qtype, n, k)
    x = rng.standard_normal((2, k)).astype(np.float32)
    x[0, 300] = bad
    got = _product(x, w, qtype, k)
    assert not np.isfinite(got[0]).any()
    assert_close(got[1:], _expected(x[1:], w, qtype, k), MATVEC_NMSE)


@pytest.mark.parametrize("qtype", FLOATS)
@pytest.mark.parametrize("m", [1, 2, quantized_module.PROMPT_MIN_ROWS + 1])
def test_float_rows_of_any_length(cuda_device, rng, qtype, m):
    n, k = 19, 75  # rows not 16-byte aligned: the scalar kernel, at every m
    w = _weight(rng, qtype, n, k)
    x = rng.standard_normal((m, k)).astype(np.float32)
    assert_close(_product(x, w, qtype, k), _expected(x, w, qtype, k), MATVEC_NMSE)


@pytest.mark.parametrize("qtype", TYPES)
def test_prompt_products_dequantize_to_float16_within_the_quant_bound(cuda_device, rng,
                                                                       qtype):
    m = quantized_module.PROMPT_MIN_ROWS + 3
    n, k = 37, _k(qtype, 2)
    w = _weight(rng, qtype, n, k)
    x = rng.standard_normal((m, k)).astype(np.float32)
    got = _product(x, w, qtype, k)
    expected = _expected(x, w, qtype, k)
    assert_close(got, expected, PROMPT_NMSE)
    # float16 rounding shows: the product is the prompts' path, not the matrix-vector one
    assert np.abs(got - expected).max() > 0


@pytest.mark.parametrize("qtype", TYPES)
def test_dequantized_float16_weights_are_the_exact_values_rounded(cuda_device, rng, qtype):
    n, k = 5, _k(qtype, 2)
    w = _weight(rng, qtype, n, k)
    got = quantized_module._f16_weight(cuda_device.context(), cuda_device.from_numpy(w),
                                       qtype, k).numpy()
    assert got.dtype == np.float16 and got.shape == (n, k)
    np.testing.assert_array_equal(got, dequantize(w, qtype, k).astype(np.float16))


@pytest.mark.parametrize("qtype", TYPES)
def test_embedding_rows_are_the_exact_values(cuda_device, rng, qtype):
    n, k = 41, _k(qtype, 2)
    w = _weight(rng, qtype, n, k)
    ids = rng.integers(0, n, size=9).astype(np.int32)
    got = pxvm.ops.embedding_quant(ids, w, qtype=qtype, k=k, backend="cuda").numpy()
    np.testing.assert_array_equal(got, quant_types.dequantize(w, qtype, k)[ids])


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K", "Q6_K", "F16"])
def test_embedding_of_a_table_in_parts_adds_up_to_the_whole(cuda_device, rng, qtype):
    n, k = 41, (75 if qtype == "F16" else _k(qtype, 1))  # F16: rows of any length
    w = _weight(rng, qtype, n, k)
    ids = np.array([0, 16, 17, 40, 5, 33, 16], np.int32)
    expected = dequantize(w, qtype, k)[ids]
    parts = [(0, w[:17]), (17, w[17:30]), (30, w[30:])]
    got = [pxvm.ops.embedding_quant(ids, np.ascontiguousarray(part), qtype=qtype, k=k,
                                    first_row=first, backend="cuda").numpy()
           for first, part in parts]
    for (first, part), rows in zip(parts, got):
        held = (ids >= first) & (ids < first + part.shape[0])
        np.testing.assert_array_equal(rows[held], expected[held])
        assert not rows[~held].any()
    np.testing.assert_array_equal(sum(got), expected)


@pytest.mark.parametrize("qtype", ["Q8_0", "Q6_K"])  # repacked types
def test_a_written_weight_is_repacked_again(cuda_device, rng, qtype):
    k = _k(qtype, 1)
    w = cuda_device.from_numpy(_weight(rng, qtype, 9, k))
    x = rng.standard_normal((1, k)).astype(np.float32)
    first = _product(x, w, qtype, k)
    new = _weight(rng, qtype, 9, k)
    cuda_device.write(w, new)
    again = _product(x, w, qtype, k)
    assert_close(again, _expected(x, new, qtype, k), MATVEC_NMSE)
    assert np.abs(again - first).max() > 1e-3


@pytest.mark.parametrize("keep_free,kept", [(0.25, True), (1.0, False)])
def test_a_prompt_keeps_its_dequantized_weight_while_memory_stays_free(
        cuda_device, rng, monkeypatch, keep_free, kept):
    # KEEP_FREE 1: no memory is ever free enough, the weight is dequantized at each use
    monkeypatch.setattr(cuda_backend_module, "KEEP_FREE", keep_free)
    qtype, n = "Q4_K", 40
    k = _k(qtype, 2)
    w = pxvm.tensor(_weight(rng, qtype, n, k), backend="cuda")
    launches = []
    for _ in range(2):
        x = rng.standard_normal((quantized_module.PROMPT_MIN_ROWS, k)).astype(np.float32)
        with Batch(cuda_device, profile=True) as batch:
            y = pxvm.ops.matmul_quant(batch.upload(x), w, qtype=qtype, k=k)
        batch.execute()
        assert_close(batch.read(y), _expected(x, w.numpy(), qtype, k), PROMPT_NMSE)
        launches.append([name for name, _ in batch.profile])
    assert any(name.startswith("dequantize") for name in launches[0])
    assert any(name.startswith("dequantize") for name in launches[1]) is not kept


@pytest.mark.parametrize("keep_free,min_values,tensor_cores", [
    (0.25, 0, True), (1.0, 0, False), (0.25, 1 << 30, False)])
@pytest.mark.parametrize("m", [quantized_module.BATCH_MIN_ROWS, 9])
def test_a_batch_takes_tensor_cores_where_its_large_float16_weight_is_kept(
        cuda_device, rng, monkeypatch, keep_free, min_values, tensor_cores, m):
    # A batch's rows (several sequences decoding) read a kept float16 weight once on
    # tensor cores; where it would not be kept, or the weight is small (read from L2
    # after the first row), the matrix-vector kernel, once a row. (Q6_K: a type the
    # tensor-core kernel on quantized weights does not decode.)
    monkeypatch.setattr(cuda_backend_module, "KEEP_FREE", keep_free)
    monkeypatch.setattr(quantized_module, "BATCH_MIN_VALUES", min_values)
    qtype = "Q6_K"
    got, expected, names = _profiled_product(cuda_device, rng, qtype, 40, _k(qtype, 2), m)
    assert any(name.startswith("matvec") for name in names) is not tensor_cores, names
    assert_close(got, expected, PROMPT_NMSE if tensor_cores else MATVEC_NMSE)


@pytest.mark.parametrize("split", [True, False])
@pytest.mark.parametrize("m", [quantized_module.BATCH_MIN_ROWS, 9, 33,
                               quantized_module.QUANT_BATCH_MAX_ROWS])
@pytest.mark.parametrize("qtype", ptx_wgmma_quant.TYPES)
def test_a_batch_decodes_k_quant_weights_onto_tensor_cores_without_a_float16_copy(
        cuda_device, rng, monkeypatch, qtype, m, split):
    # Hopper's batches read W's quantized bytes, decoded in shared memory (float16 scales:
    # about the float16 copy's rounding); 300 rows: two full blocks of 128 and a part.
    if cuda_device.device.info.arch != "sm_90":
        pytest.skip("wgmma is Hopper's (sm_90)")
    monkeypatch.setattr(quantized_module, "BATCH_MIN_VALUES", 0)
    if not split:
        monkeypatch.setattr(cuda_matmul, "MAX_SPLITS", 1)
    got, expected, names = _profiled_product(cuda_device, rng, qtype, 300, _k(qtype, 3), m)
    assert any(name.startswith(f"matmul_{qtype.lower()}_wgmma") for name in names), names
    assert not any(name.startswith("dequantize") for name in names), names
    assert ("split_sum" in names) == split, names
    assert_close(got, expected, PROMPT_NMSE)
