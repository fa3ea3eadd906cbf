"""Recording work for the GPU: one command buffer and one submit per `Recorder`.

Three kinds, chosen by `Device.recorder(...)`:
- `Recorder`: dispatches in one compute pass (reopened after copies), readback copies,
  optionally the whole submit's GPU time (`timestamps`);
- `ProfilingRecorder`: every dispatch in a pass of its own, timed on the GPU;
- `CapturingRecorder`: encodes nothing; `capture()` returns the dispatches as a
  `DispatchList` to submit again and again (a decoding step).
Every allocation bound is kept alive until the submit (or by the DispatchList), so a
pooled buffer is never reused under queued work.
"""

from __future__ import annotations

import numpy as np

from .capture import DispatchList
from .memory import Allocation

UNIFORM_SLOT = 256   # bytes per dispatch's parameter block (WebGPU's offset alignment)
UNIFORM_ARENA = 64 * 1024
MAX_PROFILED = 2048  # dispatches timed individually in one profiled submit


def workgroup_grid(n_groups: int, max_per_dim: int = 65535) -> tuple[int, int, int]:
    """Spread `n_groups` workgroups over x and y (a dimension holds at most 65535)."""
    n_groups = max(1, int(n_groups))
    if n_groups <= max_per_dim:
        return (n_groups, 1, 1)
    y = (n_groups + max_per_dim - 1) // max_per_dim
    return ((n_groups + y - 1) // y, y, 1)


class UniformSlots:
    """Kernel parameter blocks in 256-byte slots of 64 KiB uniform buffers ("arenas"),
    written to the device in one go. A submitting Recorder uses the device's shared
    arenas 0, 1, ... in order, so a loop binds the same (buffer, offset) for the same
    dispatch each time and its bind groups are reused; that is safe because each
    Recorder writes them right before its own submit and the queue keeps that order. A
    captured list keeps its parameters for good, so it gets arenas of its own."""

    def __init__(self, device, own: bool):
        self.device = device
        self.own = own
        self.arenas: list[tuple[object, bytearray]] = []
        self._slot = UNIFORM_ARENA  # forces a new arena on first use

    def place(self, params: bytes) -> tuple[object, int]:
        """(buffer, offset) of a new slot holding `params`."""
        if len(params) > UNIFORM_SLOT:
            raise ValueError(f"kernel parameters of {len(params)} bytes exceed {UNIFORM_SLOT}")
        if self._slot + UNIFORM_SLOT > UNIFORM_ARENA:
            arena = (self.device.create_uniform_arena(UNIFORM_ARENA) if self.own
                     else self.device.uniform_arena(len(self.arenas)))
            self.arenas.append((arena, bytearray(UNIFORM_ARENA)))
            self._slot = 0
        buffer, data = self.arenas[-1]
        offset = self._slot
        data[offset: offset + len(params)] = params
        self._slot += UNIFORM_SLOT
        return buffer, offset

    def write(self) -> list:
        """Write every slot used to the device; returns the arenas' buffers."""
        for i, (buffer, data) in enumerate(self.arenas):
            used = self._slot if i == len(self.arenas) - 1 else UNIFORM_ARENA
            self.device.queue.write_buffer(buffer, 0, bytes(data[:used]))
        buffers = [buffer for buffer, _ in self.arenas]
        self.arenas = []
        return buffers


class _Binding:
    """What every kind of recorder does for a dispatch before encoding it: the bind
    group of its buffers and parameter block (cached by the device), its buffers kept."""

    def __init__(self, device, own_uniforms: bool):
        self.device = device
        self._uniforms = UniformSlots(device, own_uniforms)
        self._keep: list = []
        self.dispatches = 0

    def _bind(self, pipeline, buffers: list[Allocation], params: bytes | None):
        """Bindings 0..n-1 are `buffers`; binding n is the parameter block when given."""
        self._keep.extend(buffers)
        ranges = [(alloc.buffer, 0, alloc.binding_size()) for alloc in buffers]
        if params is not None:
            buffer, offset = self._uniforms.place(params)
            ranges.append((buffer, offset, UNIFORM_SLOT))
        return self.device.bind_group(pipeline.layout, ranges)


class Recorder(_Binding):
    """Dispatches and readback copies in one command buffer, queued by `submit()`.
    With `timestamps`, `device_seconds` is the GPU time from the first dispatch to the end
    of the last."""

    def __init__(self, device, timestamps: bool = False):
        super().__init__(device, own_uniforms=False)
        self.encoder = device.device.create_command_encoder()
        self.staged: list[StagingReadback] = []   # a DispatchList's readbacks of its outputs
        self._copies: list[StagingReadback] = []  # every readback copy recorded here
        self._pass = None
        self.submitted = False
        self._command_buffer = None      # set by finish(), queued by submit()
        self._query = (device.device.create_query_set(type="timestamp", count=2)
                       if timestamps else None)
        self._timestamps: StagingReadback | None = None
        self._timing_stopped = False  # the end timestamp is written
        self._elapsed_ns: float | None = None
        self.profile: list[tuple[str, float]] | None = None

    # ---- the compute pass -------------------------------------------------------------
    def _open_pass(self):
        if self._pass is None:
            kwargs = {}
            if self._query is not None and self.dispatches == 0:
                kwargs["timestamp_writes"] = {"query_set": self._query,
                                              "beginning_of_pass_write_index": 0}
            self._pass = self.encoder.begin_compute_pass(**kwargs)
        return self._pass

    def _close_pass(self):
        if self._pass is not None:
            self._pass.end()
            self._pass = None

    def dispatch(self, pipeline, buffers: list[Allocation], params: bytes | None,
                 groups: tuple[int, int, int]) -> None:
        """Record one dispatch of `pipeline` over `groups` (x, y, z) workgroups (within the
        device's max_groups per dimension: workgroup_grid spreads a count)."""
        try:
            group = self._bind(pipeline, buffers, params)
            calls = self.device.calls
            calls.encode(self._open_pass(), calls.prepare([(pipeline, group, groups)]))
        except Exception as exc:
            raise self.device.wrap_error(exc, f"recording {pipeline.kernel}") from exc
        self.dispatches += 1

    def replay(self, dispatches: DispatchList) -> None:
        """Encode a captured list's dispatches into this pass."""
        try:
            self.device.calls.encode(self._open_pass(), dispatches.prepared)
        except Exception as exc:
            raise self.device.wrap_error(exc, "recording a captured list") from exc
        self.dispatches += len(dispatches)

    # ---- copies and readbacks ---------------------------------------------------------
    def copy(self, src: Allocation, dst: Allocation, nbytes: int | None = None) -> None:
        self._close_pass()
        n = (nbytes if nbytes is not None else src.binding_size()) // 4 * 4
        self.encoder.copy_buffer_to_buffer(src.buffer, 0, dst.buffer, 0, n)
        self._keep += [src, dst]

    def stage(self, alloc: Allocation) -> "StagingReadback":
        """Record a copy of `alloc` into a mappable buffer; read it after submit. A timed
        recorder stops timing first: the readback's copy is not the work being timed."""
        self._stop_timing()
        staged = self.staging(alloc)
        self.copy_to_staging(alloc, staged, 0)
        return staged

    def staging(self, alloc: Allocation, copies: int = 1) -> "StagingReadback":
        """A mappable buffer for `copies` snapshots of `alloc`, each recorded here by
        `copy_to_staging`; read it after submit."""
        stride = max(4, (alloc.nbytes + 3) // 4 * 4)
        buffer = self.device.pool.take(stride * copies, self.device.STAGING)
        staged = StagingReadback(self.device, buffer, alloc.nbytes, copies, stride)
        self._copies.append(staged)
        return staged

    def copy_to_staging(self, alloc: Allocation, staged: "StagingReadback", index: int) -> None:
        """Record the copy of `alloc`'s current contents into snapshot `index`."""
        if not 0 <= index < staged.copies:
            raise IndexError(f"snapshot {index} of {staged.copies}")
        self._close_pass()
        self.encoder.copy_buffer_to_buffer(alloc.buffer, 0, staged.buffer,
                                           index * staged.stride, staged.stride)
        self._keep.append(alloc)

    def _resolve(self, query_set, count: int) -> "StagingReadback":
        """Record resolving `count` timestamps and a readback of them."""
        usage = self.device.wgpu.BufferUsage.QUERY_RESOLVE | self.device.wgpu.BufferUsage.COPY_SRC
        resolve = Allocation(self.device.pool.take(8 * count, usage), 8 * count, self.device.pool)
        self.encoder.resolve_query_set(query_set, 0, count, resolve.buffer, 0)
        return self.stage(resolve)

    # ---- submitting -------------------------------------------------------------------
    def _stop_timing(self) -> None:
        """Write the end timestamp (once), in a pass of its own so that it follows every
        dispatch recorded so far."""
        if self._query is not None and not self._timing_stopped:
            self._timing_stopped = True
            self._open_pass()  # the beginning timestamp, where nothing was dispatched
            self._close_pass()
            end_pass = self.encoder.begin_compute_pass(
                timestamp_writes={"query_set": self._query, "end_of_pass_write_index": 1})
            end_pass.end()

    def _end_queries(self) -> None:
        """Close the pass and record the readback of this recorder's timestamps."""
        if self._query is not None:
            self._stop_timing()
            self._timestamps = self._resolve(self._query, 2)
        self._close_pass()

    def _read_queries(self) -> None:
        if self._timestamps is not None:
            t = self._timestamps.result(np.uint64)
            self._elapsed_ns = float(t[1] - t[0]) if t[1] >= t[0] else None

    def finish(self) -> None:
        """End the command buffer without queueing it (submit() does, and calls this if
        needed): the encoding's host work, which may run on another thread than the
        submit (decoding encodes its next steps while the main thread waits)."""
        if self._command_buffer is not None:
            return
        if self.submitted:
            raise RuntimeError("this Recorder was already submitted")
        self.device.check_alive()
        self._end_queries()
        try:
            self._command_buffer = self.encoder.finish()
        except Exception as exc:
            raise self.device.wrap_error(exc, "submitting") from exc

    def submit(self) -> None:
        if self.submitted:
            raise RuntimeError("this Recorder was already submitted")
        self.finish()
        device = self.device
        try:
            # Parameter blocks are written here, not in finish(): queued writes land
            # before the next submit, which must be this command buffer's.
            self._uniforms.write()
            submission = device.submit(self._command_buffer)
        except Exception as exc:
            raise device.wrap_error(exc, "submitting") from exc
        self.submitted = True
        self._command_buffer = None
        for staged in self._copies:
            staged.submission = submission
        self._keep = []
        self._read_queries()

    @property
    def device_seconds(self) -> float | None:
        """GPU time between the first dispatch and the end of the last (timestamps)."""
        return None if self._elapsed_ns is None else self._elapsed_ns * 1e-9

    def wait(self) -> None:
        """Block until the submitted work is done."""
        self.device.wait()


class ProfilingRecorder(Recorder):
    """A Recorder that times every dispatch on the GPU, each in a compute pass of its
    own (a little slower than normal): `profile` lists (kernel:entry, seconds)."""

    def __init__(self, device):
        super().__init__(device)
        self._profile_query = device.device.create_query_set(type="timestamp",
                                                             count=2 * MAX_PROFILED)
        self._labels: list[str] = []
        self._spans: StagingReadback | None = None

    def dispatch(self, pipeline, buffers, params, groups) -> None:
        if len(self._labels) >= MAX_PROFILED:
            super().dispatch(pipeline, buffers, params, groups)
            return
        i = len(self._labels)
        try:
            group = self._bind(pipeline, buffers, params)
            self._close_pass()
            self._labels.append(pipeline.label)
            compute_pass = self.encoder.begin_compute_pass(timestamp_writes={
                "query_set": self._profile_query,
                "beginning_of_pass_write_index": 2 * i, "end_of_pass_write_index": 2 * i + 1})
            compute_pass.set_pipeline(pipeline.pipeline)
            compute_pass.set_bind_group(0, group)
            compute_pass.dispatch_workgroups(*groups)
            compute_pass.end()
        except Exception as exc:
            raise self.device.wrap_error(exc, f"recording {pipeline.kernel}") from exc
        self.dispatches += 1

    def _end_queries(self) -> None:
        super()._end_queries()
        if self._labels:
            self._spans = self._resolve(self._profile_query, 2 * len(self._labels))

    def _read_queries(self) -> None:
        super()._read_queries()
        if self._spans is not None:
            t = self._spans.result(np.uint64).astype(np.int64)
            spans = np.maximum(t[1::2] - t[0::2], 0) * 1e-9
            self.profile = list(zip(self._labels, spans.tolist()))


class CapturingRecorder(_Binding):
    """Records dispatches only, encoding nothing: `capture()` returns them as a
    DispatchList, with parameter blocks and buffers of its own."""

    def __init__(self, device):
        super().__init__(device, own_uniforms=True)
        self._items: list = []
        self.captured = False

    def dispatch(self, pipeline, buffers: list[Allocation], params: bytes | None,
                 groups: tuple[int, int, int]) -> None:
        try:
            group = self._bind(pipeline, buffers, params)
        except Exception as exc:
            raise self.device.wrap_error(exc, f"recording {pipeline.kernel}") from exc
        self._items.append((pipeline, group, tuple(groups)))
        self.dispatches += 1

    def capture(self) -> DispatchList:
        """The dispatches recorded, their parameter blocks written once."""
        if self.captured:
            raise RuntimeError("this Recorder was already captured")
        self.captured = True
        keep = self._keep + self._uniforms.write()
        self._keep = []
        return DispatchList(self.device, self._items, keep)


class StagingReadback:
    """A readback copy recorded in a Recorder; `result()` after the submit. It may hold
    `copies` snapshots of one allocation (taken at different points of the command
    buffer, `stride` bytes apart): `result` then has one row per snapshot."""

    def __init__(self, device, buffer, nbytes: int, copies: int = 1, stride: int = 0):
        self.device = device
        self.buffer = buffer  # mappable, from the device's pool
        self.nbytes = nbytes
        self.copies = copies
        self.stride = stride
        self.submission: int | None = None  # set by the Recorder's submit

    def _values(self, raw: np.ndarray, dtype, count):
        """The snapshots' values from the staging buffer's bytes, `raw` (a copy)."""
        if self.copies > 1:
            rows = raw[: self.copies * self.stride].reshape(self.copies, self.stride)
            data = rows[:, : self.nbytes].copy()
        else:
            data = raw[: self.nbytes]
        self.device.pool.give_back(self.buffer)
        arr = data.view(np.dtype(dtype)) if self.nbytes else np.zeros(0, dtype)
        if self.copies > 1:
            return arr if count is None else arr[:, :count]
        return arr if count is None else arr[:count]

    def result(self, dtype, count: int | None = None) -> np.ndarray:
        """The values (the first `count`), waiting for the submission that wrote them."""
        device = self.device
        device.check_alive()
        try:
            raw = device.calls.read(device.device, self.buffer, self.submission,
                                    device.wgpu.MapMode.READ)
        except Exception as exc:
            raise device.wrap_error(exc, "reading back") from exc
        return self._values(raw, dtype, count)

    async def result_async(self, dtype, count: int | None = None) -> np.ndarray:
        """As result(), awaiting the GPU without blocking the event loop."""
        device = self.device
        device.check_alive()
        try:
            await self.buffer.map_async(device.wgpu.MapMode.READ)
            raw = np.frombuffer(self.buffer.read_mapped(0, self.buffer.size), np.uint8)
            self.buffer.unmap()
        except Exception as exc:
            raise device.wrap_error(exc, "reading back") from exc
        return self._values(raw, dtype, count)
