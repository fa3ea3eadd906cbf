"""The runtime's promises: binding limits, pooled buffers, compile errors, device loss,
one submit per batch, GPU timing, async readback and writes from the host."""

import asyncio
import os

import numpy as np
import pytest

import pxvm
from pxvm.backends.webgpu import WebGPUBackend, webgpu_backend
from pxvm.backends.webgpu.ops import matmul as webgpu_matmul
from pxvm.core.errors import BindingTooLargeError, DeviceLostError, ShaderCompileError
from pxvm.backends.webgpu.runtime import Device, NativeCalls, PortableCalls
from pxvm.backends.webgpu.runtime import device as device_module
from pxvm.backends.webgpu.runtime.shaders import UNCHECKED_KERNELS, declared_bindings


def test_buffer_over_the_binding_limit_names_both_sizes(gpu_device):
    limit = gpu_device.max_binding
    with pytest.raises(BindingTooLargeError) as info:
        gpu_device.alloc(limit + 4)
    assert f"{limit + 4:,}" in str(info.value) and f"{limit:,}" in str(info.value)


def test_op_on_a_tensor_over_the_binding_limit_raises_before_running(gpu_device):
    limit = gpu_device.max_binding
    n = limit // 4 + 1
    big = np.broadcast_to(np.float32(1.0), (n,))  # no memory behind it until uploaded
    with pytest.raises(BindingTooLargeError):
        pxvm.ops.relu(big, backend="gpu")


def test_many_small_ops_reuse_pooled_buffers(gpu_device, rng):
    x = rng.standard_normal(33).astype(np.float32)
    t = pxvm.tensor(x, backend="gpu")
    for _ in range(20):  # warm the pool
        pxvm.ops.scale(t, 1.0)
    created = gpu_device.pool.created
    for _ in range(2000):
        t2 = pxvm.ops.scale(t, 1.0)
    assert gpu_device.pool.created - created <= 4
    np.testing.assert_array_equal(t2.numpy(), x)


def test_shader_compile_error_names_kernel_and_line(gpu_device, monkeypatch):
    source = "@group(0) @binding(0) var<storage, read_write> x: array<f32>;\n\n" \
             "@compute @workgroup_size(1) fn main() { x[0] = undefined_name; }\n"
    monkeypatch.setattr(device_module, "load_wgsl", lambda name: source)
    monkeypatch.setattr(device_module, "declared_bindings", lambda name: ((0, "storage"),))
    with pytest.raises(ShaderCompileError) as info:
        gpu_device.pipeline("broken_for_test.wgsl", "main", {"BOGUS": 1})
    text = str(info.value)
    assert "broken_for_test.wgsl" in text and "undefined_name" in text and ":3:" in text


def test_a_compile_error_without_runtime_checks_names_kernel_and_line(gpu_device,
                                                                     monkeypatch):
    # The unchecked path (wgpu-native's trusted modules) reports errors as the checked one.
    source = "@group(0) @binding(0) var<storage, read_write> x: array<f32>;\n\n" \
             "@compute @workgroup_size(1) fn main() { x[0] = undefined_name; }\n"
    monkeypatch.setattr(device_module, "load_wgsl", lambda name: source)
    monkeypatch.setattr(device_module, "declared_bindings", lambda name: ((0, "storage"),))
    monkeypatch.setattr(device_module, "UNCHECKED_KERNELS", {"broken_for_test.wgsl"})
    monkeypatch.setattr(gpu_device, "calls", NativeCalls())
    with pytest.raises(ShaderCompileError) as info:
        gpu_device.pipeline("broken_for_test.wgsl", "main", {"BOGUS": 2})
    assert "undefined_name" in str(info.value) and ":3:" in str(info.value)


def test_kernels_compiled_with_and_without_runtime_checks_agree(gpu_device, rng,
                                                                 monkeypatch, forced):
    # The products' kernels are compiled unchecked (shaders.UNCHECKED_KERNELS) through
    # wgpu-native's calls, checked through wgpu-py's or with PXVM_SHADER_CHECKS=1; every
    # way gives the same bits.
    made = []
    a = rng.standard_normal((70, 45)).astype(np.float32)
    b = rng.standard_normal((45, 33)).astype(np.float32)
    results = []
    for calls, env in ((NativeCalls(), None), (NativeCalls(), "1"), (PortableCalls(), None)):
        if env is None:
            monkeypatch.delenv("PXVM_SHADER_CHECKS", raising=False)
        else:
            monkeypatch.setenv("PXVM_SHADER_CHECKS", env)
        create = calls.create_shader_module
        monkeypatch.setattr(calls, "create_shader_module", lambda device, label, code, checks,
                            create=create: made.append((label, checks)) or create(
                                device, label, code, checks))
        monkeypatch.setattr(gpu_device, "calls", calls)
        gpu_device.forget_pipelines()
        forced(webgpu_matmul.SHAPE_TUNED, "64x64x8")  # the blocked kernel
        results.append(pxvm.ops.matmul(a, b, backend="gpu").numpy())
    gpu_device.forget_pipelines()
    assert made and made[0][0] in UNCHECKED_KERNELS, made
    # asked for: unchecked, checked (the variable), unchecked (wgpu-py compiles it checked)
    assert [checks for label, checks in made if label == made[0][0]] == [False, True, False]
    np.testing.assert_array_equal(results[0], results[1])
    np.testing.assert_array_equal(results[0], results[2])
    np.testing.assert_allclose(results[0], a @ b, rtol=1e-4, atol=1e-4)


def test_lost_device_raises_clear_error_on_every_later_call(gpu_device, rng):
    dev = Device(os.environ.get("PXVM_DEVICE"))
    backend = WebGPUBackend(dev)
    t = backend.from_numpy(rng.standard_normal(7).astype(np.float32))
    dev.destroy()
    for call in (lambda: t.numpy(), lambda: pxvm.ops.relu(t), lambda: backend.from_numpy([1.0])):
        with pytest.raises(DeviceLostError, match="was lost"):
            call()


def test_batch_runs_a_chain_with_one_submit_and_records_nothing_before(gpu_device, rng, monkeypatch):
    submits = []
    submit = gpu_device.submit
    monkeypatch.setattr(gpu_device, "submit", lambda buffer: submits.append(buffer) or submit(buffer))
    x = rng.standard_normal(257).astype(np.float32)
    with pxvm.Batch("gpu") as batch:
        t = batch.upload(x)
        y = pxvm.ops.scale(pxvm.ops.relu(pxvm.ops.add(t, t)), 0.5)
    assert not submits
    batch.execute()
    result = batch.read(y)
    assert len(submits) == 1  # the readback copy rode along in the same submit
    np.testing.assert_allclose(result, np.maximum(2 * x, 0) * 0.5, rtol=1e-6)


def test_batch_gives_the_same_result_on_numpy(rng):
    x = rng.standard_normal(9).astype(np.float32)
    with pxvm.Batch("numpy") as batch:
        y = pxvm.ops.sigmoid(batch.upload(x))
    batch.execute()
    np.testing.assert_allclose(batch.read(y), 1 / (1 + np.exp(-x)), rtol=1e-6)


def test_reading_a_batch_before_execute_is_an_error():
    with pxvm.Batch("numpy") as batch:
        y = pxvm.ops.relu(batch.upload([1.0, -1.0]))
    with pytest.raises(pxvm.PxvmError, match="execute"):
        batch.read(y)


def test_gpu_timestamps_measure_a_batch(gpu_device, rng):
    if not gpu_device.has("timestamp-query"):
        pytest.skip("adapter has no timestamp-query")
    with pxvm.Batch("gpu", timestamps=True) as batch:
        t = batch.upload(rng.standard_normal(1 << 16).astype(np.float32))
        for _ in range(4):
            t = pxvm.ops.gelu(t)
    batch.execute()
    assert batch.device_seconds is not None and batch.device_seconds > 0


def test_async_readback_and_batch_do_not_need_the_sync_api(gpu_device, rng):
    x = rng.standard_normal(33).astype(np.float32)

    async def main():
        t = pxvm.ops.relu(x, backend="gpu")
        direct = await t.numpy_async()
        with pxvm.Batch("gpu") as batch:
            y = pxvm.ops.scale(batch.upload(x), 2.0)
        await batch.execute_async()
        return direct, await batch.read_async(y)

    direct, scaled = asyncio.run(main())
    np.testing.assert_array_equal(direct, np.where(x < 0, 0, x))
    np.testing.assert_array_equal(scaled, x * 2)


def test_profiled_recorder_times_every_dispatch_by_kernel(gpu_device, rng):
    if not gpu_device.has("timestamp-query"):
        pytest.skip("adapter has no timestamp-query")
    with pxvm.Batch(webgpu_backend(), profile=True) as batch:
        t = batch.upload(rng.standard_normal(4096).astype(np.float32))
        out = pxvm.ops.add(pxvm.ops.relu(t), t)
    batch.execute()
    labels = [label for label, _ in batch.profile]
    assert labels == ["elementwise.wgsl:unary", "elementwise.wgsl:binary"]
    assert all(seconds >= 0 for _, seconds in batch.profile)
    expected = np.where(t.numpy() < 0, 0, t.numpy()) + t.numpy()
    np.testing.assert_allclose(out.numpy(), expected, rtol=1e-6)


def test_a_readback_waits_for_its_own_submission_only(gpu_device, rng, monkeypatch):
    # Readbacks queued behind later submissions: each one waits for its own index (which
    # increase with every submit) and gets its own data.
    if not isinstance(gpu_device.calls, NativeCalls):
        pytest.skip("submission indices come with wgpu-native's calls only")
    arrays = [rng.standard_normal(1001).astype(np.float32) for _ in range(3)]
    waited = []
    wait_for = gpu_device.calls.wait_for
    monkeypatch.setattr(gpu_device.calls, "wait_for",
                        lambda device, s: waited.append(s) or wait_for(device, s))
    staged = []
    for a in arrays:
        rec = gpu_device.recorder()
        staged.append(rec.stage(gpu_device.upload(a)))
        rec.submit()
    indices = [s.submission for s in staged]
    assert None not in indices and indices == sorted(set(indices))
    for a, s in zip(arrays, staged):
        np.testing.assert_array_equal(s.result(np.float32), a)
    assert waited == indices


def test_readbacks_match_through_wgpu_py_as_through_native_calls(gpu_device, rng, monkeypatch):
    # StagingReadback.result reads through the device's calls: wgpu-native's own where it can,
    # wgpu-py's public map_sync otherwise; both must return the same bytes.
    arrays = [rng.standard_normal(n).astype(np.float32) for n in (1, 257, 4099)]
    for calls in (NativeCalls(), PortableCalls()):
        monkeypatch.setattr(gpu_device, "calls", calls)
        for a in arrays:
            rec = gpu_device.recorder()
            staged = rec.stage(gpu_device.upload(a))
            rec.submit()
            np.testing.assert_array_equal(staged.result(np.float32), a)


def test_bind_groups_made_through_either_calls_bind_the_buffers_asked_for(gpu_device, rng,
                                                                         monkeypatch):
    # Bind groups made by each calls implementation feed a kernel the very bytes bound;
    # a range past a buffer's end is refused by both alike.
    x = rng.standard_normal(300).astype(np.float32)
    small = gpu_device.alloc(64)
    entries = [{"binding": i, "resource": {"buffer": small.buffer, "offset": 0, "size": 4096}}
               for i, kind in declared_bindings("copy.wgsl") if kind != "uniform"]
    entries.append({"binding": len(entries), "resource": {
        "buffer": gpu_device.uniform_arena(0), "offset": 0, "size": 256}})
    for calls in (NativeCalls(), PortableCalls()):
        monkeypatch.setattr(gpu_device, "calls", calls)
        monkeypatch.setattr(gpu_device, "_bind_groups", type(gpu_device._bind_groups)())
        np.testing.assert_array_equal(pxvm.ops.scale(x, 2.0, backend="gpu").numpy(), 2 * x)
        with pytest.raises(Exception, match="overflow buffer size"):
            calls.create_bind_group(gpu_device.device, gpu_device.bind_group_layout("copy.wgsl"),
                                    entries)


# ---- writes from the host ----------------------------------------------------------

@pytest.mark.parametrize("nbytes,offset", [(8, 2), (6, 0), (16, 140), (160, 0), (7, 140)])
def test_device_write_refuses_unaligned_or_overflowing_writes(nbytes, offset, gpu_device):
    alloc = gpu_device.alloc(148)   # 37 floats
    with pytest.raises(ValueError, match=f"cannot write {nbytes} bytes at offset {offset} "
                                         "into an allocation of 148 bytes"):
        gpu_device.write(alloc, np.zeros(nbytes, np.uint8), offset)


def test_device_write_at_an_offset_changes_only_those_bytes(rng, gpu_device):
    values = rng.standard_normal(37).astype(np.float32)
    alloc = gpu_device.upload(values)
    part = rng.standard_normal(3).astype(np.float32)
    gpu_device.write(alloc, part, offset=4 * 34)   # the last three floats
    values[34:] = part
    np.testing.assert_array_equal(gpu_device.read(alloc, np.float32, 37), values)


def test_device_write_of_odd_length_that_ends_the_allocation(rng, gpu_device):
    values = rng.integers(0, 255, 37).astype(np.uint8)
    alloc = gpu_device.upload(values)
    tail = rng.integers(0, 255, 33).astype(np.uint8)
    gpu_device.write(alloc, tail, offset=4)   # bytes 4..36, the last word padded
    values[4:] = tail
    np.testing.assert_array_equal(gpu_device.read(alloc, np.uint8, 37), values)


def test_a_timed_batch_stops_timing_before_its_readbacks(gpu_device, rng, monkeypatch):
    # the end timestamp must precede the outputs' copies to mappable buffers, or a
    # benchmark times the readback of a large output with the kernel
    if not gpu_device.has("timestamp-query"):
        pytest.skip("adapter has no timestamp-query")
    calls = []

    class LoggingEncoder:
        def __init__(self, encoder):
            self._encoder = encoder

        def __getattr__(self, name):
            method = getattr(self._encoder, name)

            def logged(*args, **kwargs):
                writes = kwargs.get("timestamp_writes") or {}
                calls.append("end timestamp" if "end_of_pass_write_index" in writes else name)
                return method(*args, **kwargs)
            return logged

    create = gpu_device.device.create_command_encoder
    monkeypatch.setattr(gpu_device.device, "create_command_encoder",
                        lambda *a, **k: LoggingEncoder(create(*a, **k)))
    x = rng.standard_normal(4096).astype(np.float32)
    with pxvm.Batch(webgpu_backend(), timestamps=True) as batch:
        y = pxvm.ops.relu(batch.upload(x))
    batch.execute()
    np.testing.assert_array_equal(batch.read(y), np.where(x < 0, 0, x))
    assert batch.device_seconds is not None
    end = calls.index("end timestamp")
    assert "copy_buffer_to_buffer" in calls[end:] and "copy_buffer_to_buffer" not in calls[:end]
