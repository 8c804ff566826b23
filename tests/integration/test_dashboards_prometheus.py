"""Proof: every dashboard panel query runs on a real Prometheus loaded with a real vLLM recording.

The recording (tests/recordings/, recorded from real vLLM on CPU) goes through the agent's replay
path, so the series are exactly what the agent re-exports as `kvscope_*`; they are written with
their timestamps and backfilled with `promtool tsdb create-blocks-from openmetrics`, then a real
Prometheus serves them on 127.0.0.1. A panel query that returns nothing must read a signal the
recording lacks, declared below with the reason; a declared signal the recording has fails too.
"""

from __future__ import annotations

import contextlib
import os
import re
import subprocess
from collections import defaultdict
from itertools import groupby
from operator import attrgetter
from pathlib import Path

import pytest
import yaml

from kvscope.agent.derive.cascade import CASCADE_SIGNALS, CascadeWindow
from kvscope.agent.recording.omfile import read_recording_text
from kvscope.agent.recording.replay import replay_recording
from kvscope.agent.scrape.exposition import format_labels, format_value
from kvscope.commands.demo import BUNDLED, RECORDINGS
from kvscope.core.signals import KVSCOPE_PREFIX, load_catalog
from kvscope.dashboards.lint import read_recorded_names
from kvscope.dashboards.registry import BOARDS
from testbed.prometheus import EMPTY_CONFIG, backfill_openmetrics, require_binaries, running_prometheus
from testbed.prometheus import query_range as prometheus_query_range

pytestmark = pytest.mark.prometheus

NO_GPU = "CPU-only recording: no DCGM or NVML, so no GPU series"
KVSCOPE_LIVE = (
    "produced live by a kvscope component (request tap, trace receiver, KV-event subscriber or fairness "
    "analytics), not by the engine's /metrics that a recording holds"
)
DECLARED_ABSENT = {
    **{
        s: NO_GPU
        for s in (
            "gpu_utilization_ratio",
            "gpu_sm_active_ratio",
            "gpu_memory_used_bytes",
            "gpu_memory_total_bytes",
            "gpu_power_watts",
            "gpu_temperature_celsius",
            "gpu_xid_last_code",
            "gpu_energy_joules_total",
            "engine_gpu_memory_used_bytes",
            "gpu_graphics_engine_active_ratio",
        )
    },
    **{
        s: "host collector series are produced by the live agent, not by the engine's /metrics"
        for s in (
            "host_cpu_utilization_ratio",
            "host_memory_used_bytes",
            "host_memory_total_bytes",
            "engine_process_resident_memory_bytes",
            "engine_process_cpu_seconds_total",
        )
    },
    **{
        s: KVSCOPE_LIVE
        for s in (
            "tenant_requests_total",
            "tenant_request_errors_total",
            "tenant_prompt_tokens_total",
            "tenant_cached_tokens_total",
            "tenant_ttft_seconds",
            "tenant_lost_reuse_ratio",
            "fleet_tenant_hit_jain_ratio",
            "fleet_cold_tenant_ratio",
            "fleet_tenant_hit_ratio_tail_gap_ratio",
            "prefix_split_ratio",
            "request_phase_seconds",
            "kv_blocks_removed_total",
            "kv_blocks_evicted_recomputed_total",
            "kv_hot_blocks_evicted_total",
            "kv_block_residency_seconds",
        )
    },
    "engine_kv_evicted_tokens_total": "SGLang-only counter; vLLM exports preemptions instead",
    "engine_kv_host_used_tokens": "SGLang HiCache host tier; vLLM has no host-tier usage gauge",
    "engine_kv_host_capacity_tokens": "SGLang HiCache host tier",
    **{
        s: "single unified vLLM server: no prefill/decode KV transfer (no NIXL/Mooncake connector)"
        for s in ("kv_transfer_seconds", "kv_transfer_bytes", "kv_transfer_failures_total")
    },
    "ALERTS": "alerts exist only while Prometheus evaluates alert rules live; backfilled history has none",
    **{
        s: "a KV tier (LMCache, HiCache storage, vLLM offload) exports these; the bundled single vLLM server has none"
        for s in ("kv_tier_hit_tokens_total", "kv_tier_lookup_tokens_total")
    },
    **{
        s: "a router or gateway (SMG, Dynamo, llm-d EPP) exports these; the bundled recording scrapes engines only"
        for s in ("router_prefix_match_ratio", "router_policy_branch_total")
    },
}
CONDITIONAL = {
    "engine_cascade_lead_seconds": "exported only once an engine has both a KV-high and a latency onset; a "
    "healthy recording has none (the bundled incident has it, so the strict proof checks the panel)",
}
"""Signals present only when the recorded scenario reaches the condition."""
DECLARED_IDLE = {
    "engine_external_prefix_cache_queries_tokens_total": "no KV connector configured: vLLM exports the external "
    "prefix-cache counters but they stay 0, so the guarded hit ratio is (correctly) empty",
}
"""Signals the recording has but whose denominators never move, so a guarded ratio has no value."""


def _binaries() -> tuple[str, str]:
    prom, tool = require_binaries("prometheus", "promtool")
    return prom, tool


def derived_cascade(samples, every: int = 5) -> list:
    """The cascade series the live agent derives: its derive hook (agent/derive/cascade.py
    `CascadeWindow`) run on the recording's scrapes in time order, `every` scrapes a cycle."""
    hook = CascadeWindow()
    ordered = sorted(
        (s for s in samples if s.timestamp is not None and s.name in CASCADE_SIGNALS), key=attrgetter("timestamp")
    )
    scrapes = [list(scrape) for _, scrape in groupby(ordered, key=attrgetter("timestamp"))]
    return [d for i in range(0, len(scrapes), every) for d in hook([s for sc in scrapes[i : i + every] for s in sc])]


def render_backfill(samples) -> str:
    """Canonical samples as OpenMetrics with timestamps, each name its own contiguous family."""
    by_name: dict[str, list[str]] = defaultdict(list)
    for s in samples:
        if s.timestamp is None:
            continue
        name = s.name if s.name.startswith(KVSCOPE_PREFIX) else KVSCOPE_PREFIX + s.name
        by_name[name].append(f"{name}{format_labels(s.labels)} {format_value(s.value)} {s.timestamp:.3f}\n")
    return "".join("".join(lines) for lines in by_name.values()) + "# EOF\n"


ARTIFACTS = Path(__file__).resolve().parents[2] / "artifacts"
LIBRARY = sorted(p for p in RECORDINGS.glob("*.om*") if p.is_file()) if RECORDINGS.is_dir() else []


def _panel_library() -> list[Path]:
    """LIBRARY with the curve-shape recordings (testbed/curve_record.py) read once per engine build:
    one recorder, one engine with the same flags in the same four phases, so they hold the same
    series (names and label names: 94 in each of the 16, 2026-11-30) and the panels find the same
    signals in each. The smallest of those with one `source` stands for the rest (twelve of them
    took about 3.5 minutes more here, the six long ones 22-29 s each). Every recording still runs
    through the diagnoses, the fleet path's parity and the promtool backfill."""
    shapes: dict[str, Path] = {}
    for path in sorted((p for p in LIBRARY if p.name.startswith("curve-shape-")), key=lambda p: p.stat().st_size):
        meta = path.with_name(path.name.split(".")[0] + ".yaml")
        shapes.setdefault(yaml.safe_load(meta.read_text())["source"], path)
    return [p for p in LIBRARY if not p.name.startswith("curve-shape-") or p in shapes.values()]


@pytest.fixture(scope="module")
def recording() -> Path:
    """The strict proof runs on the bundled real vLLM incident (or KVSCOPE_TEST_RECORDING)."""
    return Path(os.environ.get("KVSCOPE_TEST_RECORDING") or BUNDLED)


RULES = Path(__file__).resolve().parents[2] / "rules" / "prometheus"
RULE_FILES = ("kvscope-canonical.yml", "kvscope-derived.yml", "kvscope-tenant-slo.yml")


def rule_layers(paths: list[Path]) -> list[str]:
    """The recording rules of `paths` as rule files to backfill in order, each rule in a layer after
    every record it reads: promtool's backfill evaluates rules against data already in the TSDB only,
    so the derived and tenant SLO rules, which read the canonical kvscope:<signal> records, and the
    tenant SLO ratios, which read the top-N record of their own file, each wait for what they read.
    Alert rules are left out (not backfilled)."""
    rules = [r for p in paths for g in yaml.safe_load(p.read_text())["groups"] for r in g["rules"] if "record" in r]
    names = {r["record"] for r in rules}
    layer: dict[str, int] = {}
    pending = list(rules)
    while pending:
        ready = [r for r in pending if all(n in layer for n in (names & _reads(r["expr"])) - {r["record"]})]
        assert ready, "recording rules that read each other in a cycle"
        for r in ready:
            reads = (names & _reads(r["expr"])) - {r["record"]}
            layer[r["record"]] = 1 + max((layer[n] for n in reads), default=-1)
            pending.remove(r)
    return [
        yaml.safe_dump({"groups": [{"name": f"layer-{i}", "rules": [r for r in rules if layer[r["record"]] == i]}]})
        for i in range(max(layer.values(), default=-1) + 1)
    ]


def _reads(expr: str) -> set[str]:
    return set(re.findall(r"[a-zA-Z_:][a-zA-Z0-9_:]*", expr))


def _prometheus(prom: str, work: Path):
    """A real Prometheus serving `work/data` (nothing scraped); its log is `work/prometheus.log`."""
    (work / "prometheus.yml").write_text(EMPTY_CONFIG)
    return running_prometheus(
        work / "prometheus.yml",
        work / "data",
        "--storage.tsdb.retention.time=100y",
        log_path=work / "prometheus.log",
        binary=prom,
    )


@contextlib.contextmanager
def serve_recording(path: Path, work: Path, eval_interval: str = "2s"):
    """A real Prometheus on 127.0.0.1 over one recording, the way a deployment would hold it:

    1. the engine's native series as recorded (what Prometheus scraping vLLM directly stores),
    2. the agent's `kvscope_*` re-export of the same scrapes plus its derived cascade series,
    3. kvscope's recording rules (canonical, then derived, rules/prometheus/) backfilled over the
       window every `eval_interval` with `promtool tsdb create-blocks-from rules` against that
       Prometheus (2 s, the recordings' scrape interval, where records are compared with values;
       deploy/prometheus/prometheus.yml evaluates every 15 s).

    Yields (URL, replay).
    """
    prom, tool = _binaries()
    replay = replay_recording(path)
    replay.samples.extend(derived_cascade(replay.samples))
    (work / "native.om").write_text(read_recording_text(path))
    (work / "agent.om").write_text(render_backfill(replay.samples))
    for name in ("native.om", "agent.om"):
        subprocess.run(
            [tool, "tsdb", "create-blocks-from", "openmetrics", str(work / name), str(work / "data")],
            check=True,
            capture_output=True,
            timeout=120,
        )
    start, end = int(replay.start) - 1, int(replay.end) + 2
    for i, text in enumerate(rule_layers([RULES / name for name in RULE_FILES])):
        rule_file, out = work / f"rules-{i}.yml", work / f"rules-{i}"
        rule_file.write_text(text)
        with _prometheus(prom, work) as server:
            subprocess.run(
                [
                    tool,
                    "tsdb",
                    "create-blocks-from",
                    "rules",
                    f"--start={start}",
                    f"--end={end}",
                    f"--url={server.url}",
                    f"--output-dir={out}",
                    f"--eval-interval={eval_interval}",
                    "--quiet",
                    str(rule_file),
                ],
                check=True,
                capture_output=True,
                timeout=300,
            )
        for block in out.iterdir():
            if block.is_dir():
                block.rename(work / "data" / block.name)
    with _prometheus(prom, work) as server:
        yield server.url, replay


@pytest.fixture(scope="module")
def loaded(tmp_path_factory, recording):
    with serve_recording(recording, tmp_path_factory.mktemp("prom")) as served:
        yield served


def substitute(expr: str, start: float, end: float) -> str:
    """Grafana's variables as a dashboard user with everything selected would send them."""
    values = {
        "$__rate_interval": "1m",
        "$__range": f"{max(60, int(end - start))}s",
        "$ttft_slo": "1",
        "$itl_slo": "0.1",
        "$gpu_hour_cost": "2.5",
    }
    for var in ("$job", "$namespace", "$model", "$instance", "$tenant"):
        values[var] = ".*"
    for k in sorted(values, key=len, reverse=True):
        expr = expr.replace(k, values[k])
    return expr


def query_range(url: str, expr: str, start: float, end: float) -> list[dict]:
    return prometheus_query_range(url, expr, start, end, step=max(2.0, (end - start) / 200))


def _has_data(result: list[dict]) -> bool:
    return any(v not in ("NaN", "+Inf", "-Inf") for series in result for _, v in series["values"])


def _present(replay) -> set[str]:
    names = {s.name for s in replay.samples}
    return {n.removesuffix(sfx) for n in names for sfx in ("_bucket", "_sum", "_count", "")} | names


def measured_idle(url: str, replay, signal: str) -> bool:
    """True when a counter (or a histogram's _count) never increased in the recording."""
    sig = load_catalog().signals.get(signal)
    if sig is None or sig.kind == "gauge":
        return False
    name = KVSCOPE_PREFIX + signal + ("_count" if sig.kind == "histogram" else "")
    expr = f"sum(increase({name}[{max(60, int(replay.end - replay.start) + 10)}s]))"
    result = query_range(url, expr, replay.end, replay.end)
    return not result or all(float(v) == 0 for r in result for _, v in r["values"])


def silent_panels(url: str, replay, strict: bool = True, explained: list[str] | None = None) -> tuple[int, list[str]]:
    """(queries run, queries with no data that nothing explains).

    strict (the bundled incident): an empty query must read a signal of DECLARED_ABSENT or
    CONDITIONAL that the recording lacks, or one of DECLARED_IDLE. Not strict (the incident
    library, whose scenarios and engines differ): a signal the recording verifiably lacks, or a
    counter measured idle in it, explains the empty query; `explained` collects each such panel
    with its reason, and the test writes them out as that recording's declared absences.
    """
    present = _present(replay) | {"target_up", "up"} | read_recorded_names(RULES)
    silent, ran = [], 0
    for board in BOARDS:
        for panel in board.panels():
            for q in panel.queries:
                ran += 1
                if _has_data(query_range(url, substitute(q.expr, replay.start, replay.end), replay.start, replay.end)):
                    continue
                absent = [s for s in q.signals if s not in present]
                if strict:
                    lacking = absent + [s for s in q.signals if s in DECLARED_IDLE]
                    undeclared = [
                        s
                        for s in lacking
                        if s not in DECLARED_ABSENT and s not in DECLARED_IDLE and s not in CONDITIONAL
                    ]
                else:
                    idle = [] if absent else [s for s in q.signals if measured_idle(url, replay, s)]
                    lacking, undeclared = absent + idle, []
                    if lacking and explained is not None:
                        why = f"absent: {', '.join(absent)}" if absent else f"never moved: {', '.join(idle)}"
                        explained.append(f"{board.uid} / {panel.title} ({q.legend or q.expr[:40]}): {why}")
                if not lacking or undeclared:
                    silent.append(f"{board.uid} / {panel.title}: {q.expr} (lacks {lacking or 'nothing'})")
    return ran, silent


@pytest.mark.servers
def test_every_panel_query_returns_data_or_is_declared_absent(loaded):
    ran, silent = silent_panels(*loaded)
    assert ran > 60
    assert silent == [], "panels silently empty:\n" + "\n".join(silent)


# not in the server matrix (`servers`): one Prometheus and a rule backfill per library recording
# (48 of the 63: `_panel_library`) is the slowest part of this file, and it checks which series
# exist, not how a range reads them; the panels' PromQL runs on both generations through the tests marked `servers`. The rules
# are evaluated every 15 s, as the deploy config does: at the recordings' 2 s the backfill of the
# hour-long curve-shape recordings took up to 106 s each on a loaded 2-core box.
@pytest.mark.parametrize("path", _panel_library(), ids=lambda p: p.name)
def test_library_recordings_show_data_or_declared_absence(path, tmp_path):
    """Every real recording of the incident library (one curve-shape recording for the 16 alike):
    no silently empty panel either."""
    explained: list[str] = []
    with serve_recording(path, tmp_path, eval_interval="15s") as (url, replay):
        ran, silent = silent_panels(url, replay, strict=False, explained=explained)
    ARTIFACTS.mkdir(exist_ok=True)
    (ARTIFACTS / f"dashboard-absences-{path.name.split('.')[0]}.txt").write_text(
        f"{path.name}: {ran} panel queries, {len(explained)} empty with a reason\n" + "\n".join(explained) + "\n"
    )
    assert ran > 60
    assert silent == [], f"{path.name}: panels silently empty:\n" + "\n".join(silent)


@pytest.mark.servers
def test_declared_absent_signals_really_are_absent(loaded):
    _, replay = loaded
    present = _present(replay)
    assert sorted(s for s in DECLARED_ABSENT if s in present) == []
    assert sorted(s for s in CONDITIONAL if s not in present) == []  # the incident reaches them


@pytest.mark.servers
def test_declared_idle_signals_really_never_move(loaded):
    url, replay = loaded
    for signal in DECLARED_IDLE:
        expr = f"sum(increase({KVSCOPE_PREFIX}{signal}[{max(60, int(replay.end - replay.start))}s]))"
        result = query_range(url, expr, replay.end, replay.end)
        assert result and all(float(v) == 0 for s in result for _, v in s["values"]), signal


@pytest.mark.servers
def test_core_panels_show_the_incident(loaded):
    """Not just 'some data': the headline panels carry real, plausible numbers."""
    url, replay = loaded
    from kvscope.dashboards import queries as q

    def last(expr: str) -> float:
        result = query_range(url, substitute(expr, replay.start, replay.end), replay.start, replay.end)
        values = [float(v) for s in result for _, v in s["values"] if v != "NaN"]
        assert values, expr
        return max(values)

    assert 0 < last(q.KV_USAGE_SPREAD[0].expr) <= 1
    assert last(q.token_rates()[1].expr) > 0
    assert 0 < last(q.TTFT[1].expr) < 600


@pytest.mark.servers
def test_ui_diagnoses_the_same_cause_from_prometheus(loaded, recording):
    """The UI's Prometheus path (kvscope.diagnoser.sources over kvscope: series) and its recording
    path agree on the likely cause of the same incident."""
    from kvscope.ui.data import SourceSpec, load_triage

    url, replay = loaded
    from_rec = load_triage(SourceSpec("recording", str(recording))).diagnosis
    from_prom = load_triage(SourceSpec("prometheus", url, replay.end - replay.start, replay.end)).diagnosis
    assert from_rec.likely_cause is not None and from_prom.likely_cause is not None
    assert from_prom.likely_cause.rule_id in {f.rule_id for f in from_rec.findings}
    assert from_rec.likely_cause.rule_id in {f.rule_id for f in from_prom.findings}


@pytest.mark.servers
def test_weekly_report_from_prometheus_matches_the_recording(loaded):
    from kvscope.diagnoser.sources.prometheus import PrometheusSource
    from kvscope.diagnoser.sources.samples import SamplesSource
    from kvscope.report.weekly import build_report, report_window

    url, replay = loaded
    direct = build_report(
        report_window(SamplesSource(replay.samples, carry=False)), replay.end + 1, 2.5, "recording"
    ).this
    via_prom = build_report(
        report_window(PrometheusSource(url), replay.end + 1, replay.start), replay.end + 1, 2.5, "prometheus"
    ).this
    tokens = direct.fleet["output_tokens"]
    assert tokens and tokens > 0
    assert via_prom.fleet["output_tokens"] == pytest.approx(tokens, rel=0.05)
    assert via_prom.fleet["hit_ratio"] == pytest.approx(direct.fleet["hit_ratio"], abs=0.02)
    assert via_prom.fleet["gpu_hours"] is None  # no GPU in the recording: absent through both paths
    # the efficiency sections read the same through Prometheus: preemptions (and their estimated
    # recompute tax), tokens per tier, and the MFU estimate absent in both (vLLM 0.32 on CPU, flag off)
    a, b = direct.efficiency, via_prom.efficiency
    assert a is not None and b is not None and a.compute.empty and b.compute.empty
    assert list(a.tiers.index) == list(b.tiers.index) and not a.tiers.empty
    assert b.tiers.to_numpy() == pytest.approx(a.tiers.to_numpy(), rel=0.05)
    assert list(a.recompute.index) == list(b.recompute.index)
    if not a.recompute.empty:
        # Prometheus extrapolates increase() to the range edges: within 10 %
        assert b.recompute["preemptions"].to_numpy() == pytest.approx(a.recompute["preemptions"].to_numpy(), rel=0.1)


# not in the server matrix: it checks which router series a query finds, not how a range reads them
def test_ui_router_decisions_from_prometheus_match_the_recording(tmp_path):
    """The triage page's router lines read from a Prometheus holding the real sglang-router recording
    (its native series, as Prometheus scraping the router stores them) say what they say from the
    recording itself on the same grid: the same keys and policies, the counts within 5 %."""
    from kvscope.diagnoser.sources.recording import RecordingSource
    from kvscope.ui.data import SourceSpec, load_triage

    prom, tool = _binaries()
    rec = RECORDINGS / "router-cache-aware-vs-round-robin.om.gz"
    replay = replay_recording(rec)
    (tmp_path / "native.om").write_text(read_recording_text(rec))
    backfill_openmetrics(tmp_path / "native.om", tmp_path / "data", binary=tool)
    with _prometheus(prom, tmp_path) as server:
        spec = SourceSpec("prometheus", server.url, replay.end - replay.start + 60, replay.end + 30)
        (got,) = load_triage(spec, RecordingSource(rec).natural_step()).router_rows()
    (want,) = load_triage(SourceSpec("recording", str(rec))).router_rows()
    assert got["instance"] == want["instance"] and set(got) == set(want), (got, want)
    assert got["decisions"].keys() == want["decisions"].keys()
    for key in ("kept", "load_only"):
        assert abs(got[key] - want[key]) <= 0.05 * want[key], (key, got, want)


@pytest.mark.servers
def test_the_changes_panel_shows_the_config_change_recordings_restarts_and_kv_cuts(tmp_path):
    """The fleet board's "Restarts and KV-capacity changes" on the real vLLM recording restarted
    between phases (--num-gpu-blocks-override 256 -> 20 -> 256 -> 256): a restart at each change
    `kvscope curve` finds in the same recording, a KV-capacity change at the first two only (the
    third restart kept its flags)."""
    from kvscope.dashboards import queries as q
    from kvscope.diagnoser.curve.report import pool_curves
    from kvscope.diagnoser.curve.window import read_window
    from kvscope.diagnoser.sources.recording import RecordingSource

    path = RECORDINGS / "curve-vllm-config-changes.om.gz"
    source = RecordingSource(path)
    (pc,) = pool_curves(read_window(source, None, None, source.natural_step()))
    times = [j.change.time for j in pc.changes]
    assert [bool(j.change.diff) for j in pc.changes] == [True, True, False]
    with serve_recording(path, tmp_path) as (url, replay):

        def at(query, t: float) -> float:  # the panel query's value at t (one engine)
            (series,) = prometheus_query_range(url, substitute(query.expr, t, t), t, t, step=1.0)
            return float(series["values"][-1][1])

        # a step up at each change: the 15-minute window before a point just after it holds one more
        stepped = [[at(query, t + 30) - at(query, t - 30) for t in times] for query in q.CHANGES]
    assert stepped == [[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]], (times, stepped)


@pytest.mark.servers
def test_the_operating_point_panel_draws_the_staircase_against_its_truths(tmp_path):
    """The fleet board's "TTFT p99 and p50 against concurrency" on the real vLLM staircase
    (closed-loop levels of 1, 2, 4, 8, 16 streams). Each query is evaluated at the end of each
    level over the level's own span (Grafana's $__rate_interval set to it) and compared with the
    truths the recorder computed apart from kvscope: the engine's mean running + waiting polled
    once a second, and its TTFT histogram read from /metrics at the level's start and end. The
    panel reads the recorded 2 s scrapes instead, so its window may take in up to a scrape of the
    neighbouring level at each edge (a few of a level's ~100 requests): each number is to agree
    within 15 %, and the concurrency must rise level by level with p99 at the top above the bottom's."""
    from kvscope.dashboards import queries as q

    (panel,) = [p for b in BOARDS for p in b.panels() if p.kind == "xychart"]
    assert panel.queries == q.OPERATING_POINT and panel.repeat == "model"
    path = RECORDINGS / "curve-vllm-staircase.om.gz"
    meta = yaml.safe_load(path.with_name("curve-vllm-staircase.yaml").read_text())
    t0 = meta["recorded_at_unix"]
    got = []
    with serve_recording(path, tmp_path) as (url, _):
        for phase in meta["phases"]:
            start, end = t0 + phase["start_s"], t0 + phase["end_s"]
            row = []
            for query in panel.queries:
                expr = query.expr.replace("$__rate_interval", f"{round(end - start)}s")
                (series,) = prometheus_query_range(url, substitute(expr, start, end), end, end, step=1.0)
                row.append(float(series["values"][-1][1]))
            got.append(row)
    truth = [[p["engine_in_flight_mean"], p["engine_ttft_p99_s"], p["engine_ttft_p50_s"]] for p in meta["phases"]]
    for mine, want in zip(got, truth, strict=True):
        assert all(abs(a - b) <= 0.15 * b for a, b in zip(mine, want, strict=True)), (got, truth)
    concurrency = [row[0] for row in got]
    assert concurrency == sorted(concurrency) and len(set(concurrency)) == len(concurrency), got
    assert got[-1][1] > got[0][1], got
