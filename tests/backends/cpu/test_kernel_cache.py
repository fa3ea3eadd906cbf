"""The CPU kernels' disk cache (pxvm.backends.cpu.kernel_cache): a damaged cache file
(which made numba raise, or LLVM abort, or the process crash, on every later run) is
noticed, named once on stderr, and rebuilt; the rebuilt cache then loads silently.

Each run is a fresh process with its own NUMBA_CACHE_DIR, as a user's next command is."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from gguf import quants
from gguf.constants import GGMLQuantizationType

# A Q8_0 product on the CPU backend: its kernels come from numba's cache when there is one.
PRODUCT = """
import sys
import numpy as np
import pxvm
x, w = np.load(sys.argv[1]), np.load(sys.argv[2])
np.save(sys.argv[3], np.asarray(pxvm.ops.matmul_quant(x, w, qtype="Q8_0", k=x.shape[1],
                                                      backend="cpu")))
"""


@pytest.fixture(scope="module")
def operands(tmp_path_factory):
    rng = np.random.default_rng(7)
    x = rng.standard_normal((1, 256)).astype(np.float32)
    w = quants.quantize(rng.standard_normal((64, 256)).astype(np.float32),
                        GGMLQuantizationType.Q8_0)
    folder = tmp_path_factory.mktemp("operands")
    np.save(folder / "x.npy", x)
    np.save(folder / "w.npy", w)
    expected = x @ quants.dequantize(w, GGMLQuantizationType.Q8_0).T
    return folder, expected


def run_product(cache_dir: Path, operands) -> subprocess.CompletedProcess:
    folder, _ = operands
    env = {**os.environ, "NUMBA_CACHE_DIR": str(cache_dir)}
    out = subprocess.run([sys.executable, "-c", PRODUCT, str(folder / "x.npy"),
                          str(folder / "w.npy"), str(cache_dir / "y.npy")],
                         capture_output=True, text=True, env=env, timeout=600)
    return out


def assert_right_product(cache_dir: Path, operands, out: subprocess.CompletedProcess):
    assert out.returncode == 0, out.stderr
    np.testing.assert_allclose(np.load(cache_dir / "y.npy"), operands[1], rtol=1e-3,
                               atol=1e-2)


@pytest.fixture(scope="module")
def warm_cache(tmp_path_factory, operands):
    """A cache directory filled by a first run."""
    cache_dir = tmp_path_factory.mktemp("warm")
    out = run_product(cache_dir, operands)
    assert_right_product(cache_dir, operands, out)
    assert list(cache_dir.rglob("*.nbc")) and list(cache_dir.rglob("*.nbi"))
    return cache_dir


def cache_files(cache_dir: Path) -> dict[Path, tuple[int, int]]:
    """Numba's cache files and pxvm's checksums, with their sizes and times written."""
    return {path: (path.stat().st_size, path.stat().st_mtime_ns)
            for path in cache_dir.rglob("*.nb*")}


def truncate_data(cache_dir: Path):
    for path in cache_dir.rglob("*.nbc"):
        path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def garble_index(cache_dir: Path):
    for path in cache_dir.rglob("*.nbi"):
        path.write_bytes(bytes(range(256)) * (path.stat().st_size // 256 + 1))


def zero_machine_code(cache_dir: Path):
    """Zeros inside the object code (numba crashed running it, or LLVM aborted)."""
    for path in cache_dir.rglob("*.nbc"):
        data = bytearray(path.read_bytes())
        start = max(data.find(b"\x7fELF"), 0) + 1000
        data[start:start + 4096] = bytes(len(data[start:start + 4096]))
        path.write_bytes(bytes(data))


def drop_checksums(cache_dir: Path):
    """As numba leaves a cache it wrote without pxvm (or an older pxvm did)."""
    for path in cache_dir.rglob("*.nbc.sha256"):
        path.unlink()


@pytest.mark.parametrize("damage", [truncate_data, garble_index, zero_machine_code,
                                    drop_checksums])
def test_damaged_kernel_cache_is_rebuilt_once_with_a_notice(damage, warm_cache, operands,
                                                            tmp_path):
    cache_dir = tmp_path / "cache"
    shutil.copytree(warm_cache, cache_dir)
    (cache_dir / "y.npy").unlink()
    damage(cache_dir)

    rebuilt = run_product(cache_dir, operands)
    assert_right_product(cache_dir, operands, rebuilt)
    notices = [line for line in rebuilt.stderr.splitlines() if line.startswith("pxvm:")]
    assert len(notices) == 1, rebuilt.stderr
    assert "rebuilding the CPU kernels' cache" in notices[0]
    assert str(next(cache_dir.rglob("*.nbi")).parent) in notices[0]

    (cache_dir / "y.npy").unlink()
    written = cache_files(cache_dir)
    again = run_product(cache_dir, operands)
    assert_right_product(cache_dir, operands, again)
    assert "pxvm:" not in again.stderr
    assert cache_files(cache_dir) == written  # loaded, not compiled and written again


def test_a_good_kernel_cache_loads_silently(warm_cache, operands, tmp_path):
    cache_dir = tmp_path / "cache"
    shutil.copytree(warm_cache, cache_dir)
    written = cache_files(cache_dir)
    out = run_product(cache_dir, operands)
    assert_right_product(cache_dir, operands, out)
    assert "pxvm:" not in out.stderr
    assert cache_files(cache_dir) == written
