"""Uploaded programs' plans, computed in processes of their own: each under a memory and
a time limit, at most a few at a time, killed when the time is up or the client goes
away (the server's other threads keep answering meanwhile)."""

from __future__ import annotations

import json
import multiprocessing
import resource
import threading
import time
import traceback
from http import HTTPStatus

from ..core.errors import PxvmError
from ..vm import load_pxi
from . import plans
from .httpd import MAX_RESPONSE

#: Largest uploaded program (pixels), read from its PNG header before anything is decoded:
#: its plan (the image, the expected result and the buffer, in base64) stays near 17 MB.
UPLOAD_MAX_PIXELS = 1 << 20
#: An upload's planning process: its address space, and the wall-clock time it may take
#: (the slowest program the work budget admits takes a fraction of it on an idle core).
PLAN_MEMORY = 1 << 30
PLAN_SECONDS = 20.0
#: Uploads planned at the same time; one more is answered 503 at once.
PLAN_WORKERS = 2


class ResponseTooLarge(PxvmError):
    """A response over MAX_RESPONSE; answered 413 instead."""


def upload_plan(body: bytes) -> bytes:
    """The plan of an uploaded .pxi as JSON bytes (what the planning process computes)."""
    plan = plans.program_plan(load_pxi(body, max_pixels=UPLOAD_MAX_PIXELS))
    plan["name"] = "uploaded program"
    data = json.dumps(plan).encode()
    if len(data) > MAX_RESPONSE:
        raise ResponseTooLarge(f"the program's plan is {len(data):,} bytes of JSON; responses "
                               f"are limited to {MAX_RESPONSE:,}: run it with `pxvm run`")
    return data


def _plan_worker(conn, body: bytes, memory: int, seconds: float) -> None:
    """The planning process: limit memory and CPU time (a backstop: the server kills it
    first), then send back ("ok", json) or (outcome, message)."""
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    cpu = int(4 * seconds) + 5  # BLAS threads add up CPU time faster than the wall clock
    resource.setrlimit(resource.RLIMIT_CPU, (cpu, cpu + 5))
    try:
        result = ("ok", upload_plan(body))
    except ResponseTooLarge as exc:
        result = ("too_large", str(exc))
    except PxvmError as exc:
        result = ("error", str(exc))
    except MemoryError:
        result = ("memory", (f"planning this program needs more than the {memory >> 20} MiB "
                             "of memory an upload may use; run it with `pxvm run`"))
    except Exception:  # noqa: BLE001 - a bug: the server logs it and answers 500
        result = ("bug", traceback.format_exc())
    conn.send(result)
    conn.close()


class PlanRunner:
    """Runs uploads' planning processes, at most `workers` at a time, each under a memory
    and a time limit, and kills one whose client has gone."""

    def __init__(self, workers=PLAN_WORKERS, memory=PLAN_MEMORY, seconds=PLAN_SECONDS):
        self.memory, self.seconds = memory, seconds
        self._slots = threading.BoundedSemaphore(workers)
        self._context = multiprocessing.get_context("forkserver")
        # the fork server imports this module once; each planning process forks from it
        self._context.set_forkserver_preload([__name__])
        self.running: set = set()  # live planning processes
        self.stopped = 0  # processes killed before their answer (time up, client gone)

    def run(self, body: bytes, client_gone) -> tuple[str, object]:
        """(outcome, payload): ("ok", json bytes), ("error" | "too_large" | "memory" | "bug" |
        "died" | "timeout", message), ("busy", message) or ("gone", None)."""
        if not self._slots.acquire(blocking=False):
            return "busy", "the server is planning other uploads; try again in a moment"
        try:
            return self._run(body, client_gone)
        finally:
            self._slots.release()

    def _run(self, body, client_gone):
        receiver, sender = self._context.Pipe(duplex=False)
        process = self._context.Process(target=_plan_worker, daemon=True,
                                        args=(sender, body, self.memory, self.seconds))
        process.start()
        sender.close()
        self.running.add(process)
        deadline = time.monotonic() + self.seconds
        answered = False
        try:
            while True:
                if receiver.poll(0.05):
                    try:
                        result = receiver.recv()
                        answered = True
                        return result
                    except EOFError:
                        process.join(1)
                        return "died", ("the planning process ended without an answer (exit "
                                        f"code {process.exitcode}); the program may need more "
                                        "memory or time than an upload may use")
                if client_gone():
                    return "gone", None
                if time.monotonic() > deadline:
                    return "timeout", (f"planning this program took more than {self.seconds:g} s "
                                       "and was stopped; run it with `pxvm run`")
        finally:
            if answered:
                process.join(5)  # it exits right after sending its answer
            if process.is_alive():
                process.kill()
                self.stopped += 1
            process.join()
            process.close()
            receiver.close()
            self.running.discard(process)


PLAN_STATUS = {"ok": HTTPStatus.OK, "error": HTTPStatus.BAD_REQUEST,
               "too_large": HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
               "memory": HTTPStatus.REQUEST_ENTITY_TOO_LARGE,
               "timeout": HTTPStatus.SERVICE_UNAVAILABLE, "died": HTTPStatus.SERVICE_UNAVAILABLE,
               "busy": HTTPStatus.SERVICE_UNAVAILABLE,
               "bug": HTTPStatus.INTERNAL_SERVER_ERROR}
