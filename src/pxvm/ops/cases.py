"""Each op's conformance cases: inputs of odd shapes from a seeded generator, the
parameters, and the NMSE a kernel must meet against the op's reference. The conformance
matrix (tests/test_conformance.py) runs every case on every backend, and the browser
page runs each in the browser (pxvm.web.plans)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
from gguf import GGMLQuantizationType, quants

from .quant_types import random_weight

NMSE_ELEMENTWISE = 1e-7
NMSE_NORM = 1e-6
NMSE_LONG = 5e-4


@dataclass(frozen=True)
class ConformanceCase:
    """Inputs from `make(rng)`, keyword `params`, and the NMSE the result must meet
    against the op's reference (0: exactly equal, as integer results must be)."""

    make: Callable[[np.random.Generator], list]
    params: dict = field(default_factory=dict)
    threshold: float = NMSE_ELEMENTWISE


def _normal(*shape, scale=3.0):
    return lambda rng: [(rng.standard_normal(shape) * scale).astype(np.float32)]


def _ties_and_nan(rng):
    """Rows of small integers (many ties for the maximum), one row with a NaN late in it."""
    x = rng.integers(-3, 4, (5, 1237)).astype(np.float32)
    x[2, 1000] = np.nan
    return [x]


def _away_from_zero(rng, shape):
    return (rng.uniform(0.5, 2.0, shape) * rng.choice([-1.0, 1.0], shape)).astype(np.float32)


def _binary(rng):
    # broadcasting across a middle axis, odd extents that match no tile size
    return [(rng.standard_normal((7, 1, 33)) * 3).astype(np.float32),
            _away_from_zero(rng, (5, 33))]


def _binary_int(dtype):
    def make(rng):
        lo, hi = (-1000, 1000) if dtype == np.int32 else (0, 2000)
        return [rng.integers(lo, hi, (7, 33)).astype(dtype), rng.integers(lo, hi, (33,)).astype(dtype)]
    return make


def _quantized_rows(rng, qtype, n, k):
    """Raw GGUF blocks of a random (n, k) weight, made by the gguf package's quantizer."""
    w = rng.standard_normal((n, k)).astype(np.float32)
    raw = quants.quantize(w, GGMLQuantizationType[qtype])
    return np.ascontiguousarray(raw).view(np.uint8).reshape(n, -1)


def _quantized_matmul(qtype, rows=13, tokens=3):
    """x (tokens, 64) and a (rows, 64) weight; 37 tokens are a prompt's (tiled or
    tensor-core kernels), 3 decoding's."""
    return lambda rng: [rng.standard_normal((tokens, 64)).astype(np.float32),
                        _quantized_rows(rng, qtype, rows, 64)]


def _k_quant_matmul(qtype, rows=13, tokens=3):
    """x (tokens, 256) and a (rows, 256) weight of random valid blocks (random_weight: gguf
    quantizes no K type)."""
    return lambda rng: [rng.standard_normal((tokens, 256)).astype(np.float32),
                        random_weight(rng, rows, 256, qtype)]


def _with_gain(make):
    """(x, W) -> (x, gain, W): the inputs of the norm-fused products."""
    def with_gain(rng):
        x, w = make(rng)
        return [x, (1.0 + 0.3 * rng.standard_normal(x.shape[1])).astype(np.float32), w]
    return with_gain


def _cached_attention(tokens, n_ctx, pos, cache=np.float32, head_dim=8):
    """attention_cached's inputs: 4 query heads and 2 kv heads of `head_dim`, `tokens` new
    tokens at `pos`, caches of `n_ctx` rows of dtype `cache`."""
    return lambda rng: [rng.standard_normal((tokens, 8 * head_dim)).astype(np.float32),
                        rng.standard_normal((n_ctx, 2, head_dim)).astype(cache),
                        rng.standard_normal((n_ctx, 2, head_dim)).astype(cache),
                        np.array([0, pos], np.int32)]


def _projected_attention(tokens, n_ctx, pos, cache=np.float32):
    """The same (heads of 8), then a Q4_1 output projection and the residual."""
    attention = _cached_attention(tokens, n_ctx, pos, cache)
    return lambda rng: [*attention(rng), _quantized_rows(rng, "Q4_1", 13, 32),
                        rng.standard_normal((tokens, 13)).astype(np.float32)]


def _paged_attention(cache=np.float32, head_dim=8, block_size=4):
    """attention_paged's inputs: 4 query heads and 2 kv heads of `head_dim`; a batch of a
    prompt's chunk (sequence 2: 5 tokens at positions 3..7), a token at position 21
    (sequence 0) and a first token (sequence 1); the sequences' blocks scattered over a
    pool of 20 blocks of `block_size` rows holding random earlier keys and values."""
    def make(rng):
        pool = lambda: rng.standard_normal((20, block_size, 2, head_dim)).astype(cache)
        tokens = np.array([[2, p] for p in range(3, 8)] + [[0, 21], [1, 0]], np.int32)
        blocks = rng.permutation(20)[:18].reshape(3, 6).astype(np.int32)
        return [rng.standard_normal((len(tokens), 8 * head_dim)).astype(np.float32), pool(),
                pool(), tokens, blocks]
    return make


def _quantized_embedding(qtype):
    return lambda rng: [rng.integers(0, 13, 5).astype(np.int32), _quantized_rows(rng, qtype, 13, 64)]


UNARY = {"relu": {}, "leaky_relu": {"alpha": 0.07}, "elu": {"alpha": 0.8}, "sigmoid": {},
         "tanh": {}, "silu": {}, "gelu_tanh": {}, "gelu": {}, "clip": {"lo": -0.5, "hi": 0.9},
         "scale": {"factor": 1.7}}
BINARY = ("add", "sub", "mul", "div", "maximum", "minimum")

CASES: dict[str, list[ConformanceCase]] = {}
for _name, _params in UNARY.items():
    CASES[_name] = [ConformanceCase(_normal(7, 33), _params)]
for _name in BINARY:
    CASES[_name] = [ConformanceCase(_binary)]
    if _name != "div":
        CASES[_name] += [ConformanceCase(_binary_int(np.int32), threshold=0.0),
                         ConformanceCase(_binary_int(np.uint32), threshold=0.0)]
    # a row of 33 repeated over 7 rows (a bias)
    CASES[_name].append(ConformanceCase(lambda rng: [
        (rng.standard_normal((7, 33)) * 3).astype(np.float32), _away_from_zero(rng, (33,))]))
CASES.update({
    "sum": [ConformanceCase(_normal(1001, scale=1.0), threshold=NMSE_LONG)],
    "max": [ConformanceCase(_normal(1001), threshold=0.0)],
    "dot": [ConformanceCase(lambda rng: [rng.standard_normal(777).astype(np.float32) for _ in range(2)],
                 threshold=NMSE_LONG)],
    "argmax": [ConformanceCase(_normal(7, 257), {"axis": -1}, threshold=0.0),
               ConformanceCase(_normal(333), {"axis": None}, threshold=0.0),
               # rows longer than a block's threads, with ties and a NaN: the first
               # maximum (or NaN) wins, as numpy's
               ConformanceCase(_ties_and_nan, {"axis": -1}, threshold=0.0)],
    "softmax": [ConformanceCase(_normal(7, 33), threshold=NMSE_NORM)],
    "log_softmax": [ConformanceCase(_normal(7, 33), threshold=NMSE_NORM)],
    "rmsnorm": [ConformanceCase(lambda rng: [rng.standard_normal((7, 33)).astype(np.float32),
                                  rng.standard_normal(33).astype(np.float32)],
                     {"eps": 1e-5}, threshold=NMSE_NORM)],
    "layer_norm": [ConformanceCase(lambda rng: [rng.standard_normal((7, 33)).astype(np.float32),
                                     rng.standard_normal(33).astype(np.float32),
                                     rng.standard_normal(33).astype(np.float32)],
                        threshold=NMSE_NORM)],
    "rope": [ConformanceCase(_normal(7, 3, 16, scale=1.0), {"pos_offset": 5}, threshold=NMSE_NORM),
             ConformanceCase(_normal(5, 2, 8, scale=1.0), {"style": "neox"}, threshold=NMSE_NORM)],
    "matmul": [ConformanceCase(lambda rng: [rng.standard_normal((33, 17)).astype(np.float32),
                                 rng.standard_normal((17, 45)).astype(np.float32)],
                    threshold=NMSE_LONG),
               ConformanceCase(lambda rng: [rng.standard_normal((7, 33)).astype(np.float32),
                                 rng.standard_normal((9, 33)).astype(np.float32)],
                    {"transpose_b": True}, threshold=NMSE_LONG)],
    "conv2d": [ConformanceCase(lambda rng: [rng.standard_normal((3, 11, 13)).astype(np.float32),
                                 rng.standard_normal((5, 3, 3, 3)).astype(np.float32)],
                    {"stride": 2, "padding": 1}, threshold=NMSE_LONG)],
    "convolve2d": [ConformanceCase(lambda rng: [rng.standard_normal((17, 19)).astype(np.float32),
                                     rng.standard_normal((3, 5)).astype(np.float32)],
                        threshold=NMSE_LONG)],
    "attention": [ConformanceCase(lambda rng: [rng.standard_normal((7, 4, 16)).astype(np.float32),
                                    rng.standard_normal((9, 2, 16)).astype(np.float32),
                                    rng.standard_normal((9, 2, 16)).astype(np.float32)],
                       {"causal": True}, threshold=NMSE_LONG)],
    "write_rows": [ConformanceCase(lambda rng: [rng.standard_normal((9, 3, 5)).astype(np.float32),
                                     rng.standard_normal((2, 3, 5)).astype(np.float32)],
                        {"start": 4}, threshold=0.0)],
    "slice_rows": [ConformanceCase(_normal(9, 7), {"start": 2, "stop": 6}, threshold=0.0)],
    "slice_columns": [ConformanceCase(_normal(9, 7), {"start": 2, "stop": 6}, threshold=0.0),
                      ConformanceCase(_normal(3, 40), {"start": 12, "stop": 36}, threshold=0.0)],
    "matmul_quant": [ConformanceCase(_quantized_matmul(q), {"qtype": q, "k": 64}, threshold=NMSE_LONG)
                     for q in ("F32", "F16", "Q4_0", "Q4_1", "Q8_0")]
    + [ConformanceCase(_quantized_matmul(q, 70, 37), {"qtype": q, "k": 64}, threshold=NMSE_LONG)
       for q in ("Q4_1", "Q8_0")]
    + [ConformanceCase(_k_quant_matmul(q), {"qtype": q, "k": 256}, threshold=NMSE_LONG)
       for q in ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")]
    + [ConformanceCase(_k_quant_matmul("Q4_K", 70, 37), {"qtype": "Q4_K", "k": 256},
                       threshold=NMSE_LONG)],
    "embedding_quant": [ConformanceCase(_quantized_embedding(q), {"qtype": q, "k": 64}, threshold=0.0)
                        for q in ("Q4_1", "Q8_0")],
    "rmsnorm_matmul_quant": [ConformanceCase(_with_gain(_quantized_matmul(q)), {"qtype": q, "k": 64},
                                  threshold=NMSE_LONG) for q in ("Q4_1", "Q8_0")],
    "rmsnorm_glu_quant": [ConformanceCase(_with_gain(_quantized_matmul(q, 26)),
                               {"qtype": q, "k": 64, "activation": act}, threshold=NMSE_LONG)
                          for q, act in (("Q4_1", "silu"), ("Q8_0", "silu"), ("Q8_0", "gelu_tanh"))]
    + [ConformanceCase(_with_gain(_quantized_matmul("Q4_1", 70, 37)), {"qtype": "Q4_1", "k": 64}, threshold=NMSE_LONG)],
    "qk_norm": [ConformanceCase(lambda rng: [rng.standard_normal((3, 64)).astype(np.float32),
                                  (1.0 + 0.3 * rng.standard_normal(8)).astype(np.float32),
                                  (1.0 + 0.3 * rng.standard_normal(8)).astype(np.float32)],
                     {"n_heads": 4, "n_kv_heads": 2})],
    "matmul_quant_add": [ConformanceCase(lambda rng: [*_quantized_matmul("Q4_1")(rng),
                                           rng.standard_normal((3, 13)).astype(np.float32)],
                              {"qtype": "Q4_1", "k": 64}, threshold=NMSE_LONG)],
    "matmul_f16": [ConformanceCase(lambda rng: [rng.standard_normal((5, 6)).astype(np.float16),
                                     rng.standard_normal((6, 7)).astype(np.float16)],
                        threshold=NMSE_LONG),
                   ConformanceCase(lambda rng: [rng.standard_normal((3, 8)).astype(np.float16),
                                     rng.standard_normal((4, 8)).astype(np.float16)],
                        {"transpose_b": True}, threshold=NMSE_LONG)],
    # an odd head dimension: a row's values straddle the packed u32 words
    "attention_f16": [ConformanceCase(lambda rng: [rng.standard_normal((7, 4, 15)).astype(np.float16),
                                        rng.standard_normal((9, 2, 15)).astype(np.float16),
                                        rng.standard_normal((9, 2, 15)).astype(np.float16)],
                           {"causal": True}, threshold=NMSE_LONG),
                      ConformanceCase(lambda rng: [rng.standard_normal((5, 2, 16)).astype(np.float16),
                                        rng.standard_normal((3, 2, 16)).astype(np.float16),
                                        rng.standard_normal((3, 2, 16)).astype(np.float16)],
                           {"causal": False}, threshold=NMSE_LONG),
                      # an LLM's head size: 64
                      ConformanceCase(lambda rng: [rng.standard_normal((5, 4, 64)).astype(np.float16),
                                        rng.standard_normal((9, 2, 64)).astype(np.float16),
                                        rng.standard_normal((9, 2, 64)).astype(np.float16)],
                           {"causal": True}, threshold=NMSE_LONG)],
    "concat_columns": [ConformanceCase(lambda rng: [rng.standard_normal((5, 7)).astype(np.float32),
                                         rng.standard_normal((5, 4)).astype(np.float32)],
                            threshold=0.0)],
    # one range; a cache longer than one range (64 keys): ranges + combine; a prompt of 40
    # tokens after 30 (a prompt's tiled path)
    "attention_cached": [ConformanceCase(_cached_attention(tokens, n_ctx, pos), {"n_heads": 4},
                              threshold=NMSE_LONG) for tokens, n_ctx, pos in ((3, 11, 5),
                                                                              (2, 300, 290),
                                                                              (40, 90, 30))]
    # Gemma 2's and Phi-3's extras: a window, capped scores, scaled RoPE
    + [ConformanceCase(_cached_attention(2, 300, 290),
            {"n_heads": 4, "window": 100, "softcap": 2.0, "style": "neox",
             "freq_factors": (1.0, 2.0, 4.0, 8.0), "attn_factor": 1.1}, threshold=NMSE_LONG)]
    # float16 caches (cases 4..): the same paths; heads of 6 and 12, whose rows are not
    # whole groups of eight values; a ring (a window's cache, positions beyond its rows)
    + [ConformanceCase(_cached_attention(tokens, n_ctx, pos, np.float16, d), {"n_heads": 4},
            threshold=NMSE_LONG) for tokens, n_ctx, pos, d in ((3, 11, 5, 8), (2, 300, 290, 8),
                                                              (40, 90, 30, 8), (2, 300, 290, 6),
                                                              (40, 90, 30, 12))]
    + [ConformanceCase(_cached_attention(2, 300, 290, np.float16),
            {"n_heads": 4, "window": 100, "softcap": 2.0, "style": "neox",
             "freq_factors": (1.0, 2.0, 4.0, 8.0), "attn_factor": 1.1}, threshold=NMSE_LONG),
       ConformanceCase(_cached_attention(3, 128, 200, np.float16),
            {"n_heads": 4, "window": 70, "max_keys": 203}, threshold=NMSE_LONG)],
    # two tokens in one range; one token (decoding) whose ranges the product merges; the
    # same over float16 caches (cases 2, 3)
    "attention_cached_matmul_quant_add": [
        ConformanceCase(_projected_attention(tokens, n_ctx, pos, cache),
                        {"n_heads": 4, "qtype": "Q4_1", "k": 32}, threshold=NMSE_LONG)
        for cache in (np.float32, np.float16)
        for tokens, n_ctx, pos in ((2, 11, 5), (1, 300, 290))],
    # float32 and float16 pools; heads of 6, whose rows are not whole groups of eight
    "attention_paged": [ConformanceCase(_paged_attention(cache, d, b), {"n_heads": 4},
                                        threshold=NMSE_LONG)
                        for cache, d, b in ((np.float32, 8, 4), (np.float16, 8, 4),
                                            (np.float16, 6, 16))]
    + [ConformanceCase(_paged_attention(np.float16), {"n_heads": 4, "window": 3, "softcap": 2.0,
                                                      "style": "neox"}, threshold=NMSE_LONG)],
    "greedy_step": [ConformanceCase(lambda rng: [rng.standard_normal(333).astype(np.float32),
                                      np.array([7, 4], np.int32)], threshold=0.0)],
    "advance_tokens": [ConformanceCase(lambda rng: [
        rng.integers(0, 1000, 37).astype(np.int32),
        np.stack([rng.permutation(37), rng.integers(0, 5000, 37)], axis=1).astype(np.int32),
        rng.integers(0, 1000, 37).astype(np.int32)], threshold=0.0)],
    # two chunks of the first pass; history slot 4 % 2
    "sample_step": [ConformanceCase(lambda rng: [rng.standard_normal(4500).astype(np.float32),
                                      np.array([7, 4, -1, -1], np.int32),
                                      np.array([0.8, 1234, 9], np.float32)], threshold=0.0)],
})
