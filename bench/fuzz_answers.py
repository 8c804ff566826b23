"""Fuzz target for Prometheus HTTP API answers (bench/fuzz.py runs it; issue 41).

prom-answer: one whole answer as it comes off the wire (status line, headers, Content-Length or
chunked framing, JSON body) read by `answer_from_bytes` (the same aiohttp parsing, body
bounding and error mapping as every outbound read, core/net.py), then decoded by
PromClient as a range query (typed matrix decoder, shape checks, `matrix_on_grid`), an instant
query and a label-values call. Clean errors: FetchError (the read) and PromError (the answer);
anything else escaping is a crash.

Seeds are real: answers of a real Prometheus (the `prometheus` binary on this machine) scraping
itself, captured byte for byte by `python bench/fuzz_answers.py --capture` into
tests/fixtures/prometheus-answers/ (a matrix, a vector, label values, a 400 parse error and a
422 sample-limit refusal, each with Content-Length and re-framed chunked), plus one matrix with
"NaN" and "+Inf" values as Prometheus writes them.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path
from typing import Any

from kvscope.core.net import FetchError
from kvscope.diagnoser.sources.promapi import PromClient, PromError, matrix_on_grid

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # testbed/, run as a script too
from testbed.answers import answer_from_bytes  # noqa: E402

SEEDS = ROOT / "tests" / "fixtures" / "prometheus-answers"
MAX_BODY = 1 << 20


class _Answered(PromClient):
    """PromClient whose every call is answered by `body` (no network)."""

    body: bytearray = bytearray()

    def _read(self, path: str, form: bytes | None = None, matrix: bool = False) -> bytearray:
        return self.body


def parse_prom_answer(data: bytes) -> Any:
    try:
        body = answer_from_bytes(data, "fuzz", MAX_BODY)
    except FetchError:
        return None
    client = _Answered("http://fuzz", concurrency=1)
    client.body = body
    out: list[Any] = []
    for call in (
        lambda: matrix_on_grid(client.query_range("up", 1500.0, 1800.0, 15.0), 1500.0, 15.0, 21),
        lambda: client.query("up", 1800.0),
        lambda: client.label_values("instance", ["up"], 0.0, 1800.0),
    ):
        try:
            out.append(call())
        except PromError:
            out.append(None)
    return out


def seeds_prom_answers() -> list[bytes]:
    return [p.read_bytes() for p in sorted(SEEDS.glob("*.http"))]


TOKENS = [
    b"HTTP/1.1 200 OK\r\n",
    b"HTTP/1.0 ",
    b"\r\n",
    b"\r\n\r\n",
    b"Transfer-Encoding: chunked\r\n",
    b"Content-Length: ",
    b"Content-Length: 99999999999\r\n",
    b"0\r\n\r\n",
    b"ffffffff\r\n",
    b'"status":"success"',
    b'"status":"error"',
    b'"resultType":"matrix"',
    b'"resultType":"vector"',
    b'"data":',
    b'"result":',
    b'"values":',
    b'"value":',
    b'"metric":',
    b"[",
    b"]",
    b"[[",
    b"null",
    b'"+Inf"',
    b'"-Inf"',
    b'"1e400"',
    b"1e400",
    b"\\u0000",
    b"\\ud800",
    b"\x1b[31m",
]

TARGETS = {"prom-answer": (parse_prom_answer, seeds_prom_answers, TOKENS)}


# ------------------------------------------------------------------------------------ capture
def _raw(port: int, path: str, form: dict[str, str] | None = None) -> bytes:
    """The answer to one request, byte for byte, as it came off the socket (HTTP/1.0 + close)."""
    body = urllib.parse.urlencode(form or {}).encode()
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: close\r\n"
    head += f"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {len(body)}\r\n\r\n"
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(head.encode() + body)
        chunks = []
        while more := s.recv(65536):
            chunks.append(more)
    return b"".join(chunks)


def _chunked(answer: bytes) -> bytes:
    """The same answer re-framed as chunked (Prometheus streams large answers that way)."""
    head, _, body = answer.partition(b"\r\n\r\n")
    lines = [h for h in head.split(b"\r\n") if not h.lower().startswith(b"content-length:")]
    pieces = [body[i : i + 700] for i in range(0, len(body), 700)]
    framed = b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in pieces) + b"0\r\n\r\n"
    return b"\r\n".join([*lines, b"Transfer-Encoding: chunked"]) + b"\r\n\r\n" + framed


def capture(out: Path) -> None:
    """Start the real `prometheus` scraping itself every second, then save its answers."""
    with tempfile.TemporaryDirectory() as tmp:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        config = Path(tmp) / "prometheus.yml"
        config.write_text(
            "global: {scrape_interval: 1s}\n"
            f"scrape_configs: [{{job_name: self, static_configs: [{{targets: ['127.0.0.1:{port}']}}]}}]\n"
        )
        proc = subprocess.Popen(
            [
                "prometheus",
                f"--config.file={config}",
                f"--storage.tsdb.path={tmp}/data",
                f"--web.listen-address=127.0.0.1:{port}",
                "--query.max-samples=2000",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        try:
            time.sleep(25)
            now = time.time()
            rng = {"start": f"{now - 20:.3f}", "end": f"{now:.3f}", "step": "1"}
            answers = {
                "matrix": _raw(port, "/api/v1/query_range", {"query": "up", **rng}),
                "matrix-rate": _raw(
                    port, "/api/v1/query_range", {"query": "rate(prometheus_http_requests_total[5s])", **rng}
                ),
                "vector": _raw(port, "/api/v1/query", {"query": "scrape_duration_seconds", "time": f"{now:.3f}"}),
                "label-values": _raw(port, "/api/v1/label/instance/values", {"match[]": "up"}),
                "error-400": _raw(port, "/api/v1/query_range", {"query": "rate(up[", **rng}),
                "error-422": _raw(
                    port, "/api/v1/query_range", {"query": '{__name__=~".+"}', **rng, "start": f"{now - 20:.3f}"}
                ),
            }
        finally:
            proc.terminate()
            proc.wait(30)
    out.mkdir(parents=True, exist_ok=True)
    for name, answer in answers.items():
        answer = answer[: 24 << 10] if len(answer) > 24 << 10 else answer  # the fuzzer's inputs are small
        (out / f"{name}.http").write_bytes(answer)
        (out / f"{name}-chunked.http").write_bytes(_chunked(answer))
    nan = (
        b'{"status":"success","data":{"resultType":"matrix","result":[{"metric":{"instance":"e0:8000"},'
        b'"values":[[1500,"NaN"],[1515,"+Inf"],[1530,"-Inf"],[1545,"0.5"]]}]}}'
    )
    (out / "matrix-nan-inf.http").write_bytes(
        b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(nan), nan)
    )
    print(f"wrote {len(list(out.glob('*.http')))} answers to {out}", file=sys.stderr)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--capture", action="store_true", help="capture the seeds from a real Prometheus")
    if parser.parse_args().capture:
        capture(SEEDS)
