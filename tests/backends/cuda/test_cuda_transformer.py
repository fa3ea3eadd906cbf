"""The language model's ops on the CUDA backend: the fused products of a transformer layer
(for decoding's rows one launch each, of every type, shape and prefetch of the
matrix-vector kernel), qk_norm, attention over a KV cache (pxvm.backends.cuda.ptx.transformer:
RoPE, the cache's append, rings, windows, soft-caps, frequency factors; one key range and
several merged), the row copies and decoding's steps (pxvm.backends.cuda.ptx.decoding), each
against its numpy reference or the independent float64 computations of tests/ops on
fresh random inputs of odd shapes, outputs poisoned before each run (conftest). Skipped,
saying why, without a driver. The products take Q8_0 weights, and every other type where
matmul_quant's CUDA kernel reads it (skipped with its MissingKernelError until then)."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import NMSE_ELEMENTWISE, NMSE_F16, assert_close

import pxvm
from pxvm.batch import Batch, Graph
from pxvm.backends.cuda.ops import matmul as cuda_matmul
from pxvm.backends.cuda.ops import quantized as quantized_module
from pxvm.backends.cuda.ops import transformer as cuda_transformer
from pxvm.backends.cuda.ptx import quantized as ptx_quantized
from pxvm.backends.cuda.ptx import wgmma_quant as ptx_wgmma_quant
from pxvm.llm.model import KVCacheTypeError, kv_cache_type
from pxvm.ops import transformer
from pxvm.ops.decoding import greedy_step, sample_step, sampled_logits
from pxvm.ops.registry import MissingKernelError
from pxvm.ops.transformer import attention_cached

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "ops"))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "webgpu"))
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "llm"))
import test_transformer_attention as attention_cases  # noqa: E402
import test_transformer_paged as paged_cases  # noqa: E402
import test_webgpu_fused_products as product_cases  # noqa: E402
from test_decoding import GREEDY_CASES  # noqa: E402

Q8_0 = "Q8_0"
TOL = NMSE_ELEMENTWISE  # the tests/ops bounds: f32 arithmetic against float64


def test_attention_reads_float16_and_float32_caches_so_models_take_float16():
    # no driver needed: the declaration
    class Cuda:  # what Op.takes reads of the backend
        name, records, host_arrays = "cuda", True, False

    assert transformer.cache_dtypes(Cuda()) == ["f32", "f16"]
    assert kv_cache_type(Cuda(), "auto") == "f16"
    assert kv_cache_type(Cuda(), "f32") == "f32"
    with pytest.raises(KVCacheTypeError, match="kv_cache must be one of"):
        kv_cache_type(Cuda(), "q8")


def _on_cuda(call, qtype: str = Q8_0):
    """call(); for weight types other than Q8_0, a skip naming what CUDA lacks yet."""
    if qtype == Q8_0:
        return call()
    try:
        return call()
    except MissingKernelError as exc:
        pytest.skip(f"not on CUDA yet: {exc}")


# ---- fused products --------------------------------------------------------------------

@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("m,n,k", [(40, 128, 96), (130, 384, 576)])
def test_a_prompts_glu_in_the_tensor_core_pass_matches_float64_gate_rows_first(
        activation, m, n, k, cuda_device, rng):
    # GLU widths in whole 128-column halves of the wgmma block take the GLU in the
    # product's epilogue (ops.matmul.glu_takes), the weight's rows reordered for it.
    (x, gain, w), params, expected = product_cases._case(
        "rmsnorm_glu_quant", rng, Q8_0, m=m, n=n, k=k, activation=activation)
    got = transformer.rmsnorm_glu_quant(x, gain, w, backend="cuda", **params).numpy()
    assert got.shape == (m, n)
    assert_close(got, expected, NMSE_F16)
    swapped = np.concatenate([w[n:], w[:n]])
    other = transformer.rmsnorm_glu_quant(x, gain, swapped, backend="cuda", **params).numpy()
    assert np.abs(other - expected).max() > 1e-3


@pytest.mark.parametrize("qtype", product_cases.QTYPES)
@pytest.mark.parametrize("name", product_cases.FUSED)
def test_fused_products_match_float64_for_every_weight_type(name, qtype, cuda_device, rng):
    args, params, expected = product_cases._case(name, rng, qtype, m=3, n=37)
    op = pxvm.ops.REGISTRY[name]
    got = _on_cuda(lambda: op(*args, backend="cuda", **params).numpy(), qtype)
    assert got.shape == (3, 37) and got.dtype == np.float32
    assert_close(got, expected, TOL)


@pytest.mark.parametrize("m,n,k", [(1, 300, 96), (17, 37, 3104), (2, 1, 32), (5, 64, 256),
                                   (64, 37, 96), (130, 300, 576)])
@pytest.mark.parametrize("name", product_cases.FUSED)
def test_fused_products_on_decoding_and_prompt_shapes(name, m, n, k, cuda_device, rng):
    # A prompt's many rows may take the product in float16 on tensor cores
    # (quantized.PROMPT_MIN_ROWS): x rounded to float16 costs about 1e-7 there.
    args, params, expected = product_cases._case(name, rng, Q8_0, m=m, n=n, k=k)
    got = pxvm.ops.REGISTRY[name](*args, backend="cuda", **params).numpy()
    assert_close(got, expected, TOL if m < 32 else NMSE_F16)


@pytest.mark.parametrize("name", product_cases.FUSED)
def test_prompt_products_on_ampere_tensor_cores_add_and_gate_apart(name, cuda_device, rng,
                                                                   forced):
    # Without wgmma (mma.sync, Ampere's) the residual and the GLU are launches of their own.
    forced(cuda_matmul.KERNEL_TUNED, "mma")
    args, params, expected = product_cases._case(name, rng, Q8_0, m=64, n=256, k=96)
    got = pxvm.ops.REGISTRY[name](*args, backend="cuda", **params).numpy()
    assert_close(got, expected, NMSE_F16)


@pytest.mark.parametrize("qtype", ptx_wgmma_quant.TYPES)
@pytest.mark.parametrize("name,activation", [
    ("rmsnorm_matmul_quant", "silu"), ("matmul_quant_add", "silu"),
    ("rmsnorm_glu_quant", "silu"), ("rmsnorm_glu_quant", "gelu_tanh")])  # (the GLU's only)
def test_a_batchs_fused_products_decode_k_quants_onto_tensor_cores_norm_add_and_gate_in_place(
        name, activation, qtype, cuda_device, rng, monkeypatch):
    # 9 rows, 200 outputs: a GLU's blocks hold 64 outputs (gate and up rows alternating
    # by 8), the others' 128; the last block of each partly filled.
    if cuda_device.device.info.arch != "sm_90":
        pytest.skip("wgmma is Hopper's (sm_90)")
    monkeypatch.setattr(quantized_module, "BATCH_MIN_VALUES", 0)
    args, params, expected = product_cases._case(name, rng, qtype, m=9, n=200, k=768,
                                                 activation=activation)
    with Batch(cuda_device, profile=True) as batch:
        y = pxvm.ops.REGISTRY[name](*[batch.upload(a) for a in args], **params)
    batch.execute()
    names = [launch for launch, _ in batch.profile]
    assert any(launch.startswith(f"matmul_{qtype.lower()}_wgmma") for launch in names), names
    assert_close(batch.read(y), expected, NMSE_F16)


@pytest.mark.parametrize("activation", ["silu", "gelu_tanh"])
@pytest.mark.parametrize("n", [5, 36])  # GLU columns one at a time, and in fours
def test_rmsnorm_glu_quant_takes_its_activation_and_the_gate_rows_first(activation, n,
                                                                       cuda_device, rng):
    (x, gain, w), params, expected = product_cases._case(
        "rmsnorm_glu_quant", rng, Q8_0, m=3, n=n, activation=activation)
    got = transformer.rmsnorm_glu_quant(x, gain, w, backend="cuda", **params).numpy()
    assert_close(got, expected, TOL)
    swapped = np.concatenate([w[n:], w[:n]])
    other = transformer.rmsnorm_glu_quant(x, gain, swapped, backend="cuda", **params).numpy()
    assert np.abs(other - expected).max() > 1e-3


# Decoding's rows (below quantized.PROMPT_MIN_ROWS, K a multiple of 32) take each fused
# op in one launch of the matrix-vector kernel, the norm, residual and GLU inside it.
DECODING_FUSIONS = [("rmsnorm_matmul_quant", "silu"), ("matmul_quant_add", "silu"),
                    ("rmsnorm_glu_quant", "gelu_tanh")]  # (op, the GLU's activation)


def _one_launch(cuda_device, name, args, params):
    """The op's result, checking that a graph of it holds one launch."""
    tensors = [cuda_device.from_numpy(a) for a in args]
    op = pxvm.ops.REGISTRY[name]
    step = Graph(cuda_device, lambda: {"out": op(*tensors, **params)})
    assert step.dispatches == 1
    return step.run("out")["out"]


@pytest.mark.parametrize("qtype", product_cases.QTYPES)
@pytest.mark.parametrize("name,activation", DECODING_FUSIONS, ids=lambda v: v)
def test_fused_products_of_decoding_rows_are_one_launch_for_every_weight_type(
        name, activation, qtype, cuda_device, rng):
    k = 512 if qtype in product_cases.K_TYPES else 96  # float rows of whole units too
    args, params, expected = product_cases._case(name, rng, qtype, m=2, n=37, k=k,
                                                 activation=activation)
    assert_close(_one_launch(cuda_device, name, args, params), expected, TOL)


@pytest.mark.parametrize("prefetch", ptx_quantized.PREFETCHES)
@pytest.mark.parametrize("shape", ptx_quantized.SHAPES, ids=lambda s: f"r{s[0]}g{s[1]}")
@pytest.mark.parametrize("qtype", ptx_quantized.SWEPT)
def test_every_swept_shape_of_the_fused_kernel(qtype, shape, prefetch, cuda_device, rng,
                                               forced):
    # a GLU block's rows are half gate rows, half up rows, in groups of each or of both
    if prefetch == "lines" and shape != ptx_quantized.DEFAULT_SHAPE:
        pytest.skip("line prefetches come in the default shape only")
    if prefetch in ("bulk", "stage", "ring") and cuda_device.device.info.arch != "sm_90":
        pytest.skip("bulk prefetches and copies are Hopper's (sm_90)")
    forced(quantized_module.matvec_tuned(qtype), (*shape, prefetch))
    k = 512 if qtype in product_cases.K_TYPES else 256  # rows that can be staged
    for name, activation in DECODING_FUSIONS:
        args, params, expected = product_cases._case(name, rng, qtype, m=2, n=21, k=k,
                                                     activation=activation)
        assert_close(_one_launch(cuda_device, name, args, params), expected, TOL)


@pytest.mark.parametrize("prefetch", ["none", "stage", "ring"])
@pytest.mark.parametrize("qtype", ["Q4_K", "Q8_0"])
@pytest.mark.parametrize("name,activation", DECODING_FUSIONS, ids=lambda v: v)
def test_fused_products_of_rows_longer_than_a_block_of_threads(name, activation, qtype,
                                                               prefetch, cuda_device, rng,
                                                               monkeypatch, forced):
    # several passes over the row: each thread's sum of x^2 gathers several units (a
    # ring's one pass: 40 or 72 units in 64 or 96 threads, those past them count nothing)
    if prefetch in ("stage", "ring") and cuda_device.device.info.arch != "sm_90":
        pytest.skip("bulk copies into shared memory are Hopper's (sm_90)")
    monkeypatch.setattr(ptx_quantized, "MAX_THREADS", 32)  # 32 units of a row a pass
    forced(quantized_module.matvec_tuned(qtype),
           (*quantized_module.MATVEC_SHAPES[qtype], prefetch))
    k = 256 * 5 if qtype == "Q4_K" else 32 * 72
    args, params, expected = product_cases._case(name, rng, qtype, m=3, n=11, k=k,
                                                 activation=activation)
    assert_close(_one_launch(cuda_device, name, args, params), expected, TOL)


def test_rmsnorm_matmul_quant_uses_its_eps(cuda_device, rng):
    (x, gain, w), params, expected = product_cases._case("rmsnorm_matmul_quant", rng, Q8_0,
                                                         m=2, n=37)
    params["eps"] = 1e-9  # row 0's mean square is ~1e-6: eps matters there
    got = transformer.rmsnorm_matmul_quant(x, gain, w, backend="cuda", **params).numpy()
    assert np.abs(got[0] - expected[0]).max() > 1e-2 * np.abs(got[0]).max()
    assert_close(got[1], expected[1], TOL)


# ---- qk_norm ---------------------------------------------------------------------------

@pytest.mark.parametrize("s,hq,hkv,d", [(1, 4, 2, 64), (7, 3, 3, 48), (5, 2, 1, 256),
                                        (3, 6, 2, 2), (33, 16, 8, 128), (2, 1, 1, 40)])
def test_qk_norm_matches_its_reference_and_leaves_values_exact(s, hq, hkv, d, cuda_device, rng):
    scales = np.array([1e-3, 1.0, 30.0])[np.arange(s * (hq + 2 * hkv)) % 3]
    qkv = (rng.standard_normal((s, hq + 2 * hkv, d)) * scales.reshape(s, -1, 1))
    qkv = qkv.reshape(s, -1).astype(np.float32)
    q_gain = (1 + 0.5 * rng.standard_normal(d)).astype(np.float32)
    k_gain = (1 + 0.5 * rng.standard_normal(d)).astype(np.float32)
    params = {"n_heads": hq, "n_kv_heads": hkv, "eps": 1e-6}
    got = transformer.qk_norm(qkv, q_gain, k_gain, backend="cuda", **params).numpy()
    expected = transformer.qk_norm.reference(qkv, q_gain, k_gain, **params)
    assert_close(got, expected, NMSE_F16)
    values = slice((hq + hkv) * d, None)
    np.testing.assert_array_equal(got[:, values], qkv[:, values])
    swapped = transformer.qk_norm(qkv, k_gain, q_gain, backend="cuda", **params).numpy()
    assert np.abs(swapped - expected).max() > 1e-3  # each gain on its own heads


# ---- attention over a KV cache ---------------------------------------------------------

@pytest.fixture(params=["one range", "ranges"])
def key_ranges(request, monkeypatch):
    """"one range" (a block per token and head: prompts, short caches) or "ranges" (the
    keys cut into ranges merged by the last block to finish, as decoding over a long
    cache does; the ranges made short here, so that the tests' caches of a few hundred
    keys take them)."""
    if request.param == "ranges":
        monkeypatch.setattr(cuda_transformer, "ONE_RANGE_KEYS", 16)
        monkeypatch.setattr(cuda_transformer, "RANGE_KEYS", 16)
    else:
        monkeypatch.setattr(cuda_transformer, "BUSY_BLOCKS", 0)
    return request.param


@pytest.fixture(params=["a head a block", "packs"])
def packs(request, monkeypatch):
    """Blocks of one query head, or packs of a KV head's query heads for any number of
    keys (by default only for many)."""
    for name in ("PACK_MIN_KEYS", "PACK_MIN_HEADS"):
        monkeypatch.setattr(cuda_transformer, name, 0 if request.param == "packs" else 10**9)
    return request.param


def _ranges_taken(key_ranges, bound, tokens, hq, hkv):
    packs = -(-(hq // hkv) // cuda_transformer.head_pack(bound, hq // hkv, tokens * hq))
    blocks = tokens * hkv * packs
    n_ranges = cuda_transformer.key_ranges(bound, blocks)[0]
    assert (n_ranges > 1) == (key_ranges == "ranges" and bound > 16
                              and blocks < cuda_transformer.BUSY_BLOCKS)


@pytest.mark.parametrize("cache", [np.float32, np.float16])
@pytest.mark.parametrize("style", ["interleaved", "neox"])
@pytest.mark.parametrize("hq,hkv,d,n_ctx,pos,s,max_keys", attention_cases.CASES)
def test_attention_cached_matches_float64_and_appends_only_its_rows(
        hq, hkv, d, n_ctx, pos, s, max_keys, style, cache, key_ranges, packs, cuda_device,
        rng):
    _ranges_taken(key_ranges, max_keys or n_ctx, s, hq, hkv)
    qkv, kc, vc = attention_cases._case(rng, hq, hkv, d, n_ctx, s, cache)
    state = attention_cases._state(rng, pos, extra=(12345,))
    got = attention_cases._run("cuda", qkv, kc, vc, state, n_heads=hq, style=style,
                               max_keys=max_keys)
    expected = attention_cases.expected_step(qkv, kc, vc, pos, hq, style=style)
    attention_cases._check(got, kc, vc, expected, pos, s)
    np.testing.assert_array_equal(got[3], state)  # the op only reads the state


@pytest.mark.parametrize("cache", [np.float32, np.float16])
@pytest.mark.parametrize("hq,hkv,d,n_ctx,pos,s,window", attention_cases.WINDOW_CASES)
def test_attention_cached_window_softcap_and_scaled_rope_match_float64(
        hq, hkv, d, n_ctx, pos, s, window, cache, key_ranges, packs, cuda_device, rng):
    qkv, kc, vc = attention_cases._case(rng, hq, hkv, d, n_ctx, s, cache)
    qkv *= 3.0  # scores large enough for the cap to matter
    params = {"freq_factors": tuple(1.0 + 7.0 * rng.random(d // 2)), "attn_factor": 1.15,
              "softcap": 4.0, "window": window}
    got = attention_cases._run("cuda", qkv, kc, vc, attention_cases._state(rng, pos),
                               n_heads=hq, style="neox", **params)
    expected = attention_cases.expected_step(qkv, kc, vc, pos, hq, style="neox", **params)
    attention_cases._check(got, kc, vc, expected, pos, s)
    plain = attention_cases.expected_step(qkv, kc, vc, pos, hq, style="neox")[0]
    assert np.abs(got[0] - plain).max() > 1e-2  # the parameters really changed it


@pytest.mark.parametrize("s", [1, 4])
def test_attention_cached_uses_theta_and_scale(s, cuda_device, rng):
    hq, hkv, d, pos = 4, 2, 32, 50
    qkv, kc, vc = attention_cases._case(rng, hq, hkv, d, 80, s)
    got = attention_cases._run("cuda", qkv, kc, vc, attention_cases._state(rng, pos),
                               n_heads=hq, theta=500000.0, scale=0.3)
    expected = attention_cases.expected_step(qkv, kc, vc, pos, hq, 500000.0, scale=0.3)
    attention_cases._check(got, kc, vc, expected, pos, s)


@pytest.mark.parametrize("hq,hkv,d,rows,pos,s,window", attention_cases.RING_CASES)
def test_a_ring_cache_of_the_window_attends_as_a_full_cache_would(
        hq, hkv, d, rows, pos, s, window, key_ranges, cuda_device, rng):
    qkv, full_k, full_v = attention_cases._case(rng, hq, hkv, d, pos + s, s)
    ring_k = rng.standard_normal((rows, hkv, d)).astype(np.float32)  # rows never written
    ring_v = rng.standard_normal((rows, hkv, d)).astype(np.float32)
    for j in range(max(0, pos - rows), pos):  # the positions a ring holds before the pass
        ring_k[j % rows], ring_v[j % rows] = full_k[j], full_v[j]
    got = attention_cases._run("cuda", qkv, ring_k, ring_v, attention_cases._state(rng, pos),
                               n_heads=hq, style="neox", window=window,
                               max_keys=max(pos + s, rows + 64))
    out, k_full, v_full = attention_cases.expected_step(qkv, full_k, full_v, pos, hq,
                                                        style="neox", window=window)
    assert_close(got[0], out, TOL)
    new_rows = np.arange(pos, pos + s) % rows
    assert_close(got[1][new_rows], k_full[pos: pos + s], TOL)
    np.testing.assert_array_equal(got[2][new_rows], v_full[pos: pos + s].astype(np.float32))


@pytest.mark.parametrize("max_keys", [32, 96])
def test_positions_beyond_max_keys_are_nan_rows_and_not_appended(max_keys, key_ranges,
                                                                  cuda_device, rng):
    # The position lives on the device, where no error can be raised: a token whose keys
    # the recorded grid does not cover gets NaN, and the cache is left as it was.
    qkv, kc, vc = attention_cases._case(rng, 4, 2, 16, 120, 1)
    beyond = attention_cases._run("cuda", qkv, kc, vc, np.array([0, max_keys + 8], np.int32),
                                  n_heads=4, max_keys=max_keys)
    assert np.isnan(beyond[0]).all()
    np.testing.assert_array_equal(beyond[1], kc)
    np.testing.assert_array_equal(beyond[2], vc)
    inside = attention_cases._run("cuda", qkv, kc, vc, np.array([0, max_keys - 1], np.int32),
                                  n_heads=4, max_keys=max_keys)
    assert np.isfinite(inside[0]).all()


def test_one_captured_attention_step_serves_every_position(key_ranges, packs, cuda_device,
                                                           rng):
    # As a decoding step: captured once, submitted again with the new token's qkv and
    # the position written between submits; it attends and appends at each position.
    hq, hkv, d, n_ctx = 4, 2, 16, 140
    qkv, kc, vc = attention_cases._case(rng, hq, hkv, d, n_ctx, 1)
    qkv_t, k_t, v_t = (cuda_device.from_numpy(a) for a in (qkv, kc, vc))
    state_t = cuda_device.from_numpy(attention_cases._state(rng, 0))
    step = Graph(cuda_device, lambda: {"out": attention_cached(qkv_t, k_t, v_t, state_t,
                                                               n_heads=hq, style="neox")})
    k_ref, v_ref = kc.astype(np.float64), vc.astype(np.float64)
    for pos in (0, 1, 2, 31, 32, 33, 100, 139):
        row = rng.standard_normal(qkv.shape).astype(np.float32)
        qkv_t.write(row)
        state_t.write(np.array([7, pos], np.int32))
        got = step.run("out")["out"]
        expected, k_ref, v_ref = attention_cases.expected_step(row, k_ref, v_ref, pos, hq,
                                                               style="neox")
        assert_close(got, expected, TOL)
    assert_close(k_t.numpy(), k_ref, TOL)
    np.testing.assert_array_equal(v_t.numpy(), v_ref.astype(np.float32))


@pytest.mark.parametrize("cache", [np.float32, np.float16])
@pytest.mark.parametrize("hq,hkv,d,block_size,lengths,starts", [
    (4, 2, 8, 4, (5, 1, 1), (3, 21, 0)),          # a prompt's chunk beside two tokens
    (9, 3, 64, 16, (1, 1, 1, 1), (300, 0, 17, 130)),  # SmolLM2's heads: packs of 4 and 3
    (32, 8, 128, 16, (1, 1), (511, 1000)),        # Llama 3's heads, ranges of the keys
    (14, 2, 64, 32, (40, 1), (0, 250)),           # a group of 7: two packs
])
def test_attention_paged_gives_each_sequence_its_cached_attention(
        hq, hkv, d, block_size, lengths, starts, cache, key_ranges, packs, cuda_device, rng):
    qkv, kp, vp, tokens, table = paged_cases._batch(
        rng, lengths, starts, hq=hq, hkv=hkv, d=d, block_size=block_size,
        n_blocks=len(lengths) * (-(-(max(starts) + max(lengths)) // block_size)) + 3,
        cache=cache)
    out, k_pool, v_pool = paged_cases._run("cuda", qkv, kp, vp, tokens, table, n_heads=hq)
    for b, (start, n) in enumerate(zip(starts, lengths)):
        mine = tokens[:, 0] == b
        want, k_want, v_want = attention_cases.expected_step(
            qkv[mine], paged_cases._plain(kp, table[b], block_size),
            paged_cases._plain(vp, table[b], block_size), start, hq)
        assert_close(out[mine], want, TOL if cache == np.float32 else 1e-6)
        rows = slice(start, start + n)
        assert_close(paged_cases._plain(k_pool, table[b], block_size)[rows], k_want[rows], TOL)
        np.testing.assert_array_equal(paged_cases._plain(v_pool, table[b], block_size)[rows],
                                      v_want[rows].astype(cache))
    free = np.setdiff1d(np.arange(len(kp)), table)
    np.testing.assert_array_equal(k_pool[free], kp[free])


def test_paged_tokens_beyond_their_table_are_nan_rows_and_not_written(cuda_device, rng):
    qkv, kp, vp, tokens, table = paged_cases._batch(rng, (1, 1), (2, 5))
    tokens[1, 1] = table.shape[1] * 4  # one past the sequence's last block
    out, k_pool, v_pool = paged_cases._run("cuda", qkv, kp, vp, tokens, table, n_heads=4)
    assert np.isfinite(out[0]).all() and np.isnan(out[1]).all()
    unchanged = np.ones(len(kp), bool)
    unchanged[table[0, 0]] = False  # sequence 0 wrote its row there
    np.testing.assert_array_equal(k_pool[unchanged], kp[unchanged])
    np.testing.assert_array_equal(v_pool[unchanged], vp[unchanged])


PROJECTED_CASES = [  # tests/ops' cases, all with Q8_0 weights
    (*case[:-1], Q8_0) for case in attention_cases.PROJECTED_CASES]


@pytest.mark.parametrize("hq,hkv,d,n_ctx,pos,s,max_keys,qtype", PROJECTED_CASES)
def test_attention_cached_matmul_quant_add_matches_float64(
        hq, hkv, d, n_ctx, pos, s, max_keys, qtype, key_ranges, cuda_device, rng):
    inputs, (expected, k_new, v_new) = attention_cases._projected(rng, hq, hkv, d, n_ctx, pos,
                                                                  s, qtype)
    out, k_got, v_got = attention_cases._run_projected("cuda", inputs, n_heads=hq,
                                                       max_keys=max_keys, qtype=qtype, k=hq * d)
    assert out.shape == expected.shape and out.dtype == np.float32
    assert_close(out, expected, TOL if s < 32 else NMSE_F16)  # float16 products of prompts
    assert_close(k_got, k_new, TOL)
    np.testing.assert_array_equal(v_got, v_new.astype(np.float32))


@pytest.mark.parametrize("cache", [np.float32, np.float16])
@pytest.mark.parametrize("hq,hkv,d,n_ctx,pos,s,max_keys,style", [
    (4, 2, 64, 400, 0, 40, None, "neox"),        # a prompt's first piece
    (6, 2, 64, 400, 200, 133, 333, "interleaved"),  # after 200 positions, a ragged tile
    (2, 1, 128, 300, 31, 64, None, "neox"),      # head size 128
])
def test_prompt_attention_on_tensor_cores_matches_float64_and_appends_its_rows(
        hq, hkv, d, n_ctx, pos, s, max_keys, style, cache, cuda_device, rng):
    # Prompts' attention with head sizes the flash kernel takes runs on tensor cores:
    # float16 q, k, v (a float16 cache is read in place; a float32 one through float16
    # copies), the position read on the device.
    inputs, _ = attention_cases._projected(rng, hq, hkv, d, n_ctx, pos, s, Q8_0, cache)
    qkv, kc, vc, state, w, residual = inputs
    att, k_new, v_new = attention_cases.expected_step(qkv, kc, vc, pos, hq, style=style)
    expected = residual + att @ attention_cases.dequantize(w, Q8_0, hq * d).astype(np.float64).T
    params = {"n_heads": hq, "qtype": Q8_0, "k": hq * d, "style": style,
              "max_keys": max_keys}
    out, k_got, v_got = attention_cases._run_projected("cuda", inputs, **params)
    assert_close(out, expected, NMSE_F16)
    assert_close(k_got, k_new, TOL)
    np.testing.assert_array_equal(v_got, v_new.astype(np.float32))


@pytest.mark.parametrize("pos,s,window", [(290, 1, 40), (290, 1, 200), (5, 2, 3)])
def test_attention_cached_matmul_quant_add_takes_the_window_and_cap(pos, s, window,
                                                                     cuda_device, rng):
    hq, hkv, d, n_ctx = 4, 2, 16, 300
    inputs, _ = attention_cases._projected(rng, hq, hkv, d, n_ctx, pos, s, Q8_0)
    params = {"n_heads": hq, "qtype": Q8_0, "k": hq * d, "softcap": 3.0, "window": window}
    got = attention_cases._run_projected("cuda", inputs, **params)
    expected = attention_cases._run_projected("numpy", inputs, **params)
    assert_close(got[0], expected[0], TOL * 10)


# ---- row copies ------------------------------------------------------------------------

@pytest.mark.parametrize("shape,start,stop", [((7, 5), 2, 6), ((9, 8), 8, 9), ((3, 4, 3), 0, 3),
                                              ((300, 576), 299, 300)])
def test_slice_rows_copies_the_range_exactly(shape, start, stop, cuda_device, rng):
    x = rng.standard_normal(shape).astype(np.float32)
    got = pxvm.ops.slice_rows(x, start, stop, backend="cuda").numpy()
    np.testing.assert_array_equal(got, x[start:stop])


@pytest.mark.parametrize("rows,na,nb", [(3, 5, 7), (1, 64, 128), (4, 8, 3), (33, 1, 1)])
def test_concat_columns_joins_side_by_side_exactly(rows, na, nb, cuda_device, rng):
    a = rng.standard_normal((rows, na)).astype(np.float32)
    b = rng.standard_normal((rows, nb)).astype(np.float32)
    got = pxvm.ops.concat_columns(a, b, backend="cuda").numpy()
    np.testing.assert_array_equal(got, np.concatenate([a, b], axis=1))


@pytest.mark.parametrize("shape,start,rows", [((10, 3), 4, 5), ((16, 2, 8), 0, 16),
                                              ((9, 4), 8, 1)])
def test_write_rows_writes_only_its_rows_in_place(shape, start, rows, cuda_device, rng):
    dst = rng.standard_normal(shape).astype(np.float32)
    src = rng.standard_normal((rows, *shape[1:])).astype(np.float32)
    t = cuda_device.from_numpy(dst)
    assert pxvm.ops.write_rows(t, src, start=start) is t
    expected = dst.copy()
    expected[start:start + rows] = src
    np.testing.assert_array_equal(t.numpy(), expected)


# ---- decoding steps --------------------------------------------------------------------

@pytest.mark.parametrize("shape,ties", GREEDY_CASES)
def test_greedy_step_takes_the_first_maximum_and_advances_the_position(shape, ties,
                                                                       cuda_device, rng):
    logits = rng.standard_normal(shape).astype(np.float32)
    flat = logits.reshape(-1)
    flat[ties] = flat.max() + 0.5
    state = cuda_device.from_numpy(np.array([-5, 41], np.int32))
    greedy_step(logits, state)
    assert state.numpy().tolist() == [int(np.argmax(logits)), 42]


def test_greedy_step_agrees_with_numpy_on_special_values(cuda_device):
    cases = [np.full(300, 2.5, np.float32),                        # all equal: index 0
             np.full(5000, -np.inf, np.float32),                   # all -inf: index 0
             np.where(np.arange(5000) == 4321, np.inf, -1.0).astype(np.float32),
             np.where(np.arange(5000) % 1000 == 999, np.nan, 1.0).astype(np.float32),
             np.where(np.arange(9000) == 8500, np.nan, 1.0).astype(np.float32)]
    state = cuda_device.from_numpy(np.array([0, 0], np.int32))
    for i, logits in enumerate(cases):
        greedy_step(logits, state)
        assert state.numpy().tolist() == [int(np.argmax(logits)), i + 1], i


def test_greedy_steps_write_each_token_into_the_history_slot_of_its_position(cuda_device,
                                                                              rng):
    start, history = 5, 4
    state = cuda_device.from_numpy(np.array([0, start] + [-1] * history, np.int32))
    rows = rng.standard_normal((6, 4099)).astype(np.float32)
    with Batch(cuda_device) as batch:
        for row in rows:
            greedy_step(row, state)
    batch.execute()
    tokens = [int(np.argmax(row)) for row in rows]
    slots = [-1] * history
    for i, token in enumerate(tokens):
        slots[(start + i) % history] = token
    assert state.numpy().tolist() == [tokens[-1], start + len(rows)] + slots


@pytest.mark.parametrize("n,temperature,seed,counter", [
    (37, 0.7, 1, 0), (4099, 1.0, 12345, 17), (9001, 0.3, 99, 4096), (50, 2.5, 0, 3),
    (49152, 0.9, 777, 5)])
def test_sample_step_draws_the_numpy_token(n, temperature, seed, counter, cuda_device, rng):
    logits = rng.standard_normal(n).astype(np.float32)
    z = np.sort(sampled_logits(logits, temperature, seed, counter))
    assert z[-1] - z[-2] > 1e-4  # no near-tie that float rounding could flip
    state = cuda_device.from_numpy(np.array([-1, 40, -1, -1], np.int32))
    sampler = cuda_device.from_numpy(np.array([temperature, seed, counter], np.float32))
    sample_step(logits, state, sampler)
    token = int(np.argmax(sampled_logits(logits, temperature, seed, counter)))
    assert state.numpy().tolist() == [token, 41, token, -1]  # history slot 40 % 2
    assert sampler.numpy().tolist() == [np.float32(temperature), seed, counter + 1]


def test_sample_step_with_temperature_zero_is_greedy(cuda_device, rng):
    logits = rng.standard_normal(5000).astype(np.float32)
    state = cuda_device.from_numpy(np.array([0, 3], np.int32))
    sampler = cuda_device.from_numpy(np.array([0.0, 7, 0], np.float32))
    sample_step(logits, state, sampler)
    assert state.numpy().tolist() == [int(np.argmax(logits)), 4]
    assert sampler.numpy()[2] == 1


def test_chained_sample_steps_draw_what_numpy_draws(cuda_device, rng):
    # The counter advances on the device: 300 steps in one batch draw numpy's tokens.
    logits = rng.standard_normal(1000).astype(np.float32)
    steps = 300
    state = cuda_device.from_numpy(np.zeros(2 + steps, np.int32))
    sampler = cuda_device.from_numpy(np.array([1.3, 2024, 0], np.float32))
    with Batch(cuda_device) as batch:
        for _ in range(steps):
            sample_step(logits, state, sampler)
    batch.execute()
    got = state.numpy()[2:].tolist()
    assert sampler.numpy()[2] == steps
    compared = 0
    for counter, token in enumerate(got):
        z = sampled_logits(logits, 1.3, 2024, counter)
        top2 = np.sort(z)[-2:]
        if top2[1] - top2[0] > 1e-4:  # no near-tie that float rounding could flip
            assert token == int(np.argmax(z)), counter
            compared += 1
    assert compared > steps * 0.9
