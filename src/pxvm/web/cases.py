"""The browser page's test data: the conformance table (op name -> cases of input
generator, parameters and threshold), the in-browser benchmarks' inputs, and random
pxVM programs. plans.py turns a case into a dispatch plan with the expected output."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np
from gguf import GGMLQuantizationType, quants

from ..vm.assembler import assemble

NMSE_ELEMENTWISE = 1e-7
NMSE_NORM = 1e-6
NMSE_LONG = 5e-4


@dataclass(frozen=True)
class Case:
    """Inputs from `make(rng)`, keyword `params`, and the NMSE the result must meet
    (integer results must match exactly). `flops(inputs)` and `bytes_moved(inputs)` give
    the work of one run, for benchmarks."""

    make: Callable[[np.random.Generator], list]
    params: dict = field(default_factory=dict)
    threshold: float = NMSE_ELEMENTWISE
    flops: Callable[[list], float] | None = None
    bytes_moved: Callable[[list], float] | None = None


def _normal(*shape, scale=3.0):
    return lambda rng: [(rng.standard_normal(shape) * scale).astype(np.float32)]


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


def _size_bytes(inputs):
    return 4.0 * sum(x.size for x in inputs)


def _quantized_rows(rng, qtype, n, k):
    """Raw GGUF blocks of a random (n, k) weight, made by the gguf package's quantizer."""
    w = rng.standard_normal((n, k)).astype(np.float32)
    raw = quants.quantize(w, GGMLQuantizationType(qtype))
    return np.ascontiguousarray(raw).view(np.uint8).reshape(n, -1)


def _quantized_matmul(qtype, rows=13, tokens=3):
    """x (tokens, 64) and a (rows, 64) weight; 32 tokens or more take the prompts' tiled
    kernel (pxvm/ops/quantized.py's takes_tiled)."""
    return lambda rng: [rng.standard_normal((tokens, 64)).astype(np.float32),
                        _quantized_rows(rng, qtype, rows, 64)]


def _with_gain(make):
    """(x, W) -> (x, gain, W): the inputs of the norm-fused products."""
    def with_gain(rng):
        x, w = make(rng)
        return [x, (1.0 + 0.3 * rng.standard_normal(x.shape[1])).astype(np.float32), w]
    return with_gain


def _cached_attention(tokens, n_ctx, pos):
    """attention_cached's inputs: 4 query heads and 2 kv heads of 8, `tokens` new tokens
    at `pos`, caches of `n_ctx` rows."""
    return lambda rng: [rng.standard_normal((tokens, 64)).astype(np.float32),
                        rng.standard_normal((n_ctx, 2, 8)).astype(np.float32),
                        rng.standard_normal((n_ctx, 2, 8)).astype(np.float32),
                        np.array([0, pos], np.int32)]


def _projected_attention(tokens, n_ctx, pos):
    """The same, then a Q4_1 output projection and the residual."""
    attention = _cached_attention(tokens, n_ctx, pos)
    return lambda rng: [*attention(rng), _quantized_rows(rng, 3, 13, 32),
                        rng.standard_normal((tokens, 13)).astype(np.float32)]


def _quantized_embedding(qtype):
    return lambda rng: [rng.integers(0, 13, 5).astype(np.int32), _quantized_rows(rng, qtype, 13, 64)]


UNARY = {"relu": {}, "leaky_relu": {"alpha": 0.07}, "elu": {"alpha": 0.8}, "sigmoid": {},
         "tanh": {}, "silu": {}, "gelu_tanh": {}, "gelu": {}, "clip": {"lo": -0.5, "hi": 0.9},
         "scale": {"factor": 1.7}}
BINARY = ("add", "sub", "mul", "div", "maximum", "minimum")

CASES: dict[str, list[Case]] = {}
for _name, _params in UNARY.items():
    CASES[_name] = [Case(_normal(7, 33), _params)]
for _name in BINARY:
    CASES[_name] = [Case(_binary)]
    if _name != "div":
        CASES[_name] += [Case(_binary_int(np.int32), threshold=0.0),
                         Case(_binary_int(np.uint32), threshold=0.0)]
CASES.update({
    "sum": [Case(_normal(1001, scale=1.0), threshold=NMSE_LONG)],
    "max": [Case(_normal(1001), threshold=0.0)],
    "dot": [Case(lambda rng: [rng.standard_normal(777).astype(np.float32) for _ in range(2)],
                 threshold=NMSE_LONG)],
    "argmax": [Case(_normal(7, 257), {"axis": -1}, threshold=0.0),
               Case(_normal(333), {"axis": None}, threshold=0.0)],
    "softmax": [Case(_normal(7, 33), threshold=NMSE_NORM)],
    "log_softmax": [Case(_normal(7, 33), threshold=NMSE_NORM)],
    "rmsnorm": [Case(lambda rng: [rng.standard_normal((7, 33)).astype(np.float32),
                                  rng.standard_normal(33).astype(np.float32)],
                     {"eps": 1e-5}, threshold=NMSE_NORM)],
    "layer_norm": [Case(lambda rng: [rng.standard_normal((7, 33)).astype(np.float32),
                                     rng.standard_normal(33).astype(np.float32),
                                     rng.standard_normal(33).astype(np.float32)],
                        threshold=NMSE_NORM)],
    "rope": [Case(_normal(7, 3, 16, scale=1.0), {"pos_offset": 5}, threshold=NMSE_NORM),
             Case(_normal(5, 2, 8, scale=1.0), {"style": "neox"}, threshold=NMSE_NORM)],
    "matmul": [Case(lambda rng: [rng.standard_normal((33, 17)).astype(np.float32),
                                 rng.standard_normal((17, 45)).astype(np.float32)],
                    threshold=NMSE_LONG),
               Case(lambda rng: [rng.standard_normal((7, 33)).astype(np.float32),
                                 rng.standard_normal((9, 33)).astype(np.float32)],
                    {"transpose_b": True}, threshold=NMSE_LONG)],
    "conv2d": [Case(lambda rng: [rng.standard_normal((3, 11, 13)).astype(np.float32),
                                 rng.standard_normal((5, 3, 3, 3)).astype(np.float32)],
                    {"stride": 2, "padding": 1}, threshold=NMSE_LONG)],
    "convolve2d": [Case(lambda rng: [rng.standard_normal((17, 19)).astype(np.float32),
                                     rng.standard_normal((3, 5)).astype(np.float32)],
                        threshold=NMSE_LONG)],
    "attention": [Case(lambda rng: [rng.standard_normal((7, 4, 16)).astype(np.float32),
                                    rng.standard_normal((9, 2, 16)).astype(np.float32),
                                    rng.standard_normal((9, 2, 16)).astype(np.float32)],
                       {"causal": True}, threshold=NMSE_LONG)],
    "write_rows": [Case(lambda rng: [rng.standard_normal((9, 3, 5)).astype(np.float32),
                                     rng.standard_normal((2, 3, 5)).astype(np.float32)],
                        {"start": 4}, threshold=0.0)],
    "slice_rows": [Case(_normal(9, 7), {"start": 2, "stop": 6}, threshold=0.0)],
    "matmul_quant": [Case(_quantized_matmul(q), {"qtype": q, "k": 64}, threshold=NMSE_LONG)
                     for q in (0, 1, 2, 3, 8)]
    + [Case(_quantized_matmul(q, 70, 37), {"qtype": q, "k": 64}, threshold=NMSE_LONG)
       for q in (3, 8)],
    "embedding_quant": [Case(_quantized_embedding(q), {"qtype": q, "k": 64}, threshold=0.0)
                        for q in (3, 8)],
    "rmsnorm_matmul_quant": [Case(_with_gain(_quantized_matmul(q)), {"qtype": q, "k": 64},
                                  threshold=NMSE_LONG) for q in (3, 8)],
    "rmsnorm_glu_quant": [Case(_with_gain(_quantized_matmul(q, 26)),
                               {"qtype": q, "k": 64, "activation": act}, threshold=NMSE_LONG)
                          for q, act in ((3, "silu"), (8, "silu"), (8, "gelu_tanh"))]
    + [Case(_with_gain(_quantized_matmul(3, 70, 37)), {"qtype": 3, "k": 64}, threshold=NMSE_LONG)],
    "qk_norm": [Case(lambda rng: [rng.standard_normal((3, 64)).astype(np.float32),
                                  (1.0 + 0.3 * rng.standard_normal(8)).astype(np.float32),
                                  (1.0 + 0.3 * rng.standard_normal(8)).astype(np.float32)],
                     {"n_heads": 4, "n_kv_heads": 2})],
    "matmul_quant_add": [Case(lambda rng: [*_quantized_matmul(3)(rng),
                                           rng.standard_normal((3, 13)).astype(np.float32)],
                              {"qtype": 3, "k": 64}, threshold=NMSE_LONG)],
    "matmul_f16": [Case(lambda rng: [rng.standard_normal((5, 6)).astype(np.float16),
                                     rng.standard_normal((6, 7)).astype(np.float16)],
                        threshold=NMSE_LONG),
                   Case(lambda rng: [rng.standard_normal((3, 8)).astype(np.float16),
                                     rng.standard_normal((4, 8)).astype(np.float16)],
                        {"transpose_b": True}, threshold=NMSE_LONG)],
    # an odd head dimension: a row's values straddle the packed u32 words
    "attention_f16": [Case(lambda rng: [rng.standard_normal((7, 4, 15)).astype(np.float16),
                                        rng.standard_normal((9, 2, 15)).astype(np.float16),
                                        rng.standard_normal((9, 2, 15)).astype(np.float16)],
                           {"causal": True}, threshold=NMSE_LONG),
                      Case(lambda rng: [rng.standard_normal((5, 2, 16)).astype(np.float16),
                                        rng.standard_normal((3, 2, 16)).astype(np.float16),
                                        rng.standard_normal((3, 2, 16)).astype(np.float16)],
                           {"causal": False}, threshold=NMSE_LONG)],
    "concat_columns": [Case(lambda rng: [rng.standard_normal((5, 7)).astype(np.float32),
                                         rng.standard_normal((5, 4)).astype(np.float32)],
                            threshold=0.0)],
    # one range; a cache longer than one range (64 keys): ranges + combine; a prompt of 40
    # tokens after 30 (attention_prompt.wgsl)
    "attention_cached": [Case(_cached_attention(tokens, n_ctx, pos), {"n_heads": 4},
                              threshold=NMSE_LONG) for tokens, n_ctx, pos in ((3, 11, 5),
                                                                              (2, 300, 290),
                                                                              (40, 90, 30))]
    # Gemma 2's and Phi-3's extras: a window, capped scores, scaled RoPE
    + [Case(_cached_attention(2, 300, 290),
            {"n_heads": 4, "window": 100, "softcap": 2.0, "style": "neox",
             "freq_factors": (1.0, 2.0, 4.0, 8.0), "attn_factor": 1.1}, threshold=NMSE_LONG)],
    # two tokens in one range; one token (decoding) whose ranges the product merges
    "attention_cached_matmul_quant_add": [
        Case(_projected_attention(tokens, n_ctx, pos), {"n_heads": 4, "qtype": 3, "k": 32},
             threshold=NMSE_LONG) for tokens, n_ctx, pos in ((2, 11, 5), (1, 300, 290))],
    "greedy_step": [Case(lambda rng: [rng.standard_normal(333).astype(np.float32),
                                      np.array([7, 4], np.int32)], threshold=0.0)],
    # two chunks of the first pass; history slot 4 % 2
    "sample_step": [Case(lambda rng: [rng.standard_normal(4500).astype(np.float32),
                                      np.array([7, 4, -1, -1], np.int32),
                                      np.array([0.8, 1234, 9], np.float32)], threshold=0.0)],
})

#: Larger inputs for the in-browser benchmark: (op, make, params, flops, bytes moved).
BENCHMARKS: dict[str, Case] = {
    "add": Case(lambda rng: [rng.standard_normal(1 << 18).astype(np.float32) for _ in range(2)],
                flops=lambda xs: xs[0].size, bytes_moved=lambda xs: 12.0 * xs[0].size),
    "gelu": Case(_normal(1 << 18), flops=lambda xs: 20.0 * xs[0].size,
                 bytes_moved=lambda xs: 8.0 * xs[0].size),
    "softmax": Case(_normal(256, 1024), flops=lambda xs: 5.0 * xs[0].size,
                    bytes_moved=lambda xs: 8.0 * xs[0].size),
    "sum": Case(_normal(1 << 18), flops=lambda xs: xs[0].size,
                bytes_moved=lambda xs: 4.0 * xs[0].size),
    "matmul": Case(lambda rng: [rng.standard_normal((256, 256)).astype(np.float32) for _ in range(2)],
                   flops=lambda xs: 2.0 * xs[0].shape[0] * xs[0].shape[1] * xs[1].shape[1],
                   bytes_moved=lambda xs: 4.0 * (xs[0].size + xs[1].size + xs[0].shape[0] * xs[1].shape[1])),
}


def random_program(seed: int) -> np.ndarray:
    """A random valid pxVM program exercising every executable opcode: noise everywhere
    but in the instruction row, dot products and adds over random rows, and an int8
    matmul -> bias -> requantize -> relu -> argmax chain on random matrices."""
    rng = np.random.default_rng(seed)
    w = int(rng.integers(24, 40))
    m, k, n = (int(v) for v in rng.integers(2, 7, 3))

    def vals(count, lo, hi):
        return " ".join(str(int(v)) for v in rng.integers(lo, hi, count))

    # rows 1..8 vectors; matrices from row 10 on, each in its own block of rows
    rows_needed = lambda size: -(-size // (w - 1))  # noqa: E731
    a_row = 10
    b_row = a_row + rows_needed(m * k)
    c_row = b_row + rows_needed(k * n)
    bias_row = c_row + rows_needed(m * n)
    q_row = bias_row + rows_needed(n)
    out_row = q_row + 1
    arg_row = out_row + rows_needed(m * n)
    height = arg_row + rows_needed(m) + 2
    lines = [f".size {w} {height}"]
    for _ in range(int(rng.integers(2, 5))):
        ra, rb, ro = rng.integers(1, 9, 3)
        lines.append(f"{rng.choice(['DOT_RGB', 'ADD'])} {ra} {rb} {ro}")
    lines += [f"MATMUL_I8 {a_row} {b_row} {c_row}", f"BIAS_I32 {c_row} {bias_row}",
              f"REQUANT {c_row} {q_row} {out_row}", f"RELU_I8 {out_row}",
              f"MATMUL_I8 {a_row} {b_row} {c_row}", f"ARGMAX_I32 {c_row} {arg_row}", "HALT"]
    for y in range(1, 9):
        lines.append(f".vector {y} {vals(w, 0, 256)}")
    lines.append(f".matrix {a_row} {m} {k} {vals(m * k, -128, 128)}")
    lines.append(f".matrix {b_row} {k} {n} {vals(k * n, -128, 128)}")
    lines.append(f".matrix32 {c_row} {m} {n} {vals(m * n, 0, 1)}")
    lines.append(f".matrix32 {bias_row} 1 {n} {vals(n, -5000, 5000)}")
    lines.append(f".requant {q_row} {int(rng.integers(1, 1 << 15))} {int(rng.integers(8, 20))} "
                 f"{int(rng.integers(-20, 20))}")
    img = assemble("\n".join(lines))
    # random G/B/A noise in the vector rows: the executors must leave or use it identically
    img[1:9, :, 1:] = rng.integers(0, 256, (8, w, 3), dtype=np.uint8)
    return img
