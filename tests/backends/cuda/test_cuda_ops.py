"""The CUDA backend (pxvm.backends.cuda) on an NVIDIA GPU: every op with a CUDA kernel
against its numpy reference on fresh random inputs of odd sizes, special values and the
broadcasts it takes, outputs poisoned before each run (conftest); batches, timing, and
the clear errors of what it does not run yet. Skipped, saying why, without a driver."""

from __future__ import annotations


import numpy as np
import pytest
from conftest import NMSE_ELEMENTWISE, NMSE_F16, ODD_SIZES, assert_close, nmse
from gguf import GGMLQuantizationType
from gguf import quants as gguf_quants

import pxvm
from pxvm.core import model_backend
from pxvm.batch import Batch, Graph
from pxvm.backends.cuda.ops import matmul as cuda_matmul
from pxvm.backends.cuda.ptx import tensor_core as ptx_tensor_core
from pxvm.backends.cuda.ptx import wgmma as ptx_wgmma
from pxvm.ops.registry import MissingKernelError



UNARY = [("relu", {}), ("leaky_relu", {"alpha": 0.1}), ("elu", {"alpha": 0.7}),
         ("sigmoid", {}), ("tanh", {}), ("silu", {}), ("gelu_tanh", {}),
         ("clip", {"lo": -0.5, "hi": 0.8}), ("scale", {"factor": -2.5})]
BINARY = ["add", "sub", "mul", "div", "maximum", "minimum"]


@pytest.mark.parametrize("name,params", UNARY)
@pytest.mark.parametrize("n", ODD_SIZES + (4, 70001, 1 << 20))
def test_unary_ops_match_their_references(cuda_device, rng, name, params, n):
    x = (rng.standard_normal(n) * 4).astype(np.float32)
    op = getattr(pxvm.ops, name)
    assert_close(op(x, backend="cuda", **params).numpy(), op.reference(x, **params),
                 NMSE_ELEMENTWISE)


@pytest.mark.parametrize("name,params", UNARY)
def test_unary_ops_are_accurate_at_every_magnitude(cuda_device, rng, name, params):
    x = np.concatenate([rng.standard_normal(2000) * s for s in (1e-6, 1e-3, 0.1, 4, 30)])
    x = x.astype(np.float32)
    op = getattr(pxvm.ops, name)
    got, expected = op(x, backend="cuda", **params).numpy(), op.reference(x, **params)
    worst = max(nmse(got[i:i + 1], expected[i:i + 1]) for i in range(x.size))
    assert worst <= NMSE_ELEMENTWISE


@pytest.mark.parametrize("name,params", UNARY)
def test_unary_ops_propagate_nan_and_inf_as_the_reference(cuda_device, name, params):
    x = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e30, -1e30, 3.0], np.float32)
    op = getattr(pxvm.ops, name)
    with np.errstate(all="ignore"):
        expected = op.reference(x, **params)
    assert_close(op(x, backend="cuda", **params).numpy(), expected, NMSE_ELEMENTWISE)


@pytest.mark.parametrize("name", BINARY)
@pytest.mark.parametrize("shapes", [((33,), (33,)), ((7, 33), (33,)), ((33,), (7, 33)),
                                    ((5, 8), (8,)), ((1000, 4), (1, 4)), ((9, 2), (1,)),
                                    ((2, 3, 5, 7), (5, 7))])
def test_binary_ops_match_their_references(cuda_device, rng, name, shapes):
    a = rng.standard_normal(shapes[0]).astype(np.float32)
    b = rng.standard_normal(shapes[1]).astype(np.float32) + 0.1
    op = getattr(pxvm.ops, name)
    assert_close(op(a, b, backend="cuda").numpy(), op.reference(a, b), NMSE_ELEMENTWISE)


def test_what_cuda_does_not_run_yet_is_one_clear_error(cuda_device, rng):
    a = rng.standard_normal((4, 1)).astype(np.float32)
    with pytest.raises(MissingKernelError, match="op add on CUDA broadcasts"):
        pxvm.ops.add(a, rng.standard_normal((1, 5)).astype(np.float32), backend="cuda")
    with pytest.raises(MissingKernelError, match="op mul has no CUDA kernel for int32"):
        pxvm.ops.mul(np.ones(4, np.int32), np.ones(4, np.int32), backend="cuda")
    with pytest.raises(MissingKernelError, match="op gelu has no cuda kernel yet"):
        pxvm.ops.gelu(a, backend="cuda")


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
@pytest.mark.parametrize("shape", [(n,) for n in ODD_SIZES] + [(7, 33), (2, 3, 257),
                                                                (70001, 3), (3, 5000)])
def test_softmax_family_matches_its_reference(cuda_device, rng, name, shape):
    x = (rng.standard_normal(shape) * 10).astype(np.float32)
    op = getattr(pxvm.ops, name)
    assert_close(op(x, backend="cuda").numpy(), op.reference(x), NMSE_F16)


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_softmax_rows_with_nan_and_inf_agree_with_the_reference(cuda_device, rng, name):
    x = rng.standard_normal((4, 300)).astype(np.float32)
    x[0, 5], x[1, 299], x[2, 100] = np.nan, np.nan, -np.inf
    op = getattr(pxvm.ops, name)
    with np.errstate(invalid="ignore"):
        expected = op.reference(x)
    assert_close(op(x, backend="cuda").numpy(), expected, NMSE_F16)


@pytest.mark.parametrize("shape", [(1,), (7,), (33, 257), (5, 3, 576), (70001, 3), (2, 8192)])
def test_rmsnorm_matches_its_reference(cuda_device, rng, shape):
    x = (rng.standard_normal(shape) * 3 + 1).astype(np.float32)
    w = rng.standard_normal(shape[-1]).astype(np.float32)
    assert_close(pxvm.ops.rmsnorm(x, w, 1e-5, backend="cuda").numpy(),
                 pxvm.ops.rmsnorm.reference(x, w, 1e-5), NMSE_F16)


def test_a_batch_chains_ops_on_the_device_and_times_them(cuda_device, rng):
    x = rng.standard_normal((64, 1000)).astype(np.float32)
    w = rng.standard_normal(1000).astype(np.float32)
    with Batch("cuda", timestamps=True) as batch:
        h = pxvm.ops.rmsnorm(batch.upload(x), batch.upload(w), 1e-6)
        y = pxvm.ops.softmax(pxvm.ops.scale(pxvm.ops.silu(h), 2.0))
    batch.execute()
    ops = pxvm.ops
    expected = ops.softmax.reference(ops.scale.reference(ops.silu.reference(
        ops.rmsnorm.reference(x, w, 1e-6)), 2.0))
    assert_close(batch.read(y), expected, NMSE_F16)
    assert 0 < batch.device_seconds < 1


def test_a_profiled_batch_times_each_launch(cuda_device, rng):
    x = rng.standard_normal((16, 300)).astype(np.float32)
    with Batch("cuda", profile=True) as batch:
        pxvm.ops.softmax(pxvm.ops.relu(batch.upload(x)))
    batch.execute()
    profile = batch.profile
    assert [name for name, _ in profile] == ["unary_relu_v4", "softmax_v4"]
    assert all(0 < seconds < 0.1 for _, seconds in profile)
    assert batch.profile == profile  # read again: the same numbers (events freed once)


def test_a_graph_replays_its_launches_on_the_inputs_current_values(cuda_device, rng):
    x = pxvm.tensor(rng.standard_normal((5, 70)).astype(np.float32), backend="cuda")
    # the intermediate relu result is dropped by Python: the graph must keep its memory
    graph = Graph(cuda_device, lambda: {"y": pxvm.ops.softmax(pxvm.ops.relu(x))})
    assert graph.dispatches == 2
    for _ in range(3):
        values = rng.standard_normal((5, 70)).astype(np.float32)
        x.write(values)
        # new tensors take whatever pooled memory is free, and are filled with garbage
        junk = [pxvm.tensor(np.full((5, 70), np.nan, np.float32), backend="cuda")
                for _ in range(4)]
        expected = pxvm.ops.softmax.reference(pxvm.ops.relu.reference(values))
        assert_close(graph.run("y")["y"], expected, NMSE_ELEMENTWISE)
        del junk


def test_a_graph_runs_several_times_in_one_launch_and_is_timed(cuda_device, rng):
    values = rng.standard_normal(1000).astype(np.float32)
    x = pxvm.tensor(values, backend="cuda")
    graph = Graph(cuda_device, lambda: {"y": pxvm.ops.scale(pxvm.ops.tanh(x), factor=3.0)})
    launch = graph.launch("y", runs=3, timestamps=True)
    y = launch.result()["y"]
    assert y.shape == (3, 1000)
    for row in y:
        assert_close(row, np.tanh(values.astype(np.float64)) * 3.0, NMSE_ELEMENTWISE)
    assert 0 < launch.device_seconds < 1.0
    last = graph.launch("y", runs=4, each_run=False).result()["y"]
    assert last.shape == (1000,)
    assert_close(last, np.tanh(values.astype(np.float64)) * 3.0, NMSE_ELEMENTWISE)


def test_a_graph_repacks_a_weight_once_outside_the_graph(cuda_device, rng):
    n, k = 40, 64
    w = gguf_quants.quantize(rng.standard_normal((n, k)).astype(np.float32),
                             GGMLQuantizationType.Q8_0)
    x_values = rng.standard_normal((1, k)).astype(np.float32)
    x = pxvm.tensor(x_values, backend="cuda")
    tw = pxvm.tensor(w, backend="cuda")
    graph = Graph(cuda_device, lambda: {"y": pxvm.ops.matmul_quant(x, tw, qtype="Q8_0", k=k)})
    expected = pxvm.ops.matmul_quant.reference(x_values, w, qtype="Q8_0", k=k)
    assert graph.dispatches == 1  # the product only: the repack ran when it was recorded
    for _ in range(2):
        assert_close(graph.run("y")["y"], expected, 1e-5)


def test_tensors_round_trip_and_write_in_place(cuda_device, rng):
    x = rng.standard_normal((3, 5)).astype(np.float32)
    t = cuda_device.from_numpy(x)
    np.testing.assert_array_equal(t.numpy(), x)
    cuda_device.write(t, x[::-1].copy())
    np.testing.assert_array_equal(t.numpy(), x[::-1])
    assert "CUDA on" in cuda_device.describe()


@pytest.mark.parametrize("transpose_b", [False, True])
@pytest.mark.parametrize("m,k,n", [(1, 1, 1), (7, 33, 5), (33, 20, 100), (129, 130, 131),
                                   (300, 64, 257), (256, 512, 128), (3, 1000, 2)])
def test_matmul_matches_its_reference(cuda_device, rng, transpose_b, m, k, n):
    # tiny products take the naive kernel, the others the tiled one
    a = rng.standard_normal((m, k)).astype(np.float32)
    b = rng.standard_normal((n, k) if transpose_b else (k, n)).astype(np.float32)
    got = pxvm.ops.matmul(a, b, transpose_b=transpose_b, backend="cuda")
    expected = a.astype(np.float64) @ (b.T if transpose_b else b).astype(np.float64)
    assert got.shape == (m, n)
    assert_close(got.numpy(), expected, NMSE_ELEMENTWISE)


@pytest.mark.parametrize("shape", ptx_tensor_core.SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("m,k,n", [(1, 8, 1), (7, 40, 5), (129, 136, 131), (300, 64, 257),
                                   (256, 1024, 384), (128, 32, 128)])
def test_tensor_core_matmul_matches_its_reference(cuda_device, rng, m, k, n, shape, forced):
    forced(cuda_matmul.KERNEL_TUNED, "mma")
    forced(cuda_matmul.MMA_SHAPE_TUNED, shape)
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((n, k)).astype(np.float16)
    got = pxvm.ops.matmul_f16(a, b, transpose_b=True, backend="cuda").numpy()
    expected = a.astype(np.float64) @ b.astype(np.float64).T
    assert got.dtype == np.float32 and got.shape == (m, n)
    assert_close(got, expected, 1e-10)  # float16 products are exact in float32


@pytest.mark.parametrize("shape", ptx_wgmma.SHAPES, ids=lambda s: "x".join(map(str, s)))
@pytest.mark.parametrize("m,k,n", [(1, 8, 1), (7, 40, 5), (129, 136, 131), (300, 64, 257),
                                   (256, 1024, 384), (128, 520, 512)])
def test_hopper_tensor_core_matmul_matches_its_reference(cuda_device, rng, m, k, n, shape,
                                                         forced):
    if cuda_device.device.info.arch != "sm_90":
        pytest.skip(f"wgmma needs a Hopper GPU (sm_90), not {cuda_device.device.info.arch}")
    forced(cuda_matmul.KERNEL_TUNED, "wgmma")
    forced(cuda_matmul.WGMMA_SHAPE_TUNED, shape)
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((n, k)).astype(np.float16)
    got = pxvm.ops.matmul_f16(a, b, transpose_b=True, backend="cuda").numpy()
    expected = a.astype(np.float64) @ b.astype(np.float64).T
    assert got.dtype == np.float32 and got.shape == (m, n)
    assert_close(got, expected, 1e-10)  # float16 products are exact in float32


def test_a_wgmma_product_of_few_blocks_splits_k_and_sums_the_ranges_alike_every_run(
        cuda_device, rng, forced):
    # 8 rows by 512 columns: 2 blocks on a GPU of many multiprocessors, so K (not a whole
    # number of 64-value steps) is cut into ranges, summed by a launch of their own
    if cuda_device.device.info.arch != "sm_90":
        pytest.skip(f"wgmma needs a Hopper GPU (sm_90), not {cuda_device.device.info.arch}")
    forced(cuda_matmul.KERNEL_TUNED, "wgmma")
    m, k, n = 8, 4096 + 3 * 64 + 8, 512
    a = rng.standard_normal((m, k)).astype(np.float16)
    b = rng.standard_normal((n, k)).astype(np.float16)
    runs = []
    for _ in range(2):
        with Batch("cuda", profile=True) as batch:
            y = pxvm.ops.matmul_f16(batch.upload(a), batch.upload(b), transpose_b=True)
        batch.execute()
        runs.append(batch.read(y))
        names = [name for name, _ in batch.profile]
    assert any(name.endswith("_split") for name in names) and "split_sum" in names, names
    assert_close(runs[0], a.astype(np.float64) @ b.astype(np.float64).T, 1e-10)
    np.testing.assert_array_equal(runs[0], runs[1])


def test_tensor_core_matmul_says_what_it_does_not_take_yet(cuda_device):
    a = np.ones((4, 12), np.float16)
    with pytest.raises(MissingKernelError, match="K a multiple of 8"):
        pxvm.ops.matmul_f16(a, np.ones((4, 12), np.float16), transpose_b=True, backend="cuda")
    with pytest.raises(MissingKernelError, match="transpose_b=True"):
        pxvm.ops.matmul_f16(np.ones((4, 8), np.float16), np.ones((8, 4), np.float16),
                            backend="cuda")


@pytest.mark.parametrize("shape", [(1,), (7,), (33, 257), (5, 3, 576), (70001, 3)])
def test_layer_norm_matches_its_reference(cuda_device, rng, shape):
    x = (rng.standard_normal(shape) * 3 + 1).astype(np.float32)
    w, b = (rng.standard_normal(shape[-1]).astype(np.float32) for _ in range(2))
    assert_close(pxvm.ops.layer_norm(x, w, b, backend="cuda").numpy(),
                 pxvm.ops.layer_norm.reference(x, w, b), NMSE_F16)


@pytest.mark.parametrize("n", ODD_SIZES + (1 << 20, 3_000_001))
def test_sum_max_and_dot_match_their_references(cuda_device, rng, n):
    a = rng.standard_normal(n).astype(np.float32)
    b = rng.standard_normal(n).astype(np.float32)
    ops = pxvm.ops
    for name, args in (("sum", (a,)), ("max", (a,)), ("dot", (a, b))):
        got = getattr(ops, name)(*args, backend="cuda").numpy()
        assert got.shape == ()
        assert_close(got, getattr(ops, name).reference(*args), NMSE_ELEMENTWISE)
    a[n // 2] = np.nan
    assert np.isnan(ops.max(a, backend="cuda").numpy())


@pytest.mark.parametrize("style", ["interleaved", "neox"])
@pytest.mark.parametrize("seq,heads,d,offset", [(1, 1, 2, 0), (7, 3, 16, 5), (33, 9, 64, 4000)])
def test_rope_matches_its_reference(cuda_device, rng, style, seq, heads, d, offset):
    x = rng.standard_normal((seq, heads, d)).astype(np.float32)
    params = {"pos_offset": offset, "theta": 500000.0, "style": style,
              "freq_factors": tuple(1.0 + rng.random(d // 2)), "attn_factor": 1.1}
    assert_close(pxvm.ops.rope(x, backend="cuda", **params).numpy(),
                 pxvm.ops.rope.reference(x, **params), NMSE_ELEMENTWISE)


def test_a_model_on_auto_runs_on_cuda_and_says_why(cuda_device):
    backend, reason = model_backend("auto")
    assert backend is cuda_device and "CUDA" in reason
    assert model_backend("numpy")[1] is None  # asked for by name: no reason to give
