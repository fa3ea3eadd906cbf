"""The WebGPU device: buffers (pooled), pipelines (cached), recording and submitting work.

This module knows nothing about ops. A caller asks for a pipeline by
(kernel file, entry point, override constants), allocates `Allocation`s, records
dispatches into a `Recorder` (one compute pass, one submit) and reads results back.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict, defaultdict
from dataclasses import dataclass

import numpy as np

from .adapters import AdapterDescription, choose_adapter, import_wgpu
from .errors import (
    BindingTooLargeError,
    DeviceLostError,
    GpuUnavailableError,
    OutOfDeviceMemoryError,
    ShaderCompileError,
)
from .shaders import declared_bindings, load_wgsl

log = logging.getLogger("pxvm.runtime")

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
UNIFORM_SLOT = 256  # bytes per dispatch's parameter block (WebGPU's offset alignment)
UNIFORM_ARENA = 64 * 1024
BIND_GROUP_CACHE = 8192  # least recently used bind groups beyond this are dropped
MAX_PROFILED = 2048  # dispatches timed individually in one profiled submit
POOL_KEEP_BYTES = 1 << 30  # freed buffers kept for reuse at most
#: When true, every allocation is filled with 0xFF bytes (NaN as f32, -1 as i32) so a
#: kernel that leaves an output element unwritten is caught by tests.
POISON = os.environ.get("PXVM_POISON") == "1"


def _size_class(nbytes: int) -> int:
    """Round a request up so that similar sizes share pooled buffers (<= 25% waste)."""
    n = max(256, (int(nbytes) + 3) // 4 * 4)
    step = max(256, 1 << max(0, n.bit_length() - 3))
    return (n + step - 1) // step * step


class Allocation:
    """A device buffer lent from the pool; given back when this object is collected."""

    __slots__ = ("buffer", "nbytes", "_pool", "__weakref__")

    def __init__(self, buffer, nbytes: int, pool: "BufferPool"):
        self.buffer = buffer
        self.nbytes = nbytes
        self._pool = pool

    def binding_size(self) -> int:
        return max(4, (self.nbytes + 3) // 4 * 4)

    def __del__(self):
        pool = self._pool
        if pool is not None:
            self._pool = None
            pool.give_back(self.buffer)


class BufferPool:
    """Reuses freed buffers by size class so loops of small ops do not grow memory."""

    def __init__(self, create):
        self._create = create
        self._free: dict[tuple[int, int], list] = defaultdict(list)
        self._kept = 0
        self._lock = threading.Lock()
        self.created = 0

    def take(self, nbytes: int, usage: int):
        cls = _size_class(nbytes)
        with self._lock:
            bucket = self._free.get((cls, usage))
            if bucket:
                self._kept -= cls
                return bucket.pop()
        self.created += 1
        return self._create(cls, usage)

    def give_back(self, buffer) -> None:
        key = (int(buffer.size), int(buffer.usage))
        with self._lock:
            if self._kept + key[0] <= POOL_KEEP_BYTES:
                self._free[key].append(buffer)
                self._kept += key[0]
                return
        try:
            buffer.destroy()
        except Exception:  # the device may already be gone at interpreter exit
            pass

    def clear(self) -> None:
        with self._lock:
            self._free.clear()
            self._kept = 0


@dataclass
class Pipeline:
    pipeline: object
    layout: object
    kernel: str
    entry: str = "main"

    @property
    def label(self) -> str:
        return f"{self.kernel}:{self.entry}"


def workgroup_grid(n_groups: int, max_per_dim: int = 65535) -> tuple[int, int, int]:
    """Spread `n_groups` workgroups over x and y (a dimension holds at most 65535)."""
    n_groups = max(1, int(n_groups))
    if n_groups <= max_per_dim:
        return (n_groups, 1, 1)
    y = (n_groups + max_per_dim - 1) // max_per_dim
    return ((n_groups + y - 1) // y, y, 1)


class Device:
    """One WebGPU device with its pipeline cache and buffer pool."""

    def __init__(self, request: str | int | None = None):
        self.wgpu = wgpu = import_wgpu()
        if os.environ.get("WGPU_DEBUG") == "1":
            wgpu.logger.setLevel("DEBUG")
            logging.getLogger("wgpu").setLevel(logging.DEBUG)
        self.adapter_desc, self.choice_reason = choose_adapter(request)
        adapter = self.adapter_desc.adapter
        features = [f for f in WANTED_FEATURES if f in adapter.features]
        limits = {k: adapter.limits[k] for k in WANTED_LIMITS if k in adapter.limits}
        try:
            self.device = adapter.request_device_sync(
                label="pxvm", required_features=features, required_limits=limits
            )
        except Exception as exc:
            raise GpuUnavailableError(
                f"could not create a device on {self.adapter_desc.name}: {exc}"
            ) from exc
        self.features = frozenset(self.device.features)
        self.limits = dict(self.device.limits)
        self.max_binding = int(self.limits["max-storage-buffer-binding-size"])
        self.max_buffer = int(self.limits["max-buffer-size"])
        self.max_groups = int(self.limits["max-compute-workgroups-per-dimension"])
        self.queue = self.device.queue
        self._lost_reason: str | None = None
        self._pipelines: dict[tuple, Pipeline] = {}
        self._fence_alloc: Allocation | None = None
        self._bind_groups: OrderedDict = OrderedDict()
        self._uniform_arenas: list = []
        U = wgpu.BufferUsage
        self.STORAGE = U.STORAGE | U.COPY_SRC | U.COPY_DST
        self.UNIFORM = U.UNIFORM | U.COPY_DST
        self.STAGING = U.MAP_READ | U.COPY_DST
        self.pool = BufferPool(self._create_buffer)
        log.info("pxvm device: %s (%s)", self.adapter_desc.name, self.choice_reason)

    # ---- identity -------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.adapter_desc.name

    @property
    def description(self) -> AdapterDescription:
        return self.adapter_desc

    def has(self, feature: str) -> bool:
        return feature in self.features

    # ---- lifetime -------------------------------------------------------------
    def _check_alive(self) -> None:
        if self._lost_reason is not None:
            raise DeviceLostError(
                f"the GPU device {self.name!r} was lost ({self._lost_reason}); "
                "create a new pxvm device (pxvm.runtime.reset_device()) or use backend='cpu'"
            )

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

    def _wrap_gpu_error(self, exc: Exception, what: str) -> Exception:
        text = str(exc)
        if isinstance(exc, self.wgpu.GPUOutOfMemoryError) or "out of memory" in text.lower():
            return OutOfDeviceMemoryError(
                f"out of device memory while {what} on {self.name}: free tensors you no "
                "longer need, use smaller batches, or a device with more memory"
            )
        if "lost" in text.lower() or "destroyed" in text.lower():
            self.mark_lost(text.splitlines()[0] if text else "unknown reason")
            return DeviceLostError(f"GPU device lost while {what}: {text}")
        return exc

    # ---- buffers --------------------------------------------------------------
    def _create_buffer(self, size: int, usage: int):
        if size > self.max_buffer:
            raise BindingTooLargeError(size, self.max_buffer, "buffer")
        try:
            return self.device.create_buffer(size=size, usage=usage)
        except Exception as exc:
            raise self._wrap_gpu_error(exc, f"allocating {size:,} bytes") from exc

    def alloc(self, nbytes: int, what: str = "tensor") -> Allocation:
        """A storage buffer of at least `nbytes`, bindable by shaders."""
        self._check_alive()
        if nbytes > self.max_binding:
            raise BindingTooLargeError(int(nbytes), self.max_binding, what)
        alloc = Allocation(self.pool.take(nbytes, self.STORAGE), int(nbytes), self.pool)
        if POISON:
            self.queue.write_buffer(alloc.buffer, 0, b"\xff" * alloc.binding_size())
        return alloc

    def upload(self, array: np.ndarray, what: str = "tensor") -> Allocation:
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
                raise self._wrap_gpu_error(exc, "uploading") from exc
        alloc.nbytes = data.nbytes
        return alloc

    # ---- pipelines ------------------------------------------------------------
    def pipeline(self, kernel: str, entry: str = "main", constants: dict | None = None) -> Pipeline:
        """The compute pipeline of `entry` in kernel file `kernel`, cached per constants."""
        self._check_alive()
        consts = tuple(sorted((constants or {}).items()))
        key = (kernel, entry, consts)
        found = self._pipelines.get(key)
        if found is not None:
            return found
        source = load_wgsl(kernel)
        if "enable f16;" in source and not self.has("shader-f16"):
            raise ShaderCompileError(
                f"kernel {kernel} needs shader-f16, which {self.name} does not offer"
            )
        try:
            module = self.device.create_shader_module(label=kernel, code=source)
            layout = self._layout(kernel)
            pipe = self.device.create_compute_pipeline(
                label=f"{kernel}:{entry}",
                layout=self.device.create_pipeline_layout(bind_group_layouts=[layout]),
                compute={
                    "module": module,
                    "entry_point": entry,
                    "constants": {k: float(v) for k, v in consts},
                },
            )
        except Exception as exc:
            wrapped = self._wrap_gpu_error(exc, f"compiling {kernel}")
            if isinstance(wrapped, DeviceLostError):
                raise wrapped from exc
            raise ShaderCompileError(
                f"kernel {kernel} (entry {entry}, constants {dict(consts)}) failed to "
                f"compile on {self.name}:\n{exc}"
            ) from exc
        result = Pipeline(pipe, layout, kernel, entry)
        self._pipelines[key] = result
        return result

    def _layout(self, kernel: str):
        """One explicit bind group layout per kernel file, from its declared bindings."""
        key = ("layout", kernel)
        if key not in self._pipelines:
            C = self.wgpu.ShaderStage.COMPUTE
            entries = [
                {"binding": i, "visibility": C, "buffer": {"type": kind}}
                for i, kind in declared_bindings(kernel)
            ]
            self._pipelines[key] = self.device.create_bind_group_layout(entries=entries)
        return self._pipelines[key]

    def uniform_arena(self, index: int):
        """The index-th uniform arena. Every Recorder uses arenas 0, 1, ... in order, so a
        decoding loop binds the same (buffer, offset) for the same dispatch each token and
        its bind groups are reused. Sharing is safe: a Recorder writes its parameters with
        queue.write_buffer right before its own submit, and the queue keeps that order."""
        while len(self._uniform_arenas) <= index:
            self._uniform_arenas.append(self._create_buffer(UNIFORM_ARENA, self.UNIFORM))
        return self._uniform_arenas[index]

    def bind_group(self, layout, entries):
        """A bind group for these exact buffers and ranges, reused when seen before: with
        pooled buffers a decoding loop binds the same buffers token after token, and
        creating bind groups was the largest host cost of a dispatch. Keys hold the buffer
        objects themselves, so a key can never match a different, later buffer."""
        key = (layout, tuple((e["binding"], e["resource"]["buffer"], e["resource"]["offset"],
                              e["resource"]["size"]) for e in entries))
        group = self._bind_groups.get(key)
        if group is None:
            group = self.device.create_bind_group(layout=layout, entries=entries)
            self._bind_groups[key] = group
            if len(self._bind_groups) > BIND_GROUP_CACHE:
                self._bind_groups.popitem(last=False)
        else:
            self._bind_groups.move_to_end(key)
        return group

    # ---- recording ------------------------------------------------------------
    def recorder(self, timestamps: bool = False, profile: bool = False,
                 capture: bool = False) -> "Recorder":
        """A Recorder; `timestamps` times the whole submit on the GPU, `profile` times
        every dispatch (each in its own pass, so a little slower than normal), `capture`
        keeps the dispatches as a DispatchList to submit again and again."""
        self._check_alive()
        ok = self.has("timestamp-query")
        return Recorder(self, timestamps and ok, profile and ok, capture)

    def write(self, alloc: Allocation, data: np.ndarray, offset: int = 0) -> None:
        """Overwrite bytes of an allocation from the host (ordered before later submits).
        WebGPU writes whole 4-byte words: a write starts on one, and one whose length is
        not a multiple of 4 (uint8 or float16 data) must reach the allocation's end, where
        its last word is padded with zeros past the data."""
        self._check_alive()
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
            raise self._wrap_gpu_error(exc, "writing") from exc

    def read(self, alloc: Allocation, dtype, count: int | None = None) -> np.ndarray:
        """Copy an allocation back to the host (one submit, one map)."""
        rec = self.recorder()
        staged = rec.stage(alloc)
        rec.submit()
        return staged.result(dtype, count)

    def _fence(self) -> Staged:
        # A 4-byte readback submitted after everything else: once it maps, all earlier
        # work is done. (wgpu 0.32's on_submitted_work_done_async is broken.)
        if self._fence_alloc is None:
            self._fence_alloc = self.alloc(4, "fence")
        rec = self.recorder()
        staged = rec.stage(self._fence_alloc)
        rec.submit()
        return staged

    def submit(self, command_buffer) -> int | None:
        """Submit one command buffer; its submission index where the backend gives one."""
        if _NATIVE_QUEUE is None:  # pragma: no cover - another wgpu backend
            self.queue.submit([command_buffer])
            return None
        submit_for_index, _, ffi = _NATIVE_QUEUE
        handles = ffi.new("WGPUCommandBuffer[1]", [command_buffer._internal])
        return submit_for_index(self.queue._internal, 1, handles)

    def wait_for(self, submission: int | None) -> None:
        """Block until the submission with this index is done (no-op for None)."""
        if submission is not None and _NATIVE_QUEUE is not None:
            _, poll, ffi = _NATIVE_QUEUE
            poll(self.device._internal, True, ffi.new("WGPUSubmissionIndex *", submission))

    def wait(self) -> None:
        """Block until all submitted work is done."""
        self._fence().result(np.uint32)

    async def wait_async(self) -> None:
        """Await all submitted work without blocking the event loop."""
        await self._fence().result_async(np.uint32)

    async def read_async(self, alloc: Allocation, dtype, count: int | None = None) -> np.ndarray:
        rec = self.recorder()
        staged = rec.stage(alloc)
        rec.submit()
        return await staged.result_async(dtype, count)


class Staged:
    """A readback copy recorded in a Recorder; map it after the submit. It may hold
    `copies` snapshots of one allocation (taken at different points of the command
    buffer, `stride` bytes apart): `result` then has one row per snapshot."""

    def __init__(self, device: Device, staging, nbytes: int, copies: int = 1,
                 stride: int = 0):
        self._device = device
        self._staging = staging
        self.nbytes = nbytes
        self.copies = copies
        self.stride = stride
        self.submission: int | None = None  # set by the Recorder's submit

    def _finish(self, raw: np.ndarray, dtype, count):
        """The snapshots' values from the staging buffer's bytes, `raw` (a copy)."""
        if self.copies > 1:
            rows = raw[: self.copies * self.stride].reshape(self.copies, self.stride)
            data = rows[:, : self.nbytes].copy()
        else:
            data = raw[: self.nbytes]
        self._device.pool.give_back(self._staging)
        arr = data.view(np.dtype(dtype)) if self.nbytes else np.zeros(0, dtype)
        if self.copies > 1:
            return arr if count is None else arr[:, :count]
        return arr if count is None else arr[:count]

    def result(self, dtype, count: int | None = None) -> np.ndarray:
        dev = self._device
        dev._check_alive()
        buf = self._staging
        try:
            if _NATIVE_MAP is not None and self.submission is not None:
                raw = _NATIVE_MAP.read(dev.device, buf, lambda: dev.wait_for(self.submission))
            else:
                dev.wait_for(self.submission)
                buf.map_sync(dev.wgpu.MapMode.READ)
                raw = np.frombuffer(buf.read_mapped(0, buf.size), np.uint8)
                buf.unmap()
        except Exception as exc:
            raise dev._wrap_gpu_error(exc, "reading back") from exc
        return self._finish(raw, dtype, count)

    async def result_async(self, dtype, count: int | None = None) -> np.ndarray:
        dev = self._device
        dev._check_alive()
        buf = self._staging
        try:
            await buf.map_async(dev.wgpu.MapMode.READ)
            raw = np.frombuffer(buf.read_mapped(0, buf.size), np.uint8)
            buf.unmap()
        except Exception as exc:
            raise dev._wrap_gpu_error(exc, "reading back") from exc
        return self._finish(raw, dtype, count)


def _native_pass_calls():
    """wgpu-native's own C entry points for set_pipeline / set_bind_group / dispatch, or
    None when wgpu-py runs on another backend. A captured step is re-encoded for every
    token, and wgpu-py's Python wrappers around these three calls cost three times the
    calls themselves (on the development machine: 7.4 against 2.4 us per dispatch)."""
    try:
        from wgpu.backends.wgpu_native._ffi import ffi, lib

        return (lib.wgpuComputePassEncoderSetPipeline, lib.wgpuComputePassEncoderSetBindGroup,
                lib.wgpuComputePassEncoderDispatchWorkgroups, ffi.NULL)
    except Exception:  # pragma: no cover - depends on the installed wgpu
        return None


_NATIVE = _native_pass_calls()


def _native_queue_calls():
    """wgpu-native's submit-with-index and poll-until-index (wgpu-py's error-raising
    wrappers), or None on another backend. wgpu-py's map polls until *all* queued work is
    done, so reading back decoding step i with steps i+1.. queued behind it would drain
    the queue, and the GPU would then idle while the host encodes the next step; waiting
    for step i's own submission first lets the map resolve at once (H100, greedy decode
    of a SmolLM2-shaped model: 662 -> 692 tokens/s)."""
    try:
        from wgpu.backends.wgpu_native._api import ffi, libf

        return libf.wgpuQueueSubmitForIndex, libf.wgpuDevicePoll, ffi
    except Exception:  # pragma: no cover - depends on the installed wgpu
        return None


_NATIVE_QUEUE = _native_queue_calls()


class _NativeMap:
    """Reading a staging buffer back through wgpu-native's own calls. wgpu-py's map_sync
    submits an empty command buffer before every read map and waits through its polling
    thread (a thread hand-off each way): 0.27-0.35 ms per readback on the H100's host,
    a quarter of a decoding step. Here the map's callback fires inside our own poll for
    the copy's submission, on the caller's thread. SmolLM2 on the H100
    (benchmarks/h100/decode_overlap.py): forward() one token at a time, as sampling
    does, 433 against 341 tokens/s; pipelined greedy decoding 818 against 814."""

    def __init__(self):
        from wgpu.backends.wgpu_native._api import ffi, lib, libf

        self.ffi, self.lib, self.libf = ffi, lib, libf
        self.status: dict[int, int] = {}
        self._next = 0

        @ffi.callback("void(WGPUMapAsyncStatus, WGPUStringView, void *, void *)")
        def on_mapped(result, _message, key, _unused):
            self.status[int(ffi.cast("uintptr_t", key))] = int(result)

        self._on_mapped = on_mapped  # kept alive: wgpu-native holds the pointer

    def read(self, device, buf, wait) -> np.ndarray:
        """A copy of `buf`'s bytes; `wait()` blocks until the submission that wrote them
        is done (polling the device, which fires the map's callback)."""
        ffi, lib, libf = self.ffi, self.lib, self.libf
        self._next += 1
        key = self._next
        info = ffi.new("WGPUBufferMapCallbackInfo *")
        info.mode = lib.WGPUCallbackMode_AllowProcessEvents
        info.callback = self._on_mapped
        info.userdata1 = ffi.cast("void *", key)
        libf.wgpuBufferMapAsync(buf._internal, lib.WGPUMapMode_Read, 0, buf.size, info[0])
        wait()
        for _ in range(3):  # the callback normally fired in the poll above
            if key in self.status:
                break
            libf.wgpuDevicePoll(device._internal, True, ffi.NULL)
        result = self.status.pop(key, None)
        if result != lib.WGPUMapAsyncStatus_Success:
            raise RuntimeError(f"could not map a readback buffer (status {result})")
        try:
            ptr = libf.wgpuBufferGetConstMappedRange(buf._internal, 0, buf.size)
            return np.frombuffer(ffi.buffer(ptr, buf.size), np.uint8).copy()
        finally:
            libf.wgpuBufferUnmap(buf._internal)


def _native_map():
    try:
        return _NativeMap()
    except Exception:  # pragma: no cover - depends on the installed wgpu
        return None


_NATIVE_MAP = _native_map()


class DispatchList:
    """Dispatches captured once by a Recorder and submitted again on every `submit`: the
    host cost of a step is then only encoding (pipeline, bind group, dispatch) per item.
    Whatever changes between submits must live in buffers (written from the host or by
    the dispatches themselves); the captured parameter blocks are fixed. The list holds
    every buffer it binds, so they stay valid for as long as it lives."""

    def __init__(self, device: Device, items: list, keep: list):
        self.device = device
        self.items = items  # (wgpu pipeline, bind group, (x, y, z) workgroups)
        self._keep = keep
        # The same items as wgpu-native handles, valid while `items` holds the objects.
        try:
            self.native = [(pipe._internal, group._internal, *groups)
                           for pipe, group, groups in items] if _NATIVE else None
        except AttributeError:  # pragma: no cover - not the wgpu-native backend
            self.native = None

    def __len__(self) -> int:
        return len(self.items)

    def submit(self, stage: list[Allocation] = (), timestamps: bool = False,
               runs: int = 1, each_run: bool = True) -> "Recorder":
        """Encode and submit the dispatches, then copies of `stage` for reading back; the
        returned (submitted) Recorder has the Staged copies in `.staged`. With `runs` > 1
        the dispatches go `runs` times into the one command buffer, and each Staged holds
        a copy of its allocation after every run (after the last only, when not
        `each_run`): one submit and one readback for several steps (each submit and map
        costs the host more than the GPU's step on the H100's Vulkan driver). A copy
        between runs splits the compute pass: on the H100 it cost decoding ~39 us a step."""
        rec = self.encode(stage, timestamps, runs, each_run)
        rec.submit()
        return rec

    def encode(self, stage: list[Allocation] = (), timestamps: bool = False,
               runs: int = 1, each_run: bool = True) -> "Recorder":
        """As submit, but only encoded (finished, not submitted): the returned Recorder's
        submit() queues it. Safe on another thread than the submits."""
        if runs < 1:
            raise ValueError(f"runs must be >= 1, got {runs}")
        rec = self.device.recorder(timestamps=timestamps)
        staged = [rec.staging(a, runs if each_run else 1) for a in stage]
        for run in range(runs):
            rec.replay(self.items, self.native)
            if each_run or run == runs - 1:
                for alloc, st in zip(stage, staged):
                    rec.copy_to_staging(alloc, st, run if each_run else 0)
        rec.staged = staged
        rec.finish()
        return rec


class Recorder:
    """Collects dispatches (and readback copies) for one command buffer and one submit.

    Every allocation bound here is kept alive until the submit, so pooled buffers are
    never reused while queued work still reads them. A capturing Recorder encodes
    nothing: `capture()` returns its dispatches as a DispatchList instead of a submit.
    """

    def __init__(self, device: Device, timestamps: bool = False, profile: bool = False,
                 capture: bool = False):
        self.device = device
        self.encoder = None if capture else device.device.create_command_encoder()
        self._captured: list | None = [] if capture else None
        self.staged: list[Staged] = []
        self._copies: list[Staged] = []  # every readback copy recorded here
        self._pass = None
        self._keep: list = []
        self._arenas: list[tuple[object, bytearray]] = []
        self._slot = UNIFORM_ARENA  # forces a new arena on first use
        self.dispatches = 0
        self.submitted = False
        self._command_buffer = None  # set by finish(), sent by submit()
        self._ts_staged: Staged | None = None
        self._prof_staged: Staged | None = None
        self._query = None
        self._elapsed_ns: float | None = None
        if timestamps:
            self._query = device.device.create_query_set(type="timestamp", count=2)
        self._profile_query = None
        self._profile_labels: list[str] = []
        self.profile: list[tuple[str, float]] | None = None
        if profile:
            self._profile_query = device.device.create_query_set(
                type="timestamp", count=2 * MAX_PROFILED)

    def _open_pass(self):
        if self._pass is None:
            kwargs = {}
            if self._query is not None and self.dispatches == 0:
                kwargs["timestamp_writes"] = {
                    "query_set": self._query,
                    "beginning_of_pass_write_index": 0,
                }
            self._pass = self.encoder.begin_compute_pass(**kwargs)
        return self._pass

    def _close_pass(self):
        if self._pass is not None:
            self._pass.end()
            self._pass = None

    def _uniform(self, params: bytes):
        if len(params) > UNIFORM_SLOT:
            raise ValueError(f"kernel parameters of {len(params)} bytes exceed {UNIFORM_SLOT}")
        if self._slot + UNIFORM_SLOT > UNIFORM_ARENA:
            # A captured list keeps its parameters for good: it gets arenas of its own
            # instead of the device's shared ones, which the next Recorder rewrites.
            arena = (self.device._create_buffer(UNIFORM_ARENA, self.device.UNIFORM)
                     if self._captured is not None
                     else self.device.uniform_arena(len(self._arenas)))
            self._arenas.append((arena, bytearray(UNIFORM_ARENA)))
            self._slot = 0
        buf, data = self._arenas[-1]
        offset = self._slot
        data[offset : offset + len(params)] = params
        self._slot += UNIFORM_SLOT
        return buf, offset

    def dispatch(
        self,
        pipeline: Pipeline,
        buffers: list[Allocation],
        params: bytes | None,
        groups: tuple[int, int, int] | int,
    ) -> None:
        """Record one dispatch. Bindings 0..n-1 are `buffers`; binding n is the uniform
        parameter block when `params` is given."""
        if isinstance(groups, int):
            groups = workgroup_grid(groups, self.device.max_groups)
        entries = []
        for i, alloc in enumerate(buffers):
            entries.append(
                {
                    "binding": i,
                    "resource": {"buffer": alloc.buffer, "offset": 0, "size": alloc.binding_size()},
                }
            )
            self._keep.append(alloc)
        if params is not None:
            ubuf, off = self._uniform(params)
            entries.append(
                {
                    "binding": len(buffers),
                    "resource": {"buffer": ubuf, "offset": off, "size": UNIFORM_SLOT},
                }
            )
        try:
            group = self.device.bind_group(pipeline.layout, entries)
            if self._captured is not None:
                self._captured.append((pipeline.pipeline, group, tuple(groups)))
                self.dispatches += 1
                return
            if self._profile_query is not None and len(self._profile_labels) < MAX_PROFILED:
                self._close_pass()
                i = len(self._profile_labels)
                self._profile_labels.append(pipeline.label)
                self._pass = self.encoder.begin_compute_pass(timestamp_writes={
                    "query_set": self._profile_query,
                    "beginning_of_pass_write_index": 2 * i,
                    "end_of_pass_write_index": 2 * i + 1,
                })
            cpass = self._open_pass()
            cpass.set_pipeline(pipeline.pipeline)
            cpass.set_bind_group(0, group)
            cpass.dispatch_workgroups(*groups)
            if self._profile_query is not None:
                self._close_pass()
        except Exception as exc:
            raise self.device._wrap_gpu_error(exc, f"recording {pipeline.kernel}") from exc
        self.dispatches += 1

    def replay(self, items: list, native: list | None = None) -> None:
        """Encode captured (pipeline, bind group, workgroups) items into this pass;
        `native`, the same items as wgpu-native handles, takes the direct C calls."""
        cpass = self._open_pass()
        last = None
        handle = getattr(cpass, "_internal", None)
        try:
            if native is not None and handle is not None:
                set_pipeline, set_group, dispatch, null = _NATIVE
                for pipe, group, x, y, z in native:
                    if pipe != last:
                        set_pipeline(handle, pipe)
                        last = pipe
                    set_group(handle, 0, group, 0, null)
                    dispatch(handle, x, y, z)
                self.dispatches += len(native)
                return
            for pipe, group, groups in items:
                if pipe is not last:
                    cpass.set_pipeline(pipe)
                    last = pipe
                cpass.set_bind_group(0, group)
                cpass.dispatch_workgroups(*groups)
        except Exception as exc:
            raise self.device._wrap_gpu_error(exc, "recording a captured list") from exc
        self.dispatches += len(items)

    def capture(self) -> DispatchList:
        """End a capturing Recorder: its parameter blocks are written once and its
        dispatches come back as a DispatchList."""
        if self._captured is None:
            raise RuntimeError("capture() needs a Recorder created with capture=True")
        if self.submitted:
            raise RuntimeError("this Recorder was already captured")
        dev = self.device
        for i, (buf, data) in enumerate(self._arenas):
            used = self._slot if i == len(self._arenas) - 1 else UNIFORM_ARENA
            dev.queue.write_buffer(buf, 0, bytes(data[:used]))
        self.submitted = True
        keep = self._keep + [buf for buf, _ in self._arenas]
        self._arenas, self._keep = [], []
        return DispatchList(dev, self._captured, keep)

    def _check_encoding(self, what: str) -> None:
        if self._captured is not None:
            raise RuntimeError(f"a capturing Recorder records dispatches only, not {what}")

    def copy(self, src: Allocation, dst: Allocation, nbytes: int | None = None) -> None:
        self._check_encoding("copies")
        self._close_pass()
        n = (nbytes if nbytes is not None else src.binding_size()) // 4 * 4
        self.encoder.copy_buffer_to_buffer(src.buffer, 0, dst.buffer, 0, n)
        self._keep += [src, dst]

    def stage(self, alloc: Allocation) -> Staged:
        """Record a copy of `alloc` into a mappable buffer; map it after submit."""
        staged = self.staging(alloc)
        self.copy_to_staging(alloc, staged, 0)
        return staged

    def staging(self, alloc: Allocation, copies: int = 1) -> Staged:
        """A mappable buffer for `copies` snapshots of `alloc`, each recorded here by
        `copy_to_staging`; map it after submit."""
        self._check_encoding("readbacks")
        stride = max(4, (alloc.nbytes + 3) // 4 * 4)
        staging = self.device.pool.take(stride * copies, self.device.STAGING)
        staged = Staged(self.device, staging, alloc.nbytes, copies, stride)
        self._copies.append(staged)
        return staged

    def copy_to_staging(self, alloc: Allocation, staged: Staged, index: int) -> None:
        """Record the copy of `alloc`'s current contents into snapshot `index`."""
        self._check_encoding("readbacks")
        if not 0 <= index < staged.copies:
            raise IndexError(f"snapshot {index} of {staged.copies}")
        self._close_pass()
        self.encoder.copy_buffer_to_buffer(alloc.buffer, 0, staged._staging,
                                           index * staged.stride, staged.stride)
        self._keep.append(alloc)

    def finish(self) -> None:
        """End the command buffer without queueing anything (submit() does, and calls
        this if needed): the encoding's host work, which may run on another thread than
        the submit (decoding encodes its next steps while the main thread waits)."""
        if self._command_buffer is not None:
            return
        if self.submitted:
            raise RuntimeError("this Recorder was already submitted")
        self._check_encoding("a submit (use capture())")
        dev = self.device
        dev._check_alive()
        if self._query is not None:
            if self._pass is None:
                self._open_pass()
            self._pass.end()
            self._pass = None
            # The end timestamp goes in a pass of its own so it follows all dispatches.
            end_pass = self.encoder.begin_compute_pass(
                timestamp_writes={"query_set": self._query, "end_of_pass_write_index": 1}
            )
            end_pass.end()
            usage = dev.wgpu.BufferUsage.QUERY_RESOLVE | dev.wgpu.BufferUsage.COPY_SRC
            resolve = Allocation(dev.pool.take(16, usage), 16, dev.pool)
            self.encoder.resolve_query_set(self._query, 0, 2, resolve.buffer, 0)
            self._ts_staged = self.stage(resolve)
        if self._profile_labels:
            self._close_pass()
            n = 2 * len(self._profile_labels)
            usage = dev.wgpu.BufferUsage.QUERY_RESOLVE | dev.wgpu.BufferUsage.COPY_SRC
            resolve = Allocation(dev.pool.take(8 * n, usage), 8 * n, dev.pool)
            self.encoder.resolve_query_set(self._profile_query, 0, n, resolve.buffer, 0)
            self._prof_staged = self.stage(resolve)
        self._close_pass()
        try:
            self._command_buffer = self.encoder.finish()
        except Exception as exc:
            raise dev._wrap_gpu_error(exc, "submitting") from exc

    def submit(self) -> None:
        if self.submitted:
            raise RuntimeError("this Recorder was already submitted")
        self.finish()
        dev = self.device
        try:
            # Parameter blocks are written here, not in finish(): queued writes land
            # before the next submit, which must be this command buffer's.
            for i, (buf, data) in enumerate(self._arenas):
                used = self._slot if i == len(self._arenas) - 1 else UNIFORM_ARENA
                dev.queue.write_buffer(buf, 0, bytes(data[:used]))
            submission = dev.submit(self._command_buffer)
        except Exception as exc:
            raise dev._wrap_gpu_error(exc, "submitting") from exc
        self.submitted = True
        self._command_buffer = None
        for staged in self._copies:
            staged.submission = submission
        self._arenas = []
        self._keep = []
        if self._ts_staged is not None:
            t = self._ts_staged.result(np.uint64)
            self._elapsed_ns = float(t[1] - t[0]) if t[1] >= t[0] else None
        if self._prof_staged is not None:
            t = self._prof_staged.result(np.uint64).astype(np.int64)
            spans = np.maximum(t[1::2] - t[0::2], 0) * 1e-9
            self.profile = list(zip(self._profile_labels, spans.tolist()))

    @property
    def gpu_seconds(self) -> float | None:
        """GPU time between the first dispatch and the end of the last (timestamp queries)."""
        return None if self._elapsed_ns is None else self._elapsed_ns * 1e-9

    def wait(self) -> None:
        """Block until the submitted work is done."""
        self.device.wait()


class Timer:
    """Wall-clock timing of a region that ends with the GPU idle."""

    def __init__(self, device: Device | None = None):
        self.device = device
        self.seconds = 0.0

    def __enter__(self):
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc):
        if self.device is not None:
            self.device.wait()
        self.seconds = time.perf_counter() - self._t0
