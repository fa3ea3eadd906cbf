"""Writes tiny random-weight GGUF files with gguf.GGUFWriter, for model tests on every
tensor type and family (the tensors and metadata keys each architecture's files carry,
as llama.cpp's converter writes them); also returns the float weights actually stored
(after quantization), so tests can run an independent float64 forward pass on them."""

from __future__ import annotations

from dataclasses import dataclass

import gguf
import numpy as np

from gguf_blocks import dequantize, quantize, random_blocks


@dataclass
class TinySpec:
    n_layers: int = 2
    dim: int = 64
    n_heads: int = 4
    n_kv_heads: int = 2
    ffn_dim: int = 96
    vocab_size: int = 101
    context_length: int = 24
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    tied_output: bool = True
    matrix_type: str = "Q4_1"       # type of the attention / FFN matrices
    embedding_type: str = "Q8_0"    # type of token_embd (and output.weight when untied)
    arch: str = "llama"
    rope_scaling: str | None = None  # written as {arch}.rope.scaling.type when set
    #: per-matrix type overrides, e.g. {"attn_v": "Q6_K"} as in Q4_K_M files
    matrix_types: dict | None = None
    name: str = "tiny"                 # general.name (HF reads Mistral from it)
    head_dim: int | None = None        # written as attention.key_length / value_length
    #: further metadata, keys without the "{arch}." prefix, e.g. {"attention.sliding_window": 8}
    extra: dict | None = None
    #: extra F32 tensors, e.g. {"rope_freqs.weight": factors}
    extra_tensors: dict | None = None
    #: the vocabulary (vocab_size tokens; default "t0", "t1", .., which spell no text)
    tokens: list | None = None
    #: further string metadata under its full key, e.g. {"tokenizer.chat_template": ...}
    strings: dict | None = None
    #: a whole tokenizer, under full keys ("tokenizer.ggml.model", "tokenizer.ggml.tokens",
    #: ...), written in place of `tokens` and the "llama" model (vocab_size tokens)
    tokenizer: dict | None = None


# The tensors each architecture's layers carry besides attn_norm, attn_output, ffn_norm
# and ffn_down (gguf's MODEL_TENSORS; llama.cpp's converter)
_SEPARATE_QKV = ("attn_q", "attn_k", "attn_v")
_LAYER_TENSORS = {
    "llama": {"qkv": _SEPARATE_QKV, "gate": True},
    "qwen2": {"qkv": _SEPARATE_QKV, "gate": True, "bias": True},
    "qwen3": {"qkv": _SEPARATE_QKV, "gate": True, "qk_norm": True},
    "gemma2": {"qkv": _SEPARATE_QKV, "gate": True, "post_norms": True},
    "gemma3": {"qkv": _SEPARATE_QKV, "gate": True, "post_norms": True, "qk_norm": True},
    "phi3": {"qkv": ("attn_qkv",), "gate": False},
}


def write_tiny_gguf(path, spec: TinySpec, rng: np.random.Generator) -> dict:
    """Write the file; returns {tensor name: float32 array as stored}, 2-D ones as (N, K)."""
    head_dim = spec.head_dim or spec.dim // spec.n_heads
    layout = _LAYER_TENSORS.get(spec.arch, _LAYER_TENSORS["llama"])
    w = gguf.GGUFWriter(str(path), spec.arch)
    w.add_name(spec.name)
    if spec.head_dim:
        w.add_key_length(spec.head_dim)
        w.add_value_length(spec.head_dim)
    for key, value in (spec.extra or {}).items():
        key = f"{spec.arch}.{key}"
        if isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, list):
            w.add_array(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value) if value >= 0 else w.add_int32(key, value)
        elif isinstance(value, float):
            w.add_float32(key, value)
        else:
            w.add_string(key, value)
    w.add_block_count(spec.n_layers)
    w.add_embedding_length(spec.dim)
    w.add_feed_forward_length(spec.ffn_dim)
    w.add_head_count(spec.n_heads)
    w.add_head_count_kv(spec.n_kv_heads)
    w.add_context_length(spec.context_length)
    w.add_rope_freq_base(spec.rope_theta)
    w.add_layer_norm_rms_eps(spec.norm_eps)
    w.add_vocab_size(spec.vocab_size)
    if spec.rope_scaling is not None:
        w.add_string(f"{spec.arch}.rope.scaling.type", spec.rope_scaling)
    if spec.tokenizer is None:
        w.add_string("tokenizer.ggml.model", "llama")
        w.add_array("tokenizer.ggml.tokens", spec.tokens or [f"t{i}" for i in range(spec.vocab_size)])
    else:
        _add_fields(w, spec.tokenizer)
    for key, text in (spec.strings or {}).items():
        w.add_string(key, text)

    stored = {}

    def matrix(name, n, k, type_name, scale):
        short = name.split(".")[-2]
        qtype = (spec.matrix_types or {}).get(short, type_name)
        if qtype.endswith("_K"):  # no quantizer here: random valid blocks
            raw = random_blocks(n, k, qtype, rng, scale)
        else:
            raw = quantize(rng.standard_normal((n, k)).astype(np.float32) * scale, qtype)
        w.add_tensor(name, raw, raw_dtype=gguf.GGMLQuantizationType[qtype])
        stored[name] = dequantize(raw, qtype, k)

    def norm(name, k, spread=0.2):
        # near 1 so activations keep their size through many layers, but not all equal
        values = (1.0 + spread * rng.standard_normal(k)).astype(np.float32)
        w.add_tensor(name, values)
        stored[name] = values

    d, q, kv = spec.dim, spec.n_heads * head_dim, spec.n_kv_heads * head_dim
    matrix("token_embd.weight", spec.vocab_size, d, spec.embedding_type, 1.0)
    for name, values in (spec.extra_tensors or {}).items():
        w.add_tensor(name, np.asarray(values, np.float32))
    for i in range(spec.n_layers):
        p = f"blk.{i}."
        norm(p + "attn_norm.weight", d)
        if layout["qkv"] == _SEPARATE_QKV:
            for part, rows in zip(_SEPARATE_QKV, (q, kv, kv)):
                matrix(p + part + ".weight", rows, d, spec.matrix_type, d ** -0.5)
                if layout.get("bias"):
                    norm(p + part + ".bias", rows, spread=0.5)
        else:
            matrix(p + "attn_qkv.weight", q + 2 * kv, d, spec.matrix_type, d ** -0.5)
        if layout.get("qk_norm"):
            norm(p + "attn_q_norm.weight", head_dim)
            norm(p + "attn_k_norm.weight", head_dim)
        matrix(p + "attn_output.weight", d, q, spec.matrix_type, q ** -0.5)
        if layout.get("post_norms"):
            norm(p + "post_attention_norm.weight", d)
        norm(p + "ffn_norm.weight", d)
        if layout["gate"]:
            matrix(p + "ffn_gate.weight", spec.ffn_dim, d, spec.matrix_type, d ** -0.5)
            matrix(p + "ffn_up.weight", spec.ffn_dim, d, spec.matrix_type, d ** -0.5)
        else:  # the gate's rows, then the up projection's
            matrix(p + "ffn_up.weight", 2 * spec.ffn_dim, d, spec.matrix_type, d ** -0.5)
        matrix(p + "ffn_down.weight", d, spec.ffn_dim, spec.matrix_type, spec.ffn_dim ** -0.5)
        if layout.get("post_norms"):
            norm(p + "post_ffw_norm.weight", d)
    norm("output_norm.weight", d)
    if not spec.tied_output:
        matrix("output.weight", spec.vocab_size, d, spec.embedding_type, d ** -0.5)

    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return stored


def write_metadata_gguf(path, arch: str, meta: dict) -> None:
    """A GGUF file with metadata only (no tensors), e.g. a tokenizer's: token lists,
    scores, types and merges through gguf's own writers, other values by their type."""
    w = gguf.GGUFWriter(str(path), arch)
    _add_fields(w, meta)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def _add_fields(w: gguf.GGUFWriter, meta: dict) -> None:
    """Token lists, scores, types and merges through gguf's own writers, other values by
    their type."""
    writers = {"tokenizer.ggml.tokens": w.add_token_list,
               "tokenizer.ggml.scores": w.add_token_scores,
               "tokenizer.ggml.token_type": w.add_token_types,
               "tokenizer.ggml.merges": w.add_token_merges}
    for key, value in meta.items():
        if key in writers:
            writers[key](value)
        elif isinstance(value, bool):
            w.add_bool(key, value)
        elif isinstance(value, int):
            w.add_uint32(key, value)
        else:
            w.add_string(key, value)
