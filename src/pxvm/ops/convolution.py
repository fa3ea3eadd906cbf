"""2-D convolution: `conv2d` with PyTorch's cross-correlation semantics on
(C_in, H, W) inputs, and `convolve2d`, scipy.signal.convolve2d(mode="valid") on one 2-D
image, which is conv2d with the kernel flipped."""

from __future__ import annotations

import numpy as np

from .registry import meta, op, require


def infer_conv2d(x, w, bias=None, stride=1, padding=0):
    require(len(x.shape) == 3, f"conv2d takes x of shape (C_in, H, W), got {tuple(x.shape)}")
    require(len(w.shape) == 4, f"conv2d takes w of shape (C_out, C_in, kh, kw), got {tuple(w.shape)}")
    require(w.shape[1] == x.shape[0],
            f"conv2d: x has {x.shape[0]} channels but w expects {w.shape[1]} (w is {tuple(w.shape)})")
    require(int(stride) >= 1 and int(padding) >= 0, f"need stride >= 1 and padding >= 0, got {stride}, {padding}")
    if bias is not None:
        bias_shape = tuple(getattr(bias, "shape", np.shape(bias)))
        require(bias_shape == (w.shape[0],),
                f"conv2d bias must have shape ({w.shape[0]},), got {bias_shape}")
    h_out = (x.shape[1] + 2 * padding - w.shape[2]) // stride + 1
    w_out = (x.shape[2] + 2 * padding - w.shape[3]) // stride + 1
    require(h_out >= 1 and w_out >= 1,
            f"conv2d: kernel {tuple(w.shape[2:])} is larger than the padded input {tuple(x.shape[1:])}")
    return meta((w.shape[0], h_out, w_out), np.float32)


def _infer_convolve2d(image, kernel):
    require(len(image.shape) == 2 and len(kernel.shape) == 2,
            f"convolve2d takes a 2-D image and a 2-D kernel, got {tuple(image.shape)} and {tuple(kernel.shape)}")
    require(kernel.shape[0] <= image.shape[0] and kernel.shape[1] <= image.shape[1],
            f"convolve2d 'valid' mode needs the kernel {tuple(kernel.shape)} to fit in the image {tuple(image.shape)}")
    return meta((image.shape[0] - kernel.shape[0] + 1, image.shape[1] - kernel.shape[1] + 1), np.float32)


@op(infer=infer_conv2d)
def conv2d(x, w, bias=None, stride=1, padding=0, *, backend="auto"):
    """Cross-correlation of x (C_in, H, W) with w (C_out, C_in, kh, kw), plus bias
    (PyTorch's conv2d on one image)."""
    x = np.asarray(x, np.float64)
    w = np.asarray(w, np.float64)
    c_in, h, wd = x.shape
    c_out, _, kh, kw = w.shape
    xp = np.pad(x, ((0, 0), (padding, padding), (padding, padding)))
    h_out = (h + 2 * padding - kh) // stride + 1
    w_out = (wd + 2 * padding - kw) // stride + 1
    out = np.zeros((c_out, h_out, w_out))
    for ky in range(kh):
        for kx in range(kw):
            patch = xp[:, ky: ky + stride * h_out: stride, kx: kx + stride * w_out: stride]
            out += np.einsum("oc,chw->ohw", w[:, :, ky, kx], patch)
    if bias is not None:
        out += np.asarray(bias, np.float64)[:, None, None]
    return out.astype(np.float32)


@op(infer=_infer_convolve2d)
def convolve2d(image, kernel, *, backend="auto"):
    """True 2-D convolution, 'valid' mode: the kernel is flipped
    (scipy.signal.convolve2d(image, kernel, mode="valid"))."""
    k = np.asarray(kernel, np.float32)[::-1, ::-1]
    return conv2d.reference(np.asarray(image)[None], k[None, None])[0]
