"""`pxvm bench ops`: the table, JSON and plot on the CPU backends and WebGPU (lavapipe);
a kernel whose results are wrong is marked FAIL and the command exits 1; bad flags are
one clear error."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys

import numpy as np
import pytest
from typer.testing import CliRunner

import pxvm
from pxvm.cli import app
from pxvm.tools import bench_ops

runner = CliRunner()
HAS_TORCH = importlib.util.find_spec("torch") is not None
ENVIRONMENT_KEYS = {"backend", "device", "driver", "torch", "versions", "tuned", "platform",
                    "date"}
VERSION_KEYS = {"pxvm", "numpy", "torch", "wgpu", "cuda-bindings", "python"}
ROW_KEYS = {"case", "op", "shape", "work", "unit", "status", "note", "pxvm_seconds",
            "pxvm_clock", "pxvm_runs", "numpy_seconds", "torch_seconds", "nmse", "nmse_limit",
            "pxvm_per_second", "numpy_per_second", "torch_per_second", "pxvm_vs_numpy",
            "pxvm_vs_torch", "pxvm_percent_of_copy"}


def run_pxvm(*args):
    return subprocess.run([sys.executable, "-m", "pxvm", *args], capture_output=True, text=True,
                          timeout=300)


def bench(tmp_path, *args):
    """`pxvm bench ops ARGS --json --plot` in a new process: (process, JSON, PNG path)."""
    out_json, out_png = tmp_path / "ops.json", tmp_path / "ops.png"
    proc = run_pxvm("bench", "ops", *args, "--json", str(out_json), "--plot", str(out_png))
    data = json.loads(out_json.read_text()) if out_json.exists() else None
    return proc, data, out_png


def check_rows_ran(data, backend: str, cases: list[str]) -> None:
    assert ENVIRONMENT_KEYS <= data["environment"].keys()
    assert VERSION_KEYS <= data["environment"]["versions"].keys()
    assert data["environment"]["backend"] == backend and data["failed"] == 0
    assert data["environment"]["versions"]["numpy"] == np.__version__
    assert sorted({r["case"] for r in data["rows"]}) == sorted(cases)
    for row in data["rows"]:
        assert ROW_KEYS <= row.keys(), row["case"]
        if row["case"] == "attention_f16" and row["status"] == "skipped":
            continue  # the op may not exist in this pxvm yet
        assert row["status"] == "ok", row
        assert row["pxvm_seconds"] > 0 and row["numpy_seconds"] > 0
        assert 0 <= row["nmse"] <= row["nmse_limit"]
        assert row["pxvm_per_second"] == pytest.approx(row["work"] / row["pxvm_seconds"])
    check_percent_of_copy(data)


def check_percent_of_copy(data) -> None:
    """Every rate in bytes is a percentage of the fastest copy of the same run."""
    copies = [r for r in data["rows"] if r["case"] == "copy" and r["status"] == "ok"]
    if not copies:
        assert data["copy_bandwidth"] is None
        assert all(r["pxvm_percent_of_copy"] is None for r in data["rows"])
        return
    assert data["rows"][0]["case"] == "copy"  # it ran first
    fastest = max(copies, key=lambda r: r["pxvm_per_second"])
    assert data["copy_bandwidth"] == {"shape": fastest["shape"],
                                      "per_second": fastest["pxvm_per_second"]}
    for row in data["rows"]:
        if row["unit"] == "B" and row["status"] == "ok":
            assert row["pxvm_percent_of_copy"] == pytest.approx(
                100 * row["pxvm_per_second"] / fastest["pxvm_per_second"])
        else:
            assert row["pxvm_percent_of_copy"] is None


def check_png(path) -> None:
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 10_000


def test_quick_run_on_the_numpy_backend_checks_every_case(tmp_path):
    proc, data, png = bench(tmp_path, "--quick", "--backend", "numpy", "--no-torch")
    assert proc.returncode == 0, proc.stderr
    check_rows_ran(data, "numpy", list(bench_ops.CASES))
    assert all(r["pxvm_runs"] == "reference" for r in data["rows"] if r["status"] == "ok")
    for name in ("matmul", "softmax", "matmul_quant_q6_k", "NMSE", "pxvm/torch", "of copy"):
        assert name in proc.stdout
    check_png(png)


def test_cpu_backend_against_numpy_and_torch(tmp_path):
    proc, data, png = bench(tmp_path, "--quick", "--backend", "cpu", "--ops",
                            "rmsnorm,matmul_quant_q4_k", "--repeats", "2")
    assert proc.returncode == 0, proc.stderr
    # the copy came along: the reference of the rates in bytes
    check_rows_ran(data, "cpu", ["copy", "rmsnorm", "matmul_quant_q4_k"])
    assert data["settings"]["repeats"] == 2
    assert data["settings"]["ops"] == ["rmsnorm", "matmul_quant_q4_k"]
    runs = {r["case"]: r["pxvm_runs"] for r in data["rows"]}
    assert runs == {"copy": "reference", "matmul_quant_q4_k": "kernel", "rmsnorm": "reference"}
    # where the cpu backend has no kernel pxvm ran numpy's own code: no speed-up claimed
    for row in data["rows"]:
        if row["pxvm_runs"] == "reference":
            assert row["note"] == "no cpu kernel: numpy reference", row
            assert row["pxvm_vs_numpy"] is None and row["pxvm_vs_torch"] is None
        else:
            assert row["pxvm_vs_numpy"] > 0
    assert all(r["pxvm_percent_of_copy"] > 0 for r in data["rows"])
    text = " ".join(proc.stdout.split())  # the caption wraps with the table's width
    assert "of copy" in text and "this run's copy bandwidth" in text
    if HAS_TORCH:  # torch on its GPU where it has one (CUDA events), else on the host
        assert all(r["torch_seconds"] > 0 for r in data["rows"])
        import torch
        clock = "CUDA events" if torch.cuda.is_available() else "host clock"
        assert clock in data["environment"]["torch"]
    check_png(png)


def test_quick_run_on_webgpu_times_kernels_on_the_gpu_clock(gpu_device, tmp_path):
    proc, data, png = bench(tmp_path, "--quick", "--backend", "webgpu", "--no-torch",
                            "--repeats", "1")
    assert proc.returncode == 0, proc.stderr + proc.stdout
    check_rows_ran(data, "webgpu", list(bench_ops.CASES))
    env = data["environment"]
    assert env["device"].startswith("WebGPU on") and env["driver"]
    assert env["torch"].startswith("not measured") and env["versions"]["wgpu"]
    ran = [r for r in data["rows"] if r["status"] == "ok"]
    assert all(r["pxvm_runs"] == "kernel" for r in ran)
    expected_clock = ("GPU timestamps" if "timestamp-query" in gpu_device.description.features
                      else "host clock (no timestamp-query)")
    assert {r["pxvm_clock"] for r in ran} == {expected_clock}
    check_png(png)


def test_quick_run_on_cuda_against_torch_on_the_same_gpu(cuda_device, tmp_path):
    proc, data, png = bench(tmp_path, "--quick", "--backend", "cuda")
    assert proc.returncode == 0, proc.stderr + proc.stdout
    env = data["environment"]
    assert env["backend"] == "cuda" and env["driver"].startswith("CUDA driver")
    assert env["versions"]["cuda-bindings"] and data["failed"] == 0
    ran = [r for r in data["rows"] if r["status"] == "ok"]
    assert {"matmul", "matmul_f16", "dot", "add", "silu", "softmax", "rmsnorm",
            "matmul_quant_q8_0"} <= {r["case"] for r in ran}
    for row in ran:
        assert row["pxvm_clock"] == "CUDA events" and row["pxvm_runs"] == "kernel"
        assert row["nmse"] <= row["nmse_limit"]
    for row in data["rows"]:  # whatever has no CUDA kernel yet says so
        assert row["status"] in ("ok", "skipped") and (row["status"] == "ok" or row["note"])
    if "CUDA events" in env["torch"]:
        assert all(r["torch_seconds"] > 0 for r in ran)
    check_png(png)


# ---- a wrong kernel is caught ----------------------------------------------------------

def _relu_on_host(ctx, x):
    out = ctx.empty(x.shape, x.dtype)
    ctx.record_host("not silu", lambda: np.maximum(x.storage, 0, out=out.storage))
    return out


def _silu_one_percent_high(ctx, x):
    out = ctx.empty(x.shape, x.dtype)
    ctx.record_host("not quite silu", lambda: out.storage.__setitem__(
        ..., pxvm.ops.silu.reference(x.storage) * np.float32(1.01)))
    return out


@pytest.mark.parametrize("wrong", [_relu_on_host, _silu_one_percent_high],
                         ids=["relu instead", "one percent high"])
def test_a_kernel_with_wrong_results_fails_its_row_and_the_run(wrong, monkeypatch, tmp_path):
    monkeypatch.setitem(pxvm.ops.silu.kernels, "cpu", wrong)
    out = tmp_path / "ops.json"
    result = runner.invoke(app, ["bench", "ops", "--quick", "--backend", "cpu", "--no-torch",
                                 "--ops", "silu,add", "--repeats", "1", "--json", str(out)])
    assert result.exit_code == 1, result.output
    rows = {r["case"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows["silu"]["status"] == "FAIL" and rows["silu"]["nmse"] > rows["silu"]["nmse_limit"]
    assert rows["add"]["status"] == "ok"
    assert "FAIL" in result.output and "1 of 3 rows failed" in result.output  # and the copy


def test_a_wrong_webgpu_kernel_fails_its_row(gpu_device, monkeypatch, tmp_path):
    # relu's shader recorded for silu: a real GPU kernel, the wrong function
    monkeypatch.setitem(pxvm.ops.silu.kernels, "webgpu", pxvm.ops.relu.kernels["webgpu"])
    out = tmp_path / "ops.json"
    result = runner.invoke(app, ["bench", "ops", "--quick", "--backend", "webgpu", "--no-torch",
                                 "--ops", "silu", "--repeats", "1", "--json", str(out)])
    assert result.exit_code == 1, result.output
    rows = {r["case"]: r for r in json.loads(out.read_text())["rows"]}
    assert rows.keys() == {"copy", "silu"} and rows["copy"]["status"] == "ok"
    assert rows["silu"]["status"] == "FAIL" and rows["silu"]["nmse"] > 1e-3


def _no_kernel(ctx, x, **params):
    raise pxvm.ops.MissingKernelError("op silu has no cpu kernel for this (test)")


def test_a_missing_kernel_is_a_skipped_row_with_the_reason(monkeypatch, tmp_path):
    monkeypatch.setitem(pxvm.ops.silu.kernels, "cpu", _no_kernel)
    out = tmp_path / "ops.json"
    result = runner.invoke(app, ["bench", "ops", "--quick", "--backend", "cpu", "--no-torch",
                                 "--ops", "silu", "--repeats", "1", "--json", str(out)])
    assert result.exit_code == 0, result.output
    copy, row = json.loads(out.read_text())["rows"]
    assert copy["case"] == "copy" and row["case"] == "silu"
    assert row["status"] == "skipped" and "has no cpu kernel for this (test)" in row["note"]
    assert row["pxvm_percent_of_copy"] is None
    assert row["pxvm_seconds"] is None and row["numpy_seconds"] > 0  # the peers still ran
    assert "skipped" in result.output


def test_without_matplotlib_the_json_is_still_written(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib fails
    out, png = tmp_path / "ops.json", tmp_path / "ops.png"
    result = runner.invoke(app, ["bench", "ops", "--quick", "--backend", "numpy", "--no-torch",
                                 "--ops", "dot", "--json", str(out), "--plot", str(png)])
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())["rows"]
    assert [r["case"] for r in rows] == ["copy", "dot"] and not png.exists()
    assert all(r["status"] == "ok" for r in rows)
    assert "pip install 'pxvm[plots]'" in result.output


# ---- flags -------------------------------------------------------------------------------

@pytest.mark.parametrize("args,message", [
    (["--ops", "matmul,convolve"], "unknown op 'convolve'"),
    (["--ops", ","], "--ops names no op"),
    (["--sizes", "0"], "--sizes must be positive"),
    (["--sizes", "-4"], "--sizes must be positive"),
    (["--sizes", "1.5"], "whole numbers"),
    (["--sizes", "lots"], "whole numbers"),
    (["--backend", "tpu"], "--backend must be one of"),
    (["--repeats", "0"], "--repeats"),
])
def test_bad_flags_are_one_usage_error(args, message):
    result = runner.invoke(app, ["bench", "ops", "--no-torch", *args])
    assert result.exit_code == 2 and message in result.output, result.output


def test_sizes_read_as_each_case_says(tmp_path):
    cases = bench_ops.select(["matmul", "softmax", "matmul_quant"])
    shapes = {(c.name, s) for c, s in bench_ops.plan(cases, [64, 512])}
    copy = bench_ops.CASES["copy"]  # not named: at its own shapes
    assert shapes == {*(("copy", s) for s in copy.default),
                      ("matmul", (64, 64, 64)), ("matmul", (512, 512, 512)),
                      ("softmax", (64, bench_ops.ROW)), ("softmax", (512, bench_ops.ROW)),
                      ("matmul_quant_q8_0", (64, 64)), ("matmul_quant_q8_0", (512, 512)),
                      ("matmul_quant_q4_k", (64, 64)), ("matmul_quant_q4_k", (512, 512)),
                      ("matmul_quant_q6_k", (64, 64)), ("matmul_quant_q6_k", (512, 512))}
    out = tmp_path / "ops.json"  # --quick: the copy that comes along at its quick shape
    result = runner.invoke(app, ["bench", "ops", "--backend", "numpy", "--no-torch", "--ops",
                                 "matmul_quant", "--sizes", "2^6,1k", "--repeats", "1",
                                 "--quick", "--json", str(out)])
    assert result.exit_code == 0, result.output
    rows = {(r["case"], r["shape"]): r for r in json.loads(out.read_text())["rows"]}
    assert rows["matmul_quant_q8_0", "Q8_0 W 64x64, 1 row"]["status"] == "ok"
    assert rows["matmul_quant_q4_k", "Q4_K W 1024x1024, 1 row"]["status"] == "ok"
    assert rows["matmul_quant_q6_k", "Q6_K W 1024x1024, 1 row"]["status"] == "ok"
    small = rows["matmul_quant_q4_k", "Q4_K W 64x64, 1 row"]  # Q4_K blocks hold 256 values
    assert small["status"] == "skipped" and "divisible by 256" in small["note"]


def test_an_unavailable_backend_is_one_line_and_exit_1():
    if pxvm.unavailable_reason("cuda") is None:
        pytest.skip("CUDA works here")
    proc = run_pxvm("bench", "ops", "--backend", "cuda", "--quick")
    assert proc.returncode == 1 and "backend cuda is not available here" in proc.stderr
    assert "Traceback" not in proc.stderr and proc.stderr.strip().count("\n") == 0


def test_bench_lists_both_benchmarks_and_ops_lists_its_cases():
    result = runner.invoke(app, ["bench", "--help"])
    assert result.exit_code == 0 and "llm" in result.output and "ops" in result.output
    result = runner.invoke(app, ["bench", "ops", "--list"])
    assert result.exit_code == 0
    for name in bench_ops.CASES:
        assert name in result.output
    help_text = " ".join(runner.invoke(app, ["bench", "ops", "--help"]).output.split())
    for words in ("percentage of the copy bandwidth", "slice_rows", "the copy case runs first",
                  "Q6_K"):
        assert words.lower() in help_text.lower(), words


def test_products_in_flops_alone_run_without_the_copy(tmp_path):
    out = tmp_path / "ops.json"
    result = runner.invoke(app, ["bench", "ops", "--quick", "--backend", "numpy", "--no-torch",
                                 "--ops", "matmul", "--repeats", "1", "--json", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    assert {r["case"] for r in data["rows"]} == {"matmul"} and data["copy_bandwidth"] is None
    assert "no copy ran" in " ".join(result.output.split())


@pytest.mark.parametrize("option", ["--json", "--plot"])
def test_an_output_in_a_missing_folder_is_refused_before_measuring(option, tmp_path):
    proc = run_pxvm("bench", "ops", "--backend", "numpy", "--quick", option,
                    str(tmp_path / "missing" / "out.file"))
    assert proc.returncode == 1 and "does not exist" in proc.stderr
    assert proc.stdout == ""  # no table: nothing was measured
