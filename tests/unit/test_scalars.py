"""The one reader of durations, booleans and timestamps (core/scalars.py), and the callers whose
input differs choosing an option instead of keeping a copy."""

from __future__ import annotations

import pytest

from kvscope.agent.collectors.engine import EngineCollector
from kvscope.agent.config import ConfigError, build_config
from kvscope.agent.tap.collector import parse_tap_config
from kvscope.core.scalars import MAX_TEXT, parse_bool, parse_duration, parse_timestamp
from kvscope.ui.alert_link import from_query


@pytest.mark.parametrize(
    "text, seconds",
    [("30s", 30.0), ("5m", 300.0), ("1h30m", 5400.0), ("500ms", 0.5), ("10s1ms", 10.001), ("1w", 604800.0)],
)
def test_prometheus_durations_read_the_same_either_way(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)
    assert parse_duration(text, loose=True) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "text, seconds", [("2.5", 2.5), ("1e3", 1000.0), ("15S", 15.0), (" 15 s ", 15.0), (".5h", 1800.0)]
)
def test_loose_durations_are_config_and_flag_text_never_promql(text, seconds):
    assert parse_duration(text, loose=True) == seconds
    with pytest.raises(ValueError, match="not a duration"):
        parse_duration(text)  # a rule file's duration goes into PromQL as written


def test_durations_reject_garbage_booleans_and_overlong_text():
    for bad in ("", "abc", "5 minutes", "1.h", "-5s", "nan", "inf"):
        with pytest.raises(ValueError):
            parse_duration(bad, loose=True)
    with pytest.raises(ValueError, match="boolean"):
        parse_duration(True, loose=True)
    with pytest.raises(ValueError, match=f"longer than {MAX_TEXT}"):
        parse_duration("1" * 10_000 + "x", loose=True)
    assert parse_duration(7) == 7.0


def test_booleans_take_the_usual_words_and_refuse_a_typo():
    assert [parse_bool(v) for v in (True, "yes", " ON ", 1, "True")] == [True] * 5
    assert [parse_bool(v) for v in (False, "no", "Off", 0, "false")] == [False] * 5
    with pytest.raises(ValueError, match="not a boolean: 'flase'"):
        parse_bool("flase")


def test_rfc3339_offsets_fractions_and_garbage():
    z = parse_timestamp("2026-06-01T12:00:00Z")
    assert z == 1780315200.0
    assert parse_timestamp("2026-06-01T14:00:00+02:00") == parse_timestamp("2026-06-01T07:00:00-05:00") == z
    assert parse_timestamp("2026-06-01T12:00:00.5Z") == z + 0.5
    assert parse_timestamp("2026-06-01T12:00:00.417512934Z") == pytest.approx(z + 0.417512934, abs=1e-6)
    bad = ("2026-06-01T12:00:00", "2026-06-01T12:00:00.Z", "2026-06-01T25:00:00Z", "2026-06-01T12:00:00+2:00")
    bad += ("2026-02-30T00:00:00Z", "2026-06-01T12:00:00+24:00", "1780315200", "x" * (MAX_TEXT + 1), None)
    for text in bad:
        with pytest.raises(ValueError):
            parse_timestamp(text)


def test_loose_timestamps_are_command_line_times_in_utc():
    z = 1763769600.0  # 2025-11-22T00:00:00Z
    for text in ("1763769600", "2025-11-22T00:00:00", "2025-11-22", "2025-11-22 01:00:00+01:00", " 2025-11-22T00:00z "):
        assert parse_timestamp(text, loose=True) == z, text


def test_tap_inject_usage_false_as_text_is_false():
    """`inject_usage: "false"` (or KVSCOPE-style text) was bool("false"), i.e. True."""
    cfg = parse_tap_config({"upstreams": "http://e:8000", "inject_usage": "false"})["tap"]
    assert cfg.inject_usage is False
    with pytest.raises(ConfigError, match='tap.inject_usage: must be true or false, got "sometimes"'):
        parse_tap_config({"upstreams": "http://e:8000", "inject_usage": "sometimes"})


def test_engine_health_probe_typo_is_an_error_not_on():
    """`health_probe: flase` used to leave the probe on; now it names the option."""

    def collector(value):
        return EngineCollector(build_config({"collectors": {"engine": {"health_probe": value}}}, environ={}, flags=[]))

    assert collector("off").health_probe is False and collector("yes").health_probe is True
    with pytest.raises(ConfigError, match="collectors.engine.health_probe: not a boolean"):
        collector("flase")


def test_config_durations_take_prometheus_compound_forms():
    cfg = build_config({"store": {"retention_s": "1w"}, "scrape": {"interval_s": "1m30s"}}, environ={}, flags=[])
    assert (cfg.retention_s, cfg.interval_s) == (604800.0, 90.0)


def test_triage_link_window_is_any_prometheus_duration():
    assert from_query({"alertname": "A", "window": "1h30m"}).window_s == 5400.0
    assert from_query({"alertname": "A", "window": "1h 30m"}).window_s is None
