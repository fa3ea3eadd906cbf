"""Live state of the NVIDIA GPUs through NVML (`nvidia-ml-py`): utilisation, memory,
clocks, temperature and power, sampled on demand (`sample`) or shown refreshing in the
terminal (`watch`, behind `pxvm monitor` and the seed's `pxvm.examples.cuda_monitor`)."""

from __future__ import annotations

import time
from dataclasses import dataclass

from rich.console import Console
from rich.live import Live
from rich.table import Table

from ..core.errors import PxvmError


class MonitorUnavailableError(PxvmError):
    """NVML cannot be used here (no nvidia-ml-py, no NVIDIA driver or no GPU)."""


@dataclass(frozen=True)
class GpuSample:
    index: int
    name: str
    gpu_percent: int          # kernels running, share of the last sample period
    memory_percent: int       # memory reads/writes, share of the period
    memory_used: int          # bytes
    memory_total: int
    sm_clock_mhz: int
    memory_clock_mhz: int
    temperature_c: int
    power_w: float | None     # None where the board does not report it
    power_limit_w: float | None


def _nvml():
    try:
        import pynvml
    except ImportError as exc:
        raise MonitorUnavailableError("nvidia-ml-py is not installed (pip install "
                                      "nvidia-ml-py)") from exc
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        raise MonitorUnavailableError(f"NVML cannot start: {exc} (is an NVIDIA driver "
                                      "installed?)") from exc
    return pynvml


def sample() -> list[GpuSample]:
    """One reading of every NVIDIA GPU."""
    nv = _nvml()
    out = []
    for i in range(nv.nvmlDeviceGetCount()):
        h = nv.nvmlDeviceGetHandleByIndex(i)
        name = nv.nvmlDeviceGetName(h)
        util = nv.nvmlDeviceGetUtilizationRates(h)
        mem = nv.nvmlDeviceGetMemoryInfo(h)
        try:
            power = nv.nvmlDeviceGetPowerUsage(h) / 1000
            limit = nv.nvmlDeviceGetEnforcedPowerLimit(h) / 1000
        except nv.NVMLError:
            power = limit = None
        out.append(GpuSample(
            i, name.decode() if isinstance(name, bytes) else name, int(util.gpu),
            int(util.memory), int(mem.used), int(mem.total),
            int(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
            int(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_MEM)),
            int(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)), power, limit))
    return out


def table(samples: list[GpuSample]) -> Table:
    t = Table(title="NVIDIA GPUs (NVML)", title_justify="left")
    for column in ("GPU", "util", "mem util", "memory", "SM / mem clock", "temp", "power"):
        t.add_column(column)
    for s in samples:
        power = "-" if s.power_w is None else f"{s.power_w:.0f} / {s.power_limit_w:.0f} W"
        t.add_row(f"[{s.index}] {s.name}", f"{s.gpu_percent}%", f"{s.memory_percent}%",
                  f"{s.memory_used / 2**30:.1f} / {s.memory_total / 2**30:.1f} GiB",
                  f"{s.sm_clock_mhz} / {s.memory_clock_mhz} MHz", f"{s.temperature_c} C", power)
    return t


def watch(interval: float = 1.0, count: int | None = None, console: Console | None = None) -> None:
    """Show the GPUs' state, refreshed every `interval` seconds, `count` times (None:
    until interrupted)."""
    console = console or Console()
    with Live(table(sample()), console=console, auto_refresh=False) as live:
        shown = 1
        while count is None or shown < count:
            time.sleep(interval)
            live.update(table(sample()), refresh=True)
            shown += 1
