"""conv2d against the reference and torch; convolve2d against scipy (independent)."""

import numpy as np
import pytest
import scipy.signal

import pxvm
from conftest import NMSE_LONG, assert_close


@pytest.mark.parametrize("c_in,h,w,c_out,kh,kw,stride,padding", [
    (1, 7, 7, 1, 3, 3, 1, 0), (3, 33, 17, 5, 3, 4, 2, 1), (2, 1, 1, 3, 1, 1, 1, 0),
    (4, 20, 31, 7, 5, 5, 1, 2), (1, 9, 9, 2, 9, 9, 3, 4), (2, 33, 257, 3, 3, 3, 1, 1),
    (7, 16, 16, 1, 2, 3, 3, 0)])
@pytest.mark.parametrize("with_bias", [False, True])
def test_conv2d_matches_reference(gpu_device, rng, c_in, h, w, c_out, kh, kw, stride, padding, with_bias):
    x = rng.standard_normal((c_in, h, w)).astype(np.float32)
    wt = rng.standard_normal((c_out, c_in, kh, kw)).astype(np.float32)
    bias = rng.standard_normal(c_out).astype(np.float32) if with_bias else None
    got = pxvm.ops.conv2d(x, wt, bias, stride, padding, backend="gpu").numpy()
    assert_close(got, pxvm.ops.conv2d.reference(x, wt, bias, stride, padding), NMSE_LONG)


def test_conv2d_reference_agrees_with_torch(rng):
    torch = pytest.importorskip("torch")
    x = rng.standard_normal((3, 12, 10)).astype(np.float32)
    w = rng.standard_normal((4, 3, 3, 3)).astype(np.float32)
    b = rng.standard_normal(4).astype(np.float32)
    expected = torch.nn.functional.conv2d(torch.tensor(x)[None], torch.tensor(w), torch.tensor(b),
                                          stride=2, padding=1)[0].numpy()
    assert_close(pxvm.ops.conv2d.reference(x, w, b, 2, 1), expected, 1e-10)


@pytest.mark.parametrize("image,kernel", [((7, 7), (3, 3)), ((33, 40), (5, 2)), ((1, 9), (1, 9))])
def test_convolve2d_matches_scipy(gpu_device, rng, image, kernel):
    im = rng.standard_normal(image).astype(np.float32)
    k = rng.standard_normal(kernel).astype(np.float32)
    expected = scipy.signal.convolve2d(im, k, mode="valid")
    assert_close(pxvm.ops.convolve2d(im, k, backend="gpu").numpy(), expected, NMSE_LONG)
    assert_close(pxvm.ops.convolve2d(im, k, backend="cpu").numpy(), expected, 1e-10)


@pytest.mark.parametrize("x,w,kwargs,message", [
    ((3, 5, 5), (1, 2, 3, 3), {}, "x has 3 channels but w expects 2"),
    ((5, 5), (1, 1, 3, 3), {}, r"x of shape \(C_in, H, W\), got \(5, 5\)"),
    ((1, 5, 5), (1, 3, 3), {}, r"w of shape \(C_out, C_in, kh, kw\), got \(1, 3, 3\)"),
    ((1, 2, 2), (1, 1, 3, 3), {}, r"kernel \(3, 3\) is larger than the padded input"),
    ((1, 5, 5), (1, 1, 3, 3), {"stride": 0}, "need stride >= 1"),
    ((1, 5, 5), (2, 1, 3, 3), {"bias": np.ones(3, np.float32)}, r"bias must have shape \(2,\)"),
])
def test_conv2d_bad_operands_are_refused_clearly(x, w, kwargs, message):
    with pytest.raises(pxvm.ShapeError, match=message):
        pxvm.ops.conv2d(np.ones(x, np.float32), np.ones(w, np.float32), backend="gpu", **kwargs)


def test_convolve2d_kernel_larger_than_image_is_refused():
    with pytest.raises(pxvm.ShapeError, match=r"kernel \(4, 2\) to fit in the image \(3, 3\)"):
        pxvm.ops.convolve2d(np.ones((3, 3), np.float32), np.ones((4, 2), np.float32), backend="gpu")


@pytest.mark.parametrize("bias_backend", ["numpy", "cpu", "gpu"])
def test_conv2d_bias_may_be_a_tensor_of_either_backend(gpu_device, rng, bias_backend):
    x = rng.standard_normal((2, 6, 7)).astype(np.float32)
    w = rng.standard_normal((3, 2, 3, 2)).astype(np.float32)
    b = rng.standard_normal(3).astype(np.float32)
    bias = b if bias_backend == "numpy" else pxvm.tensor(b, backend=bias_backend)
    expected = pxvm.ops.conv2d.reference(x, w, b)
    assert_close(pxvm.ops.conv2d(x, w, bias, backend="gpu").numpy(), expected, NMSE_LONG)
