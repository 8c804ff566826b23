"""The live cascade hook (CascadeWindow) against the offline detector on synthetic cycles."""

from itertools import groupby

from kvscope.agent.config import build_config
from kvscope.agent.derive import cascade
from kvscope.agent.derive.cascade import CascadeConfig, CascadeWindow, evaluate_cascade, render_cascade_samples
from kvscope.agent.derive.hooks import derive_hooks
from kvscope.agent.runtime import AgentRuntime
from kvscope.core.signals import Sample
from tests.unit.test_cascade import _cascade_run, _no_counter, _series


def _cycles(samples):
    """One list of samples per timestamp, in time order (one agent cycle each)."""
    ordered = sorted(samples, key=lambda s: s.timestamp)
    return [list(g) for _, g in groupby(ordered, key=lambda s: s.timestamp)]


def _run(samples, hook=None):
    """Feed the hook cycle by cycle; each cycle's output next to the offline evaluation of
    everything up to that cycle."""
    hook, seen, out = hook or CascadeWindow(), [], []
    for cycle in _cycles(samples):
        seen += cycle
        ts = cycle[0].timestamp
        out.append((hook(cycle), render_cascade_samples(evaluate_cascade(seen), ts)))
    return out


def _stage(samples):
    return next(s.value for s in samples if s.name == "engine_cascade_stage_code")


def test_the_hook_fires_stage_2_from_a_counter_as_the_offline_detector_does():
    steps = _run(_cascade_run())
    assert all(live == offline for live, offline in steps)
    assert [_stage(live) for live, _ in steps] == [0, 0, 1, 1, 2, 2, 3, 4, 4, 4]  # the queue counts from its 2nd sample
    names = {s.name for s in steps[-1][0]}
    assert names == {
        "engine_cascade_stage_code",
        "engine_cascade_stage_onset_timestamp_seconds",
        "engine_cascade_lead_seconds",
    }


def test_the_hook_fires_stage_2_from_the_queues_without_a_counter():
    steps = _run(_no_counter([8, 12, 16] + [16, 15] * 10 + [16]))
    assert all(live == offline for live, offline in steps)
    onsets = {s.label("stage") for s in steps[-1][0] if s.name == "engine_cascade_stage_onset_timestamp_seconds"}
    assert onsets == {"kv_high", "evicting", "queueing"} and _stage(steps[-1][0]) == 3


def test_the_hook_is_silent_on_a_healthy_engine_and_absent_without_kv_usage():
    healthy = (
        _series("engine_kv_cache_usage_ratio", [0.3, 0.4, 0.35, 0.3])
        + _series("engine_preemptions_total", [0, 0, 0, 0])
        + _series("engine_requests_waiting", [0, 1, 0, 0])
    )
    for live, _ in _run(healthy):
        assert [(s.name, s.value) for s in live] == [("engine_cascade_stage_code", 0.0)]  # no onset, no lead
    blind = [s for s in _cascade_run() if s.name != "engine_kv_cache_usage_ratio"]
    assert all(live == [] for live, _ in _run(blind))  # no root to read: absent, not healthy


def test_the_window_forgets_by_time_and_drops_vanished_and_surplus_instances():
    hook = CascadeWindow(window_s=20.0, max_instances=2)
    _run(_cascade_run(), hook)  # t = 0 .. 45
    assert [t for t, _ in hook.series["e0:8000"]["engine_kv_cache_usage_ratio"]] == [25.0, 30.0, 35.0, 40.0, 45.0]
    other = {"instance": "e1:8000"}
    for i, inst in enumerate(["e1:8000", "e2:8000"]):
        hook([Sample("engine_kv_cache_usage_ratio", (("instance", inst),), 0.5, 50.0 + i)])
    assert set(hook.series) == {"e1:8000", "e2:8000"}  # e0 (least recently seen) went past max_instances
    hook(_series("engine_kv_cache_usage_ratio", [0.5], labels=other, t0=80.0))
    assert set(hook.series) == {"e1:8000"}  # e2 silent for a whole window: gone
    hook(_series("engine_kv_cache_usage_ratio", [0.5, 0.6], labels=other, t0=70.0))
    assert hook.dropped["out_of_order"] == 2 and [
        t for t, _ in hook.series["e1:8000"]["engine_kv_cache_usage_ratio"]
    ] == [80.0]


def test_a_bad_instance_is_counted_and_the_others_are_still_evaluated(monkeypatch):
    real = cascade._evaluate_instance

    def flaky(instance, ser, cfg):
        if instance == "bad":
            raise ValueError("bad item")
        return real(instance, ser, cfg)

    monkeypatch.setattr(cascade, "_evaluate_instance", flaky)
    runtime = AgentRuntime(build_config({"targets": []}, environ={}, flags=[]), [], None)
    runtime.derive = [CascadeWindow()]
    good = _series("engine_kv_cache_usage_ratio", [0.95])
    bad = _series("engine_kv_cache_usage_ratio", [0.95], labels={"instance": "bad"})
    out = runtime._derived(good + bad)
    assert [(s.label("instance"), s.value) for s in out if s.name == "engine_cascade_stage_code"] == [("e0:8000", 1.0)]
    assert runtime.state.dropped[("derive_cascade", "", "exception_ValueError")] == 1
    assert runtime.state.collector_status["derive_cascade"][0]


def test_the_agent_runs_the_cascade_hook_with_the_default_thresholds():
    hooks = derive_hooks(build_config({"targets": []}, environ={}, flags=[]))
    live = [h for h in hooks if isinstance(h, CascadeWindow)]
    assert len(live) == 1 and live[0].config == CascadeConfig() and live[0].window_s == 900.0
