"""`pxvm info` (adapters, features, limits, what auto picks and what was tuned), `pxvm
tune` and `pxvm demo`."""

from __future__ import annotations

import json
import time
from importlib import resources

import numpy as np
import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .. import ops
from ..backends.webgpu import WebGPUBackend
from ..backends.webgpu.runtime import choose_adapter, list_adapters
from ..backends.webgpu.runtime.adapters import KEY_FEATURES, KEY_LIMITS
from ..core import Backend, get_backend, tuning, unavailable_reason
from ..core.selection import names
from ..tools import tune as tuner
from ..core.errors import NoAdapterError, PxvmError
from ..vm import load_pxi, run_program_cpu, run_program_gpu
from .cuda_commands import cuda_summary
from .output_paths import check_output_folder
from .terminal import plain

console = Console()


def info(
    as_json: bool = typer.Option(False, "--json", help="Print machine-readable JSON."),
    all_features: bool = typer.Option(False, "--all-features", help="List every feature."),
):
    """List WebGPU adapters (backend, type, features, limits) and which one auto picks,
    CUDA devices (compute capability, memory, clocks) or why there are none, and what the
    fast CPU backend runs on (threads, SIMD, BLAS)."""
    try:
        adapters = list_adapters()
    except PxvmError as exc:
        adapters, error = [], exc.reason
    else:
        error = None
    try:
        chosen, reason = choose_adapter("auto", adapters) if adapters else (None, error or "")
    except PxvmError as exc:
        chosen, reason = None, exc.reason
    cpu = get_backend("cpu").details()
    cuda = cuda_summary()
    tuned = _tuning_summary(bool(cuda["devices"]))
    if as_json:
        print(json.dumps({
            "cpu": cpu,
            "cuda": cuda,
            "tuning": tuned,
            "adapters": [{
                "index": a.index, "name": a.name, "vendor": a.vendor, "backend": a.backend,
                "type": a.adapter_type, "software": a.is_software, "features": a.features,
                "limits": a.limits} for a in adapters],
            "auto": None if chosen is None else chosen.index,
            "reason": reason,
        }, indent=2))
        return
    table = Table(title="CPU backend (--backend cpu)", title_justify="left", show_header=False)
    for key, label in (("cpu", "CPU (LLVM's name)"), ("simd", "widest SIMD"),
                       ("threads", "threads (PXVM_CPU_THREADS)"), ("thread_pool", "thread pool"),
                       ("numba", "numba"), ("blas", "BLAS (prompts)")):
        table.add_row(label, str(cpu[key]))
    console.print(table)
    if cpu["thread_pool_warning"]:
        console.print(f"[yellow]Warning:[/] {escape(cpu['thread_pool_warning'])}")
    _print_cuda(cuda)
    if not adapters:
        console.print(f"[red]No WebGPU adapter:[/] {error or 'none found'}")
        console.print("pxvm will run on the CPU backend (--backend cpu).")
        return
    for a in adapters:
        mark = "[green]auto -> [/]" if chosen is not None and a.index == chosen.index else ""
        table = Table(title=f"{mark}[{a.index}] {a.name}", title_justify="left", show_header=False)
        table.add_row("backend / type", f"{a.backend} / {a.adapter_type}"
                      + ("  (software: used only when asked for)" if a.is_software else ""))
        table.add_row("key features", ", ".join(f for f in KEY_FEATURES if f in a.features) or "-")
        for key in KEY_LIMITS:
            if key in a.limits:
                table.add_row(key, f"{a.limits[key]:,}")
        if all_features:
            table.add_row("all features", ", ".join(a.features))
        console.print(table)
    if chosen is not None:
        console.print(f"auto picks [bold][{chosen.index}] {plain(chosen.name)}[/]: {reason}")
    else:
        console.print(f"[yellow]auto picks no adapter:[/] {reason}")
    console.print("Override with PXVM_DEVICE=<index or part of a name>.")
    _print_tuning(tuned)


def _tuning_summary(cuda: bool) -> list[dict]:
    """What `pxvm tune` measured for the WebGPU device pxvm uses (auto's, or
    PXVM_DEVICE's) and for CUDA, if anything."""
    out = []
    for name, present in (("webgpu", True), ("cuda", cuda)):
        if not present or unavailable_reason(name) is not None:
            continue
        try:
            backend = get_backend(name)
        except PxvmError:
            continue
        t = tuning.tuning_for(backend)
        out.append({"backend": name, "device": backend.describe(), "file": str(t.path),
                    "tuned": bool(t.configs or t.crossovers), "configs": t.configs,
                    "crossovers": t.crossovers, "never": _never(t.measured),
                    "tuned_at": t.measured.get("tuned at")})
    return out


def _never(measured: dict) -> list[str]:
    """Ops whose GPU never beat the CPU at the sizes measured."""
    return [key.split(" ", 1)[1] for key, value in measured.items()
            if key.startswith("crossover ") and value.get("gpu_faster_from") is None]


def _print_tuning(tuned: list[dict]) -> None:
    for t in tuned:
        if not t["tuned"]:
            console.print(f"{t['backend']}: not tuned on this device (defaults); run "
                          f"`pxvm tune --backend {t['backend']}`")
            continue
        table = Table(title=f"Tuned for {t['device']} ({t['tuned_at']})",
                      title_justify="left", show_header=False)
        for name, value in sorted(t["configs"].items()):
            table.add_row(name, str(tuple(value) if isinstance(value, list) else value))
        for name, elements in sorted(t["crossovers"].items()):
            table.add_row(f"{name}: GPU from", f"{elements:,} input elements (CPU below)"
                          + ("; the CPU won at every size measured" if name in t["never"]
                             else ""))
        console.print(table)


def tune(
    backend: str = typer.Option("auto", help="The GPU backend to tune: webgpu, cuda or "
                                "auto (the GPU auto picks)."),
    quick: bool = typer.Option(False, "--quick", help="Fewer cases, sizes and repeats "
                               "(a smoke test; the choices are less sure)."),
    only: list[str] = typer.Option(None, "--only", help="Tune only this tunable (repeat "
                                   "for more); `pxvm tune --list` names them."),
    crossovers: bool = typer.Option(True, "--crossovers/--no-crossovers",
                                    help="Also measure where the GPU beats the CPU per op."),
    list_only: bool = typer.Option(False, "--list", help="Name every tunable and exit."),
):
    """Measure the fastest kernel configurations on this GPU (each checked against the
    numpy reference before it is timed) and the input sizes from which the GPU beats
    the CPU; kept per device, driver and pxvm version, and used from then on (`pxvm
    info` shows them)."""
    if list_only:
        for t in tuning.TUNABLES.values():
            console.print(f"{t.name}  ({', '.join(t.backends)}): {t.description}; "
                          f"candidates {', '.join(map(str, t.candidates))}")
        return
    unknown = sorted(set(only or ()) - set(tuning.TUNABLES))
    if unknown:
        raise PxvmError(f"no tunable {', '.join(unknown)}; `pxvm tune --list` names them")
    check_output_folder(tuning.cache_dir(), "the tuning")
    be = _gpu_backend(backend)
    wanted = set(only) if only else None
    total = tuner.steps(be, quick, crossovers, wanted)
    with Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(),
                  console=console, transient=True) as bar:
        task = bar.add_task(f"tuning {be.name}", total=total)
        result = tuner.tune(be, quick=quick, crossovers=crossovers, only=wanted,
                            progress=tuner.Progress(total, lambda label: bar.update(
                                task, advance=1, description=label)))
    console.print(f"saved {result.path}")
    _print_tuning([{"backend": be.name, "device": be.describe(), "tuned": True,
                    "configs": result.configs, "crossovers": result.crossovers,
                    "never": _never(result.measured),
                    "tuned_at": result.measured.get("tuned at")}])


def _gpu_backend(name: str) -> Backend:
    if name not in ("auto", "webgpu", "wgpu", "gpu", "cuda"):
        raise PxvmError(f"pxvm tune tunes a GPU backend (webgpu or cuda), not {name!r}")
    try:
        be = get_backend(name)
    except NoAdapterError as exc:  # its remedy, the CPU backend, is nothing to tune
        raise PxvmError(f"no GPU to tune: {exc.reason}") from None
    if be.name not in ("webgpu", "cuda"):
        raise PxvmError(f"no GPU to tune: auto picked {be.describe()}; ask for one with "
                        "--backend webgpu (and PXVM_DEVICE for a software adapter)")
    return be


def _print_cuda(cuda: dict) -> None:
    if not cuda["devices"]:
        console.print(f"No CUDA backend (--backend cuda): {cuda['unavailable']}")
        return
    for d in cuda["devices"]:
        table = Table(title=f"CUDA [{d['index']}] {d['name']} (--backend cuda)",
                      title_justify="left", show_header=False)
        table.add_row("compute capability", f"{d['compute_capability']} ({d['arch']})")
        table.add_row("memory", f"{d['memory_bytes'] / 2**30:.1f} GiB")
        table.add_row("multiprocessors", str(d["multiprocessors"]))
        table.add_row("clocks", f"{d['clock_mhz']} MHz, memory {d['memory_clock_mhz']} MHz")
        table.add_row("driver", f"CUDA {d['driver']}")
        console.print(table)


def demo(
    backend: str = typer.Option("auto", help="Where to run: " + ", ".join(names())
                                + " (auto: the best WebGPU GPU, else cpu)."),
    size: int = typer.Option(1024, min=1, max=8192, help="Matrix size for the matmul."),
):
    """Run a matmul and the dot-product pixel program; print the backend and the times."""
    be = get_backend(backend)
    console.print(f"backend: [bold]{be.name}[/] - {be.describe()}")
    rng = np.random.default_rng(0)
    a = rng.standard_normal((size, size), dtype=np.float32)
    b = rng.standard_normal((size, size), dtype=np.float32)
    ops.matmul(a[:8, :8], b[:8, :8], backend=be).numpy()  # compile / warm up
    t0 = time.perf_counter()
    c = ops.matmul(a, b, backend=be).numpy()
    dt = time.perf_counter() - t0
    err = float(np.sum((c - a @ b) ** 2) / np.sum((a @ b) ** 2))
    console.print(f"matmul {size}x{size}x{size}: {dt * 1e3:.1f} ms including upload and "
                  f"readback ({2 * size**3 / dt / 1e9:.1f} GFLOP/s), NMSE vs numpy {err:.1e}")
    path = resources.files("pxvm.examples").joinpath("dot_test.pxi")
    img = load_pxi(str(path))
    run = (lambda image: run_program_gpu(image, be)) if isinstance(be, WebGPUBackend) \
        else run_program_cpu
    run(img)
    t0 = time.perf_counter()
    out = run(img)
    dt = time.perf_counter() - t0
    value = int(out[3, 0, 0]) + 256 * int(out[3, 0, 1])
    console.print(f"dot_test.pxi on {be.name}: pixel (0,3) = {value} (expected 300) "
                  f"in {dt * 1e3:.2f} ms")


def register(app: typer.Typer) -> None:
    app.command("info")(info)
    app.command("tune")(tune)
    app.command("demo")(demo)
