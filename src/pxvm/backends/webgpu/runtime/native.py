"""The wgpu calls on the hot paths (a decoding step's encoding, a prompt's bind groups,
compiling the heavy kernels), behind one adapter with two implementations.

`PortableCalls` uses wgpu-py's public API and works with any wgpu-py backend.
`NativeCalls` calls wgpu-native's C functions directly, which wgpu-py runs on today;
it is chosen when wgpu-native is importable, unless `PXVM_WGPU_CALLS=portable` (the
test suite runs the GPU paths through both). Why the native path (docs/benchmarks-log.md has
the measurements):
- encoding a captured step: wgpu-py's wrappers around set_pipeline / set_bind_group /
  dispatch cost three times the C calls themselves;
- creating a bind group: wgpu-py builds and checks each entry's struct in Python, which
  cost a recorded prompt about as much as all its other host work (a prompt's buffers
  are new, so its bind groups are too);
- compiling a kernel without naga's runtime checks (bounds checks on every array access,
  a counter in every loop), which wgpu-py's API always asks for: the products and
  attention run much faster without them (shaders.UNCHECKED_KERNELS says which kernels
  may, and why that is safe);
- reading back: wgpu-py's map polls until *all* queued work is done, so reading step i
  with steps i+1.. queued behind it would drain the queue and idle the GPU while the
  host encodes the next step; submitting with an index and waiting for that index lets
  the read resolve at once. wgpu-py's map_sync also submits an empty command buffer and
  waits through its polling thread; here the map's callback fires in our own poll.
"""

from __future__ import annotations

import os

import numpy as np


class PortableCalls:
    """Through wgpu-py's public API."""

    name = "wgpu-py"

    def create_bind_group(self, device, layout, entries: list[dict]):
        """A bind group of buffer `entries` ({"binding", "resource": {"buffer", "offset",
        "size"}}) on wgpu device `device`."""
        return device.create_bind_group(layout=layout, entries=entries)

    def create_shader_module(self, device, label: str, code: str, checks: bool = True):
        """A shader module of WGSL `code`; without `checks`, compiled without naga's
        runtime checks where these calls can (wgpu-py's API cannot: always checked)."""
        return device.create_shader_module(label=label, code=code)

    def prepare(self, items: list) -> list:
        """Captured (Pipeline, bind group, (x, y, z)) items in the form `encode` takes."""
        return [(pipeline.pipeline, group, groups) for pipeline, group, groups in items]

    def encode(self, compute_pass, prepared: list) -> None:
        """Record the prepared items into an open compute pass."""
        last = None
        for pipeline, group, groups in prepared:
            if pipeline is not last:
                compute_pass.set_pipeline(pipeline)
                last = pipeline
            compute_pass.set_bind_group(0, group)
            compute_pass.dispatch_workgroups(*groups)

    def submit(self, queue, command_buffer) -> int | None:
        """Queue one command buffer; its submission index where the calls give one."""
        queue.submit([command_buffer])
        return None

    def wait_for(self, device, submission: int | None) -> None:
        """Block until that submission is done (mapping waits for all work here)."""

    def read(self, device, buffer, submission: int | None, map_mode) -> np.ndarray:
        """A copy of a mappable buffer's bytes once `submission` (which wrote them) is done."""
        buffer.map_sync(map_mode)
        try:
            return np.frombuffer(buffer.read_mapped(0, buffer.size), np.uint8)
        finally:
            buffer.unmap()


class NativeCalls(PortableCalls):
    """Straight to wgpu-native's C functions (the handles wgpu-py keeps in `_internal`)."""

    name = "wgpu-native"

    def __init__(self):
        from wgpu.backends.wgpu_native import _api, _ffi  # noqa: PLC0415 - wgpu is optional

        self.ffi, self.lib, self.libf = _api.ffi, _api.lib, _api.libf
        self._bind_group_class = _api.GPUBindGroup  # releases its handle when collected
        self._shader_module_class = _api.GPUShaderModule
        # wgpu-native builds before the trusted modules compile everything checked
        self._unchecked = hasattr(_ffi.lib, "wgpuDeviceCreateShaderModuleTrusted")
        raw = _ffi.lib  # without wgpu-py's error checks: three calls per dispatch
        self._pass_calls = (raw.wgpuComputePassEncoderSetPipeline,
                            raw.wgpuComputePassEncoderSetBindGroup,
                            raw.wgpuComputePassEncoderDispatchWorkgroups, _ffi.ffi.NULL)
        self._status: dict[int, int] = {}
        self._next_key = 0

        @self.ffi.callback("void(WGPUMapAsyncStatus, WGPUStringView, void *, void *)")
        def on_mapped(result, _message, key, _unused):
            self._status[int(self.ffi.cast("uintptr_t", key))] = int(result)

        self._on_mapped = on_mapped  # kept alive: wgpu-native holds the pointer

    def create_bind_group(self, device, layout, entries: list[dict]):
        ffi = self.ffi
        c_entries = ffi.new("WGPUBindGroupEntry[]", len(entries))
        for c_entry, entry in zip(c_entries, entries):
            resource = entry["resource"]
            c_entry.binding = entry["binding"]
            c_entry.buffer = resource["buffer"]._internal
            c_entry.offset = resource["offset"]
            c_entry.size = resource["size"]
        descriptor = ffi.new("WGPUBindGroupDescriptor *")
        descriptor.layout = layout._internal
        descriptor.entryCount = len(entries)
        descriptor.entries = c_entries
        # libf: wgpu-py's checked call, so a validation error raises as it would there
        handle = self.libf.wgpuDeviceCreateBindGroup(device._internal, descriptor)
        return self._bind_group_class("", handle, device)

    def create_shader_module(self, device, label: str, code: str, checks: bool = True):
        if checks or not self._unchecked:
            return super().create_shader_module(device, label, code)
        ffi, lib = self.ffi, self.lib
        text, name = code.encode(), label.encode()
        source = ffi.new("WGPUShaderSourceWGSL *")
        source.chain.sType = lib.WGPUSType_ShaderSourceWGSL
        code_chars = ffi.new("char[]", text)  # kept alive until the call returns
        source.code.data, source.code.length = code_chars, len(text)
        descriptor = ffi.new("WGPUShaderModuleDescriptor *")
        descriptor.nextInChain = ffi.cast("WGPUChainedStruct *", source)
        label_chars = ffi.new("char[]", name)
        descriptor.label.data, descriptor.label.length = label_chars, len(name)
        handle = self.libf.wgpuDeviceCreateShaderModuleTrusted(
            device._internal, descriptor, lib.WGPUShaderRuntimeChecks_None)
        return self._shader_module_class(label, handle, device)

    def prepare(self, items: list) -> list:
        return [(pipeline.pipeline._internal, group._internal, *groups)
                for pipeline, group, groups in items]

    def encode(self, compute_pass, prepared: list) -> None:
        set_pipeline, set_group, dispatch, null = self._pass_calls
        handle = compute_pass._internal
        last = None
        for pipeline, group, x, y, z in prepared:
            if pipeline != last:
                set_pipeline(handle, pipeline)
                last = pipeline
            set_group(handle, 0, group, 0, null)
            dispatch(handle, x, y, z)

    def submit(self, queue, command_buffer) -> int | None:
        handles = self.ffi.new("WGPUCommandBuffer[1]", [command_buffer._internal])
        return self.libf.wgpuQueueSubmitForIndex(queue._internal, 1, handles)

    def wait_for(self, device, submission: int | None) -> None:
        if submission is not None:
            self.libf.wgpuDevicePoll(device._internal, True,
                                     self.ffi.new("WGPUSubmissionIndex *", submission))

    def read(self, device, buffer, submission: int | None, map_mode) -> np.ndarray:
        ffi, lib, libf = self.ffi, self.lib, self.libf
        self._next_key += 1
        key = self._next_key
        info = ffi.new("WGPUBufferMapCallbackInfo *")
        info.mode = lib.WGPUCallbackMode_AllowProcessEvents
        info.callback = self._on_mapped
        info.userdata1 = ffi.cast("void *", key)
        libf.wgpuBufferMapAsync(buffer._internal, lib.WGPUMapMode_Read, 0, buffer.size, info[0])
        self.wait_for(device, submission)
        for _ in range(3):  # the callback normally fired in the poll above
            if key in self._status:
                break
            libf.wgpuDevicePoll(device._internal, True, ffi.NULL)
        result = self._status.pop(key, None)
        if result != lib.WGPUMapAsyncStatus_Success:
            raise RuntimeError(f"could not map a readback buffer (status {result})")
        try:
            ptr = libf.wgpuBufferGetConstMappedRange(buffer._internal, 0, buffer.size)
            return np.frombuffer(ffi.buffer(ptr, buffer.size), np.uint8).copy()
        finally:
            libf.wgpuBufferUnmap(buffer._internal)


def choose_calls() -> PortableCalls:
    """NativeCalls where wgpu-native is importable, else (or with
    PXVM_WGPU_CALLS=portable) PortableCalls."""
    if os.environ.get("PXVM_WGPU_CALLS", "").lower() == "portable":
        return PortableCalls()
    try:
        return NativeCalls()
    except (ImportError, AttributeError):  # another wgpu-py backend, or renamed internals
        return PortableCalls()
