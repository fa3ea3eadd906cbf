"""The op registry: an `Op` pairs one numpy reference with one GPU implementation.

Calling an op (`pxvm.ops.relu(x, backend="auto")`) resolves the backend, moves numpy
inputs onto it, checks shapes once for both backends (`infer`) and runs it.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..runtime.errors import ShapeError
from ..tensor import DTYPES, Tensor, as_supported_array

REGISTRY: dict[str, "Op"] = {}


@dataclass(frozen=True)
class Meta:
    """Shape and dtype of an op's result."""

    shape: tuple
    dtype: np.dtype


def meta(shape, dtype) -> Meta:
    return Meta(tuple(int(s) for s in shape), np.dtype(dtype))


class Op:
    """One op: `reference(*arrays, **params)` in numpy, `gpu(ctx, *tensors, **params)` in
    WGSL, and `infer(inputs, params) -> Meta`, which raises ShapeError on bad operands.

    `dtypes` are the dtypes every input may have; `input_dtypes`, when given, says it
    per input instead (a name, or a tuple of names, for each), for ops whose inputs have
    different roles (a float activation and a raw uint8 weight)."""

    def __init__(self, name: str, n_inputs: int, reference: Callable, gpu: Callable,
                 infer: Callable, dtypes: tuple = ("f32",), input_dtypes: tuple | None = None):
        self.name = name
        self.n_inputs = n_inputs
        self.reference = reference
        self.gpu = gpu
        self._infer = infer
        if input_dtypes is None:
            input_dtypes = (dtypes,) * n_inputs
        if len(input_dtypes) != n_inputs:
            raise ValueError(f"op {name!r}: input_dtypes names {len(input_dtypes)} inputs, "
                             f"it has {n_inputs}")
        self.input_dtypes = tuple(
            tuple(DTYPES[d] for d in ((allowed,) if isinstance(allowed, str) else allowed))
            for allowed in input_dtypes)
        self.signature = inspect.signature(reference)
        self.__doc__ = reference.__doc__
        self.__name__ = name

    def infer(self, inputs, params) -> Meta:
        names = list(self.signature.parameters)
        for i, (x, allowed) in enumerate(zip(inputs, self.input_dtypes)):
            if np.dtype(x.dtype) not in allowed:
                raise ShapeError(
                    f"{self.name}: input {i} ({names[i]}) has dtype {np.dtype(x.dtype)}, "
                    f"expected {' or '.join(str(d) for d in allowed)}"
                )
        return self._infer(*inputs, **params)

    def bind(self, args, kwargs):
        """Split a call's arguments into the tensor inputs and the keyword parameters."""
        try:
            bound = self.signature.bind(*args, **kwargs)
        except TypeError as exc:
            raise TypeError(f"{self.name}{self.signature}: {exc}") from None
        bound.apply_defaults()
        values = list(bound.arguments.values())
        names = list(bound.arguments)
        inputs = values[: self.n_inputs]
        params = dict(zip(names[self.n_inputs:], values[self.n_inputs:]))
        return inputs, params

    def __call__(self, *args, backend="auto", **kwargs) -> Tensor:
        inputs, params = self.bind(args, kwargs)
        target = resolve_backend(inputs, backend)
        tensors = [to_backend(x, target) for x in inputs]
        return target.run(self, tensors, params)

    def __repr__(self) -> str:
        return f"<pxvm op {self.name}{self.signature}>"


def resolve_backend(inputs, backend):
    """'auto' follows the inputs: a tensor already on a backend keeps the op there."""
    from ..backends import get_backend

    if isinstance(backend, str) and backend == "auto":
        for x in inputs:
            if isinstance(x, Tensor):
                return x.backend
    return get_backend(backend)


def to_backend(x, backend) -> Tensor:
    if isinstance(x, Tensor):
        return x if x.backend is backend else backend.from_numpy(x.numpy())
    return backend.from_numpy(as_supported_array(x))


def register(name: str, n_inputs: int, reference: Callable, gpu: Callable, infer: Callable,
             dtypes: tuple = ("f32",), input_dtypes: tuple | None = None) -> Op:
    if name in REGISTRY:
        raise ValueError(f"op {name!r} registered twice")
    op = Op(name, n_inputs, reference, gpu, infer, dtypes, input_dtypes)
    REGISTRY[name] = op
    return op


def require(cond: bool, message: str) -> None:
    """Raise ShapeError(message) unless cond: the one way ops reject bad operands."""
    if not cond:
        raise ShapeError(message)
