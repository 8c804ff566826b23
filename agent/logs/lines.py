"""One engine log line -> the stats it carries, or the reason it carries none.

Recognised: vLLM's periodic stats line (V0 and V1), V0's prefix-cache hit line, preemption
warning and `Speculative metrics:` line, V1's `SpecDecoding metrics:` and NIXL `KV Transfer
metrics:` lines; SGLang's `Prefill batch` / `Decode batch` lines and retraction warnings;
LMCache's per-request lookup (`LMCache hit tokens`), retrieve (`Retrieved N out of M required
tokens`) and store (`Stored N out of total M tokens`) lines. A `kubectl logs`
`--prefix` (the pod becomes the instance) and `--timestamps` (RFC 3339, used instead of the
engine's own second-resolution time) are read first. SGLang lines may also start with a date-time
without brackets (`2026-06-07 10:59:31,659 [INFO] logger: Decode batch ...`, or `YYYY-MM-DD
HH:MM:SS LEVEL PID [file.py:line] ...` as forks print it). A recognised line with no time at all
(an excerpt pasted without its header) is returned with `ts` NaN and `missing` "time": the reader
orders such lines as printed when no line of the log has a time (agent/logs/series.py). The
formats and the releases that print them: docs/logs.md. Parsing is str.find/partition/split only:
linear in the line, no regex."""

from __future__ import annotations

import calendar
import datetime
from typing import NamedTuple

from kvscope.core.scalars import parse_timestamp

MAX_LINE = 16384
"""Characters; a longer line is skipped (reason too_long), never parsed."""
MAX_VALUE = 32
"""Characters of one field value; a longer one is a bad_value."""

# upstream field name -> (internal key, scale); None: known, read by nothing here
VLLM_FIELDS: dict[str, tuple[str, float] | None] = {
    "Avg prompt throughput": ("prompt_tps", 1.0),
    "Avg generation throughput": ("gen_tps", 1.0),
    "Running": ("running", 1.0),
    "Waiting": ("waiting", 1.0),
    "Pending": ("waiting", 1.0),
    "Swapped": ("swapped", 1.0),
    "Preemptions": ("preempt_n", 1.0),
    "GPU KV cache usage": ("kv", 0.01),
    "CPU KV cache usage": ("kv_cpu", 0.01),
    "XPU KV cache usage": ("kv", 0.01),
    "TPU KV cache usage": ("kv", 0.01),
    "Prefix cache hit rate": ("prefix_hit", 0.01),
    **dict.fromkeys(("Deferred", "KV fetch", "Corrupted", "External prefix cache hit rate", "MM cache hit rate")),
}
SGLANG_FIELDS: dict[str, tuple[str, float] | None] = {
    "#new-token": ("new", 1.0),
    "#cached-token": ("cached", 1.0),
    "#running-req": ("running", 1.0),
    "#queue-req": ("waiting", 1.0),
    "token usage": ("kv", 1.0),
    "full token usage": ("kv_full", 1.0),
    "swa token usage": ("kv_swa", 1.0),
    "gen throughput (token/s)": ("gen_tps", 1.0),
    **dict.fromkeys(
        (
            "#new-seq|#token|#full token|#swa token|mamba num|mamba usage|cuda graph|cpu graph|accept len|"
            "accept rate|cache hit rate|#inflight-req|#unbootstrapped-req|#transferring-req|#prealloc-req|"
            "#transfer-req|#retracted-req|pre-allocated usage|input throughput (token/s)|#pending-token|"
            "#replay-token|#bootstrap-req|#optimistic-req|cap len|block accept len|#host-receive-req"
        ).split("|")
    ),
}
VLLM_SPEC_FIELDS: dict[str, tuple[str, float] | None] = {  # vllm/v1/spec_decode/metrics.py, 0.8.3+
    "Accepted": ("spec_acc", 1.0),  # accepted draft tokens since the previous line (a count, reset)
    "Drafted": ("spec_draft", 1.0),  # drafted tokens since the previous line
    "Mean acceptance length": ("spec_len", 1.0),  # 1 + accepted / drafts: the bonus token included
    **dict.fromkeys(
        (
            "Draft acceptance rate",
            "Avg Draft acceptance rate",
            "Accepted throughput",
            "Drafted throughput",
            "Per-position acceptance rate",
        )
    ),
}
VLLM_V0_SPEC_FIELDS: dict[str, tuple[str, float] | None] = {  # vllm/engine/metrics.py, V0 (to 0.10)
    # The sampler's running totals since the engine started (vllm/spec_decode/metrics.py copies
    # them whole): a counter's value, not an increase. `Number of speculative tokens` is k.
    "Number of speculative tokens": ("spec_k", 1.0),
    "Number of accepted tokens": ("spec_acc_total", 1.0),
    "Number of draft tokens": ("spec_draft_total", 1.0),
    "Number of draft tokens tokens": ("spec_draft_total", 1.0),  # the earlier wording (0.4-0.5 era)
    **dict.fromkeys(
        (
            "Draft acceptance rate",  # accepted / draft of the totals: the whole run's, not the interval's
            "System efficiency",
            "Number of emitted tokens",
            "Number of emitted tokens tokens",
        )
    ),
}
KVXFER_FIELDS: dict[str, tuple[str, float] | None] = {
    # NIXL: nixl_connector.py / nixl/stats.py reduce(), 0.11+; Mooncake: mooncake/stats.py reduce()
    # (the same keys, and `Num failed recvs`), vLLM 0.32
    "Num successful transfers": ("xfer_n", 1.0),
    "Avg xfer time (ms)": ("xfer_s", 0.001),  # mean over the interval's transfers
    "Avg MB per transfer": ("xfer_bytes", 2.0**20),  # MiB: bytes / 2**20 in the source
    "Num failed transfers": ("xfer_fail", 1.0),  # NIXL: transfers + handshakes + notifications (0.33)
    "Num failed recvs": ("xfer_fail_recv", 1.0),  # Mooncake: pulls that failed on the receiving side
    "Num KV expired reqs": ("xfer_expired", 1.0),  # NIXL 0.32: leases expired (prefill) or declined reads
    "Num notifs after expiry": ("xfer_late", 1.0),  # NIXL 0.32: reads reported after the lease expired
    # The offloading connector (offloading/metrics.py reduce(), vLLM 0.32): its Prometheus names as
    # keys, each a count since the previous line; times in seconds.
    "vllm:kv_offload_load_bytes": ("offload_load_bytes", 1.0),
    "vllm:kv_offload_store_bytes": ("offload_store_bytes", 1.0),
    "vllm:kv_offload_load_time": ("offload_load_s", 1.0),
    "vllm:kv_offload_allocation_failure": ("offload_alloc_fail", 1.0),
    **dict.fromkeys(
        (
            "P90 xfer time (ms)",
            "Avg post time (ms)",
            "P90 post time (ms)",
            "Throughput (MB/s)",
            "Avg number of descriptors",
            "vllm:kv_offload_store_time",  # no canonical store-time signal
            *(
                f"vllm:kv_offload_{name}_{part}"
                for name in ("load_size", "store_size", "lookup_sync_delay_seconds", "lookup_async_delay_seconds")
                for part in ("count", "sum")
            ),
        )
    ),
}
LINE_FIELDS = {"spec": (VLLM_SPEC_FIELDS, ": "), "spec0": (VLLM_V0_SPEC_FIELDS, ": "), "kvxfer": (KVXFER_FIELDS, "=")}
"""vLLM's `<name> metrics: ` lines: kind -> (the fields known, the key-value separator)."""
LMCACHE_LOOKUP = "LMCache hit tokens: "
LMCACHE_RETRIEVE = ("Retrieved ", " out of ", " required tokens")
LMCACHE_STORE = ("Stored ", " out of total ", " tokens")  # v1/cache_engine.py store()
NIXL_EVENTS = (
    ("Releasing expired KV blocks for request ", "xfer_expired"),  # prefill: its lease elapsed, blocks freed
    ("Declining expired remote read for ", "xfer_expired"),  # bidirectional turn-2 read past the lease
    ("Potentially invalid KV blocks for unrecognized request ", "xfer_late"),  # a read of freed blocks
    ("Unrecognized request ", "xfer_late"),  # push mode: `... %s notif (may have expired).`, decode side
)
"""vLLM NIXL per-request lines (nixl/base_worker.py, pull_worker.py, push_worker.py in 0.32;
nixl_connector.py from 0.10): one event each, counted as the `KV Transfer metrics:` line counts it."""
SGLANG_RETRACT = (
    "KV cache pool is full. Retract requests.",
    "Decode out of memory happened.",
    "decode out of memory happened,",
)  # seen in 0.4.10-0.5.23 / 0.2.15-0.4.6 / 0.2.0


class Line(NamedTuple):
    """The stats of one recognised line. `kind`: stats (vLLM), prefix, preempt, spec0 (vLLM V0),
    spec, kvxfer (vLLM V1), xferevent (a vLLM NIXL per-request expiry line), prefill, decode, retract
    (SGLang), lookup, retrieve, store (LMCache).
    `source`: the pod of a `kubectl logs --prefix` header."""

    engine: str
    kind: str
    ts: float
    rank: str
    source: str
    fields: dict[str, float]
    unknown: tuple[str, ...] = ()
    missing: str = ""  # what the line's own time lacked and `day` supplied: year | date


def parse_line(line: str, day: datetime.date) -> Line | str:
    """A recognised line, or why not (other, too_long, no_timestamp, bad_value, tp_rank_copy).
    `day`: supplies the year of vLLM's own `MM-DD HH:MM:SS` time and the date of SGLang's
    `HH:MM:SS` (releases before its log format carried the date). A line with no time gets ts NaN."""
    if len(line) > MAX_LINE:
        return "too_long"
    kubectl = _kubectl_headers(line)
    if isinstance(kubectl, str):
        return kubectl
    source, kube_ts, line = kubectl
    for marker, kind in (
        ("Avg prompt throughput: ", "stats"),
        ("] Running: ", "stats"),  # V1 in 0.7.0
        ("Prefix cache hit rate: GPU: ", "prefix"),
        ("total_num_cumulative_preemption=", "preempt"),
        ("SpecDecoding metrics: ", "spec"),
        ("Speculative metrics: ", "spec0"),
        ("KV Transfer metrics: ", "kvxfer"),
    ):
        i = line.find(marker)
        if i >= 0:
            return _vllm(line, i + 2 * (marker[0] == "]"), kind, kube_ts, source, day.year)
    for marker, key in NIXL_EVENTS:
        if (i := line.find(marker)) >= 0 and (key != "xfer_late" or line.find("may have expired", i) >= 0):
            got = _vllm(line, i, "xferevent", kube_ts, source, day.year)
            return got if isinstance(got, str) else got._replace(fields={key: 1.0})
    if (
        (i := line.find(LMCACHE_LOOKUP)) >= 0
        or (i := _counted(line, LMCACHE_RETRIEVE)) >= 0
        or (i := _counted(line, LMCACHE_STORE)) >= 0
    ):
        return _lmcache(line, i, kube_ts, source, day.year)
    for marker, kind in (("Prefill batch", "prefill"), ("Decode batch", "decode"), ("#retracted_reqs: ", "retract")):
        i = line.find(marker)
        if i >= 0 and (kind != "retract" or any(line.find(w) >= 0 for w in SGLANG_RETRACT)):
            return _sglang(line, i, kind, kube_ts, source, day)
    return "other"


def _kubectl_headers(line: str) -> tuple[str, float | None, str] | str:
    """(pod, time, the rest of the line) after `kubectl logs --prefix` (`[pod/NAME/CONTAINER] `)
    and `--timestamps` (RFC 3339) headers, each "" / None where absent; or why the line is not
    read (other, no_timestamp)."""
    source = ""
    if line.startswith("[pod/"):
        end = line.find("] ")
        if end < 0:
            return "other"
        source, line = line[5:end].partition("/")[0], line[end + 2 :]
    kube_ts = None
    if len(line) > 20 and line[4] == "-" and line[10] == "T":
        stamp, _, line = line.partition(" ")
        try:
            kube_ts = parse_timestamp(stamp)
        except ValueError:
            return "no_timestamp"
    return source, kube_ts, line


def _vllm(line: str, i: int, kind: str, kube_ts: float | None, source: str, year: int) -> Line | str:
    head = line[:i].split()
    timed = _vllm_time(head, kube_ts, year)
    if isinstance(timed, str):
        return timed
    ts, missing = timed
    rank = _rank(head[-1][:-1]) if len(head) > 1 and head[-2] == "Engine" else ""
    body = line[i:].rstrip()
    if kind == "xferevent":  # one event; the caller names it
        return Line("vllm", kind, ts, rank, source, {}, missing=missing)
    if kind == "prefix":
        if (value := _value(body[len("Prefix cache hit rate: GPU: ") :].partition(",")[0])) is None:
            return "bad_value"
        return Line("vllm", kind, ts, rank, source, {"prefix_hit": value * 0.01} if value >= 0 else {}, missing=missing)
    if kind == "preempt":
        if (value := _value(body[len("total_num_cumulative_preemption=") :])) is None:
            return "bad_value"
        return Line("vllm", kind, ts, rank, source, {"preempt_total": value}, missing=missing)
    if kind in LINE_FIELDS:
        known, sep = LINE_FIELDS[kind]
        fields, unknown = _fields(body.partition(": ")[2].split(", "), known, sep, reprs=kind == "kvxfer")
        if isinstance(fields, str):
            return fields
        return Line("vllm", kind, ts, rank, source, fields, unknown, missing)
    fields, unknown = _fields(body.removesuffix(".").split(", "), VLLM_FIELDS)
    if isinstance(fields, str):
        return fields
    if "kv_cpu" in fields and "swapped" not in fields:  # V1 names the KV cache's own device
        fields.setdefault("kv", fields["kv_cpu"])
    return Line("vllm", kind, ts, rank, source, fields, unknown, missing)


def _vllm_time(head: list[str], kube_ts: float | None, year: int) -> tuple[float, str] | str:
    """(time, what it lacked) of a vLLM line from its header words (`MM-DD HH:MM:SS`, the year
    from `year`) unless kubectl gave one; NaN and "time" with none; no_timestamp for a time that
    does not parse."""
    ts, shaped = kube_ts, False
    for k in range(len(head) - 1):
        if ts is None and len(head[k]) == 5 and head[k][2] == "-" and len(head[k + 1]) == 8:
            shaped, ts = True, _time(year, head[k][:2], head[k][3:], head[k + 1])
    missing = "" if kube_ts is not None else "year"
    if ts is None and shaped:
        return "no_timestamp"  # a time that does not parse is a bad line, not an untimed one
    if ts is None:
        return NAN, "time"
    return ts, missing


def _sglang(line: str, i: int, kind: str, kube_ts: float | None, source: str, day: datetime.date) -> Line | str:
    header = _sglang_header(line, i, kube_ts, day)
    if isinstance(header, str):
        return header
    ts, rank, missing = header
    if kind == "retract":
        if (value := _value(line[i + len("#retracted_reqs: ") :].partition(",")[0])) is None:
            return "bad_value"
        return Line("sglang", kind, ts, rank, source, {"retracted": value}, missing=missing)
    fields, unknown = _fields(_batch_parts(line[i:]), SGLANG_FIELDS)
    if isinstance(fields, str):
        return fields
    if "kv" not in fields and ("kv_full" in fields or "kv_swa" in fields):
        fields["kv"] = max(fields.get("kv_full", 0.0), fields.get("kv_swa", 0.0))  # SGLang's own token_usage
    return Line("sglang", kind, ts, rank, source, fields, unknown, missing)


def _sglang_header(line: str, i: int, kube_ts: float | None, day: datetime.date) -> tuple[float, str, str] | str:
    """(time, DP rank, what the time lacked) from the header before `i` of an SGLang line: an
    unbracketed date-time, or the bracketed `[YYYY-MM-DD HH:MM:SS TPn DPn]` / `[HH:MM:SS ...]`
    (the date from `day`); kubectl's time first. NaN and "time" with none; tp_rank_copy for a
    rank other than TP0; no_timestamp for a time that does not parse."""
    ts, rank, missing = kube_ts, "", ""
    if ts is None and _dated(line):  # an unbracketed date-time first (python logging's default, forks)
        ts = _time(_year(line[:4]), line[5:7], line[8:10], line[11:19])
    open_, close = line.find("["), line.find("]")
    if 0 <= open_ < close < i:
        inside = line[open_ + 1 : close]
        dated = len(inside) >= 19 and inside[4] == "-" and inside[10] == " "
        for tag in inside[19 if dated else 8 :].split():
            if tag.startswith("TP") and tag[2:] != "0":
                return "tp_rank_copy"  # every TP rank of one scheduler logs the same stats
            if tag.startswith("DP"):
                rank = _rank(tag[2:])
        if ts is None and dated:
            ts = _time(_year(inside[:4]), inside[5:7], inside[8:10], inside[11:19])
        elif ts is None and inside[2:3] == ":" and inside[5:6] == ":":
            ts, missing = _time(day.year, str(day.month), str(day.day), inside[:8]), "date"
    if ts is None and (0 <= open_ < close < i) and _hms(line[open_ + 1 : close]):
        return "no_timestamp"  # a time that does not parse is a bad line, not an untimed one
    if ts is None:
        return NAN, rank, "time"
    return ts, rank, missing


def _batch_parts(body: str) -> list[str]:
    """The `key: value` parts of an SGLang `Prefill batch` / `Decode batch` line from its marker
    on: the `(mixed #running-req: N)` of a mixed batch first, a `[N]` iteration count dropped."""
    body = body.partition("batch")[2].rstrip(" ,")  # newer releases end with `, `
    parts = []
    if body.startswith("(mixed "):  # Prefill batch(mixed #running-req: N). ...
        mixed, _, body = body[7:].partition(")")
        parts.append(mixed)
    body = body.lstrip(" .,")
    if body.startswith("["):  # SGLANG_LOG_FORWARD_ITERS: `Decode batch [N], ...`
        body = body[body.find("]") + 1 :].lstrip(" ,")
    return parts + body.split(", ")


Known = dict[str, tuple[str, float] | None]
NAN = float("nan")


def _counted(line: str, shape: tuple[str, str, str]) -> int:
    """Where LMCache's `Retrieved N out of M required tokens` or `Stored N out of total M tokens`
    (`shape`: head, middle, tail) starts, or -1."""
    head, middle, tail = shape
    i = line.find(head)
    if i < 0:
        return -1
    j = line.find(middle, i)
    count = line[i + len(head) : j] if 0 <= j < i + 40 else ""
    r = line.find(tail, j) if count.isdigit() and count.isascii() else -1
    return i if r >= 0 and r == line.find(" ", j + len(middle)) else -1


def _lmcache(line: str, i: int, kube_ts: float | None, source: str, year: int) -> Line | str:
    """LMCache's lookup, retrieve or store line. Its own header is `[YYYY-MM-DD HH:MM:SS,mmm] LMCache
    LEVEL:` (lmcache/logging.py, ANSI colours around it on a terminal); vLLM's header when the
    line came through vLLM's logger."""
    timed = _lmcache_time(line, i, kube_ts, year)
    if isinstance(timed, str):
        return timed
    ts, missing = timed
    if line.startswith(LMCACHE_LOOKUP, i):  # `Reqid: R, Total tokens N, LMCache hit tokens: H, ...`
        t = line.rfind("Total tokens ", 0, i)
        total = _value(line[t + len("Total tokens ") :].partition(",")[0]) if t >= 0 else None
        hit = _value(line[i + len(LMCACHE_LOOKUP) :].partition(",")[0])
        if total is None or hit is None:  # `LMCache hit tokens: None.`: the lookup had no answer
            return "no_fields"
        return Line("lmcache", "lookup", ts, "", source, {"lookup": total, "hit": min(hit, total)}, missing=missing)
    kind, key, word = (
        ("store", "stored", LMCACHE_STORE[0])
        if line.startswith(LMCACHE_STORE[0], i)
        else ("retrieve", "loaded", LMCACHE_RETRIEVE[0])
    )
    got = _value(line[i + len(word) :])
    if got is None:
        return "bad_value"
    return Line("lmcache", kind, ts, "", source, {key: got}, missing=missing)


def _lmcache_time(line: str, i: int, kube_ts: float | None, year: int) -> tuple[float, str] | str:
    """(time, what it lacked) of an LMCache line: kubectl's, else LMCache's own bracketed
    date-time, else vLLM's `MM-DD HH:MM:SS` read as `_vllm_time` reads it; NaN and "time" with
    none; no_timestamp for a time that does not parse."""
    if kube_ts is not None:
        return kube_ts, ""
    k = line.rfind("] LMCache ", 0, i)
    o = line.rfind("[", 0, k) + 1 if k > 0 else 0
    if o > 0 and _dated(line[o:k]):  # `,mmm` dropped: the second is enough here
        ts = _time(_year(line[o : o + 4]), line[o + 5 : o + 7], line[o + 8 : o + 10], line[o + 11 : o + 19])
        return "no_timestamp" if ts is None else (ts, "")
    return _vllm_time(line[:i].split(), None, year)


def _dated(text: str) -> bool:
    """`text` starts with `YYYY-MM-DD HH:MM:SS`."""
    return len(text) >= 19 and text[4] == "-" and text[7] == "-" and text[10] == " " and _hms(text[11:19])


def _hms(text: str) -> bool:
    """`text` starts with `HH:MM:SS` shaped characters (digits checked when parsed)."""
    return len(text) >= 8 and text[2] == ":" and text[5] == ":"


def _fields(
    parts: list[str], known: Known, sep_: str = ": ", reprs: bool = False
) -> tuple[dict[str, float] | str, tuple[str, ...]]:
    """`key<sep_>value` parts -> (internal key -> value, unknown keys), or a skip reason. `reprs`:
    the values are Python's repr of numbers (`1.2e-05` allowed), not a printf format's."""
    fields: dict[str, float] = {}
    unknown = []
    for part in parts:
        key, sep, raw = part.partition(sep_)
        key = key.strip()
        if not sep:
            continue  # a continuation (`KV fetch: a, b in progress`) or ''
        if key not in known:
            unknown.append(key[:40])
            continue
        target = known[key]
        if target is None:
            continue
        value = _value(raw, reprs)
        if value is None or (value < 0 and target[0] != "prefix_hit"):
            return "bad_value", ()
        if value >= 0:
            fields[target[0]] = value * target[1]
    if not fields:
        return "no_fields", ()
    return fields, tuple(unknown)


def _value(raw: str, reprs: bool = False) -> float | None:
    """The leading number of `12.5 tokens/s`, `80.0%`, `3 reqs`; None if there is none. `reprs`: also
    `1.5e-05` (Python's repr of a small float, as `KV Transfer metrics:` prints its values; an
    exponent of at most two digits)."""
    token = raw.strip().partition(" ")[0].removesuffix(".").removesuffix("%")
    mantissa, e, exponent = token.partition("e") if reprs else (token, "", "")
    digits = mantissa.lstrip("-").replace(".", "", 1)
    power = exponent.removeprefix("-").removeprefix("+")
    if e and not (0 < len(power) <= 2 and power.isdigit() and power.isascii()):
        return None
    if not token or len(token) > MAX_VALUE or not (digits.isdigit() and digits.isascii()):
        return None
    return float(token)


def _rank(digits: str) -> str:
    """`007` -> `7`; '' for anything but a short decimal number (no int() of outside text)."""
    return (digits.lstrip("0") or "0") if digits.isdigit() and digits.isascii() and len(digits) <= 6 else ""


def _int(text: str, lo: int, hi: int) -> int:
    if not (text.isdigit() and text.isascii()) or not lo <= int(text) <= hi:
        raise ValueError(text)
    return int(text)


def _time(year: int | None, month: str, day: str, hms: str) -> float | None:
    """Unix seconds of a UTC wall-clock time, None if any part is malformed."""
    if year is None:
        return None
    try:
        h, m, s = hms.split(":") if hms.count(":") == 2 else ("x", "", "")
        return float(
            calendar.timegm(
                (year, _int(month, 1, 12), _int(day, 1, 31), _int(h, 0, 23), _int(m, 0, 59), _int(s, 0, 60), 0, 0, 0)
            )
        )
    except ValueError:
        return None


def _year(text: str) -> int | None:
    return int(text) if text.isdigit() and text.isascii() and 1970 <= int(text) <= 9999 else None
