"""The op library. Every op has one numpy reference and one WGSL implementation with the
same signature on both backends: `op(*inputs, **params, backend="auto"|"gpu"|"cpu")`.
"""

from __future__ import annotations

from .registry import REGISTRY, Op
from .elementwise import (add, clip, div, elu, gelu, gelu_tanh, leaky_relu, maximum, minimum,
                          mul, relu, scale, sigmoid, silu, sub, swish, tanh)

__all__ = ["REGISTRY", "Op", "add", "clip", "div", "elu", "gelu", "gelu_tanh", "leaky_relu",
           "maximum", "minimum", "mul", "relu", "scale", "sigmoid", "silu", "sub", "swish",
           "tanh"]
