"""Reductions (reduce.wgsl): sum, max and dot over all elements, argmax (flat or per
row), and decoding's steps: greedy (argmax into a state tensor, advancing its position)
and sampling (the argmax of logits / temperature plus Gumbel noise from a counter-based
hash, so the draw is made on the device and is the same on every backend).
Two passes for any length: bounded workgroups reduce grid-strided shares, then one
workgroup reduces the partials; both passes are recorded in the same submit."""

from __future__ import annotations

import numpy as np

from .registry import meta, register, require

KERNEL = "reduce.wgsl"
WG = 256
MAX_GROUPS = 1024
ARGMAX_CHUNK = 4096  # elements per workgroup in the first pass of a flat argmax


def sum_ref(x):
    """Sum of all elements (float64 accumulation, returned as f32)."""
    return np.float32(np.sum(np.asarray(x, np.float64)))


def max_ref(x):
    """Largest element; NaN if any element is NaN (numpy semantics)."""
    return np.float32(np.max(np.asarray(x, np.float32)))


def dot_ref(a, b):
    """Dot product of two 1-D vectors (float64 accumulation, returned as f32)."""
    return np.float32(np.dot(np.asarray(a, np.float64), np.asarray(b, np.float64)))


def argmax_ref(x, axis=None):
    """numpy.argmax as int32: flat index (axis=None) or per row of the last axis (-1);
    ties pick the first index and the first NaN wins."""
    return np.asarray(np.argmax(np.asarray(x, np.float32), axis=axis), dtype=np.int32)


def _nonempty(x, name):
    require(int(np.prod(x.shape, dtype=np.int64)) > 0,
            f"{name} of an empty tensor is undefined; pass at least one element")


def _infer_full(x):
    _nonempty(x, "reduction")
    return meta((), np.float32)


def _infer_dot(a, b):
    require(len(a.shape) == 1 and len(b.shape) == 1,
            f"dot takes two 1-D vectors, got shapes {tuple(a.shape)} and {tuple(b.shape)}")
    require(a.shape == b.shape,
            f"dot needs vectors of equal length, got {a.shape[0]} and {b.shape[0]}")
    _nonempty(a, "dot")
    return meta((), np.float32)


def _infer_argmax(x, axis=None):
    _nonempty(x, "argmax")
    require(axis in (None, -1, len(x.shape) - 1),
            f"argmax supports axis=None (flat) or axis=-1 (last axis), got axis={axis}")
    if axis is None:
        return meta((), np.int32)
    require(x.shape[-1] > 0, "argmax over an empty last axis is undefined")
    return meta(tuple(x.shape[:-1]), np.int32)


def _reduce_gpu(op_code, x, y, ctx):
    n = x.size
    groups = min(MAX_GROUPS, (n + WG - 1) // WG)
    partials = ctx.empty((groups,), np.float32, "reduction partials")
    dummy_i = ctx.empty((1,), np.int32, "unused")
    ctx.dispatch(KERNEL, "partial", [x, y, partials, dummy_i], (n, 0, groups, 0), (groups, 1, 1),
                 {"OP": op_code})
    out = ctx.empty((), np.float32)
    ctx.dispatch(KERNEL, "finish", [partials, partials, out, dummy_i], (groups, 0, 1, 0), (1, 1, 1),
                 {"OP": 0 if op_code == 2 else op_code})
    return out


def sum_gpu(ctx, x):
    return _reduce_gpu(0, x, x, ctx)


def max_gpu(ctx, x):
    return _reduce_gpu(1, x, x, ctx)


def dot_gpu(ctx, a, b):
    return _reduce_gpu(2, a, b, ctx)


def greedy_step_ref(logits, state):
    """Greedy decoding's step on a state [token, position, history...] (int32), in place:
    token = argmax(logits) (flat, first maximum), also written to
    history[position % len(history)] when there is a history, then position += 1.
    Returns state. The history keeps the tokens of several steps run back to back."""
    token = argmax_ref(logits)
    state[0] = token
    history = len(state) - 2
    if history > 0:
        state[2 + int(state[1]) % history] = token
    state[1] += 1
    return state


def _pcg_hash(v: np.ndarray) -> np.ndarray:
    """PCG's output hash of uint32 values (reduce.wgsl's pcg_hash)."""
    v = np.asarray(v, np.uint32)
    with np.errstate(over="ignore"):  # uint32 arithmetic wraps, as in WGSL
        state = v * np.uint32(747796405) + np.uint32(2891336453)
        word = ((state >> ((state >> np.uint32(28)) + np.uint32(4))) ^ state) * np.uint32(277803737)
    return (word >> np.uint32(22)) ^ word


def gumbel_noise(seed: int, counter: int, n: int) -> np.ndarray:
    """float32 Gumbel noise -log(-log(u)) for elements 0..n-1, u in (0, 1) from 24 bits of
    hash(seed, counter, index): the noise the sampling step adds on every backend."""
    inner = _pcg_hash(np.uint32(counter) ^ _pcg_hash(np.uint32(seed)))
    h = _pcg_hash(np.arange(n, dtype=np.uint32) ^ inner)
    u = ((h >> np.uint32(8)).astype(np.float32) + np.float32(0.5)) * np.float32(1.0 / 16777216.0)
    return -np.log(-np.log(u))


def sampled_logits(logits, temperature: float, seed: int, counter: int) -> np.ndarray:
    """logits / temperature + Gumbel noise (flat, float32): their argmax is a draw from
    softmax(logits / temperature). Temperature 0: the logits themselves (greedy)."""
    z = np.asarray(logits, np.float32).reshape(-1)
    if temperature <= 0:
        return z
    return z / np.float32(temperature) + gumbel_noise(seed, counter, z.size)


def sample_step_ref(logits, state, sampler):
    """Sampled decoding's step: as greedy_step on the argmax of
    sampled_logits(logits, temperature, seed, counter) for the sampler [temperature,
    seed, counter] (float32; seed and counter whole numbers below 2^24), whose counter
    then advances by one. Returns state."""
    temperature, seed, counter = (float(v) for v in np.asarray(sampler)[:3])
    greedy_step_ref(sampled_logits(logits, temperature, int(seed), int(counter)), state)
    sampler[2] += 1
    return state


def _infer_sample(logits, state, sampler):
    require(np.dtype(sampler.dtype) == np.float32 and tuple(sampler.shape) == (3,),
            "sample_step: the sampler must be a float32 tensor [temperature, seed, counter]")
    return _infer_greedy(logits, state)


def sample_step_gpu(ctx, logits, state, sampler):
    _flat_argmax(ctx, logits, state, advance=True, sampler=sampler)
    return state


def _infer_greedy(logits, state):
    _nonempty(logits, "greedy_step")
    require(np.dtype(state.dtype) == np.int32 and len(state.shape) == 1 and state.shape[0] >= 2,
            "greedy_step: state must be a 1-D int32 tensor [token, position, ...]")
    return meta(state.shape, np.int32)


def greedy_step_gpu(ctx, logits, state):
    _flat_argmax(ctx, logits, state, advance=True)
    return state


def _flat_argmax(ctx, x, out, advance=False, sampler=None):
    n = x.size
    chunks = (n + ARGMAX_CHUNK - 1) // ARGMAX_CHUNK
    values = ctx.empty((chunks,), np.float32, "chunk maxima")
    indices = ctx.empty((chunks,), np.int32, "chunk argmax")
    sample = {"SAMPLE": int(sampler is not None)}
    ctx.dispatch(KERNEL, "argmax_rows", [x, x if sampler is None else sampler, values, indices],
                 (n, ARGMAX_CHUNK, 0, 0), chunks, sample)
    if sampler is None:
        sampler = ctx.empty((1,), np.float32, "unused")
    history = out.size - 2 if advance else 0
    ctx.dispatch(KERNEL, "argmax_finish", [values, indices, sampler, out],
                 (chunks, ARGMAX_CHUNK, 0, history), (1, 1, 1),
                 {"ADVANCE": int(advance), **sample})


def argmax_gpu(ctx, x, axis=None):
    n = x.size
    if axis is not None:
        row_len = x.shape[-1]
        rows = n // row_len
        values = ctx.empty((rows,), np.float32, "row maxima")
        out = ctx.empty(x.shape[:-1], np.int32)
        ctx.dispatch(KERNEL, "argmax_rows", [x, x, values, out], (n, row_len, 0, 0), rows)
        return out
    out = ctx.empty((), np.int32)
    _flat_argmax(ctx, x, out)
    return out


sum = register("sum", 1, sum_ref, sum_gpu, _infer_full)  # noqa: A001 - numpy's name
max = register("max", 1, max_ref, max_gpu, _infer_full)  # noqa: A001
dot = register("dot", 2, dot_ref, dot_gpu, _infer_dot)
argmax = register("argmax", 1, argmax_ref, argmax_gpu, _infer_argmax)
greedy_step = register("greedy_step", 2, greedy_step_ref, greedy_step_gpu, _infer_greedy,
                       input_dtypes=("f32", "i32"))
sample_step = register("sample_step", 3, sample_step_ref, sample_step_gpu, _infer_sample,
                       input_dtypes=("f32", "i32", "f32"))
