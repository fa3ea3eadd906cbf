"""Inputs that are not regular files (a FIFO, a device, a directory) given to the CLI are
one clear error with exit code 1, at once: never an open or a read that blocks forever."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

#: A FIFO with no writer blocks a plain open() forever: the commands must finish long before.
SECONDS = 60


def pxvm(*args):
    return subprocess.run([sys.executable, "-m", "pxvm", *args], capture_output=True, text=True,
                          timeout=SECONDS, env={**os.environ, "PXVM_DEVICE": "0"})


@pytest.fixture
def fifo(tmp_path):
    path = tmp_path / "input.fifo"
    os.mkfifo(path)
    return path


@pytest.mark.parametrize("command", [
    ["run", "{path}", "--backend", "cpu"], ["disasm", "{path}"], ["compare", "{path}"],
    ["asm", "{path}", "-o", "{out}"], ["models", "{path}"],
    ["generate", "--model", "{path}", "--backend", "cpu", "hi"],
])
def test_a_fifo_as_an_input_is_refused_at_once(fifo, tmp_path, command):
    args = [a.format(path=fifo, out=tmp_path / "out.pxi") for a in command]
    proc = pxvm(*args)
    assert proc.returncode == 1, proc.stderr
    assert f"{fifo} is a FIFO (named pipe), not a regular file" in proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "Traceback" not in proc.stderr


@pytest.mark.parametrize("path,kind", [("/dev/zero", "a character device"),
                                       ("/tmp", "a directory")])
def test_a_device_or_a_directory_as_a_model_or_program_is_refused(path, kind):
    for command in (["disasm", path], ["models", path]):
        proc = pxvm(*command)
        assert proc.returncode == 1 and f"{path} is {kind}, not a regular file" in proc.stderr
