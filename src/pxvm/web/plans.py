"""Dispatch plans: the GPU work an op (or a pxVM program) records, captured without a GPU
so a browser can replay it with its own WebGPU.

A `PlanDevice` stands in for the runtime's Device behind the WebGPU backend's own
recording context (pxvm.backends.webgpu): the ops' WebGPU kernels and
`pxvm.vm.record_program` record into it exactly what they record on a GPU, and the page
only replays buffers, pipelines and workgroup counts. `conformance_plan(case_id)` runs a
case of cases.py through its op's kernel on fresh random inputs and attaches the numpy
reference's output.
"""

from __future__ import annotations

import base64

import numpy as np

from ..backends.webgpu import WebGPUContext
from ..backends.webgpu.runtime import UNIFORM_SLOT
from ..backends.webgpu.runtime.memory import binding_bytes
from ..core import Backend, Tensor, as_supported_array, dtype_name
from ..ops import REGISTRY
from ..vm import record_program, run_program_cpu, validate_program
from .cases import BENCHMARKS, CASES

#: WebGPU's guaranteed maxComputeWorkgroupsPerDimension; plans must run on any adapter.
MAX_GROUPS_PER_DIM = 65535


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
        # the runtime's Allocation rounds the same way, so bindings cover identical ranges
        return binding_bytes(self.nbytes)


class PlanDevice:
    """The WebGPU context's device (backends.webgpu.WgslDevice), recording a plan:
    memory is PlanBuffers, pipelines are names, and dispatches are kept as JSON."""

    max_groups = MAX_GROUPS_PER_DIM
    #: plans are replayed on whatever adapter the browser has: record the GPU variants
    is_software = False
    #: .. within the limits every WebGPU device grants (the spec's defaults)
    limits = {"max-compute-workgroup-storage-size": 16384}

    def __init__(self, features: tuple[str, ...] = ()):
        self.features = frozenset(features)
        self.buffers: list[PlanBuffer] = []
        self.dispatches: list[dict] = []

    def has(self, feature: str) -> bool:
        return feature in self.features

    def alloc(self, nbytes: int, what: str = "tensor") -> PlanBuffer:
        return self._buffer(nbytes, None)

    def upload(self, array: np.ndarray, what: str = "tensor") -> PlanBuffer:
        data = np.ascontiguousarray(array)
        return self._buffer(data.nbytes, data.tobytes())

    def pipeline(self, kernel: str, entry: str = "main", constants: dict | None = None):
        return (kernel, entry, {k: float(v) for k, v in sorted((constants or {}).items())})

    def recorder(self):
        raise RuntimeError("a plan is replayed by the browser, never submitted here")

    def dispatch(self, pipeline, buffers: list, params: bytes | None, groups) -> None:
        """The recorder's half: one dispatch of the plan."""
        kernel, entry, constants = pipeline
        if params is not None and len(params) > UNIFORM_SLOT:
            raise ValueError(f"kernel parameters of {len(params)} bytes exceed {UNIFORM_SLOT}")
        for b in buffers:
            if not (isinstance(b, PlanBuffer) and b.index < len(self.buffers)
                    and b is self.buffers[b.index]):
                raise ValueError(f"{kernel}:{entry}: a bound tensor was not recorded in this plan")
        self.dispatches.append({
            "kernel": kernel, "entry": entry, "bindings": [b.index for b in buffers],
            "params": None if params is None else b64(params),
            "groups": [int(g) for g in groups], "constants": constants,
        })

    def _buffer(self, nbytes: int, data: bytes | None) -> PlanBuffer:
        buf = PlanBuffer(len(self.buffers), nbytes, data)
        self.buffers.append(buf)
        return buf

    def plan(self, result: Tensor) -> dict:
        """The JSON-ready plan whose output is `result` (a tensor recorded here)."""
        if not isinstance(result.storage, PlanBuffer) or result.storage not in self.buffers:
            raise ValueError("the result tensor was not recorded in this plan")
        return {
            "buffers": [{"nbytes": b.nbytes, "size": b.binding_size(),
                         "data": None if b.data is None else b64(b.data)} for b in self.buffers],
            "dispatches": self.dispatches,
            "uniform_size": UNIFORM_SLOT,
            "result": {"buffer": result.storage.index, "dtype": dtype_name(result.dtype),
                       "shape": list(result.shape), "nbytes": result.nbytes},
        }


class PlanBackend(Backend):
    """What recorded tensors belong to: one per plan, so that ops caching device tensors
    per backend (rope's angle tables) never reuse a buffer of another plan."""

    name = "webgpu"  # the kernels recorded are the WebGPU backend's

    def __init__(self, device: PlanDevice):
        self.device = device

    def describe(self) -> str:
        return "a dispatch plan for the browser"

    def from_numpy(self, array) -> Tensor:
        arr = as_supported_array(array)
        return Tensor(arr.shape, arr.dtype, self, self.device.upload(arr))

    def to_numpy(self, tensor):
        raise RuntimeError("a recorded plan has no values; replay it on a GPU to read results")

    def write(self, tensor, array):
        raise RuntimeError("a recorded plan has no values to overwrite")


def plan_context(features=()) -> WebGPUContext:
    """A WebGPU recording context whose device and recorder are a new PlanDevice."""
    device = PlanDevice(features)
    return WebGPUContext(PlanBackend(device), device, device)


def record_op(op, inputs: list[np.ndarray], params: dict, features=()) -> dict:
    """Plan of one op on `inputs` (numpy arrays), through its own WebGPU kernel."""
    ctx = plan_context(features)
    tensors = [ctx.tensor(x) for x in inputs]
    shape = op.infer(tensors, params)
    return ctx.device.plan(op.run(ctx.backend, ctx, tensors, params, shape))


#: Optional WebGPU features a plan's kernels may use (the browser's names), each with the
#: name the ops ask the device for (`ctx.has`, wgpu-native's): the page asks for plans with
#: those its device was granted.
BROWSER_FEATURES = {"subgroups": "subgroup"}


def plan_features(names: list[str]) -> tuple[str, ...]:
    """The ops' names of browser features `names` (BROWSER_FEATURES); ValueError names
    any other."""
    unknown = [n for n in names if n not in BROWSER_FEATURES]
    if unknown:
        raise ValueError(f"unknown plan features {unknown}: a plan may use "
                         f"{', '.join(BROWSER_FEATURES)}")
    return tuple(sorted({BROWSER_FEATURES[n] for n in names}))


def case_ids(registry=REGISTRY) -> list[str]:
    """Every conformance case of the registered ops: "op" or "op-k" for the k-th extra one
    ('-' never occurs in op names, and unlike '#' survives in a URL)."""
    ids = []
    for name in sorted(registry):
        for k, _ in enumerate(CASES.get(name, ())):
            ids.append(name if k == 0 else f"{name}-{k}")
    return ids


def ops_without_case(registry=REGISTRY) -> list[str]:
    return sorted(n for n in registry if n not in CASES)


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
    op = REGISTRY[name]
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


def benchmark_inputs(name: str, seed: int = 0):
    case = BENCHMARKS[name]
    rng = np.random.default_rng([seed, *name.encode()])
    return [as_supported_array(x) for x in case.make(rng)], case


def benchmark_plan(name: str, seed: int = 0) -> dict:
    inputs, case = benchmark_inputs(name, seed)
    plan = record_op(REGISTRY[name], inputs, case.params)
    plan.update({"id": name, "op": name, "input_shapes": [list(x.shape) for x in inputs],
                 "flops": float(case.flops(inputs)), "bytes": float(case.bytes_moved(inputs))})
    return plan


def _jsonable(v):
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.floating):
        return float(v)
    return v


def program_plan(img: np.ndarray) -> dict:
    """Plan of a .pxi image through pxvm.vm.record_program, with the CPU executor's result
    (the bytes the page's GPU result must equal) and the image itself for drawing."""
    img = np.ascontiguousarray(img)
    program = validate_program(img)
    ctx = plan_context()
    words = record_program(ctx, img, program)
    plan = ctx.device.plan(words)
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
