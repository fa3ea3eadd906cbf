"""`pxvm models`: what a GGUF file holds and whether pxvm runs it, read from its header;
files that are no GGUF get one clear line and exit code 1, the others are still shown."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "llm"))
from make_tiny_gguf import TinySpec, write_tiny_gguf  # noqa: E402


def run_pxvm(*args):
    return subprocess.run([sys.executable, "-m", "pxvm", *args], capture_output=True,
                          text=True, timeout=120)


def test_models_describes_files_and_says_which_pxvm_runs(tmp_path, rng):
    llama = tmp_path / "llama.gguf"
    stored = write_tiny_gguf(llama, TinySpec(dim=256, ffn_dim=256, matrix_type="Q4_K",
                                             matrix_types={"attn_v": "Q6_K"},
                                             context_length=77), rng)
    gemma = tmp_path / "gemma.gguf"
    write_tiny_gguf(gemma, TinySpec(arch="gemma3", n_layers=3), rng)
    mamba = tmp_path / "mamba.gguf"
    write_tiny_gguf(mamba, TinySpec(arch="mamba"), rng)
    proc = run_pxvm("models", "--json", str(llama), str(mamba), str(gemma))
    assert proc.returncode == 0, proc.stderr
    first, second, third = json.loads(proc.stdout)
    assert first["architecture"] == "llama" and first["runs"] and first["reason"] is None
    assert (first["context_length"], first["layers"]) == (77, 2)
    assert first["tensor_types"] == {"Q8_0": 1, "F32": 5, "Q4_K": 12, "Q6_K": 2}
    assert first["parameters"] == sum(int(np.prod(v.shape)) for v in stored.values())
    assert first["file_bytes"] == llama.stat().st_size
    assert second["architecture"] == "mamba" and not second["runs"]
    assert "architecture 'mamba' is not supported" in second["reason"]
    assert third["architecture"] == "gemma3" and third["runs"] and third["layers"] == 3
    # keys and values of 2 layers x 2 KV heads x head size 64 (256 / 4 heads), all 77
    # positions: bytes by cache type; none for a file pxvm does not run
    assert first["kv_cache_positions"] == 77
    assert first["kv_cache_bytes"] == {"f32": 2 * 2 * 2 * 64 * 77 * 4,
                                       "f16": 2 * 2 * 2 * 64 * 77 * 2}
    assert second["kv_cache_bytes"] is None and second["kv_cache_positions"] is None


def test_models_shows_the_kv_cache_of_a_huge_declared_context_at_the_default(tmp_path, rng):
    # 16 layers of 16 KV heads of 256 declaring 2^20 positions: an 11 MB file whose
    # cache at the default context (8,192 positions) is 4.3 GB in float32
    hostile = tmp_path / "hostile.gguf"
    write_tiny_gguf(hostile, TinySpec(n_layers=16, dim=64, n_heads=16, n_kv_heads=16,
                                      head_dim=256, ffn_dim=64, context_length=1 << 20), rng)
    proc = run_pxvm("models", str(hostile))
    assert proc.returncode == 0, proc.stderr
    text = " ".join(proc.stdout.split())
    f32 = 2 * 16 * 16 * 256 * 8192 * 4
    assert f"{f32 / 2e9:.2f} GB (f16) or {f32 / 1e9:.2f} GB (f32) for 8,192 positions" in text
    assert "1,048,576" in text  # the context it declares


def test_models_in_a_table_and_a_clear_line_for_a_file_that_is_no_gguf(tmp_path, rng):
    good = tmp_path / "tiny.gguf"
    write_tiny_gguf(good, TinySpec(), rng)
    bad = tmp_path / "notes.gguf"
    bad.write_text("hello")
    proc = run_pxvm("models", str(bad), str(good), str(tmp_path / "missing.gguf"))
    assert proc.returncode == 1
    assert "tiny.gguf" in proc.stdout and "yes" in proc.stdout and "Q4_1 x14" in proc.stdout
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 2 and "Traceback" not in proc.stderr
    assert "is not a GGUF file" in lines[0] and "missing.gguf" in lines[1]
