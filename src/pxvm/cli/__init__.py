"""The `pxvm` command. Each part of pxvm adds its own subcommands from its own module
(`register(app)`), so this file only assembles them."""

from __future__ import annotations

import importlib
import logging
import sys

import typer

from ..runtime.errors import PxvmError

app = typer.Typer(
    name="pxvm",
    help="Portable GPU computing for Python: WGSL kernels on any GPU through WebGPU, "
    "pixel programs (.pxi) and LLM inference, with a numpy fallback.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)

# Modules that contribute subcommands; each defines register(app).
COMMAND_MODULES = ("device_commands", "vm_commands", "llm_commands", "web_commands")

for _name in COMMAND_MODULES:
    try:
        _module = importlib.import_module(f"{__name__}.{_name}")
    except ModuleNotFoundError as exc:
        if exc.name != f"{__name__}.{_name}":
            raise
        continue
    _module.register(app)


def main() -> None:
    """Entry point: runs the app, turning pxvm's own errors into one line and exit code 1."""
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    try:
        app()
    except PxvmError as exc:
        typer.secho(f"error: {exc}", err=True, fg="red")
        sys.exit(1)
