"""Fused FP16 attention on the CUDA backend against PyTorch's FlashAttention in one run.

    python benchmarks/cuda/attention.py [--repeats 20] [--shape 128x64x4] [--issue-only]

Shapes (batch 1, float16 q, k, v): issue 17's, causal over 2,048 tokens with 32 query
heads of 128 and 8 key/value heads (GQA 4:1), then 1,024 and 4,096 tokens, head
dimension 64, and one without the mask. pxvm's `attention_f16` (tensors (S, H, D), float32
out) is timed by CUDA events right around its launch, PyTorch's
`scaled_dot_product_attention` with the flash backend forced (`sdpa_kernel(
SDPBackend.FLASH_ATTENTION)`, tensors (1, H, S, D), float16 out) between its own events:
medians of --repeats runs after a warm-up. GQA on PyTorch's side: `enable_gqa=True` where
the flash backend takes it, else k and v repeated to 32 heads (the table says which).
FLOPs: 4 Sq Skv D Hq (two products), halved with the causal mask. Each pxvm result is
checked against PyTorch's (NMSE).
"""

from __future__ import annotations

import argparse
import contextlib
import statistics

import numpy as np

import pxvm
from pxvm import get_backend
from pxvm.backends.cuda.ops import attention as cuda_attention
from pxvm.backends.cuda.ptx import attention as ptx_attention
from pxvm.core import tuning
from pxvm.tools.bench_ops import TorchPeer

#: (tokens, query heads, key/value heads, head dimension, causal); the first is issue 17's
CONFIGS = [(2048, 32, 8, 128, True), (1024, 32, 8, 128, True), (4096, 32, 8, 128, True),
           (2048, 32, 8, 64, True), (2048, 32, 8, 128, False)]


def _torch_attention(torch, q, k, v, causal: bool):
    """PyTorch's flash attention of (S, H, D) arrays as (1, H, S, D) tensors: a function
    running it, and how its GQA was done."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    from torch.nn.functional import scaled_dot_product_attention as sdpa

    tq, tk, tv = (torch.from_numpy(x).cuda().permute(1, 0, 2).unsqueeze(0).contiguous()
                  for x in (q, k, v))
    group = q.shape[1] // k.shape[1]

    def native():
        with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
            return sdpa(tq, tk, tv, is_causal=causal, enable_gqa=True)

    try:
        native()
        torch.cuda.synchronize()
        return native, "enable_gqa=True"
    except RuntimeError:
        rk, rv = (t.repeat_interleave(group, dim=1).contiguous() for t in (tk, tv))

        def repeated():
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                return sdpa(tq, rk, rv, is_causal=causal)
        return repeated, f"k, v repeated x{group}"


def main() -> None:
    import torch

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--shape", default=None,
                        help="the tensor-core kernel's HEAD_DIMxBLOCK_NxWARPS (one of "
                             + ", ".join("x".join(map(str, s)) for s in ptx_attention.SHAPES)
                             + "), forced for the configurations of that head dimension "
                             "(the `pxvm tune` choice attention_f16.cuda.dD)")
    parser.add_argument("--issue-only", action="store_true", help="issue 17's shape only")
    args = parser.parse_args()
    configs = CONFIGS[:1] if args.issue_only else CONFIGS
    forced = contextlib.nullcontext()
    if args.shape:
        shape = tuple(int(x) for x in args.shape.split("x"))
        if shape not in ptx_attention.SHAPES:
            parser.error(f"--shape {args.shape} is not one of ptx_attention.SHAPES")
        forced = tuning.forcing(cuda_attention.shape_tuned(shape[0]), shape)
        configs = [c for c in configs if c[3] == shape[0]]
    backend = get_backend("cuda")
    with forced:
        measure(backend, configs, args.repeats, torch)


def measure(backend, configs, repeats: int, torch) -> None:
    kernels = ", ".join(f"D {d}: {'x'.join(map(str, cuda_attention.flash_shape(backend.context(), d)))}"
                        for d in ptx_attention.DEFAULT)
    print(f"device: {backend.describe()}; torch {torch.__version__}; pxvm's kernel "
          f"(head dim x keys a tile x warps) {kernels}\n")
    print("| tokens, heads q/kv, D, mask | pxvm ms | pxvm TFLOP/s | torch ms | torch TFLOP/s "
          "| pxvm / torch | torch GQA | NMSE vs torch |")
    print("|---|---|---|---|---|---|---|---|")
    rng = np.random.default_rng(0)
    for s, hq, hkv, d, causal in configs:
        q = rng.standard_normal((s, hq, d), dtype=np.float32).astype(np.float16)
        k = rng.standard_normal((s, hkv, d), dtype=np.float32).astype(np.float16)
        v = rng.standard_normal((s, hkv, d), dtype=np.float32).astype(np.float16)
        tq, tk, tv = (backend.from_numpy(x) for x in (q, k, v))
        samples = []
        for i in range(repeats + 1):
            with pxvm.Batch(backend, timestamps=True) as batch:
                out = pxvm.ops.attention_f16(tq, tk, tv, causal=causal)
            batch.execute()
            if i:  # the first compiles the kernel
                samples.append(batch.device_seconds)
        t = statistics.median(samples)
        got = batch.read(out).astype(np.float64)

        peer, gqa = _torch_attention(torch, q, k, v, causal)
        tt = TorchPeer(torch).time(peer, repeats)
        expected = peer()[0].permute(1, 0, 2).double().cpu().numpy()
        err = float(np.sum((got - expected) ** 2) / np.sum(expected ** 2))
        flops = 4.0 * s * s * d * hq / (2 if causal else 1)
        print(f"| {s}, {hq}/{hkv}, {d}, {'causal' if causal else 'none'} | {t * 1e3:.3f} | "
              f"{flops / t / 1e12:.1f} | {tt * 1e3:.3f} | {flops / tt / 1e12:.1f} | "
              f"{tt / t:.2f} | {gqa} | {err:.1e} |", flush=True)


if __name__ == "__main__":
    main()
