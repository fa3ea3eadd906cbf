"""The NVML monitor (pxvm.tools.monitor, `pxvm monitor`, pxvm.examples.cuda_monitor):
readings of every NVIDIA GPU where there is one; one clear line and exit code 1 where
there is none."""

from __future__ import annotations

import subprocess
import sys

import pytest
from rich.console import Console

from pxvm.tools import monitor


def _has_nvml() -> bool:
    try:
        monitor.sample()
    except monitor.MonitorUnavailableError:
        return False
    return True


def test_readings_are_plausible_where_a_gpu_is():
    if not _has_nvml():
        pytest.skip("no NVIDIA driver here: NVML cannot start")
    samples = monitor.sample()
    assert samples and [s.index for s in samples] == list(range(len(samples)))
    for s in samples:
        assert 0 <= s.gpu_percent <= 100 and 0 <= s.memory_percent <= 100
        assert 0 < s.memory_used <= s.memory_total
        assert s.sm_clock_mhz > 0 and s.memory_clock_mhz > 0 and 0 < s.temperature_c < 120
        assert s.power_w is None or 0 < s.power_w <= 2 * s.power_limit_w
    console = Console(record=True, width=160)
    monitor.watch(interval=0.1, count=2, console=console)
    assert samples[0].name in console.export_text()


@pytest.mark.parametrize("command", [[sys.executable, "-m", "pxvm", "monitor", "--count", "1"],
                                     [sys.executable, "-m", "pxvm.examples.cuda_monitor"]])
def test_without_a_driver_the_monitor_says_why_in_one_line(command):
    if _has_nvml():
        pytest.skip("this machine has an NVIDIA driver")
    run = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert run.returncode == 1
    assert run.stderr.strip().count("\n") == 0 and "NVML cannot start" in run.stderr
    assert "Traceback" not in run.stderr
