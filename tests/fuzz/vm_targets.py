"""The pxVM fuzz targets, run in the bounded worker (harness.py). A module of its own, apart
from the test modules, so that the worker imports only pxvm and this: not hypothesis,
pytest or a conftest."""

from __future__ import annotations

from pxvm.vm import load_pxi, run_program_cpu, validate_program
from pxvm.vm.assembler import assemble


def load_validate_and_run(data: bytes) -> None:
    """Decode a .pxi file's bytes, validate the program and run it on the CPU executor."""
    img = load_pxi(data)
    validate_program(img)
    run_program_cpu(img)


def assemble_and_run(source: str) -> None:
    """Assemble .pxs text and run the program on the CPU executor."""
    run_program_cpu(assemble(source))
