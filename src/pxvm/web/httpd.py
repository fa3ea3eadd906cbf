"""The HTTP bounds and names `pxvm serve` shares between its page (server.py's routes,
pxvm.serve.page) and the server that answers them (pxvm.serve.server, guard), and the
reading of a request's query parameters that the page's routes share."""

from __future__ import annotations

import ipaddress
import json

from ..core.errors import PxvmError, shortened

#: Largest response body sent.
MAX_RESPONSE = 32 << 20
#: Connections served at once; one more is answered 503 (BUSY_RESPONSE) and closed.
MAX_CONNECTIONS = 64
#: A request's line and headers must arrive within this long (an idle keep-alive
#: connection is closed then too), so that clients sending a byte now and then cannot
#: hold the connection slots.
HEADER_SECONDS = 10.0
#: A body over the size limit but at most this large is read and dropped before the 413,
#: so that the client sees the answer instead of a reset connection.
DRAIN_LIMIT = 16 << 20
#: The request header that carries the page's session token (pxvm.serve.page.Page).
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


_BUSY = json.dumps({"error": f"the server is serving {MAX_CONNECTIONS} connections; try again "
                             "in a moment"}).encode()
BUSY_RESPONSE = (b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json\r\n"
                 b"Retry-After: 5\r\nConnection: close\r\nContent-Length: "
                 + str(len(_BUSY)).encode() + b"\r\n\r\n" + _BUSY)


#: Longest query parameter value read (a name, a list of features, a number).
MAX_QUERY_VALUE = 200


class QueryError(PxvmError):
    """A query parameter given wrongly (missing, twice, too long, not an integer in its
    range): answered 400 with the message, which names the parameter."""


def query_text(query: dict, name: str, default: str | None = None) -> str:
    """Parameter `name` of a parsed query ({name: [values]}, as parse_qs gives it): given
    once, at most MAX_QUERY_VALUE characters; `default` where it is absent (None: it
    must be given)."""
    values = query.get(name)
    if values is None:
        if default is None:
            raise QueryError(f"{name} must be given")
        return default
    if len(values) != 1 or len(values[0]) > MAX_QUERY_VALUE:
        raise QueryError(f"{name} must be given once, at most {MAX_QUERY_VALUE} characters, "
                         f"got {shortened(', '.join(values), 40)!r}")
    return values[0]


def query_integer(query: dict, name: str, low: int, high: int, default: int | None = None) -> int:
    """Parameter `name` as an integer in low..high, written in decimal digits (query_text
    reads it; `default` where it is absent, None: it must be given)."""
    text = query_text(query, name, None if default is None else str(default))
    if not (text.isascii() and text.isdigit()) or not low <= int(text) <= high:
        raise QueryError(f"{name} must be an integer in {low}..{high}, got "
                         f"{shortened(text, 40)!r}")
    return int(text)
