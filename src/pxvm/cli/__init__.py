"""The `pxvm` command. Each part of pxvm adds its own subcommands from its own module
(`register(app)`), so this file only assembles them."""

from __future__ import annotations

import logging
import sys

import typer

from ..runtime.errors import PxvmError
from . import device_commands, llm_commands, vm_commands, web_commands

app = typer.Typer(
    name="pxvm",
    help="Portable GPU computing for Python: WGSL kernels on any GPU through WebGPU, "
    "pixel programs (.pxi) and LLM inference, with a numpy fallback.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

for _commands in (device_commands, vm_commands, llm_commands, web_commands):
    _commands.register(app)


def main() -> None:
    """Entry point: runs the app, turning pxvm's own errors into one line and exit code 1."""
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    try:
        app()
    except PxvmError as exc:
        typer.secho(f"error: {exc}", err=True, fg="red")
        sys.exit(1)
