"""The GPU executor: the image goes up as it is (one RGBA pixel per u32 word), the host
records one dispatch per validated instruction into a single submit, and the mutated
image comes back. Written only against the WebGPU backend's recording context, so the
browser page can record the same dispatches and replay them with its own WebGPU."""

from __future__ import annotations

import numpy as np

from ..backends.webgpu import WebGPUBackend, webgpu_backend
from ..backends.webgpu.runtime.params import KernelParams, i32, kernel_params, u32
from .protocol import (OP_ADD, OP_ARGMAX_I32, OP_BIAS_I32, OP_DOT_RGB, OP_MATMUL,
                       OP_MATMUL_I8, OP_RELU, OP_RELU_I8, OP_REQUANT, Program, check_image,
                       validate_program)

KERNEL = "pxvm_interpreter.wgsl"
WG = 256


@kernel_params(KERNEL)
class InstructionParams(KernelParams):
    width: u32
    r0: u32     # first row argument (or matrix A / int32 matrix row)
    r1: u32     # second (matrix B / bias / params / output row)
    r2: u32     # third (result row)
    m: u32      # rows of the result
    k: u32      # inner dimension
    n: u32      # columns of the result
    mult: u32   # REQUANT multiplier
    shift: u32  # REQUANT shift
    zp: i32     # REQUANT zero point


def _params(width, r0=0, r1=0, r2=0, m=0, k=0, n=0, mult=0, shift=0, zp=0) -> InstructionParams:
    return InstructionParams(width, r0, r1, r2, m, k, n, mult, shift, int(zp))


def record_program(ctx, img: np.ndarray, program: Program | None = None):
    """Record `img`'s program into `ctx` (a WebGPUContext); returns the device tensor of
    the image words."""
    img = check_image(img)
    if program is None:
        program = validate_program(img)
    h, w = img.shape[:2]
    words = ctx.tensor(img.view("<u4").reshape(h * w))
    for ins in program.instructions:
        op = ins.opcode
        if op in (OP_DOT_RGB, OP_ADD):
            ra, rb, ro = ins.rows
            entry = "dot" if op == OP_DOT_RGB else "add"
            ctx.dispatch(KERNEL, entry, [words], _params(w, ra, rb, ro), (1, 1, 1))
        elif op == OP_RELU:
            continue
        elif op in (OP_MATMUL, OP_MATMUL_I8):
            a, b, c = ins.mats
            ctx.dispatch(KERNEL, "matmul", [words],
                         _params(w, a.row, b.row, c.row, a.rows, a.cols, b.cols),
                         -(-c.size // WG), {"SIGNED": int(op == OP_MATMUL_I8)})
        elif op == OP_BIAS_I32:
            c, bias = ins.mats
            ctx.dispatch(KERNEL, "bias", [words], _params(w, c.row, bias.row, 0, c.rows, 0, c.cols),
                         -(-c.size // WG))
        elif op == OP_REQUANT:
            c, out = ins.mats
            mult, shift, zp = ins.extra
            ctx.dispatch(KERNEL, "requant", [words],
                         _params(w, c.row, 0, out.row, c.rows, 0, c.cols, mult, shift, zp),
                         -(-c.size // WG))
        elif op == OP_RELU_I8:
            (m,) = ins.mats
            ctx.dispatch(KERNEL, "relu_i8", [words], _params(w, m.row, 0, 0, m.rows, 0, m.cols),
                         -(-m.size // WG))
        elif op == OP_ARGMAX_I32:
            m, out = ins.mats
            ctx.dispatch(KERNEL, "argmax", [words], _params(w, m.row, out.row, 0, m.rows, 0, m.cols),
                         -(-m.rows // WG))
    return words


def run_program_gpu(img: np.ndarray, backend: WebGPUBackend | None = None) -> np.ndarray:
    """Run a .pxi image on the GPU; returns the mutated image (H, W, 4) uint8."""
    backend = backend if backend is not None else webgpu_backend()
    img = check_image(img)
    program = validate_program(img, max_pixels=backend.device.max_binding // 4)
    ctx = backend.context()
    words = record_program(ctx, img, program)
    staged = ctx.stage(words)
    ctx.submit()
    h, w = img.shape[:2]
    return staged.result(np.uint32, h * w).view(np.uint8).reshape(h, w, 4).copy()
