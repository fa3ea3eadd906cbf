// extends matmul_quant.wgsl
// matmul_quant.wgsl's `matmul` with one thread a column (LANES 1) and x read from its
// buffer, for CPU drivers (ops/quantized.py chooses it there; products that merge
// attention's partial results, ATTENTION_PARTS, take matmul_quant.wgsl). Its `matmul`
// reaches no workgroup memory: a WebGPU implementation that zeroes the workgroup
// variables an entry point reaches (Dawn, in browsers) does it at each workgroup's start
// and then waits at a barrier, and on a CPU driver a kernel with a barrier runs its
// invocations as coroutines switched at each one, which this product otherwise never
// needs (BENCHMARKS.md, issue 40).

fn x_at(m: u32, k: u32) -> f32 {
    return x[m * p.K + k];
}

fn x4(m: u32, k: u32) -> vec4<f32> {
    return x_vec[(m * p.K + k) >> 2u];
}

// One lane a column: its sums are the lane's own.
fn column_sums(lid: u32, lane: u32, acc: vec3<f32>) -> vec3<f32> {
    return acc;
}

// Not for ATTENTION_PARTS (see above): nothing to merge.
fn merge_attention(m: u32, lid: u32, threads: u32) {}
