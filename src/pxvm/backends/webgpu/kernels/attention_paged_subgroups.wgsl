// extends attention_paged.wgsl
// attention_paged.wgsl's `reduce` by subgroup operations, as attention_cached_subgroups.wgsl
// does attention_cached.wgsl's: each subgroup's max or sum, then the workgroup's over
// those, with two barriers instead of a tree of log2(size); for devices with the
// subgroup feature (ops/transformer.py chooses this file there). It relies on subgroups
// being runs of consecutive invocations.

enable subgroups;

fn reduce(lid: u32, x: f32, take_max: bool, size: u32) -> f32 {
    let width = subgroup_width();
    let v = select(select(0.0, EMPTY, take_max), x, lid < size);
    var r = 0.0;
    if (take_max) { r = subgroupMax(v); } else { r = subgroupAdd(v); }
    let shift = countTrailingZeros(width);  // widths are powers of two
    if ((lid & (width - 1u)) == 0u) { scratch[lid >> shift] = r; }
    workgroupBarrier();
    r = scratch[0];
    for (var i = 1u; i < ((size + width - 1u) >> shift); i = i + 1u) {
        if (take_max) { r = max(r, scratch[i]); } else { r = r + scratch[i]; }
    }
    workgroupBarrier();  // scratch is written again by the next reduction
    return r;
}

// The subgroup's size, from a function (the subgroup_size built-in reaches entry points
// only): its invocations counted, every one of them being active here.
fn subgroup_width() -> u32 {
    let ballot = countOneBits(subgroupBallot(true));
    return ballot.x + ballot.y + ballot.z + ballot.w;
}
