"""kvscope's one way to make an outbound HTTP read (aiohttp, names looked up by core/resolve.py):
an overall deadline, bounded bodies, one-line errors.

`read` is the coroutine: the whole exchange (name lookup, connect, status line, headers, body) runs
under one `asyncio.timeout`, so a server that sends one byte every 2 s, or a resolver that never
answers, cannot stretch it. The body is refused, with the size in words, when its Content-Length
says it is past the cap, and while streaming before it grows past it. `fetch` is the same read for
synchronous callers (the CLI, the webhook's diagnosis threads, the UI): it runs on the process's one
client event loop, a daemon thread with one session, shared by every caller. Every failure is one
`FetchError` line naming what was read and what went wrong; `printable` strips what a server wrote
from control characters before it can reach a terminal.
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import json
import os
import re
import reprlib
import threading
from collections.abc import Coroutine
from typing import Any, TypeVar

import aiohttp
import yarl
from multidict import CIMultiDictProxy

from kvscope.core.resolve import Connector, ResolverStuck, ThreadResolver, dns_unanswered

T = TypeVar("T")

CHUNK = 1 << 20
"""Bytes taken from the connection per read of the body."""
MAX_ERROR_CHARS = 500
MAX_HEADERS = 100
"""Header lines an answer may have (as http.client's limit)."""
MAX_FIELD = 64 << 10
"""Bytes in one status or header line."""

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f\u2028\u2029\u202a-\u202e\u2066-\u2069]")


def printable(text: object, limit: int = 0, lines: bool = False) -> str:
    """`text` with every control character (escape codes, carriage returns, bidi overrides) shown
    as `?`, on one line (newlines and tabs as spaces; kept with `lines`); cut to `limit`
    characters when given (cut before it is looked at: a long text costs no more than `limit`)."""
    out = str(text)
    out = _CONTROL.sub("?", out[: 2 * limit + 64] if limit else out)
    out = out if lines else out.replace("\n", " ").replace("\t", " ").strip()
    return out if not limit or len(out) <= limit else out[:limit] + "…"


_REPR = reprlib.Repr()
_REPR.maxlevel, _REPR.maxstring, _REPR.maxother, _REPR.maxlong = 3, 60, 60, 40
_REPR.maxdict = _REPR.maxlist = _REPR.maxtuple = _REPR.maxset = _REPR.maxfrozenset = 4


def quoted(value: object, limit: int = 80) -> str:
    """What an answer held, for an error message: `repr` of at most a few items of at most a few
    levels (reprlib: a 400 MiB answer is never written out whole), printable, cut to `limit`."""
    return printable(_REPR.repr(value), limit)


def in_words(n: float) -> str:
    """A byte count as people say it: 512 MiB, 3.2 GiB, 900 bytes."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.3g} {unit}"
    return f"{int(n)} bytes"


class FetchError(RuntimeError):
    """The read failed; the message starts with what was read. `status` is the HTTP status when
    the server answered one (its error body in `text`), `timed_out` when the deadline passed."""

    def __init__(self, message: str, status: int = 0, text: str = "", timed_out: bool = False) -> None:
        super().__init__(message)
        self.status, self.text, self.timed_out = status, text, timed_out


TOO_LARGE = "narrow the window, raise --step or select fewer series"
"""What to do about a range query's answer past the cap."""

Headers = CIMultiDictProxy[str]


def new_session(**options: Any) -> aiohttp.ClientSession:
    """A client session for `read`: names looked up by core/resolve.py's ThreadResolver, no
    cookies, a new connection per read (`force_close`: no stale kept-alive socket), status and
    header lines of at most MAX_FIELD bytes; time is bounded by each read's deadline."""
    return aiohttp.ClientSession(
        connector=Connector(force_close=True, **options),
        timeout=aiohttp.ClientTimeout(total=None),
        cookie_jar=aiohttp.DummyCookieJar(),
        max_line_size=MAX_FIELD,
        max_field_size=MAX_FIELD,
    )


async def read(
    session: aiohttp.ClientSession,
    url: str,
    what: str,
    timeout_s: float,
    max_bytes: int,
    data: bytes | None = None,
    headers_only: bool = False,
    too_large: str = "",
) -> tuple[bytearray, Headers]:
    """(body, headers) of one GET (or form POST of `data`) that ends within `timeout_s` seconds,
    lookup to last byte, with a body of at most `max_bytes`. Raises FetchError (message starting
    with `what`) for no answer, an error status, the deadline, a larger answer, or a malformed one.
    `headers_only` skips the body. `too_large` says what to do about an answer past `max_bytes`
    (default: TOO_LARGE, a range query's remedies)."""
    host = host_of(url)
    asked = {"Accept-Encoding": "identity", "User-Agent": "kvscope"}
    if data is not None:
        asked["Content-Type"] = "application/x-www-form-urlencoded"
    try:
        async with (
            asyncio.timeout(timeout_s),
            session.request("POST" if data is not None else "GET", url, data=data, headers=asked) as resp,
        ):
            if len(resp.raw_headers) > MAX_HEADERS:
                raise FetchError(f"{what}: malformed answer: more than {MAX_HEADERS} headers")
            if resp.status >= 400:
                text = await _error_text(resp)
                raise FetchError(f"{what}: HTTP {resp.status}: {text}", resp.status, text)
            body = bytearray() if headers_only else await _body(resp, what, max_bytes, too_large)
            return body, resp.headers
    except FetchError:
        raise
    except TimeoutError:
        if dns_unanswered(session, host):
            lookups = getattr(session.connector, "lookups", None)
            if isinstance(lookups, ThreadResolver) and host:
                lookups.abandon(host)
            raise FetchError(
                f"{what}: the host name {printable(host, 200)} did not resolve within {timeout_s:.3g} s (the DNS "
                "resolver is slow or unreachable; check the name and the resolver, or raise the read timeout: "
                "--timeout)",
                timed_out=True,
            ) from None
        raise FetchError(
            f"{what}: no complete answer within {timeout_s:.3g} s (the server is slow or stalled; "
            "raise the read timeout (--timeout), narrow the window or raise --step)",
            timed_out=True,
        ) from None
    except (aiohttp.ClientError, OSError, ValueError) as exc:
        stuck = getattr(exc, "os_error", None)
        if isinstance(stuck, ResolverStuck):
            raise FetchError(
                f"{what}: the DNS resolver is not answering: {stuck.stuck} name lookups have waited on it for up "
                f"to {stuck.oldest_s:.0f} s, so {printable(stuck.host, 200)} was not looked up (check the "
                "resolver, or use an address instead of a name)",
                timed_out=True,
            ) from None
        raise FetchError(f"{what}: {_failure(exc)}") from None


async def _body(resp: aiohttp.ClientResponse, what: str, max_bytes: int, too_large: str = "") -> bytearray:
    """The body, streamed into a buffer sized from Content-Length; refused, before it grows past
    `max_bytes`, with the cap in words and `too_large` (what to do) in the message."""
    remedy = too_large or TOO_LARGE
    declared = (resp.headers.get("Content-Length") or "").strip()
    digits = declared.isascii() and declared.isdigit()
    size = int(declared) if digits and len(declared) <= 18 else -1
    if size > max_bytes or (digits and size < 0):
        said = in_words(size) if size >= 0 else f"a {len(declared)}-digit length"
        raise FetchError(
            f"{what}: the answer declares {said}, more than the {in_words(max_bytes)} read at most; {remedy}"
        )
    if "Content-Encoding" in resp.headers:
        size = -1  # decoded bytes are counted, not the declared ones
    buf = bytearray(max(size, 0))
    got = 0
    while chunk := await resp.content.read(CHUNK):
        end = got + len(chunk)
        if end > max_bytes:
            raise FetchError(f"{what}: the answer is larger than the {in_words(max_bytes)} read at most; {remedy}")
        if end <= len(buf):
            buf[got:end] = chunk
        else:
            del buf[got:]
            buf += chunk
        got = end
    if 0 <= got < size:
        raise FetchError(f"{what}: the answer ended early: {got} of the {size} bytes it declared")
    del buf[got:]
    return buf  # not copied to bytes: callers decode it as it is


async def _error_text(resp: aiohttp.ClientResponse) -> str:
    """An error answer's message: its JSON `error`, else its first 64 KiB as text, else the reason."""
    try:
        raw = await resp.content.read(65536)
    except (aiohttp.ClientError, OSError, ValueError):
        raw = b""
    text = raw.decode("utf-8", "replace").strip()
    try:
        doc = json.loads(raw) if raw[:1] == b"{" else None
        if isinstance(doc, dict) and doc.get("error") is not None:
            text = str(doc["error"])
    except (ValueError, RecursionError):
        pass
    return printable(text or resp.reason or "", MAX_ERROR_CHARS)


def host_of(url: str) -> str | None:
    """The host name of `url`; None for what is not a URL."""
    try:
        return yarl.URL(url).host
    except (ValueError, TypeError):
        return None


def _failure(exc: BaseException) -> str:
    """What went wrong with the exchange, in words (one line, printable)."""
    cause = exc.__cause__ or exc
    name = type(cause).__name__
    # aiohttp's parser errors: the words on the first line, the offending line after them
    said = str(getattr(cause, "message", None) or cause).strip().split("\n")[0].rstrip(":")
    if isinstance(exc, aiohttp.InvalidURL | aiohttp.NonHttpUrlClientError):
        return f"not a URL kvscope can read: {printable(exc, 200)}"
    if isinstance(exc, aiohttp.ClientConnectorError):
        os_error = exc.os_error  # asyncio's words are "Connect call failed (address)": the errno's are said
        said = os.strerror(os_error.errno) if os_error.errno else (os_error.strerror or str(os_error))
        return f"cannot connect: {printable(said, 200)}"
    if isinstance(exc, aiohttp.ClientPayloadError):
        return f"the answer ended early or its framing is bad (bad chunked encoding?): {printable(exc, 200)}"
    if isinstance(exc, aiohttp.ServerDisconnectedError | aiohttp.ClientOSError | ConnectionError):
        return f"the connection was cut mid-answer ({printable(exc, 200) or name})"
    if name == "BadStatusLine" or said.lower().startswith("bad status line"):
        return f"the answer's status line is not HTTP ({printable(said, 100)}); is this an HTTP server?"
    if name == "LineTooLong" or "too long" in said.lower() or "got more than" in said.lower():
        return f"malformed answer: {printable(said, 200)} (a header or status line too long)"
    if isinstance(exc, aiohttp.ClientResponseError | aiohttp.ClientError):
        return f"malformed answer: {printable(said, 200) or name}"
    return f"cannot connect: {printable(getattr(exc, 'strerror', None) or exc, 200)}"


class _Client:
    """The process's client event loop (one daemon thread) and its session."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.session: aiohttp.ClientSession | None = None
        threading.Thread(target=self.loop.run_forever, name="kvscope net", daemon=True).start()
        self.session = self.run(self._open())
        atexit.register(self.close)

    async def _open(self) -> aiohttp.ClientSession:
        return new_session(limit=0)

    def close(self, timeout_s: float = 1.0) -> None:
        """Close the session at exit (no "Unclosed client session" warning); a loop that does not
        answer within `timeout_s` is left to die with the process."""
        if self.session is not None and not self.session.closed and self.loop.is_running():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(self.session.close(), self.loop).result(timeout_s)

    def run(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result()


_client: _Client | None = None
_client_lock = threading.Lock()


def _forget() -> None:  # a forked child has no client thread: it starts its own
    global _client, _client_lock
    _client, _client_lock = None, threading.Lock()


os.register_at_fork(after_in_child=_forget)


def client() -> _Client:
    """The process's one client loop and session, started on first use."""
    global _client
    with _client_lock:
        if _client is None:
            _client = _Client()
        return _client


def lookups() -> ThreadResolver:
    """The name lookups of `fetch`'s session (what `kvscope serve` exports on /metrics)."""
    session = client().session
    resolver = getattr(session.connector, "lookups", None) if session is not None else None
    assert isinstance(resolver, ThreadResolver)
    return resolver


def fetch(
    url: str,
    what: str,
    timeout_s: float,
    max_bytes: int,
    data: bytes | None = None,
    headers_only: bool = False,
    too_large: str = "",
) -> tuple[bytearray, Headers]:
    """`read` for a synchronous caller, on the process's client loop (same arguments, same errors).
    Safe from any thread but that loop's own."""
    c = client()
    assert c.session is not None
    return c.run(read(c.session, url, what, timeout_s, max_bytes, data, headers_only, too_large))
