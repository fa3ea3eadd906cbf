"""What the CLI's messages tell a user to do is written as the CLI's flags, never as the
Python API's keywords (backend='cpu')."""

from __future__ import annotations

import subprocess
import sys

from pxvm.cli import error_text
from pxvm.core.errors import NoAdapterError, PxvmError


def run_pxvm(*args, env=None):
    return subprocess.run([sys.executable, "-m", "pxvm", *args], capture_output=True, text=True,
                          timeout=600, env=env)


def test_an_error_naming_another_backend_says_the_flag_on_the_command_line():
    exc = NoAdapterError("no WebGPU adapter found", other_backend="cpu")
    assert error_text(exc) == "no WebGPU adapter found; or run it with --backend cpu"
    assert str(exc) == "no WebGPU adapter found; or run it with backend='cpu'"  # the API's
    assert exc.reason == "no WebGPU adapter found"


def test_an_error_naming_no_backend_reads_the_same_everywhere():
    exc = PxvmError("bad file")
    assert error_text(exc) == str(exc) == exc.reason == "bad file"


def test_info_names_backends_by_flag():
    proc = run_pxvm("info")
    assert proc.returncode == 0, proc.stderr
    assert "--backend cpu" in proc.stdout
    assert "backend='" not in proc.stdout + proc.stderr
