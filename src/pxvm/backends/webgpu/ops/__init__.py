"""The WebGPU backend's kernels for the ops, one module per module of pxvm.ops: each
dispatches its WGSL files (kernels/) with their typed parameters and registers the
kernels (`op.kernel("webgpu")`) when imported."""

from . import (attention, convolution, decoding, elementwise, indexing, matmul,  # noqa: F401
               normalization, quantized, reductions, transformer)
