"""The `pxvm` command. Each part of pxvm adds its own subcommands from its own module
(`register(app)`), so this file only assembles them."""

from __future__ import annotations

import logging
import os
import sys
import traceback

import typer

from ..core.errors import PxvmError
from . import (bench_commands, cuda_commands, device_commands, help_format, llm_commands,
               pixels_commands, vm_commands, web_commands)
from .terminal import visible

app = typer.Typer(
    name="pxvm",
    help="Portable GPU computing for Python: WGSL kernels on any GPU through WebGPU, "
    "pixel programs (.pxi) and LLM inference, with a fast CPU fallback.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=help_format.MARKUP_MODE,
)

for _commands in (device_commands, cuda_commands, vm_commands, llm_commands, bench_commands,
                  pixels_commands, web_commands):
    _commands.register(app)
help_format.apply(app)


def error_text(exc: PxvmError) -> str:
    """`exc`'s message for the command line: another backend to try named by its flag."""
    if exc.other_backend is None:
        return str(exc)
    return f"{exc.reason}; or run it with --backend {exc.other_backend}"


def main() -> None:
    """Entry point: runs the app. pxvm's own errors (bad files, bad inputs, no device)
    become one line and exit code 1, usage errors exit 2 (typer), an interrupt 130, and
    anything else, a bug, one line saying so and exit 3 (PXVM_DEBUG=1 shows the
    traceback)."""
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    try:
        app()
    except PxvmError as exc:
        typer.secho(f"error: {visible(error_text(exc))}", err=True, fg="red")
        sys.exit(1)
    except KeyboardInterrupt:
        typer.secho("interrupted", err=True)
        sys.exit(130)
    except MemoryError:
        typer.secho("error: out of memory; try a smaller input (or --context)", err=True, fg="red")
        sys.exit(1)
    except Exception as exc:  # noqa: BLE001 - the last line of defence: no traceback
        if os.environ.get("PXVM_DEBUG") == "1":
            traceback.print_exc()
        typer.secho(f"internal error: {type(exc).__name__}: {visible(str(exc))}. This is a bug in pxvm; "
                    "please report it (PXVM_DEBUG=1 shows where it happened)", err=True, fg="red")
        sys.exit(3)
