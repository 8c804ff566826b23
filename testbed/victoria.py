"""A real VictoriaMetrics (Debian `victoria-metrics` 1.79) for tests and benches.

`running_victoria()` starts single-node VictoriaMetrics on a free 127.0.0.1 port with an empty
data directory, waits for `/health`, and always stops it. `import_prometheus_text()` loads a
recording: OpenMetrics (timestamps in seconds, what `kvscope record` and promtool use) is
rewritten to the Prometheus text format with millisecond timestamps and posted to
`/api/v1/import/prometheus`, then `/internal/force_flush` makes it searchable at once.

Flags: `-search.maxLookback=5m` gives Prometheus' fixed 5-minute lookback (VictoriaMetrics
otherwise derives it from the sample interval), `-search.latencyOffset=0s` serves the newest
points, `-search.disableCache` (unless `cache=True`) keeps runs independent of each other,
`-retentionPeriod=100y` keeps old test data.
"""

from __future__ import annotations

import contextlib
import gzip
import re
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from testbed.procs import LOOPBACK, LoggedProcess, free_port, stop_process, wait_http

_SAMPLE_TS = re.compile(r"^(\S.*\s)(\S+)\s+([0-9]+(?:\.[0-9]+)?)$")


class Victoria(NamedTuple):
    url: str
    port: int
    proc: LoggedProcess


def victoria_argv(
    data: Path, port: int, *extra: str, binary: str = "victoria-metrics", cache: bool = False
) -> list[str]:
    return [
        binary,
        f"-storageDataPath={data}",
        f"-httpListenAddr={LOOPBACK}:{port}",
        "-retentionPeriod=100y",
        "-search.maxLookback=5m",
        "-search.latencyOffset=0s",
        *([] if cache else ["-search.disableCache"]),
        *extra,
    ]


@contextlib.contextmanager
def running_victoria(
    data: Path,
    *extra: str,
    log_path: Path | None = None,
    ready_timeout_s: float = 60.0,
    binary: str = "victoria-metrics",
    cache: bool = False,
) -> Iterator[Victoria]:
    """Start VictoriaMetrics on a free port, yield it once /health answers, stop it whatever happens.
    `cache`: keep its rollup cache on (its default; it moves range queries' starts to multiples
    of their step, and `reset_cache` empties it)."""
    port = free_port()
    proc = LoggedProcess(
        victoria_argv(data, port, *extra, binary=binary, cache=cache), log_path, name="victoria-metrics"
    )
    url = f"http://{LOOPBACK}:{port}"
    try:
        wait_http(url + "/health", ready_timeout_s, procs=(proc,))
        yield Victoria(url, port, proc)
    finally:
        stop_process(proc, timeout_s=20.0)


def reset_cache(url: str) -> None:
    """Empty VictoriaMetrics' rollup cache (so that a command cannot reuse an earlier one's work)."""
    with urllib.request.urlopen(url + "/internal/resetRollupResultCache", timeout=30) as resp:  # noqa: S310
        resp.read()


def delete_series(url: str, match: str) -> None:
    """Delete every series `match` selects (VictoriaMetrics' admin API), and the caches with them."""
    query = urllib.parse.urlencode({"match[]": match})
    with urllib.request.urlopen(f"{url}/api/v1/admin/tsdb/delete_series?{query}", timeout=60) as resp:  # noqa: S310
        resp.read()
    reset_cache(url)


def prometheus_text_lines(path: Path, shift_s: float = 0.0) -> Iterator[str]:
    """Sample lines of an OpenMetrics file (optionally .gz) with timestamps in milliseconds,
    moved by `shift_s` (VictoriaMetrics drops samples more than a day or two in the future)."""
    opener = gzip.open if path.name.endswith(".gz") else open
    with opener(path, "rt") as fh:
        for line in fh:
            line = line.rstrip("\n")
            if not line or line.startswith("#"):
                continue
            m = _SAMPLE_TS.match(line)
            if m:
                yield f"{m.group(1)}{m.group(2)} {int(round((float(m.group(3)) + shift_s) * 1000))}\n"


def import_prometheus_text(
    url: str, path: Path, chunk_lines: int = 200_000, timeout_s: float = 600.0, shift_s: float = 0.0
) -> int:
    """Post a recording to /api/v1/import/prometheus in chunks; returns the samples sent."""
    sent, buf = 0, []

    def post(lines: list[str]) -> None:
        req = urllib.request.Request(url + "/api/v1/import/prometheus", data="".join(lines).encode(), method="POST")
        with urllib.request.urlopen(req, timeout=timeout_s) as resp:  # noqa: S310
            resp.read()

    for line in prometheus_text_lines(path, shift_s):
        buf.append(line)
        if len(buf) >= chunk_lines:
            post(buf)
            sent += len(buf)
            buf = []
    if buf:
        post(buf)
        sent += len(buf)
    with urllib.request.urlopen(url + "/internal/force_flush", timeout=timeout_s) as resp:  # noqa: S310
        resp.read()
    return sent


def replay_rules(
    url: str, rule_file: Path, start: float, end: float, log: Path, interval: str = "15s", max_points: int = 10000
) -> float:
    """The recording rules of `rule_file` evaluated over [start, end] every `interval` into
    VictoriaMetrics at `url`, as a live vmalert would have (`vmalert -replay`), flushed so that
    queries see them. `max_points`: evaluations per query (fewer: smaller writes, for rules with
    many series). Returns the seconds vmalert took; raises RuntimeError when vmalert dropped a
    write (it exits 0 all the same)."""
    import subprocess
    import time

    iso = lambda t: time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t))  # noqa: E731
    argv = [
        "vmalert",
        f"-rule={rule_file}",
        f"-datasource.url={url}",
        f"-remoteWrite.url={url}",
        f"-replay.timeFrom={iso(start)}",
        f"-replay.timeTo={iso(end)}",
        f"-evaluationInterval={interval}",
        f"-datasource.queryStep={interval}",
        "-replay.disableProgressBar",
        "-replay.rulesDelay=0s",
        f"-replay.maxDatapointsPerQuery={max_points}",
    ]
    t0 = time.perf_counter()
    with log.open("w") as fh:
        subprocess.run(argv, stdout=fh, stderr=subprocess.STDOUT, check=True, timeout=7200)
    took = time.perf_counter() - t0
    if "dropping" in log.read_text():
        raise RuntimeError(f"vmalert dropped records replaying {rule_file}: see {log}")
    urllib.request.urlopen(url + "/internal/force_flush", timeout=600).read()  # noqa: S310
    return took


def replay_in_order(url: str, rule_file: Path, start: float, end: float, log_dir: Path) -> float:
    """`replay_rules` of each rule of `rule_file` on its own, in the file's order, at its group's
    interval: in replay mode vmalert evaluates a rule over the whole range before the next, and
    its writes are not yet searchable when the next runs, so a rule reading an earlier one of its
    group (as Prometheus allows: a group's rules run in order at one time) reads nothing unless
    the earlier one was replayed and flushed first. Returns the seconds vmalert took in all."""
    import yaml

    took = 0.0
    for group in yaml.safe_load(rule_file.read_text())["groups"]:
        interval = group.get("interval", "15s")
        for i, rule in enumerate(group["rules"]):
            one = log_dir / f"{group['name']}-{i}.yml"
            one.write_text(yaml.safe_dump({"groups": [{"name": group["name"], "interval": interval, "rules": [rule]}]}))
            took += replay_rules(url, one, start, end, log_dir / f"{group['name']}-{i}.log", interval, max_points=500)
    return took
