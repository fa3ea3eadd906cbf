"""conv2d against the reference and torch; convolve2d against scipy (independent)."""

import numpy as np
import pytest
import scipy.signal

import pxvm
from conftest import NMSE_LONG, assert_close


@pytest.mark.parametrize("c_in,h,w,c_out,kh,kw,stride,padding", [
    (1, 7, 7, 1, 3, 3, 1, 0), (3, 33, 17, 5, 3, 4, 2, 1), (2, 1, 1, 3, 1, 1, 1, 0),
    (4, 20, 31, 7, 5, 5, 1, 2), (1, 9, 9, 2, 9, 9, 3, 4)])
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


def test_channel_mismatch_is_a_clear_error():
    with pytest.raises(pxvm.ShapeError, match="x has 3 channels but w expects 2"):
        pxvm.ops.conv2d(np.ones((3, 5, 5), np.float32), np.ones((1, 2, 3, 3), np.float32), backend="gpu")
