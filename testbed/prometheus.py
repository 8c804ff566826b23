"""A real Prometheus (the Debian 2.42 binary) and promtool for tests and benches.

`prometheus_argv()` is the one command line (config, TSDB path, 127.0.0.1:<port>, extra flags);
`running_prometheus()` starts it, waits for `/-/ready` and always stops and reaps it. The query
helpers speak the HTTP API; `backfill_openmetrics()` turns an OpenMetrics file into TSDB blocks
with `promtool tsdb create-blocks-from openmetrics`.
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import shutil
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import NamedTuple

import yaml

from testbed.procs import LOOPBACK, LoggedProcess, free_port, stop_process, wait_http, wait_until

EMPTY_CONFIG = "global: {scrape_interval: 15s}\nscrape_configs: []\n"
"""A config that scrapes nothing: Prometheus only serves the TSDB it is started on."""


def promtool_input_series(samples: Iterable, interval: float) -> list[dict[str, str]]:
    """Canonical samples -> promtool `input_series` (one value per `interval`, `_` where a
    series has none, `stale` for a NaN: the rule cases' staleness marker, which the engine reads
    as the series ending there; a plain `nan` would be a NaN sample that `resets` and `increase`
    compare against), named as the agent exports them (`kvscope_<name>`)."""
    series: dict[tuple, dict[int, float]] = {}
    for s in samples:
        series.setdefault((s.name, s.labels), {})[round(s.timestamp / interval)] = s.value
    out = []
    for (name, labels), points in sorted(series.items()):
        body = ",".join(f'{k}="{v}"' for k, v in labels)
        values = " ".join(_promtool_value(points.get(i)) for i in range(max(points) + 1))
        out.append({"series": f"kvscope_{name}{{{body}}}", "values": values})
    return out


def _promtool_value(value: float | None) -> str:
    if value is None:
        return "_"
    return "stale" if math.isnan(value) else repr(float(value))


def promtool_test_rules(
    work: Path, tests: list[dict], rule_groups: list[dict] | None = None, evaluation_interval: str | None = None
) -> tuple[int, str]:
    """Runs `promtool test rules` in `work` on `tests` (promtool's test groups), with `rule_groups`
    written as work/rules.yml (rendered as `kvscope rules build` writes rule files); returns
    promtool's exit status and its stdout and stderr together. The timeout is a hang guard only
    (promtool is slow on a loaded 2-core box)."""
    from kvscope.diagnoser.promql.rulefiles import render_rule_file

    test: dict = {"rule_files": ["rules.yml"] if rule_groups is not None else []}
    if rule_groups is not None:
        (work / "rules.yml").write_text(render_rule_file(rule_groups, ""))
    if evaluation_interval:
        test["evaluation_interval"] = evaluation_interval
    test["tests"] = tests
    (work / "cases.test.yml").write_text(yaml.safe_dump(test, sort_keys=False))
    proc = subprocess.run(
        ["promtool", "test", "rules", "cases.test.yml"], cwd=work, capture_output=True, text=True, timeout=600
    )
    return proc.returncode, proc.stdout + proc.stderr


def promtool_got(out: str) -> list[dict[str, str]]:
    """The label sets after the first `got:` of promtool's output (what an expression returned
    where its test expected nothing): one dict per series."""
    got = out.split("got:", 1)[1] if "got:" in out else ""
    return [
        dict(re.findall(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"', labels))
        for labels in re.findall(r"\{([^}]*)\}", got)
    ]


def missing_binaries(*names: str) -> str | None:
    """Which of these programs are not on PATH (a sentence), or None when all are installed."""
    absent = [n for n in names if shutil.which(n) is None]
    if not absent:
        return None
    return f"{'/'.join(absent)} not installed (Debian packages; scripts/setup.sh installs them)"


def require_binaries(*names: str) -> list[str]:
    """The paths of these programs; the calling test fails when one is missing. `make test`
    (scripts/setup.sh) installs every one, so a missing program is a broken install that a skip
    would hide, and a check of that program must not pass for want of it."""
    if why := missing_binaries(*names):
        import pytest  # test tooling only: the bench scripts import this module without pytest

        pytest.fail(why, pytrace=False)
    return [shutil.which(n) or n for n in names]


def prometheus_argv(config: Path, data: Path, port: int, *extra: str, binary: str = "prometheus") -> list[str]:
    """`prometheus` serving `data` with `config` on 127.0.0.1:`port`."""
    return [
        binary,
        f"--config.file={config}",
        f"--storage.tsdb.path={data}",
        f"--web.listen-address={LOOPBACK}:{port}",
        *extra,
    ]


class Prometheus(NamedTuple):
    """A started Prometheus: its base URL, port and process."""

    url: str
    port: int
    proc: LoggedProcess


@contextlib.contextmanager
def running_prometheus(
    config: Path,
    data: Path,
    *extra: str,
    log_path: Path | None = None,
    ready_timeout_s: float = 60.0,
    stop_timeout_s: float = 20.0,
    binary: str = "prometheus",
    **popen_kw: object,
) -> Iterator[Prometheus]:
    """Start Prometheus on a free 127.0.0.1 port, wait until `/-/ready` answers 200 (failing with
    its log if it exits first), yield it, and stop it whatever happens."""
    port = free_port()
    argv = prometheus_argv(config, data, port, *extra, binary=binary)
    proc = LoggedProcess(argv, log_path, name="prometheus", **popen_kw)
    url = f"http://{LOOPBACK}:{port}"
    try:
        wait_http(url + "/-/ready", ready_timeout_s, procs=(proc,))
        yield Prometheus(url, port, proc)
    finally:
        stop_process(proc, timeout_s=stop_timeout_s)


def get_json(url: str, timeout_s: float = 30.0) -> dict:
    with urllib.request.urlopen(url, timeout=timeout_s) as resp:
        return json.load(resp)


def query(url: str, expr: str, at: float | None = None, timeout_s: float = 10.0) -> list[dict]:
    """Instant query at `at` (default now): the `data.result` list. Raises OSError if unreachable."""
    params = {"query": expr} | ({"time": f"{at:.3f}"} if at is not None else {})
    return get_json(f"{url}/api/v1/query?{urllib.parse.urlencode(params)}", timeout_s)["data"]["result"]


def query_range(url: str, expr: str, start: float, end: float, step: float, timeout_s: float = 30.0) -> list[dict]:
    """Range query: the `data.result` list; an answer whose status is not success fails."""
    qs = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": step})
    body = get_json(f"{url}/api/v1/query_range?{qs}", timeout_s)
    assert body["status"] == "success", (expr, body)
    return body["data"]["result"]


def wait_query(
    url: str, expr: str, timeout_s: float, *, procs: Iterable[subprocess.Popen] = (), interval_s: float = 0.5
) -> list[dict]:
    """Poll an instant query until it returns a non-empty result, and return that."""
    return wait_until(lambda: query(url, expr), timeout_s, expr, procs=procs, interval_s=interval_s)


def backfill_openmetrics(source: Path, out_dir: Path, timeout_s: float = 300.0, binary: str = "promtool") -> None:
    """`promtool tsdb create-blocks-from openmetrics SOURCE OUT_DIR`; fails with promtool's output."""
    res = subprocess.run(
        [binary, "tsdb", "create-blocks-from", "openmetrics", str(source), str(out_dir)],
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )
    assert res.returncode == 0, f"promtool backfill of {source.name} failed:\n{(res.stdout + res.stderr)[-2000:]}"


def backfill_rules(
    config: Path, data: Path, rule_file: Path, start: float, end: float, interval: str = "15s", timeout_s: float = 600.0
) -> float:
    """The recording rules of `rule_file` evaluated over [start, end] every `interval` as a live
    Prometheus would have (`promtool tsdb create-blocks-from rules` against a Prometheus serving
    `data`), their blocks moved into `data`: a Prometheus started on it afterwards holds them.
    Returns the seconds promtool took."""
    import shutil
    import time

    out = data.parent / f"rule-blocks-{rule_file.stem}"
    shutil.rmtree(out, ignore_errors=True)
    with running_prometheus(config, data, "--storage.tsdb.retention.time=100y", "--query.timeout=30m") as prom:
        t0 = time.perf_counter()
        res = subprocess.run(
            [
                "promtool",
                "tsdb",
                "create-blocks-from",
                "rules",
                f"--start={int(start)}",
                f"--end={int(end)}",
                f"--url={prom.url}",
                f"--output-dir={out}",
                f"--eval-interval={interval}",
                str(rule_file),
            ],
            capture_output=True,
            text=True,
            timeout=timeout_s,
        )
        took = time.perf_counter() - t0
    out_text = res.stdout + res.stderr
    (data.parent / f"promtool-{rule_file.stem}.log").write_text(out_text)
    # a rule the TSDB refuses ("rule importer error") leaves its records out, the others are written
    refused = res.returncode != 0 and all(
        "rule importer error" in line or "error importing rules" in line
        for line in out_text.splitlines()
        if "error" in line.lower()
    )
    assert res.returncode == 0 or refused, f"promtool rule backfill failed:\n{out_text[-2000:]}"
    for block in out.iterdir() if out.exists() else ():
        shutil.move(str(block), data / block.name)
    return took
