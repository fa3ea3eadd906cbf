// Element-wise ops: unary activations and binary arithmetic with numpy broadcasting.
// Specialised by override constants: OP selects the function, DTYPE the element type
// (0 = f32, 1 = i32, 2 = u32; data are stored as u32 words and bitcast),
// BROADCAST = false when both operands are contiguous with the output's shape.
// Both entry points bind (a, b, out, params); `unary` ignores b.

override OP: u32 = 0u;
override DTYPE: u32 = 0u;
override BROADCAST: bool = false;
override WG: u32 = 256u;

struct Params {
    n: u32,
    ndim: u32,
    alpha: f32,
    beta: f32,
    shape: array<vec4<u32>, 2>,
    a_strides: array<vec4<u32>, 2>,
    b_strides: array<vec4<u32>, 2>,
}

@group(0) @binding(0) var<storage, read> a: array<u32>;
@group(0) @binding(1) var<storage, read> b: array<u32>;
@group(0) @binding(2) var<storage, read_write> out: array<u32>;
@group(0) @binding(3) var<uniform> p: Params;

// Unary op codes
const RELU: u32 = 0u;
const LEAKY_RELU: u32 = 1u;
const ELU: u32 = 2u;
const SIGMOID: u32 = 3u;
const TANH: u32 = 4u;
const SILU: u32 = 5u;
const GELU_TANH: u32 = 6u;
const GELU_ERF: u32 = 7u;
const CLIP: u32 = 8u;
const SCALE: u32 = 9u;
// Binary op codes
const ADD: u32 = 100u;
const SUB: u32 = 101u;
const MUL: u32 = 102u;
const DIV: u32 = 103u;
const MAXIMUM: u32 = 104u;
const MINIMUM: u32 = 105u;

fn linear_id(wid: vec3<u32>, lid: vec3<u32>, nwg: vec3<u32>) -> u32 {
    return (wid.y * nwg.x + wid.x) * WG + lid.x;
}

fn dim(v: array<vec4<u32>, 2>, i: u32) -> u32 {
    return v[i / 4u][i % 4u];
}

// NaN test on the bits: some compilers fold `x != x` away under fast-math assumptions.
fn is_nan(x: f32) -> bool {
    return (bitcast<u32>(x) & 0x7fffffffu) > 0x7f800000u;
}

// erfc with relative error < 1.2e-7 everywhere (Chebyshev fit, as in Numerical Recipes'
// erfcc), so 1 + erf(x) = erfc(-x) keeps its precision for negative x. WGSL has no erf.
fn erfc_approx(x: f32) -> f32 {
    let z = abs(x);
    let t = 1.0 / (1.0 + 0.5 * z);
    let r = t * exp(-z * z - 1.26551223 + t * (1.00002368 + t * (0.37409196 + t * (0.09678418
        + t * (-0.18628806 + t * (0.27886807 + t * (-1.13520398 + t * (1.48851587
        + t * (-0.82215223 + t * 0.17087277)))))))));
    return select(2.0 - r, r, x >= 0.0);
}

// exp(x) - 1 without cancellation near 0.
fn expm1_approx(x: f32) -> f32 {
    if (abs(x) < 0.1) {  // Taylor series: relative error < 3e-10 here
        return x * (1.0 + x * (0.5 + x * (0.16666667 + x * (0.041666668 + x * (0.008333334
            + x * 0.0013888889)))));
    }
    return exp(x) - 1.0;
}

// tanh(a) = expm1(2a) / (expm1(2a) + 2): builtin tanh lost 2e-3 relative accuracy near 0
// on lavapipe, and some drivers return NaN for large arguments (tanh(15) == 1 in f32).
fn safe_tanh(x: f32) -> f32 {
    if (is_nan(x)) { return x; }
    let e = expm1_approx(2.0 * min(abs(x), 15.0));
    return sign(x) * (e / (e + 2.0));
}

fn unary_f32(x: f32) -> f32 {
    // Drivers may compile selects and comparisons as if NaN did not exist (NVIDIA's
    // Vulkan driver turns relu into fmax), so NaN is passed through explicitly.
    if (is_nan(x)) { return x; }
    switch OP {
        case RELU: { return select(x, 0.0, x < 0.0); }
        case LEAKY_RELU: { return select(x, x * p.alpha, x < 0.0); }
        case ELU: { return select(x, p.alpha * expm1_approx(min(x, 0.0)), x < 0.0); }
        case SIGMOID: { return 1.0 / (1.0 + exp(-x)); }
        case TANH: { return safe_tanh(x); }
        case SILU: { return x / (1.0 + exp(-x)); }
        case GELU_TANH: {
            // 0.5 x (1 + tanh(u)) == x / (1 + exp(-2u)): no cancellation for negative x.
            let u = 0.7978845608028654 * (x + 0.044715 * x * x * x);
            if (is_nan(x)) { return x; }
            return x / (1.0 + exp(-2.0 * u));
        }
        case GELU_ERF: {
            // 0.5 x (1 + erf(x / sqrt 2)) == 0.5 x erfc(-x / sqrt 2)
            if (is_nan(x)) { return x; }
            return 0.5 * x * erfc_approx(-x * 0.7071067811865476);
        }
        case CLIP: {
            if (is_nan(x)) { return x; }
            return min(max(x, p.alpha), p.beta);
        }
        case SCALE: { return x * p.alpha; }
        default: { return x; }
    }
}

fn binary_f32(x: f32, y: f32) -> f32 {
    switch OP {
        case ADD: { return x + y; }
        case SUB: { return x - y; }
        case MUL: { return x * y; }
        case DIV: { return x / y; }
        case MAXIMUM: {
            if (is_nan(x) || is_nan(y)) { return x + y; }
            return max(x, y);
        }
        case MINIMUM: {
            if (is_nan(x) || is_nan(y)) { return x + y; }
            return min(x, y);
        }
        default: { return x; }
    }
}

fn binary_i32(x: i32, y: i32) -> i32 {
    switch OP {
        case ADD: { return x + y; }
        case SUB: { return x - y; }
        case MUL: { return x * y; }
        case MAXIMUM: { return max(x, y); }
        case MINIMUM: { return min(x, y); }
        default: { return x; }
    }
}

fn binary_u32(x: u32, y: u32) -> u32 {
    switch OP {
        case ADD: { return x + y; }
        case SUB: { return x - y; }
        case MUL: { return x * y; }
        case MAXIMUM: { return max(x, y); }
        case MINIMUM: { return min(x, y); }
        default: { return x; }
    }
}

@compute @workgroup_size(WG)
fn unary(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
         @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = linear_id(wid, lid, nwg);
    if (i >= p.n) { return; }
    out[i] = bitcast<u32>(unary_f32(bitcast<f32>(a[i])));
}

@compute @workgroup_size(WG)
fn binary(@builtin(workgroup_id) wid: vec3<u32>, @builtin(local_invocation_id) lid: vec3<u32>,
          @builtin(num_workgroups) nwg: vec3<u32>) {
    let i = linear_id(wid, lid, nwg);
    if (i >= p.n) { return; }
    var ia = i;
    var ib = i;
    if (BROADCAST) {
        // Walk the output index from the last dimension, adding each operand's stride
        // (0 along broadcast dimensions).
        ia = 0u;
        ib = 0u;
        var rest = i;
        for (var d = i32(p.ndim) - 1; d >= 0; d = d - 1) {
            let extent = dim(p.shape, u32(d));
            let coord = rest % extent;
            rest = rest / extent;
            ia = ia + coord * dim(p.a_strides, u32(d));
            ib = ib + coord * dim(p.b_strides, u32(d));
        }
    }
    let x = a[ia];
    let y = b[ib];
    if (DTYPE == 0u) {
        out[i] = bitcast<u32>(binary_f32(bitcast<f32>(x), bitcast<f32>(y)));
    } else if (DTYPE == 1u) {
        out[i] = bitcast<u32>(binary_i32(bitcast<i32>(x), bitcast<i32>(y)));
    } else {
        out[i] = binary_u32(x, y);
    }
}
