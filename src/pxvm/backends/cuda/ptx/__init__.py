"""pxvm's CUDA kernels: PTX written by Python builders (builder.py), one module per kernel
family, each listing the variants it can emit (`variants()`), so that `pxvm ptx --list`
and the tests (which assemble every one with ptxas) see them all."""

from __future__ import annotations

import functools
from typing import Callable

from . import (attention, decoding, dequantize, elementwise, matmul, quantized, reductions,
               rows, tensor_core, transformer, wgmma, wgmma_quant)
from .builder import ARCHS, Kernel, PtxError, module

FAMILIES = {"elementwise": elementwise, "rows": rows, "matmul": matmul,
            "tensor_core": tensor_core, "quantized": quantized, "reductions": reductions,
            "wgmma": wgmma, "wgmma_quant": wgmma_quant, "attention": attention,
            "dequantize": dequantize, "transformer": transformer, "decoding": decoding}


def kernels() -> dict[str, tuple[Callable[..., Kernel], tuple]]:
    """Every kernel the code can emit: its name -> (builder, arguments)."""
    return dict(_catalogue())


@functools.cache
def _catalogue() -> dict[str, tuple[Callable[..., Kernel], tuple]]:
    # names are known only by building each kernel (seconds for all): once a process
    out = {}
    for family in FAMILIES.values():
        for builder, args in family.variants():
            out[builder(*args).name] = (builder, args)
    return out


def ptx(name: str, arch: str = "sm_90") -> str:
    """The PTX module of kernel `name` for `arch`; PtxError naming the kernels if unknown."""
    found = kernels().get(name)
    if found is None:
        raise PtxError(f"no kernel {name!r}; `pxvm ptx --list` names them all")
    builder, args = found
    return module([builder(*args)], arch)


__all__ = ["ARCHS", "FAMILIES", "Kernel", "PtxError", "kernels", "module", "ptx"]
