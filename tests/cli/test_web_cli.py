"""`pxvm serve`'s options: out-of-range values are usage errors, not tracebacks; --replicas
without Ray or without its cluster is one clear error."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest


@pytest.mark.parametrize("port", ["70000", "-1", "http"])
def test_a_port_outside_0_to_65535_is_a_usage_error(port):
    result = subprocess.run([sys.executable, "-m", "pxvm", "serve", "--port", port],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert "--port" in result.stderr and "Traceback" not in result.stderr


def _serve_without_ray(*args: str) -> subprocess.CompletedProcess:
    """`pxvm serve ARGS` in a Python where ray cannot be imported (None in sys.modules)."""
    code = ("import sys; sys.modules['ray'] = None; from pxvm.cli import main; "
            f"sys.argv = ['pxvm', 'serve', *{list(args)!r}]; main()")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)


def test_replicas_without_ray_name_the_extra_to_install(tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "serve"))
    from tiny_chat_model import write_tiny_chat_model
    model = write_tiny_chat_model(tmp_path / "tiny.gguf")
    result = _serve_without_ray("--model", str(model), "--replicas", "2")
    assert result.returncode == 1
    assert "pip install 'pxvm[cluster]'" in result.stderr and "Traceback" not in result.stderr


def test_replicas_without_a_model_is_a_usage_error():
    result = _serve_without_ray("--replicas", "2")
    assert result.returncode == 2
    assert "--model" in result.stderr and "Traceback" not in result.stderr


def test_replicas_with_a_ray_address_that_does_not_answer_fail_at_once(tmp_path):
    pytest.importorskip("ray")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "serve"))
    from tiny_chat_model import write_tiny_chat_model
    model = write_tiny_chat_model(tmp_path / "tiny.gguf")
    with socket.socket() as closed:  # a port nothing listens on
        closed.bind(("127.0.0.1", 0))
        address = f"127.0.0.1:{closed.getsockname()[1]}"
    result = subprocess.run([sys.executable, "-m", "pxvm", "serve", "--model", str(model),
                             "--replicas", "2"], capture_output=True, text=True, timeout=60,
                            env={**os.environ, "RAY_ADDRESS": address})
    assert result.returncode == 1
    assert f"RAY_ADDRESS={address} does not answer" in result.stderr
    assert "Traceback" not in result.stderr
