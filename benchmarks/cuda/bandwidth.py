"""Memory-bound ops on the CUDA backend against the device-to-device copy bandwidth and
PyTorch, in one run: the issue's goal is 75% of the copy bandwidth on 2^26 elements.
(The quantized products' weight bandwidth, the same goal in weight bytes read, is
benchmarks/cuda/quantized.py's.)

    python benchmarks/cuda/bandwidth.py [--log2 26] [--repeats 20]

Each op's GPU time is the median of --repeats timed batches after a warm-up (events
around its launch); bandwidth = bytes read + written / time. The copy is the driver's
cuMemcpyDtoDAsync of the same bytes, timed the same way. PyTorch (when installed) runs
the same ops on the same GPU, timed with its CUDA events. Every pxvm result is checked
against its numpy reference once.
"""

from __future__ import annotations

import argparse
import statistics

import numpy as np

import pxvm
from pxvm import get_backend
from pxvm.tools.bench_ops import torch_peer

ROW = 4096  # row length of the row-wise ops (rows = n / ROW)


def gpu_time(backend, record, repeats: int) -> float:
    samples = []
    for i in range(repeats + 1):
        with pxvm.Batch(backend, timestamps=True) as batch:
            record()
        batch.execute()
        if i:
            samples.append(batch.device_seconds)
    return statistics.median(samples)


def copy_time(device, nbytes: int, repeats: int) -> float:
    src, dst = device.alloc(nbytes), device.alloc(nbytes)
    samples = []
    for i in range(repeats + 1):
        start = device.event()
        device.copy(dst, src, nbytes)
        seconds = device.elapsed(start, device.event())
        if i:
            samples.append(seconds)
    return statistics.median(samples)


def torch_time(fn, repeats: int) -> float | None:
    """Median seconds of `fn()` on torch's GPU (CUDA events), None without one."""
    peer = torch_peer()
    return peer.time(fn, repeats) if peer is not None and peer.on_gpu else None


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--log2", type=int, default=26)
    parser.add_argument("--repeats", type=int, default=20)
    args = parser.parse_args()
    n = 1 << args.log2
    backend = get_backend("cuda")
    device = backend.device
    rng = np.random.default_rng(0)
    x = rng.standard_normal(n, dtype=np.float32)
    y = rng.standard_normal(n, dtype=np.float32)
    w = rng.standard_normal(ROW, dtype=np.float32)
    tx, ty, tw = backend.from_numpy(x), backend.from_numpy(y), backend.from_numpy(w)
    rows = tx.reshape(n // ROW, ROW)
    ops = pxvm.ops
    cases = {  # name: (record, bytes moved, reference check, torch op)
        "relu": (lambda: ops.relu(tx), 8 * n, lambda: (ops.relu(tx), ops.relu.reference(x))),
        "silu": (lambda: ops.silu(tx), 8 * n, lambda: (ops.silu(tx), ops.silu.reference(x))),
        "add": (lambda: ops.add(tx, ty), 12 * n,
                lambda: (ops.add(tx, ty), ops.add.reference(x, y))),
        "rmsnorm": (lambda: ops.rmsnorm(rows, tw, 1e-6), 8 * n,
                    lambda: (ops.rmsnorm(rows, tw, 1e-6),
                             ops.rmsnorm.reference(x.reshape(-1, ROW), w, 1e-6))),
        "softmax": (lambda: ops.softmax(rows), 8 * n,
                    lambda: (ops.softmax(rows), ops.softmax.reference(x.reshape(-1, ROW)))),
    }
    torch_ops = {}
    try:
        import torch
        tt, tu = torch.from_numpy(x).cuda(), torch.from_numpy(y).cuda()
        tw_t, rows_t = torch.from_numpy(w).cuda(), torch.from_numpy(x).cuda().view(-1, ROW)
        torch_ops = {
            "relu": lambda: torch.relu(tt), "silu": lambda: torch.nn.functional.silu(tt),
            "add": lambda: tt + tu,
            "rmsnorm": lambda: torch.nn.functional.rms_norm(rows_t, (ROW,), tw_t, 1e-6),
            "softmax": lambda: torch.softmax(rows_t, -1)}
        torch_version = torch.__version__
    except ImportError:
        torch_version = None
    copy = copy_time(device, 4 * n, args.repeats)
    copy_bw = 8 * n / copy
    print(f"device: {backend.describe()}; {n:,} float32 elements (2^{args.log2}); "
          f"torch {torch_version}")
    print(f"device-to-device copy (cuMemcpyDtoDAsync): {copy * 1e3:.3f} ms, "
          f"{copy_bw / 1e9:.0f} GB/s read + written\n")
    print("| op | pxvm ms | pxvm GB/s | of copy | NMSE vs numpy | PyTorch ms | PyTorch GB/s |")
    print("|---|---|---|---|---|---|---|")
    for name, (record, moved, check) in cases.items():
        got, expected = check()
        got = got.numpy()
        err = float(np.sum((got - expected) ** 2) / max(np.sum(expected.astype(np.float64) ** 2), 1e-30))
        t = gpu_time(backend, record, args.repeats)
        tt_ = torch_time(torch_ops[name], args.repeats) if name in torch_ops else None
        torch_cols = (f"{tt_ * 1e3:.3f} | {moved / tt_ / 1e9:.0f}" if tt_ else "- | -")
        print(f"| {name} | {t * 1e3:.3f} | {moved / t / 1e9:.0f} | {moved / t / copy_bw:.0%} "
              f"| {err:.1e} | {torch_cols} |")


if __name__ == "__main__":
    main()
