"""`pxvm info` lists adapters, says what auto picks and what the CPU backend runs on;
errors exit non-zero."""

import json
import os
import subprocess
import sys

import pytest


def run_pxvm(*args, env=None):
    return subprocess.run([sys.executable, "-m", "pxvm", *args], capture_output=True, text=True,
                          timeout=120, env=env)


def test_info_lists_every_adapter_and_the_auto_choice(gpu_device):
    proc = run_pxvm("info", "--json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["adapters"], "no adapters listed"
    for a in data["adapters"]:
        assert {"name", "backend", "type", "features", "limits"} <= a.keys()
        assert "max-storage-buffer-binding-size" in a["limits"]
    if all(a["software"] for a in data["adapters"]):
        assert data["auto"] is None and "only software adapters" in data["reason"]
    else:
        assert not data["adapters"][data["auto"]]["software"]


def test_help_explains_the_subcommands():
    proc = run_pxvm("--help")
    assert proc.returncode == 0 and "info" in proc.stdout


@pytest.mark.parametrize("name", ["numpy", "cpu"])
def test_demo_runs_matmul_and_the_dot_program_on_the_cpu_backends(name):
    proc = run_pxvm("demo", "--backend", name, "--size", "64")
    assert proc.returncode == 0, proc.stderr
    assert f"backend: {name}" in proc.stdout and "pixel (0,3) = 300 (expected 300)" in proc.stdout


def test_info_says_what_the_cpu_backend_runs_on():
    proc = run_pxvm("info", "--json")
    assert proc.returncode == 0, proc.stderr
    cpu = json.loads(proc.stdout)["cpu"]
    assert cpu["threads"] >= 1 and cpu["numba"] and cpu["thread_pool"] in ("tbb", "omp",
                                                                          "workqueue")
    proc = run_pxvm("info", env={**os.environ, "PXVM_CPU_THREADS": "1"})
    assert proc.returncode == 0 and "CPU backend" in proc.stdout


@pytest.mark.parametrize("name", ["webgpu", "gpu"])
def test_demo_runs_on_the_gpu(gpu_device, name):
    proc = run_pxvm("demo", "--backend", name, "--size", "64")
    assert proc.returncode == 0, proc.stderr
    assert "backend: webgpu" in proc.stdout and "= 300 (expected 300)" in proc.stdout


def test_demo_refuses_a_matrix_size_past_8192():
    proc = subprocess.run([sys.executable, "-m", "pxvm", "demo", "--size", "1000000"],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "--size" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.parametrize("value", ["0", "two", "-1"])
def test_a_bad_thread_count_is_one_clear_line(value):
    proc = run_pxvm("info", env={**os.environ, "PXVM_CPU_THREADS": value})
    assert proc.returncode == 1
    assert "PXVM_CPU_THREADS must be a positive integer" in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stderr.strip().count("\n") == 0


def test_tune_refuses_a_tuning_folder_it_cannot_create_before_measuring(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    env = {**os.environ, "PXVM_CACHE_DIR": str(blocker / "cache")}
    proc = run_pxvm("tune", "--quick", env=env)
    assert proc.returncode == 1 and "cannot create" in proc.stderr, proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "saved" not in proc.stdout
