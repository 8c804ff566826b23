"""Where the diagnoser reads a window of canonical series from.

Every source implements `window.Source` and is read through `window.read_window`: the `Frame`
of the canonical series asked for on a grid with Prometheus' lookback, plus engine facts
(SourceError when it cannot be read). The same data gives the same frame from each:
recording.py, logs.py, agent.py, store.py, prometheus.py.
"""

from __future__ import annotations

from collections.abc import Callable

from kvscope.diagnoser.sources.http import FetchError, fetch


class SourceError(RuntimeError):
    """The source could not be read (file, HTTP, malformed answer); the message says which."""


def read_url(
    url: str,
    what: str,
    timeout_s: float,
    max_bytes: int,
    data: bytes | None = None,
    error: type[SourceError] = SourceError,
    on_status: Callable[[FetchError], SourceError] | None = None,
) -> bytearray:
    """The body of one synchronous HTTP GET (or form POST of `data`), at most `max_bytes`, read
    whole within `timeout_s` seconds, connect to last byte (http.fetch). An error status raises
    `on_status(failure)` (else `error`); no answer, a late, larger or malformed one raises
    `error` with one printable line that starts with `what`."""
    try:
        return fetch(url, what, timeout_s, max_bytes, data)[0]
    except FetchError as exc:
        raise (on_status(exc) if on_status and exc.status else error(str(exc))) from None
