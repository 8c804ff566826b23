"""Issue 41 N2, N7, N10: what a hostile or broken HTTP server (a Prometheus, a proxy in front of
one) can do to `kvscope diagnose`, against a real local server on an ephemeral port that answers
every request with the same raw bytes: a stalled dribble ends at --timeout, every malformed
answer is one line naming the source and what was wrong (exit 4), and no escape code from the
server reaches the terminal."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from kvscope.cli import main
from kvscope.diagnoser.sources import SourceError, read_url


class RawServer:
    """Answers every connection with `answer` (bytes), or with `answer(conn)` when callable."""

    def __init__(self, answer) -> None:  # noqa: ANN001
        self.answer = answer
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.closed = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn:
            try:
                _read_request(conn)
                if callable(self.answer):
                    self.answer(conn, self.closed)
                else:
                    conn.sendall(self.answer)
                    conn.shutdown(socket.SHUT_WR)
                    conn.recv(1)
            except OSError:
                pass

    def close(self) -> None:
        self.closed.set()
        self.sock.close()


def _read_request(conn: socket.socket) -> None:
    """The request's head and its body (Content-Length), so that closing the connection after the
    answer does not reset it."""
    data = b""
    while b"\r\n\r\n" not in data:
        more = conn.recv(65536)
        if not more:
            return
        data += more
    head, _, body = data.partition(b"\r\n\r\n")
    length = next((int(h.split(b":")[1]) for h in head.split(b"\r\n") if h.lower().startswith(b"content-length:")), 0)
    while len(body) < length:
        more = conn.recv(65536)
        if not more:
            return
        body += more


@pytest.fixture
def serve():
    servers: list[RawServer] = []

    def start(answer) -> str:  # noqa: ANN001
        servers.append(RawServer(answer))
        return servers[-1].url

    yield start
    for s in servers:
        s.close()


def _dribble(conn: socket.socket, closed: threading.Event) -> None:
    """A valid answer, one byte every 0.2 s (each read is quick: urllib's per-read timeout never
    fires), for up to 30 s, then the connection is cut."""
    answer = b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n" + b"{" * 100000
    until = time.monotonic() + 30
    for byte in answer:
        if closed.is_set() or time.monotonic() > until:
            return
        conn.sendall(bytes([byte]))
        time.sleep(0.2)


def _http(body: bytes, status: str = "200 OK", headers: bytes = b"") -> bytes:
    head = f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n".encode()
    return head + headers + b"\r\n" + body


def _diagnose(capsys, url: str, *extra: str) -> tuple[int, str]:
    code = main(["diagnose", "--prometheus", url, "--since", "10m", "--timeout", "2", "-q", *extra])
    return code, capsys.readouterr().err


# --- N2: one deadline for connect, headers and body ----------------------------------------------


@pytest.mark.parametrize("stall", ["headers", "body"])
def test_a_server_that_dribbles_one_byte_at_a_time_is_cut_off_at_the_timeout(serve, stall):
    url = serve(_dribble if stall == "headers" else lambda c, closed: _body_dribble(c, closed))
    with pytest.raises(SourceError, match=r"^t: no complete answer within 1 s"):
        read_url(url + "/", "t", 1.0, 1 << 20)


def _body_dribble(conn: socket.socket, closed: threading.Event) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n")
    _dribble_bytes(conn, closed, b"x" * 1000)


def _dribble_bytes(conn: socket.socket, closed: threading.Event, data: bytes) -> None:
    until = time.monotonic() + 30
    for byte in data:
        if closed.is_set() or time.monotonic() > until:
            return
        conn.sendall(bytes([byte]))
        time.sleep(0.2)


def test_diagnose_against_a_dribbling_prometheus_ends_with_exit_4_naming_the_timeout(serve, capsys):
    code, err = _diagnose(capsys, serve(_dribble))
    assert code == 4, err
    assert (
        err.startswith("kvscope diagnose: not diagnosed: prometheus http://127.0.0.1:")
        and "no complete answer within 2 s" in err
    )


# --- N7: every malformed answer is one line, exit 4 ----------------------------------------------

_BAD = {
    "status line": (b"HELLO THERE\r\n\r\n{}", "status line is not HTTP"),
    "bad chunk": (b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\nZZ\r\nabc\r\n0\r\n\r\n", "chunk size"),
    "101 headers": (_http(b"{}", headers=b"".join(b"X-%d: 1\r\n" % i for i in range(101))), "more than 100 headers"),
    "100 KiB header": (_http(b"{}", headers=b"X-Big: " + b"a" * (100 << 10) + b"\r\n"), "too long"),
    "nested 100k deep": (_http(b"[" * 100_000 + b"]" * 100_000), "nested too deep"),
    "data is 5": (_http(b'{"data": 5}'), 'no status "success"'),
    "success, data is 5": (_http(b'{"status": "success", "data": 5}'), "malformed answer"),
    "result not a list": (
        _http(b'{"status": "success", "data": {"resultType": "vector", "result": {"a": 1}}}'),
        "malformed answer",
    ),
    "NaN strings in the wrong place": (
        _http(b'{"status":"success","data":{"resultType":"vector","result":[{"metric":{},"value":["x","y"]}]}}'),
        "malformed answer",
    ),
    "matrix value not a number": (
        _http(b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{},"values":[[1,"abc"]]}]}}'),
        "malformed answer",
    ),
    "declared length past the cap": (
        b"HTTP/1.1 200 OK\r\nContent-Length: 99999999999\r\n\r\n{}",
        "the answer declares 93.1 GiB, more than the 64 MiB read at most",  # the inventory: parsed whole
    ),
    "cut mid-body": (b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n{}", "ended early"),
}


@pytest.mark.parametrize("case", list(_BAD))
def test_a_malformed_answer_is_one_line_naming_the_source_and_what_was_wrong_exit_4(serve, capsys, case):
    answer, words = _BAD[case]
    url = serve(answer)
    code, err = _diagnose(capsys, url, "--full-fetch")
    assert code == 4, err
    assert err.startswith(f"kvscope diagnose: not diagnosed: prometheus {url}") and words in err, err
    assert "Traceback" not in err and len(err.strip().splitlines()) == 1, err


def test_the_fleet_path_reads_the_same_malformed_answers_as_one_line(serve, capsys):
    for case in ("success, data is 5", "matrix value not a number", "nested 100k deep"):
        code, err = _diagnose(capsys, serve(_BAD[case][0]))
        assert code == 4 and _BAD[case][1] in err and len(err.strip().splitlines()) == 1, (case, err)


@pytest.mark.parametrize("flag", ["--since", "--timeout"])
@pytest.mark.parametrize("value", ["nan", "inf", "-1"])
def test_nan_or_infinite_arguments_are_bad_usage_naming_the_flag(capsys, flag, value):
    code, err = _diagnose(capsys, "http://127.0.0.1:9", flag, value)
    assert code == 3 and err.startswith(f"kvscope diagnose: {flag}:"), err


# --- N10: no escape code from the server reaches the terminal -------------------------------------


@pytest.mark.parametrize(
    "body",
    [
        b'{"status":"error","error":"bad \\u001b[31mred\\u001b]0;owned\\u0007 \\r\\u009b2J text"}',
        b"plain \x1b[2J\x1b]0;owned\x07 text \r\x08\x08",
    ],
)
@pytest.mark.parametrize("status", ["400 Bad Request", "500 Internal Server Error", "200 OK"])
def test_no_control_character_from_the_servers_error_text_reaches_the_terminal(serve, capsys, body, status):
    code, err = _diagnose(capsys, serve(_http(body, status)), "--full-fetch")
    assert code == 4, err
    assert "text" in err or "not JSON" in err, err
    assert not any(ord(c) < 32 and c != "\n" or 0x7F <= ord(c) <= 0x9F for c in err), repr(err)
