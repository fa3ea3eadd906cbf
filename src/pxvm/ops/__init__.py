"""The op library. Every op has one numpy reference and one WGSL implementation with the
same signature on both backends: `op(*inputs, **params, backend="auto"|"gpu"|"cpu")`.

Each family module registers its ops in `REGISTRY`; they are exported here by name.
"""

from __future__ import annotations

from . import (attention, convolution, elementwise, indexing, matmul, normalization, quantized,
               reductions)
from .registry import REGISTRY, Op

globals().update(REGISTRY)
swish = REGISTRY["silu"]

__all__ = ["REGISTRY", "Op", "swish", *sorted(REGISTRY)]
