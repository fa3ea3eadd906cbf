"""`Device`: one WebGPU device with its buffer pool, pipeline cache and bind group cache.

It knows nothing about ops: callers ask for a pipeline by (kernel file, entry point,
override constants), allocate `Allocation`s, record dispatches into a recorder
(recorder.py) and read results back.
"""

from __future__ import annotations

import logging
import os
import re
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from ....core.errors import (BindingTooLargeError, DeviceLostError, GpuUnavailableError,
                      OutOfDeviceMemoryError, ShaderCompileError)
from .adapters import AdapterDescription, choose_adapter, import_wgpu
from .memory import Allocation, BufferPool
from .native import PortableCalls, choose_calls
from .recorder import CapturingRecorder, ProfilingRecorder, Recorder, StagingReadback
from .shaders import UNCHECKED_KERNELS, declared_bindings, enables, load_wgsl

log = logging.getLogger("pxvm.backends.webgpu")

#: The device feature each WGSL extension of an `enable` directive needs.
EXTENSION_FEATURES = {"f16": "shader-f16", "subgroups": "subgroup"}
#: Enable directives naga (wgpu 0.32) rejects although browsers require them: naga
#: compiles subgroup operations without it where the device has the feature.
UNPARSED_ENABLE = re.compile(r"^enable subgroups;\n", re.MULTILINE)
#: Features used when the adapter offers them; code checks `Device.has(...)` before use.
WANTED_FEATURES = ("shader-f16", "timestamp-query", "timestamp-query-inside-passes", "subgroup")
#: Limits requested at the adapter's own maximum.
WANTED_LIMITS = (
    "max-buffer-size",
    "max-storage-buffer-binding-size",
    "max-compute-workgroup-storage-size",
    "max-compute-invocations-per-workgroup",
    "max-compute-workgroup-size-x",
    "max-compute-workgroup-size-y",
    "max-compute-workgroup-size-z",
    "max-compute-workgroups-per-dimension",
    "max-storage-buffers-per-shader-stage",
    "max-uniform-buffer-binding-size",
)
BIND_GROUP_CACHE = 8192  # least recently used bind groups beyond this are dropped
#: When true, every allocation is filled with 0xFF bytes (NaN as f32, -1 as i32) so a
#: kernel that leaves an output element unwritten is caught by tests.
POISON = os.environ.get("PXVM_POISON") == "1"


@dataclass
class Pipeline:
    """A compiled compute pipeline: `entry` of kernel file `kernel` with override
    `constants` ((name, value) pairs, sorted)."""

    pipeline: object
    layout: object
    kernel: str
    entry: str = "main"
    constants: tuple = ()

    @property
    def label(self) -> str:
        return f"{self.kernel}:{self.entry}"


class Device:
    """One WebGPU device. `request` picks the adapter (see adapters.choose_adapter);
    `calls` the wgpu calls of the hot path (native.choose_calls() by default)."""

    def __init__(self, request: str | int | None = None, calls: PortableCalls | None = None):
        self.wgpu = wgpu = import_wgpu()
        if os.environ.get("WGPU_DEBUG") == "1":
            wgpu.logger.setLevel("DEBUG")
            logging.getLogger("wgpu").setLevel(logging.DEBUG)
        self.description, self.choice_reason = choose_adapter(request)
        adapter = self.description.adapter
        features = [f for f in WANTED_FEATURES if f in adapter.features]
        limits = {k: adapter.limits[k] for k in WANTED_LIMITS if k in adapter.limits}
        try:
            self.device = adapter.request_device_sync(
                label="pxvm", required_features=features, required_limits=limits)
        except Exception as exc:
            raise GpuUnavailableError(
                f"could not create a device on {self.description.name}: {exc}") from exc
        self.calls = calls if calls is not None else choose_calls()
        self.features = frozenset(self.device.features)
        self.limits = dict(self.device.limits)
        self.max_binding = int(self.limits["max-storage-buffer-binding-size"])
        self.max_buffer = int(self.limits["max-buffer-size"])
        self.max_groups = int(self.limits["max-compute-workgroups-per-dimension"])
        self.queue = self.device.queue
        self._lost_reason: str | None = None
        self._pipelines: dict[tuple, Pipeline] = {}
        self._layouts: dict[str, object] = {}
        self._bind_groups: OrderedDict = OrderedDict()
        self._uniform_arenas: list = []
        self._fence_alloc: Allocation | None = None
        usage = wgpu.BufferUsage
        self.STORAGE = usage.STORAGE | usage.COPY_SRC | usage.COPY_DST
        self.UNIFORM = usage.UNIFORM | usage.COPY_DST
        self.STAGING = usage.MAP_READ | usage.COPY_DST
        self.pool = BufferPool(self._create_buffer)
        log.info("pxvm device: %s (%s)", self.description.name, self.choice_reason)

    # ---- identity -------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.description.name

    @property
    def is_software(self) -> bool:
        """True on CPU rasterisers (lavapipe, SwiftShader)."""
        return self.description.is_software

    def has(self, feature: str) -> bool:
        return feature in self.features

    # ---- lifetime and errors --------------------------------------------------
    def check_alive(self) -> None:
        if self._lost_reason is not None:
            raise DeviceLostError(
                f"the GPU device {self.name!r} was lost ({self._lost_reason}); "
                "create a new pxvm device (pxvm.backends.reset_backends())",
                other_backend="numpy")

    def mark_lost(self, reason: str) -> None:
        self._lost_reason = reason
        self.pool.clear()
        self._bind_groups.clear()

    def destroy(self) -> None:
        """Release the device; later calls raise DeviceLostError."""
        self.mark_lost("destroyed by the program")
        try:
            self.device.destroy()
        except Exception:
            pass

    def wrap_error(self, exc: Exception, what: str) -> Exception:
        """The pxvm error for a wgpu failure while doing `what` (or `exc` itself)."""
        text = str(exc)
        if isinstance(exc, self.wgpu.GPUOutOfMemoryError) or "out of memory" in text.lower():
            return OutOfDeviceMemoryError(
                f"out of device memory while {what} on {self.name}: free tensors you no "
                "longer need, use smaller batches, or a device with more memory")
        if "lost" in text.lower() or "destroyed" in text.lower():
            self.mark_lost(text.splitlines()[0] if text else "unknown reason")
            return DeviceLostError(f"GPU device lost while {what}: {text}")
        return exc

    # ---- memory ---------------------------------------------------------------
    def _create_buffer(self, size: int, usage: int):
        if size > self.max_buffer:
            raise BindingTooLargeError(size, self.max_buffer, "buffer")
        try:
            return self.device.create_buffer(size=size, usage=usage)
        except Exception as exc:
            raise self.wrap_error(exc, f"allocating {size:,} bytes") from exc

    def alloc(self, nbytes: int, what: str = "tensor") -> Allocation:
        """A storage buffer of at least `nbytes`, bindable by shaders."""
        self.check_alive()
        if nbytes > self.max_binding:
            raise BindingTooLargeError(int(nbytes), self.max_binding, what)
        alloc = Allocation(self.pool.take(nbytes, self.STORAGE), int(nbytes), self.pool)
        if POISON:
            self.queue.write_buffer(alloc.buffer, 0, b"\xff" * alloc.binding_size())
        return alloc

    def zeros(self, nbytes: int, what: str = "tensor") -> Allocation:
        """A new allocation of `nbytes` zero bytes, cleared by the device: a pooled buffer
        may hold an earlier tensor's values, and no host array of its size is made."""
        alloc = self.alloc(max(4, nbytes), what)
        alloc.nbytes = nbytes
        encoder = self.device.create_command_encoder()
        encoder.clear_buffer(alloc.buffer, 0, alloc.buffer.size)
        try:
            self.queue.submit([encoder.finish()])
        except Exception as exc:
            raise self.wrap_error(exc, "clearing a buffer") from exc
        return alloc

    def upload(self, array: np.ndarray, what: str = "tensor") -> Allocation:
        """A new allocation holding `array`'s bytes."""
        if array.nbytes > self.max_binding:  # before copying a broadcast view on the host
            raise BindingTooLargeError(int(array.nbytes), self.max_binding, what)
        data = np.ascontiguousarray(array)
        raw = data.view(np.uint8).reshape(-1)
        alloc = self.alloc(max(4, raw.nbytes), what)
        padded = (raw.nbytes + 3) // 4 * 4
        if padded != raw.nbytes:
            raw = np.concatenate([raw, np.zeros(padded - raw.nbytes, np.uint8)])
        if raw.nbytes:
            try:
                self.queue.write_buffer(alloc.buffer, 0, raw)
            except Exception as exc:
                raise self.wrap_error(exc, "uploading") from exc
        alloc.nbytes = data.nbytes
        return alloc

    def write(self, alloc: Allocation, data: np.ndarray, offset: int = 0) -> None:
        """Overwrite bytes of an allocation from the host (ordered before later submits).
        WebGPU writes whole 4-byte words: a write starts on one, and one whose length is
        not a multiple of 4 (uint8 or float16 data) must reach the allocation's end, where
        its last word is padded with zeros past the data."""
        self.check_alive()
        raw = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
        end = offset + raw.nbytes
        ragged = raw.nbytes % 4 and end != alloc.nbytes
        if offset < 0 or offset % 4 or end > alloc.nbytes or ragged:
            raise ValueError(
                f"cannot write {raw.nbytes} bytes at offset {offset} into an allocation of "
                f"{alloc.nbytes} bytes: a write starts at a multiple of 4 bytes, stays inside "
                "the allocation, and reaches its end unless its length is a multiple of 4")
        if raw.nbytes % 4:
            raw = np.concatenate([raw, np.zeros(4 - raw.nbytes % 4, np.uint8)])
        try:
            self.queue.write_buffer(alloc.buffer, offset, raw)
        except Exception as exc:
            raise self.wrap_error(exc, "writing") from exc

    def read(self, alloc: Allocation, dtype, count: int | None = None) -> np.ndarray:
        """Copy an allocation back to the host (one submit, one map)."""
        recorder = self.recorder()
        staged = recorder.stage(alloc)
        recorder.submit()
        return staged.result(dtype, count)

    async def read_async(self, alloc: Allocation, dtype, count: int | None = None) -> np.ndarray:
        recorder = self.recorder()
        staged = recorder.stage(alloc)
        recorder.submit()
        return await staged.result_async(dtype, count)

    # ---- programs -------------------------------------------------------------
    def pipeline(self, kernel: str, entry: str = "main", constants: dict | None = None) -> Pipeline:
        """The compute pipeline of `entry` in kernel file `kernel`, cached per constants."""
        self.check_alive()
        consts = tuple(sorted((constants or {}).items()))
        key = (kernel, entry, consts)
        found = self._pipelines.get(key)
        if found is not None:
            return found
        source = load_wgsl(kernel)
        for extension in enables(source):
            feature = EXTENSION_FEATURES.get(extension, extension)
            if not self.has(feature):
                raise ShaderCompileError(
                    f"kernel {kernel} needs {feature}, which {self.name} does not offer")
        source = UNPARSED_ENABLE.sub("", source)
        try:
            checks = (kernel not in UNCHECKED_KERNELS
                      or os.environ.get("PXVM_SHADER_CHECKS") == "1")
            module = self.calls.create_shader_module(self.device, kernel, source, checks)
            layout = self.bind_group_layout(kernel)
            pipe = self.device.create_compute_pipeline(
                label=f"{kernel}:{entry}",
                layout=self.device.create_pipeline_layout(bind_group_layouts=[layout]),
                compute={"module": module, "entry_point": entry,
                         "constants": {k: float(v) for k, v in consts}})
        except Exception as exc:
            wrapped = self.wrap_error(exc, f"compiling {kernel}")
            if isinstance(wrapped, DeviceLostError):
                raise wrapped from exc
            raise ShaderCompileError(
                f"kernel {kernel} (entry {entry}, constants {dict(consts)}) failed to "
                f"compile on {self.name}:\n{exc}") from exc
        result = Pipeline(pipe, layout, kernel, entry, consts)
        self._pipelines[key] = result
        return result

    def pipelines(self) -> set[tuple]:
        """(kernel, entry, constants) of every pipeline compiled so far."""
        return set(self._pipelines)

    def forget_pipelines(self) -> None:
        """Drop the compiled pipelines: the next use of each compiles it again."""
        self._pipelines.clear()

    def bind_group_layout(self, kernel: str):
        """One explicit bind group layout per kernel file, from its declared bindings, so
        that every entry point of the file shares it."""
        layout = self._layouts.get(kernel)
        if layout is None:
            compute = self.wgpu.ShaderStage.COMPUTE
            entries = [{"binding": i, "visibility": compute, "buffer": {"type": kind}}
                       for i, kind in declared_bindings(kernel)]
            layout = self._layouts[kernel] = self.device.create_bind_group_layout(entries=entries)
        return layout

    def bind_group(self, layout, ranges: list[tuple]):
        """A bind group of (buffer, offset, size) `ranges` at bindings 0, 1, .., reused
        when seen before: with pooled buffers a decoding loop binds the same buffers token
        after token, and creating bind groups was the largest host cost of a dispatch.
        Keys hold the buffer objects themselves, so a key can never match a different,
        later buffer."""
        key = (layout, *ranges)
        group = self._bind_groups.get(key)
        if group is None:
            entries = [{"binding": i, "resource": {"buffer": buffer, "offset": offset,
                                                   "size": size}}
                       for i, (buffer, offset, size) in enumerate(ranges)]
            group = self.calls.create_bind_group(self.device, layout, entries)
            self._bind_groups[key] = group
            if len(self._bind_groups) > BIND_GROUP_CACHE:
                self._bind_groups.popitem(last=False)
        else:
            self._bind_groups.move_to_end(key)
        return group

    def uniform_arena(self, index: int):
        """The index-th shared uniform arena (recorder.UniformSlots says why shared)."""
        while len(self._uniform_arenas) <= index:
            self._uniform_arenas.append(self.create_uniform_arena())
        return self._uniform_arenas[index]

    def create_uniform_arena(self, nbytes: int = 64 * 1024):
        return self._create_buffer(nbytes, self.UNIFORM)

    # ---- recording and submitting ---------------------------------------------
    def recorder(self, timestamps: bool = False, profile: bool = False,
                 capture: bool = False) -> Recorder | CapturingRecorder:
        """A recorder (recorder.py): `capture` keeps the dispatches as a DispatchList,
        `profile` times every dispatch, `timestamps` the whole submit (both only where
        the device has timestamp queries)."""
        self.check_alive()
        if capture:
            return CapturingRecorder(self)
        timed = self.has("timestamp-query")
        if profile and timed:
            return ProfilingRecorder(self)
        return Recorder(self, timestamps=timestamps and timed)

    def submit(self, command_buffer) -> int | None:
        """Queue one command buffer; its submission index where the calls give one."""
        return self.calls.submit(self.queue, command_buffer)

    def _fence(self) -> StagingReadback:
        # A 4-byte readback submitted after everything else: once it maps, all earlier
        # work is done. (wgpu 0.32's on_submitted_work_done_async is broken.)
        if self._fence_alloc is None:
            self._fence_alloc = self.alloc(4, "fence")
        recorder = self.recorder()
        staged = recorder.stage(self._fence_alloc)
        recorder.submit()
        return staged

    def wait(self) -> None:
        """Block until all submitted work is done."""
        self._fence().result(np.uint32)

    async def wait_async(self) -> None:
        """Await all submitted work without blocking the event loop."""
        await self._fence().result_async(np.uint32)


__all__ = ["AdapterDescription", "Device", "Pipeline"]
