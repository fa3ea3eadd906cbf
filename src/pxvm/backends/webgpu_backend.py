"""The WebGPU backend: runs each op's WGSL kernels through the runtime's device."""

from __future__ import annotations

import struct

import numpy as np

from ..runtime import Device, Recorder, ShapeError, get_device, workgroup_grid
from ..tensor import Tensor, as_supported_array, values_for


def pack_params(*values) -> bytes:
    """Pack a kernel's uniform parameter block: Python ints become u32 (i32 if negative),
    floats become f32, in order, as a WGSL struct of 4-byte scalars lays them out."""
    out = bytearray()
    for v in values:
        if isinstance(v, (bool, np.bool_)):
            out += struct.pack("<I", int(v))
        elif isinstance(v, (int, np.integer)):
            out += struct.pack("<i" if v < 0 else "<I", int(v))
        else:
            out += struct.pack("<f", float(v))
    return bytes(out)


class GpuContext:
    """What an op's GPU implementation records into: a device and an open Recorder."""

    def __init__(self, backend: "WebGPUBackend", recorder: Recorder, one_buffer: bool = False):
        self.backend = backend
        self.device: Device = backend.device
        self.recorder = recorder
        # timed, profiled and captured work is one command buffer by nature: no flush
        self.one_buffer = one_buffer

    def flush(self) -> None:
        """Submit what is recorded so far and go on in a new command buffer."""
        if not self.one_buffer:
            self.recorder.submit()
            self.recorder = self.device.recorder()

    def empty(self, shape, dtype, what: str = "output") -> Tensor:
        dtype = np.dtype(dtype)
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        alloc = self.device.alloc(max(nbytes, 4), what)
        alloc.nbytes = nbytes
        return Tensor(shape, dtype, self.backend, alloc)

    def tensor(self, array) -> Tensor:
        """Upload host data as an input of the work being recorded."""
        return self.backend.from_numpy(array)

    def has(self, feature: str) -> bool:
        return self.device.has(feature)

    @property
    def is_software(self) -> bool:
        """True on CPU rasterisers (lavapipe, SwiftShader), where kernels may pick a
        variant with fewer barriers."""
        return self.device.description.is_software

    def dispatch(self, kernel: str, entry: str, tensors, params: tuple | bytes | None,
                 groups, constants: dict | None = None) -> None:
        """Record `entry` of `kernel` over `groups` workgroups (an int is spread over x/y).
        Bindings: the tensors in order, then the parameter block if any."""
        pipe = self.device.pipeline(kernel, entry, constants)
        if isinstance(params, tuple):
            params = pack_params(*params)
        if isinstance(groups, int):
            groups = workgroup_grid(groups, self.device.max_groups)
        self.recorder.dispatch(pipe, [t.storage for t in tensors], params, groups)


class WebGPUBackend:
    name = "gpu"

    def __init__(self, device: Device | None = None):
        self.device = device if device is not None else get_device()

    def from_numpy(self, array) -> Tensor:
        arr = as_supported_array(array)
        if arr.dtype == np.float16 and not self.device.has("shader-f16"):
            raise ShapeError(f"{self.device.name} does not offer shader-f16; use f32 tensors")
        alloc = self.device.upload(arr)
        return Tensor(arr.shape, arr.dtype, self, alloc)

    def to_numpy(self, tensor: Tensor) -> np.ndarray:
        flat = self.device.read(tensor.storage, tensor.dtype, tensor.size)
        return flat.reshape(tensor.shape)

    async def to_numpy_async(self, tensor: Tensor) -> np.ndarray:
        flat = await self.device.read_async(tensor.storage, tensor.dtype, tensor.size)
        return flat.reshape(tensor.shape)

    def write(self, tensor: Tensor, array) -> None:
        """Overwrite a tensor's values in place from the host."""
        self.device.write(tensor.storage, values_for(tensor, array))

    def context(self, timestamps: bool = False, profile: bool = False,
                capture: bool = False) -> GpuContext:
        return GpuContext(self, self.device.recorder(timestamps, profile, capture),
                          one_buffer=timestamps or profile or capture)

    def run(self, op, inputs, params) -> Tensor:
        op.infer(inputs, params)
        ctx = self.context()
        out = op.gpu(ctx, *inputs, **params)
        ctx.recorder.submit()
        return out

    def describe(self) -> str:
        d = self.device.description
        return f"WebGPU on {d.name} ({d.adapter_type}, {d.backend})"
