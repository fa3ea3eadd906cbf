"""Dispatch plans: the GPU work an op (or a pxVM program) records, captured without a GPU
so a browser can replay it with its own WebGPU.

`PlanContext` implements the same interface as `backends.webgpu_backend.GpuContext`
(`empty`, `tensor`, `dispatch`, `has`), so the ops' own `gpu()` functions and
`pxvm.vm.record_program` produce the plan: the dispatch logic exists once, in Python,
and the page only replays buffers, pipelines and workgroup counts.

`CASES` is the conformance table (op name -> input generator, parameters, threshold);
`conformance_plan(name)` runs the op's GPU recording on fresh random inputs and attaches
the numpy reference's output.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..backends import pack_params
from ..runtime import workgroup_grid
from ..runtime.device import UNIFORM_SLOT
from ..tensor import Tensor, as_supported_array, dtype_name

#: WebGPU's guaranteed maxComputeWorkgroupsPerDimension; plans must run on any adapter.
MAX_GROUPS_PER_DIM = 65535

NMSE_ELEMENTWISE = 1e-7
NMSE_NORM = 1e-6
NMSE_LONG = 5e-4


def b64(data: bytes) -> str:
    return base64.b64encode(bytes(data)).decode("ascii")


class PlanBuffer:
    """A buffer of the plan: initial bytes for inputs, None for outputs (poisoned by the
    page with 0xFF, as the Python runtime does in tests, so unwritten elements fail)."""

    __slots__ = ("index", "nbytes", "data", "__weakref__")

    def __init__(self, index: int, nbytes: int, data: bytes | None):
        self.index = index
        self.nbytes = int(nbytes)
        self.data = data

    def binding_size(self) -> int:
        # same rounding as runtime.device.Allocation, so bindings cover identical ranges
        return max(4, (self.nbytes + 3) // 4 * 4)


class PlanBackend:
    """What recorded tensors point to. One per plan: ops that cache device tensors per
    backend (rope's angle tables) then never reuse a buffer of another plan."""

    name = "plan"

    def __init__(self, context: "PlanContext"):
        self.context = context

    def from_numpy(self, array) -> Tensor:
        return self.context.tensor(array)

    def to_numpy(self, tensor):
        raise RuntimeError("a recorded plan has no values; replay it on a GPU to read results")


class PlanContext:
    """A GpuContext stand-in that records a dispatch plan instead of running anything."""

    def __init__(self, features: tuple[str, ...] = ()):
        self.features = frozenset(features)
        self.backend = PlanBackend(self)
        self.buffers: list[PlanBuffer] = []
        self.dispatches: list[dict] = []

    # ---- the GpuContext interface ---------------------------------------------------
    def empty(self, shape, dtype, what: str = "output") -> Tensor:
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        return Tensor(shape, dtype, self.backend, self._buffer(nbytes, None))

    def tensor(self, array) -> Tensor:
        arr = np.ascontiguousarray(as_supported_array(array))
        return Tensor(arr.shape, arr.dtype, self.backend, self._buffer(arr.nbytes, arr.tobytes()))

    #: Plans are replayed on whatever adapter the browser has; record the GPU variant.
    is_software = False

    def has(self, feature: str) -> bool:
        return feature in self.features

    def dispatch(self, kernel: str, entry: str, tensors, params: tuple | bytes | None,
                 groups, constants: dict | None = None) -> None:
        if isinstance(params, tuple):
            params = pack_params(*params)
        if params is not None and len(params) > UNIFORM_SLOT:
            raise ValueError(f"kernel parameters of {len(params)} bytes exceed {UNIFORM_SLOT}")
        if isinstance(groups, int):
            groups = workgroup_grid(groups, MAX_GROUPS_PER_DIM)
        for t in tensors:
            if not isinstance(t.storage, PlanBuffer) or t.backend is not self.backend:
                raise ValueError(f"{kernel}:{entry}: a bound tensor was not recorded in this plan")
        self.dispatches.append({
            "kernel": kernel,
            "entry": entry,
            "bindings": [t.storage.index for t in tensors],
            "params": None if params is None else b64(params),
            "groups": [int(g) for g in groups],
            "constants": {k: float(v) for k, v in sorted((constants or {}).items())},
        })

    # ---- the plan -------------------------------------------------------------------
    def _buffer(self, nbytes: int, data: bytes | None) -> PlanBuffer:
        buf = PlanBuffer(len(self.buffers), nbytes, data)
        self.buffers.append(buf)
        return buf

    def plan(self, result: Tensor) -> dict:
        """The JSON-ready plan whose output is `result` (a tensor recorded here)."""
        if not isinstance(result.storage, PlanBuffer) or result.backend is not self.backend:
            raise ValueError("the result tensor was not recorded in this plan")
        return {
            "buffers": [{"nbytes": b.nbytes, "size": b.binding_size(),
                         "data": None if b.data is None else b64(b.data)} for b in self.buffers],
            "dispatches": self.dispatches,
            "uniform_size": UNIFORM_SLOT,
            "result": {"buffer": result.storage.index, "dtype": dtype_name(result.dtype),
                       "shape": list(result.shape), "nbytes": result.nbytes},
        }


def record_op(op, inputs: list[np.ndarray], params: dict, features=()) -> dict:
    """Plan of one registered op on `inputs` (numpy arrays), through its own gpu()."""
    ctx = PlanContext(features)
    tensors = [ctx.tensor(x) for x in inputs]
    op.infer(tensors, params)
    return ctx.plan(op.gpu(ctx, *tensors, **params))


# ---- the conformance table ------------------------------------------------------------
@dataclass(frozen=True)
class Case:
    """Inputs from `make(rng)`, keyword `params`, and the NMSE the result must meet
    (integer results must match exactly). `flops(inputs)` and `bytes_moved(inputs)` give
    the work of one run, for benchmarks."""

    make: Callable[[np.random.Generator], list]
    params: dict = field(default_factory=dict)
    threshold: float = NMSE_ELEMENTWISE
    flops: Callable[[list], float] | None = None
    bytes_moved: Callable[[list], float] | None = None


def _normal(*shape, scale=3.0):
    return lambda rng: [(rng.standard_normal(shape) * scale).astype(np.float32)]


def _away_from_zero(rng, shape):
    return (rng.uniform(0.5, 2.0, shape) * rng.choice([-1.0, 1.0], shape)).astype(np.float32)


def _binary(rng):
    # broadcasting across a middle axis, odd extents that match no tile size
    return [(rng.standard_normal((7, 1, 33)) * 3).astype(np.float32),
            _away_from_zero(rng, (5, 33))]


def _binary_int(dtype):
    def make(rng):
        lo, hi = (-1000, 1000) if dtype == np.int32 else (0, 2000)
        return [rng.integers(lo, hi, (7, 33)).astype(dtype), rng.integers(lo, hi, (33,)).astype(dtype)]
    return make


def _size_bytes(inputs):
    return 4.0 * sum(x.size for x in inputs)


def _quantized_rows(rng, qtype, n, k):
    """Raw GGUF blocks of a random (n, k) weight, made by the gguf package's quantizer."""
    import gguf

    w = rng.standard_normal((n, k)).astype(np.float32)
    raw = gguf.quants.quantize(w, gguf.GGMLQuantizationType(qtype))
    return np.ascontiguousarray(raw).view(np.uint8).reshape(n, -1)


def _quantized_matmul(qtype, rows=13):
    return lambda rng: [rng.standard_normal((3, 64)).astype(np.float32),
                        _quantized_rows(rng, qtype, rows, 64)]


def _with_gain(make):
    """(x, W) -> (x, gain, W): the inputs of the norm-fused products."""
    def with_gain(rng):
        x, w = make(rng)
        return [x, (1.0 + 0.3 * rng.standard_normal(x.shape[1])).astype(np.float32), w]
    return with_gain


def _cached_attention(tokens, n_ctx, pos):
    """attention_cached's inputs: 4 query heads and 2 kv heads of 8, `tokens` new tokens
    at `pos`, caches of `n_ctx` rows."""
    return lambda rng: [rng.standard_normal((tokens, 64)).astype(np.float32),
                        rng.standard_normal((n_ctx, 2, 8)).astype(np.float32),
                        rng.standard_normal((n_ctx, 2, 8)).astype(np.float32),
                        np.array([0, pos], np.int32)]


def _projected_attention(tokens, n_ctx, pos):
    """The same, then a Q4_1 output projection and the residual."""
    attention = _cached_attention(tokens, n_ctx, pos)
    return lambda rng: [*attention(rng), _quantized_rows(rng, 3, 13, 32),
                        rng.standard_normal((tokens, 13)).astype(np.float32)]


def _quantized_embedding(qtype):
    return lambda rng: [rng.integers(0, 13, 5).astype(np.int32), _quantized_rows(rng, qtype, 13, 64)]


UNARY = {"relu": {}, "leaky_relu": {"alpha": 0.07}, "elu": {"alpha": 0.8}, "sigmoid": {},
         "tanh": {}, "silu": {}, "gelu_tanh": {}, "gelu": {}, "clip": {"lo": -0.5, "hi": 0.9},
         "scale": {"factor": 1.7}}
BINARY = ("add", "sub", "mul", "div", "maximum", "minimum")

CASES: dict[str, list[Case]] = {}
for _name, _params in UNARY.items():
    CASES[_name] = [Case(_normal(7, 33), _params)]
for _name in BINARY:
    CASES[_name] = [Case(_binary)]
    if _name != "div":
        CASES[_name] += [Case(_binary_int(np.int32), threshold=0.0),
                         Case(_binary_int(np.uint32), threshold=0.0)]
CASES.update({
    "sum": [Case(_normal(1001, scale=1.0), threshold=NMSE_LONG)],
    "max": [Case(_normal(1001), threshold=0.0)],
    "dot": [Case(lambda rng: [rng.standard_normal(777).astype(np.float32) for _ in range(2)],
                 threshold=NMSE_LONG)],
    "argmax": [Case(_normal(7, 257), {"axis": -1}, threshold=0.0),
               Case(_normal(333), {"axis": None}, threshold=0.0)],
    "softmax": [Case(_normal(7, 33), threshold=NMSE_NORM)],
    "log_softmax": [Case(_normal(7, 33), threshold=NMSE_NORM)],
    "rmsnorm": [Case(lambda rng: [rng.standard_normal((7, 33)).astype(np.float32),
                                  rng.standard_normal(33).astype(np.float32)],
                     {"eps": 1e-5}, threshold=NMSE_NORM)],
    "layer_norm": [Case(lambda rng: [rng.standard_normal((7, 33)).astype(np.float32),
                                     rng.standard_normal(33).astype(np.float32),
                                     rng.standard_normal(33).astype(np.float32)],
                        threshold=NMSE_NORM)],
    "rope": [Case(_normal(7, 3, 16, scale=1.0), {"pos_offset": 5}, threshold=NMSE_NORM),
             Case(_normal(5, 2, 8, scale=1.0), {"style": "neox"}, threshold=NMSE_NORM)],
    "matmul": [Case(lambda rng: [rng.standard_normal((33, 17)).astype(np.float32),
                                 rng.standard_normal((17, 45)).astype(np.float32)],
                    threshold=NMSE_LONG),
               Case(lambda rng: [rng.standard_normal((7, 33)).astype(np.float32),
                                 rng.standard_normal((9, 33)).astype(np.float32)],
                    {"transpose_b": True}, threshold=NMSE_LONG)],
    "conv2d": [Case(lambda rng: [rng.standard_normal((3, 11, 13)).astype(np.float32),
                                 rng.standard_normal((5, 3, 3, 3)).astype(np.float32)],
                    {"stride": 2, "padding": 1}, threshold=NMSE_LONG)],
    "convolve2d": [Case(lambda rng: [rng.standard_normal((17, 19)).astype(np.float32),
                                     rng.standard_normal((3, 5)).astype(np.float32)],
                        threshold=NMSE_LONG)],
    "attention": [Case(lambda rng: [rng.standard_normal((7, 4, 16)).astype(np.float32),
                                    rng.standard_normal((9, 2, 16)).astype(np.float32),
                                    rng.standard_normal((9, 2, 16)).astype(np.float32)],
                       {"causal": True}, threshold=NMSE_LONG)],
    "write_rows": [Case(lambda rng: [rng.standard_normal((9, 3, 5)).astype(np.float32),
                                     rng.standard_normal((2, 3, 5)).astype(np.float32)],
                        {"start": 4}, threshold=0.0)],
    "slice_rows": [Case(_normal(9, 7), {"start": 2, "stop": 6}, threshold=0.0)],
    "matmul_quant": [Case(_quantized_matmul(q), {"qtype": q, "k": 64}, threshold=NMSE_LONG)
                     for q in (0, 1, 2, 3, 8)],
    "embedding_quant": [Case(_quantized_embedding(q), {"qtype": q, "k": 64}, threshold=0.0)
                        for q in (3, 8)],
    "rmsnorm_matmul_quant": [Case(_with_gain(_quantized_matmul(q)), {"qtype": q, "k": 64},
                                  threshold=NMSE_LONG) for q in (3, 8)],
    "rmsnorm_swiglu_quant": [Case(_with_gain(_quantized_matmul(q, 26)), {"qtype": q, "k": 64},
                                  threshold=NMSE_LONG) for q in (3, 8)],
    "matmul_quant_add": [Case(lambda rng: [*_quantized_matmul(3)(rng),
                                           rng.standard_normal((3, 13)).astype(np.float32)],
                              {"qtype": 3, "k": 64}, threshold=NMSE_LONG)],
    "concat_columns": [Case(lambda rng: [rng.standard_normal((5, 7)).astype(np.float32),
                                         rng.standard_normal((5, 4)).astype(np.float32)],
                            threshold=0.0)],
    # one range; a cache longer than one range (64 keys): ranges + combine
    "attention_cached": [Case(_cached_attention(tokens, n_ctx, pos), {"n_heads": 4},
                              threshold=NMSE_LONG) for tokens, n_ctx, pos in ((3, 11, 5),
                                                                              (2, 300, 290))],
    # two tokens in one range; one token (decoding) whose ranges the product merges
    "attention_cached_matmul_quant_add": [
        Case(_projected_attention(tokens, n_ctx, pos), {"n_heads": 4, "qtype": 3, "k": 32},
             threshold=NMSE_LONG) for tokens, n_ctx, pos in ((2, 11, 5), (1, 300, 290))],
    "greedy_step": [Case(lambda rng: [rng.standard_normal(333).astype(np.float32),
                                      np.array([7, 4], np.int32)], threshold=0.0)],
    # two chunks of the first pass; history slot 4 % 2
    "sample_step": [Case(lambda rng: [rng.standard_normal(4500).astype(np.float32),
                                      np.array([7, 4, -1, -1], np.int32),
                                      np.array([0.8, 1234, 9], np.float32)], threshold=0.0)],
})

#: Larger inputs for the in-browser benchmark: (op, make, params, flops, bytes moved).
BENCHMARKS: dict[str, Case] = {
    "add": Case(lambda rng: [rng.standard_normal(1 << 18).astype(np.float32) for _ in range(2)],
                flops=lambda xs: xs[0].size, bytes_moved=lambda xs: 12.0 * xs[0].size),
    "gelu": Case(_normal(1 << 18), flops=lambda xs: 20.0 * xs[0].size,
                 bytes_moved=lambda xs: 8.0 * xs[0].size),
    "softmax": Case(_normal(256, 1024), flops=lambda xs: 5.0 * xs[0].size,
                    bytes_moved=lambda xs: 8.0 * xs[0].size),
    "sum": Case(_normal(1 << 18), flops=lambda xs: xs[0].size,
                bytes_moved=lambda xs: 4.0 * xs[0].size),
    "matmul": Case(lambda rng: [rng.standard_normal((256, 256)).astype(np.float32) for _ in range(2)],
                   flops=lambda xs: 2.0 * xs[0].shape[0] * xs[0].shape[1] * xs[1].shape[1],
                   bytes_moved=lambda xs: 4.0 * (xs[0].size + xs[1].size + xs[0].shape[0] * xs[1].shape[1])),
}


def case_ids(registry=None) -> list[str]:
    """Every conformance case of the registered ops: "op" or "op-k" for the k-th extra one
    ('-' never occurs in op names, and unlike '#' survives in a URL)."""
    registry = _registry() if registry is None else registry
    ids = []
    for name in sorted(registry):
        for k, _ in enumerate(CASES.get(name, ())):
            ids.append(name if k == 0 else f"{name}-{k}")
    return ids


def ops_without_case(registry=None) -> list[str]:
    registry = _registry() if registry is None else registry
    return sorted(n for n in registry if n not in CASES)


def _registry():
    from ..ops import REGISTRY

    return REGISTRY


def _split_id(case_id: str):
    name, _, k = case_id.partition("-")
    return name, int(k or 0)


def _expected(op, inputs, params, meta) -> np.ndarray:
    with np.errstate(all="ignore"):
        ref = np.asarray(op.reference(*inputs, **params))
    # copy(), not ascontiguousarray(): the latter turns a 0-d result into shape (1,)
    return ref.astype(meta.dtype, copy=False).reshape(meta.shape).copy(order="C")


def conformance_plan(case_id: str, seed: int = 0, features=()) -> dict:
    """Plan + reference output of one conformance case (KeyError if there is none)."""
    name, k = _split_id(case_id)
    op = _registry()[name]
    case = CASES[name][k]
    rng = np.random.default_rng([seed, k, *name.encode()])
    inputs = [as_supported_array(x) for x in case.make(rng)]
    plan = record_op(op, inputs, case.params, features)
    m = op.infer(inputs, case.params)
    expected = _expected(op, inputs, case.params, m)
    exact = case.threshold == 0.0 or expected.dtype.kind in "iu"
    plan.update({
        "id": case_id, "op": name, "params": {p: _jsonable(v) for p, v in case.params.items()},
        "input_shapes": [list(x.shape) for x in inputs],
        "expected": {"data": b64(expected.tobytes()), "dtype": dtype_name(expected.dtype),
                     "shape": list(expected.shape)},
        "threshold": 0.0 if exact else case.threshold, "exact": exact,
    })
    return plan


def benchmark_plan(name: str, seed: int = 0) -> dict:
    op = _registry()[name]
    case = BENCHMARKS[name]
    rng = np.random.default_rng([seed, *name.encode()])
    inputs = [as_supported_array(x) for x in case.make(rng)]
    plan = record_op(op, inputs, case.params)
    plan.update({"id": name, "op": name, "input_shapes": [list(x.shape) for x in inputs],
                 "flops": float(case.flops(inputs)), "bytes": float(case.bytes_moved(inputs))})
    return plan


def benchmark_inputs(name: str, seed: int = 0):
    case = BENCHMARKS[name]
    rng = np.random.default_rng([seed, *name.encode()])
    inputs = [as_supported_array(x) for x in case.make(rng)]
    return inputs, case


def _jsonable(v):
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (np.floating,)):
        return float(v)
    return v


# ---- pxVM programs --------------------------------------------------------------------
def program_plan(img: np.ndarray) -> dict:
    """Plan of a .pxi image through pxvm.vm.record_program, with the CPU executor's result
    (the bytes the page's GPU result must equal) and the image itself for drawing."""
    from ..vm import record_program, run_program_cpu, validate_program

    img = np.ascontiguousarray(img)
    program = validate_program(img)
    ctx = PlanContext()
    words = record_program(ctx, img, program)
    plan = ctx.plan(words)
    expected = run_program_cpu(img.copy())
    h, w = img.shape[:2]
    plan.update({
        "width": w, "height": h,
        "instructions": [ins.name for ins in program.instructions],
        "image": b64(img.tobytes()),
        "expected": {"data": b64(np.ascontiguousarray(expected).tobytes()), "dtype": "u8",
                     "shape": [h, w, 4]},
        "exact": True, "threshold": 0.0,
    })
    return plan


def random_program(seed: int) -> np.ndarray:
    """A random valid pxVM program exercising every executable opcode: noise everywhere
    but in the instruction row, dot products and adds over random rows, and an int8
    matmul -> bias -> requantize -> relu -> argmax chain on random matrices."""
    from ..vm.assembler import assemble

    rng = np.random.default_rng(seed)
    w = int(rng.integers(24, 40))
    m, k, n = (int(v) for v in rng.integers(2, 7, 3))

    def vals(count, lo, hi):
        return " ".join(str(int(v)) for v in rng.integers(lo, hi, count))

    # rows 1..8 vectors; matrices from row 10 on, each in its own block of rows
    rows_needed = lambda size: -(-size // (w - 1))  # noqa: E731
    a_row = 10
    b_row = a_row + rows_needed(m * k)
    c_row = b_row + rows_needed(k * n)
    bias_row = c_row + rows_needed(m * n)
    q_row = bias_row + rows_needed(n)
    out_row = q_row + 1
    arg_row = out_row + rows_needed(m * n)
    height = arg_row + rows_needed(m) + 2
    lines = [f".size {w} {height}"]
    for _ in range(int(rng.integers(2, 5))):
        ra, rb, ro = rng.integers(1, 9, 3)
        lines.append(f"{rng.choice(['DOT_RGB', 'ADD'])} {ra} {rb} {ro}")
    lines += [f"MATMUL_I8 {a_row} {b_row} {c_row}", f"BIAS_I32 {c_row} {bias_row}",
              f"REQUANT {c_row} {q_row} {out_row}", f"RELU_I8 {out_row}",
              f"MATMUL_I8 {a_row} {b_row} {c_row}", f"ARGMAX_I32 {c_row} {arg_row}", "HALT"]
    for y in range(1, 9):
        lines.append(f".vector {y} {vals(w, 0, 256)}")
    lines.append(f".matrix {a_row} {m} {k} {vals(m * k, -128, 128)}")
    lines.append(f".matrix {b_row} {k} {n} {vals(k * n, -128, 128)}")
    lines.append(f".matrix32 {c_row} {m} {n} {vals(m * n, 0, 1)}")
    lines.append(f".matrix32 {bias_row} 1 {n} {vals(n, -5000, 5000)}")
    lines.append(f".requant {q_row} {int(rng.integers(1, 1 << 15))} {int(rng.integers(8, 20))} "
                 f"{int(rng.integers(-20, 20))}")
    img = assemble("\n".join(lines))
    # random G/B/A noise in the vector rows: the executors must leave or use it identically
    img[1:9, :, 1:] = rng.integers(0, 256, (8, w, 3), dtype=np.uint8)
    return img
