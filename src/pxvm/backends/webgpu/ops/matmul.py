"""matmul_naive.wgsl, matmul_blocked.wgsl, matmul_f16.wgsl and matmul_f16_half.wgsl for
pxvm.ops.matmul.

matmul: "gemv" (32 threads an output) for at most GEMV_MAX_ROWS rows, "naive" (an
output a thread) for tiny products, else "blocked" (8 x 8 outputs a thread in
registers, two K slices in workgroup memory) in a tile shape of BLOCKED_SHAPES chosen by
the grid's size, or as `pxvm tune` measured (SHAPE_TUNED).

matmul_f16: "naive" for tiny products, else the f32-product blocked kernel (float16
unpacked into f32 tiles, any device) or, where the device has shader-f16 and `pxvm
tune` measured it faster, "half" (f16 products summed in f32 every HALF_STEPS values of
K; accurate for inputs near unit scale, see the file).
"""

from __future__ import annotations

import numpy as np

from ....core import tuning
from .... import ops
from ..runtime.params import KernelParams, kernel_params, u32

#: Tile shapes of the register-blocked kernels (matmul_blocked.wgsl, matmul_f16_half.wgsl):
#: name -> (tile rows, tile columns, K values a slice). Each thread computes 8 x 8 outputs,
#: so a workgroup has rows/8 x columns/8 threads; each thread moves one or two runs of 4
#: values of each operand a slice. Workgroup memory: 2 slices x depth x 2 x 128 values
#: (rows have room for the widest tile), 4 bytes each in f32 and 2 in f16: 16 KiB at
#: depth 8 in f32, the most WebGPU guarantees; 128x128x16 in f32 needs a device offering
#: 32 KiB (the f16-product kernel's fits in 16).
BLOCKED_SHAPES = {
    "128x128x8": (128, 128, 8),
    "128x128x16": (128, 128, 16),
    "128x64x8": (128, 64, 8),
    "64x128x8": (64, 128, 8),
    "64x64x8": (64, 64, 8),
    "64x64x4": (64, 64, 4),
}
#: Untuned, the blocked kernel takes the first of these shapes whose grid has at least
#: MIN_WORKGROUPS workgroups, else the last: large tiles do the least memory traffic a
#: flop, small ones keep every multiprocessor busy on small or tall-skinny products (an
#: H100 holds 132 x 2 workgroups of 128x128 tiles).
FP32_SHAPES = ("128x128x8", "128x64x8", "64x64x8")
MIN_WORKGROUPS = 256
SHAPE_TUNED = "matmul.webgpu.shape"
GEMV_MAX_ROWS = 4
GEMV_ROWS_PER_WG = 8  # outputs per gemv workgroup: ROWS_PER_WG in matmul_naive.wgsl

#: matmul_f16's kernels; "half" needs shader-f16
F16_KERNELS = ("blocked", "half", "naive")
F16_KERNEL_TUNED = "matmul_f16.webgpu.kernel"
F16_SHAPE_TUNED = "matmul_f16.webgpu.shape"
#: the f16-product kernel's shapes, chosen like FP32_SHAPES (f16 tiles are half the bytes:
#: 128x128x16 fits WebGPU's 16 KiB), and the K values it sums in f16 (a multiple of the
#: shape's depth)
HALF_SHAPES = ("128x128x16", "128x64x8", "64x64x8")
HALF_STEPS = 32


@kernel_params("matmul_naive.wgsl", "matmul_blocked.wgsl", "matmul_f16.wgsl",
               "matmul_f16_half.wgsl")
class MatmulParams(KernelParams):
    M: u32
    N: u32
    K: u32


def choose_kernel(M: int, N: int) -> str:
    """The kernel an (M, K) @ (K, N) product runs: gemv, naive or blocked."""
    if M <= GEMV_MAX_ROWS:
        return "gemv"
    if M * N < 64 * 64:
        return "naive"
    return "blocked"


def choose_shape(M: int, N: int, shapes=FP32_SHAPES) -> str:
    """The first of `shapes` (BLOCKED_SHAPES names) whose grid for an M x N product has at
    least MIN_WORKGROUPS workgroups, else the last."""
    for name in shapes:
        rows, cols, _ = BLOCKED_SHAPES[name]
        if -(-M // rows) * -(-N // cols) >= MIN_WORKGROUPS:
            return name
    return shapes[-1]


def blocked_constants(shape: str, transpose_b: bool) -> dict:
    """The override constants of a BLOCKED_SHAPES shape (matmul_blocked.wgsl's WX, WY, BK)."""
    rows, cols, depth = BLOCKED_SHAPES[shape]
    return {"TRANSPOSE_B": int(bool(transpose_b)), "WX": cols // 8, "WY": rows // 8, "BK": depth}


def workgroup_bytes(shape: str, value_bytes: int = 4) -> int:
    """Workgroup memory of a BLOCKED_SHAPES shape's kernel (value_bytes 2: f16 tiles)."""
    return 2 * 2 * BLOCKED_SHAPES[shape][2] * 128 * value_bytes


def aligned_runs(K: int, N: int, transpose_b: bool) -> bool:
    """Whether the blocked kernels may fetch runs of 4 values with one vector load: every
    run lies wholly inside or outside its matrix (K and, for B (K, N), N multiples of 4)."""
    return K % 4 == 0 and (transpose_b or N % 4 == 0)


def dispatch_blocked(ctx, a, b, out, transpose_b: bool, shape: str, f16: bool = False) -> None:
    """Record matmul_blocked.wgsl for out (M, N) = a @ b (b^T): tile shape `shape` (a
    BLOCKED_SHAPES name); float16 a and b (unpacked to f32) when `f16`."""
    M, K = a.shape
    N = out.shape[1]
    rows, cols, _ = BLOCKED_SHAPES[shape]
    aligned = aligned_runs(K, N, transpose_b)
    entry = ("main_f16" + ("_vec" if aligned else "")) if f16 else (
        "main" + ("_vec4" if aligned else ""))
    ctx.dispatch("matmul_blocked.wgsl", entry, [a, b, out], MatmulParams(M, N, K),
                 (-(-N // cols), -(-M // rows), 1), blocked_constants(shape, transpose_b))


@ops.matmul.kernel("webgpu")
def matmul(ctx, a, b, transpose_b=False):
    M, K = a.shape
    N = b.shape[0] if transpose_b else b.shape[1]
    out = ctx.empty((M, N), np.float32)
    forced = tuning.forced(SHAPE_TUNED)
    kernel = "blocked" if forced else choose_kernel(M, N)
    params = MatmulParams(M, N, K)
    consts = {"TRANSPOSE_B": int(bool(transpose_b))}
    if kernel == "blocked":
        shape = tuning.choice(ctx.backend, SHAPE_TUNED) or choose_shape(M, N)
        dispatch_blocked(ctx, a, b, out, transpose_b, shape)
    elif kernel == "gemv":
        ctx.dispatch("matmul_naive.wgsl", "gemv", [a, b, out], params,
                     (M * N + GEMV_ROWS_PER_WG - 1) // GEMV_ROWS_PER_WG, consts)
    else:
        ctx.dispatch("matmul_naive.wgsl", "main", [a, b, out], params,
                     ((N + 15) // 16, (M + 15) // 16, 1), consts)
    return out


def choose_f16_kernel(M: int, N: int, has_f16: bool, tuned: str | None = None) -> str:
    """The kernel an M x N matmul_f16 runs on a device with shader-f16 or not, `tuned`
    the kernel `pxvm tune` chose there (if any)."""
    if M <= GEMV_MAX_ROWS or M * N < 64 * 64:
        return "naive"
    return "half" if has_f16 and tuned == "half" else "blocked"


def dispatch_f16_half(ctx, a, b, out, transpose_b: bool, shape: str, half_steps: int) -> None:
    """Record matmul_f16_half.wgsl for out = a @ b (b^T), float16 a and b: tile shape
    `shape` (a BLOCKED_SHAPES name), f16 sums over `half_steps` values of K."""
    M, K = a.shape
    N = out.shape[1]
    rows, cols, depth = BLOCKED_SHAPES[shape]
    if half_steps % depth:
        raise ValueError(f"half_steps ({half_steps}) must be a multiple of shape {shape}'s "
                         f"depth {depth}")
    entry = "main_vec" if aligned_runs(K, N, transpose_b) else "main"
    ctx.dispatch("matmul_f16_half.wgsl", entry, [a, b, out], MatmulParams(M, N, K),
                 (-(-N // cols), -(-M // rows), 1),
                 {**blocked_constants(shape, transpose_b), "HALF_STEPS": half_steps})


@ops.matmul_f16.kernel("webgpu")
def matmul_f16(ctx, a, b, transpose_b=False):
    M, K = a.shape
    N = b.shape[0] if transpose_b else b.shape[1]
    out = ctx.empty((M, N), np.float32)
    has_f16 = ctx.has("shader-f16")
    kernel = tuning.forced(F16_KERNEL_TUNED) or choose_f16_kernel(
        M, N, has_f16, tuning.choice(ctx.backend, F16_KERNEL_TUNED))
    if kernel == "half" and not has_f16:  # f16 products do not compile without shader-f16
        kernel = "blocked"
    shape = tuning.choice(ctx.backend, F16_SHAPE_TUNED)
    if kernel == "half":
        dispatch_f16_half(ctx, a, b, out, transpose_b, shape or choose_shape(M, N, HALF_SHAPES),
                          HALF_STEPS)
    elif kernel == "blocked":
        dispatch_blocked(ctx, a, b, out, transpose_b, shape or choose_shape(M, N), f16=True)
    else:
        ctx.dispatch("matmul_f16.wgsl", "main", [a, b, out], MatmulParams(M, N, K),
                     -(-M * N // 64), {"TRANSPOSE_B": int(bool(transpose_b))})
    return out


def _cases(op, dtype, shapes):
    def cases(rng, backend) -> list[tuning.TuningCase]:
        out = []
        for m, k, n in shapes:
            a = rng.standard_normal((m, k)).astype(dtype)
            b = rng.standard_normal((n, k)).astype(dtype)
            ta, tb = backend.from_numpy(a), backend.from_numpy(b)
            out.append(tuning.TuningCase(f"{m} x {k} x {n}",
                                   lambda ta=ta, tb=tb: op(ta, tb, transpose_b=True),
                                   op.reference(a, b, transpose_b=True), 1e-5))
        return out
    return cases


_LARGE = ((2048, 2048, 2048), (512, 576, 1536))
tuning.tunable(SHAPE_TUNED, "matmul's tile shape (rows x columns x K slice) for products "
               "of more than a few rows", tuple(BLOCKED_SHAPES), ("webgpu",),
               _cases(ops.matmul, np.float32, _LARGE))
tuning.tunable(F16_KERNEL_TUNED, "matmul_f16's kernel for products of more than a few rows: "
               "f32 products (blocked), f16 products (half: needs shader-f16) or one output "
               "a thread (naive)", F16_KERNELS, ("webgpu",),
               _cases(ops.matmul_f16, np.float16, _LARGE))
tuning.tunable(F16_SHAPE_TUNED, "matmul_f16's tile shape (rows x columns x K slice)",
               tuple(BLOCKED_SHAPES), ("webgpu",),
               _cases(ops.matmul_f16, np.float16, _LARGE))
