"""Issue 57 N3 and S7: every answer from outside is bounded before it is parsed, and every read
ends at the command's --timeout. Against real local servers on ephemeral ports (the RawServer of
test_hostile_answers): an instant query's, a label-values and an agent API answer past the cap
(KVSCOPE_MAX_ANSWER_MIB, small here so that no test sends hundreds of MiB) is refused before it is
parsed, naming the cap and how to raise it; no error path writes a whole answer out; a stalled
agent is given up at --timeout, not at a timeout of its own."""

from __future__ import annotations

import json
import socket
import threading

import pytest

from kvscope.cli import main
from kvscope.diagnoser.sources import SourceError, answer_cap
from kvscope.diagnoser.sources.promapi import PromClient, PromError, _series
from tests.unit.test_hostile_answers import RawServer


def _http(body: bytes) -> bytes:
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body) + body


def _chunked(body: bytes) -> bytes:
    parts = [body[i : i + 65536] for i in range(0, len(body), 65536)]
    framed = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts) + b"0\r\n\r\n"
    return b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" + framed


def _label_values(mib: float) -> bytes:
    """A valid label-values answer of about `mib` MiB (big_labels_prom's shape)."""
    n = int(mib * (1 << 20)) // 29
    names = b",".join(b'"vllm:x_%013d_total"' % i for i in range(n))
    return b'{"status":"success","data":[' + names + b"]}"


@pytest.fixture
def serve():
    servers: list[RawServer] = []

    def start(answer) -> str:  # noqa: ANN001
        servers.append(RawServer(answer))
        return servers[-1].url

    yield start
    for s in servers:
        s.close()


def test_a_label_values_answer_past_the_cap_is_refused_naming_the_cap_and_how_to_raise_it(serve, capsys, monkeypatch):
    monkeypatch.setenv("KVSCOPE_MAX_ANSWER_MIB", "1")
    url = serve(_http(_label_values(2)))
    code = main(["diagnose", "--prometheus", url, "--since", "10m", "--timeout", "20", "-q"])
    err = capsys.readouterr().err
    assert code == 4, err
    assert "the answer declares 2 MiB, more than the 1 MiB read at most" in err, err
    assert "KVSCOPE_MAX_ANSWER_MIB" in err and "Traceback" not in err


def test_an_instant_query_answer_past_the_cap_is_refused_while_it_is_read(serve, monkeypatch):
    """Chunked: no length is declared, so the read itself stops past the cap."""
    monkeypatch.setenv("KVSCOPE_MAX_ANSWER_MIB", "1")
    vector = {"status": "success", "data": {"resultType": "vector", "result": []}}
    body = json.dumps(vector).encode()[:-2] + b" " * (2 << 20) + b"}}"
    client = PromClient(serve(_chunked(body)), timeout_s=20)
    with pytest.raises(PromError, match=r"the answer is larger than the 1 MiB read at most; .*KVSCOPE_MAX_ANSWER_MIB"):
        client.query("up", 1_700_000_000)
    with pytest.raises(PromError, match=r"larger than the 1 MiB"):
        client.label_values("instance", ["up"], 1_700_000_000, 1_700_000_600)


def test_a_range_query_keeps_its_own_larger_cap(serve, monkeypatch):
    monkeypatch.setenv("KVSCOPE_MAX_ANSWER_MIB", "1")
    values = [[1_700_000_000 + 15 * k, "1"] for k in range(400)]
    series = [{"metric": {"instance": f"i{i}"}, "values": values} for i in range(200)]
    body = json.dumps({"status": "success", "data": {"resultType": "matrix", "result": series}}).encode()
    assert len(body) > 1 << 20
    got = PromClient(serve(_http(body)), timeout_s=20).query_range("up", 1_700_000_000, 1_700_006_000, 15)
    assert len(got) == 200


def test_the_cap_from_the_environment_is_checked():
    assert answer_cap({}) == 64 << 20
    assert answer_cap({"KVSCOPE_MAX_ANSWER_MIB": "3"}) == 3 << 20
    for bad in ("0", "-1", "1.5", "lots", "99999999"):
        with pytest.raises(SourceError, match="KVSCOPE_MAX_ANSWER_MIB"):
            answer_cap({"KVSCOPE_MAX_ANSWER_MIB": bad})


class _Counted:
    calls = 0

    def __repr__(self) -> str:
        _Counted.calls += 1
        return "x" * 1000


def test_no_error_path_writes_a_whole_answer_out():
    """A malformed answer is quoted a few items deep, never repr'd whole (a 400 MiB answer was
    written out in full to be cut to 80 characters)."""
    answer = {"resultType": "vector", "result": [_Counted() for _ in range(100_000)]}
    _Counted.calls = 0
    message = str(PromClient("http://127.0.0.1:9").malformed("/api/v1/query", "data is not a list", answer))
    assert _Counted.calls <= 8 and len(message) < 300, (_Counted.calls, len(message))
    _Counted.calls = 0
    with pytest.raises(TypeError) as exc:
        _series([_Counted() for _ in range(100_000)], "value")
    assert _Counted.calls <= 8 and len(str(exc.value)) < 200


def test_an_agent_answer_past_the_cap_is_refused_naming_the_cap(serve, capsys, monkeypatch):
    monkeypatch.setenv("KVSCOPE_MAX_ANSWER_MIB", "1")
    body = b'{"status":"success","data":{"series":[' + b" " * (2 << 20) + b"]}}"
    code = main(["diagnose", "--agent", serve(_http(body)), "--since", "10m", "--timeout", "20", "-q"])
    err = capsys.readouterr().err
    assert code == 4, err
    assert "more than the 1 MiB read at most" in err and "KVSCOPE_MAX_ANSWER_MIB" in err, err


def _stall(conn: socket.socket, closed: threading.Event) -> None:
    """Reads the request, then answers nothing until the server closes (at most 60 s)."""
    closed.wait(60)


def test_a_stalled_agent_is_given_up_at_the_commands_timeout(serve, capsys):
    """S7: the agent source kept a 30 s timeout of its own whatever --timeout said."""
    code = main(["diagnose", "--agent", serve(_stall), "--since", "10m", "--timeout", "1", "-q"])
    err = capsys.readouterr().err
    assert code == 4, err
    assert "no complete answer within 1 s" in err, err
