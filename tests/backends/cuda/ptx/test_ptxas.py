"""Every PTX kernel pxvm can emit, each variant, assembled by NVIDIA's ptxas for sm_80
and sm_90, so that malformed PTX fails here, without a GPU. ptxas comes with the
`nvidia-cuda-nvcc` wheel (a test dependency on Linux x86_64)."""

from __future__ import annotations

import functools
import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pxvm.backends.cuda import ptx

PXVM = [sys.executable, "-m", "pxvm"]  # the command, installed or not (PYTHONPATH=src)


def _ptxas() -> str:
    spec = importlib.util.find_spec("nvidia")
    for root in (spec.submodule_search_locations if spec else []):
        for found in sorted(Path(root).glob("*/bin/ptxas")):
            return str(found)
    pytest.skip("ptxas is not installed (pip install nvidia-cuda-nvcc)")


@functools.cache
def _built() -> list:
    """Every kernel built, once for both architectures' runs (seconds)."""
    return [builder(*args) for builder, args in ptx.kernels().values()]


@pytest.mark.parametrize("arch", ptx.ARCHS)
def test_every_kernel_assembles_with_ptxas(arch, tmp_path):
    # every kernel that runs there (those of an architecture's own features, sm_90a's
    # wgmma, make it that target) in a module for each core, assembled side by side
    names = list(ptx.kernels())
    built = _built()
    here = [k for k in built if k.arch is None or k.arch.rstrip("a") == arch]
    parts = max(1, min(4, os.cpu_count() or 1))
    runs = []
    for i in range(parts):
        text = ptx.module(here[i::parts], arch)
        target = re.search(r"^\.target (\S+)$", text, re.M).group(1)
        source = tmp_path / f"part{i}_{arch}.ptx"
        source.write_text(text)
        # -O0: malformed PTX fails as at -O3 (the front end checks it), in half the time
        runs.append(subprocess.Popen([_ptxas(), f"-arch={target}", "-O0", "-o", os.devnull,
                                      str(source)], stderr=subprocess.PIPE, text=True))
    for run in runs:
        _, errors = run.communicate(timeout=300)
        assert run.returncode == 0, errors[:4000]
    assert len(names) == len(set(names)) >= 97  # every family's variants, each named once
    assert arch == "sm_80" or len(here) == len(built)  # sm_90 assembles every kernel


def test_a_hopper_kernel_is_refused_for_another_architecture():
    with pytest.raises(ptx.PtxError, match="sm_90a only, not sm_80"):
        ptx.ptx("matmul_f16_wgmma_128x4x0", "sm_80")
    assert ".target sm_90a" in ptx.ptx("matmul_f16_wgmma_128x4x0", "sm_90")


def test_pxvm_ptx_lists_every_kernel_and_prints_one():
    run = subprocess.run([*PXVM, "ptx", "--list"], capture_output=True, text=True, timeout=60)
    assert run.returncode == 0 and run.stdout.split() == list(ptx.kernels())
    one = subprocess.run([*PXVM, "ptx", "softmax_v4", "--arch", "sm_80"], capture_output=True,
                         text=True, timeout=60)
    assert one.returncode == 0 and ".target sm_80" in one.stdout
    assert ".visible .entry softmax_v4(" in one.stdout
    bad = subprocess.run([*PXVM, "ptx", "nope"], capture_output=True, text=True, timeout=60)
    assert bad.returncode == 1 and "pxvm ptx --list" in bad.stderr
