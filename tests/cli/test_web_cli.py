"""`pxvm serve`'s options: out-of-range values are usage errors, not tracebacks."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("port", ["70000", "-1", "http"])
def test_a_port_outside_0_to_65535_is_a_usage_error(port):
    result = subprocess.run([sys.executable, "-m", "pxvm", "serve", "--port", port],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "--port" in result.stderr and "Traceback" not in result.stderr
