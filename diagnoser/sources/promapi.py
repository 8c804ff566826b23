"""The one client of the Prometheus HTTP query API (Prometheus, Thanos, Mimir, VictoriaMetrics).

`PromClient` keeps range queries within the server's limits (split in time; a query refused as
too large halved and retried; every split noted in `notes`), runs parts on a few threads, turns
failures into `PromError` saying what to do, and decodes matrices into float (time, value) pairs.
"""

from __future__ import annotations

import math
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from itertools import chain
from typing import Any

import msgspec
import numpy as np

from kvscope.core.net import FetchError, fetch, printable, quoted
from kvscope.diagnoser.sources import SourceError, answer_cap, answer_data, raise_cap_hint, read_url

MAX_POINTS = 11_000
"""Prometheus refuses a range query with more points per series than this."""
MAX_SAMPLES = 50_000_000
"""Prometheus' default --query.max-samples: samples one query may hold in memory at once."""
SAMPLE_BUDGET = 0.5
"""Share of max_samples a query is planned to load (the estimate is rough: ranges and lookback)."""
MAX_RESPONSE_BYTES = 512 * 1024 * 1024
"""Cap of a matrix answer (decoded one series at a time, `_typed_matrix`); every other answer is
parsed whole and capped at `sources.answer_cap()` (64 MiB unless KVSCOPE_MAX_ANSWER_MIB says)."""
CONCURRENCY = 4
"""Queries one client keeps in flight at once (the TSDB's load from one command)."""
MAX_BISECT = 6
"""How many times a rejected (422 too many samples) range is halved before giving up."""


class _Series(msgspec.Struct):
    metric: dict[str, str] = {}
    values: msgspec.Raw = msgspec.Raw(b"[]")  # decoded one series at a time (`_points`)


class _Data(msgspec.Struct):
    resultType: str = ""
    result: list[_Series] = []


class _Answer(msgspec.Struct):
    status: str = ""
    data: _Data | None = None


_MATRIX = msgspec.json.Decoder(_Answer, strict=False)
"""A range query's answer; each series' values kept as raw JSON and decoded by `_points`."""
_POINTS = msgspec.json.Decoder(list[tuple[float, float]], strict=False)
"""One series' values as float pairs ("1.5", "NaN", "Inf" read as numbers)."""


class PromError(SourceError):
    """A Prometheus API call that failed; `status` is the HTTP status (0: no answer)."""

    def __init__(self, message: str, status: int = 0, too_many_samples: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.too_many_samples = too_many_samples


@dataclass
class PromClient:
    """Queries against one Prometheus-compatible base URL (thread-safe)."""

    url: str
    timeout_s: float = 60.0
    max_points: int = MAX_POINTS
    max_samples: int = MAX_SAMPLES
    concurrency: int = CONCURRENCY
    progress: Callable[[str], None] | None = None
    deadline: float | None = None
    """time.monotonic() by which every read ends (a whole diagnosis' budget); None: per read only."""
    notes: list[str] = field(default_factory=list)
    stats: dict[str, int] = field(default_factory=lambda: {"queries": 0, "bytes": 0})

    def __post_init__(self) -> None:
        self.url = self.url.rstrip("/")
        self._lock = threading.Lock()
        self._in_flight = threading.BoundedSemaphore(max(1, self.concurrency))
        self._flavor: str | None = None

    # ---------------------------------------------------------------- raw calls
    def _call(self, path: str, params: dict[str, str] | list[tuple[str, str]], matrix: bool = False) -> Any:
        raw = self._read(path, urllib.parse.urlencode(params).encode(), matrix)
        with self._lock:
            self.stats["queries"] += 1
            self.stats["bytes"] += len(raw)
        try:
            typed = _typed_matrix(raw) if matrix else None
        except ValueError as exc:
            raise self.malformed(path, f"a matrix series' values are not [[time, value]...] ({exc})") from None
        return typed if typed is not None else self._data(path, raw)

    def _data(self, path: str, raw: bytes | bytearray) -> Any:
        """The answer's `data` (`answer_data`); PromError for an error or malformed answer."""
        hint = f"; is {self.url} the base URL of a Prometheus-compatible API?"
        return answer_data(raw, f"prometheus {self.url}", path, PromError, hint)

    def malformed(self, path: str, what: str, got: Any = None) -> PromError:
        """The error for an answer of the wrong shape: where, what was expected, what came."""
        seen = "" if got is None else f", got {quoted(got)}"
        return PromError(f"prometheus {self.url}{path}: malformed answer: {what}{seen}")

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[dict[str, Any]]:
        """One range query as sent (no splitting): the matrix, at start + k x step, values as float
        (time, value) pairs. VictoriaMetrics' rollup cache moves a start off the step's multiples;
        such a query is sent with `nocache=1`."""
        params = {"query": expr, "start": _ts(start), "end": _ts(end), "step": f"{step:g}"}
        if not on_step(start, step) and self.flavor() == "victoriametrics":
            params["nocache"] = "1"
        path = "/api/v1/query_range"
        return self._matrix(path, self._call(path, params, matrix=True), "range query")

    def _matrix(self, path: str, data: Any, what: str) -> list[dict[str, Any]]:
        """The series of a matrix answer, each value a float (time, value) pair; a malformed
        answer (`what` answered something else, or a series of another shape) raises."""
        if not isinstance(data, dict) or data.get("resultType") != "matrix":
            kind = data.get("resultType") if isinstance(data, dict) else data
            raise self.malformed(path, f"{what} answered {quoted(kind, 40)}, not a matrix")
        if data.get("typed"):  # read by the typed decoder: already float pairs
            return list(data["result"])
        try:
            return [_series(s, "values") for s in _items(data.get("result"))]
        except (TypeError, ValueError, AttributeError, OverflowError) as exc:
            shape = "{metric, values: [[time, value]...]}"
            raise self.malformed(path, f"a matrix series is not {shape} ({exc})") from None

    def query(self, expr: str, at: float) -> list[dict[str, Any]]:
        """Instant query at `at`: the vector, each value a float (time, value) pair."""
        path = "/api/v1/query"
        data = self._call(path, {"query": expr, "time": _ts(at)})
        if not isinstance(data, dict):
            raise self.malformed(path, "data is not an object", data)
        try:
            return [_series(s, "value") for s in _items(data.get("result"))]
        except (TypeError, ValueError, AttributeError, OverflowError) as exc:
            raise self.malformed(path, f"a vector sample is not {{metric, value: [time, value]}} ({exc})") from None

    def raw_samples(self, selector: str, seconds: float, at: float) -> list[dict[str, Any]]:
        """The raw samples (as scraped, no lookback) of `selector` in (at - seconds, at]: an instant
        query of a range vector, answered as a matrix by Prometheus and VictoriaMetrics alike."""
        path = "/api/v1/query"
        expr = f"{selector}[{max(1, round(seconds * 1000))}ms]"
        return self._matrix(path, self._call(path, {"query": expr, "time": _ts(at)}, matrix=True), "a range vector")

    def label_values(self, label: str, matchers: Iterable[str], start: float, end: float) -> list[str]:
        """Values of `label` over series matching any of `matchers` in [start, end] (the index
        only, no samples are read)."""
        path = f"/api/v1/label/{urllib.parse.quote(label)}/values"
        params = [("match[]", m) for m in matchers] + [("start", _ts(start)), ("end", _ts(end))]
        try:
            data = self._call(path, params)
        except PromError as exc:
            if exc.status != 405:
                raise
            qs = urllib.parse.urlencode(params)  # servers that only take GET here
            data = self._get(f"{path}?{qs}")
        if data is not None and not isinstance(data, list):
            raise self.malformed(path, "label values are not a list", data)
        return [str(v) for v in data or []]

    def flavor(self) -> str:
        """ "victoriametrics" when the server is VictoriaMetrics (it marks every answer with an
        X-Server-Hostname header), else "prometheus" (Prometheus and the servers that speak its
        API: Thanos, Mimir), also when the server cannot tell. Asked once."""
        if self._flavor is None:
            try:
                url, seconds = self.url + "/api/v1/status/buildinfo", min(self.timeout_s, 10.0)
                if self.deadline is not None:
                    seconds = max(0.001, min(seconds, self.deadline - time.monotonic()))
                vm = fetch(url, "buildinfo", seconds, 0, headers_only=True)[1].get("X-Server-Hostname") is not None
            except FetchError:
                vm = False
            self._flavor = "victoriametrics" if vm else "prometheus"
        return self._flavor

    def _get(self, path_qs: str) -> Any:
        return self._data(path_qs.split("?")[0], self._read(path_qs))

    def _read(self, path: str, form: bytes | None = None, matrix: bool = False) -> bytearray:
        """The answer's body (a form POST when `form`); PromError for every failure. A `matrix`
        answer (decoded a series at a time) is capped at MAX_RESPONSE_BYTES, any other (parsed
        whole) at `answer_cap()`, both before anything is parsed. At most `concurrency` reads are
        in flight; the wait for a free one counts against the read's time."""
        what, began = f"prometheus {self.url}", time.monotonic()
        if matrix:
            limit, too_large = MAX_RESPONSE_BYTES, ""
        else:
            limit, too_large = answer_cap(), raise_cap_hint("narrow the window or select fewer series")
        budget = self.timeout_s if self.deadline is None else min(self.timeout_s, self.deadline - began)
        if budget <= 0:
            raise PromError(f"{what}: the diagnosis' time is up; no more queries are sent")
        if not self._in_flight.acquire(timeout=budget):
            raise PromError(
                f"{what}: no answer in {budget:.0f} s: this client's {self.concurrency} queries in flight were "
                "all still running (the server is slow or overloaded: allow more time or narrow the window)"
            )
        try:
            seconds = budget - (time.monotonic() - began)
            if seconds <= 0:
                raise PromError(f"{what}: no answer in {budget:.0f} s (waited for a query in flight to end)")
            on_status = partial(http_error, self.url)
            return read_url(self.url + path, what, seconds, limit, form, PromError, on_status, too_large)
        finally:
            self._in_flight.release()

    # ---------------------------------------------------------------- bounded range queries
    def plan_chunks(
        self, start: float, end: float, step: float, series: int = 0, reach_s: float = 0.0, what: str = ""
    ) -> list[tuple[float, float]]:
        """[start, end] cut on the grid into parts of at most max_points steps whose estimated
        load, `series` x (steps + reach / step), stays under the sample budget."""
        steps = int(math.floor((end - start) / step + 1e-9)) + 1
        per_part = self.max_points
        if series > 0:
            budget = self.max_samples * SAMPLE_BUDGET
            per_part = min(per_part, max(1, int(budget // series - reach_s / step)))
        n_parts = max(1, math.ceil(steps / per_part))
        if n_parts > 1:
            self.note(
                f"{what or 'query'}: {steps} steps cut into {n_parts} time ranges "
                f"(at most {self.max_points} points per series, ~{series} series each "
                f"under {int(self.max_samples * SAMPLE_BUDGET):,} samples)"
            )
        size = math.ceil(steps / n_parts)
        return [(start + k * step, start + min(steps - 1, k + size - 1) * step) for k in range(0, steps, size)]

    def range_parts(
        self, expr: str, start: float, end: float, step: float, series: int = 0, reach_s: float = 0.0, what: str = ""
    ) -> list[dict[str, Any]]:
        """A range query of any length: split by plan_chunks, parts run concurrently, a part the
        server rejects for its sample limit halved and retried; the answers' series merged."""
        chunks = self.plan_chunks(start, end, step, series, reach_s, what)
        return merge_matrices(self.map(lambda c: self._bisecting(expr, c[0], c[1], step, what, 0), chunks))

    def _bisecting(
        self, expr: str, start: float, end: float, step: float, what: str, depth: int
    ) -> list[dict[str, Any]]:
        try:
            return self.query_range(expr, start, end, step)
        except PromError as exc:
            steps = int(round((end - start) / step)) + 1
            if not exc.too_many_samples or steps < 2 or depth >= MAX_BISECT:
                raise
            mid = start + (steps // 2) * step
            self.note(f"{what or 'query'}: the server refused {steps} steps (too many samples); split in two")
            halves = [(start, mid - step), (mid, end)]
            return merge_matrices([self._bisecting(expr, a, b, step, what, depth + 1) for a, b in halves])

    def map(self, fn: Callable[[Any], Any], items: list[Any]) -> list[Any]:
        """fn over items on at most twice `concurrency` threads, results in order: at most
        `concurrency` queries in flight (`_read`), the other threads decoding the answers."""
        if len(items) <= 1 or self.concurrency <= 1:
            return [fn(x) for x in items]
        with ThreadPoolExecutor(max_workers=min(2 * self.concurrency, len(items))) as pool:
            return list(pool.map(fn, items))

    def note(self, text: str) -> None:
        with self._lock:
            if text not in self.notes:
                self.notes.append(text)

    def say(self, text: str) -> None:
        """Progress for long fetches (stderr in the commands)."""
        if self.progress is not None:
            self.progress(text)


def _items(result: Any) -> list[Any]:
    if result is None:
        return []
    if not isinstance(result, list):
        raise TypeError(f"result is {type(result).__name__}, not a list")
    return result


def _series(item: Any, key: str) -> dict[str, Any]:
    """One matrix series (`key` "values") or vector sample ("value") checked and read: labels as
    str, points as float (time, value) pairs ("NaN" and "+Inf" read as numbers). Raises TypeError
    or ValueError for any other shape."""
    if not isinstance(item, dict) or not isinstance(item.get("metric", {}), dict):
        raise TypeError(f"{quoted(item, 60)} is not {{metric: {{...}}, {key}: ...}}")
    metric = {str(k): str(v) for k, v in (item.get("metric") or {}).items()}
    raw = item.get(key)
    if key == "value":
        return {"metric": metric, "value": _point(raw) if raw is not None else None}
    if raw is not None and not isinstance(raw, list):
        raise TypeError(f"values is {type(raw).__name__}, not a list")
    pairs = [_point(p) for p in raw or []]
    return {"metric": metric, "values": np.array(pairs, dtype=float).reshape(-1, 2)}


def _point(p: Any) -> tuple[float, float]:
    if not isinstance(p, list | tuple) or len(p) != 2 or not all(isinstance(x, str | int | float) for x in p):
        raise TypeError(f"{quoted(p, 40)} is not [time, value]")
    return float(p[0]), float(p[1])


def _typed_matrix(raw: bytes | bytearray) -> dict[str, Any] | None:
    """A successful matrix answer as {"resultType", "result": [{"metric", "values": float array
    (n, 2) of (time, value)}]}, decoded one series at a time, so that an answer of N bytes takes
    about N / 2 more (16 bytes a point) rather than Python objects for every point; None for
    anything else (errors, other result types). Raises TypeError or ValueError for a series
    whose values are not [time, value] pairs."""
    try:
        doc = _MATRIX.decode(raw)
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        return None
    if doc.status != "success" or doc.data is None or doc.data.resultType != "matrix":
        return None
    result = [{"metric": s.metric, "values": _points(s.values)} for s in doc.data.result]
    return {"resultType": "matrix", "typed": True, "result": result}


def _points(raw: msgspec.Raw) -> np.ndarray:
    """One series' raw JSON values -> float array (n, 2)."""
    try:
        pairs = _POINTS.decode(raw)
    except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
        text = bytes(raw).replace(b'"+Inf"', b'"Inf"')  # Prometheus' spelling; msgspec reads "Inf"
        try:
            pairs = _POINTS.decode(text)
        except (msgspec.ValidationError, msgspec.DecodeError, RecursionError) as exc:
            raise ValueError(printable(exc, 120)) from None
    return np.fromiter(chain.from_iterable(pairs), float, 2 * len(pairs)).reshape(-1, 2)


def as_points(values: Any) -> np.ndarray:
    """A series' values (a float array from this client, or [[t, "v"], ...] text) as float (n, 2)."""
    if isinstance(values, np.ndarray):
        return values
    return np.asarray(values if values else np.empty((0, 2)), dtype=float).reshape(-1, 2)


_TOO_LARGE = (
    "too many samples",
    "max-samples",
    "maxsamplesperquery",
    "exceeded maximum resolution",
    "too many points",
    "maxpointsperseries",
)
"""How Prometheus, Mimir/Thanos and VictoriaMetrics say a query is over their size limits."""


def http_error(url: str, failure: FetchError) -> PromError:
    """What an HTTP error status means for a query, in words (the server's text made printable)."""
    text, code = failure.text, failure.status
    if code == 404:
        return PromError(
            f"prometheus {url}: HTTP 404 ({text}); is {url} the base URL of a Prometheus-compatible "
            "API (the part before /api/v1)?",
            code,
        )
    low = text.lower().replace("_", "")
    if any(k in low for k in _TOO_LARGE):
        return PromError(
            f"prometheus {url}: HTTP {code}: the server refused the query for its size: {text}. "
            "Raise --step, narrow the window, or raise the server's limit (Prometheus "
            "--query.max-samples, VictoriaMetrics -search.maxSamplesPerQuery / "
            "-search.maxPointsPerTimeseries)",
            code,
            too_many_samples=True,
        )
    if code in (400, 422):
        return PromError(f"prometheus {url}: HTTP {code}: the server rejected the query: {text}", code)
    if code == 503 or code == 504:
        return PromError(
            f"prometheus {url}: HTTP {code}: the server is overloaded or the query timed out: {text} "
            "(narrow the window, raise --step, or the server's --query.timeout)",
            code,
        )
    if code in (401, 403):
        return PromError(f"prometheus {url}: HTTP {code}: not authorised ({text})", code)
    return PromError(f"prometheus {url}: HTTP {code}: {text}", code)


def _ts(t: float) -> str:
    return f"{t:.3f}"


def on_step(t: float, step: float) -> bool:
    """Whether t (seconds) is a multiple of step, to the millisecond the API speaks."""
    ms = round(step * 1000)
    return ms <= 0 or round(t * 1000) % ms == 0


def merge_matrices(parts: Iterable[list[dict[str, Any]]]) -> list[dict[str, Any]]:
    """Matrices of consecutive time ranges -> one: the values of a series concatenated in order."""
    parts = list(parts)
    if len(parts) == 1:
        return parts[0]
    out: dict[tuple, dict[str, Any]] = {}
    for part in parts:
        for series in part:
            metric = series.get("metric") or {}
            have = out.setdefault(tuple(sorted(metric.items())), {"metric": metric, "values": []})
            have["values"].append(as_points(series.get("values")))
    for have in out.values():
        have["values"] = np.concatenate(have["values"]) if have["values"] else np.empty((0, 2))
    return list(out.values())


def matrix_on_grid(
    result: list[dict[str, Any]], start: float, step: float, n: int
) -> tuple[list[dict[str, str]], np.ndarray]:
    """(label dicts, values [series, n]) of a matrix on the grid start + k x step; NaN where a
    series has no point. Non-numeric values ("NaN", "+Inf") stay as floats (NaN / inf). A series
    whose first and last points are k - 1 steps apart on the grid, as a range query's answer is
    where the series has no gap, is copied as one slice (a third of the time of placing each
    point, for the many short series of a pool's hour)."""
    metrics = [dict(s.get("metric") or {}) for s in result]
    out = np.full((len(result), n), np.nan)
    for i, series in enumerate(result):
        arr = as_points(series.get("values"))
        k = len(arr)
        if not k:
            continue
        first = (float(arr[0, 0]) - start) / step
        if first.is_integer() and 0 <= first <= n - k and float(arr[-1, 0]) == start + (first + k - 1) * step:
            out[i, int(first) : int(first) + k] = arr[:, 1]  # an answer's times rise: k points on k grid times
            continue
        pos = np.rint((arr[:, 0] - start) / step)
        ok = np.isfinite(pos) & (pos >= 0) & (pos < n)
        out[i, pos[ok].astype(np.int64)] = arr[ok, 1]
    return metrics, out
