"""`pxvm bench serve`: concurrent streaming clients against an OpenAI-compatible server
(pxvm.serve.bench), pxvm's own started here or another at a loopback --url."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from ..core.selection import names
from ..llm import GGUFModelFile
from ..llm.tokenizer import Tokenizer
from ..serve import bench
from ..serve.bench import MAX_CONCURRENCY
from ..serve.server import HttpServer, connections_for, model_service
from .output_paths import check_output_file

SERVE_HELP = (
    "Drive an OpenAI-compatible server with N concurrent streaming clients (the official "
    "openai client), as vLLM's serving benchmark: each request a prompt of "
    "--input-len random token ids asking for --output-len tokens (ignore_eos). For each N "
    "of --concurrency, --requests requests (or those started within --max-seconds); "
    "reports output tokens/s, TTFT, TPOT and ITL p50/p99 as a table, --json and a --plot "
    "against N.\n\n"
    "Without --url, pxvm's own server runs the --model in this process; with --url (on "
    "this machine only), another server, e.g. llama-server, serves it and --model gives "
    "the tokenizer the prompts are drawn from. --processes shares each level's streams "
    "among several client processes, where one cannot parse the tokens as fast as the "
    "server sends them.\n\n"
    "Example: pxvm bench serve --model m.gguf --concurrency 1,16,64 --json s.json --plot s.png")


def _concurrency(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise typer.BadParameter(f"--concurrency takes whole numbers like 1,16,64, not "
                                 f"{text!r}") from None
    if not values or any(not 1 <= v <= MAX_CONCURRENCY for v in values):
        raise typer.BadParameter(f"--concurrency values must be 1..{MAX_CONCURRENCY}, not {text!r}")
    return values


def _ms(stats: dict, q: str) -> str:
    value = stats.get(q)
    return "-" if value is None else f"{value:,.1f}"


def serve_bench(
    model: Path = typer.Option(..., "--model", "-m", help="The .gguf model served (and "
                               "whose tokenizer draws the prompts)."),
    url: str = typer.Option(None, "--url", help="A running server's address on this "
                            "machine (e.g. http://127.0.0.1:8080); default: pxvm's own."),
    backend: str = typer.Option("auto", help="Where pxvm's own server runs the model: "
                                + ", ".join(names()) + "."),
    concurrency: str = typer.Option("1,16,64", "--concurrency", help="Comma-separated "
                                    "numbers of streams in flight, one level each."),
    requests: int = typer.Option(None, "--requests", min=1, max=100_000,
                                 help="Requests per level (default: 4 x N)."),
    input_len: int = typer.Option(128, "--input-len", min=1, max=1 << 20,
                                  help="Prompt tokens of each request."),
    output_len: int = typer.Option(128, "--output-len", min=1, max=1 << 20,
                                   help="Tokens each request generates."),
    request_rate: float = typer.Option(None, "--request-rate", min=0.001,
                                       help="Start requests at this rate (Poisson, per "
                                       "second), at most N at once (default: all at once)."),
    max_seconds: float = typer.Option(300.0, "--max-seconds", min=1.0, max=3600.0,
                                      help="No request of a level starts after this."),
    processes: int = typer.Option(1, "--processes", min=1, max=64, help="Client processes "
                                  "sharing each level's streams (one Python process parses "
                                  "a few thousand streamed tokens a second at most; e.g. one "
                                  "per 32 streams past a few thousand tokens/s)."),
    api_key: str = typer.Option("none", "--api-key", envvar="PXVM_API_KEY",
                                show_envvar=False, help="Bearer key for --url servers."),
    json_path: Path = typer.Option(None, "--json", help="Write the levels to this file."),
    plot_path: Path = typer.Option(None, "--plot", help="Draw output tokens/s, TTFT and "
                                   "TPOT against N to this PNG (needs matplotlib)."),
):
    """Concurrent streaming clients against an OpenAI-compatible server (SERVE_HELP)."""
    console = Console(highlight=False, width=None if sys.stdout.isatty() else 170)
    err = Console(stderr=True, highlight=False)
    levels_n = _concurrency(concurrency)
    check_output_file(json_path, "--json")
    check_output_file(plot_path, "--plot")
    try:
        import openai  # noqa: F401
    except ImportError:
        raise typer.BadParameter("the openai client is not installed: pip install openai") from None
    file = GGUFModelFile(str(model))
    tokenizer = Tokenizer(file.metadata, source=str(model))
    settings = bench.Settings(levels_n, requests or 0, input_len, output_len, request_rate,
                              max_seconds)
    server = None
    if url is None:
        if backend.lower() not in names():
            raise typer.BadParameter(f"--backend must be one of {', '.join(names())}")
        service = model_service(str(model), backend=backend, max_batch=max(levels_n))
        server = HttpServer(service, max_connections=connections_for(max(levels_n), 256)).start()
        err.print(f"loading {model.name} for pxvm's server at {server.url}")
        server.load().join()
        if service.load_error:
            server.stop()
            raise bench.BenchError(service.load_error)
        base, model_id = server.url + "/v1", service.model_id
        about = {"server": "pxvm", "backend": service.engine.model.backend_name}
    else:
        base, model_id = bench.check_loopback(url), model.name
        about = {"server": url}
    about["client_processes"] = processes
    table = Table(title=f"pxvm bench serve: {model.name}, {input_len} in / {output_len} out")
    for column in ("N", "requests", "failed", "output tok/s", "TTFT p50", "TTFT p99",
                   "TPOT p50", "TPOT p99", "ITL p50", "ITL p99"):
        table.add_column(column, justify="right")
    try:
        results = []
        for n in levels_n:
            level_settings = bench.Settings(**{**vars(settings), "concurrency": [n],
                                               "requests": requests or 4 * n})
            err.print(f"N = {n}: {level_settings.requests} requests", style="dim")
            results += bench.run(level_settings, tokenizer, base, model_id, api_key,
                                 processes=processes)
    finally:
        if server is not None:
            server.stop()
            server.service.close()
    for lv in results:
        table.add_row(str(lv.concurrency), str(lv.requests), str(lv.failed),
                      f"{lv.output_tokens_per_s:,.1f}", _ms(lv.ttft_ms, "p50"),
                      _ms(lv.ttft_ms, "p99"), _ms(lv.tpot_ms, "p50"), _ms(lv.tpot_ms, "p99"),
                      _ms(lv.itl_ms, "p50"), _ms(lv.itl_ms, "p99"))
    console.print(table)
    console.print("times in ms", style="dim")
    for lv in results:
        for message in lv.errors:
            err.print(f"N = {lv.concurrency}: {message}", style="red", markup=False)
    if json_path is not None:
        json_path.write_text(json.dumps(bench.as_json(settings, results, about), indent=2)
                             + "\n", encoding="utf-8")
        console.print(f"wrote {json_path}")
    if plot_path is not None:
        try:
            bench.write_plot(results, plot_path, f"pxvm bench serve: {model.name}")
        except ImportError:
            err.print("note: matplotlib is not installed, so no plot is drawn: pip install "
                      "'pxvm[plots]'", style="yellow")
        else:
            console.print(f"wrote {plot_path}")
    if any(lv.failed for lv in results):
        raise typer.Exit(1)
