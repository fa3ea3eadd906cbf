"""Matrix product (matmul_naive.wgsl, matmul_tiled.wgsl, matmul_blocked.wgsl): C = A @ B or
A @ B^T for any M, N, K >= 1. WebGPU kernels: "naive" (one output per thread), "gemv" (32
threads per output, for matrix-vector), "tiled" (64x64 tiles, 4x4 a thread), "tiled_wide"
(64x128 tiles, 4x8 a thread) and "blocked" (8x8 a thread in registers, two K slices in
workgroup memory; its tile shapes are BLOCKED_SHAPES, "blocked" choosing one by the grid's
size and "blocked_<shape>" naming one). `kernel="auto"` picks gemv for small M, naive for
tiny products and the blocked kernel for the rest. On CUDA (pxvm.kernels.ptx.matmul):
"naive", and "tiled" (128x128 tiles, 8x8 a thread) for the rest."""

from __future__ import annotations

import numpy as np

from ..kernels.ptx import matmul as ptx_matmul
from ..kernels.ptx import tensor_core as ptx_tensor_core
from ..kernels.ptx import wgmma as ptx_wgmma
from ..runtime.webgpu.params import KernelParams, kernel_params, u32
from . import tuning
from .elementwise import add
from .registry import MissingKernelError, meta, op, require

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
#: "blocked" (and "auto") take the first of these shapes whose grid has at least
#: MIN_WORKGROUPS workgroups, else the last: large tiles do the least memory traffic a
#: flop, small ones keep every multiprocessor busy on small or tall-skinny products (an
#: H100 holds 132 x 2 workgroups of 128x128 tiles). First guesses, to be set from
#: benchmarks/webgpu/matmul.py --variants.
FP32_SHAPES = ("128x128x8", "128x64x8", "64x64x8")
MIN_WORKGROUPS = 256

KERNELS = ("auto", "naive", "tiled", "tiled_wide", "gemv", "blocked",
           *(f"blocked_{name}" for name in BLOCKED_SHAPES))
GEMV_MAX_ROWS = 4
GEMV_ROWS_PER_WG = 8  # outputs per gemv workgroup: ROWS_PER_WG in matmul_naive.wgsl
# Above this many outputs the 64x64 tiles lost speed on the H100 (BENCHMARKS.md); 64x128
# tiles move a quarter less data from memory per flop. Only an explicit "tiled" or
# "tiled_wide" uses these kernels now: "auto" takes the blocked kernel.
WIDE_MIN_OUTPUTS = 2048 * 2048


@kernel_params("matmul_naive.wgsl", "matmul_tiled.wgsl", "matmul_blocked.wgsl",
               "matmul_f16.wgsl", "matmul_f16_half.wgsl")
class MatmulParams(KernelParams):
    M: u32
    N: u32
    K: u32


def _infer(a, b, transpose_b=False, kernel="auto"):
    require(len(a.shape) == 2 and len(b.shape) == 2,
            f"matmul takes 2-D operands, got shapes {tuple(a.shape)} and {tuple(b.shape)}")
    require(kernel in KERNELS, f"kernel must be one of {KERNELS}, got {kernel!r}")
    M, K = a.shape
    N, Kb = (b.shape if transpose_b else b.shape[::-1])
    require(K == Kb,
            f"matmul inner dimensions differ: A is {tuple(a.shape)}, B is {tuple(b.shape)}"
            + (" (transpose_b: B is (N, K))" if transpose_b else " (B is (K, N))"))
    require(M > 0 and N > 0 and K > 0, f"matmul needs M, N, K >= 1, got M={M}, N={N}, K={K}")
    return meta((M, N), np.float32)


def choose_kernel(M: int, N: int, K: int) -> str:
    """The WebGPU kernel "auto" runs for an (M, K) @ (K, N) product."""
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


def _matmul_webgpu(ctx, a, b, transpose_b=False, kernel="auto"):
    M, K = a.shape
    N = b.shape[0] if transpose_b else b.shape[1]
    out = ctx.empty((M, N), np.float32)
    kernel = choose_kernel(M, N, K) if kernel == "auto" else kernel
    consts = {"TRANSPOSE_B": int(bool(transpose_b))}
    params = MatmulParams(M, N, K)
    if kernel.startswith("blocked"):
        shape = kernel.removeprefix("blocked_") if kernel != "blocked" else choose_shape(M, N)
        dispatch_blocked(ctx, a, b, out, transpose_b, shape)
    elif kernel == "tiled_wide":
        ctx.dispatch("matmul_tiled.wgsl", "main_wide", [a, b, out], params,
                     ((N + 127) // 128, (M + 63) // 64, 1), consts)
    elif kernel == "tiled":
        ctx.dispatch("matmul_tiled.wgsl", "main", [a, b, out], params,
                     ((N + 63) // 64, (M + 63) // 64, 1), consts)
    elif kernel == "gemv":
        ctx.dispatch("matmul_naive.wgsl", "gemv", [a, b, out], params,
                     (M * N + GEMV_ROWS_PER_WG - 1) // GEMV_ROWS_PER_WG, consts)
    else:
        ctx.dispatch("matmul_naive.wgsl", "main", [a, b, out], params,
                     ((N + 15) // 16, (M + 15) // 16, 1), consts)
    return out


#: the tiled CUDA kernel keeps two K slices in shared memory: one barrier a slice instead
#: of two, faster on the H100 (BENCHMARKS.md; benchmarks set it)
FP32_DOUBLE_BUFFER = True


def _matmul_cuda(ctx, a, b, transpose_b=False, kernel="auto"):
    """"naive" or "tiled" (pxvm.kernels.ptx.matmul); the WebGPU-only kernel names (gemv,
    tiled_wide) and "auto" take the tiled kernel except for tiny products."""
    M, K = a.shape
    N = b.shape[0] if transpose_b else b.shape[1]
    out = ctx.empty((M, N), np.float32)
    if kernel == "naive" or (kernel == "auto" and M * N < 64 * 64):
        ctx.launch(ptx_matmul.naive, (bool(transpose_b),), [a, b, out, M, N, K],
                   ctx.stride_grid(M * N))
    else:
        tile = ptx_matmul.TILE
        aligned = K % 4 == 0 and (transpose_b or N % 4 == 0)
        ctx.launch(ptx_matmul.tiled, (bool(transpose_b), aligned, FP32_DOUBLE_BUFFER),
                   [a, b, out, M, N, K],
                   (-(-N // tile), -(-M // tile), 1), block=ptx_matmul.THREADS)
    return out


@op(infer=_infer, webgpu=_matmul_webgpu, cuda=_matmul_cuda)
def matmul(a, b, transpose_b=False, kernel="auto", *, backend="auto"):
    """A (M, K) @ B (K, N), or @ B.T for B of shape (N, K) when transpose_b. `kernel`
    picks the WebGPU kernel (the module's docstring); "auto" chooses by shape."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return (a @ (b.T if transpose_b else b)).astype(np.float32)


#: (block columns, warp columns, stages) of the mma.sync tensor-core kernel and (block
#: columns, stages, groups in flight) of Hopper's wgmma one (benchmarks set them); "auto"
#: launches wgmma on sm_90, mma.sync elsewhere
TENSOR_CORE_SHAPE = ptx_tensor_core.DEFAULT
WGMMA_SHAPE = ptx_wgmma.DEFAULT
TENSOR_CORE_KERNEL = "auto"


def _infer_f16(a, b, transpose_b=False):
    return _infer(a, b, transpose_b)


def _matmul_f16_cuda(ctx, a, b, transpose_b=False):
    K = a.shape[1]
    if not transpose_b or K % 8:
        raise MissingKernelError(
            "matmul_f16 on CUDA takes B as (N, K) (transpose_b=True) and K a multiple of 8 "
            f"so far, not {'B as (K, N)' if not transpose_b else f'K = {K}'}; run it on numpy")
    return record_f16_product(ctx, a, b)


def _tensor_core_kernel(ctx) -> str:
    if TENSOR_CORE_KERNEL != "auto":
        return TENSOR_CORE_KERNEL
    return "wgmma" if ctx.device.info.arch == "sm_90" else "mma"


def glu_takes(ctx, n: int, activation: str) -> bool:
    """Whether a GLU of a weight of `n` rows [gate; up] runs as one tensor-core launch
    (record_f16_glu): wgmma, and gate rows in whole halves of its block."""
    return (_tensor_core_kernel(ctx) == "wgmma" and activation in ptx_wgmma.GLU_ACTIVATIONS
            and (n // 2) % (WGMMA_SHAPE[0] // 2) == 0 and n % 2 == 0)


def record_f16_glu(ctx, a, b, activation: str):
    """(M, N / 2) float32 = act(a @ gate^T) * (a @ up^T) of float16 CUDA tensors, b (N, K)
    in ptx_wgmma.glu_rows' order (glu_takes)."""
    M, K = a.shape
    N = b.shape[0]
    out = ctx.empty((M, N // 2), np.float32)
    block_n, stages, _ = shape = WGMMA_SHAPE
    ctx.launch(ptx_wgmma.matmul_f16_wgmma, (*shape, False, activation), [a, b, out, M, N, K],
               (-(-N // block_n), -(-M // ptx_wgmma.ROWS), 1), block=ptx_wgmma.THREADS,
               shared_bytes=ptx_wgmma.shared_bytes(block_n, stages))
    return out


def record_f16_product(ctx, a, b, residual=None):
    """(M, N) float32 = a (M, K) @ b (N, K)^T [+ residual (M, N) float32] of float16 CUDA
    tensors, K a multiple of 8, on tensor cores: the kernel matmul_f16 launches (and the
    prompts' quantized products, pxvm.ops.quantized). The residual is added in the
    product's own pass on Hopper (wgmma), by a second launch elsewhere."""
    M, K = a.shape
    N = b.shape[0]
    out = ctx.empty((M, N), np.float32)
    if _tensor_core_kernel(ctx) == "wgmma":
        block_n, stages, _ = shape = WGMMA_SHAPE
        added = residual is not None
        ctx.launch(ptx_wgmma.matmul_f16_wgmma, (*shape, added),
                   [a, b, out, M, N, K, *([residual] if added else [])],
                   (-(-N // block_n), -(-M // ptx_wgmma.ROWS), 1), block=ptx_wgmma.THREADS,
                   shared_bytes=ptx_wgmma.shared_bytes(block_n, stages))
        return out
    block_n, warp_n, stages = shape = TENSOR_CORE_SHAPE
    ctx.launch(ptx_tensor_core.matmul_f16_bt, shape, [a, b, out, M, N, K],
               (-(-N // block_n), -(-M // ptx_tensor_core.TILE), 1),
               block=ptx_tensor_core.threads(block_n, warp_n))
    if residual is None:
        return out
    return add.kernels["cuda"](ctx, out, residual)


#: matmul_f16's WebGPU kernel: "half" multiplies in f16 pairs with f32 totals every
#: HALF_STEPS values of K (matmul_f16_half.wgsl: needs shader-f16; accurate for inputs
#: near unit scale, see the file), "blocked" in f32 (matmul_blocked.wgsl's f16 entry
#: points: products exact, any device), "naive" one output a thread (matmul_f16.wgsl).
#: "auto": "naive" for tiny products and M <= GEMV_MAX_ROWS, else "blocked" unless `pxvm
#: tune` measured "half" faster on this device (it was slower on the H100: BENCHMARKS.md).
F16_KERNELS = ("auto", "half", "blocked", "naive")
F16_KERNEL = "auto"
#: the f16-product kernel's shapes, chosen like FP32_SHAPES (f16 tiles are half the bytes:
#: 128x128x16 fits WebGPU's 16 KiB), and the K values it sums in f16 (a multiple of the
#: shape's depth)
HALF_SHAPES = ("128x128x16", "128x64x8", "64x64x8")
HALF_STEPS = 32
#: the f32-product kernel's shapes for float16 operands
F16_BLOCKED_SHAPES = FP32_SHAPES


def choose_f16_kernel(M: int, N: int, has_f16: bool, tuned: str | None = None) -> str:
    """The kernel F16_KERNEL = "auto" runs for an M x N matmul_f16, on a device with
    shader-f16 or not, `tuned` the kernel `pxvm tune` chose there (if any)."""
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


def _matmul_f16_webgpu(ctx, a, b, transpose_b=False):
    M, K = a.shape
    N = b.shape[0] if transpose_b else b.shape[1]
    out = ctx.empty((M, N), np.float32)
    kernel = F16_KERNEL
    if kernel == "auto":
        kernel = choose_f16_kernel(M, N, ctx.has("shader-f16"),
                                   tuning.choice(ctx.backend, "matmul_f16.webgpu"))
    if kernel == "half":
        dispatch_f16_half(ctx, a, b, out, transpose_b, choose_shape(M, N, HALF_SHAPES),
                          HALF_STEPS)
    elif kernel == "blocked":
        dispatch_blocked(ctx, a, b, out, transpose_b, choose_shape(M, N, F16_BLOCKED_SHAPES),
                         f16=True)
    elif kernel == "naive":
        ctx.dispatch("matmul_f16.wgsl", "main", [a, b, out], MatmulParams(M, N, K),
                     -(-M * N // 64), {"TRANSPOSE_B": int(bool(transpose_b))})
    else:
        raise ValueError(f"F16_KERNEL must be one of {F16_KERNELS}, not {kernel!r}")
    return out


@op(infer=_infer_f16, dtypes=("f16",), webgpu=_matmul_f16_webgpu, cuda=_matmul_f16_cuda)
def matmul_f16(a, b, transpose_b=False, *, backend="auto"):
    """A @ B (A @ B^T with transpose_b) of float16 matrices, float32 results: on CUDA
    tensor cores with float32 accumulation (pxvm.kernels.ptx.tensor_core); on WebGPU
    register-blocked tiles, multiplying in f16 with float32 totals where the device has
    shader-f16 and in float32 elsewhere (F16_KERNEL says which)."""
    a = np.asarray(a, np.float64)
    b = np.asarray(b, np.float64)
    return (a @ (b.T if transpose_b else b)).astype(np.float32)


def _f16_cases(rng, backend) -> list[tuning.Case]:
    out = []
    for m, k, n in ((2048, 2048, 2048), (512, 576, 1536)):
        a = rng.standard_normal((m, k)).astype(np.float16)
        b = rng.standard_normal((n, k)).astype(np.float16)
        ta, tb = backend.from_numpy(a), backend.from_numpy(b)
        out.append(tuning.Case(f"{m} x {k} x {n}",
                               lambda ta=ta, tb=tb: matmul_f16(ta, tb, transpose_b=True),
                               matmul_f16.reference(a, b, transpose_b=True), 1e-5))
    return out


tuning.tunable("matmul_f16.webgpu", "matmul_f16's kernel where the device has shader-f16: "
               "f16 products (half) or f32 products (blocked)", ("blocked", "half"),
               ("webgpu",), _f16_cases)
