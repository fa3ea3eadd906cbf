// extends matmul_quant.wgsl
// `matmul_subgroup`: matmul_quant.wgsl's `matmul` (a workgroup's ROWS_PER_WG output columns
// of one row of x, LANES threads a column) with each column's lanes summed by subgroup
// shuffles instead of `matmul`'s tree of log2(LANES) workgroup barriers; a column wider
// than a subgroup adds its subgroups' totals after one barrier. For devices with the
// subgroup feature (pxvm/ops/quantized.py chooses it there); loaded after
// matmul_quant.wgsl's text, whose functions, bindings and Params it uses.
// It relies on a one-dimensional workgroup's subgroups being runs of subgroup_size
// consecutive invocations, as drivers lay them out (WGSL does not promise it; the tests
// check every LANES on lavapipe, whose subgroups are 8 wide, and on the H100, 32).

enable subgroups;

var<workgroup> subgroup_totals: array<vec3<f32>, WG>;

@compute @workgroup_size(WG)
fn matmul_subgroup(@builtin(workgroup_id) wid: vec3<u32>,
                   @builtin(local_invocation_id) lid3: vec3<u32>,
                   @builtin(subgroup_size) subgroup_size: u32) {
    let lid = lid3.x;
    let lane = lid % LANES;
    let n = wid.x * ROWS_PER_WG + lid / LANES;
    let m = wid.y;
    if (ATTENTION_PARTS) {
        merge_attention(m, lid);
        workgroupBarrier();
    }
    // (dot with W's row, with the up row for the GLUs, x's sum of squares for NORM)
    var acc = vec3<f32>(0.0);
    if (n < p.N) { acc = lane_dot(m, n, lane); }
    let within = min(LANES, subgroup_size);  // a column's lanes in one subgroup
    for (var o = 1u; o < within; o = o * 2u) {
        acc.x = acc.x + subgroupShuffleXor(acc.x, o);
        if (EPILOGUE >= 2u) { acc.y = acc.y + subgroupShuffleXor(acc.y, o); }
        if (NORM) { acc.z = acc.z + subgroupShuffleXor(acc.z, o); }
    }
    if (LANES > subgroup_size) {
        if (lane % subgroup_size == 0u) { subgroup_totals[lid / subgroup_size] = acc; }
        workgroupBarrier();
        if (lane == 0u) {
            for (var i = 1u; i < LANES / subgroup_size; i = i + 1u) {
                acc = acc + subgroup_totals[lid / subgroup_size + i];
            }
        }
    }
    if (lane == 0u && n < p.N) {
        var scale = 1.0;
        if (NORM) { scale = inverseSqrt(acc.z / f32(p.K) + p.eps); }
        store_output(m * p.N + n, acc.x * scale, acc.y, scale);
    }
}
