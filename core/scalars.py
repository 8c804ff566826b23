"""The one reader of each scalar that config files, flags, rule files and payloads write as text:
durations, booleans, timestamps and listen addresses (`host:port`).

Every package imports it, so it sits in the shared kernel (core/) and imports nothing
of kvscope's (docs/architecture.md, "Layout"). A caller whose input legitimately differs picks
an option (`loose`) and words its own error around the ValueError; it never keeps a copy.
"""

from __future__ import annotations

import ipaddress
import re
from datetime import UTC, datetime
from typing import Any

UNIT_S = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0, "y": 365 * 86400.0}
"""Prometheus' duration units in seconds (a year is 365 days), the ones `prom_duration` writes."""

_UNIT = "ms|s|m|h|d|w|y"  # ms before m and s: the regex takes the first unit that fits
_PROM_PART = re.compile(rf"([0-9]+(?:\.[0-9]+)?)({_UNIT})")
_PROM = re.compile(rf"(?:{_PROM_PART.pattern})+")
_NUMBER = r"[0-9]*\.?[0-9]+(?:e[-+]?[0-9]+)?"
_LOOSE_PART = re.compile(rf"({_NUMBER})\s*({_UNIT})")
_LOOSE = re.compile(rf"(?:{_LOOSE_PART.pattern}\s*)+")
MAX_TEXT = 64
"""Longest duration or timestamp text read; a longer one is an error before any parsing."""


def parse_duration(value: Any, *, loose: bool = False) -> float:
    """A duration -> seconds: a number (int or float) is seconds; text is Prometheus' form,
    parts of a number and a unit (`30s`, `5m`, `1h30m`, `500ms`, `1w`), exactly as PromQL takes
    it (rule files, whose durations go into PromQL). `loose=True` reads text as people write it
    in a config file or a flag: a bare number is seconds (`2.5`, `1e3`), any case (`15S`),
    spaces around and before a unit (` 15 s `), `.5h`. ValueError if it is none of these."""
    if isinstance(value, bool):
        raise ValueError("a boolean is not a duration")
    if isinstance(value, int | float):
        return float(value)
    text = str(value).strip()
    if len(text) > MAX_TEXT:
        raise ValueError(f"not a duration: {text[:MAX_TEXT]!r}... (longer than {MAX_TEXT} characters)")
    if loose:
        text = text.lower()
        if re.fullmatch(_NUMBER, text):
            return float(text)
    part, whole = (_LOOSE_PART, _LOOSE) if loose else (_PROM_PART, _PROM)
    if not whole.fullmatch(text):
        raise ValueError(f"not a duration: {value!r} (use 30s, 5m, 1h, 1m30s)")
    return sum(float(n) * UNIT_S[u] for n, u in part.findall(text))


_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def parse_bool(value: Any) -> bool:
    """A boolean: True/False, or text 1/true/yes/on and 0/false/no/off in any case. ValueError
    for anything else (a typo is an error, never silently one of the two)."""
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise ValueError(f"not a boolean: {value!r} (use true or false)")


_STAMP = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})"
    r"(?:[Tt ]([0-9]{2}):([0-9]{2})(?::([0-9]{2})(?:\.([0-9]+))?)?([Zz]|[+-][0-9]{2}:[0-9]{2})?)?"
)


def parse_timestamp(text: Any, *, loose: bool = False) -> float:
    """RFC 3339 -> unix seconds: `2026-11-24T08:00:01.123456789Z` or a `+hh:mm` / `-hh:mm` offset
    (what Alertmanager and `kubectl logs --timestamps` write; nanoseconds are kept to float
    precision). `loose=True` reads a command-line time: a bare number is unix seconds, and a
    time without zone, or a date alone, is UTC. ValueError if it is none of these."""
    if not isinstance(text, str) or len(text) > MAX_TEXT:
        raise ValueError(f"not a timestamp: {text!r}")
    if loose:
        try:
            return float(text)
        except ValueError:
            pass
    m = _STAMP.fullmatch(text.strip() if loose else text)
    if m is None or (m.group(8) is None and not loose):
        raise ValueError(f"not a timestamp: {text!r} (use RFC 3339 such as 2026-11-22T00:00:00Z)")
    year, month, day, hour, minute, second, frac, zone = m.groups()
    try:
        moment = datetime(
            int(year), int(month), int(day), int(hour or 0), int(minute or 0), int(second or 0), tzinfo=UTC
        )
    except ValueError as exc:  # month 13, hour 25, February 30
        raise ValueError(f"not a timestamp: {text!r} ({exc})") from None
    offset = 0
    if zone and zone not in "Zz":
        hours, minutes = int(zone[1:3]), int(zone[4:6])
        if hours > 23 or minutes > 59:
            raise ValueError(f"not a timestamp: {text!r} (offset {zone})")
        offset = (hours * 3600 + minutes * 60) * (1 if zone[0] == "+" else -1)
    return moment.timestamp() + (float("0." + frac[:9]) if frac else 0.0) - offset


def iso_utc(t: float) -> str:
    """A Unix time as 2023-11-14T22:13:20Z (UTC, whole seconds); as a number where no date fits."""
    try:
        return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (ValueError, OverflowError, OSError):
        return f"{t:g}"


def split_host_port(address: str) -> tuple[str, int]:
    """A listen address, `host:port` or `[v6]:port` -> (host, port): the host an IP address or a
    name, none for 127.0.0.1; the port 0-65535 (0 picks a free one). Raises ValueError."""
    host, sep, port = address.rpartition(":")
    name = host.strip("[]")
    try:
        host_ok = not name or ipaddress.ip_address(name) is not None
    except ValueError:
        host_ok = re.fullmatch(r"[A-Za-z0-9.-]+", host) is not None
    if not (sep and host_ok and re.fullmatch(r"[0-9]{1,5}", port) and int(port) < 65536):
        raise ValueError(f"not host:port: {address!r}")
    return name or "127.0.0.1", int(port)
