"""Test support: numpy quantize / dequantize of GGUF block formats (F32, F16, BF16, Q8_0,
Q4_0, Q4_1, Q5_0, Q5_1; the K formats dequantize only, plus random valid blocks): the byte
layouts the WGSL kernels read, written out plainly so tests can check them against the
`gguf` package's own code and build small model files."""

from __future__ import annotations

import numpy as np

# GGML type name -> (values per block, bytes per block)
FORMATS = {"F32": (1, 4), "F16": (1, 2), "BF16": (1, 2), "Q4_0": (32, 18), "Q4_1": (32, 20),
           "Q5_0": (32, 22), "Q5_1": (32, 24), "Q8_0": (32, 34), "Q2_K": (256, 84),
           "Q3_K": (256, 110), "Q4_K": (256, 144), "Q5_K": (256, 176), "Q6_K": (256, 210)}


def row_bytes(qtype: str, k: int) -> int:
    per, size = FORMATS[qtype]
    return k // per * size


def _blocks(raw: np.ndarray, qtype: str) -> np.ndarray:
    _, size = FORMATS[qtype]
    return np.ascontiguousarray(raw, np.uint8).reshape(-1, size)


def _nibbles(q: np.ndarray) -> np.ndarray:
    """(B, 16) bytes -> (B, 32) values: low nibbles are values 0..15, high ones 16..31."""
    return np.concatenate([q & 15, q >> 4], axis=1)


def dequantize(raw: np.ndarray, qtype: str, k: int) -> np.ndarray:
    """Raw GGUF rows (N, row_bytes) uint8 -> (N, K) float32."""
    raw = np.ascontiguousarray(raw, np.uint8)
    n = raw.size // row_bytes(qtype, k)
    if qtype == "F32":
        return raw.view(np.float32).reshape(n, k).copy()
    if qtype == "F16":
        return raw.view(np.float16).astype(np.float32).reshape(n, k)
    if qtype == "BF16":  # bfloat16: the high 16 bits of a float32
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(n, k)
    b = _blocks(raw, qtype)
    d = b[:, 0:2].copy().view(np.float16).astype(np.float32)
    if qtype == "Q8_0":
        vals = d * b[:, 2:].view(np.int8).astype(np.float32)
    elif qtype == "Q4_0":
        vals = d * (_nibbles(b[:, 2:]).astype(np.float32) - 8.0)
    elif qtype == "Q5_0":
        # Q5_0: 4 bytes of fifth bits (bit j of the little-endian word: value j), then
        # nibbles as Q4_0; w = d * (q - 16)
        fifth = (b[:, 2:6].copy().view("<u4") >> np.arange(32, dtype=np.uint32)) & 1
        vals = d * ((_nibbles(b[:, 6:]) | (fifth << 4)).astype(np.float32) - 16.0)
    elif qtype == "Q5_1":
        # Q5_1: f16 d, f16 m, fifth bits as Q5_0, then nibbles; w = d * q + m
        m = b[:, 2:4].copy().view(np.float16).astype(np.float32)
        fifth = (b[:, 4:8].copy().view("<u4") >> np.arange(32, dtype=np.uint32)) & 1
        vals = d * (_nibbles(b[:, 8:]) | (fifth << 4)).astype(np.float32) + m
    elif qtype == "Q4_1":
        m = b[:, 2:4].copy().view(np.float16).astype(np.float32)
        vals = d * _nibbles(b[:, 4:]).astype(np.float32) + m
    elif qtype == "Q2_K":
        vals = _dequantize_q2_k(b)
    elif qtype == "Q3_K":
        vals = _dequantize_q3_k(b)
    elif qtype == "Q4_K":
        vals = _dequantize_q4_k(b)
    elif qtype == "Q5_K":
        vals = _dequantize_q5_k(b)
    elif qtype == "Q6_K":
        vals = _dequantize_q6_k(b)
    else:
        raise ValueError(f"no dequantizer for GGML type {qtype}")
    return vals.reshape(n, k).astype(np.float32)


def _k_scales(sc: np.ndarray):
    """Q4_K's 12 scale bytes -> 8 six-bit (scale, min) pairs, one per 32-value sub-block."""
    sc = sc.astype(np.uint8)
    scale = np.concatenate([sc[:, 0:4] & 63, (sc[:, 8:12] & 15) | ((sc[:, 0:4] >> 6) << 4)], 1)
    mins = np.concatenate([sc[:, 4:8] & 63, (sc[:, 8:12] >> 4) | ((sc[:, 4:8] >> 6) << 4)], 1)
    return scale.astype(np.float32), mins.astype(np.float32)


def _dequantize_q4_k(b: np.ndarray) -> np.ndarray:
    """Q4_K super-block (256 values): f16 d, f16 dmin, 12 scale bytes, 128 nibble bytes;
    each 64 values take 32 bytes, low nibbles first; w = d * scale * q - dmin * min."""
    d = b[:, 0:2].copy().view(np.float16).astype(np.float32)
    dmin = b[:, 2:4].copy().view(np.float16).astype(np.float32)
    scale, mins = _k_scales(b[:, 4:16])
    qs = b[:, 16:144].reshape(-1, 4, 32)
    q = np.stack([qs & 15, qs >> 4], axis=2).reshape(-1, 8, 32).astype(np.float32)
    return (d[:, :, None] * scale[:, :, None] * q - dmin[:, :, None] * mins[:, :, None])


def _dequantize_q6_k(b: np.ndarray) -> np.ndarray:
    """Q6_K super-block (256 values): 128 low-nibble bytes, 64 bytes of 2-bit highs, 16 int8
    scales (one per 16 values), f16 d; w = d * scale * (q - 32)."""
    ql = b[:, 0:128].reshape(-1, 2, 64)
    qh = b[:, 128:192].reshape(-1, 2, 32)
    scales = b[:, 192:208].view(np.int8).astype(np.float32)
    d = b[:, 208:210].copy().view(np.float16).astype(np.float32)
    parts = [(ql[:, :, :32] & 15) | ((qh & 3) << 4),
             (ql[:, :, 32:] & 15) | (((qh >> 2) & 3) << 4),
             (ql[:, :, :32] >> 4) | (((qh >> 4) & 3) << 4),
             (ql[:, :, 32:] >> 4) | (((qh >> 6) & 3) << 4)]
    q = np.stack(parts, axis=2).reshape(-1, 256).astype(np.float32) - 32.0
    return d * np.repeat(scales, 16, axis=1) * q


def _two_bit_values(qs: np.ndarray) -> np.ndarray:
    """Q2_K / Q3_K's 64 bytes of 2-bit values -> 256: each 128 values take 32 bytes, the
    bit pairs 0-1 of them first, then 2-3, 4-5, 6-7."""
    qs = qs.reshape(-1, 2, 32)
    return np.stack([(qs >> s) & 3 for s in (0, 2, 4, 6)], axis=2).reshape(-1, 256)


def _dequantize_q2_k(b: np.ndarray) -> np.ndarray:
    """Q2_K super-block (256 values): 16 bytes of (4-bit scale, 4-bit min) per 16 values,
    64 bytes of 2-bit values, f16 d, f16 dmin; w = d * scale * q - dmin * min."""
    d = b[:, 80:82].copy().view(np.float16).astype(np.float32)
    dmin = b[:, 82:84].copy().view(np.float16).astype(np.float32)
    scale = np.repeat((b[:, 0:16] & 15).astype(np.float32), 16, axis=1)
    mins = np.repeat((b[:, 0:16] >> 4).astype(np.float32), 16, axis=1)
    return d * scale * _two_bit_values(b[:, 16:80]).astype(np.float32) - dmin * mins


def _dequantize_q3_k(b: np.ndarray) -> np.ndarray:
    """Q3_K super-block (256 values): 32 bytes of high bits (bit i of byte l: value 32 i
    + l), 64 bytes of 2-bit values as Q2_K, 12 bytes of 6-bit scales, f16 d; w = d *
    (scale - 32) * (q - 4 where the high bit is clear)."""
    d = b[:, 108:110].copy().view(np.float16).astype(np.float32)
    high = np.stack([(b[:, 0:32] >> i) & 1 for i in range(8)], axis=1).reshape(-1, 256)
    q = _two_bit_values(b[:, 32:96]).astype(np.float32) - 4.0 * (1 - high)
    sc = b[:, 96:108]
    # scale i: its low 4 bits from byte i % 8 (high nibble for i >= 8), its top 2 bits
    # from byte 8 + i % 4 (bit pair i // 4)
    low = np.concatenate([sc[:, 0:8] & 15, sc[:, 0:8] >> 4], axis=1)
    top = np.concatenate([(sc[:, 8:12] >> s) & 3 for s in (0, 2, 4, 6)], axis=1)
    scales = (low | (top << 4)).astype(np.float32) - 32.0
    return d * np.repeat(scales, 16, axis=1) * q


def _dequantize_q5_k(b: np.ndarray) -> np.ndarray:
    """Q5_K super-block (256 values): Q4_K's fields with 32 bytes of fifth bits between the
    scales and the nibbles (bit i of byte l: value 32 i + l); w = d * scale * q - dmin * min
    with q = nibble + 16 * fifth bit."""
    d = b[:, 0:2].copy().view(np.float16).astype(np.float32)
    dmin = b[:, 2:4].copy().view(np.float16).astype(np.float32)
    scale, mins = _k_scales(b[:, 4:16])
    qh = b[:, 16:48]
    qs = b[:, 48:176].reshape(-1, 4, 32)
    low = np.stack([qs & 15, qs >> 4], axis=2).reshape(-1, 256)          # value 64c + 32h + l
    fifth = np.stack([(qh >> i) & 1 for i in range(8)], axis=1).reshape(-1, 256)
    q = (low | (fifth << 4)).astype(np.float32)
    return d * np.repeat(scale, 32, axis=1) * q - dmin * np.repeat(mins, 32, axis=1)


def random_blocks(n: int, k: int, qtype: str, rng: np.random.Generator,
                  scale: float = 1.0) -> np.ndarray:
    """Valid raw rows (N, row_bytes) of random quants whose values are about `scale` in size
    (for formats with no quantizer here); scale fields are set to finite f16 values."""
    per, size = FORMATS[qtype]
    raw = rng.integers(0, 256, size=(n * (k // per), size), dtype=np.uint8)

    def f16_field(divisor):
        values = rng.uniform(0.5, 1.5, (len(raw), 1)) * scale / divisor
        return values.astype(np.float16).view(np.uint8)

    # divisors bring (6-bit or int8 sub-scale) x (quant level) back to about `scale`; in
    # the types with a min, dmin is half the top level's d so that the values' mean is
    # about 0 (a shared offset makes every row alike, and random models made of such rows
    # grow activations hundreds of times and amplify float32 rounding into wrong logits)
    if qtype in ("Q4_K", "Q5_K"):
        levels = 15 if qtype == "Q4_K" else 31
        raw[:, 0:2] = f16_field(levels * 40)   # d: times sub-scale <= 63, times q
        raw[:, 2:4] = f16_field(2 * 40)        # dmin: times min <= 63
    elif qtype == "Q2_K":
        raw[:, 80:82] = f16_field(3 * 15)      # d: times scale <= 15, times q <= 3
        raw[:, 82:84] = f16_field(2 * 15)      # dmin: times min <= 15
    elif qtype == "Q3_K":
        raw[:, 108:110] = f16_field(32 * 4)    # d: times scale - 32, times q - 4
    elif qtype == "Q6_K":
        raw[:, 208:210] = f16_field(32 * 128)  # d: times int8 scale, times q - 32
    else:
        raise ValueError(f"random_blocks is for the K formats, not GGML type {qtype}")
    return raw.reshape(n, row_bytes(qtype, k))


def _round_half_away(v: np.ndarray) -> np.ndarray:
    """C's roundf, as ggml rounds (numpy's round takes ties to even: 108.5 -> 108, where
    ggml and the gguf package write 109)."""
    a = np.abs(v)
    whole = np.floor(a)
    return np.sign(v) * (whole + np.floor(2 * (a - whole)))


def quantize(x: np.ndarray, qtype: str) -> np.ndarray:
    """(N, K) float -> raw GGUF rows (N, row_bytes) uint8, rounding as ggml's reference
    quantizers do (nearest level; Q4_0 scales by the signed extreme / -8)."""
    x = np.asarray(x, np.float32)
    n, k = x.shape
    if qtype == "F32":
        return x.copy().view(np.uint8).reshape(n, -1)
    if qtype == "F16":
        return x.astype(np.float16).view(np.uint8).reshape(n, -1)
    if qtype == "BF16":  # round to nearest even on the dropped 16 bits (finite values)
        bits = x.view(np.uint32).astype(np.uint64)
        rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
        return rounded.astype(np.uint16).view(np.uint8).reshape(n, -1)
    blocks = x.reshape(-1, 32)
    if qtype == "Q8_0":
        d = np.abs(blocks).max(axis=1, keepdims=True) / 127.0
        inv = np.divide(1.0, d, out=np.zeros_like(d), where=d != 0)
        q = _round_half_away(blocks * inv).astype(np.int8).view(np.uint8)
        head = [d.astype(np.float16).view(np.uint8)]
    elif qtype == "Q4_0":
        idx = np.abs(blocks).argmax(axis=1)
        extreme = blocks[np.arange(len(blocks)), idx][:, None]
        d = extreme / -8.0
        inv = np.divide(1.0, d, out=np.zeros_like(d), where=d != 0)
        q = np.minimum(15, np.trunc(blocks * inv + 8.5)).astype(np.uint8)
        q = q[:, :16] | (q[:, 16:] << 4)
        head = [d.astype(np.float16).view(np.uint8)]
    elif qtype == "Q4_1":
        lo = blocks.min(axis=1, keepdims=True)
        d = (blocks.max(axis=1, keepdims=True) - lo) / 15.0
        inv = np.divide(1.0, d, out=np.zeros_like(d), where=d != 0)
        q = np.minimum(15, np.trunc((blocks - lo) * inv + 0.5)).astype(np.uint8)
        q = q[:, :16] | (q[:, 16:] << 4)
        head = [d.astype(np.float16).view(np.uint8), lo.astype(np.float16).view(np.uint8)]
    elif qtype == "Q5_0":
        # as ggml: d = the signed extreme / -16, q = trunc(x / d + 16.5) clamped to 31
        idx = np.abs(blocks).argmax(axis=1)
        d = blocks[np.arange(len(blocks)), idx][:, None] / -16.0
        inv = np.divide(1.0, d, out=np.zeros_like(d), where=d != 0)
        q5 = np.minimum(31, np.trunc(blocks * inv + 16.5)).astype(np.uint32)
        fifth = ((q5 >> 4) << np.arange(32, dtype=np.uint32)).sum(axis=1, dtype=np.uint32)
        q = (q5[:, :16] & 15) | ((q5[:, 16:] & 15) << 4)
        head = [d.astype(np.float16).view(np.uint8),
                fifth.astype("<u4").view(np.uint8).reshape(-1, 4)]
        q = q.astype(np.uint8)
    elif qtype == "Q5_1":
        # as ggml: d = (max - min) / 31, q = trunc((x - min) / d + 0.5) clamped to 31
        lo = blocks.min(axis=1, keepdims=True)
        d = (blocks.max(axis=1, keepdims=True) - lo) / 31.0
        inv = np.divide(1.0, d, out=np.zeros_like(d), where=d != 0)
        q5 = np.minimum(31, np.trunc((blocks - lo) * inv + 0.5)).astype(np.uint32)
        fifth = ((q5 >> 4) << np.arange(32, dtype=np.uint32)).sum(axis=1, dtype=np.uint32)
        q = ((q5[:, :16] & 15) | ((q5[:, 16:] & 15) << 4)).astype(np.uint8)
        head = [d.astype(np.float16).view(np.uint8), lo.astype(np.float16).view(np.uint8),
                fifth.astype("<u4").view(np.uint8).reshape(-1, 4)]
    else:
        raise ValueError(f"no quantizer for GGML type {qtype}")
    return np.concatenate(head + [q], axis=1).reshape(n, row_bytes(qtype, k))
