"""Issue 41 N3: a Prometheus answer's size is bounded before it is allocated and a valid large
answer is decoded without ballooning: against a real local server, a ~48 MiB matrix (the shape of
a range query over 160 engines) read by PromClient in a fresh interpreter adds less than three times
its size to the peak RSS (Python objects for every point took ~5x: 2.3 GB for a 414 MiB answer);
an answer past the cap, declared or chunked, is refused with the size in words."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from kvscope.core.net import FetchError
from kvscope.diagnoser.sources import SourceError, read_url
from testbed.answers import answer_from_bytes
from tests.unit.test_hostile_answers import RawServer

N_SERIES, N_POINTS = 240, 10_000
T0 = 1_700_000_010  # on the 15 s step


def _matrix() -> bytes:
    points = b",".join(b'[%d,"0.5"]' % (T0 + 15 * i) for i in range(N_POINTS))
    series = [
        b'{"metric":{"__name__":"vllm:gpu_cache_usage_perc","instance":"10.0.0.%d:8000"},"values":[%s]}' % (i, points)
        for i in range(N_SERIES)
    ]
    return b'{"status":"success","data":{"resultType":"matrix","result":[' + b",".join(series) + b"]}}"


_MEASURE = """
import json, sys
from kvscope.diagnoser.sources.promapi import PromClient, matrix_on_grid
def peak():  # VmHWM, not ru_maxrss (which keeps the forking parent's peak across exec)
    return int(open("/proc/self/status").read().split("VmHWM:")[1].split()[0]) * 1024
base = peak()
result = PromClient(sys.argv[1], timeout_s=600).query_range("x", T0, T_END, 15)
metrics, grid = matrix_on_grid(result, T0, 15, N_POINTS)
print(json.dumps({"grew": peak() - base, "series": len(metrics), "last": float(grid[-1, -1])}))
"""
_MEASURE = _MEASURE.replace("T_END", str(T0 + 15 * (N_POINTS - 1))).replace("T0", str(T0))
_MEASURE = _MEASURE.replace("N_POINTS", str(N_POINTS))


def test_a_large_valid_answer_adds_less_than_three_times_its_size_to_peak_memory():
    body = _matrix()
    head = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n" % len(body)
    server = RawServer(head + body)
    try:
        # the interpreter and every module the read uses are loaded before the baseline
        warm = "import kvscope.diagnoser.sources.promapi, numpy, msgspec, json, urllib.request, http.client;"
        out = subprocess.run(
            [sys.executable, "-c", warm + _MEASURE, server.url],
            capture_output=True,
            text=True,
            check=True,
            timeout=600,
        )
    finally:
        server.close()
    got = json.loads(out.stdout)
    assert got["series"] == N_SERIES and got["last"] == 0.5
    print(f"peak RSS grew {got['grew'] / 2**20:.0f} MiB for a {len(body) / 2**20:.0f} MiB answer")
    assert got["grew"] < 3 * len(body), f"peak RSS grew {got['grew'] / 2**20:.0f} MiB for {len(body) / 2**20:.0f} MiB"


def test_an_answer_past_the_cap_is_refused_with_its_size_in_words():
    declared = RawServer(b"HTTP/1.1 200 OK\r\nContent-Length: 734003200\r\n\r\n{}")
    chunk = b"%x\r\n%s\r\n" % (4096, b"x" * 4096)
    chunked = RawServer(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n" + chunk * 300 + b"0\r\n\r\n")
    try:
        with pytest.raises(SourceError, match=r"^t: the answer declares 700 MiB, more than the 512 MiB read at most"):
            read_url(declared.url, "t", 10.0, 512 << 20)
        with pytest.raises(SourceError, match=r"^t: the answer is larger than the 1 MiB read at most"):
            read_url(chunked.url, "t", 10.0, 1 << 20)
    finally:
        declared.close()
        chunked.close()


def test_the_prometheus_answer_fuzz_target_reads_its_real_seeds_and_a_huge_declared_length():
    """The seeds (a real Prometheus' answers) decode to what they hold; a Content-Length of
    hundreds of digits (found by the fuzz bench: an OverflowError) is refused in words."""
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "bench" / "fuzz_answers.py"
    spec = importlib.util.spec_from_file_location("fuzz_answers", path)
    area = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(area)
    parse, seeds_fn, _ = area.TARGETS["prom-answer"]
    seeds = seeds_fn()
    assert len(seeds) >= 12
    for seed in seeds:
        parse(seed)
    matrix = parse(next(s for s in seeds if b'"+Inf"' in s))[0][1]
    assert matrix[0, 1] == float("inf") and matrix[0, 2] == float("-inf") and matrix[0, 3] == 0.5
    huge = b"HTTP/1.1 200 OK\r\nContent-Length: " + b"16" * 400 + b"\r\n\r\n{}"
    with pytest.raises(FetchError, match="^t: malformed answer: Content-Length overflow$"):
        answer_from_bytes(huge, "t", 1 << 20)
