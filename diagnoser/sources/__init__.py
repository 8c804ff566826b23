"""Where the diagnoser reads a window of canonical series from.

Every source implements `window.Source` and is read through `window.read_window`: the `Frame`
of the canonical series asked for on a grid with Prometheus' lookback, plus engine facts
(SourceError when it cannot be read). The same data gives the same frame from each:
recording.py, logs.py, agent.py, store.py, prometheus.py.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from typing import Any

from kvscope.core.net import FetchError, fetch, printable, quoted


class SourceError(RuntimeError):
    """The source could not be read (file, HTTP, malformed answer); the message says which."""


MAX_ANSWER_MIB = 64
"""Default cap, in MiB, of an answer that is parsed whole into Python objects (a Prometheus instant
query, label values, the agent's API): such an answer takes about 5-10 times its size once parsed.
Range queries' matrices are decoded one series at a time and keep their own, larger cap."""
ENV_MAX_ANSWER = "KVSCOPE_MAX_ANSWER_MIB"


def answer_cap(env: dict[str, str] | None = None) -> int:
    """The cap in bytes of an answer parsed whole: MAX_ANSWER_MIB, or $KVSCOPE_MAX_ANSWER_MIB
    (a whole number of MiB from 1 to 65536; SourceError for anything else)."""
    text = (os.environ if env is None else env).get(ENV_MAX_ANSWER, "").strip()
    if not text:
        return MAX_ANSWER_MIB << 20
    if not (text.isascii() and text.isdigit() and 1 <= int(text) <= 65536):
        raise SourceError(f"{ENV_MAX_ANSWER}={text[:40]!r} is not a whole number of MiB from 1 to 65536")
    return int(text) << 20


def raise_cap_hint(what: str) -> str:
    """What to do about an answer past `answer_cap`: `what` (narrower asks), or the cap raised."""
    return f"{what}, or raise the cap with {ENV_MAX_ANSWER}=<MiB> (default {MAX_ANSWER_MIB})"


def read_url(
    url: str,
    what: str,
    timeout_s: float,
    max_bytes: int,
    data: bytes | None = None,
    error: type[SourceError] = SourceError,
    on_status: Callable[[FetchError], SourceError] | None = None,
    too_large: str = "",
) -> bytearray:
    """The body of one synchronous HTTP GET (or form POST of `data`), at most `max_bytes`, read
    whole within `timeout_s` seconds, connect to last byte (core/net.py `fetch`). An error status raises
    `on_status(failure)` (else `error`); no answer, a late, larger or malformed one raises
    `error` with one printable line that starts with `what`; past `max_bytes` it says `too_large`
    (what to do; default: a range query's remedies)."""
    try:
        return fetch(url, what, timeout_s, max_bytes, data, too_large=too_large)[0]
    except FetchError as exc:
        raise (on_status(exc) if on_status and exc.status else error(str(exc))) from None


def answer_data(
    raw: bytes | bytearray, who: str, path: str, error: type[SourceError] = SourceError, hint: str = ""
) -> Any:
    """The `data` of a Prometheus-style JSON answer `{"status", "data", "error"}` (Prometheus'
    HTTP API, the agent's), read from `who` (the source and its URL) at `path`. Else `error`
    with one line: the server's error text, or what is wrong (not JSON, then `hint`; no status
    "success" and no error text)."""
    try:
        doc = json.loads(raw)
    except (ValueError, RecursionError) as exc:
        why = "nested too deep" if isinstance(exc, RecursionError) else printable(exc, 200)
        raise error(f"{who}{path}: the answer is not JSON ({why}){hint}") from None
    if not isinstance(doc, dict) or doc.get("status") != "success":
        said = doc.get("error") if isinstance(doc, dict) else None
        if isinstance(said, str) and said:
            raise error(f"{who}: {printable(said, 500)}")
        raise error(f'{who}{path}: malformed answer: no status "success" and no error text, got {quoted(doc)}')
    return doc.get("data")
