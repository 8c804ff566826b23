"""Where the diagnoser reads a window of canonical series from.

Every source implements `window.Source` and is read through `window.read_window`: the `Frame`
of the canonical series asked for on a grid with Prometheus' lookback, plus engine facts
(SourceError when it cannot be read). The same data gives the same frame from each:
recording.py, logs.py, agent.py, store.py, prometheus.py.
"""

from __future__ import annotations

import urllib.error
import urllib.request
from collections.abc import Callable


class SourceError(RuntimeError):
    """The source could not be read (file, HTTP, malformed answer); the message says which."""


def read_url(
    url: str,
    what: str,
    timeout_s: float,
    max_bytes: int,
    data: bytes | None = None,
    error: type[SourceError] = SourceError,
    on_status: Callable[[urllib.error.HTTPError], SourceError] | None = None,
) -> bytes:
    """The body of one synchronous HTTP GET (or form POST of `data`), at most `max_bytes`. An error
    status raises `on_status(exc)` (else `error`); no answer, or a larger one, raises `error`
    with a message that starts with `what`."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, data=data), timeout=timeout_s) as resp:  # noqa: S310
            body = resp.read(max_bytes + 1)
    except urllib.error.HTTPError as exc:
        with exc:  # its body is read by on_status, then the connection closed
            failure = on_status(exc) if on_status else error(f"{what}: {exc}")
        raise failure from exc
    except (urllib.error.URLError, OSError) as exc:
        raise error(f"{what}: cannot connect: {getattr(exc, 'reason', exc)}") from exc
    if len(body) > max_bytes:
        raise error(f"{what}: answer larger than {max_bytes} bytes; narrow the window")
    return body
