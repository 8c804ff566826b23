"""no_change is a claim: the interval excludes a change beyond the thresholds (issue 55).

A verdict of no_change where a metric's interval clears no threshold and yet reaches past one
says "nothing moved" of data that cannot tell: on the robustness bench a KV cut whose engine
TTFT p99 fell 76 % read no_change over an interval of [-0.147, -0.060] s against a threshold of
0.1 s (docs/curve.md "Did it help"). Such a comparison is undecided: `not_comparable`."""

from __future__ import annotations

from kvscope.diagnoser.curve.compare import Thresholds, same_load, undecided, verdict
from kvscope.diagnoser.curve.pooled import Load


def _d(interval, rel):
    return {"interval": list(interval), "relative_interval": list(rel)}


def test_an_interval_straddling_the_threshold_is_undecided_not_no_change():
    d = {
        "ttft_p99_s": _d([-0.147, -0.060], [-0.80, -0.30]),  # clears 10 % but not 0.1 s in full
        "output_tokens_per_s": _d([2.0, 20.0], [0.05, 0.34]),  # reaches past 10 % but not in full
    }
    assert verdict(d, Thresholds()) == ("not_comparable", [], [])
    assert undecided(d, Thresholds()) == ["ttft_p99_s", "output_tokens_per_s"]


def test_intervals_inside_the_thresholds_are_no_change():
    d = {
        "ttft_p99_s": _d([-0.05, 0.04], [-0.60, 0.50]),  # large relative, small absolute: within
        "output_tokens_per_s": _d([-30.0, 25.0], [-0.08, 0.07]),
    }
    assert verdict(d, Thresholds()) == ("no_change", [], [])
    assert undecided(d, Thresholds()) == []


def test_an_interval_wholly_past_the_thresholds_is_still_a_verdict():
    d = {"ttft_p99_s": _d([0.2, 0.5], [0.5, 2.0]), "output_tokens_per_s": _d([-30.0, 25.0], [-0.4, 0.3])}
    assert verdict(d, Thresholds()) == ("regression", ["ttft_p99_s"], [])


def test_no_change_needs_every_exported_metric_compared():
    """TTFT within the thresholds, and throughput compared at no matched bucket (the sides held
    different load at each: `compare.SAME_LOAD`): not no_change; a regression still stands."""
    d = {"ttft_p99_s": _d([-0.05, 0.04], [-0.60, 0.50])}
    assert verdict(d, Thresholds()) == ("no_change", [], [])
    assert verdict(d, Thresholds(), unmatched=["output_tokens_per_s"]) == ("not_comparable", [], [])
    worse = {"ttft_p99_s": _d([0.2, 0.5], [0.5, 2.0])}
    assert verdict(worse, Thresholds(), unmatched=["output_tokens_per_s"]) == ("regression", ["ttft_p99_s"], [])


def test_a_bucket_held_at_different_load_is_no_same_load():
    """Within the relative threshold of the larger side's mean requests in the engine."""
    at = lambda c: Load(concurrency=c, waiting=0.0, preemptions_per_s=0.0)  # noqa: E731
    assert same_load(at(1.0), at(0.95)) and same_load(at(20.0), at(18.2))
    assert not same_load(at(1.35), at(0.87)) and not same_load(at(0.86), at(1.06))


def test_an_undecided_change_says_how_much_more_traffic_would_settle_it():
    """TTFT p99 +0.14 s over [-0.02, +0.30] s and +25 % over [-5 %, +60 %]: both straddle their
    thresholds (0.1 s, 10 %); the relative scale needs less: half-width 32.5 %, 15 % from the
    threshold, (32.5 / 15)^2 = 4.69 times the intervals, 3.69 more per interval held; on the clock,
    over each side's share of its time at that load. With the estimate on both thresholds nothing
    is estimable."""
    from kvscope.diagnoser.curve.compare import At
    from kvscope.diagnoser.curve.decide import more_to_settle

    at = [At((3.5, 5.0), 4.0, (10, 8), (1000.0, 800.0))]
    d = {"ttft_p99_s": _d([-0.02, 0.30], [-0.05, 0.60]) | {"delta": 0.14, "relative": 0.25}}
    assert undecided(d, Thresholds()) == ["ttft_p99_s"]
    (more,) = more_to_settle(d, Thresholds(), at, 15.0)
    assert (more["before"]["more_intervals"], more["after"]["more_intervals"]) == (37, 30)
    assert more["after"]["more_seconds"] == 30 * 15.0 and more["after"]["more_wall_seconds"] is None
    # each side held the load a quarter (10 of 40 intervals) and half (8 of 16) of its time: on
    # traffic of that shape the intervals asked take four and two times as long on the clock
    (more,) = more_to_settle(d, Thresholds(), at, 15.0, totals=(40, 16))
    assert (more["before"]["more_wall_seconds"], more["after"]["more_wall_seconds"]) == (148 * 15.0, 60 * 15.0)
    d["ttft_p99_s"] |= {"delta": 0.101, "relative": 0.105}
    assert more_to_settle(d, Thresholds(), at, 15.0) == []


def test_a_gain_the_step_may_explain_is_no_verdict_where_the_step_was_not_shown_held():
    """stairs-10-long's same-flags restart: output tokens/s +12..+39 % at matched concurrency while
    the mean ITL at the same batch went -15..-6 %: not beyond -10 % in full (not `moved`), nor
    within it (not shown held). With the step divided out the gain is -0..+26 %: the machine (there
    the API server starved the engine before the restart) is not ruled out, so no engine verdict.
    Where the step's interval lies within the threshold, the same gain is an improvement."""
    from kvscope.diagnoser.curve.compare import step_held, verdict

    d = {"output_tokens_per_s": _d([71.6, 203.5], [0.12, 0.39])}
    step = _d([-0.00034, -0.00012], [-0.149, -0.059]) | {
        "scaled": {"output_tokens_per_s": _d([-0.6, 140.0], [-0.001, 0.257])}
    }
    assert not step_held(step, Thresholds())
    assert verdict(d, Thresholds(), None, step) == ("not_comparable", [], [])
    step["relative_interval"] = [-0.08, -0.02]
    assert step_held(step, Thresholds())
    assert verdict(d, Thresholds(), None, step) == ("improvement", [], ["output_tokens_per_s"])
