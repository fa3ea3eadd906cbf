"""pxvm's server as Ray Serve replicas behind one OpenAI-compatible endpoint (the optional
`cluster` extra: pip install 'pxvm[cluster]').

Each replica is a whole pxvm server: its own Engine (continuous batching) and the same
ASGI app as `pxvm serve --model` (every route, SSE streaming, the Guard's checks), built
in the replica once its model has loaded. Ray Serve's HTTP proxy is the one ingress; it
sends each request to the less loaded of two replicas picked at random (Serve's default
power-of-two-choices router, by requests in flight). Where the cluster has GPUs, each
replica takes one (Ray sets CUDA_VISIBLE_DEVICES for it); elsewhere one CPU each.

Health: a replica joins the routing only once its model has loaded (the constructor
loads it), and Ray's health check (`check_health`) restarts one whose engine thread has
stopped; a replica that dies is replaced by Ray while the others keep serving. Every
replica whose engine runs publishes its metrics each second to a small named actor (the
board); /health through the ingress counts the replicas heard from in the last few
seconds, and /metrics gives every replica's metrics labelled replica="<id>" (each answer
names the replica that served it in the X-Pxvm-Replica header). Ray's own view is
`serve status`, and its per-replica request metrics are on its metrics port.

Ray is imported by the functions that need it (an optional extra: importing this module
needs no Ray, `available` says whether it is there)."""

from __future__ import annotations

import importlib.util
import os
import socket
import threading
import time
from typing import TYPE_CHECKING

from ..core.errors import PxvmError
from .app import create_app
from .metrics import merge_labelled
from .server import model_service

if TYPE_CHECKING:
    from ray.serve import Application

#: the Serve application's name
APP = "pxvm"
#: the deployment's name (in `serve status`, and in a Serve config's `deployments:`)
DEPLOYMENT = "PxvmReplica"
#: response header naming the replica that answered
REPLICA_HEADER = "x-pxvm-replica"
#: the board's actor name and namespace (one per Ray cluster and application)
BOARD, BOARD_NAMESPACE = f"{APP}-replicas", "pxvm"
#: seconds between a replica's reports to the board, and after which a replica not
#: heard from counts as down (Ray's own health check takes longer to notice)
REPORT_SECONDS, STALE_SECONDS = 1.0, 5.0


class ClusterError(PxvmError):
    """A cluster that cannot hold the replicas asked for."""


def available() -> bool:
    """Whether Ray Serve is installed (pip install 'pxvm[cluster]')."""
    return importlib.util.find_spec("ray") is not None and \
        importlib.util.find_spec("ray.serve") is not None


class PxvmReplica:
    """One replica: a loaded model and pxvm's API for it (made a Serve ingress, whose app
    is built once the model is loaded, by application())."""

    def __init__(self, model: str, backend: str = "auto", max_batch: int = 64,
                 max_waiting: int = 256, api_key: str | None = None,
                 loopback_only: bool = True):
        self.service = model_service(model, backend=backend, max_batch=max_batch,
                                     max_waiting=max_waiting)
        self.service.load()
        if self.service.load_error:  # Serve reports it and does not route here
            raise ClusterError(f"the model failed to load: {self.service.load_error}")
        self.api_key, self.loopback_only = api_key, loopback_only
        from ray import serve
        self.replica = serve.get_replica_context().replica_id.unique_id
        self.board = _board()
        self.stopped = threading.Event()
        self._report(wait=True)  # counted by /health before Serve routes here
        threading.Thread(target=self._reports, name="pxvm-board", daemon=True).start()

    def __serve_build_asgi_app__(self):
        app = create_app(self.service, api_key=self.api_key, loopback_only=self.loopback_only,
                         replicas=_Replicas(self))
        return _NamedReplica(app, self.replica)

    def check_health(self) -> None:
        if not self.service.engine.alive:
            raise ClusterError("the engine's thread has stopped")

    def _report(self, wait: bool = False) -> None:
        import ray
        ref = self.board.report.remote(self.replica, self.service.metrics.render())
        if wait:
            ray.get(ref, timeout=30)

    def _reports(self) -> None:
        while not self.stopped.wait(REPORT_SECONDS):
            if not self.service.engine.alive:  # silent: counted as down once stale
                continue
            try:
                self._report()
            except Exception:  # noqa: BLE001 - the board is gone: the cluster is stopping
                return

    def __del__(self):
        self.stopped.set()
        # ends every open request ("cancelled"), so streams end with [DONE], not a cut
        self.service.close()


class _Board:
    """Every replica's last report: its metrics text, and when it came (a Ray actor)."""

    def __init__(self):
        self.reports: dict[str, tuple[float, bytes]] = {}

    def report(self, replica: str, metrics: bytes) -> None:
        self.reports[replica] = (time.monotonic(), metrics)

    def current(self) -> dict[str, bytes]:
        """The reports of the replicas heard from within STALE_SECONDS."""
        now = time.monotonic()
        self.reports = {r: (t, m) for r, (t, m) in self.reports.items()
                        if now - t < STALE_SECONDS}
        return {r: m for r, (_, m) in self.reports.items()}


def _board():
    """The cluster's board, made by the first replica that asks (detached: it outlives
    any one replica; stop() ends it)."""
    import ray
    return ray.remote(num_cpus=0)(_Board).options(
        name=BOARD, namespace=BOARD_NAMESPACE, lifetime="detached", get_if_exists=True,
        max_restarts=-1).remote()


class _Replicas:
    """/health and /metrics for every replica, answered by any of them from the board
    (with its own metrics as they are now)."""

    def __init__(self, replica: PxvmReplica):
        self.replica = replica

    async def _current(self) -> dict[str, bytes]:
        reports = await self.replica.board.current.remote()
        reports[self.replica.replica] = self.replica.service.metrics.render()
        return reports

    async def health(self) -> dict:
        up = sorted(await self._current())
        return {"status": "ok", "replicas_up": len(up), "replicas": up}

    async def metrics(self) -> bytes:
        return merge_labelled(await self._current())


class _NamedReplica:
    """The app, with X-Pxvm-Replica on every answer (which replica served it)."""

    def __init__(self, app, replica: str):
        self.app, self.header = app, (REPLICA_HEADER.encode(), replica.encode())

    async def __call__(self, scope, receive, send):
        async def named(message):
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), self.header]}
            await send(message)
        return await self.app(scope, receive, named)


def replica_resources() -> dict:
    """What each replica reserves: one GPU where the cluster has GPUs, else one CPU."""
    import ray
    gpus = ray.cluster_resources().get("GPU", 0) if ray.is_initialized() else 0
    return {"num_gpus": 1} if gpus >= 1 else {"num_cpus": 1}


def application(model: str, replicas: int, backend: str = "auto", max_batch: int = 64,
                max_waiting: int = 256, api_key: str | None = None,
                loopback_only: bool = True, resources: dict | None = None) -> Application:
    """`replicas` pxvm servers of the GGUF file at `model` (the same path on every node)
    as one Serve application; `resources` each (default: replica_resources())."""
    from ray import serve
    deployment = serve.deployment(
        serve.ingress()(PxvmReplica), name=DEPLOYMENT, num_replicas=replicas,
        ray_actor_options=resources or replica_resources(),
        # the engine's own queue answers 429 past max_waiting: Serve sends a replica as
        # many, and holds at most max_waiting more in its own queue (503 past that)
        max_ongoing_requests=max_batch + max_waiting, max_queued_requests=max_waiting)
    return deployment.bind(model, backend, max_batch, max_waiting, api_key, loopback_only)


def build_app(args: dict) -> Application:
    """The application builder of a Serve config (`import_path: pxvm.serve.cluster:build_app`,
    docs/serve-cluster.yaml): `args` are application()'s arguments but `resources`
    (set a deployment's ray_actor_options in the config instead)."""
    known = {"model", "replicas", "backend", "max_batch", "max_waiting", "api_key",
             "loopback_only"}
    unknown = sorted(set(args) - known)
    if unknown or "model" not in args:
        raise ClusterError(f"pxvm's Serve application takes args {sorted(known)} "
                           f"(model is required), not {unknown or 'none without model'}")
    return application(**{"replicas": 1, **args})


def start(model: str, replicas: int, host: str, port: int, **options) -> str:
    """Start (or join, with RAY_ADDRESS) a Ray cluster and serve `replicas` replicas of
    `model` on host:port (where Serve already runs on a joined cluster, its own HTTP
    options stay); returns the endpoint's URL once every replica is ready."""
    import ray
    from ray import serve
    if not ray.is_initialized():
        _check_address(os.environ.get("RAY_ADDRESS", ""))
        try:
            ray.init(logging_level="warning")
        except ConnectionError as exc:
            raise ClusterError(f"cannot join the Ray cluster: {exc}") from None
        except Exception as exc:  # noqa: BLE001 - Ray's own start-up failures are plain
            raise ClusterError(f"Ray did not start (its logs are under /tmp/ray): {exc}") \
                from None
    gpus = int(ray.cluster_resources().get("GPU", 0))
    if gpus and replicas > gpus:
        raise ClusterError(f"--replicas {replicas} asks for one GPU each, but the Ray "
                           f"cluster has {gpus}; give at most --replicas {gpus}")
    port = port or _free_port(host)  # the URL must name the port the proxy listens on
    serve.start(http_options={"host": host, "port": port})
    try:
        serve.run(application(model, replicas, **options), name=APP, route_prefix="/")
    except RuntimeError as exc:  # a replica that failed to start; Ray logged its error
        raise ClusterError(f"the replicas did not start (their error is logged above): "
                           f"{exc}") from None
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}"


def _check_address(address: str) -> None:
    """A RAY_ADDRESS of host:port must answer: Ray itself would wait minutes for it."""
    host, _, port = address.rpartition(":")
    if not host or "://" in address or not port.isdigit():
        return  # unset, "auto", or a ray:// client address: Ray's own checks
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=5).close()
    except OSError as exc:
        raise ClusterError(f"RAY_ADDRESS={address} does not answer ({exc.strerror or exc}); "
                           "start the cluster there (ray start --head) or unset RAY_ADDRESS "
                           "to start one here") from None


def _free_port(host: str) -> int:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


def stop() -> None:
    """Take pxvm's application down (its replicas close their engines: open streams end)
    and leave Ray: a cluster this process started stops, a joined one keeps running."""
    import ray
    from ray import serve
    if not ray.is_initialized():
        return
    try:
        serve.delete(APP)
        try:
            ray.kill(ray.get_actor(BOARD, namespace=BOARD_NAMESPACE))
        except ValueError:  # no replica made it
            pass
    finally:
        ray.shutdown()
