"""`pxvm serve`: the local web page that runs pxvm's kernels and .pxi programs with the
browser's WebGPU (see pxvm/web)."""

from __future__ import annotations

import threading
import webbrowser

import typer

from ..web.httpd import is_loopback
from ..web.server import make_server


def serve(
    port: int = typer.Option(8765, "--port", min=0, max=65535,
                             help="Port to listen on (0 picks a free one)."),
    host: str = typer.Option("127.0.0.1", "--host",
                             help="Address to bind; loopback unless you mean to expose it."),
    open_browser: bool = typer.Option(False, "--open", help="Open the page in the default browser."),
):
    """Serve the pxvm web page: WebGPU adapter info, the kernel conformance suite,
    benchmarks, and .pxi programs run on the browser's GPU next to the CPU executor."""
    try:
        server = make_server(host, port)
    except OSError as exc:
        typer.secho(f"error: cannot listen on {host}:{port}: {exc.strerror or exc}", err=True, fg="red")
        raise typer.Exit(1) from None
    if not is_loopback(server.server_address[0]):
        typer.secho(f"warning: listening on {host}, reachable from other machines; the page "
                    "runs GPU work on request", err=True, fg="yellow")
    typer.echo(f"pxvm page at {server.url}  (Ctrl-C stops)")
    if open_browser:
        threading.Timer(0.3, webbrowser.open, args=(server.url,)).start()
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        typer.echo("stopped")
    finally:
        server.server_close()


def register(app: typer.Typer) -> None:
    app.command("serve")(serve)
