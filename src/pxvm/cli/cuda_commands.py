"""`pxvm ptx` (the PTX pxvm's CUDA kernels are), `pxvm monitor` (NVML) and the CUDA part
of `pxvm info`."""

from __future__ import annotations

import typer

from ..backends.cuda import CudaError, CudaUnavailableError, list_cuda_devices
from ..backends.cuda import ptx as ptx_kernels
from ..core.errors import PxvmError
from ..tools.monitor import watch


def ptx(
    kernel: str = typer.Argument(None, help="A kernel's name (see --list)."),
    arch: str = typer.Option("sm_90", help="GPU architecture, e.g. sm_80, sm_90."),
    list_all: bool = typer.Option(False, "--list", help="Name every kernel and variant, one a line."),
):
    """Print the PTX of one of pxvm's CUDA kernels, written by its Python builder, or
    (--list) name every kernel and variant the code can emit."""
    if list_all:
        for name in ptx_kernels.kernels():
            print(name)
        return
    if kernel is None:
        raise PxvmError("name a kernel (pxvm ptx --list names them all)")
    try:
        print(ptx_kernels.ptx(kernel, arch), end="")
    except ptx_kernels.PtxError as exc:
        raise PxvmError(str(exc)) from None


def cuda_summary() -> dict:
    """{"devices": [...]} or {"unavailable": why}, for `pxvm info`."""
    try:
        devices = list_cuda_devices()
    except (CudaUnavailableError, CudaError) as exc:
        return {"devices": [], "unavailable": str(exc)}
    return {"devices": [{
        "index": d.ordinal, "name": d.name, "compute_capability": ".".join(
            map(str, d.compute_capability)), "arch": d.arch, "memory_bytes": d.memory_bytes,
        "multiprocessors": d.multiprocessors, "clock_mhz": d.clock_mhz,
        "memory_clock_mhz": d.memory_clock_mhz,
        "driver": f"{d.driver_version // 1000}.{d.driver_version % 1000 // 10}"}
        for d in devices], "unavailable": None}


def monitor(
    interval: float = typer.Option(1.0, min=0.1, max=3600, help="Seconds between readings."),
    count: int = typer.Option(0, min=0, help="Readings to show (0: until Ctrl-C)."),
):
    """Show the NVIDIA GPUs' utilisation, memory, clocks, temperature and power (NVML),
    refreshing in the terminal."""
    watch(interval, count or None)


def register(app: typer.Typer) -> None:
    app.command("ptx")(ptx)
    app.command("monitor")(monitor)
