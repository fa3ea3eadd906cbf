"""Kernel files extended with subgroup operations: `*_subgroups.wgsl` files replace some
functions of their base (the products' column sums, attention's max and sum) by
subgroup shuffles and reductions, so one barrier does what a tree of them did. A module
using them does not compile on a device without the feature, hence files of their own
(runtime/shaders.py joins a variant to its base)."""

from __future__ import annotations

from ....core import tuning
from ....ops.quantized import product_cases

#: whether the ops take their subgroup variants where the device has subgroups; untuned,
#: they do (faster on the H100: docs/benchmarks-log.md)
TUNED = "webgpu.subgroup_kernels"


def subgroup_variant(ctx, kernel: str, variant: str) -> str:
    """`variant`, a kernel file extending `kernel` with subgroup operations, where the
    device has subgroups (and they are not tuned off), else `kernel`."""
    if not ctx.has("subgroup"):
        return kernel
    return kernel if tuning.choice(ctx.backend, TUNED) is False else variant


# decoding's products (a row of x, many lanes a column: the column sums take subgroups)
tuning.tunable(TUNED, "whether decoding's products and attention use subgroup operations "
               "where the device has them", (True, False), ("webgpu",),
               product_cases(((1, 4096, 4096), (1, 1536, 576))))
