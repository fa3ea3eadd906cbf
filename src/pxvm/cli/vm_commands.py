"""pxVM subcommands: asm, disasm, run, compare, show, digits."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np
import typer
from rich.console import Console

from ..backends.webgpu import WebGPUBackend
from ..core import get_backend, unavailable_reason
from ..core.files import check_regular_file
from ..core.selection import canonical, names
from ..vm import load_pxi, run_program_cpu, run_program_gpu, save_pxi
from ..vm.assembler import assemble, disassembly_lines
from ..vm.digits import report
from ..vm.protocol import ProgramError
from ..vm.render import render_program

console = Console(soft_wrap=True)  # device names are long; never split a result line
BACKEND_HELP = ("Where to run: " + ", ".join(names()) + " (gpu: webgpu; cpu: SIMD kernels on "
                "the CPU; numpy: the reference).")
MAX_PICTURE_PIXELS = 1 << 26  # `show`'s picture: 256 MB as RGB


def _load(path: Path) -> np.ndarray:
    return load_pxi(path)


def _changes(before: np.ndarray, after: np.ndarray, limit: int = 20) -> list[str]:
    ys, xs = np.nonzero(np.any(before != after, axis=2))
    lines = [f"pixel (x={x}, y={y}): {tuple(int(v) for v in before[y, x])} -> "
             f"{tuple(int(v) for v in after[y, x])}" for y, x in zip(ys[:limit], xs[:limit])]
    if len(ys) > limit:
        lines.append(f"... and {len(ys) - limit} more pixels")
    return lines


#: Largest .pxs read: the largest program, every pixel a .matrix32 value, is about 800 MB.
MAX_SOURCE_BYTES = 1 << 30


def _read_source(path: Path) -> str:
    """The text of a .pxs, read in pieces up to MAX_SOURCE_BYTES (a pipe or a device has
    no size to check first)."""
    too_large = ProgramError(f"{path} is over {MAX_SOURCE_BYTES >> 20} MiB; a .pxs program "
                             "is at most that")
    pieces, total = [], 0
    try:
        with open(path, "rb") as f:
            if os.fstat(f.fileno()).st_size > MAX_SOURCE_BYTES:
                raise too_large
            while piece := f.read(min(1 << 24, MAX_SOURCE_BYTES + 1 - total)):
                pieces.append(piece)
                total += len(piece)
                if total > MAX_SOURCE_BYTES:
                    raise too_large
        return b"".join(pieces).decode("utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ProgramError(f"cannot read {path}: {getattr(exc, 'strerror', None) or exc}") from exc


def asm(source: Path = typer.Argument(..., help="Assembly text (.pxs)."),
        output: Path = typer.Option(..., "-o", "--output", help="The .pxi to write.")):
    """Assemble pxVM assembly text into a .pxi program image."""
    check_regular_file(source, ".pxs assembly", ProgramError)
    img = assemble(_read_source(source))
    save_pxi(img, output)
    console.print(f"wrote {output} ({img.shape[1]}x{img.shape[0]})")


def disasm(program: Path = typer.Argument(..., help="A .pxi program.")):
    """Print a .pxi program as assembly text (assembles back to the same bytes)."""
    for line in disassembly_lines(_load(program)):  # streamed: the text is twice the image
        sys.stdout.write(line + "\n")


def run(program: Path = typer.Argument(..., help="A .pxi program."),
        backend: str = typer.Option("auto", help=BACKEND_HELP),
        output: Path = typer.Option(None, "-o", "--output", help="Write the resulting image.")):
    """Run a .pxi program and print the pixels it wrote."""
    img = _load(program)
    be = get_backend(backend)
    t0 = time.perf_counter()
    out = run_program_gpu(img, be) if isinstance(be, WebGPUBackend) else run_program_cpu(img)
    dt = time.perf_counter() - t0
    console.print(f"ran on {be.describe()} in {dt * 1e3:.2f} ms")
    changes = _changes(img, out)
    console.print("\n".join(changes) if changes else "the program wrote nothing")
    if output is not None:
        save_pxi(out, output)
        console.print(f"wrote {output}")


def compare(program: Path = typer.Argument(..., help="A .pxi program."),
            backend: str = typer.Option("auto", help="Where the GPU executor runs: "
                                        + ", ".join(names()) + " (auto: the best WebGPU GPU; "
                                        "only a WebGPU device has a GPU executor to compare).")):
    """Run a program on both executors, time both, and check the images are identical."""
    img = _load(program)
    be = _gpu_executor_backend(backend)
    run_program_gpu(img, be)  # compile the interpreter once before timing
    t0 = time.perf_counter()
    cpu = run_program_cpu(img)
    t_cpu = time.perf_counter() - t0
    t0 = time.perf_counter()
    gpu = run_program_gpu(img, be)
    t_gpu = time.perf_counter() - t0
    console.print(f"CPU executor: {t_cpu * 1e3:.2f} ms")
    console.print(f"GPU executor: {t_gpu * 1e3:.2f} ms on {be.describe()}")
    if np.array_equal(cpu, gpu):
        console.print(f"[green]IDENTICAL[/]: {img.shape[1]}x{img.shape[0]} images are byte-identical")
        return
    console.print("[red]DIFFERENT[/]:")
    console.print("\n".join(_changes(cpu, gpu)))
    raise typer.Exit(1)


def _gpu_executor_backend(name: str) -> WebGPUBackend:
    """The WebGPU backend `compare` runs the GPU executor on; a one-line error saying what
    compare compares, and why it cannot here, otherwise."""
    what = ("compare runs a program on the CPU executor and on the GPU executor (WebGPU) "
            "and checks the images match")
    if str(name).lower() != "auto" and canonical(name) != "webgpu":
        if canonical(name) is None:
            get_backend(name)  # an unknown name: its own error
        raise ProgramError(f"{what}; --backend {name} has no GPU executor. Use --backend "
                           f"webgpu, or `pxvm run --backend {name}` to run the program alone")
    reason = unavailable_reason("webgpu")
    if reason is not None:
        raise ProgramError(f"{what}, but there is no WebGPU device here: {reason}. Or run the "
                           "program alone with `pxvm run --backend cpu`")
    return get_backend("webgpu")


def show(program: Path = typer.Argument(..., help="A .pxi program."),
         output: Path = typer.Option(..., "-o", "--output", help="PNG to write."),
         scale: int = typer.Option(0, min=0, max=64,
                                   help="Pixels per program pixel (0: automatic).")):
    """Draw a program enlarged, with its instructions labelled."""
    img = _load(program)
    h, w = img.shape[:2]
    cell = scale or max(4, min(48, 2048 // max(h, w)))  # render_program's automatic scale
    if w * cell * h * cell > MAX_PICTURE_PIXELS:
        raise ProgramError(f"a {w}x{h} program drawn at {cell} pixels per pixel is a picture of "
                           f"{w * cell * h * cell:,} pixels, more than {MAX_PICTURE_PIXELS:,}; "
                           "pass a smaller --scale or show a smaller program")
    picture = render_program(img, scale)
    try:
        picture.save(output)
    except (OSError, ValueError) as exc:  # ValueError: Pillow knows no format for the suffix
        raise ProgramError(f"cannot write {output}: {getattr(exc, 'strerror', None) or exc}") from exc
    console.print(f"wrote {output}")


def digits(output: Path = typer.Option(None, "-o", "--output", help="Write the network's .pxi."),
           hidden: int = typer.Option(32, min=1, max=1024, help="Hidden units."),
           backend: str = typer.Option("auto", help="Also run on this backend: " + ", ".join(names())
                                       + " (a GPU one runs the GPU executor too).")):
    """Train an MLP on scikit-learn's digits, compile it to a .pxi, compare accuracies."""
    report(output, hidden, backend, console)


def register(app: typer.Typer) -> None:
    for fn in (asm, disasm, run, compare, show, digits):
        app.command(fn.__name__)(fn)
