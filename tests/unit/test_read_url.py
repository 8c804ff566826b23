"""read_url (diagnoser/sources): the diagnoser's one synchronous HTTP request, against a real local
server: bounded reads, a form POST, error statuses and no answer each end as the caller asked."""

from __future__ import annotations

import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from kvscope.diagnoser.sources import SourceError, read_url
from kvscope.diagnoser.sources.promapi import PromError


class _Handler(BaseHTTPRequestHandler):
    def do_GET(self):  # noqa: N802 - http.server's name
        if self.path == "/missing":
            self.send_error(404, "no such page")
            return
        body = b"x" * int(self.path.strip("/") or 0)
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_POST(self):  # noqa: N802
        form = self.rfile.read(int(self.headers["Content-Length"]))
        body = self.headers["Content-Type"].encode() + b" " + form
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def base():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_a_body_up_to_the_cap_is_read_and_one_past_it_is_refused(base):
    assert read_url(f"{base}/1000", "t", 5.0, 1000) == b"x" * 1000
    with pytest.raises(SourceError, match="^t: the answer declares 1000 bytes, more than the 999 bytes read at most"):
        read_url(f"{base}/1000", "t", 5.0, 999)


def test_a_form_post(base):
    assert read_url(f"{base}/", "t", 5.0, 1000, data=b"a=1") == b"application/x-www-form-urlencoded a=1"


def test_an_error_status_goes_to_on_status_else_to_the_error_class(base):
    with pytest.raises(SourceError, match="^t: HTTP 404"):
        read_url(f"{base}/missing", "t", 5.0, 1000)
    with pytest.raises(PromError) as info:
        read_url(f"{base}/missing", "t", 5.0, 1000, on_status=lambda e: PromError("status", e.status))
    assert info.value.status == 404


def test_no_answer_raises_the_callers_error_class():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed again: nothing listens there
    with pytest.raises(PromError, match="^t: cannot connect"):
        read_url(f"http://127.0.0.1:{port}/", "t", 2.0, 1000, error=PromError)
