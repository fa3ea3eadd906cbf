"""Seed 000's entry points, where the seed puts them: `pxvm.gpu.executor` (GPUExecutor,
is_gpu_available; implemented in pxvm.compat)."""
