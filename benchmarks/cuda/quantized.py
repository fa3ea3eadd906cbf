"""Quantized products on the CUDA backend (issue 17) in one run: matrix-vector products
(decoding's: one row of x) of each GGUF type at W 4096 x 4096, 11008 x 4096 and
4096 x 11008, in GB/s of the weight's GGUF bytes against the device-to-device copy; then
prompt-shaped products (M rows of x) in TFLOP/s next to PyTorch's float16 matmul of the
same shape.

    python benchmarks/cuda/quantized.py [--types Q4_K Q8_0 ..] [--repeats 20]
        [--variants] [--prompt-rows 512] [--stream]

Timing: every sample is queued behind a 512 MB device-to-device copy, which streams 1 GB
through L2 (50 MB on the H100), so that L2 holds nothing of W, and keeps the GPU busy
while the host queues the product: events around each launch (a profiled batch) time
the GPU's work only. A product's time is the sum of its launches' (one for the
matrix-vector kernel; the conversion of x, the dequantization and the tensor-core
product for prompts); the median of --repeats after a warm-up (which also repacks the
weights that are read as planes, once). The copy of the same bytes as W, and of 512 MB,
is timed the same way; its GB/s count bytes read and written (bandwidth.py's measure),
the products' the weight's bytes read. NMSE: each product against float64 numpy of the
`gguf` package's dequantization, in the same run.

--variants: every kernel shape (pxvm.backends.cuda.ptx.quantized.SHAPES: outputs a block,
rows loaded together) and prefetch (PREFETCHES) for the types that have them (SWEPT),
each forced as `pxvm tune` forces its candidates (tuning.forcing).
--stream: the matrix-vector products again as a model's decoding graph runs them, back
to back over distinct weights (stream_table): the op's choice of kernel, then the type's
shape reading the weights from global memory with and without their L2 prefetch before
each kernel waits for the one before it.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
from pathlib import Path

import numpy as np

import pxvm
from pxvm import get_backend
from pxvm.backends.cuda.ops import quantized as cuda_quantized
from pxvm.backends.cuda.ptx import quantized as ptx_quantized
from pxvm.core import tuning
from pxvm.tools.bench_ops import TorchPeer

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests" / "llm"))
from gguf_blocks import FORMATS, dequantize, quantize, random_blocks  # noqa: E402

SHAPES = ((4096, 4096), (11008, 4096), (4096, 11008))  # W (N, K)
TYPES = ("Q4_K", "Q8_0", "Q4_0", "Q6_K", "Q5_K")
K_TYPES = ("Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")
BUSY = 1 << 29  # the copy queued before every sample
STREAM_BYTES = 1 << 28  # the distinct weights of a --stream graph: 5x the H100's L2
RUNS = 4  # --stream: graph runs a submit


def weight(rng, qtype: str, n: int, k: int) -> np.ndarray:
    """Raw GGUF rows (N, row_bytes): quantized normal values, or random valid blocks for
    the K types (no quantizer here); the speed depends on the shape and type only."""
    if qtype in K_TYPES:
        return random_blocks(n, k, qtype, rng, k ** -0.5)
    return quantize(rng.standard_normal((n, k)).astype(np.float32) * k ** -0.5, qtype)


class Timer:
    """GPU times of work queued behind a copy that empties L2 (see the module's doc)."""

    def __init__(self, backend, repeats: int):
        self.backend = backend
        self.device = backend.device
        self.repeats = repeats
        self.busy = (self.device.alloc(BUSY), self.device.alloc(BUSY))

    def _flush(self) -> None:
        self.device.copy(self.busy[1], self.busy[0], BUSY)

    def launches(self, record) -> tuple[float, list[tuple[str, float]]]:
        """(median total seconds of record()'s launches, one sample's launches)."""
        samples, last = [], []
        for i in range(self.repeats + 1):
            self._flush()
            with pxvm.Batch(self.backend, profile=True) as batch:
                record()
            batch.execute()
            if i:
                last = batch.profile
                samples.append(sum(seconds for _, seconds in last))
        return statistics.median(samples), last

    def copy(self, nbytes: int) -> float:
        """Median seconds of a device-to-device copy of nbytes."""
        src, dst = self.device.alloc(nbytes), self.device.alloc(nbytes)
        samples = []
        for i in range(self.repeats + 1):
            self._flush()
            start = self.device.event()
            self.device.copy(dst, src, nbytes)
            end = self.device.event()
            seconds = self.device.elapsed(start, end)
            self.device.destroy(start, end)
            if i:
                samples.append(seconds)
        return statistics.median(samples)


def product_cases(rng, types, m: int = 1):
    """For each type named and each of SHAPES: (type name, N, K, W's raw rows (N, K),
    x (m, K), x @ W^T in float64 from the `gguf` package's dequantization)."""
    for qtype in types:
        for n, k in SHAPES:
            w = weight(rng, qtype, n, k)
            x = rng.standard_normal((m, k)).astype(np.float32)
            yield (qtype, n, k, w, x,
                   x.astype(np.float64) @ dequantize(w, qtype, k).astype(np.float64).T)


def streamed(backend, tx, weights, qtype: str, k: int, repeats: int):
    """(median seconds a product, the first product's result) of x @ W^T for every W of
    `weights` in one CUDA graph, launched RUNS times a submit, GPU time by events around
    the submit over its products; `repeats` submits after a warm-up."""
    graph = pxvm.Graph(backend, lambda: {
        f"y{i}": pxvm.ops.matmul_quant(tx, tw, qtype=qtype, k=k)
        for i, tw in enumerate(weights)})
    samples, got = [], None
    for i in range(repeats + 1):
        launch = graph.launch("y0", timestamps=True, runs=RUNS, each_run=False)
        got = launch.result()["y0"]
        if i:
            samples.append(launch.device_seconds / (RUNS * len(weights)))
    return statistics.median(samples), got


def nmse(got, expected) -> float:
    got = np.asarray(got, np.float64)
    return float(np.sum((got - expected) ** 2) / np.sum(expected ** 2))


def matvec_table(timer, types, rng, variants: bool) -> None:
    big = timer.copy(BUSY)
    big_bw = 2 * BUSY / big
    print(f"device-to-device copy of 512 MB: {big * 1e3:.3f} ms, {big_bw / 1e9:.0f} GB/s "
          "read + written\n")
    print("| type | W (N x K) | MB | kernel | us | weight GB/s | copy of W: us, GB/s | "
          "of that copy | of the 512 MB copy | NMSE |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    copies = {}
    for qtype, n, k, w, x, expected in product_cases(rng, types):
        tw, tx = timer.backend.from_numpy(w), timer.backend.from_numpy(x)
        if w.nbytes not in copies:
            copies[w.nbytes] = timer.copy(w.nbytes)
        copy = copies[w.nbytes]
        copy_bw = 2 * w.nbytes / copy
        configs = [None]  # the op's own choice
        if variants and qtype in ptx_quantized.SWEPT:
            configs = [(*shape, prefetch) for prefetch in ptx_quantized.PREFETCHES
                       for shape in (ptx_quantized.SHAPES if prefetch != "lines"
                                     else [ptx_quantized.DEFAULT_SHAPE])]
        for config in configs:
            with forcing_matvec(qtype, config):
                t, launches = timer.launches(
                    lambda tx=tx, tw=tw, qtype=qtype, k=k:
                    pxvm.ops.matmul_quant(tx, tw, qtype=qtype, k=k))
                err = nmse(pxvm.ops.matmul_quant(tx, tw, qtype=qtype, k=k).numpy(), expected)
            kernel = "+".join(name for name, _ in launches)
            bw = w.nbytes / t
            print(f"| {qtype} | {n} x {k} | {w.nbytes / 1e6:.1f} | {kernel} | {t * 1e6:.1f} "
                  f"| {bw / 1e9:.0f} | {copy * 1e6:.1f}, {copy_bw / 1e9:.0f} "
                  f"| {bw / copy_bw:.0%} | {bw / big_bw:.0%} | {err:.1e} |", flush=True)


def forcing_matvec(qtype: str, config):
    """The matrix-vector kernel's (rows, group, prefetch) for `qtype` forced within the
    block, as the tuner forces it; None: the op's own choice."""
    if config is None:
        return contextlib.nullcontext()
    return tuning.forcing(cuda_quantized.matvec_tuned(qtype), config)


def kernels_of(backend, record) -> str:
    """The names of the kernels record() launches, joined by +."""
    with pxvm.Batch(backend, profile=True) as batch:
        record()
    batch.execute()
    return "+".join(name for name, _ in batch.profile)


def stream_table(backend, types, rng, repeats: int, copy_bw: float) -> None:
    """Matrix-vector products as a model's decoding runs them: one CUDA graph of products
    over STREAM_BYTES of distinct weights of the shape (so that L2, 50 MB, holds none of
    a weight when its product starts): `streamed`; the op's choice of kernel, then the
    type's shape reading from global memory ("none") and with the bulk L2 prefetch."""
    print("\n| type | W (N x K) | kernel | weights in the graph | us a product | "
          "weight GB/s | of the 512 MB copy | NMSE |")
    print("|---|---|---|---|---|---|---|---|")
    for qtype, n, k, w, x, expected in product_cases(rng, types):
        tx = backend.from_numpy(x)
        weights = [backend.from_numpy(w) for _ in range(-(-STREAM_BYTES // w.nbytes))]
        shape = cuda_quantized.MATVEC_SHAPES.get(qtype, ptx_quantized.DEFAULT_SHAPE)
        for prefetch in (None, "none", "bulk"):
            with forcing_matvec(qtype, prefetch and (*shape, prefetch)):
                kernel = kernels_of(backend, lambda: pxvm.ops.matmul_quant(
                    tx, weights[0], qtype=qtype, k=k))
                t, got = streamed(backend, tx, weights, qtype, k, repeats)
            bw = w.nbytes / t
            shown = f"{kernel} (the op's choice)" if prefetch is None else kernel
            print(f"| {qtype} | {n} x {k} | {shown} | {len(weights)} | {t * 1e6:.1f} "
                  f"| {bw / 1e9:.0f} | {bw / copy_bw:.0%} | {nmse(got, expected):.1e} |",
                  flush=True)


def torch_f16(m: int, n: int, k: int, repeats: int) -> float | None:
    """Median seconds of PyTorch's float16 (M, K) @ (N, K)^T, or None without torch."""
    try:
        import torch
    except ImportError:
        return None
    if not torch.cuda.is_available():
        return None
    a = torch.randn(m, k, device="cuda", dtype=torch.float16)
    b = torch.randn(n, k, device="cuda", dtype=torch.float16).t()
    return TorchPeer(torch).time(lambda: a @ b, repeats)


def prompt_table(timer, types, rng, m: int) -> None:
    print("\n| type | M x K x N | pxvm us | pxvm TFLOP/s | its launches (us) | torch f16 us "
          "| torch TFLOP/s | NMSE |")
    print("|---|---|---|---|---|---|---|---|")
    for qtype, n, k, w, x, expected in product_cases(rng, types, m):
        tw, tx = timer.backend.from_numpy(w), timer.backend.from_numpy(x)
        t, launches = timer.launches(lambda tx=tx, tw=tw, qtype=qtype, k=k:
                                     pxvm.ops.matmul_quant(tx, tw, qtype=qtype, k=k))
        got = pxvm.ops.matmul_quant(tx, tw, qtype=qtype, k=k).numpy()
        err = nmse(got, expected)
        flops = 2.0 * m * n * k
        tt = torch_f16(m, n, k, timer.repeats)
        torch_cols = f"{tt * 1e6:.1f} | {flops / tt / 1e12:.1f}" if tt else "- | -"
        parts = ", ".join(f"{what} {s * 1e6:.1f}" for what, s in launches)
        print(f"| {qtype} | {m} x {k} x {n} | {t * 1e6:.1f} | {flops / t / 1e12:.1f} | {parts} "
              f"| {torch_cols} | {err:.1e} |", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--types", nargs="*", default=list(TYPES),
                        help=f"GGUF type names ({', '.join(FORMATS)}) "
                             "or 'all'")
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--variants", action="store_true",
                        help="every kernel shape and prefetch of the SWEPT types")
    parser.add_argument("--prompt-rows", type=int, default=512,
                        help="M of the prompt-shaped products (0: none)")
    parser.add_argument("--no-matvec", action="store_true")
    parser.add_argument("--stream", action="store_true",
                        help="the matrix-vector products also as a decoding graph runs them: "
                             "back to back over distinct weights (stream_table)")
    args = parser.parse_args()
    types = list(FORMATS) if args.types == ["all"] else args.types
    backend = get_backend("cuda")
    try:
        import torch
        torch_version = torch.__version__
    except ImportError:
        torch_version = None
    print(f"device: {backend.describe()}; torch {torch_version}; {args.repeats} samples a "
          f"product after a warm-up; prompts from {cuda_quantized.PROMPT_MIN_ROWS} rows\n")
    timer = Timer(backend, args.repeats)
    rng = np.random.default_rng(0)
    if not args.no_matvec:
        matvec_table(timer, types, rng, args.variants)
    if args.stream:
        stream_table(backend, types, rng, args.repeats, 2 * BUSY / timer.copy(BUSY))
    if args.prompt_rows:
        prompt_table(timer, types, rng, args.prompt_rows)


if __name__ == "__main__":
    main()
