// extends matmul_quant.wgsl
// matmul_quant.wgsl's `column_sums` by subgroup shuffles instead of a tree of log2(LANES)
// workgroup barriers: for devices with the subgroup feature (ops/quantized.py
// chooses this file there). A column wider than a subgroup adds its subgroups' totals
// after the one barrier left. It relies on a one-dimensional workgroup's subgroups
// being runs of consecutive invocations, as drivers lay them out (WGSL does not promise
// it; the tests check every LANES on lavapipe, whose subgroups are 8 wide, and on the
// H100, 32).

enable subgroups;

var<workgroup> subgroup_totals: array<vec3<f32>, WG>;

fn column_sums(lid: u32, lane: u32, acc: vec3<f32>) -> vec3<f32> {
    let width = subgroup_width();
    var sums = acc;
    for (var o = 1u; o < min(LANES, width); o = o * 2u) {
        sums.x = sums.x + subgroupShuffleXor(sums.x, o);
        if (EPILOGUE >= 2u) { sums.y = sums.y + subgroupShuffleXor(sums.y, o); }
        if (NORM) { sums.z = sums.z + subgroupShuffleXor(sums.z, o); }
    }
    // (the barrier outside the branch: `width` is uniform in a subgroup only)
    let shift = countTrailingZeros(width);  // widths are powers of two
    if (LANES > width && (lane & (width - 1u)) == 0u) { subgroup_totals[lid >> shift] = sums; }
    workgroupBarrier();
    if (LANES > width && lane == 0u) {
        for (var i = 1u; i < (LANES >> shift); i = i + 1u) {
            sums = sums + subgroup_totals[(lid >> shift) + i];
        }
    }
    return sums;
}

// The subgroup's size, from a function (the subgroup_size built-in reaches entry points
// only): its invocations counted, every one of them being active here.
fn subgroup_width() -> u32 {
    let ballot = countOneBits(subgroupBallot(true));
    return ballot.x + ballot.y + ballot.z + ballot.w;
}

// matmul_quant.wgsl's `mv_sum` by subgroup sums: each subgroup's total into mv_parts,
// added up by mv_sums_ready after one barrier for all of a workgroup's sums.
// sum i of subgroup s at MV_PARTS i + s: MV_THREADS <= 256 in subgroups of at least 4
const MV_PARTS: u32 = 64u;
var<workgroup> mv_parts: array<f32, MV_MAX_SUMS * MV_PARTS>;

fn mv_sum(lid: u32, v: f32, i: u32) {
    let total = subgroupAdd(v);
    let width = subgroup_width();
    if ((lid & (width - 1u)) == 0u) { mv_parts[i * MV_PARTS + lid / width] = total; }
}

fn mv_sums_ready(lid: u32) {
    let subgroups = max(MV_THREADS / subgroup_width(), 1u);
    workgroupBarrier();
    if (lid < MV_MAX_SUMS) {
        var total = 0.0;
        for (var s = 0u; s < subgroups; s = s + 1u) { total = total + mv_parts[lid * MV_PARTS + s]; }
        mv_sums[lid] = total;
    }
    workgroupBarrier();
}
