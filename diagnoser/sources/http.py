"""The diagnoser's one way to make an outbound HTTP read: an overall deadline, bounded bodies, clean errors.

urllib's `timeout` bounds each socket operation, and name resolution not at all, so a server that
sends one byte every 2 s (or a resolver that never answers) keeps a read going for as long as it
likes. `fetch` gives the whole exchange (name lookup, connect, status line, headers, body) one
deadline: the lookup runs on a thread waited for only as long as the deadline leaves (at most
MAX_LOOKUPS such threads in the process, one per name, so a resolver that never answers leaves a
bounded number behind and then fails new lookups at once, counted in `LOOKUPS`), and then
a watchdog shuts the connection's socket down when the deadline passes, which ends any read
blocked on it at once. The body is read in pieces into a buffer sized from what
the answer declares (Content-Length) and refused, with the size in words, before it grows past
the cap. Every way an answer can be malformed (status line, headers, chunking) ends as one
`FetchError` line naming the URL and what was wrong; `printable` strips what a server wrote from
control characters before it can reach a terminal.
"""

from __future__ import annotations

import functools
import http.client
import json
import os
import re
import reprlib
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from typing import Any

CHUNK = 1 << 20
"""Bytes read per call while the deadline is checked in between."""
MAX_ERROR_CHARS = 500

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


class Deadline:
    """A point in time (monotonic) after which every socket registered here is shut down."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.at = time.monotonic() + seconds
        self.expired = False
        self._lock = threading.Lock()
        self._socks: list[socket.socket] = []
        self._timer: threading.Timer | None = None

    def left(self) -> float:
        return self.at - time.monotonic()

    def watch(self, sock: socket.socket) -> None:
        """Shut `sock` down when the deadline passes (at once if it already has)."""
        with self._lock:
            self._socks.append(sock)
            if self._timer is None:
                self._timer = threading.Timer(max(0.0, self.left()), self._expire)
                self._timer.daemon = True
                self._timer.start()
        if self.left() <= 0:
            self._expire()

    def _expire(self) -> None:
        with self._lock:
            self.expired = True
            socks, self._socks = self._socks, []
        for sock in socks:
            try:  # socket.socket's own shutdown: an SSL socket's would drop its state under a reader
                socket.socket.shutdown(sock, socket.SHUT_RDWR)
            except OSError:
                pass

    def close(self) -> None:
        """Stop the watchdog (joined: no thread outlives the read, so forking stays safe)."""
        with self._lock:
            timer, self._timer, self._socks = self._timer, None, []
        if timer is not None:
            timer.cancel()
            if timer is not threading.current_thread():
                timer.join()


class ResolveTimeout(TimeoutError):
    """The host name did not resolve before the deadline (the resolver is slow or unreachable)."""

    def __init__(self, host: str) -> None:
        super().__init__(f"the name {host} did not resolve in time")
        self.host = host


class ResolverStuck(ResolveTimeout):
    """Every lookup slot is held by a lookup that its callers gave up on: the resolver is not
    answering, so `host` is not looked up at all (no thread is started for it)."""

    def __init__(self, host: str, stuck: int, oldest_s: float) -> None:
        super().__init__(host)
        self.stuck, self.oldest_s = stuck, oldest_s


MAX_LOOKUPS = 8
"""Name lookups in flight at once, process-wide. getaddrinfo cannot be cancelled, so a lookup
past its caller's deadline is abandoned, still holding its slot until the resolver answers."""


class _Lookup:
    """One getaddrinfo on its own thread, shared by every caller asking for the same (host, port)
    while it runs."""

    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.started = time.monotonic()
        self.done = threading.Event()
        self.infos: list[Any] = []
        self.error: BaseException | None = None
        self.abandoned = False  # a caller's deadline passed while it ran


class Lookups:
    """The process's name lookups: at most `limit` threads in getaddrinfo at once, one per
    (host, port), and a count of those abandoned (`abandoned_total`, `in_flight()`, `stuck()`:
    what `kvscope serve` exports on /metrics)."""

    def __init__(self, limit: int = MAX_LOOKUPS) -> None:
        self.limit = limit
        self.abandoned_total = 0
        self._cond = threading.Condition()
        self._running: dict[tuple[str, int], _Lookup] = {}

    def in_flight(self) -> int:
        """Lookups whose thread is in getaddrinfo now (abandoned ones included)."""
        with self._cond:
            return len(self._running)

    def stuck(self) -> int:
        """Lookups still in getaddrinfo after a caller gave up on them."""
        with self._cond:
            return sum(lookup.abandoned for lookup in self._running.values())

    def resolve(self, host: str, port: int, deadline: Deadline) -> list[Any]:
        """getaddrinfo(host, port) for a stream socket, within `deadline`: raises ResolveTimeout
        when it passes (the lookup runs on, for whoever asks next), ResolverStuck at once when
        every slot is held by an abandoned lookup, or the resolver's own error."""
        lookup = self._join_or_start(host, port, deadline)
        if not lookup.done.wait(max(0.0, deadline.left())):
            with self._cond:
                if not lookup.done.is_set() and not lookup.abandoned:
                    lookup.abandoned = True
                    self.abandoned_total += 1
            raise ResolveTimeout(host)
        if lookup.error is not None:
            raise lookup.error
        return lookup.infos

    def _join_or_start(self, host: str, port: int, deadline: Deadline) -> _Lookup:
        """The lookup of (host, port) in flight, or a new one once a slot is free (waited for
        within the deadline)."""
        key = (host, port)
        with self._cond:
            while (lookup := self._running.get(key)) is None and len(self._running) >= self.limit:
                stuck = [other for other in self._running.values() if other.abandoned]
                if len(stuck) >= self.limit:
                    oldest = time.monotonic() - min(other.started for other in stuck)
                    raise ResolverStuck(host, len(stuck), oldest)
                left = deadline.left()
                if left <= 0 or not self._cond.wait(left):
                    raise ResolveTimeout(host)
            if lookup is not None:
                return lookup
            lookup = self._running[key] = _Lookup(host, port)
        try:
            threading.Thread(target=self._run, args=(lookup,), name=f"resolve {host}", daemon=True).start()
        except RuntimeError as exc:  # no thread to be had: the slot is given back
            lookup.error = OSError(f"cannot start a name lookup: {exc}")
            self._finish(lookup)
        return lookup

    def _run(self, lookup: _Lookup) -> None:
        try:
            lookup.infos = socket.getaddrinfo(lookup.host, lookup.port, 0, socket.SOCK_STREAM)
        except (OSError, UnicodeError) as exc:
            lookup.error = exc
        finally:
            self._finish(lookup)

    def _finish(self, lookup: _Lookup) -> None:
        with self._cond:
            self._running.pop((lookup.host, lookup.port), None)
            lookup.done.set()
            self._cond.notify_all()

    def forget(self) -> None:
        """In a forked child: the parent's lookup threads do not exist here, so their slots are free."""
        self._cond = threading.Condition()
        self._running = {}


LOOKUPS = Lookups()
"""The process's one set of lookups."""
os.register_at_fork(after_in_child=LOOKUPS.forget)


def _resolve(host: str, port: int, deadline: Deadline) -> list[Any]:
    """getaddrinfo within the deadline. The C resolver takes no timeout (glibc waits out its own
    timeouts and retries per nameserver), so a name is resolved through LOOKUPS: on a thread
    waited for only as long as the deadline leaves, then abandoned (it ends when the resolver
    answers), with at most MAX_LOOKUPS such threads in the process."""
    try:
        return socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM, 0, socket.AI_NUMERICHOST)
    except (socket.gaierror, UnicodeError):
        pass  # a name, not an address
    return LOOKUPS.resolve(host, port, deadline)


def _connect(deadline: Deadline, address: tuple[str, int], timeout: float, source: Any = None) -> socket.socket:
    """socket.create_connection with the name resolved, and every address tried, within `deadline`."""
    host, port = address
    error: OSError | None = None
    for family, kind, proto, _, sockaddr in _resolve(host, port, deadline):
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(max(0.001, min(timeout, deadline.left())))
            if source:
                sock.bind(source)
            sock.connect(sockaddr)
            return sock
        except OSError as exc:
            error = exc
            sock.close()
    raise error or OSError(f"no address for {host}")


def _connection(base: type[http.client.HTTPConnection], deadline: Deadline) -> Callable[..., Any]:
    class _Watched(base):  # type: ignore[valid-type, misc]
        def connect(self) -> None:
            asked: float | None = getattr(self, "timeout", None)
            self.timeout = max(0.001, min(asked or deadline.seconds, deadline.left()))
            self._create_connection = functools.partial(_connect, deadline)
            super().connect()
            deadline.watch(self.sock)

    return _Watched


class _HTTP(urllib.request.HTTPHandler):
    def __init__(self, deadline: Deadline) -> None:
        super().__init__()
        self.deadline = deadline

    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_connection(http.client.HTTPConnection, self.deadline), req)


class _HTTPS(urllib.request.HTTPSHandler):
    def __init__(self, deadline: Deadline) -> None:
        super().__init__()
        self.deadline = deadline

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_connection(http.client.HTTPSConnection, self.deadline), req)


def fetch(
    url: str,
    what: str,
    timeout_s: float,
    max_bytes: int,
    data: bytes | None = None,
    headers_only: bool = False,
    too_large: str = "",
) -> tuple[bytearray, http.client.HTTPMessage]:
    """(body, headers) of one GET (or form POST of `data`) that ends within `timeout_s` seconds,
    connect to last byte, with a body of at most `max_bytes`. Raises FetchError (message starting
    with `what`) for no answer, an error status, the deadline, a larger answer, or a malformed one.
    `headers_only` skips the body. `too_large` says what to do about an answer past `max_bytes`
    (default: TOO_LARGE, a range query's remedies)."""
    deadline = Deadline(timeout_s)
    opener = urllib.request.build_opener(_HTTP(deadline), _HTTPS(deadline))
    try:
        with opener.open(urllib.request.Request(url, data=data), timeout=timeout_s) as resp:
            body = bytearray() if headers_only else _read_body(resp, what, max_bytes, deadline, too_large)
            return body, resp.headers
    except urllib.error.HTTPError as exc:
        with exc:
            text = _error_body(exc)
        raise FetchError(f"{what}: HTTP {exc.code}: {text}", exc.code, text) from None
    except FetchError:
        raise
    except (urllib.error.URLError, http.client.HTTPException, OSError, ValueError) as exc:
        raise _mapped(exc, what, timeout_s, deadline) from None
    finally:
        deadline.close()


def _mapped(exc: BaseException, what: str, timeout_s: float, deadline: Deadline) -> FetchError:
    """The FetchError for an exchange that failed with `exc`."""
    late = getattr(exc, "reason", exc)
    if isinstance(late, ResolverStuck):
        return FetchError(
            f"{what}: the DNS resolver is not answering: {late.stuck} name lookups have waited on it for up to "
            f"{late.oldest_s:.0f} s, so {printable(late.host, 200)} was not looked up (check the resolver, or use "
            "an address instead of a name)",
            timed_out=True,
        )
    if isinstance(late, ResolveTimeout):
        return FetchError(
            f"{what}: the host name {printable(late.host, 200)} did not resolve within {timeout_s:.3g} s (the DNS "
            "resolver is slow or unreachable; check the name and the resolver, or raise the read timeout: --timeout)",
            timed_out=True,
        )
    if deadline.expired or isinstance(exc, TimeoutError) or "timed out" in str(exc):
        return FetchError(
            f"{what}: no complete answer within {timeout_s:.3g} s (the server is slow or stalled; "
            "raise the read timeout (--timeout), narrow the window or raise --step)",
            timed_out=True,
        )
    return FetchError(f"{what}: {_failure(exc)}")


class _Wire:
    """A socket stand-in that reads from bytes (`answer_from_bytes`)."""

    def __init__(self, raw: bytes) -> None:
        self.raw = raw

    def makefile(self, mode: str) -> Any:
        import io

        return io.BufferedReader(io.BytesIO(self.raw))


def answer_from_bytes(raw: bytes, what: str, max_bytes: int) -> bytearray:
    """The body `fetch` reads from an answer whose wire bytes are `raw` (status line, headers,
    framing and body parsed by the same code, with the same errors): the fuzz bench's entry."""
    deadline = Deadline(60.0)
    resp = http.client.HTTPResponse(_Wire(raw), method="POST")  # type: ignore[arg-type]
    try:
        resp.begin()
        if resp.status >= 400:
            text = printable(resp.read(65536).decode("utf-8", "replace").strip() or resp.reason, MAX_ERROR_CHARS)
            raise FetchError(f"{what}: HTTP {resp.status}: {text}", resp.status, text)
        return _read_body(resp, what, max_bytes, deadline)
    except FetchError:
        raise
    except (http.client.HTTPException, OSError, ValueError) as exc:
        raise _mapped(exc, what, 60.0, deadline) from None
    finally:
        resp.close()


TOO_LARGE = "narrow the window, raise --step or select fewer series"
"""What to do about a range query's answer past the cap."""


def _read_body(
    resp: http.client.HTTPResponse, what: str, max_bytes: int, deadline: Deadline, too_large: str = ""
) -> bytearray:
    """The body, read in CHUNK pieces within `deadline`; refused, before it grows past `max_bytes`,
    with the cap in words and `too_large` (what to do) in the message."""
    remedy = too_large or TOO_LARGE
    declared = (resp.headers.get("Content-Length") or "").strip()
    digits = declared.isascii() and declared.isdigit()
    size = int(declared) if digits and len(declared) <= 18 else -1
    if size > max_bytes or (digits and size < 0):
        said = in_words(size) if size >= 0 else f"a {len(declared)}-digit length"
        raise FetchError(
            f"{what}: the answer declares {said}, more than the {in_words(max_bytes)} read at most; {remedy}"
        )
    buf = bytearray(max(size, 0))
    view, got = memoryview(buf), 0
    while got != size:
        if got == len(buf):  # undeclared (chunked) or longer than declared: grow, up to the cap
            if got > max_bytes:
                raise FetchError(f"{what}: the answer is larger than the {in_words(max_bytes)} read at most; {remedy}")
            view.release()
            buf.extend(bytes(min(max(CHUNK, got // 2), max_bytes + 1 - got) or 1))
            view = memoryview(buf)
        n = resp.readinto(view[got : got + CHUNK])
        if not n:
            break
        got += n
        if deadline.expired:
            raise TimeoutError
    view.release()
    if 0 <= got < size:
        raise FetchError(f"{what}: the answer ended early: {got} of the {size} bytes it declared")
    del buf[got:]
    return buf  # not copied to bytes: callers decode it as it is


def _error_body(exc: urllib.error.HTTPError) -> str:
    try:
        raw = exc.read(65536)
    except (OSError, http.client.HTTPException, ValueError):
        raw = b""
    text = raw.decode("utf-8", "replace").strip()
    try:
        doc = json.loads(raw) if raw[:1] == b"{" else None
        if isinstance(doc, dict) and doc.get("error") is not None:
            text = str(doc["error"])
    except (ValueError, RecursionError):
        pass
    return printable(text or exc.reason, MAX_ERROR_CHARS)


def _failure(exc: BaseException) -> str:
    """What went wrong with the exchange, in words (one line, printable)."""
    reason = getattr(exc, "reason", None)
    if isinstance(exc, urllib.error.URLError) and not isinstance(reason, str):
        exc = reason if isinstance(reason, BaseException) else exc
    if isinstance(exc, http.client.BadStatusLine):
        return f"the answer's status line is not HTTP ({printable(exc, 100)!s}); is this an HTTP server?"
    if isinstance(exc, http.client.LineTooLong):
        return f"malformed answer: {printable(exc)} (a header or status line too long)"
    if isinstance(exc, http.client.IncompleteRead):
        return f"the answer ended early: {exc.partial.__len__()} bytes read, more expected"
    if isinstance(exc, http.client.HTTPException):
        return f"malformed answer: {printable(exc, 200) or type(exc).__name__}"
    if isinstance(exc, ConnectionResetError | BrokenPipeError | ConnectionAbortedError):
        return f"the connection was cut mid-answer ({printable(exc, 200)})"
    if isinstance(exc, ValueError):  # http.client's int() of a bad chunk size line
        return f"malformed answer (bad chunked encoding?): {printable(exc, 200)}"
    return f"cannot connect: {printable(getattr(exc, 'strerror', None) or exc, 200)}"
