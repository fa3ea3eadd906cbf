"""A model's weights on the backend: each matrix as raw GGUF rows, in row parts where
the backend takes less than all of it in one tensor (WebGPU binds at most the device's
max_storage_buffer_binding_size, 128 MiB in browsers; a 70B model's [Wgate; Wup] is
264 MB), and the check that a model fits the device's memory before any of it loads.

A product over row parts is each part's product, their output columns joined
(Model.normed_product): a part's rows are output columns first_row.. of the whole.
"""

from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np

from ..core import Backend, DeviceMemory, Tensor
from ..core.errors import OutOfDeviceMemoryError, PxvmError
from .gguf_model import GGUFModelFile, Weight, expected_shapes


class WeightRowTooLargeError(PxvmError):
    """One row of a weight matrix (two for a GLU part) is larger than the largest tensor
    the backend takes, so no split into row parts makes it fit."""


class ModelDoesNotFitError(PxvmError):
    """The model's weights and KV cache need more memory than the device has."""


#: The share of a device's free memory (the host's: MemAvailable) a model's weights and
#: KV cache may take: the rest is left to a run's activations, the backend's rounding of
#: buffer sizes and the other programs.
MEMORY_SHARE = 0.9
#: What to do when a model does not fit (ModelDoesNotFitError's messages end with it).
FIT_ADVICE = ("ask for a smaller context (--context), use a smaller quantization of the "
              "model, or run it on another backend (--backend)")


@dataclass
class WeightMatrix:
    """A weight matrix, or a row part of one, on the backend as raw GGUF rows: (N,
    row_bytes) uint8 of GGML type `qtype` ("Q4_K"), rows of `k` values."""

    tensor: Tensor
    qtype: str
    k: int
    #: the part's first row in the whole matrix: its first output column (a GLU part's
    #: first gate row and first up row, and its first GLU output column)
    first_row: int = 0


def _rows(weights: list[Weight]) -> np.ndarray:
    """The weights' raw rows stacked (all of one type and row length)."""
    rows = [np.ascontiguousarray(w.data).view(np.uint8).reshape(w.shape[0], -1)
            for w in weights]
    return rows[0] if len(rows) == 1 else np.concatenate(rows)


def _rows_per_part(backend: Backend, weights: list[Weight], rows: np.ndarray,
                   glu: bool = False) -> int:
    """Rows a part of `rows` holds: all of them, or as many as fit the backend's largest
    tensor. A GLU part holds a gate row and an up row per output column: then the
    count is of those pairs (at most F, half the rows)."""
    limit, row_bytes = backend.max_tensor_bytes, rows.shape[1] * (2 if glu else 1)
    steps = rows.shape[0] // 2 if glu else rows.shape[0]
    if limit is None or limit >= steps * row_bytes:
        return steps
    if limit < row_bytes:
        what = "a gate row and an up row" if glu else "one row"
        raise WeightRowTooLargeError(
            f"{' and '.join(w.name for w in weights)}: {what} of {weights[0].shape[1]:,} "
            f"{weights[0].qtype} values take {row_bytes:,} bytes, more than the largest "
            f"tensor {backend.describe()} takes ({limit:,} bytes), so no split into row "
            "parts fits; run the model on another backend (--backend)")
    return limit // row_bytes


def row_parts(backend: Backend, weights: list[Weight]) -> list[WeightMatrix]:
    """The weights' rows stacked as one matrix (all of one type and row length), or as
    row parts where the backend takes less than all of it in one tensor."""
    rows = _rows(weights)
    per_part = _rows_per_part(backend, weights, rows)
    qtype, k = weights[0].qtype, weights[0].shape[1]
    return [WeightMatrix(backend.from_numpy(rows[first:first + per_part]), qtype, k, first)
            for first in range(0, rows.shape[0], per_part)]


def joined_parts(backend: Backend, weights: list[Weight]) -> list[WeightMatrix]:
    """Consecutive weights of one tensor type joined into one matrix, so that one
    product computes them all (files that mix types per layer get several), each in
    row parts where needed; first_row counts the rows of all."""
    runs: list[list[Weight]] = []
    for w in weights:
        if runs and runs[-1][0].qtype == w.qtype:
            runs[-1].append(w)
        else:
            runs.append([w])
    parts, offset = [], 0
    for run in runs:
        for part in row_parts(backend, run):
            part.first_row += offset
            parts.append(part)
        offset += sum(w.shape[0] for w in run)
    return parts


def glu_parts(backend: Backend, weights: list[Weight]) -> list[WeightMatrix]:
    """[Wgate; Wup] (the two tensors of F rows, or one of 2F: Phi-3's) as matrices for
    rmsnorm_glu_quant: the whole, or row parts of the gate's rows a..b then the up
    projection's rows a..b, whose GLU outputs are columns a..b."""
    rows = _rows(weights)
    f = rows.shape[0] // 2
    per_part = _rows_per_part(backend, weights, rows, glu=True)
    qtype, k = weights[0].qtype, weights[0].shape[1]
    if per_part >= f:
        return [WeightMatrix(backend.from_numpy(rows), qtype, k)]
    parts = []
    for a in range(0, f, per_part):
        b = min(a + per_part, f)
        both = np.concatenate([rows[a:b], rows[f + a:f + b]])
        parts.append(WeightMatrix(backend.from_numpy(both), qtype, k, a))
    return parts


def feed_forward_parts(backend: Backend, gate_up: list[Weight]
                       ) -> tuple[list[WeightMatrix], list[WeightMatrix], list[WeightMatrix]]:
    """(GLU parts, [], []) of [Wgate; Wup] where its weights are of one type, else ([],
    Wgate's parts, Wup's parts): Q4_K_M files mix types, and one product takes one type."""
    if len({w.qtype for w in gate_up}) == 1:
        return glu_parts(backend, gate_up), [], []
    gate, up = gate_up
    return [], row_parts(backend, [gate]), row_parts(backend, [up])


# ---- memory ------------------------------------------------------------------------------
def uploaded_weight_bytes(file: GGUFModelFile) -> int:
    """The bytes a model's weights take on the backend: its matrices as their raw GGUF
    rows, its vectors (norm gains, biases) as float32."""
    return sum(file.tensors[name].n_bytes if len(shape) == 2 else 4 * shape[0]
               for name, shape in expected_shapes(file.config).items())


def byte_size(nbytes: int) -> str:
    """`nbytes` for people: in GB, MB or bytes."""
    if nbytes >= 10**9:
        return f"{nbytes / 1e9:.2f} GB"
    return f"{nbytes / 1e6:.1f} MB" if nbytes >= 10**6 else f"{nbytes:,} bytes"


def memory_bound(memory: DeviceMemory) -> int:
    """The bytes a model may take of a device with `memory`: MEMORY_SHARE of its free."""
    return int(memory.free * MEMORY_SHARE)


@dataclass(frozen=True)
class Footprint:
    """The device memory a model takes: its weights as uploaded and its KV cache of
    `positions` positions (not a run's activations, nor the backend's rounding of
    buffer sizes: the check bounds what loading takes, not what a prompt adds)."""

    weights: int
    kv_cache: int
    positions: int

    @property
    def total(self) -> int:
        return self.weights + self.kv_cache

    def __str__(self) -> str:
        return (f"its weights take {byte_size(self.weights)} and its KV cache "
                f"{byte_size(self.kv_cache)} for {self.positions:,} positions")

    def check(self, backend: Backend) -> None:
        """ModelDoesNotFitError when the backend can tell its free memory and the model
        needs more than MEMORY_SHARE of it; nothing where it cannot tell (WebGPU): the
        upload's own out-of-memory is then the error (`uploading`)."""
        memory = backend.memory_bytes()
        if memory is None or self.total <= memory_bound(memory):
            return
        room = memory_bound(memory) - self.weights
        fit = (f" (beside the weights, a KV cache of about "
               f"{room * self.positions // self.kv_cache:,} positions fits)"
               if room > 0 and self.kv_cache else "")
        raise ModelDoesNotFitError(
            f"the model does not fit on {backend.describe()}: {self}, {byte_size(self.total)} "
            f"in all, and a model may take {MEMORY_SHARE:.0%} of the {byte_size(memory.free)} "
            f"free (of {byte_size(memory.total)}): {byte_size(memory_bound(memory))}{fit}; "
            f"{FIT_ADVICE}")

    @contextmanager
    def uploading(self, backend: Backend):
        """A context in which the backend running out of memory (WebGPU's buffer
        creation, CUDA's cuMemAlloc, the host's) is a ModelDoesNotFitError."""
        try:
            yield
        except (OutOfDeviceMemoryError, MemoryError) as exc:
            raise ModelDoesNotFitError(
                f"{backend.describe()} ran out of memory loading the model: {self}, "
                f"{byte_size(self.total)} in all; {FIT_ADVICE}") from exc
