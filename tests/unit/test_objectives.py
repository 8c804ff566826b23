"""Latency objectives declared once (core/objectives.py): the config section, the flags and
the bucket-bound check all read them through one parser."""

from __future__ import annotations

import pytest

from kvscope.agent.config import ConfigError, build_config
from kvscope.cli import main
from kvscope.core.objectives import Objectives, ObjectiveSet, merge_flags, parse_objectives


def test_defaults_are_the_ttft_slo_the_rules_always_had():
    assert parse_objectives(None) == ObjectiveSet() and ObjectiveSet().default == Objectives(ttft=1.0, target=0.99)
    assert Objectives().bounds() == {"ttft": 1.0}


def test_durations_pools_and_tenants_inherit_the_default():
    s = parse_objectives(
        {
            "ttft": "500ms",
            "tpot": 0.1,
            "e2e": "30s",
            "target": 0.95,
            "pools": {"big": {"ttft": "2.5s"}},
            "tenants": {"batch": {"ttft": None, "target": 0.9}},
        }
    )
    assert s.default == Objectives(ttft=0.5, tpot=0.1, e2e=30.0, target=0.95)
    assert s.of(pool="big") == Objectives(ttft=2.5, tpot=0.1, e2e=30.0, target=0.95)
    assert s.of(pool="big", tenant="batch").bounds() == {"tpot": 0.1, "e2e": 30.0}  # the tenant wins
    assert s.of(pool="small", tenant="acme") is s.default


@pytest.mark.parametrize(
    ("doc", "says"),
    [
        ({"ttft": "fast"}, "objectives.ttft: not a duration"),
        ({"tpot": "-1s"}, "objectives.tpot: not a duration"),
        ({"e2e": 0}, "objectives.e2e: must be a positive duration"),
        ({"target": 99}, "objectives.target: must be a share between 0 and 1"),
        ({"target": True}, "objectives.target"),
        ({"ttfb": "1s"}, "objectives: unknown key(s) ttfb"),
        ({"pools": {"a": {"pools": {}}}}, "objectives.pools.a: unknown key(s) pools"),
        ({"tenants": ["a"]}, "objectives.tenants: must be a mapping"),
        ({"pools": {f"p{i}": {} for i in range(10_001)}}, "more than 10000"),
        ("1s", "must be a mapping"),
    ],
)
def test_bad_objectives_say_which_key(doc, says):
    with pytest.raises(ValueError, match=None) as exc:
        parse_objectives(doc)
    assert says in str(exc.value)


def test_flags_override_the_file_and_off_removes_one():
    doc = merge_flags({"tpot": "50ms", "e2e": "20s"}, {"ttft": "2s", "tpot": None, "e2e": "off", "target": None})
    assert parse_objectives(doc).default == Objectives(ttft=2.0, tpot=0.05, e2e=None)


def test_a_bound_between_bucket_bounds_names_the_engine_and_its_buckets():
    assert Objectives(ttft=1.0, tpot=0.1, e2e=10.0).unaligned() == []  # bounds vLLM and SGLang both have
    (off,) = Objectives(ttft=1.0, e2e=0.3).unaligned()
    assert (off.kind, off.engine, off.series) == ("e2e", "sglang", "sglang:e2e_request_latency_seconds")
    assert "must be bucket bounds" in off.message() and "0.2, 0.4" in off.message()


def test_the_agent_config_carries_the_objectives(tmp_path):
    cfg = build_config(file_doc={"objectives": {"ttft": "2s", "tpot": "100ms"}})
    assert cfg.objectives.default == Objectives(ttft=2.0, tpot=0.1)
    with pytest.raises(ConfigError, match="objectives.tpot"):
        build_config(file_doc={"objectives": {"tpot": "soon"}})


def test_rules_build_reads_the_same_objectives_from_file_and_flags(tmp_path, capsys):
    conf = tmp_path / "agent.yaml"
    conf.write_text("objectives:\n  ttft: 2.5s\n  target: 0.995\n")
    out = tmp_path / "out"
    args = ["rules", "build", "--out", str(out), "--runbooks", str(tmp_path / "rb")]
    assert main([*args, "--objectives", str(conf)]) == 0
    err = capsys.readouterr().err
    assert "ttft 2.5s is not a bucket bound of sglang's" in err
    assert "2.5s" in (out / "kvscope-slo.yml").read_text() and "0.995" in (out / "kvscope-slo.yml").read_text()
    assert main([*args, "--objectives", str(conf), "--slo-ttft-seconds", "1"]) == 0  # the old flag still works
    assert "0.995 within 1s" in (out / "kvscope-slo.yml").read_text()
    assert main([*args, "--slo-tpot", "soon"]) == 3
    assert "--slo-tpot: not a duration" in capsys.readouterr().err


def test_goodput_rules_follow_each_pools_objectives_and_sum_the_misses():
    from kvscope.diagnoser.promql.goodput import goodput_rules
    from kvscope.diagnoser.promql.rulefiles import SloConfig

    objectives = parse_objectives({"pools": {"big": {"ttft": "2.5s", "tpot": "100ms", "target": 0.9}}})
    text = "\n".join(r["expr"] for r in goodput_rules(objectives, SloConfig().windows))
    assert 'kvscope:request_tpot_seconds_bucket{model="big",le=~"0\\\\.1"}' in text
    assert 'kvscope:request_ttft_seconds_bucket{model!~"big",le=~"1|1\\\\.0"}' in text  # the rest: the default
    assert (
        'clamp_max((1 - pool:request_ttft_seconds:attainment_rate5m{model="big"}) + '
        '(1 - pool:request_tpot_seconds:attainment_rate5m{model="big"}), 1)'
    ) in text
    assert 'pool:goodput:error_ratio_rate1h{model="big"} > 1.44' in text  # 14.4 x the 10 % budget
