"""The CUDA backend's kernels for the ops, one module per module of pxvm.ops: each
launches the PTX its builders (ptx/) write and registers the kernels
(`op.kernel("cuda")`) when imported."""

from . import (attention, decoding, elementwise, indexing, matmul, normalization,  # noqa: F401
               quantized, reductions, transformer)
