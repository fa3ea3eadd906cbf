"""The model families pxvm runs, each a description of how its GGUF files map onto the
one transformer of model.py: which tensors a layer has, which activation and RoPE layout,
which layers attend through a sliding window. Numbers (sizes, windows, RoPE bases and
scaling, soft-caps) come from each file's metadata (gguf_model.py); what a family fixes
and its files do not say is here, as llama.cpp's loader fixes it too.

Adding a family is adding an entry to FAMILIES, if its layers are made of the parts below.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable


def _one_over_sqrt_head(dim: int, n_heads: int, head_dim: int, n_layers: int) -> float:
    return 1.0 / math.sqrt(head_dim)


def _gemma_scale(big_model_layers: int):
    """Gemma scales queries by 1/sqrt(query_pre_attn_scalar): the head size, except in its
    27B models (the ones with `big_model_layers` layers), where it is dim / heads. The
    files do not carry the scalar; the layer count tells the models apart, as in
    llama.cpp."""
    def scale(dim: int, n_heads: int, head_dim: int, n_layers: int) -> float:
        return 1.0 / math.sqrt(dim / n_heads if n_layers == big_model_layers else head_dim)
    return scale


@dataclass(frozen=True)
class Family:
    """How the GGUF files of one `general.architecture` map onto model.py's layer."""

    arch: str
    #: "interleaved" rotates pairs (2i, 2i+1) (llama files, whose Q/K rows the converter
    #: permuted for it), "neox" rotates (i, i + D/2).
    rope_style: str = "neox"
    #: the gated feed-forward's activation: "silu" (SwiGLU) or "gelu_tanh" (GeGLU)
    activation: str = "silu"
    #: attn_q / attn_k / attn_v have biases (attn_q.bias, ..)
    qkv_bias: bool = False
    #: each query and key head is RMS-normalised (attn_q_norm, attn_k_norm) before RoPE
    qk_norm: bool = False
    #: the attention and feed-forward outputs are RMS-normalised (post_attention_norm,
    #: post_ffw_norm) before their residual adds
    post_norms: bool = False
    #: one attn_qkv matrix instead of attn_q, attn_k, attn_v
    fused_qkv: bool = False
    #: ffn_up holds the gate's rows, then the up projection's; there is no ffn_gate
    fused_gate_up: bool = False
    #: the token embeddings are multiplied by sqrt(dim)
    embedding_scaled: bool = False
    #: which layers attend through the sliding window (`{arch}.attention.sliding_window`)
    #: when the file gives one: layer index -> local?; None: every layer
    local_layers: Callable[[int], bool] | None = None
    #: the local layers' RoPE base when the file gives none (`rope.freq_base_swa`); their
    #: RoPE is never scaled. None: the global base.
    local_rope_base: float | None = None
    #: the attention's score scale from (dim, heads, head size, layers)
    attention_scale: Callable[[int, int, int, int], float] = _one_over_sqrt_head


FAMILIES: dict[str, Family] = {f.arch: f for f in (
    # Llama 2 and 3.x, Mistral, SmolLM, TinyLlama (Llama 3's RoPE scaling comes as the
    # rope_freqs tensor; Mistral's window, where a file has one, as the metadata's)
    Family("llama", rope_style="interleaved"),
    Family("qwen2", qkv_bias=True),
    Family("qwen3", qk_norm=True),
    # Gemma 2: local (sliding-window) and global layers alternate, the first local
    Family("gemma2", activation="gelu_tanh", post_norms=True, embedding_scaled=True,
           local_layers=lambda i: i % 2 == 0, attention_scale=_gemma_scale(46)),
    # Gemma 3: five local layers to one global; local layers keep RoPE base 10,000
    Family("gemma3", activation="gelu_tanh", post_norms=True, qk_norm=True,
           embedding_scaled=True, local_layers=lambda i: (i + 1) % 6 != 0,
           local_rope_base=10000.0, attention_scale=_gemma_scale(62)),
    # Phi-3 and 3.5: LongRoPE's factors come as the rope_factors_short/long tensors
    Family("phi3", fused_qkv=True, fused_gate_up=True),
)}
