"""The op declaration seam (pxvm.ops.registry): an op is its numpy reference plus `infer`
and kernels by backend; its signature is the reference's, its inputs the leading
parameters without defaults; operands are checked once for every backend; a backend
without a kernel, a foreign backend inside a batch and bad declarations are refused
clearly."""

import inspect
import pydoc

import numpy as np
import pytest

import pxvm
from pxvm.batch import Batch
from pxvm.ops import REGISTRY, MissingKernelError
from pxvm.ops.registry import op, same_shape
from pxvm.core.errors import PxvmError, ShapeError


@pytest.fixture
def throwaway():
    """`op` for ops declared by a test: they leave the registry when it ends."""
    before = set(REGISTRY)
    yield op
    for name in set(REGISTRY) - before:
        REGISTRY.pop(name)


def test_signature_shows_the_parameters_and_backend():
    assert str(inspect.signature(pxvm.ops.leaky_relu)) == "(x, alpha=0.01, *, backend='auto')"
    assert str(inspect.signature(pxvm.ops.matmul)) == \
        "(a, b, transpose_b=False, *, backend='auto')"
    # op.signature is the call's without backend, which the reference never sees
    assert str(pxvm.ops.leaky_relu.signature) == "(x, alpha=0.01)"


def test_help_shows_the_parameters_backend_and_doc():
    text = pydoc.render_doc(pxvm.ops.leaky_relu, renderer=pydoc.plaintext)
    assert "x if x >= 0 else alpha * x." in text
    assert "leaky_relu(x, alpha=0.01" in text
    assert "backend='auto'" in text


@pytest.mark.parametrize("made,inputs", [
    (pxvm.ops.relu, ["x"]), (pxvm.ops.add, ["a", "b"]), (pxvm.ops.conv2d, ["x", "w"]),
    (pxvm.ops.layer_norm, ["x", "weight", "bias"]), (pxvm.ops.matmul_quant, ["x", "w"]),
    (pxvm.ops.transformer.attention_cached, ["qkv", "k_cache", "v_cache", "state"]),
])
def test_inputs_are_the_leading_parameters_without_defaults(made, inputs):
    assert made.inputs == inputs
    assert REGISTRY[made.name] is made


def test_bind_splits_a_call_into_inputs_and_parameters():
    x, w = np.ones((2, 4), np.float32), np.ones((3, 2, 3, 3), np.float32)
    inputs, params = pxvm.ops.conv2d.bind((x, w), {"padding": 1})
    assert inputs[0] is x and inputs[1] is w
    assert params == {"bias": None, "stride": 1, "padding": 1}
    with pytest.raises(TypeError, match=r"conv2d\(x, w, bias=None, stride=1, padding=0\)"):
        pxvm.ops.conv2d.bind((x,), {"strides": 2})


@pytest.mark.parametrize("args,kwargs", [
    ((1, 2), {}), ((1,), {"w": 2, "stride": 3}), ((), {"padding": 4, "x": 1, "w": 2}),
    ((1, 2, 5, 3, 4), {}), ((1, 2), {"bias": None}),
])
def test_bind_agrees_with_python_binding_the_signature(args, kwargs):
    bound = inspect.signature(pxvm.ops.conv2d.reference).bind(*args, **kwargs)
    bound.apply_defaults()
    inputs, params = pxvm.ops.conv2d.bind(args, kwargs)
    assert inputs == [bound.arguments["x"], bound.arguments["w"]]
    assert params == {n: bound.arguments[n] for n in ("bias", "stride", "padding")}


@pytest.mark.parametrize("args,kwargs", [
    ((1, 2), {"x": 1}), ((1, 2, 3, 4, 5, 6), {}), ((1,), {}), ((1, 2), {"backend": 1}),
])
def test_a_call_python_would_refuse_is_a_type_error_naming_the_op(args, kwargs):
    with pytest.raises(TypeError, match=r"conv2d\(x, w"):
        pxvm.ops.conv2d.bind(args, kwargs)


@pytest.mark.parametrize("backend", ["numpy", "webgpu"])
def test_an_input_of_a_wrong_dtype_is_named(backend, request):
    if backend == "webgpu":
        request.getfixturevalue("gpu_device")
    x, w = np.ones((1, 32), np.float32), np.ones((2, 20), np.float32)
    with pytest.raises(ShapeError, match="matmul_quant: input w has dtype float32, "
                                         "expected uint8"):
        pxvm.ops.matmul_quant(x, w, qtype="Q4_1", k=32, backend=backend)
    with pytest.raises(ShapeError, match="add: input b has dtype uint8, expected float32 or "
                                         "int32 or uint32"):
        pxvm.ops.add(np.ones(3, np.float32), np.ones(3, np.uint8), backend=backend)


def test_an_op_runs_its_reference_on_numpy_and_its_kernel_once_declared(throwaway,
                                                                         gpu_device):
    @throwaway(infer=same_shape)
    def registry_test_negate(x, *, backend="auto"):
        """-x."""
        return -np.asarray(x, np.float32)

    x = np.array([1.5, -2.0, 0.0], np.float32)
    assert registry_test_negate.reference(x).tolist() == [-1.5, 2.0, -0.0]
    assert registry_test_negate(x, backend="numpy").numpy().tolist() == [-1.5, 2.0, -0.0]
    with pytest.raises(MissingKernelError,
                       match="op registry_test_negate has no webgpu kernel yet "
                             r"\(it has none\); or run it with backend='numpy'"):
        registry_test_negate(x, backend="webgpu")
    with Batch("webgpu"), pytest.raises(MissingKernelError, match="registry_test_negate.*webgpu"):
        registry_test_negate(x)

    @registry_test_negate.kernel("webgpu")
    def _negate(ctx, x):
        return pxvm.ops.scale.kernels["webgpu"](ctx, x, factor=-1.0)

    got = registry_test_negate(x, backend="gpu")
    assert got.backend.name == "webgpu" and got.numpy().tolist() == [-1.5, 2.0, -0.0]


def test_a_kernel_taking_fewer_dtypes_than_its_op_refuses_the_others(throwaway):
    # a float32-only kernel of an op that takes float16 too: Op.takes says so, and a call
    # with float16 there is a MissingKernelError naming the input (not a wrong result)
    @throwaway(infer=lambda x, y: same_shape(x), input_dtypes=(("f32", "f16"), "f32"))
    def registry_test_twice_plus(x, y, *, backend="auto"):
        """2 x + y."""
        return (2 * np.asarray(x, np.float32) + y).astype(np.asarray(x).dtype)

    cpu, numpy = pxvm.get_backend("cpu"), pxvm.get_backend("numpy")
    x32, y = np.array([1.0, 2.5], np.float32), np.array([0.5, -1.0], np.float32)
    with pytest.raises(TypeError, match="op registry_test_twice_plus has no input 'z'"):
        registry_test_twice_plus.kernel("cpu", {"z": "f32"})

    @registry_test_twice_plus.kernel("cpu", {"x": "f32"})
    def _twice_plus(ctx, x, y):
        out = ctx.empty(x.shape, x.dtype)
        ctx.record_host("twice_plus", lambda: np.copyto(out.storage, 2 * x.storage + y.storage))
        return out

    f16 = {"x": np.float16}
    assert registry_test_twice_plus.takes(cpu, {"x": np.float32, "y": np.float32})
    assert not registry_test_twice_plus.takes(cpu, f16)
    assert registry_test_twice_plus.takes(numpy, f16)  # the reference takes the op's
    assert not registry_test_twice_plus.takes(numpy, {"y": np.float16})
    assert registry_test_twice_plus(x32, y, backend="cpu").numpy().tolist() == [2.5, 4.0]
    with pytest.raises(MissingKernelError, match="op registry_test_twice_plus's cpu kernel "
                                                 "takes x of float32 only, not float16"):
        registry_test_twice_plus(x32.astype(np.float16), y, backend="cpu")
    got = registry_test_twice_plus(x32.astype(np.float16), y, backend="numpy").numpy()
    assert got.dtype == np.float16 and got.tolist() == [2.5, 4.0]
    registry_test_twice_plus.kernel("cpu")(_twice_plus)  # registered again: every dtype
    assert registry_test_twice_plus.takes(cpu, f16)


def test_inside_a_numpy_batch_an_op_for_webgpu_is_refused(gpu_device):
    x = np.ones(3, np.float32)
    with Batch("numpy"):
        with pytest.raises(PxvmError, match="relu: inside a batch on numpy ops run there; "
                                            "leave backend='auto'"):
            pxvm.ops.relu(x, backend="webgpu")
        with pytest.raises(PxvmError, match="inside a batch on numpy ops run there"):
            pxvm.ops.relu(x, backend="cpu")   # the fast CPU backend is another backend
        # the batch's own backend, by any of its names, is allowed
        for name in ("auto", "numpy", "NumPy"):
            assert pxvm.ops.relu(x, backend=name).backend.name == "numpy"


@pytest.mark.parametrize("source", [
    "def registry_test_bad(x):\n    return x",
    "def registry_test_bad(x, backend='auto'):\n    return x",
    "def registry_test_bad(x, *, device='auto'):\n    return x",
])
def test_declaring_an_op_without_a_keyword_only_backend_is_a_type_error(throwaway, source):
    namespace = {}
    exec(source, namespace)
    with pytest.raises(TypeError, match="op registry_test_bad must take a keyword-only "
                                        "`backend` parameter"):
        throwaway(infer=same_shape)(namespace["registry_test_bad"])
    assert "registry_test_bad" not in REGISTRY


def test_declaring_two_ops_of_one_name_is_a_value_error(throwaway):
    def registry_test_twice(x, *, backend="auto"):
        return x

    first = throwaway(infer=same_shape)(registry_test_twice)
    with pytest.raises(ValueError, match="op 'registry_test_twice' declared twice"):
        throwaway(infer=same_shape)(registry_test_twice)
    assert REGISTRY["registry_test_twice"] is first
    with pytest.raises(ValueError, match="op 'relu' declared twice"):
        @throwaway(infer=same_shape)
        def relu(x, *, backend="auto"):
            return x
    assert REGISTRY["relu"] is pxvm.ops.relu
