// A batch's decoding step's inputs made the next step's, in place (pxvm.ops.decoding's
// advance_tokens): token i's id becomes tokens[i] and its position (token_table[i][1])
// one more, so that steps over a paged cache chain on the GPU without the host.

const WG: u32 = 64u;

struct Params {
    n: u32,
}

@group(0) @binding(0) var<storage, read_write> token_ids: array<i32>;
@group(0) @binding(1) var<storage, read_write> token_table: array<i32>;
@group(0) @binding(2) var<storage, read> tokens: array<i32>;
@group(0) @binding(3) var<uniform> p: Params;

@compute @workgroup_size(WG)
fn advance_tokens(@builtin(global_invocation_id) gid: vec3<u32>) {
    let i = gid.x;
    if (i >= p.n) { return; }
    token_ids[i] = tokens[i];
    token_table[2u * i + 1u] = token_table[2u * i + 1u] + 1;
}
