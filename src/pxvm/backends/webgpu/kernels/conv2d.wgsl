// 2-D cross-correlation (PyTorch's conv2d): x (C_in, H, W), w (C_out, C_in, KH, KW),
// bias (C_out,), zero padding, one output element per thread.
// FLIP = true flips the kernel spatially: true convolution (convolve2d).

override FLIP: bool = false;
const WG: u32 = 256u;

struct Params {
    c_in: u32, h: u32, w: u32,
    c_out: u32, kh: u32, kw: u32,
    h_out: u32, w_out: u32,
    stride: u32, padding: u32, has_bias: u32,
}

@group(0) @binding(0) var<storage, read> x: array<f32>;
@group(0) @binding(1) var<storage, read> weight: array<f32>;
@group(0) @binding(2) var<storage, read> bias: array<f32>;
@group(0) @binding(3) var<storage, read_write> y: array<f32>;
@group(0) @binding(4) var<uniform> p: Params;

@compute @workgroup_size(WG)
fn main(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
        @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = (wid.y * nwg.x + wid.x) * WG + lid.x;
    if (i >= p.c_out * p.h_out * p.w_out) { return; }
    let ox = i % p.w_out;
    let oy = (i / p.w_out) % p.h_out;
    let oc = i / (p.w_out * p.h_out);
    var acc = 0.0;
    if (p.has_bias != 0u) { acc = bias[oc]; }
    for (var c = 0u; c < p.c_in; c = c + 1u) {
        for (var ky = 0u; ky < p.kh; ky = ky + 1u) {
            // i32 so that rows in the padding (negative) are skipped, not wrapped.
            let iy = i32(oy * p.stride + ky) - i32(p.padding);
            if (iy < 0 || iy >= i32(p.h)) { continue; }
            for (var kx = 0u; kx < p.kw; kx = kx + 1u) {
                let ix = i32(ox * p.stride + kx) - i32(p.padding);
                if (ix < 0 || ix >= i32(p.w)) { continue; }
                let xv = x[(c * p.h + u32(iy)) * p.w + u32(ix)];
                var wy = ky;
                var wx = kx;
                if (FLIP) {
                    wy = p.kh - 1u - ky;
                    wx = p.kw - 1u - kx;
                }
                let wv = weight[((oc * p.c_in + c) * p.kh + wy) * p.kw + wx];
                acc = acc + xv * wv;
            }
        }
    }
    y[i] = acc;
}
