"""agent/otel: the OTLP push configuration and the GenAI conversion (the push itself runs against
the SDK exporter in tests/integration/test_otlp_push.py)."""

from __future__ import annotations

import os

import pytest

from kvscope.agent.config import ConfigError
from kvscope.agent.otel.convert import Converter
from kvscope.agent.otel.genai import CONVENTIONS, genai_points
from kvscope.agent.otel.push import parse_section, push_config
from kvscope.core.signals import Sample, make_labels


def _config(section, env, monkeypatch):
    """push_config with `env` as the whole OTEL_* environment (the SDK's exporter reads the process's)."""
    for var in [v for v in os.environ if v.startswith("OTEL_")]:
        monkeypatch.delenv(var)
    for var, value in env.items():
        monkeypatch.setenv(var, value)
    return push_config(section, env)


def test_push_is_off_unless_configured_or_asked_for_by_the_standard_variable(monkeypatch):
    assert _config(None, {}, monkeypatch) is None
    assert _config(None, {"OTEL_METRICS_EXPORTER": "prometheus"}, monkeypatch) is None
    assert _config({"enabled": False}, {"OTEL_METRICS_EXPORTER": "otlp"}, monkeypatch) is None
    cfg = _config(None, {"OTEL_METRICS_EXPORTER": "console,otlp"}, monkeypatch)
    assert cfg is not None and cfg.endpoint == "http://localhost:4318/v1/metrics" and cfg.interval_s == 60.0
    assert (cfg.timeout_s, cfg.temporality) == (10.0, "cumulative")


def test_the_sdk_reads_the_standard_variables_the_section_leaves_out(monkeypatch):
    env = {
        "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318/",
        "OTEL_EXPORTER_OTLP_HEADERS": "api-key=a%3Db,x=1",
        "OTEL_METRIC_EXPORT_INTERVAL": "5000",
        "OTEL_EXPORTER_OTLP_TIMEOUT": "2.5",  # seconds, as the Python SDK reads it
        "OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE": "LowMemory",
    }
    cfg = _config({}, env, monkeypatch)
    assert cfg is not None
    assert cfg.endpoint == "http://collector:4318/v1/metrics"
    assert (cfg.interval_s, cfg.timeout_s, cfg.temporality) == (5.0, 2.5, "delta")
    env["OTEL_EXPORTER_OTLP_METRICS_ENDPOINT"] = "https://m.example/otlp/v1/metrics"
    assert _config({}, env, monkeypatch).endpoint == "https://m.example/otlp/v1/metrics"
    section = {"endpoint": "http://vm:8428/opentelemetry/v1/metrics", "interval_s": "15s", "timeout_s": "3s"}
    own = _config({**section, "temporality": "cumulative"}, env, monkeypatch)
    assert own.endpoint == "http://vm:8428/opentelemetry/v1/metrics" and own.interval_s == 15.0
    assert (own.timeout_s, own.temporality) == (3.0, "cumulative")


@pytest.mark.parametrize(
    ("section", "env", "names"),
    [
        ({"endpoint": "collector:4318"}, {}, "otlp_push.endpoint"),
        (
            {},
            {"OTEL_METRICS_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_ENDPOINT": "ftp://x"},
            r"OTEL_EXPORTER_OTLP_\[METRICS_\]ENDPOINT",
        ),
        ({"temporality": "sometimes"}, {}, "otlp_push.temporality"),
        ({}, {"OTEL_METRIC_EXPORT_INTERVAL": "soon"}, "OTEL_METRIC_EXPORT_INTERVAL"),
        ({"headers": "a=b"}, {}, "otlp_push.headers"),
        ({"max_points": 0}, {}, "otlp_push.max_points"),
    ],
)
def test_bad_settings_stop_the_agent_naming_the_key(section, env, names, monkeypatch):
    with pytest.raises(ConfigError, match=names):
        _config(section, env, monkeypatch)


def test_an_unknown_key_in_the_section_is_refused():
    with pytest.raises(ConfigError, match="otlp_push.endpiont: unknown key"):
        parse_section({"endpiont": "http://x:4318/v1/metrics"})


def _hist(name: str, labels: dict[str, str], buckets: dict[str, float], total: float) -> list[Sample]:
    out = [Sample(name + "_bucket", make_labels({**labels, "le": le}), v) for le, v in buckets.items()]
    return out + [
        Sample(name + "_sum", make_labels(labels), total),
        Sample(name + "_count", make_labels(labels), max(buckets.values())),
    ]


LABELS = {"instance": "10.0.0.7:8000", "engine": "sglang", "model": "m", "job": "e"}


def test_genai_points_sum_ranks_and_keep_engine_bounds_the_advice_would_split():
    e2e = {"0.3": 1.0, "0.5": 3.0, "1.0": 4.0, "+Inf": 5.0}
    samples = _hist("request_e2e_seconds", {**LABELS, "dp_rank": "0"}, e2e, 4.0)
    samples += _hist("request_e2e_seconds", {**LABELS, "dp_rank": "1"}, e2e, 6.0)
    dropped: dict[str, int] = {}
    points = genai_points(samples, "chat", dropped)
    (conv,) = points
    assert conv.name == "gen_ai.server.request.duration"
    (p,) = points[conv]
    assert dict(p.attributes) == {
        "gen_ai.operation.name": "chat",
        "gen_ai.provider.name": "sglang",
        "gen_ai.system": "sglang",
        "gen_ai.request.model": "m",
        "server.address": "10.0.0.7",
        "server.port": 8000,
    }
    assert p.bounds == (0.3, 0.5, 1.0)  # 0.3 is no advised bound: the engine's kept, none invented
    assert p.counts == (2, 4, 2, 2) and p.count == 10 and p.total == 10.0
    assert not dropped


def test_genai_points_leave_out_broken_histograms_and_count_them():
    samples = _hist("request_ttft_seconds", LABELS, {"0.1": 5.0, "1.0": 3.0, "+Inf": 6.0}, 1.0)
    samples += _hist("request_tpot_seconds", LABELS, {"0.1": 5.0}, 1.0)  # no +Inf
    dropped: dict[str, int] = {}
    assert genai_points(samples, dropped=dropped) == {}
    assert dropped == {"not_cumulative": 1, "incomplete_histogram": 1}
    assert genai_points([Sample("request_ttft_seconds", make_labels(LABELS), 1.0)]) == {}  # absent, not zero


def test_delta_temporality_sends_increases_and_restarts_after_a_reset():
    ttft = next(c for c in CONVENTIONS if c.signal == "request_ttft_seconds")
    bounds = {str(b): 0.0 if b < 0.1 else 1.0 for b in ttft.advice}  # x n: n observations of 0.1 s
    conv = Converter("delta", started_ns=100)

    def push(n: float, t: int):
        pts = genai_points(
            _hist("request_ttft_seconds", LABELS, {**{k: v * n for k, v in bounds.items()}, "+Inf": n}, n)
        )
        pts = {ttft: pts[ttft]}
        data, kept, over = conv.metrics_data([], pts, t)
        return data.resource_metrics[0].scope_metrics[0].metrics[0].data.data_points[0]

    first, second, after_reset = push(4, 200), push(10, 300), push(3, 400)
    assert (first.count, first.start_time_unix_nano) == (4, 100)
    assert (second.count, second.start_time_unix_nano, second.sum) == (6, 200, 6.0)
    assert after_reset.count == 3  # the engine restarted: its new total, not a negative increase


def test_the_point_cap_drops_and_counts_the_rest():
    conv = Converter()
    pts = genai_points(
        _hist("request_ttft_seconds", LABELS, {"1.0": 1.0, "+Inf": 1.0}, 1.0)
        + _hist("request_ttft_seconds", {**LABELS, "model": "n"}, {"1.0": 1.0, "+Inf": 1.0}, 1.0)
    )
    _, kept, over = conv.metrics_data([], pts, 1, max_points=1)
    assert (kept, over) == (1, 1)
