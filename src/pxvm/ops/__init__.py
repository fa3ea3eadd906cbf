"""The op library: the math. Every op has one numpy reference (`op.reference`), its
shape inference and its contract, and the same signature on every backend:
`op(*inputs, **params, backend="auto")`, returning a Tensor (registry.py says how an op
is declared and run). Backends register kernels for the ops in their own packages
(pxvm.backends); nothing here names a backend.

The general ops are here by name; the fused ops of a transformer layer are in
`pxvm.ops.transformer`, decoding's steps in `pxvm.ops.decoding`, GGML's tensor types in
`pxvm.ops.quant_types`.
"""

from __future__ import annotations

from . import decoding, transformer
from .attention import attention, attention_f16
from .convolution import conv2d, convolve2d
from .elementwise import (add, clip, div, elu, gelu, gelu_tanh, leaky_relu, maximum, minimum,
                          mul, relu, scale, sigmoid, silu, sub, swish, tanh)
from .indexing import concat_columns, slice_columns, slice_rows, write_rows
from .matmul import matmul, matmul_f16
from .normalization import layer_norm, log_softmax, rmsnorm, rope, softmax
from .quantized import embedding_quant, matmul_quant
from .reductions import argmax, dot, max, sum  # noqa: A004 - numpy's names
from .registry import REGISTRY, MissingKernelError, Op

__all__ = [
    "REGISTRY", "MissingKernelError", "Op", "add", "argmax", "attention", "attention_f16", "clip",
    "concat_columns", "conv2d", "convolve2d", "decoding", "div", "dot", "elu",
    "embedding_quant", "gelu", "gelu_tanh", "layer_norm", "leaky_relu", "log_softmax",
    "matmul", "matmul_f16", "matmul_quant", "max", "maximum", "minimum", "mul", "relu", "rmsnorm", "rope",
    "scale", "sigmoid", "silu", "slice_columns", "slice_rows", "softmax", "sub", "sum", "swish", "tanh",
    "transformer", "write_rows",
]
