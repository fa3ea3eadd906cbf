"""`pxvm bench`: the benchmark group, and `pxvm bench ops` (pxvm.tools.bench_ops). Other
modules add their benchmarks to `bench` (llm_commands: `pxvm bench llm`)."""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import numpy as np
import typer
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..core import get_backend, unavailable_reason
from ..core.selection import names
from ..tools import bench_ops
from ..core.errors import PxvmError
from . import help_format
from .output_paths import check_output_file
from .serve_bench_commands import SERVE_HELP, serve_bench

bench = typer.Typer(help="Benchmarks: `ops` (pxvm's kernels against numpy and PyTorch) and "
                    "`llm` (a model's prefill and decode speed).", no_args_is_help=True,
                    rich_markup_mode=help_format.MARKUP_MODE)

#: Bounds of options that only cost time: a typo of a few more digits is refused.
MAX_REPEATS = 1000
#: A size past this is a typo (2^34 float32 values are 64 GiB an input).
MAX_SIZE = 1 << 34
#: Width of the table when stdout is not a terminal (logs, pipes): every column readable.
LOG_WIDTH = 170


def _size(text: str) -> int:
    """'4096', '1e6', '2^20' or '16k' / '1M' as a positive integer; BadParameter if not."""
    t = text.strip().lower()
    try:
        if m := re.fullmatch(r"2\^(\d+)", t):
            value = 2 ** int(m.group(1))
        elif m := re.fullmatch(r"(\d+)([km])", t):
            value = int(m.group(1)) * {"k": 1024, "m": 1024 ** 2}[m.group(2)]
        else:
            number = float(t)
            if not number.is_integer():
                raise ValueError
            value = int(number)
    except (ValueError, OverflowError):
        raise typer.BadParameter(f"--sizes takes whole numbers (4096, 1e6, 2^20, 16k), "
                                 f"not {text!r}") from None
    if value <= 0:
        raise typer.BadParameter(f"--sizes must be positive, not {text!r}")
    if value > MAX_SIZE:
        raise typer.BadParameter(f"--sizes {text!r} is more than 2^34; a typo?")
    return value


def _names(text: str | None) -> list[str] | None:
    if text is None:
        return None
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise typer.BadParameter("--ops names no op; e.g. --ops matmul,softmax")
    return names


def _backend(name: str):
    if name.lower() not in names():
        raise typer.BadParameter(f"--backend must be one of {', '.join(names())}, not {name!r}")
    if name.lower() != "auto":
        reason = unavailable_reason(name)
        if reason is not None:
            raise PxvmError(f"backend {name} is not available here: {reason}; pick another "
                            "with --backend (cpu runs everywhere)")
    return get_backend(name)


def _time(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.1f} us"
    if seconds < 1:
        return f"{seconds * 1e3:.3f} ms"
    return f"{seconds:.2f} s"


def _cell(row: bench_ops.Row, seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{_time(seconds)}\n{bench_ops.format_rate(row.rate(seconds), row.unit)}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def _percent(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}%"


def _copy_note(reference: bench_ops.Row | None) -> str:
    """What the "of copy" column is a percentage of."""
    if reference is None:
        return "of copy: - (no copy ran)"
    rate = bench_ops.format_rate(reference.rate(reference.pxvm_seconds), reference.unit)
    return (f"of copy: pxvm's GB/s as a percentage of this run's copy bandwidth, {rate} "
            f"(pxvm's copy of {reference.shape})")


def _check(row: bench_ops.Row) -> str:
    if row.status == "ok":
        how = escape(row.note) if row.note else row.pxvm_runs  # e.g. no cpu kernel
        return "[green]ok[/]" + ("" if row.pxvm_runs == "kernel" else f" [dim]({how})[/]")
    if row.status == "FAIL":
        return "[bold red]FAIL[/]"
    if row.status == "error":
        return f"[bold red]ERROR[/] {escape(row.note)}"
    return f"[yellow]skipped[/]: {escape(row.note)}"


def _table(rows: list[bench_ops.Row], env: dict, repeats: int,
           reference: bench_ops.Row | None) -> Table:
    clocks = sorted({r.pxvm_clock for r in rows if r.pxvm_clock})
    table = Table(title=f"pxvm bench ops: {env['device']}", title_justify="left",
                  caption=(f"median of {repeats} runs after a warm-up; pxvm timed by "
                           f"{', '.join(clocks) or '-'}; numpy by the host clock; "
                           f"{env['torch']}. pxvm/torch, pxvm/numpy: pxvm's throughput over the "
                           "peer's (above 1: pxvm is faster). Check: NMSE of pxvm's result "
                           "against the op's numpy reference. " + _copy_note(reference)
                           + "."),
                  caption_justify="left")
    for name, justify in (("op", "left"), ("shape", "left"), ("pxvm", "right"),
                          ("of copy", "right"), ("numpy", "right"), ("torch", "right"),
                          ("pxvm/torch", "right"), ("pxvm/numpy", "right"), ("NMSE", "right"),
                          ("check", "left")):
        table.add_column(name, justify=justify, overflow="fold")
    for r in rows:
        table.add_row(r.case, r.shape, _cell(r, r.pxvm_seconds),
                      _percent(r.pxvm_percent_of_copy), _cell(r, r.numpy_seconds),
                      _cell(r, r.torch_seconds), _ratio(r.speedup(r.torch_seconds)),
                      _ratio(r.speedup(r.numpy_seconds)),
                      "-" if r.nmse is None else f"{r.nmse:.1e}", _check(r))
    return table


def _markdown(rows: list[bench_ops.Row]) -> str:
    lines = ["| op | shape | pxvm | of copy | numpy | torch | pxvm/torch | pxvm/numpy | NMSE |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        cells = [_cell(r, t).replace("\n", " (") + (")" if t else "")
                 for t in (r.pxvm_seconds, r.numpy_seconds, r.torch_seconds)]
        nmse = "-" if r.nmse is None else f"{r.nmse:.1e}"
        if r.status != "ok":
            nmse += f" {r.status}"
        cells.insert(1, _percent(r.pxvm_percent_of_copy))
        lines.append(f"| {r.case} | {r.shape} | {' | '.join(cells)} | "
                     f"{_ratio(r.speedup(r.torch_seconds))} | "
                     f"{_ratio(r.speedup(r.numpy_seconds))} | {nmse} |")
    return "\n".join(lines)


def _list_cases(console: Console) -> None:
    table = Table(title="pxvm bench ops: the cases (--ops takes a case or an op name)",
                  title_justify="left")
    for name in ("case", "op", "a --sizes number is", "default shapes", "--quick shapes"):
        table.add_column(name, overflow="fold")
    for c in bench_ops.CASES.values():
        table.add_row(c.name, c.op, c.size_means, "\n".join(c.label(s) for s in c.default),
                      "\n".join(c.label(s) for s in c.quick))
    console.print(table)


def _matplotlib_missing() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return True
    return False


PLOTS_HINT = ("matplotlib is not installed, so no plot is drawn: pip install 'pxvm[plots]' "
              "(or pip install matplotlib)")


OPS_HELP = (
    "Time pxvm's kernels for each op and size against numpy and PyTorch, in one run.\n\n"
    "pxvm's time is the GPU's own (WebGPU timestamp queries, CUDA events; the host clock on "
    "the CPU backends), taken with the inputs already on the device; numpy and torch run the "
    "same work on the same inputs. Rates are TFLOP/s, or GB/s for memory-bound ops and "
    "quantized products (their weight's bytes). The quantized products' runs each take "
    "another copy of the weight on the device (up to 256 MiB of copies, in turn), so that "
    "it comes from memory, as in decoding, not from the GPU's cache.\n\n"
    "Each pxvm rate in GB/s is also shown as a percentage of the copy bandwidth measured in "
    "the same run on the same backend ('of copy'): the fastest row of the `copy` case, bytes "
    "read plus written per second by pxvm's slice_rows of a whole float32 tensor (pxvm has "
    "no copy op; that one copies every value once), 256 MiB and 1 GiB (or as much as the "
    "device's tensors hold, where less). So the copy case "
    "runs first, at those shapes (4 MiB with --quick; --sizes apply to it only where --ops "
    "names it), whenever a case in GB/s is chosen without it, e.g. --ops matmul_quant.\n\n"
    "Every pxvm result is checked against the op's numpy reference: one off it (NMSE over "
    "the case's limit) is marked FAIL and the command exits 1. Cases the backend has no "
    "kernel for are listed as skipped, with the reason.\n\n"
    "Examples: pxvm bench ops --backend cuda --json ops.json --plot ops.png; "
    "pxvm bench ops --quick --ops matmul,softmax; pxvm bench ops --ops dot --sizes 1e6,2^26; "
    "pxvm bench ops --backend webgpu --ops matmul_quant (Q8_0, Q4_K and Q6_K products at "
    "Llama-3-8B's weight shapes, as percentages of the copy)")


def ops(
    backend: str = typer.Option("auto", help="Where pxvm runs: webgpu, cuda, cpu, numpy or "
                                "auto (pxvm's choice: WebGPU on a hardware GPU, else cpu)."),
    op_names: str = typer.Option(None, "--ops", help="Comma-separated cases or op names "
                                 "(default: all, the copy first; --list names them), e.g. "
                                 "matmul,softmax. A case in GB/s brings the copy case along."),
    sizes: str = typer.Option(None, "--sizes", help="Comma-separated sizes for every chosen "
                              "case instead of its defaults, each read as the case says "
                              "(--list): n of n x n x n for matmul, elements, rows of 4096, "
                              "...; 4096, 1e6, 2^20 or 16k."),
    repeats: int = typer.Option(None, min=1, max=MAX_REPEATS,
                                help="Timed runs after the warm-up; the median is reported "
                                     "(default 10, 3 with --quick)."),
    quick: bool = typer.Option(False, "--quick", help="Small shapes and 3 repeats: a smoke "
                               "test that every kernel runs and is right, in seconds."),
    json_path: Path = typer.Option(None, "--json", help="Write every row, the device, "
                                   "driver and versions to this JSON file."),
    plot_path: Path = typer.Option(None, "--plot", help="Draw throughput against size, one "
                                   "panel per case, to this PNG (needs matplotlib: the "
                                   "`plots` extra)."),
    use_torch: bool = typer.Option(True, "--torch/--no-torch", help="Time PyTorch too where "
                                   "it is installed: on its GPU (CUDA events) when it has "
                                   "one, else on the CPU (host clock)."),
    markdown: bool = typer.Option(False, "--markdown", help="Also print the rows as a "
                                  "markdown table (for BENCHMARKS.md)."),
    list_cases: bool = typer.Option(False, "--list", help="List the cases, what their sizes "
                                    "mean and their default shapes, then exit."),
):
    """Time pxvm's kernels for each op and size against numpy and PyTorch, in one run
    (OPS_HELP says more: it is the command's --help)."""
    console = Console(highlight=False, width=None if sys.stdout.isatty() else LOG_WIDTH)
    err_console = Console(stderr=True, highlight=False)
    if list_cases:
        _list_cases(console)
        return
    try:
        cases = bench_ops.select(_names(op_names))
    except ValueError as exc:
        raise typer.BadParameter(str(exc), param_hint="--ops") from None
    size_list = None if sizes is None else [_size(s) for s in sizes.split(",") if s.strip()]
    if sizes is not None and not size_list:
        raise typer.BadParameter("--sizes names no size; e.g. --sizes 1024,4096")
    check_output_file(json_path, "--json")
    check_output_file(plot_path, "--plot")
    chosen = _backend(backend)
    repeats = repeats or (3 if quick else 10)
    if plot_path is not None and _matplotlib_missing():
        err_console.print(f"note: {PLOTS_HINT}", style="yellow", soft_wrap=True, markup=False)
        plot_path = None  # the JSON and the table still come
    peer = bench_ops.torch_peer(use_torch)
    env = bench_ops.environment(chosen, peer)
    err_console.print(f"device: {env['device']}" + (f" ({env['driver']})" if env["driver"] else "")
                      + f"; {env['torch']}", style="dim", soft_wrap=True)

    rng = np.random.default_rng(0)
    work = bench_ops.plan(cases, size_list, quick, chosen.max_tensor_bytes)
    rows = []
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=err_console, transient=True) as progress:
        task = progress.add_task("benchmarking", total=len(work))
        for case, shape in work:
            progress.update(task, description=f"{case.name} {case.label(shape)}")
            rows.append(bench_ops.run_case(case, shape, chosen, repeats, rng, peer))
            progress.advance(task)

    reference = bench_ops.add_percent_of_copy(rows)
    console.print(_table(rows, env, repeats, reference))
    if markdown:
        console.print(_markdown(rows), markup=False, soft_wrap=True)
    if json_path is not None:
        result = {"environment": env,
                  "settings": {"backend": chosen.name, "repeats": repeats, "quick": quick,
                               "ops": [c.name for c in cases], "sizes": size_list,
                               "torch": use_torch},
                  "copy_bandwidth": None if reference is None else {
                      "shape": reference.shape,
                      "per_second": reference.rate(reference.pxvm_seconds)},
                  "rows": [r.as_dict() for r in rows],
                  "failed": sum(r.failed for r in rows)}
        json_path.write_text(json.dumps(result, indent=2) + "\n", encoding="utf-8")
        console.print(f"wrote {json_path}")
    if plot_path is not None:
        try:
            bench_ops.write_plot(rows, plot_path, f"pxvm bench ops: {env['device']}")
        except ImportError:
            err_console.print(f"note: {PLOTS_HINT}", style="yellow", soft_wrap=True,
                              markup=False)
        else:
            console.print(f"wrote {plot_path}")
    failed = [r for r in rows if r.failed]
    if failed:
        for r in failed:
            err_console.print(f"{r.status}: {r.case} {r.shape}: {r.note}", style="red",
                              soft_wrap=True, markup=False)
        err_console.print(f"{len(failed)} of {len(rows)} rows failed", style="bold red")
        raise typer.Exit(1)


def register(app: typer.Typer) -> None:
    bench.command("ops", help=OPS_HELP)(ops)
    bench.command("serve", help=SERVE_HELP)(serve_bench)
    app.add_typer(bench, name="bench")
