"""Up-front checks of command-line values, so wrong usage fails with a message that says what to do.

Shared by the commands that read recordings, talk to Prometheus or an agent, or write files.
Every check raises ValueError with a message that names the flag, shows the value and gives an
example of a good one; the commands print it and exit with their usage status.
"""

from __future__ import annotations

import gzip
import re
import socket
import zlib
from pathlib import Path
from urllib.parse import urlsplit

from kvscope.core.scalars import parse_duration, parse_timestamp, split_host_port

SNIFF_BYTES = 8192
_SAMPLE_LINE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*(\{.*\})?\s+[-+]?([0-9.]|Inf|NaN)", re.IGNORECASE)
_DESCRIPTOR = re.compile(r"#\s+(HELP|TYPE|UNIT|EOF)\b")
_GZIP_MAGIC = b"\x1f\x8b"


def check_http_url(flag: str, value: str, example: str = "http://127.0.0.1:9090") -> str:
    """`value` if it is an http(s) URL with a host; else ValueError naming `flag`."""
    try:
        parts = urlsplit(value)
    except ValueError:  # "Invalid IPv6 URL": an unbalanced [ in the host
        parts = None
    if parts is None or parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError(f"{flag}: expected an http:// or https:// URL such as {example}, got {value!r}")
    return value


_NETWORK_WORDS = "refused|urlopen error|timed out|name or service|no route|unreachable|cannot connect".split("|")
API_PATH = {"prometheus": "/api/v1/query_range", "agent": "/api/v1/samples"}
SERVER = {"prometheus": "Prometheus-compatible API", "agent": "kvscope agent"}
OTHER = {"prometheus": "--agent for a kvscope agent", "agent": "--prometheus for a Prometheus"}


def source_hint(kind: str, url: str, message: str) -> str:
    """`message` plus what to check: reachability, or (an HTTP 4xx) whether `url` is the base URL of
    the kind of server the flag expects."""
    if any(word in message.lower() for word in _NETWORK_WORDS):
        return f"{message}\n  is it running and reachable from here? try: curl -s {url.rstrip('/')}/-/ready"
    if re.search(r"HTTP( Error)? 40[45]", message) and "base URL" not in message:
        message += (
            f"\n  is {url} the base URL of a {SERVER.get(kind, 'server')}? kvscope calls "
            f"{url.rstrip('/')}{API_PATH.get(kind, '')} (no /metrics path; {OTHER.get(kind, '')})"
        )
    return message


def _head(path: Path) -> bytes:
    """The first bytes of `path`, gunzipped when it is gzip. Raises ValueError for a bad gzip."""
    with path.open("rb") as fh:
        raw = fh.read(SNIFF_BYTES)
    if not raw.startswith(_GZIP_MAGIC):
        if path.name.endswith(".gz"):
            raise ValueError(f"recording {path} ends in .gz but is not gzip-compressed")
        return raw
    try:
        with gzip.open(path, "rb") as fh:
            return fh.read(SNIFF_BYTES)
    except (OSError, EOFError, zlib.error) as exc:
        raise ValueError(f"recording {path} is not a readable gzip file: {exc}") from exc


def check_recording(path: str | Path) -> Path:
    """`path` if it looks like an OpenMetrics recording; else ValueError saying what it is instead.

    Reads only the first few KiB: the full parse (and its own errors) is left to the reader.
    """
    path = Path(path)
    if not path.exists():
        raise ValueError(f"recording {path} does not exist")
    if not path.is_file():
        raise ValueError(f"recording {path} is not a file")
    if path.stat().st_size == 0:
        raise ValueError(
            f"recording {path} is empty (0 bytes); record one with: "
            "kvscope record --target URL --duration 10m --out FILE.om.gz"
        )
    head = _head(path)
    text = head.decode("utf-8", errors="replace")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    # free comments may precede the data; the first other line must be a descriptor or a sample
    first = next(
        (line for line in lines if not line.startswith("#") or _DESCRIPTOR.match(line)), lines[0] if lines else ""
    )
    if "\x00" in text:
        raise ValueError(f"recording {path} is binary, not OpenMetrics text (make one with kvscope record)")
    if not (_DESCRIPTOR.match(first) or _SAMPLE_LINE.match(first)):
        shown = first[:60].encode("ascii", "backslashreplace").decode()
        raise ValueError(
            f"recording {path} is not OpenMetrics text: found {shown!r} "
            "(expected '# TYPE ...' or 'metric{labels} value timestamp'; "
            "make one with kvscope record)"
        )
    return path


def check_output_file(flag: str, path: str | Path) -> Path:
    """`path` if its directory exists and it is not a directory itself; else ValueError."""
    path = Path(path)
    if path.is_dir():
        raise ValueError(f"{flag}: {path} is a directory; give a file name")
    if not path.parent.is_dir():
        raise ValueError(f"{flag}: directory {path.parent} does not exist")
    return path


def parse_seconds(flag: str, value: str) -> float:
    """A window length: plain seconds (1800) or a duration (30m, 1h, 1m30s). ValueError if neither."""
    try:
        seconds = parse_duration(value, loose=True)
    except ValueError:
        raise ValueError(f"{flag}: expected seconds or a duration such as 30m, 1h, 1m30s, got {value!r}") from None
    if not 0 < seconds < float("inf"):
        raise ValueError(f"{flag}: must be a finite number of seconds > 0, got {value!r}")
    return seconds


def parse_time(flag: str, value: str) -> float:
    """A point in time: unix seconds (1763769600) or ISO 8601 (2026-11-22T00:00:00Z; no zone = UTC)."""
    try:
        return parse_timestamp(value, loose=True)
    except ValueError:
        raise ValueError(
            f"{flag}: expected unix seconds or ISO 8601 such as 2026-11-22T00:00:00Z, got {value!r}"
        ) from None


def parse_listen(flag: str, value: str) -> tuple[str, int]:
    """'HOST:PORT' (HOST may be empty for 127.0.0.1, or a [v6] literal) -> (host, port), as
    core.scalars.split_host_port reads every listen address; ValueError naming `flag` otherwise."""
    try:
        return split_host_port(value)
    except ValueError:
        raise ValueError(
            f"{flag}: expected HOST:PORT with a port 0-65535 such as 127.0.0.1:9465, got {value!r}"
        ) from None


def check_port_free(flag: str, host: str, port: int) -> None:
    """ValueError naming `flag` when nothing can bind host:port (another process holds it).

    Binds with SO_REUSEADDR, as the servers started afterwards do: a port that only has
    connections of a stopped server in TIME_WAIT is free for them, so a restart within a
    minute is not refused."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError as exc:
            raise ValueError(
                f"{flag}: cannot listen on {host}:{port}: {exc.strerror or exc}; pick another with {flag}"
            ) from None


def check_rules_dir(flag: str, path: str | Path | None) -> None:
    """ValueError unless `path` (when given) is a directory holding at least one *.yaml rule."""
    if path is None:
        return
    folder = Path(path)
    if not folder.is_dir():
        raise ValueError(f"{flag}: {folder} is not a directory (the shipped rules are used when {flag} is left out)")
    if not any(p for p in folder.glob("*.yaml") if not p.name.endswith(".test.yaml")):
        raise ValueError(f"{flag}: no rule files (*.yaml) in {folder}")
