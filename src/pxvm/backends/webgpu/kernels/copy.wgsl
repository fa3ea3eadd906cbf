// Copies of a block of an f32 matrix into another: src with rows of src_row_len, dst with
// rows of dst_row_len: dst[dst_row0 + r][dst_col0 + c] = src[src_row0 + r][src_col0 + c]
// for r < rows, c < row_len. Used to write a KV cache in place, to take a range of rows
// or columns and to join matrices side by side.

const WG: u32 = 256u;

struct Params {
    rows: u32,
    row_len: u32,
    src_row0: u32,
    dst_row0: u32,
    dst_row_len: u32,
    dst_col0: u32,
    src_row_len: u32,
    src_col0: u32,
}

@group(0) @binding(0) var<storage, read> src: array<f32>;
@group(0) @binding(1) var<storage, read_write> dst: array<f32>;
@group(0) @binding(2) var<uniform> p: Params;

@compute @workgroup_size(WG)
fn copy_rows(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
             @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = (wid.y * nwg.x + wid.x) * WG + lid.x;
    if (i >= p.rows * p.row_len) { return; }
    let r = i / p.row_len;
    let c = i % p.row_len;
    dst[(p.dst_row0 + r) * p.dst_row_len + p.dst_col0 + c] = src[(p.src_row0 + r) * p.src_row_len + p.src_col0 + c];
}
