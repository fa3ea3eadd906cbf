"""Row copies (pxvm.ops.indexing): write_rows stores rows in place, slice_rows takes a
range of rows, concat_columns joins matrices side by side; exact on both backends, and
clear errors for operands that do not fit."""

import numpy as np
import pytest

import pxvm
from pxvm.batch import Batch
from pxvm.ops import concat_columns, slice_rows, write_rows
from pxvm.core.errors import ShapeError


def _backend(name, request):
    """The backend `name`, skipping where the GPU one is needed and missing."""
    if name == "gpu":
        request.getfixturevalue("gpu_device")
    return pxvm.get_backend(name)


# ---- write_rows and slice_rows -----------------------------------------------------

@pytest.mark.parametrize("backend", ["cpu", "gpu"])
@pytest.mark.parametrize("shape,start,rows", [((9, 3, 4), 2, 5), ((300, 33), 0, 300),
                                              ((7, 1), 6, 1)])
def test_write_rows_writes_only_its_rows_in_place(shape, start, rows, backend, rng, request):
    be = _backend(backend, request)
    before = rng.standard_normal(shape).astype(np.float32)
    src = rng.standard_normal((rows, *shape[1:])).astype(np.float32)
    dst = be.from_numpy(before)
    out = write_rows(dst, src, start=start)
    expected = before.copy()
    expected[start: start + rows] = src
    np.testing.assert_array_equal(dst.numpy(), expected)  # the destination itself changed
    np.testing.assert_array_equal(out.numpy(), expected)


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
@pytest.mark.parametrize("shape,start,stop", [((9, 3, 4), 2, 7), ((300, 33), 0, None),
                                              ((7, 1), 6, 7), ((5, 2), 0, 1)])
def test_slice_rows_copies_the_range_exactly(shape, start, stop, backend, rng, request):
    be = _backend(backend, request)
    x = rng.standard_normal(shape).astype(np.float32)
    got = slice_rows(be.from_numpy(x), start, stop)
    np.testing.assert_array_equal(got.numpy(), x[start:stop])


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
def test_rows_written_in_a_batch_are_seen_by_later_ops_of_the_batch(backend, rng, request):
    be = _backend(backend, request)
    base = rng.standard_normal((6, 5)).astype(np.float32)
    new = rng.standard_normal((2, 5)).astype(np.float32)
    dst = be.from_numpy(base)
    with Batch(be) as b:
        write_rows(dst, new, start=3)
        part = slice_rows(dst, 2, 5)
    b.execute()
    expected = base.copy()
    expected[3:5] = new
    np.testing.assert_array_equal(b.read(part), expected[2:5])
    np.testing.assert_array_equal(dst.numpy(), expected)


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
@pytest.mark.parametrize("call,message", [
    (lambda be: write_rows(np.zeros((5, 4), np.float32), np.ones((2, 3), np.float32),
                           backend=be),
     r"write_rows: rows of \(2, 3\) do not match rows of \(5, 4\)"),
    (lambda be: write_rows(np.zeros((5, 4), np.float32), np.ones((2, 4), np.float32), start=4,
                           backend=be),
     "write_rows: rows 4..5 are outside the 5 rows of the destination"),
    (lambda be: write_rows(np.zeros((5, 4), np.float32), np.ones((1, 4), np.float32), start=-1,
                           backend=be),
     "write_rows: rows -1..-1 are outside the 5 rows"),
    (lambda be: slice_rows(np.zeros((5, 4), np.float32), 3, 3, backend=be),
     r"slice_rows: \[3:3\] is not a non-empty range of 5 rows"),
    (lambda be: slice_rows(np.zeros((5, 4), np.float32), 2, 6, backend=be),
     r"slice_rows: \[2:6\] is not a non-empty range of 5 rows"),
])
def test_row_copies_refuse_rows_outside_the_tensors(call, message, backend, request):
    be = _backend(backend, request)
    with pytest.raises(ShapeError, match=message):
        call(be)


# ---- concat_columns ----------------------------------------------------------------

@pytest.mark.parametrize("backend", ["cpu", "gpu"])
@pytest.mark.parametrize("rows,na,nb", [(5, 7, 3), (37, 1, 64), (1, 300, 2), (300, 33, 257)])
def test_concat_columns_joins_side_by_side_exactly(rows, na, nb, backend, rng, request):
    be = _backend(backend, request)
    a = rng.standard_normal((rows, na)).astype(np.float32)
    c = rng.standard_normal((rows, nb)).astype(np.float32)
    got = concat_columns(be.from_numpy(a), be.from_numpy(c)).numpy()
    np.testing.assert_array_equal(got, np.concatenate([a, c], axis=1))


@pytest.mark.parametrize("backend", ["cpu", "gpu"])
@pytest.mark.parametrize("a_shape,b_shape,message", [
    ((5, 7), (4, 3), r"same rows, got \(5, 7\) and \(4, 3\)"),
    ((5,), (5, 3), r"two matrices with the same rows, got \(5,\) and \(5, 3\)"),
    ((5, 7), (5, 3, 1), r"got \(5, 7\) and \(5, 3, 1\)"),
])
def test_concat_columns_refuses_non_matching_matrices(a_shape, b_shape, message, backend,
                                                      request):
    _backend(backend, request)
    with pytest.raises(ShapeError, match=message):
        concat_columns(np.ones(a_shape, np.float32), np.ones(b_shape, np.float32),
                       backend=backend)


def _apply_row_copies(name, inputs, params, out):
    """Run an op's row_copies with numpy, each operand seen as rows of its row length."""
    from pxvm.ops.indexing import row_copies
    flat_out = out.reshape(-1)
    for c in row_copies(name, [x.shape for x in inputs], params):
        src = inputs[c.source].reshape(-1)
        for r in range(c.rows):
            s0 = (c.src_row0 + r) * c.src_row_len + c.src_col0
            d0 = (c.dst_row0 + r) * c.dst_row_len + c.dst_col0
            flat_out[d0: d0 + c.length] = src[s0: s0 + c.length]
    return out


@pytest.mark.parametrize("name,shapes,params", [
    ("write_rows", [(9, 3, 5), (4, 3, 5)], {"start": 5}),
    ("slice_rows", [(9, 3, 5)], {"start": 2, "stop": 7}),
    ("slice_rows", [(9, 7)], {"start": 8}),
    ("slice_columns", [(5, 11)], {"start": 3, "stop": 10}),
    ("slice_columns", [(5, 11)], {"start": 4}),
    ("concat_columns", [(6, 3), (6, 7)], {}),
])
def test_row_copies_of_an_op_compute_its_reference(name, shapes, params, rng):
    op = getattr(pxvm.ops, name)
    inputs = [rng.standard_normal(s).astype(np.float32) for s in shapes]
    expected = op.reference(*[x.copy() for x in inputs], **params)
    if name == "write_rows":
        out = inputs[0].copy()
    else:
        out = np.full(expected.shape, np.nan, np.float32)
    np.testing.assert_array_equal(_apply_row_copies(name, inputs, params, out), expected)
