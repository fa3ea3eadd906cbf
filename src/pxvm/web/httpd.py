"""The HTTP bounds and names `pxvm serve` shares between its page (server.py's routes,
pxvm.serve.page) and the server that answers them (pxvm.serve.server, guard)."""

from __future__ import annotations

import ipaddress
import json

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
