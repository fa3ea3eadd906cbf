"""The pxVM CPU executor's integer kernels (pxvm.backends.cpu.kernels.integer): exact against
numpy's int64 products on every block edge and the longest sums of extreme values
(tests/vm/test_integer_products.py runs programs through them)."""

import numpy as np
import pytest

from pxvm.backends.cpu.kernels import integer

RANGES = {np.int8: (-128, 128), np.uint8: (0, 256)}
# every edge of the kernels' blocks: tiles of 4 rows, panels of 32 columns, pairs of k, and
# narrow B (fewer than NARROW columns) multiplied a sum at a time
SHAPES = [(1, 1, 1), (3, 5, 7), (6, 9, 11), (6, 9, 12), (4, 2, 32), (5, 3, 33), (17, 33, 65),
          (8, 64, 31), (33, 257, 95)]


def reference(a, b):
    return a.astype(np.int64) @ b.astype(np.int64)


@pytest.mark.parametrize("dtype", [np.int8, np.uint8])
@pytest.mark.parametrize("m, k, n", SHAPES)
def test_matmul_is_exact_on_random_matrices(rng, dtype, m, k, n):
    a = rng.integers(*RANGES[dtype], (m, k)).astype(dtype)
    b = rng.integers(*RANGES[dtype], (k, n)).astype(dtype)
    c = integer.matmul(a, b)
    assert c.dtype == (np.int32 if dtype == np.int8 else np.uint32)
    np.testing.assert_array_equal(c, reference(a, b))


@pytest.mark.parametrize("n", [3, 40])
@pytest.mark.parametrize("dtype, value", [(np.int8, -128), (np.int8, 127), (np.uint8, 255)])
def test_the_longest_sums_of_extreme_values_are_exact(dtype, value, n):
    """K = 65535 (the largest matrix side): 128^2 * K is near 2^30, 255^2 * K near 2^32."""
    k = 65535
    a = np.full((5, k), value, dtype)
    b = np.full((k, n), value, dtype)
    b[-1] = -128 if dtype == np.int8 else 0  # the odd last k, alone in its pair
    c = integer.matmul(a, b)
    np.testing.assert_array_equal(c, reference(a, b))
    if dtype == np.uint8:
        assert c.max() > 2**31  # past int32: the uint32 result holds it


@pytest.mark.parametrize("n", [5, 40])
@pytest.mark.parametrize("rows", [1, 3, 4, 5, 64])
def test_blocks_of_rows_cover_the_product(rng, rows, n):
    a = rng.integers(-128, 128, (37, 21)).astype(np.int8)
    b = rng.integers(-128, 128, (21, n)).astype(np.int8)
    got = np.empty((37, n), np.int64)
    firsts = []
    for i0, block in integer.matmul_blocks(a, b, rows):
        got[i0: i0 + len(block)] = block
        firsts.append(i0)
    step = rows if n < integer.NARROW else -(-rows // 4) * 4  # panels: whole tiles of 4 rows
    assert firsts == list(range(0, 37, step))
    np.testing.assert_array_equal(got, reference(a, b))


def test_dot_is_exact_on_strided_views(rng):
    img = rng.integers(0, 256, (2, 100_003, 4), dtype=np.uint8)
    img[:, :5000, 0] = 255
    x, y = img[0, :, 0], img[1, :, 0]
    assert integer.dot(x, y) == int(np.dot(x.astype(np.int64), y))
