"""The op registry. An op is declared by its numpy reference, decorated with how its
result's shape is inferred:

    @op(infer=same_shape)
    def relu(x, *, backend="auto"):
        \"\"\"max(x, 0); NaN stays NaN.\"\"\"
        x = np.asarray(x, np.float32)
        return np.where(x < 0, np.float32(0), x)

The function's body is the reference; its signature is the op's. Backends register
their kernels for it (`@relu.kernel(name)`, in their own packages); a kernel that takes
some input in fewer dtypes than the op says which (`input_dtypes`), and the others are
a MissingKernelError there (`Op.takes` asks beforehand). A fused op also
names its `decomposition`: a function of the same signature that computes it with
other ops, which backends without the fused kernel run.

Calling the op, `pxvm.ops.relu(x, backend=...)`, chooses the backend (inside `with
batch:` the batch's, else the inputs' own or the best available), moves numpy inputs
there, checks the operands once for every backend (`infer`, which raises ShapeError)
and runs it: the reference on the host arrays where the backend has no recording
context (numpy), else the backend's kernel, which records into the context; without
one, the decomposition; without that, the reference recorded where the backend's
tensors are host arrays, and elsewhere a MissingKernelError. The
reference never sees `backend`. Inputs are the leading parameters without defaults; the
others are parameters, keyword-only ones without a default required (a weight's type).
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import Any, Callable, Generic, ParamSpec

import numpy as np

from ..batch import Batch, active_batch
from ..core import (DTYPES, Backend, PxvmError, RecordingContext, ShapeError, Tensor,
                    as_supported_array, get_backend)
from ..core.selection import backend_for

P = ParamSpec("P")

REGISTRY: dict[str, "Op"] = {}


@dataclass(frozen=True)
class Meta:
    """Shape and dtype of an op's result."""

    shape: tuple
    dtype: np.dtype


def meta(shape, dtype) -> Meta:
    return Meta(tuple(int(s) for s in shape), np.dtype(dtype))


def same_shape(x, **params) -> Meta:
    """`infer` of ops whose result has their first input's shape and dtype."""
    return meta(x.shape, x.dtype)


def require(cond: bool, message: str) -> None:
    """Raise ShapeError(message) unless cond: the one way ops reject bad operands."""
    if not cond:
        raise ShapeError(message)


class MissingKernelError(PxvmError):
    """The op has no kernel for the backend it was asked to run on."""


class Op(Generic[P]):
    """One op: its numpy `reference`, `infer(*inputs, **params) -> Meta`, `kernels` by
    backend name, each `kernel(context, *tensors, **params) -> Tensor`, and for a fused
    op its `decomposition(*inputs, **params)`, the same computed by other ops."""

    def __init__(self, reference: Callable[P, Any], infer: Callable[..., Meta],
                 dtypes: tuple[str, ...] = ("f32",), input_dtypes: tuple | None = None,
                 decomposition: Callable[..., Tensor] | None = None):
        functools.update_wrapper(self, reference)  # name, doc, and the signature for help()
        self.name = reference.__name__
        self.reference = reference
        self._infer = infer
        full = inspect.signature(reference)
        backend = full.parameters.get("backend")
        if backend is None or backend.kind is not inspect.Parameter.KEYWORD_ONLY:
            raise TypeError(f"op {self.name} must take a keyword-only `backend` parameter")
        self.signature = full.replace(parameters=[p for p in full.parameters.values()
                                                  if p.name != "backend"])
        self.inputs = [p.name for p in self.signature.parameters.values()
                       if p.default is inspect.Parameter.empty
                       and p.kind is not inspect.Parameter.KEYWORD_ONLY]
        allowed = input_dtypes or (dtypes,) * len(self.inputs)
        if len(allowed) != len(self.inputs):
            raise TypeError(f"op {self.name}: input_dtypes names {len(allowed)} inputs, it "
                            f"has {len(self.inputs)}")
        self.input_dtypes = tuple(
            tuple(DTYPES[d] for d in ((names,) if isinstance(names, str) else names))
            for names in allowed)
        self.kernels: dict[str, Callable] = {}
        #: backend name -> {input index: the dtypes its kernel takes}, for kernels that
        #: take fewer than the op (Op.kernel's input_dtypes)
        self.kernel_dtypes: dict[str, dict[int, tuple[np.dtype, ...]]] = {}
        self.decomposition = decomposition
        # bind()'s fast path: parameters by name, those a call may give by position, the
        # parameters in order with their defaults (signatures with *args, **kwargs or
        # positional-only names take inspect's)
        kinds = {p.kind for p in self.signature.parameters.values()}
        self._simple = kinds <= {inspect.Parameter.POSITIONAL_OR_KEYWORD,
                                 inspect.Parameter.KEYWORD_ONLY}
        self._names = frozenset(self.signature.parameters)
        self._positional = [p.name for p in self.signature.parameters.values()
                            if p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD]
        self._params = {p.name: p.default for p in self.signature.parameters.values()
                        if p.name not in self.inputs}
        #: parameters a call must name (keyword-only, without a default: a weight's type)
        self._required = [name for name, default in self._params.items()
                          if default is inspect.Parameter.empty]

    def kernel(self, backend_name: str, input_dtypes: dict[str, str | tuple] | None = None):
        """Decorator: `fn(context, *tensors, **params)` becomes this op's kernel on
        backend `backend_name`. `input_dtypes` ({input: dtype names}) names inputs the
        kernel takes in fewer dtypes than the op (a float32-only kernel of an op that
        takes float16 too); other dtypes there are a MissingKernelError."""
        narrowed = {}
        for name, names in (input_dtypes or {}).items():
            if name not in self.inputs:
                raise TypeError(f"op {self.name} has no input {name!r} (its inputs: "
                                f"{', '.join(self.inputs)})")
            narrowed[self.inputs.index(name)] = tuple(
                DTYPES[d] for d in ((names,) if isinstance(names, str) else names))

        def register(fn):
            self.kernels[backend_name] = fn
            if narrowed:
                self.kernel_dtypes[backend_name] = narrowed
            else:
                self.kernel_dtypes.pop(backend_name, None)
            return fn
        return register

    def takes(self, backend: Backend, dtypes: dict[str, object]) -> bool:
        """Whether the op runs on `backend` with inputs of these dtypes ({input: dtype}):
        the op takes them, and so does the backend's kernel where it runs one (the
        reference and a decomposition take what the op takes)."""
        how = self.implementation(backend)
        if how == "missing":
            return False
        for name, dtype in dtypes.items():
            index = self.inputs.index(name)
            allowed = self.input_dtypes[index]
            if how == "kernel":
                allowed = self.kernel_dtypes.get(backend.name, {}).get(index, allowed)
            if np.dtype(dtype) not in allowed:
                return False
        return True

    def infer(self, inputs, params: dict) -> Meta:
        """The result's shape and dtype; ShapeError when the operands do not fit."""
        for name, x, allowed in zip(self.inputs, inputs, self.input_dtypes):
            if np.dtype(x.dtype) not in allowed:
                raise ShapeError(f"{self.name}: input {name} has dtype {np.dtype(x.dtype)}, "
                                 f"expected {' or '.join(str(d) for d in allowed)}")
        return self._infer(*inputs, **params)

    def bind(self, args, kwargs) -> tuple[list, dict]:
        """A call's arguments split into the inputs and the keyword parameters."""
        if self._simple and len(args) <= len(self._positional):
            values = dict(zip(self._positional, args))
            if (all(k in self._names and k not in values for k in kwargs)
                    and all(n in values or n in kwargs for n in self.inputs)
                    and all(n in kwargs for n in self._required)):
                values.update(kwargs)
                return ([values[n] for n in self.inputs],
                        {n: values.get(n, d) for n, d in self._params.items()})
        # anything else (a wrong call included) as inspect binds it, with its errors
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{self.name}{self.signature}: {exc}") from None
        bound.apply_defaults()
        return ([bound.arguments[n] for n in self.inputs],
                {n: bound.arguments[n] for n in self._params})

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> Tensor:
        backend = kwargs.pop("backend", "auto")
        inputs, params = self.bind(args, kwargs)
        batch = active_batch()
        if batch is not None:
            if not (isinstance(backend, str) and backend == "auto") \
                and get_backend(backend) is not batch.backend:
                raise PxvmError(f"{self.name}: inside a batch on {batch.backend.name} ops "
                                f"run there; leave backend='auto'")
            tensors = [batch.adopt(x) for x in inputs]
            shape = self.infer(tensors, params)
            if self.implementation(batch.backend) == "decomposed":
                return self.decomposition(*tensors, **params)
            return batch.record(lambda ctx: self.run(batch.backend, ctx, tensors, params, shape),
                                tensors)
        target = backend_for(self.name, inputs, backend)
        tensors = [_on_backend(x, target) for x in inputs]
        shape = self.infer(tensors, params)
        if self.implementation(target) == "decomposed":
            with Batch(target) as decomposed:
                out = self.decomposition(*tensors, **params)
            decomposed.execute()
            return out
        context = target.context()
        out = self.run(target, context, tensors, params, shape)
        if context is not None:
            context.submit()
        return out

    def implementation(self, backend: Backend) -> str:
        """How a call on `backend` runs: "kernel" (the backend's own), "decomposed" (the
        ops it equals), "reference" (numpy's, on host arrays) or "missing" (a
        MissingKernelError)."""
        if not backend.records:
            return "reference"
        if backend.name in self.kernels:
            return "kernel"
        if self.decomposition is not None:
            return "decomposed"
        return "reference" if backend.host_arrays else "missing"

    def run(self, backend: Backend, context: RecordingContext | None, tensors: list[Tensor],
            params: dict, shape: Meta) -> Tensor:
        """Run (or record) the op on checked operands: the reference without a context."""
        if context is None:
            out = self.reference(*[t.storage for t in tensors], **params)
            out = np.asarray(out, dtype=shape.dtype).reshape(shape.shape)
            return Tensor(out.shape, out.dtype, backend, out)
        kernel = self.kernels.get(backend.name)
        if kernel is None and backend.host_arrays:
            return self._recorded_reference(context, tensors, params, shape)
        if kernel is None:
            raise MissingKernelError(
                f"op {self.name} has no {backend.name} kernel yet (it has "
                f"{', '.join(sorted(self.kernels)) or 'none'})", other_backend="numpy")
        narrowed = self.kernel_dtypes.get(backend.name)
        if narrowed is not None:
            for index, allowed in narrowed.items():
                if np.dtype(tensors[index].dtype) not in allowed:
                    raise MissingKernelError(
                        f"op {self.name}'s {backend.name} kernel takes {self.inputs[index]} "
                        f"of {' or '.join(str(d) for d in allowed)} only, not "
                        f"{np.dtype(tensors[index].dtype)}", other_backend="numpy")
        return kernel(context, *tensors, **params)

    def _recorded_reference(self, context: RecordingContext, tensors: list[Tensor],
                            params: dict, shape: Meta) -> Tensor:
        out = context.empty(shape.shape, shape.dtype)
        arrays = [t.storage for t in tensors]

        def reference():
            result = self.reference(*arrays, **params)
            out.storage[...] = np.asarray(result, shape.dtype).reshape(shape.shape)
        context.record_host(self.name, reference)
        return out

    def __repr__(self) -> str:
        return f"<pxvm op {self.name}{inspect.signature(self.reference)}>"


def op(infer: Callable[..., Meta], input_dtypes: tuple | None = None, dtypes: tuple = ("f32",),
       decomposition: Callable[..., Tensor] | None = None) -> Callable[[Callable[P, Any]], Op[P]]:
    """Decorator declaring an op (module docstring). `dtypes` are the dtypes every input
    may have; `input_dtypes` says it per input instead (a name or a tuple of names each),
    for inputs of different roles (a float activation and a raw uint8 weight).
    `decomposition`: a fused op's computation by other ops."""

    def declare(reference: Callable[P, Any]) -> Op[P]:
        made = Op(reference, infer, dtypes, input_dtypes, decomposition)
        if made.name in REGISTRY:
            raise ValueError(f"op {made.name!r} declared twice")
        REGISTRY[made.name] = made
        return made

    return declare


def _on_backend(x, backend: Backend) -> Tensor:
    if isinstance(x, Tensor):
        return x if x.backend is backend else backend.from_numpy(x.numpy())
    return backend.from_numpy(as_supported_array(x))
