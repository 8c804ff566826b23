"""Goodput from the engines' per-objective histograms (core/goodput.py, diagnoser/goodput.py,
`kvscope goodput`): Fréchet bounds that bracket the exact share, absent objectives named."""

from __future__ import annotations

import json
import random
from pathlib import Path

import numpy as np
import pytest
import yaml

from kvscope.cli import main
from kvscope.core.goodput import Attainment, attainment, frechet
from kvscope.core.objectives import Objectives, ObjectiveSet
from kvscope.core.signals import make_labels
from kvscope.diagnoser.evaluate.frame import Block
from kvscope.diagnoser.goodput import SIGNALS, pool_goodput
from kvscope.diagnoser.sources.recording import RecordingSource
from kvscope.diagnoser.sources.window import read_window

LIB = Path(__file__).resolve().parents[1] / "recordings"


def test_attainment_reads_the_bucket_at_the_bound_or_brackets_it():
    b = [(0.5, 10.0), (1.0, 60.0), (2.5, 90.0), (float("inf"), 100.0)]
    assert attainment(b, 1.0) == Attainment(60.0, 60.0, 100.0)
    assert attainment(b, 2.0) == Attainment(60.0, 90.0, 100.0)  # between 1 and 2.5: an interval
    assert attainment(b, 0.1) == Attainment(0.0, 10.0, 100.0)
    assert attainment(b[:-1], 1.0) is None  # no +Inf: no total
    assert attainment([(float("inf"), 0.0)], 1.0) is None  # nothing counted is not 100 %


def test_frechet_bounds_and_an_objective_not_evaluable():
    g = frechet({"ttft": (0.9, 0.9), "tpot": (0.8, 0.8)})
    assert g.lower == pytest.approx(0.7) and g.upper == pytest.approx(0.8)
    assert frechet({"ttft": (0.3, 0.3), "e2e": (0.4, 0.4)}).lower == 0.0
    blind = frechet({"ttft": (0.9, 0.9)}, ["tpot"])
    assert blind.lower is None and blind.upper == 0.9 and blind.not_evaluable == ("tpot",)


def test_the_bounds_bracket_the_exact_share_of_requests_meeting_all():
    """Per-request latencies drawn correlated and not: the share meeting all three objectives,
    counted per request, lies within the bounds the three histograms give."""
    rng = random.Random(59)
    les = [0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, float("inf")]
    obj = {"ttft": 1.0, "tpot": 0.1, "e2e": 10.0}
    for trial in range(40):
        reqs = []
        for _ in range(300):
            load = rng.expovariate(1.0) * (trial % 4 + 1)
            reqs.append({"ttft": 0.3 * load * rng.random(), "tpot": 0.04 * load, "e2e": 3 * load * rng.random()})
        exact = sum(all(r[k] <= b for k, b in obj.items()) for r in reqs) / len(reqs)
        shares = {}
        for k, b in obj.items():
            got = attainment([(le, sum(r[k] <= le for r in reqs)) for le in les], b)
            assert got is not None
            shares[k] = got.share
        g = frechet(shares)
        assert g.lower is not None and g.upper is not None
        assert g.lower - 1e-12 <= exact <= g.upper + 1e-12


def _frame(name: str):
    return read_window(RecordingSource(str(LIB / name)), SIGNALS)


def test_pool_goodput_on_a_real_vllm_recording_reads_all_three_objectives():
    objectives = ObjectiveSet(Objectives(ttft=1.0, tpot=0.1, e2e=30.0))
    (pool,) = pool_goodput(_frame("kv-pressure-cascade.om.gz"), objectives)
    g = pool.goodput
    assert pool.pool == "tiny-llama" and g.read == ("ttft", "tpot", "e2e") and g.not_evaluable == ()
    assert g.lower is not None and g.upper is not None and 0 < g.lower <= g.upper < 1
    assert pool.requests_per_s and pool.output_tokens_per_s  # raw throughput beside it
    lo, hi = pool.good_requests_per_s()
    assert lo == pytest.approx(g.lower * pool.requests_per_s) and hi == pytest.approx(g.upper * pool.requests_per_s)
    assert pool.gpus is None and pool.good_tokens_per_gpu_hour() == (None, None)  # a CPU recording: no GPU
    assert pool.unaligned == ()  # 30 s is a vLLM e2e bound; SGLang's are not named for a vLLM pool


def test_good_tokens_per_gpu_hour_where_the_engine_gpu_join_counts_the_pools_gpus():
    frame = _frame("kv-pressure-cascade.om.gz")
    instance = dict(frame.blocks["engine_generation_tokens_total"].labels[0])["instance"]
    join = [make_labels({"instance": instance, "gpu_uuid": f"GPU-{i}", "join": "pid"}) for i in range(2)]
    frame.blocks["engine_gpu_memory_used_bytes"] = Block(join, np.ones((2, len(frame.ts))))
    (pool,) = pool_goodput(frame, ObjectiveSet(Objectives(ttft=1.0, tpot=0.1, e2e=30.0)))
    lo, hi = pool.good_tokens_per_s()
    assert pool.gpus == 2 and lo is not None and hi is not None
    assert pool.good_tokens_per_gpu_hour() == (pytest.approx(lo * 1800), pytest.approx(hi * 1800))


def test_an_objective_without_its_histogram_is_not_evaluable_never_zero():
    """This recording's vLLM exports no per-request TPOT histogram."""
    (pool,) = pool_goodput(_frame("blind-vllm-kv-too-small.om.gz"), ObjectiveSet(Objectives(tpot=0.1)))
    assert pool.goodput.not_evaluable == ("tpot",) and pool.goodput.lower is None
    assert pool.goodput.upper is not None and pool.good_requests_per_s()[0] is None


def test_goodput_command_prints_bounds_and_refuses_bad_objectives(capsys):
    rec = str(LIB / "kv-pressure-cascade.om.gz")
    assert main(["goodput", "--recording", rec, "--slo-tpot", "100ms", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["objectives_read"] == ["ttft", "tpot"] and row["goodput"]["exact"] is None
    assert row["goodput"]["lower"] <= row["goodput"]["upper"]
    assert main(["goodput", "--recording", rec, "--slo-target", "1.5"]) == 3
    assert "--slo-target: must be a share between 0 and 1" in capsys.readouterr().err


def test_the_weekly_report_shows_goodput_beside_output_tokens():
    from kvscope.report.render import format_table, pool_columns
    from kvscope.report.weekly.series import report_window
    from kvscope.report.weekly.week import compute_week

    frame = report_window(RecordingSource(str(LIB / "kv-pressure-cascade.om.gz")))
    week = compute_week(frame, float(frame.ts[0]), float(frame.ts[-1]), 2.0)
    (expected,) = pool_goodput(frame)  # the generated rules' default objectives: TTFT <= 1 s
    assert expected.goodput.upper is not None
    head, row = format_table(week.pools, pool_columns(), "Pool")
    assert head[1:3] == ["Output tokens", "Goodput (TTFT <= 1s for 0.99 of requests)"]
    assert row[0] == "tiny-llama / unified" and row[2] == f"{expected.goodput.upper:.1%}"


def test_on_real_vllm_behind_the_tap_the_engine_bounds_miss_time_spent_outside_it():
    """lora-two-adapters: real vLLM 0.32 serving two LoRA adapters and its base model behind the
    tap, which judged every request against the recording's objectives. The engine's histograms
    (one pool: vLLM labels every request with its served model) say every request met them; the
    tap, timing what the client saw, counted some that did not (the engine's TTFT sum is 2.3 s over
    156 requests, the tap's 18 s). The exact share is not bracketed, and the output says why."""
    meta = yaml.safe_load((LIB / "lora-two-adapters.yaml").read_text())["objectives"]
    objectives = ObjectiveSet(Objectives(ttft=meta["ttft_s"], tpot=meta["tpot_s"], e2e=meta["e2e_s"]))
    rows = {r.pool: r for r in pool_goodput(_frame("lora-two-adapters.om.gz"), objectives)}
    base = rows["tiny-llama"]
    assert base.goodput.read == ("ttft", "tpot", "e2e") and base.goodput.lower == pytest.approx(1.0)
    assert base.exact is not None and base.exact < base.goodput.lower
    assert "outside the engine" in (base.outside_engine() or "")
    for adapter in ("a", "b"):  # the tap's pools by request model: no engine histogram names them
        assert rows[adapter].exact is not None and rows[adapter].goodput.read == ()
        assert rows[adapter].outside_engine() is None  # nothing to compare with: no note
    judged = sum(r.exact_requests_per_s or 0.0 for r in rows.values())
    assert judged == pytest.approx(base.requests_per_s, rel=0.05)  # the same requests, seen from both sides


def test_report_weekly_judges_goodput_against_the_objective_flags(tmp_path, capsys):
    from kvscope.report.weekly.series import report_window

    rec = str(LIB / "kv-pressure-cascade.om.gz")
    frame = report_window(RecordingSource(rec))
    (default,) = pool_goodput(frame)
    md = tmp_path / "week.md"
    args = ["report", "weekly", "--recording", rec, "--markdown", str(md), "--no-progress", "--no-diagnose"]
    assert main([*args, "--slo-ttft", "100ms", "--slo-target", "0.95"]) == 0
    table = md.read_text()
    assert "Goodput (TTFT \\<= 0.1s for 0.95 of requests)" in table and "TTFT \\<= 1s" not in table
    (tight,) = pool_goodput(frame, ObjectiveSet(Objectives(ttft=0.1, target=0.95)))
    assert tight.goodput.upper is not None and tight.goodput.upper < default.goodput.upper
    assert f"| {tight.goodput.upper:.1%} |" in table and f"| {default.goodput.upper:.1%} |" not in table
    assert main([*args, "--slo-target", "2"]) == 3
    assert "--slo-target: must be a share between 0 and 1" in capsys.readouterr().err
