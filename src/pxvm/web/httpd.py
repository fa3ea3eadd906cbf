"""A bounded HTTP/1.1 server, the plumbing of `pxvm serve` (server.py has its routes):
every refusal a JSON error with a status line, responses capped in size, reads and
bodies limited in time, connections limited in number and closed without losing the
answer, requests answered only when addressed to loopback names (when bound there), work
started only for requests from no other site's page (`_same_origin`), and paths parsed so
that nothing that looks like traversal gets through."""

from __future__ import annotations

import hmac
import io
import ipaddress
import json
import logging
import secrets
import select
import socket
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

from ..core.errors import shortened

log = logging.getLogger("pxvm.web")

#: Largest response body sent.
MAX_RESPONSE = 32 << 20
#: Connections served at once; one more is answered 503 and closed.
MAX_CONNECTIONS = 64
#: A connection's reads and writes time out after this long without progress; a request's
#: line and headers must arrive within HEADER_SECONDS in all (an idle keep-alive connection
#: is closed then too), its body within BODY_SECONDS, so that clients sending a byte now and
#: then cannot hold the connection slots.
SOCKET_SECONDS = 30.0
HEADER_SECONDS = 10.0
BODY_SECONDS = 20.0
#: How long a closing connection waits for the client to close its end, and how much of
#: what it still sends is read (and dropped) meanwhile.
LINGER_SECONDS = 2.0
DRAIN_LIMIT = 16 << 20
#: The request header that carries the server's session token (BoundedServer.session).
#: Browsers send a custom header cross-site only after a CORS preflight, which this server
#: never grants; and only a page of this server's own origin can read the token.
SESSION_HEADER = "X-Pxvm-Session"
#: Sec-Fetch-Site values of requests that did not come from another site's page.
SAME_SITE_FETCHES = ("same-origin", "none")


def is_loopback(host: str) -> bool:
    """Whether `host` (an address or the name localhost) is a loopback address."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class DeadlineReader(io.RawIOBase):
    """A socket's reads, each waiting no longer than what is left until `deadline`
    (time.monotonic()); past it a read raises TimeoutError."""

    def __init__(self, sock: socket.socket):
        super().__init__()
        self.sock = sock
        self.deadline = float("inf")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        left = self.deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("the request did not arrive in time")
        self.sock.settimeout(min(left, SOCKET_SECONDS))
        try:
            return self.sock.recv_into(buffer)
        finally:
            self.sock.settimeout(SOCKET_SECONDS)  # writes keep their own limit


class BoundedHandler(BaseHTTPRequestHandler):
    """Request plumbing for a subclass's do_GET / do_POST (which run their work through
    `_guarded`)."""

    protocol_version = "HTTP/1.1"
    timeout = SOCKET_SECONDS  # applied to the connection's socket: no read or write waits longer

    # ---- plumbing ------------------------------------------------------------------
    def log_message(self, fmt, *args):
        log.info("%s %s", self.address_string(), fmt % args)

    def setup(self):
        super().setup()
        self.rfile.close()  # the socket's own reader, unused: reads go through the deadline
        self.reader = DeadlineReader(self.connection)
        self.rfile = io.BufferedReader(self.reader)

    def handle_one_request(self):
        # the request line and headers (or, on a kept-alive connection, the next request)
        # within HEADER_SECONDS; BaseHTTPRequestHandler closes the connection past it
        self.reader.deadline = time.monotonic() + HEADER_SECONDS
        try:
            super().handle_one_request()
        except ConnectionError:  # reset or broken pipe: the client has gone
            self.close_connection = True

    def finish(self):
        try:
            super().finish()
        except OSError:  # the answer could not be flushed: the client has gone
            pass

    def parse_request(self) -> bool:
        if not super().parse_request():
            return False
        if self.request_version == "HTTP/0.9":  # its answers have no status line
            self.send_error(HTTPStatus.BAD_REQUEST, "HTTP/0.9 requests are not served; use "
                            "HTTP/1.0 or HTTP/1.1")
            return False
        return True

    def send_error(self, code, message=None, explain=None):
        """The standard errors (malformed requests, unknown methods, long lines) as JSON,
        always with a status line; unknown methods get 405 and the methods served."""
        if self.request_version in ("HTTP/0.9", ""):
            self.request_version = "HTTP/1.0"  # so that the status line is written
        if code == HTTPStatus.NOT_IMPLEMENTED:
            code, message = HTTPStatus.METHOD_NOT_ALLOWED, (
                f"method {shortened(str(self.command))!r} is not served; use GET, HEAD or POST")
        elif code == HTTPStatus.HTTP_VERSION_NOT_SUPPORTED:
            code = HTTPStatus.BAD_REQUEST
        self.close_connection = True
        try:
            self._error(code, message or HTTPStatus(code).phrase)
        except OSError:
            pass  # the client has gone

    def _send(self, status: int, body: bytes, content_type: str = "text/plain; charset=utf-8"):
        if len(body) > MAX_RESPONSE:  # nothing served is meant to come near it
            log.error("refused to send a response of %d bytes for %s", len(body), self.path)
            status, content_type = HTTPStatus.INTERNAL_SERVER_ERROR, "application/json"
            body = json.dumps({"error": f"the response would be {len(body):,} bytes, over the "
                                        f"server's limit of {MAX_RESPONSE:,}"}).encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("Cache-Control", "no-store")
        self.send_header("X-Content-Type-Options", "nosniff")
        if status == HTTPStatus.METHOD_NOT_ALLOWED:
            self.send_header("Allow", "GET, HEAD, POST")
        if status == HTTPStatus.SERVICE_UNAVAILABLE:
            self.send_header("Retry-After", "5")
        if self.close_connection:
            self.send_header("Connection", "close")
        # the page needs nothing from elsewhere; this keeps it that way
        self.send_header("Content-Security-Policy",
                         "default-src 'self'; img-src 'self' data: blob:; style-src 'self'; "
                         "script-src 'self'; connect-src 'self'")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _discard(self, length: int) -> None:
        self.reader.deadline = time.monotonic() + BODY_SECONDS
        while length > 0:
            chunk = self.rfile.read(min(length, 1 << 16))
            if not chunk:
                break
            length -= len(chunk)

    def _json(self, obj, status: int = 200):
        self._send(status, json.dumps(obj).encode(), "application/json")

    def _error(self, status: int, message: str):
        self._json({"error": message}, status)

    def _has_body(self) -> bool:
        return bool(self.headers.get("Transfer-Encoding")) or \
            self.headers.get("Content-Length", "0").strip() not in ("", "0")

    def _host_allowed(self) -> bool:
        """When bound to loopback, answer only requests addressed to loopback names, so a
        web page elsewhere cannot reach this server through DNS rebinding."""
        if not is_loopback(self.server.server_address[0]):
            return True
        host = (self.headers.get("Host") or "").strip()
        if host.startswith("["):
            name = host[1:host.find("]")] if "]" in host else host
        else:
            name = host.rsplit(":", 1)[0]
        return is_loopback(name)

    def _cross_site(self) -> str | None:
        """Why the request comes from another site's page, or None: a browser names the
        page's origin in Origin and how it relates to ours in Sec-Fetch-Site (clients that
        are not browsers send neither)."""
        origin = self.headers.get_all("Origin") or []
        own = "http://" + (self.headers.get("Host") or "").strip().lower()
        if origin and (len(origin) > 1 or origin[0].strip().lower() != own):
            return f"Origin {shortened(', '.join(origin))!r} is not this server's ({own})"
        site = self.headers.get_all("Sec-Fetch-Site") or []
        if site and (len(site) > 1 or site[0].strip().lower() not in SAME_SITE_FETCHES):
            return f"Sec-Fetch-Site is {shortened(', '.join(site))!r}"
        return None

    def _same_origin(self, token: bool) -> bool:
        """Whether the request may start work: it comes from no other site's page and, when
        `token`, carries the session token (which only this server's page can read, from
        /api/info). Refuses it with 403 otherwise."""
        why = self._cross_site()
        if why is None and token:
            sent = (self.headers.get(SESSION_HEADER) or "").encode("latin-1", "replace")
            if not hmac.compare_digest(sent, self.server.session.encode()):
                why = f"the {SESSION_HEADER} header does not carry this server's session token"
        if why is None:
            return True
        self.close_connection = True  # a POST's body is never read
        self._error(HTTPStatus.FORBIDDEN, f"cross-site request refused: {why}; use the page "
                    "this server serves")
        return False

    def _route(self):
        """(segments, query) of the request path, or None after refusing it."""
        if not self._host_allowed():
            self._error(HTTPStatus.FORBIDDEN, "this server answers only requests to localhost")
            return None
        try:
            parts = urlsplit(self.path)
        except ValueError:
            self._error(HTTPStatus.BAD_REQUEST, f"malformed request path {shortened(self.path)!r}")
            return None
        raw = parts.path
        path = unquote(raw)
        # decode twice so %252e%252e is caught too; any traversal-looking path is refused
        twice = unquote(path)
        if (not raw.startswith("/") or raw.startswith("//") or "\\" in twice or "\x00" in twice
                or any(seg in ("..", ".") for seg in twice.split("/"))):
            self._error(HTTPStatus.FORBIDDEN, "path refused")
            return None
        segments = [s for s in path.split("/") if s]
        return segments, parse_qs(parts.query)

    def _guarded(self, handler) -> None:
        """Run a request's handler: a client gone mid-answer ends the connection; any other
        exception is a bug, logged and answered 500 (never a dropped connection)."""
        try:
            handler()
        except (BrokenPipeError, ConnectionResetError):
            self.close_connection = True
        except TimeoutError:
            raise  # handle_one_request ends the connection
        except Exception:  # a bug: answer and log it
            log.exception("error answering %s %s", self.command, shortened(self.path))
            self.close_connection = True
            try:
                self._error(HTTPStatus.INTERNAL_SERVER_ERROR, "internal error (logged by the server)")
            except OSError:
                pass


    def do_HEAD(self):
        self.do_GET()


    def _content_length(self) -> int | None:
        """The declared body length, or None after refusing the request."""
        if self.headers.get("Transfer-Encoding"):
            self.close_connection = True
            self._error(HTTPStatus.LENGTH_REQUIRED, "chunked bodies are not accepted; send the "
                        "upload with a Content-Length")
            return None
        values = self.headers.get_all("Content-Length") or []
        text = values[0].strip() if len(values) == 1 else ""
        if not (text.isascii() and text.isdigit()) or len(text) > 18:
            self.close_connection = True
            self._error(HTTPStatus.LENGTH_REQUIRED, "one Content-Length header with the body's "
                        "size in bytes is required")
            return None
        return int(text)

    def _read_body(self, length: int) -> bytes | None:
        """The body, or None after answering a client that sent less than it declared
        (it closed its end, or did not send it all within BODY_SECONDS)."""
        self.reader.deadline = time.monotonic() + BODY_SECONDS
        parts, got, late = [], 0, False
        try:
            while got < length:
                chunk = self.rfile.read1(min(length - got, 1 << 16))
                if not chunk:
                    break
                parts.append(chunk)
                got += len(chunk)
        except TimeoutError:
            late = True
        if got < length:
            self.close_connection = True
            why = f"did not arrive within {BODY_SECONDS:g} s" if late else "ended"
            self._error(HTTPStatus.BAD_REQUEST, f"the body {why}: {got:,} of the {length:,} "
                        "bytes its Content-Length declares")
            return None
        return b"".join(parts)


    def _client_gone(self) -> bool:
        """Whether the client has closed its end (checked while its upload is planned)."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            return bool(readable) and self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True


class BoundedServer(ThreadingHTTPServer):
    """A thread per connection, at most `max_connections` at once (one more is answered
    503 at once), and lingering closes; IPv6 when the address is one."""

    daemon_threads = True
    max_connections = MAX_CONNECTIONS
    # the listen backlog: socketserver's 5 drops the connections a page opens at once past
    # it, each then retried a second later, and past the cap they are answered 503 anyway
    request_queue_size = 2 * MAX_CONNECTIONS

    def __init__(self, address, handler):
        host = address[0]
        if ":" in host:
            self.address_family = socket.AF_INET6
        super().__init__(address, handler)
        self._connections = 0
        self._count_lock = threading.Lock()
        self.session = secrets.token_urlsafe(32)

    @property
    def url(self) -> str:
        host, port = self.server_address[:2]
        shown = f"[{host}]" if ":" in host else host
        return f"http://{shown}:{port}/"

    def process_request(self, request, client_address):
        with self._count_lock:
            full = self._connections >= self.max_connections
            if not full:
                self._connections += 1
        if full:  # answered here, without a thread, and without waiting on the client
            try:
                request.settimeout(1.0)
                request.sendall(BUSY_RESPONSE)
                request.shutdown(socket.SHUT_WR)
                # what it sent already, up to a bound; non-blocking, since with a timeout
                # set a recv waits for more, and a client trickling bytes would hold the
                # thread that accepts every connection
                request.setblocking(False)
                for _ in range(16):
                    if not request.recv(1 << 16):
                        break
            except OSError:
                pass
            self.close_request(request)
            return
        super().process_request(request, client_address)

    def process_request_thread(self, request, client_address):
        try:
            super().process_request_thread(request, client_address)
        finally:
            with self._count_lock:
                self._connections -= 1

    def shutdown_request(self, request):
        """A lingering close: end our side, then read (and drop) what the client still
        sends, for a moment, so that closing with unread data (a body never read, a
        pipelined request) does not reset the connection and lose the answer on its way."""
        try:
            request.shutdown(socket.SHUT_WR)
            deadline = time.monotonic() + LINGER_SECONDS
            drained = 0
            while drained < DRAIN_LIMIT:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                request.settimeout(left)
                chunk = request.recv(1 << 16)
                if not chunk:
                    break
                drained += len(chunk)
        except OSError:
            pass
        self.close_request(request)


_BUSY = json.dumps({"error": f"the server is serving {MAX_CONNECTIONS} connections; try again "
                             "in a moment"}).encode()
BUSY_RESPONSE = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                 b"Retry-After: 5\r\nConnection: close\r\nContent-Length: "
                 + str(len(_BUSY)).encode() + b"\r\n\r\n" + _BUSY)
