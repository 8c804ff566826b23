"""Small HTTP servers of our own on a thread: a static /metrics body, or any handler class.

For the parts of a test that stand in for an engine (a captured exposition) or receive what a
real component sends (a webhook sink). `serving()` binds 127.0.0.1 on a free port and always
shuts the server down and closes its socket.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from testbed.procs import LOOPBACK

EXPOSITION_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def start_thread_server(handler: type[BaseHTTPRequestHandler]) -> ThreadingHTTPServer:
    """Serve `handler` on 127.0.0.1:<free port> on a daemon thread. Stop it with `stop_thread_server`."""
    server = ThreadingHTTPServer((LOOPBACK, 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def stop_thread_server(server: ThreadingHTTPServer) -> None:
    server.shutdown()
    server.server_close()


@contextlib.contextmanager
def serving(handler: type[BaseHTTPRequestHandler]) -> Iterator[ThreadingHTTPServer]:
    """`start_thread_server` for a `with` block; `server.server_address[1]` is the port."""
    server = start_thread_server(handler)
    try:
        yield server
    finally:
        stop_thread_server(server)


def static_body_handler(
    body: bytes, only_path: str | None = None, content_type: str = EXPOSITION_TYPE
) -> type[BaseHTTPRequestHandler]:
    """A handler answering every GET with `body` (or only GET `only_path`; 404 elsewhere)."""

    class StaticBody(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server API
            self.send_response(200 if only_path is None or self.path == only_path else 404)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    return StaticBody
