"""Unusable model files and inputs give one clear one-line error each."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from make_tiny_gguf import TinySpec, write_tiny_gguf

from pxvm.llm import ModelFileError, load_model
from pxvm.runtime.errors import BindingTooLargeError, PxvmError


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


def test_unsupported_tensor_type(tiny_file, tmp_path, rng):
    # rewrite the file with one matrix in Q5_0 (22-byte blocks), which pxvm does not read
    reader = gguf.GGUFReader(str(tiny_file))
    path = tmp_path / "q5.gguf"
    w = gguf.GGUFWriter(str(path), "llama")
    for name, field in reader.fields.items():
        if name.startswith("llama.") and len(field.types) == 1:
            w.add_key_value(name, field.contents(), field.types[0])
    for t in reader.tensors:
        if t.name == "blk.1.ffn_up.weight":
            n, k = int(t.shape[1]), int(t.shape[0])
            raw = rng.integers(0, 256, size=(n, k // 32 * 22), dtype=np.uint8)
            w.add_tensor(t.name, raw, raw_dtype=gguf.GGMLQuantizationType.Q5_0)
        else:
            w.add_tensor(t.name, np.asarray(t.data), raw_dtype=t.tensor_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(ModelFileError) as info:
        load_model(str(path), backend="numpy", progress=False)
    _one_line_error(info, "blk.1.ffn_up.weight", "Q5_0", "Q4_1")


def test_weight_over_binding_limit(tiny_file, gpu_device, monkeypatch):
    # token_embd of the tiny file is 101 rows of 68 bytes: a 4 KiB limit cannot hold it
    monkeypatch.setattr(gpu_device, "max_binding", 4096)
    with pytest.raises(BindingTooLargeError):
        load_model(str(tiny_file), backend="webgpu", progress=False)


def test_bad_token_ids(tiny_file):
    model = load_model(str(tiny_file), backend="numpy", progress=False)
    with pytest.raises(ValueError, match="token ids must be in 0..100"):
        model.forward([5, 101])
    with pytest.raises(ValueError, match="at least one token"):
        model.forward([])
