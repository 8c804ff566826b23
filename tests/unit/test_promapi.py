"""The one Prometheus client's own logic: error messages, time splitting, merging, queries in flight."""

from __future__ import annotations

import json

import numpy as np
import pytest

from kvscope.core.net import FetchError
from kvscope.diagnoser.sources.promapi import PromClient, PromError, http_error, matrix_on_grid, merge_matrices, on_step


def _http(code: int, body: bytes) -> FetchError:
    text = str(json.loads(body)["error"]) if body.startswith(b"{") else body.decode()
    return FetchError(f"t: HTTP {code}: {text}", code, text)


def test_a_sample_limit_is_reported_as_what_it_is_not_as_a_wrong_url():
    err = http_error(
        "http://p",
        _http(
            422,
            b'{"status":"error","errorType":"execution","error":'
            b'"query processing would load too many samples into memory in query execution"}',
        ),
    )
    assert err.too_many_samples and err.status == 422
    assert "too many samples" in str(err) and "--query.max-samples" in str(err) and "base URL" not in str(err)
    assert "base URL" in str(http_error("http://p", _http(404, b"404 page not found")))
    assert "overloaded or the query timed out" in str(
        http_error("http://p", _http(503, b'{"error":"query timed out"}'))
    )
    assert "rejected the query: parse error" in str(http_error("http://p", _http(400, b'{"error":"parse error"}')))


def test_long_ranges_are_cut_under_the_points_limit_and_the_sample_budget():
    client = PromClient("http://p")
    chunks = client.plan_chunks(0, 40_000 * 15, 15)
    assert len(chunks) == 4 and chunks[0][0] == 0 and chunks[-1][1] == 40_000 * 15
    assert all((b - a) / 15 + 1 <= 11_000 for a, b in chunks)
    assert all(b2 - a2 >= 0 and a2 == b1 + 15 for (_, b1), (a2, b2) in zip(chunks, chunks[1:], strict=False))
    assert len(client.plan_chunks(0, 3600, 15, series=300_000)) > 1 and client.notes


def test_a_refused_range_is_halved_and_the_parts_merged():
    class Stub(PromClient):
        def query_range(self, expr, start, end, step):  # noqa: ANN001, ANN201
            if (end - start) / step + 1 > 3:
                raise PromError("too many samples", 422, too_many_samples=True)
            return [{"metric": {"a": "1"}, "values": [[t, "1"] for t in np.arange(start, end + step, step)]}]

    out = Stub("http://p", concurrency=1).range_parts("x", 0, 150, 15)
    assert [v[0] for v in out[0]["values"]] == list(np.arange(0, 165, 15))


def test_matrix_on_grid_places_points_by_time_and_leaves_the_rest_absent():
    metrics, values = matrix_on_grid([{"metric": {"__name__": "m"}, "values": [[30, "2"], [0, "NaN"]]}], 0, 15, 4)
    assert metrics == [{"__name__": "m"}]
    assert np.isnan(values[0, 0]) and np.isnan(values[0, 1]) and values[0, 2] == 2 and np.isnan(values[0, 3])
    series = [
        [[15, "1"], [30, "2"]],  # no gap, from the grid's second time: one slice
        [[0, "1"], [30, "3"], [45, "4"]],  # a gap: each point at its time
        [[0, "1"], [15, "2"], [30, "3"], [45, "4"], [60, "5"]],  # past the grid's end: the end dropped
        [[7, "1"], [22, "2"]],  # off the grid's times: each point at the nearest
    ]
    _, values = matrix_on_grid([{"metric": {}, "values": v} for v in series], 0, 15, 4)
    assert values[0, 1:3].tolist() == [1.0, 2.0] and np.isnan(values[0, [0, 3]]).all()
    assert values[1, 0] == 1 and np.isnan(values[1, 1]) and values[1, 2:].tolist() == [3.0, 4.0]
    assert values[2].tolist() == [1.0, 2.0, 3.0, 4.0]
    assert values[3, 0] == 1 and values[3, 1] == 2 and np.isnan(values[3, 2:]).all()
    merged = merge_matrices(
        [[{"metric": {"a": "1"}, "values": [[0, "1"]]}], [{"metric": {"a": "1"}, "values": [[15, "2"]]}]]
    )
    assert len(merged) == 1 and merged[0]["metric"] == {"a": "1"}
    assert merged[0]["values"].tolist() == [[0.0, 1.0], [15.0, 2.0]]  # float (time, value) pairs


def test_an_unreachable_server_says_so():
    with pytest.raises(PromError, match="cannot connect"):
        PromClient("http://127.0.0.1:9", timeout_s=2).query("up", 0)


def test_only_victoriametrics_queries_off_its_step_lattice_ask_it_not_to_cache():
    sent: list[dict] = []

    class Stub(PromClient):
        def _call(self, path, params, matrix=False):  # noqa: ANN001, ANN201
            sent.append(dict(params))
            return {"resultType": "matrix", "result": []}

    assert on_step(1789639200, 15) and on_step(1789639200.0, 105) is False and on_step(0.5, 0.25)
    for flavor in ("victoriametrics", "prometheus"):
        client = Stub("http://p")
        client._flavor = flavor
        client.query_range("up", 1789639200, 1789642800, 15)  # on the lattice: cacheable
        client.query_range("up", 1789639207, 1789642807, 15)  # off it
    assert ["nocache" in p for p in sent] == [False, True, False, False]


def test_queries_in_flight_stay_within_the_concurrency_while_more_threads_decode():
    """A real HTTP server that holds each query a moment and counts how many it serves at once:
    `map` runs twice `concurrency` threads, but no more than `concurrency` queries reach it."""
    import threading
    import time
    from http.server import BaseHTTPRequestHandler

    from testbed.httpstub import serving

    lock, now, peak = threading.Lock(), [0], [0]

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            self.rfile.read(int(self.headers.get("Content-Length", "0")))
            with lock:
                now[0] += 1
                peak[0] = max(peak[0], now[0])
            time.sleep(0.05)
            with lock:
                now[0] -= 1
            body = b'{"status":"success","data":{"resultType":"vector","result":[]}}'
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    with serving(Handler) as server:
        client = PromClient(f"http://127.0.0.1:{server.server_address[1]}", timeout_s=30, concurrency=2)
        assert client.map(lambda i: client.query("up", 0), list(range(12))) == [[]] * 12
    assert 1 <= peak[0] <= 2  # four threads, never more than two queries at the server
