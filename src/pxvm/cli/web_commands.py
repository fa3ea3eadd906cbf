"""`pxvm serve`: the local web page that runs pxvm's kernels and .pxi programs with the
browser's WebGPU (see pxvm/web), and with --model an OpenAI-compatible API for a GGUF
model (see pxvm/serve)."""

from __future__ import annotations

import signal
import threading
import time
import webbrowser
from pathlib import Path

import typer

from ..core.selection import names
from ..llm import open_model_file
from ..serve import cluster
from ..serve.page import Page
from ..web.weights import WeightTiles
from ..serve.server import HttpServer, connections_for, model_service
from ..web.httpd import MAX_CONNECTIONS, is_loopback

MODEL_HELP = ("Also serve this .gguf model (or the folder of one packed as pixels) through "
              "an OpenAI-compatible API (/v1/chat/completions, /v1/completions, /v1/models, "
              "/health, /metrics), batching concurrent requests; the weight viewer "
              "(/weights) shows it.")
BACKEND_HELP = "Where the model runs: " + ", ".join(names()) + "."
REPLICAS_HELP = ("Serve the --model as this many replicas under Ray Serve behind one "
                 "OpenAI-compatible endpoint: one GPU each where the Ray cluster has GPUs, "
                 "else one CPU each (needs pip install 'pxvm[cluster]'; joins the cluster "
                 "at RAY_ADDRESS, else starts one on this machine). Without it, one process "
                 "serves.")
API_KEY_HELP = ("Require this key from API clients (sent as 'Authorization: Bearer <key>'); "
                "give it whenever --host exposes the server. Also read from PXVM_API_KEY.")


def serve(
    port: int = typer.Option(8765, "--port", min=0, max=65535,
                             help="Port to listen on (0 picks a free one)."),
    host: str = typer.Option("127.0.0.1", "--host",
                             help="Address to bind; loopback unless you mean to expose it."),
    open_browser: bool = typer.Option(False, "--open", help="Open the page in the default browser."),
    model: Path | None = typer.Option(None, "--model", help=MODEL_HELP),
    backend: str = typer.Option("auto", "--backend", help=BACKEND_HELP),
    api_key: str | None = typer.Option(None, "--api-key", envvar="PXVM_API_KEY",
                                       help=API_KEY_HELP, show_envvar=False),
    max_batch: int = typer.Option(64, "--max-batch", min=1, max=4096,
                                  help="Sequences decoded together at most."),
    max_waiting: int = typer.Option(256, "--max-waiting", min=1, max=65536,
                                    help="Requests queued at most; more are answered 429."),
    replicas: int | None = typer.Option(None, "--replicas", min=1, max=1024, help=REPLICAS_HELP),
):
    """Serve the pxvm web page: WebGPU adapter info, the kernel conformance suite,
    benchmarks, and .pxi programs run on the browser's GPU next to the CPU executor; with
    --model, an OpenAI-compatible API for that model."""
    if backend.lower() not in names():
        raise typer.BadParameter(f"--backend must be one of {', '.join(names())}, not {backend!r}")
    if api_key is not None and not api_key.strip():
        raise typer.BadParameter("--api-key is empty; give a key or leave the option out")
    if replicas is not None:
        return _serve_replicas(model, replicas, host, port, backend, api_key, max_batch,
                               max_waiting, open_browser)
    service = None
    if model is not None:
        open_model_file(str(model))  # what is not a model fails here, before listening
        service = model_service(str(model), backend=backend, max_batch=max_batch,
                                max_waiting=max_waiting)
    loopback = is_loopback(host)
    try:
        server = HttpServer(service, host, port, api_key=api_key, loopback_only=loopback,
                            page=Page(weights=WeightTiles(str(model) if model else None),
                                      llm_model=str(model) if model is not None else None),
                            max_connections=connections_for(max_batch, max_waiting)
                            if service else MAX_CONNECTIONS)
    except OSError as exc:
        typer.secho(f"error: cannot listen on {host}:{port}: {exc.strerror or exc}", err=True, fg="red")
        raise typer.Exit(1) from None
    if not loopback:
        exposed = "the page runs GPU work on request"
        if service is not None:
            exposed += "; the API runs the model" + ("" if api_key else " for anyone (give --api-key)")
        typer.secho(f"warning: listening on {host}, reachable from other machines; {exposed}",
                    err=True, fg="yellow")
    typer.echo(f"pxvm page at {server.url}/  (Ctrl-C stops)")
    if service is not None:
        typer.echo(f"OpenAI API at {server.url}/v1 (loading {model.name}; /health says when "
                   "it is ready)")
        threading.Thread(target=_load, args=(service, server), name="pxvm-load",
                         daemon=True).start()
    if open_browser:
        threading.Timer(0.3, webbrowser.open, args=(server.url + "/",)).start()
    server.serve_forever()
    if service is not None and service.load_error:
        typer.secho(f"error: {service.load_error}", err=True, fg="red")
        raise typer.Exit(1)
    typer.echo("stopped")


def _serve_replicas(model, replicas, host, port, backend, api_key, max_batch, max_waiting,
                    open_browser) -> None:
    """pxvm serve --replicas N: the API only (the page is not served), until Ctrl-C."""
    if model is None:
        raise typer.BadParameter("--replicas serves a model's API; give --model too")
    if open_browser:
        raise typer.BadParameter("--open shows the page, which --replicas does not serve")
    if not cluster.available():
        typer.secho("error: --replicas runs the server under Ray Serve, which is not "
                    "installed; pip install 'pxvm[cluster]'", err=True, fg="red")
        raise typer.Exit(1)
    open_model_file(str(model))  # what is not a model fails here, before Ray starts
    loopback = is_loopback(host)
    if not loopback:
        typer.secho(f"warning: listening on {host}, reachable from other machines; the API "
                    "runs the model" + ("" if api_key else " for anyone (give --api-key)"),
                    err=True, fg="yellow")
    count = f"{replicas} replica" + ("s" if replicas > 1 else "")
    typer.echo(f"starting {count} of {model.name} under Ray Serve")
    try:
        url = cluster.start(str(model.resolve()), replicas, host, port, backend=backend,
                            max_batch=max_batch, max_waiting=max_waiting, api_key=api_key,
                            loopback_only=loopback)
        # SIGTERM ends as Ctrl-C does: the replicas close their engines, Ray stops (set
        # after Ray's start, whose own handler would abort the process)
        signal.signal(signal.SIGTERM, _interrupt)
        typer.echo(f"OpenAI API at {url}/v1 on {count} (`serve status` shows them; "
                   "Ctrl-C stops)")
        while True:
            time.sleep(1)
    except KeyboardInterrupt:
        typer.echo("stopping")
    except cluster.ClusterError as exc:
        typer.secho(f"error: {exc}", err=True, fg="red")
        raise typer.Exit(1) from None
    finally:
        cluster.stop()
    typer.echo("stopped")


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _load(service, server) -> None:
    service.load()
    if service.load_error:
        server.server.should_exit = True
    else:
        typer.echo(f"model ready: {service.model_id} on {service.engine.model.backend_name}")


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
