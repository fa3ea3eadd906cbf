"""The multiply-add rate WGSL reaches on this device, per arithmetic type: the ceiling a
matmul kernel of that type works under (what limits matmul_f16's f16 products against
its float32 ones, BENCHMARKS.md, issue 19). Each thread runs CHAINS independent
multiply-add chains of one vector type over a fixed number of steps, its results
stored so that nothing is optimised away; GPU time from timestamp queries around one
dispatch, median of 7 after a warm-up. Raw wgpu, not pxvm: it measures the device.
`dot4I8Packed` (WGSL's packed 4 x int8 dot product, a multiply-add of four int8 pairs
into an i32) is counted as 8 operations, as a 4-wide multiply-add: whether the driver
runs it as one instruction (NVIDIA's dp4a) or a sequence shows in its rate against f32's.
Usage: python benchmarks/webgpu/fma_peak.py [WORKGROUPS]"""
import statistics
import sys

import numpy as np
import wgpu

STEPS = 1024   # loop trips
UNROLL = 4
CHAINS = 8
WORKGROUPS = int(sys.argv[1]) if len(sys.argv) > 1 else 132 * 64  # 64 a multiprocessor of an H100
WG = 256
TYPES = {  # name: (WGSL type, scalar lanes, needs f16)
    "f32": ("f32", 1, False), "vec4<f32>": ("vec4<f32>", 4, False),
    "f16": ("f16", 1, True), "vec2<f16>": ("vec2<f16>", 2, True),
    "vec4<f16>": ("vec4<f16>", 4, True),
    "dot4I8Packed": ("i32", 4, False),
}


def source(wgsl_type: str, lanes: int, half: bool) -> str:
    # every lane of every chain starts apart, or a compiler computes one lane and copies it
    chains = "\n".join(
        f"    var a{i} = {wgsl_type}({', '.join(f'x + {i + j / 4}' for j in range(lanes))});"
        for i in range(CHAINS))
    # UNROLL rounds of the chains a trip: the loop's own instructions (and the trip
    # counter naga adds) stay a small share
    step = "fma(a{i}, m, c)"
    if wgsl_type == "i32":   # dot4I8Packed: the chain's value is the next packed operand
        chains = "\n".join(f"    var a{i} = i32(gid.x) + {i};" for i in range(CHAINS))
        step = "a{i} + dot4I8Packed(bitcast<u32>(a{i}), 0x01ff02feu)"
    steps = "\n".join(f"        a{i} = {step.format(i=i)};" for _ in range(UNROLL)
                       for i in range(CHAINS))
    total = " + ".join(f"a{i}" for i in range(CHAINS))
    return f"""{"enable f16;" if half else ""}
@group(0) @binding(0) var<storage, read_write> out: array<f32>;
@compute @workgroup_size({WG})
fn main(@builtin(global_invocation_id) gid: vec3<u32>) {{
    let x = {"f16" if half else "f32"}(gid.x & 7u);
    let m = {wgsl_type}({"1" if wgsl_type == "i32" else "0.999"});
    let c = {wgsl_type}({"0" if wgsl_type == "i32" else "0.001"});
{chains}
    for (var s = 0u; s < {STEPS}u; s = s + 1u) {{
{steps}
    }}
    let t = {total};
    out[gid.x] = {"f32(t)" if wgsl_type == "i32" else " + ".join(
        f"f32(t{'.' + 'xyzw'[j] if lanes > 1 else ''})" for j in range(lanes))};
}}
"""


def main() -> None:
    adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
    features = [f for f in ("shader-f16", "timestamp-query") if f in adapter.features]
    device = adapter.request_device_sync(required_features=features)
    print(adapter.info["device"], adapter.info.get("driver_description", ""), features)
    out = device.create_buffer(size=WORKGROUPS * WG * 4, usage=wgpu.BufferUsage.STORAGE)
    query = device.create_query_set(type="timestamp", count=2)
    resolved = device.create_buffer(size=16, usage=wgpu.BufferUsage.QUERY_RESOLVE
                                    | wgpu.BufferUsage.COPY_SRC)
    for name, (wgsl_type, lanes, half) in TYPES.items():
        if half and "shader-f16" not in features:
            print(f"{name}: skipped, no shader-f16")
            continue
        module = device.create_shader_module(code=source(wgsl_type, lanes, half))
        pipeline = device.create_compute_pipeline(
            layout="auto", compute={"module": module, "entry_point": "main"})
        group = device.create_bind_group(layout=pipeline.get_bind_group_layout(0), entries=[
            {"binding": 0, "resource": {"buffer": out}}])
        seconds = []
        for _ in range(8):
            encoder = device.create_command_encoder()
            compute = encoder.begin_compute_pass(timestamp_writes={
                "query_set": query, "beginning_of_pass_write_index": 0,
                "end_of_pass_write_index": 1})
            compute.set_pipeline(pipeline)
            compute.set_bind_group(0, group)
            compute.dispatch_workgroups(WORKGROUPS)
            compute.end()
            encoder.resolve_query_set(query, 0, 2, resolved, 0)
            device.queue.submit([encoder.finish()])
            begin, end = np.frombuffer(device.queue.read_buffer(resolved), np.uint64)
            seconds.append((int(end) - int(begin)) * 1e-9)
        t = statistics.median(seconds[1:])
        flops = 2 * WORKGROUPS * WG * STEPS * UNROLL * CHAINS * lanes
        unit = "TOP/s " if name == "dot4I8Packed" else "TFLOP/s"
        print(f"{name:10s} {flops / t / 1e12:7.1f} {unit} ({t * 1e3:.2f} ms)")


if __name__ == "__main__":
    main()
