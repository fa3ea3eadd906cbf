"""Row-wise ops over the last axis: softmax and log_softmax, rmsnorm and layer_norm, and
the rotary position embedding (rope), with the table of rotations its kernels read
(`rope_table`)."""

from __future__ import annotations

import math
import weakref

import numpy as np

from .registry import meta, op, require

ROPE_STYLES = ("interleaved", "neox")


# ---- shapes ---------------------------------------------------------------------------
def _rows(x, name):
    require(len(x.shape) >= 1 and x.shape[-1] > 0,
            f"{name} needs at least one element in the last axis, got shape {tuple(x.shape)}")


def row_count(x) -> int:
    """Rows of x: its elements over the last axis' length."""
    return int(np.prod(x.shape[:-1], dtype=np.int64)) if len(x.shape) > 1 else 1


def _infer_softmax(x):
    _rows(x, "softmax")
    return meta(x.shape, np.float32)


def _check_vector(v, x, what):
    require(tuple(v.shape) == (x.shape[-1],),
            f"{what} must have shape ({x.shape[-1]},) to match the last axis of x "
            f"{tuple(x.shape)}, got {tuple(v.shape)}")


def _infer_rmsnorm(x, weight, eps=1e-6):
    _rows(x, "rmsnorm")
    _check_vector(weight, x, "rmsnorm weight")
    return meta(x.shape, np.float32)


def _infer_layer_norm(x, weight, bias, eps=1e-5):
    _rows(x, "layer_norm")
    _check_vector(weight, x, "layer_norm weight")
    _check_vector(bias, x, "layer_norm bias")
    return meta(x.shape, np.float32)


def check_rope(head_dim, style, freq_factors, attn_factor) -> None:
    """The rotary embedding's parameters, checked for a head of `head_dim`."""
    require(style in ROPE_STYLES, f"rope style must be one of {ROPE_STYLES}, got {style!r}")
    if freq_factors is not None:
        factors = np.asarray(freq_factors, np.float64)
        require(factors.shape == (head_dim // 2,),
                f"rope freq_factors must hold head_dim / 2 = {head_dim // 2} values, got "
                f"{factors.shape[0] if factors.ndim == 1 else factors.shape}")
        require(bool(np.all(np.isfinite(factors) & (factors > 0))),
                "rope freq_factors must be finite and above 0")
    require(math.isfinite(attn_factor) and attn_factor > 0,
            f"rope attn_factor must be finite and above 0, got {attn_factor}")


def _infer_rope(x, pos_offset=0, theta=10000.0, style="interleaved", freq_factors=None,
                attn_factor=1.0):
    require(len(x.shape) == 3, f"rope takes x of shape (seq, heads, head_dim), got {tuple(x.shape)}")
    require(x.shape[2] % 2 == 0, f"rope needs an even head_dim, got {x.shape[2]}")
    check_rope(x.shape[2], style, freq_factors, attn_factor)
    require(int(pos_offset) >= 0, f"pos_offset must be >= 0, got {pos_offset}")
    return meta(x.shape, np.float32)


# ---- the rotation table ----------------------------------------------------------
# (backend) -> {(theta, head_dim, factors, attn_factor): (table tensor, positions covered)};
# tables stay resident.
_rope_tables: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def rope_table(ctx, theta, head_dim, needed, freq_factors=None, attn_factor=1.0):
    """The resident (positions, head_dim/2, [cos, sin]) f32 table of this backend covering
    at least `needed` positions, computed in float64 on the host: rope_angles' angles,
    cos and sin times `attn_factor`."""
    tables = _rope_tables.setdefault(ctx.backend, {})
    factors = None if freq_factors is None else tuple(float(f) for f in freq_factors)
    key = (float(theta), int(head_dim), factors, float(attn_factor))
    found = tables.get(key)
    if found is None or found[1] < needed:
        n = max(1024, 1 << (int(needed) - 1).bit_length())
        ang = rope_angles(n, head_dim, theta, freq_factors=factors)
        table = (np.stack([np.cos(ang), np.sin(ang)], axis=-1) * attn_factor).astype(np.float32)
        found = (ctx.tensor(table), n)
        tables[key] = found
    return found[0]


@op(infer=_infer_softmax)
def softmax(x, *, backend="auto"):
    """exp(x - max) / sum(exp(x - max)) over the last axis."""
    x = np.asarray(x, np.float64)
    e = np.exp(x - np.max(x, axis=-1, keepdims=True))
    return (e / np.sum(e, axis=-1, keepdims=True)).astype(np.float32)


@op(infer=_infer_softmax)
def log_softmax(x, *, backend="auto"):
    """x - max - log(sum(exp(x - max))) over the last axis."""
    x = np.asarray(x, np.float64)
    d = x - np.max(x, axis=-1, keepdims=True)
    return (d - np.log(np.sum(np.exp(d), axis=-1, keepdims=True))).astype(np.float32)


@op(infer=_infer_rmsnorm)
def rmsnorm(x, weight, eps=1e-6, *, backend="auto"):
    """x / sqrt(mean(x^2) + eps) * weight over the last axis."""
    x = np.asarray(x, np.float64)
    scale = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return (x * scale * np.asarray(weight, np.float64)).astype(np.float32)


@op(infer=_infer_layer_norm)
def layer_norm(x, weight, bias, eps=1e-5, *, backend="auto"):
    """(x - mean) / sqrt(var + eps) * weight + bias over the last axis."""
    x = np.asarray(x, np.float64)
    mean = np.mean(x, axis=-1, keepdims=True)
    var = np.mean((x - mean) ** 2, axis=-1, keepdims=True)
    out = (x - mean) / np.sqrt(var + eps) * np.asarray(weight, np.float64) + np.asarray(bias, np.float64)
    return out.astype(np.float32)


def rope_angles(n_positions: int, head_dim: int, theta: float, start: int = 0,
                freq_factors=None) -> np.ndarray:
    """Angles (positions, head_dim/2) in float64: pos * theta^(-2i/head_dim) / factor_i,
    the factors (1 by default) being how Llama 3's frequency scaling, Phi-3's LongRoPE and
    linear scaling slow the pairs' rotation down."""
    inv_freq = theta ** (-np.arange(0, head_dim, 2, dtype=np.float64) / head_dim)
    if freq_factors is not None:
        inv_freq = inv_freq / np.asarray(freq_factors, np.float64)
    return np.arange(start, start + n_positions, dtype=np.float64)[:, None] * inv_freq[None, :]


@op(infer=_infer_rope)
def rope(x, pos_offset=0, theta=10000.0, style="interleaved", freq_factors=None,
         attn_factor=1.0, *, backend="auto"):
    """Rotary embedding of x (seq, heads, head_dim) at positions pos_offset + row;
    style "interleaved" rotates (x[2i], x[2i+1]), "neox" rotates (x[i], x[i + d/2]).
    Pair i's frequency is divided by freq_factors[i] (default 1) and the result scaled
    by `attn_factor` (LongRoPE's, default 1)."""
    x = np.asarray(x, np.float64)
    seq, _, d = x.shape
    ang = rope_angles(seq, d, theta, pos_offset, freq_factors)[:, None, :]
    c, s = np.cos(ang) * attn_factor, np.sin(ang) * attn_factor
    if style == "neox":
        x0, x1 = x[..., : d // 2], x[..., d // 2:]
    else:
        x0, x1 = x[..., 0::2], x[..., 1::2]
    y0, y1 = x0 * c - x1 * s, x0 * s + x1 * c
    out = np.empty_like(x)
    if style == "neox":
        out[..., : d // 2], out[..., d // 2:] = y0, y1
    else:
        out[..., 0::2], out[..., 1::2] = y0, y1
    return out.astype(np.float32)
