// Rotary position embedding on x of shape (seq, heads, head_dim): row s sits at position
// pos_offset + s and pair i turns by angle pos * theta^(-2i / head_dim).
// NEOX = false rotates adjacent pairs (x[2i], x[2i+1]) (the GGUF llama convention);
// NEOX = true rotates (x[i], x[i + head_dim/2]) (HF's rotate_half convention).
// cos/sin come from a table computed in float64 on the host (cos_sin[pos][i] = (cos, sin)):
// an f32 angle of a few thousand radians would already be off by ~1e-3.

override NEOX: bool = false;
const WG: u32 = 256u;

struct Params {
    seq: u32,
    heads: u32,
    head_dim: u32,
    pos_offset: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> cos_sin: array<vec2<f32>>;
@group(0) @binding(2) var<storage, read_write> y: array<f32>;
@group(0) @binding(3) var<uniform> p: Params;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let half = p.head_dim / 2u;
    let t = (wid.y * nwg.x + wid.x) * WG + lid.x;  // one thread per rotated pair
    if (t >= p.seq * p.heads * half) { return; }
    let i = t % half;
    let row = t / half;          // (s, h) flattened
    let pos = p.pos_offset + row / p.heads;
    let cs = cos_sin[pos * half + i];
    let base = row * p.head_dim;
    var j0 = base + 2u * i;
    var j1 = j0 + 1u;
    if (NEOX) {
        j0 = base + i;
        j1 = base + i + half;
    }
    let x0 = x[j0];
    let x1 = x[j1];
    y[j0] = x0 * cs.x - x1 * cs.y;
    y[j1] = x0 * cs.y + x1 * cs.x;
}
