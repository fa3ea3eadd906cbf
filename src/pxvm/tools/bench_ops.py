"""The op benchmark behind `pxvm bench ops`: pxvm's kernel time for each op and size on
one backend, next to numpy's and PyTorch's time for the same work, and pxvm's result
checked against the op's numpy reference (`op.reference`) in the same run.

A `BenchCase` says how to benchmark one op at a shape: its inputs, the work one run does
(FLOPs, or bytes moved for memory-bound ops), the numpy and torch code that does the
same work, and the NMSE a correct kernel stays under. `CASES` is the table of them;
`plan` picks cases and shapes, `run_case` times one, `environment` describes the
machine, `add_percent_of_copy` relates the rates in bytes to the copy's, `write_plot`
draws throughput against size.

Rates in bytes (memory-bound ops, quantized products) are also given as a percentage of
the copy bandwidth measured in the same run on the same backend: the `copy` case, bytes
read plus written per second by pxvm's slice_rows of a whole float32 tensor (pxvm's ops
have no copy op; that one copies every value once), 256 MiB and 1 GiB.

Times are medians of `repeats` runs after a warm-up, inputs already on the device. The
quantized products' runs each take another copy of their inputs (`cold_inputs`): a
weight of tens of MB would otherwise stay in a GPU's L2 from one run to the next, and the
rate would be the cache's, not the memory's that decoding reads weights from.
pxvm's: the GPU's own clock where the backend has one (WebGPU timestamp queries, CUDA
events around the batch's launches; readbacks are outside), else the host clock around
the op (the CPU backends). numpy's: the host clock. torch's: CUDA events on torch's GPU
when it has one, else the host clock around torch on the CPU.

Its length is the CASES table: one entry per op family with its peers' code, which reads
best side by side; the machinery around it is short.
"""

from __future__ import annotations

import itertools
import math
import platform
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from importlib import metadata

import numpy as np
from gguf import GGMLQuantizationType, quants

from .. import __version__
from ..backends.cuda import CudaBackend
from ..backends.webgpu import WebGPUBackend
from ..core import Backend
from ..batch import Batch
from ..core import tuning
from ..ops import REGISTRY
from ..ops.quant_types import dequantize, quant_type
from ..core.errors import PxvmError

#: Row length of the row-wise ops (softmax, rmsnorm): an LLM's hidden size.
ROW = 4096
#: NMSE a correct float32 kernel stays well under; a wrong one lands near 1.
NMSE_LIMIT = 1e-5
#: float16 attention: probabilities rounded to float16 for the P.V product (the bound
#: the op's own tests hold it to)
NMSE_F16_ATTENTION = 5e-4
#: A host-timed peer (numpy, torch on the CPU) stops repeating past this many seconds.
HOST_PEER_BUDGET_S = 2.0
#: Host-timed warm-ups repeat short calls until they add up to this many seconds.
WARM_UP_S = 0.05
#: Heads of the attention cases: Llama-3-8B's (32 query heads of 128 over 8 key/value
#: heads); the prompt case is issue 17's fused-attention target shape.
ATTENTION_HEADS = (32, 8, 128)
QUICK_ATTENTION_HEADS = (4, 1, 64)
#: Bytes of distinct inputs a case with `cold_inputs` cycles through: more than a GPU's
#: last-level cache (an H100's or H200's L2 holds 50 MB), so that a run reads its inputs
#: from memory, not from the cache the runs before it filled
COLD_BYTES = 256 << 20


class Skip(Exception):
    """This case cannot run at this shape or on this backend; the message says why."""


# ---- timing -----------------------------------------------------------------------------

def median_time(fn: Callable[[], object], repeats: int, budget_s: float | None = None) -> float:
    """Median host time of `fn()` over `repeats` runs after a warm-up (compilation, pool
    fill): one run, and more while they add up to less than WARM_UP_S, since thread pools
    start over several calls (torch on the CPU ran its first few calls far slower than
    the rest). With `budget_s`, fewer runs where they would take longer than that."""
    spent = 0.0
    while True:
        t0 = time.perf_counter()
        fn()
        last = time.perf_counter() - t0
        spent += last
        if spent >= WARM_UP_S:
            break
    if budget_s is not None and last > 0:
        repeats = max(1, min(repeats, int(budget_s / last)))
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _wait(backend: Backend) -> None:
    """Block until the backend's submitted work is done (host-clock timing)."""
    if isinstance(backend, WebGPUBackend):
        backend.device.wait()
    elif isinstance(backend, CudaBackend):
        backend.device.synchronize()


def time_pxvm(backend: Backend, run: Callable[[], object], repeats: int):
    """(median seconds, clock, the last run's result as numpy) of `run()`, an op call on
    tensors of `backend`. GPU backends run it in a timed Batch (readbacks are not timed);
    where a WebGPU device has no timestamp-query, and on the CPU backends, the host clock
    times the call until its work is done."""
    samples, clock, got = [], None, None
    gpu = isinstance(backend, (WebGPUBackend, CudaBackend))
    for i in range(repeats + 1):
        t0 = time.perf_counter()
        if gpu:
            with Batch(backend, timestamps=True) as batch:
                out = run()
            batch.execute()
            _wait(backend)
            seconds = batch.device_seconds
            if seconds is None:
                seconds = time.perf_counter() - t0
                clock = "host clock (no timestamp-query)"
            else:
                clock = "CUDA events" if isinstance(backend, CudaBackend) else "GPU timestamps"
        else:
            out = run()
            seconds = time.perf_counter() - t0
            clock = "host clock"
        if i:  # the first run is the warm-up
            samples.append(seconds)
        if i == repeats:
            got = batch.read(out) if gpu else out.numpy()
    return statistics.median(samples), clock, got


class TorchPeer:
    """PyTorch as a timing peer: on its GPU when it has one (CUDA events, TF32 off so
    that float32 products are float32), else on the CPU (host clock), where float16
    cases run in float32 (CPUs have no fast float16 products)."""

    def __init__(self, torch):
        self.torch = torch
        self.on_gpu = bool(torch.cuda.is_available())
        self.device = "cuda" if self.on_gpu else "cpu"
        self.clock = "CUDA events" if self.on_gpu else "host clock"
        if self.on_gpu:
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False

    @property
    def version(self) -> str:
        return self.torch.__version__

    def describe(self) -> str:
        where = (f"{self.torch.cuda.get_device_name(0)}, CUDA events" if self.on_gpu
                 else "the CPU, host clock")
        return f"torch {self.version} on {where}"

    def tensor(self, array: np.ndarray):
        """`array` on torch's device; float16 becomes float32 on the CPU."""
        if array.dtype == np.float16 and not self.on_gpu:
            array = array.astype(np.float32)
        return self.torch.from_numpy(np.ascontiguousarray(array)).to(self.device)

    def time(self, fn: Callable[[], object], repeats: int) -> float:
        if not self.on_gpu:
            return median_time(fn, repeats, HOST_PEER_BUDGET_S)
        cuda = self.torch.cuda
        fn()
        cuda.synchronize()
        samples = []
        for _ in range(repeats):
            start, end = cuda.Event(enable_timing=True), cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end) / 1e3)
        return statistics.median(samples)


def torch_peer(enabled: bool = True) -> TorchPeer | None:
    """The torch peer, or None where torch is not installed (or not wanted)."""
    if not enabled:
        return None
    try:
        import torch
    except ImportError:
        return None
    return TorchPeer(torch)


# ---- the cases ----------------------------------------------------------------------------

Inputs = tuple[list[np.ndarray], dict]


@dataclass(frozen=True)
class BenchCase:
    """How to benchmark op `op` (a name in pxvm.ops.REGISTRY) at a shape."""

    name: str                                  # what --ops names
    op: str
    size_means: str                            # what one --sizes number is
    from_size: Callable[[int], tuple]          # a --sizes number -> a shape
    default: tuple                             # shapes timed without --sizes
    quick: tuple                               # ... with --quick
    label: Callable[[tuple], str]              # a shape, for the table
    make: Callable[[tuple, np.random.Generator], Inputs]   # inputs (host arrays), params
    work: Callable[[tuple], float]             # FLOPs or bytes one run does
    unit: str                                  # "FLOP" or "B"
    numpy_peer: Callable[[list, dict], Callable[[], object]]
    torch_peer: Callable[[TorchPeer, list, dict], Callable[[], object]] | None = None
    peer_note: str = ""                        # what the peers run, where not the same op
    nmse_limit: float = NMSE_LIMIT
    cold_inputs: bool = False                  # pxvm's runs take turns over copies (COLD_BYTES)


def _normal(rng, shape, dtype=np.float32) -> np.ndarray:
    return rng.standard_normal(shape, dtype=np.float32).astype(dtype, copy=False)


# matmul: shape (M, K, N)
def _matmul_inputs(shape, rng) -> Inputs:
    m, k, n = shape
    return [_normal(rng, (m, k)), _normal(rng, (k, n))], {}


def _matmul_f16_inputs(shape, rng) -> Inputs:
    m, k, n = shape  # B as (N, K): the layout the CUDA tensor-core kernel takes
    return [_normal(rng, (m, k), np.float16), _normal(rng, (n, k), np.float16)], \
        {"transpose_b": True}


#: LLM projection shapes (M, K, N) the matmul cases time, and what they are
PROJECTIONS = {(4096, 11008, 4096): "Llama-2-7B FFN down, 4096 tokens",
               (32, 576, 1536): "SmolLM2-135M FFN up, 32 tokens"}


def _matmul_label(shape) -> str:
    m, k, n = shape
    if m == k == n:
        return f"{m}x{k}x{n}"
    named = PROJECTIONS.get(tuple(shape))
    return f"M={m} K={k} N={n}" + (f" ({named})" if named else "")


def _matmul_flops(shape) -> float:
    m, k, n = shape
    return 2.0 * m * k * n


def _numpy_matmul(arrays, params):
    a, b = (x.astype(np.float32) for x in arrays)  # numpy's float16 products are not BLAS
    b = b.T if params.get("transpose_b") else b
    return lambda: a @ b


def _torch_matmul(peer, arrays, params):
    a, b = (peer.tensor(x) for x in arrays)
    b = b.t() if params.get("transpose_b") else b  # a transposed view: cuBLAS takes B^T
    return lambda: a @ b


# vectors: shape (n,)
def _elements_label(shape) -> str:
    return f"{shape[0]:,} elements"


def _one_input(shape, rng) -> Inputs:
    return [_normal(rng, shape)], {}


def _two_inputs(shape, rng) -> Inputs:
    return [_normal(rng, shape), _normal(rng, shape)], {}


def _numpy_silu(arrays, params):
    x, = arrays
    return lambda: x / (np.float32(1) + np.exp(-x))


def _torch_dot(peer, arrays, params):
    a, b = (peer.tensor(x) for x in arrays)
    return lambda: peer.torch.dot(a, b)


def _torch_add(peer, arrays, params):
    a, b = (peer.tensor(x) for x in arrays)
    return lambda: a + b


def _torch_silu(peer, arrays, params):
    x = peer.tensor(arrays[0])
    return lambda: peer.torch.nn.functional.silu(x)


# the device copy, the run's bandwidth reference: shape (rows, ROW) of float32
#: The case whose rate is the run's copy bandwidth (copy_bandwidth): every rate in bytes
#: is also given as a percentage of it
COPY = "copy"


def _copy_label(shape) -> str:
    rows, row = shape
    nbytes = 4 * rows * row
    size = (f"{nbytes >> 30} GiB" if nbytes % (1 << 30) == 0 else f"{nbytes / 2**20:,.4g} MiB")
    return f"{size} ({rows:,} rows of {row})"


def _numpy_copy(arrays, params):
    x, = arrays
    out = np.empty_like(x)  # made once: the copy is timed, not the allocation
    return lambda: np.copyto(out, x)


def _torch_copy(peer, arrays, params):
    x = peer.tensor(arrays[0])
    out = peer.torch.empty_like(x)
    return lambda: out.copy_(x)


# rows of ROW values: shape (rows, ROW)
def _rows_label(shape) -> str:
    return f"{shape[0]:,} rows of {shape[1]}"


def _rmsnorm_inputs(shape, rng) -> Inputs:
    return [_normal(rng, shape), _normal(rng, (shape[1],))], {"eps": 1e-6}


def _numpy_softmax(arrays, params):
    x, = arrays

    def run():
        e = np.exp(x - x.max(axis=-1, keepdims=True))
        return e / e.sum(axis=-1, keepdims=True)
    return run


def _torch_softmax(peer, arrays, params):
    x = peer.tensor(arrays[0])
    return lambda: peer.torch.softmax(x, -1)


def _numpy_rmsnorm(arrays, params):
    x, w = arrays
    eps = np.float32(params["eps"])
    return lambda: x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _torch_rmsnorm(peer, arrays, params):
    x, w = (peer.tensor(a) for a in arrays)
    functional = peer.torch.nn.functional
    if hasattr(functional, "rms_norm"):
        return lambda: functional.rms_norm(x, (x.shape[-1],), w, params["eps"])
    return lambda: x * peer.torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + params["eps"]) * w


# quantized matrix-vector products: shape (N, K), x (1, K)
#: Weight shapes (N rows, K) the quantized products time by default: Llama-3-8B's, whose
#: decoding steps are such products (issue 36 names 4096 x 4096 and 14,336 x 4,096)
QUANT_PROJECTIONS = {(4096, 4096): "Llama-3-8B attention q/o",
                     (14336, 4096): "Llama-3-8B FFN gate/up",
                     (4096, 14336): "Llama-3-8B FFN down"}


def quantized_weight(n: int, k: int, qtype: str, rng: np.random.Generator) -> np.ndarray:
    """Raw GGUF rows (N, row_bytes) of a random (N, K) weight: the `gguf` package's
    quantizer where it has one, else (K-quants) random bytes with sane scales."""
    t = quant_type(qtype)
    if k % t.block_values:
        raise Skip(f"{t.name} rows need K divisible by {t.block_values}, not {k}")
    try:
        raw = quants.quantize(_normal(rng, (n, k)), t.ggml)
        return np.ascontiguousarray(raw).view(np.uint8).reshape(n, t.row_bytes(k))
    except NotImplementedError:
        pass
    if t.ggml not in (GGMLQuantizationType.Q4_K, GGMLQuantizationType.Q5_K,
                      GGMLQuantizationType.Q6_K):
        raise Skip(f"no quantizer for {t.name} here")
    raw = rng.integers(0, 256, (n * k // t.block_values, t.block_bytes), dtype=np.uint8)
    if t.ggml == GGMLQuantizationType.Q6_K:
        # 128 bytes of low 4 bits and 64 of high 2 bits of the quants q (0..63, centred on
        # 32), 16 int8 scales (one per 16 values), float16 d at byte 208: a value is
        # d * scale * (q - 32). |scale| averages 64 and |q - 32| 16, so d about 1/1024
        # makes values about 1 in size
        raw[:, 192:208] = rng.integers(-128, 128, (len(raw), 16)).astype(np.int8).view(np.uint8)
        d = rng.uniform(0.5, 1.5, (len(raw), 1)) / 1024
        raw[:, 208:210] = d.astype(np.float16).view(np.uint8)
        return raw.reshape(n, t.row_bytes(k))
    # d and dmin, the block's float16 scales (6-bit sub-scales and quants times them):
    # values about 1 in size, as a real weight's are
    levels = 15 if t.ggml == GGMLQuantizationType.Q4_K else 31
    for field_at, divisor in ((0, levels * 40), (2, 40)):
        scales = rng.uniform(0.5, 1.5, (len(raw), 1)) / divisor
        raw[:, field_at:field_at + 2] = scales.astype(np.float16).view(np.uint8)
    return raw.reshape(n, t.row_bytes(k))


def _quant_case_parts(qtype: str):
    t = quant_type(qtype)

    def make(shape, rng) -> Inputs:
        n, k = shape
        return [_normal(rng, (1, k)), quantized_weight(n, k, qtype, rng)], {"qtype": qtype, "k": k}

    def label(shape) -> str:
        n, k = shape
        named = QUANT_PROJECTIONS.get(tuple(shape))
        return f"{t.name} W {n}x{k}, 1 row" + (f" ({named})" if named else "")

    def weight_bytes(shape) -> float:
        n, k = shape
        return float(n * t.row_bytes(k))

    def numpy_peer(arrays, params):
        x, w = arrays
        dense = dequantize(w, qtype, params["k"]).astype(np.float32)
        return lambda: x @ dense.T

    def torch_peer(peer, arrays, params):
        x, w = arrays
        xt = peer.tensor(x)
        dense = peer.tensor(np.ascontiguousarray(dequantize(w, qtype, params["k"]), np.float32))
        return lambda: xt @ dense.t()

    return make, label, weight_bytes, numpy_peer, torch_peer


# attention: decode shape (keys, Hq, Hkv, D), one query; prompt shape (tokens, Hq, Hkv, D)
def _attention_label(shape, prompt: bool) -> str:
    s, hq, hkv, d = shape
    what = f"{s} tokens, causal" if prompt else f"1 query, {s} keys"
    return f"{what}; {hq}/{hkv} heads of {d}"


def _attention_inputs(shape, rng, prompt: bool, dtype) -> Inputs:
    s, hq, hkv, d = shape
    q = _normal(rng, (s if prompt else 1, hq, d), dtype)
    return [q, _normal(rng, (s, hkv, d), dtype), _normal(rng, (s, hkv, d), dtype)], \
        {"causal": True}


def numpy_attention(q, k, v, causal: bool):
    """float32 numpy attention (timing peer) of head-major q (Hkv, group, Sq, D), k^T
    (Hkv, D, Skv) and v (Hkv, Skv, D), by batched BLAS products: (Hkv, group, Sq, D).
    Query i sees keys j <= i + Skv - Sq when causal."""
    sq, d, skv = q.shape[2], q.shape[3], k.shape[2]
    scores = (q @ k[:, None]) * np.float32(d ** -0.5)
    if causal and sq > 1:
        scores[..., np.arange(skv)[None, :] > np.arange(sq)[:, None] + (skv - sq)] = -np.inf
    scores -= scores.max(axis=-1, keepdims=True)
    np.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True)
    return scores @ v[:, None]


def _numpy_attention(arrays, params):
    """numpy_attention on the inputs laid out head-major once, outside the timing (as
    torch's peer gets its (batch, heads, sequence, dim) layout)."""
    q, k, v = (a.astype(np.float32) for a in arrays)
    sq, hq, d = q.shape
    hkv = k.shape[1]
    qh = np.ascontiguousarray(q.reshape(sq, hkv, hq // hkv, d).transpose(1, 2, 0, 3))
    kt = np.ascontiguousarray(k.transpose(1, 2, 0))
    vh = np.ascontiguousarray(v.transpose(1, 0, 2))
    return lambda: numpy_attention(qh, kt, vh, params["causal"])


def _torch_attention(peer, arrays, params):
    """SDPA over (batch, heads, sequence, dim) views made once; one decoding query sees
    every key, so it runs unmasked (SDPA's causal mask is top-left aligned)."""
    q, k, v = (peer.tensor(a).permute(1, 0, 2).unsqueeze(0).contiguous() for a in arrays)
    causal = params["causal"] and q.shape[2] > 1
    sdpa = peer.torch.nn.functional.scaled_dot_product_attention
    group = q.shape[1] // k.shape[1]
    try:
        sdpa(q[:, :, :1], k[:, :, :1], v[:, :, :1], enable_gqa=True)
        return lambda: sdpa(q, k, v, is_causal=causal, enable_gqa=True)
    except TypeError:  # torch < 2.5: no enable_gqa
        k, v = (t.repeat_interleave(group, dim=1) for t in (k, v))
        return lambda: sdpa(q, k, v, is_causal=causal)


def _attention_flops(shape, prompt: bool) -> float:
    s, hq, _, d = shape
    pairs = s * (s + 1) / 2 if prompt else s  # (query, key) pairs the mask lets through
    return 4.0 * pairs * hq * d                 # q.k and p.v: 2 FLOPs a value each


def _attention_kv_bytes(shape) -> float:
    s, _, hkv, d = shape
    return 2.0 * 4 * s * hkv * d  # float32 keys and values read once


def _attention_case(name: str, op: str, prompt: bool, dtype, default, quick) -> BenchCase:
    return BenchCase(
        name=name, op=op,
        size_means="tokens of a causal prompt" if prompt else "cached keys one query attends",
        from_size=lambda s: (s, *ATTENTION_HEADS), default=default, quick=quick,
        label=lambda shape: _attention_label(shape, prompt),
        make=lambda shape, rng: _attention_inputs(shape, rng, prompt, dtype),
        work=(lambda shape: _attention_flops(shape, True)) if prompt else _attention_kv_bytes,
        unit="FLOP" if prompt else "B",
        numpy_peer=_numpy_attention, torch_peer=_torch_attention,
        peer_note="numpy: float32 batched products" + (", torch on the CPU: float32" if dtype == np.float16
                                              else ""),
        nmse_limit=NMSE_F16_ATTENTION if dtype == np.float16 else NMSE_LIMIT)


def _square(n: int) -> tuple:
    return (n, n, n)


def _quant_case(name: str, qtype: str) -> BenchCase:
    make, label, weight_bytes, numpy_peer, torch_peer_fn = _quant_case_parts(qtype)
    return BenchCase(
        name=name, op="matmul_quant", size_means="N = K of a square weight",
        from_size=lambda n: (n, n),
        default=tuple(QUANT_PROJECTIONS), quick=((512, 512),),
        label=label, make=make, work=weight_bytes, unit="B",
        numpy_peer=numpy_peer, torch_peer=torch_peer_fn,
        peer_note="rate: the quantized weight's bytes over the time; pxvm's runs each "
                  "take another device copy of the inputs (up to 256 MiB of copies, in "
                  "turn), so that the weight comes from memory, not the cache; numpy and "
                  "torch multiply by the weight dequantized to float32 once",
        cold_inputs=True)


CASES: dict[str, BenchCase] = {c.name: c for c in (
    # first: the reference of the rates in bytes. pxvm's ops have no copy op; slice_rows of
    # every row is one: its kernel reads each value once and writes it once
    BenchCase(COPY, "slice_rows", f"rows of {ROW} float32 values", lambda n: (n, ROW),
              default=((1 << 14, ROW), (1 << 16, ROW)), quick=((256, ROW),),
              label=_copy_label, make=_one_input, work=lambda s: 8.0 * s[0] * s[1], unit="B",
              numpy_peer=_numpy_copy, torch_peer=_torch_copy,
              peer_note="rate: bytes read plus bytes written; pxvm: slice_rows of every row "
                        "into a new tensor; numpy: np.copyto, torch: Tensor.copy_, into an "
                        "array made once",
              nmse_limit=0.0),  # a copy is exact
    BenchCase("matmul", "matmul", "n of an n x n x n product", _square,
              default=(_square(1024), _square(2048), _square(4096), (4096, 11008, 4096)),
              quick=(_square(128), _square(256), (32, 576, 1536)),
              label=_matmul_label, make=_matmul_inputs, work=_matmul_flops, unit="FLOP",
              numpy_peer=_numpy_matmul, torch_peer=_torch_matmul),
    BenchCase("matmul_f16", "matmul_f16", "n of an n x n x n product (B as (N, K))", _square,
              default=(_square(1024), _square(2048), _square(4096), (4096, 11008, 4096)),
              quick=(_square(128), _square(256)),
              label=_matmul_label, make=_matmul_f16_inputs, work=_matmul_flops, unit="FLOP",
              numpy_peer=_numpy_matmul, torch_peer=_torch_matmul,
              peer_note="numpy (and torch on the CPU) multiply float32 copies"),
    BenchCase("dot", "dot", "elements", lambda n: (n,),
              default=((1 << 20,), (1 << 24,), (1 << 26,)), quick=((1 << 16,),),
              label=_elements_label, make=_two_inputs, work=lambda s: 8.0 * s[0], unit="B",
              numpy_peer=lambda arrays, params: lambda: np.dot(*arrays),
              torch_peer=_torch_dot),
    BenchCase("add", "add", "elements", lambda n: (n,),
              default=((1 << 20,), (1 << 24,), (1 << 26,)), quick=((1 << 16,),),
              label=_elements_label, make=_two_inputs, work=lambda s: 12.0 * s[0], unit="B",
              numpy_peer=lambda arrays, params: lambda: np.add(*arrays),
              torch_peer=_torch_add),
    BenchCase("silu", "silu", "elements", lambda n: (n,),
              default=((1 << 20,), (1 << 24,), (1 << 26,)), quick=((1 << 16,),),
              label=_elements_label, make=_one_input, work=lambda s: 8.0 * s[0], unit="B",
              numpy_peer=_numpy_silu,
              torch_peer=_torch_silu),
    BenchCase("softmax", "softmax", f"rows of {ROW}", lambda n: (n, ROW),
              default=((256, ROW), (4096, ROW), (16384, ROW)), quick=((16, ROW),),
              label=_rows_label, make=_one_input, work=lambda s: 8.0 * s[0] * s[1], unit="B",
              numpy_peer=_numpy_softmax,
              torch_peer=_torch_softmax),
    BenchCase("rmsnorm", "rmsnorm", f"rows of {ROW}", lambda n: (n, ROW),
              default=((256, ROW), (4096, ROW), (16384, ROW)), quick=((16, ROW),),
              label=_rows_label, make=_rmsnorm_inputs, work=lambda s: 8.0 * s[0] * s[1] + 4.0 * s[1],
              unit="B", numpy_peer=_numpy_rmsnorm, torch_peer=_torch_rmsnorm),
    _quant_case("matmul_quant_q8_0", "Q8_0"),
    _quant_case("matmul_quant_q4_k", "Q4_K"),
    _quant_case("matmul_quant_q6_k", "Q6_K"),
    _attention_case("attention", "attention", prompt=False, dtype=np.float32,
                    default=tuple((s, *ATTENTION_HEADS) for s in (1024, 4096, 16384)),
                    quick=((64, *QUICK_ATTENTION_HEADS),)),
    _attention_case("attention_f16", "attention_f16", prompt=True, dtype=np.float16,
                    default=tuple((s, *ATTENTION_HEADS) for s in (512, 1024, 2048)),
                    quick=((32, *QUICK_ATTENTION_HEADS),)),
)}


def select(names: list[str] | None) -> list[BenchCase]:
    """The cases `names` ask for (a case's name, or an op's name for all its cases), in
    the table's order; every case without names. ValueError names the unknown ones."""
    if not names:
        return list(CASES.values())
    unknown = [n for n in names if n not in CASES and all(c.op != n for c in CASES.values())]
    if unknown:
        raise ValueError(f"unknown op {', '.join(map(repr, unknown))}; choose from "
                         f"{', '.join(CASES)}")
    return [c for c in CASES.values() if c.name in names or c.op in names]


def plan(cases: list[BenchCase], sizes: list[int] | None = None, quick: bool = False,
         max_tensor_bytes: int | None = None) -> list[tuple[BenchCase, tuple]]:
    """(case, shape) pairs to run: each case at `sizes` (each a number the case reads as
    `size_means`), else at its quick or default shapes. Where a case measured in bytes is
    chosen without the copy case, the copy case runs first at its own quick or default
    shapes: the reference of their percentages (add_percent_of_copy). Those copies are cut
    to `max_tensor_bytes` where a device's tensors hold less, so that one still runs."""
    pairs = [(c, shape) for c in cases
             for shape in ([c.from_size(s) for s in sizes] if sizes
                           else _copy_shapes(quick, max_tensor_bytes) if c.name == COPY
                           else c.quick if quick else c.default)]
    if any(c.unit == "B" for c in cases) and all(c.name != COPY for c in cases):
        pairs = [(CASES[COPY], shape) for shape in _copy_shapes(quick, max_tensor_bytes)] + pairs
    return pairs


def _copy_shapes(quick: bool, max_tensor_bytes: int | None) -> tuple:
    """The copy case's quick or default shapes, each cut to at most `max_tensor_bytes`."""
    copy = CASES[COPY]
    shapes = copy.quick if quick else copy.default
    if max_tensor_bytes is None:
        return shapes
    most = max(1, max_tensor_bytes // (4 * ROW))
    return tuple(dict.fromkeys((min(rows, most), row) for rows, row in shapes))


# ---- one row --------------------------------------------------------------------------------

@dataclass
class Row:
    """One case at one shape: times in seconds (None: not measured, `note` says why),
    `work` in `unit`s per run."""

    case: str
    op: str
    shape: str
    work: float
    unit: str
    status: str = "ok"          # ok, FAIL (the check), skipped, error
    note: str = ""
    pxvm_seconds: float | None = None
    pxvm_clock: str | None = None
    pxvm_runs: str | None = None  # Op.implementation: "kernel", "decomposed", "reference", ..
    numpy_seconds: float | None = None
    torch_seconds: float | None = None
    nmse: float | None = None
    nmse_limit: float = NMSE_LIMIT
    peer_notes: list[str] = field(default_factory=list)
    # pxvm's rate over the copy bandwidth of the same run, in percent (add_percent_of_copy)
    pxvm_percent_of_copy: float | None = None

    def rate(self, seconds: float | None) -> float | None:
        """Work per second (FLOP/s or B/s)."""
        return None if not seconds else self.work / seconds

    def speedup(self, peer_seconds: float | None) -> float | None:
        """The peer's time over pxvm's: above 1, pxvm is faster. None where pxvm ran numpy's
        own reference (no kernel of the backend's): no speed-up of pxvm's to claim."""
        if not peer_seconds or not self.pxvm_seconds or self.pxvm_runs == "reference":
            return None
        return peer_seconds / self.pxvm_seconds

    @property
    def failed(self) -> bool:
        return self.status in ("FAIL", "error")

    def as_dict(self) -> dict:
        out = asdict(self)
        out.update(pxvm_per_second=self.rate(self.pxvm_seconds),
                   numpy_per_second=self.rate(self.numpy_seconds),
                   torch_per_second=self.rate(self.torch_seconds),
                   pxvm_vs_numpy=self.speedup(self.numpy_seconds),
                   pxvm_vs_torch=self.speedup(self.torch_seconds))
        if out["nmse"] is not None and not math.isfinite(out["nmse"]):
            out["nmse"] = str(out["nmse"])  # JSON has no inf
        return out


def copy_bandwidth(rows: list[Row]) -> Row | None:
    """The row whose pxvm rate is the copy bandwidth of the run `rows` are from: the
    fastest copy that ran and checked out; None where none did."""
    copies = [r for r in rows if r.case == COPY and r.status == "ok" and r.pxvm_seconds]
    return max(copies, key=lambda r: r.rate(r.pxvm_seconds), default=None)


def add_percent_of_copy(rows: list[Row]) -> Row | None:
    """Set pxvm_percent_of_copy, pxvm's rate over the run's copy bandwidth (copy_bandwidth)
    in percent, on each row measured in bytes that ran and checked out. Returns the copy
    row the percentages are of; None (and no percentages) where no copy ran."""
    reference = copy_bandwidth(rows)
    if reference is None:
        return None
    copy_rate = reference.rate(reference.pxvm_seconds)
    for r in rows:
        if r.unit == "B" and r.status == "ok" and r.pxvm_seconds:
            r.pxvm_percent_of_copy = 100.0 * r.rate(r.pxvm_seconds) / copy_rate
    return reference


def nmse(got, expected) -> float:
    """sum((got - expected)^2) / sum(expected^2) in float64; inf where the shapes differ
    or got is not finite where expected is."""
    a = np.asarray(got, np.float64)
    b = np.asarray(expected, np.float64)
    if a.shape != b.shape:
        return math.inf
    finite = np.isfinite(b)
    if not np.all(np.isfinite(a[finite])):
        return math.inf
    num = float(np.sum((a[finite] - b[finite]) ** 2))
    den = float(np.sum(b[finite] ** 2))
    return num / den if den else num


def _fits(backend: Backend, arrays: list[np.ndarray]) -> None:
    limit = backend.max_tensor_bytes
    biggest = max(a.nbytes for a in arrays)
    if limit is not None and biggest > limit:
        raise Skip(f"an input of {biggest / 2**20:,.0f} MiB is over this device's "
                   f"{limit / 2**20:,.0f} MiB a tensor")


def run_case(case: BenchCase, shape: tuple, backend: Backend, repeats: int,
             rng: np.random.Generator, peer: TorchPeer | None = None) -> Row:
    """Time `case` at `shape` on `backend`, numpy and the torch peer, and check pxvm's
    result against the op's reference. Never raises for a missing op, kernel, or a shape
    the backend cannot take: the row is "skipped" with the reason; any other failure is
    an "error" row."""
    row = Row(case.name, case.op, case.label(shape), case.work(shape), case.unit,
              nmse_limit=case.nmse_limit)
    if case.peer_note:
        row.peer_notes.append(case.peer_note)
    try:
        arrays, params = case.make(shape, rng)
    except Skip as exc:
        row.status, row.note = "skipped", str(exc)
        return row
    _time_pxvm_and_check(row, case, arrays, params, backend, repeats)
    row.numpy_seconds = _peer_time(row, "numpy", lambda: median_time(
        case.numpy_peer(arrays, params), repeats, HOST_PEER_BUDGET_S))
    if peer is not None and case.torch_peer is not None:
        row.torch_seconds = _peer_time(row, "torch", lambda: peer.time(
            case.torch_peer(peer, arrays, params), repeats))
    return row


def input_copies(backend: Backend, arrays: list[np.ndarray], cold: bool,
                 runs: int) -> list[list]:
    """The inputs on the device, once; where `cold`, as many copies as `runs` takes or as
    add up to COLD_BYTES, whichever is fewer, for the runs to take in turn."""
    copies = 1
    if cold:
        copies = max(1, min(runs, math.ceil(COLD_BYTES / sum(a.nbytes for a in arrays))))
    return [[backend.from_numpy(a) for a in arrays] for _ in range(copies)]


def _time_pxvm_and_check(row: Row, case: BenchCase, arrays, params, backend, repeats) -> None:
    op = REGISTRY.get(case.op)
    try:
        if op is None:
            raise Skip(f"this pxvm has no op {case.op}")
        row.pxvm_runs = op.implementation(backend)
        if row.pxvm_runs == "reference":
            row.note = ("numpy reference" if backend.name == "numpy"
                        else f"no {backend.name} kernel: numpy reference")
        _fits(backend, arrays)
        # every copy holds the same values: any run's result is checked the same
        turns = itertools.cycle(input_copies(backend, arrays, case.cold_inputs, repeats + 1))
        row.pxvm_seconds, row.pxvm_clock, got = time_pxvm(
            backend, lambda: op(*next(turns), **params), repeats)
        row.nmse = nmse(got, op.reference(*arrays, **params))
        if not row.nmse <= case.nmse_limit:
            row.status = "FAIL"
            row.note = (f"pxvm's result is off its numpy reference: NMSE {row.nmse:.2e} > "
                        f"{case.nmse_limit:.0e}")
    except Skip as exc:
        row.status, row.note = "skipped", str(exc)
        row.pxvm_seconds = row.pxvm_clock = None
    except PxvmError as exc:  # why it was skipped; not another backend to run it on
        row.status, row.note = "skipped", exc.reason
        row.pxvm_seconds = row.pxvm_clock = None
    except MemoryError:
        row.status, row.note = "skipped", "out of memory"
    except Exception as exc:  # noqa: BLE001 - one broken case must not lose the others
        row.status, row.note = "error", f"{type(exc).__name__}: {exc}"


def _peer_time(row: Row, name: str, measure: Callable[[], float]) -> float | None:
    try:
        return measure()
    except MemoryError:
        row.peer_notes.append(f"{name}: out of memory")
    except Exception as exc:  # noqa: BLE001 - a peer's failure is a note, not ours
        row.peer_notes.append(f"{name} failed: {type(exc).__name__}: {exc}")
    return None


# ---- what ran where ----------------------------------------------------------------------------

def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def driver(backend: Backend) -> str | None:
    """The driver the backend's device runs on, where it says."""
    if isinstance(backend, CudaBackend):
        v = backend.device.info.driver_version
        return f"CUDA driver {v // 1000}.{v % 1000 // 10}"
    if isinstance(backend, WebGPUBackend):
        d = backend.device.description
        info = getattr(d.adapter, "info", None) or {}
        return info.get("description") or f"{d.backend} driver (version not reported)"
    return None


def environment(backend: Backend, peer: TorchPeer | None) -> dict:
    """Device, driver, versions, Python and date, for the JSON and the table's header."""
    return {
        "backend": backend.name,
        "device": backend.describe(),
        "driver": driver(backend),
        "torch": peer.describe() if peer is not None else "not measured (torch not installed "
                                                             "or --no-torch)",
        "versions": {"pxvm": __version__, "numpy": np.__version__,
                     "torch": peer.version if peer is not None else _version("torch"),
                     "wgpu": _version("wgpu"), "cuda-bindings": _version("cuda-bindings"),
                     "python": platform.python_version()},
        # kernel configurations `pxvm tune` chose for this device, in force while timing
        "tuned": tuning.tuning_for(backend).configs,
        "platform": platform.platform(),
        "host_cpu": platform.processor() or platform.machine(),
        "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }


# ---- the plot --------------------------------------------------------------------------------

def format_rate(per_second: float | None, unit: str) -> str:
    if not per_second:
        return "-"
    if unit == "FLOP":
        return (f"{per_second / 1e12:.2f} TFLOP/s" if per_second >= 1e12
                else f"{per_second / 1e9:.3g} GFLOP/s")
    return f"{per_second / 1e9:.3g} GB/s"


#: The plot's lines: (Row attribute, label, line style, colour), the same in every panel
SERIES = (("pxvm_seconds", "pxvm", "o-", "tab:blue"),
          ("numpy_seconds", "numpy", "s--", "tab:orange"),
          ("torch_seconds", "torch", "^:", "tab:green"))


def write_plot(rows: list[Row], path, title: str) -> None:
    """A PNG of throughput against work per run, one panel per case: pxvm, numpy and
    torch. ImportError where matplotlib (pxvm's `plots` extra) is missing."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    by_case: dict[str, list[Row]] = {}
    for r in rows:
        if any((r.pxvm_seconds, r.numpy_seconds, r.torch_seconds)):
            by_case.setdefault(r.case, []).append(r)
    panels = max(1, len(by_case))
    cols = min(3, panels)
    lines = -(-panels // cols)
    fig, axes = plt.subplots(lines, cols, figsize=(5.2 * cols, 3.8 * lines), squeeze=False)
    for ax, (name, case_rows) in zip(axes.flat, by_case.items()):
        unit = case_rows[0].unit
        scale, rate_unit = (1e12, "TFLOP/s") if unit == "FLOP" else (1e9, "GB/s")
        for attr, label, style, color in SERIES:
            points = sorted((r.work, r.work / getattr(r, attr) / scale) for r in case_rows
                            if getattr(r, attr))
            if points:
                ax.plot(*zip(*points), style, color=color, label=label)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_title(name)
        ax.set_xlabel("FLOPs a run" if unit == "FLOP" else "bytes a run")
        ax.set_ylabel(rate_unit)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize="small")
    for ax in list(axes.flat)[len(by_case):]:
        ax.set_visible(False)
    fig.suptitle(title, fontsize="medium")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
