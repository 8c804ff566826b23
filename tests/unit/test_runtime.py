"""AgentRuntime with in-process collectors (our own loop logic; real scraping is in tests/integration)."""

from __future__ import annotations

import asyncio
import time
from collections import Counter

from kvscope.agent.collectors.base import Collection, Health
from kvscope.agent.config import build_config
from kvscope.agent.runtime import AgentRuntime, CounterResets
from kvscope.agent.scrape.exposition import parse_exposition
from kvscope.agent.serve.export import render_metrics
from kvscope.agent.store.sqlite import MEMORY, SqliteStore
from kvscope.core.signals import Sample, load_catalog, make_labels

GPU = make_labels({"gpu": "0", "node": "n1"})


class StaticCollector:
    """Returns fixed samples; counts its calls."""

    name = "static"

    def __init__(self) -> None:
        self.calls = 0

    async def collect(self) -> Collection:
        self.calls += 1
        return Collection(
            samples=[Sample("gpu_power_watts", GPU, 300.0 + self.calls, time.time())],
            health=[Health(collector=self.name)],
        )

    async def close(self) -> None:
        return None


class HangingCollector:
    name = "hanging"

    async def collect(self) -> Collection:
        await asyncio.sleep(3600)  # far past any timeout: the cycle ends only if the runtime cuts it
        return Collection()

    async def close(self) -> None:
        return None


class StallingScraper:
    """Scrapes one target fine, then hangs (an engine whose /metrics stops answering while the
    event loop is too busy for the scrape's own timeout to fire first)."""

    name = "engine"

    def __init__(self) -> None:
        self.calls = 0

    async def collect(self) -> Collection:
        self.calls += 1
        if self.calls > 1:
            await asyncio.sleep(3600)
        return Collection(health=[Health("engine", "10.0.0.1:8000", up=True)])

    async def close(self) -> None:
        return None


class DownCollector:
    name = "nvmlish"

    async def collect(self) -> Collection:
        return Collection(health=[Health(collector=self.name, up=False, reason="NVMLError_LibraryNotFound")])

    async def close(self) -> None:
        return None


def config(interval_s: float = 1.0):
    return build_config({"scrape": {"interval_s": interval_s, "timeout_s": interval_s / 2}}, environ={})


def test_derive_hook_output_is_stored_and_reexported_and_a_failing_hook_is_reported():
    def doubled_power(cycle):
        return [
            Sample("gpu_memory_used_bytes", s.labels, s.value * 2, s.timestamp)
            for s in cycle
            if s.name == "gpu_power_watts"
        ]

    def broken(cycle):
        raise KeyError("oops")

    store = SqliteStore(MEMORY, background=False)
    rt = AgentRuntime(config(), [StaticCollector()], store, derive=[doubled_power, broken])
    asyncio.run(rt.run_cycle())
    store.flush()
    expo = parse_exposition(render_metrics(rt.state, load_catalog()))
    values = {(s.name, s.labels): s.value for s in expo.samples}
    assert values[("kvscope_gpu_memory_used_bytes", GPU)] == 602.0
    assert (
        values[
            ("kvscope_collector_status", make_labels({"collector": "derive_broken", "reason": "exception_KeyError"}))
        ]
        == 1
    )
    assert list(store.query("gpu_memory_used_bytes", 0, 2e10).values())[0][0][1] == 602.0


def test_a_hanging_collector_times_out_and_the_cycle_completes():
    """Causal, not timed: the collector sleeps an hour, so a cycle that returns was cut by the
    runtime's collect timeout (1 s here). The 300 s ceiling only turns a regression into a failure
    instead of an hour-long hang."""
    static = StaticCollector()
    rt = AgentRuntime(config(1.0), [HangingCollector(), static], None)
    asyncio.run(asyncio.wait_for(rt.run_cycle(), 300))
    assert rt.state.collector_status["hanging"][:2] == (False, "collect_timeout")
    assert rt.state.collector_status["static"][:2] == (True, "ok")
    assert static.calls == 1


def test_the_targets_of_a_collection_that_timed_out_are_down_not_absent():
    """A collector cut by the runtime's timeout reports no health of its own: its targets read
    down with the collector's reason and one scrape error, instead of vanishing from
    kvscope_target_up for the cycle."""
    rt = AgentRuntime(config(1.0), [StallingScraper()], None)
    asyncio.run(rt.run_cycle())
    asyncio.run(asyncio.wait_for(rt.run_cycle(), 300))
    (h,) = rt.state.health["engine"]
    assert (h.target, h.up, h.reason) == ("10.0.0.1:8000", False, "collect_timeout")
    values = {(s.name, s.labels): s.value for s in parse_exposition(render_metrics(rt.state, load_catalog())).samples}
    up = [
        v
        for (name, labels), v in values.items()
        if name == "kvscope_target_up" and ("instance", "10.0.0.1:8000") in labels
    ]
    errors = [
        v
        for (name, labels), v in values.items()
        if name == "kvscope_scrape_errors_total" and ("reason", "collect_timeout") in labels
    ]
    assert up == [0.0] and errors == [1.0]
    asyncio.run(asyncio.wait_for(rt.run_cycle(), 300))  # still hanging: still down, one more error
    assert [(h.target, h.up) for h in rt.state.health["engine"]] == [("10.0.0.1:8000", False)]
    assert sum(n for (_, _, reason), n in rt.state.scrape_errors.items() if reason == "collect_timeout") == 2


def test_a_collector_reporting_itself_down_carries_its_reason():
    rt = AgentRuntime(config(), [DownCollector()], None)
    asyncio.run(rt.run_cycle())
    assert rt.state.collector_status["nvmlish"][:2] == (False, "NVMLError_LibraryNotFound")


def test_run_keeps_the_cadence_and_stops_promptly():
    """Load-proof: ticks keep coming (wait for 3, however slow the box), never faster than the
    interval (a stalled loop only makes fewer ticks), and stop() ends the loop without another cycle."""
    static = StaticCollector()
    rt = AgentRuntime(config(0.2), [static], None)

    async def main():
        task = asyncio.create_task(rt.run())
        t0 = time.monotonic()
        while static.calls < 3:  # a generous ceiling only guards against a loop that stopped ticking
            assert time.monotonic() - t0 < 300 and not task.done(), f"{static.calls} ticks"
            await asyncio.sleep(0.05)
        elapsed = time.monotonic() - t0
        calls = static.calls
        rt.stop()
        await task
        return elapsed, calls

    elapsed, calls = asyncio.run(main())
    assert calls <= elapsed / 0.2 + 2  # ticks at 0, 0.2, 0.4, ...: never ahead of the cadence
    assert static.calls == calls  # stopped: no cycle after stop()


def test_stop_wakes_the_loop_instead_of_sleeping_out_the_interval():
    """Causal, not timed: with an hour between ticks, the loop ends after stop() only if stop()
    wakes it; the 300 s ceiling turns a regression into a failure instead of an hour-long hang."""
    static = StaticCollector()
    rt = AgentRuntime(config(3600.0), [static], None)

    async def main():
        task = asyncio.create_task(rt.run())
        while static.calls < 1:
            await asyncio.sleep(0.01)
        rt.stop()
        await asyncio.wait_for(task, 300)

    asyncio.run(main())
    assert static.calls == 1


def test_a_cycle_that_raises_is_reported_and_the_loop_goes_on():
    """A collector bug that breaks the cycle itself (a counter whose value turns into text makes
    the reset check compare str with float): the cycle is reported down, the next ones run."""
    values = iter([1.0, "x", 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0, 9.0])

    class Flaky(StaticCollector):
        async def collect(self) -> Collection:
            self.calls += 1
            return Collection(
                samples=[Sample("engine_x_total", GPU, next(values), time.time())], health=[Health(collector=self.name)]
            )

    rt = AgentRuntime(config(0.1), [Flaky()], SqliteStore(MEMORY, background=False))
    seen = []

    async def main():
        task = asyncio.create_task(rt.run())
        for _ in range(60):
            await asyncio.sleep(0.02)
            seen.append(rt.state.collector_status.get("cycle"))
            if rt.state.cycles >= 3:
                break
        rt.stop()
        await task

    asyncio.run(main())
    assert (False, "exception_TypeError", 0.0) in seen and rt.state.cycles >= 3
    assert rt.state.collector_status["cycle"] == (True, "ok", 0.0)


def test_counter_resets_count_once_per_instance_and_scrape():
    resets = CounterResets()
    into: Counter[str] = Counter()
    a = make_labels({"instance": "a"})

    def cycle(v1, v2):
        return [
            Sample("engine_preemptions_total", a, v1),
            Sample("request_ttft_seconds_count", a, v2),
            Sample("engine_requests_running", a, 0.0),
        ]

    resets.observe(cycle(10, 5), into)
    resets.observe(cycle(12, 6), into)
    assert into == Counter()
    resets.observe(cycle(1, 1), into)  # both counters went down in one scrape: one reset
    resets.observe(cycle(2, 2), into)
    assert into == Counter({"a": 1})


def _resets_by_key(cycles):
    """The definition: a counter below its value in the previous cycle (last one wins in a cycle)."""
    into: Counter[str] = Counter()
    last: dict = {}
    for cycle in cycles:
        seen, insts = {}, set()
        for s in cycle:
            if s.name.endswith(("_total", "_count")):
                if s.value < last.get((s.name, s.labels), float("-inf")):
                    insts.add(s.label("instance"))
                seen[(s.name, s.labels)] = s.value
        into.update(insts)
        last = seen
    return into


def test_counter_resets_count_like_the_definition():
    import random

    rng = random.Random(5)
    labs = [make_labels({"instance": f"i{i % 3}", "k": str(i)}) for i in range(9)]
    cycles = []
    for _ in range(300):
        cycle = [Sample(f"c{i % 2}_total", lab, float(rng.randrange(4)), 1.0) for i, lab in enumerate(labs)]
        cycle.append(Sample("g", labs[0], 1.0, 1.0))
        event = rng.randrange(10)
        if event == 0:
            del cycle[rng.randrange(len(cycle))]  # a series missing from one cycle
        elif event == 1:
            cycle.append(cycle[0]._replace(value=0.0))  # a series twice in one cycle
        elif event == 2:
            rng.shuffle(cycle)
        cycles.append(cycle)
    resets, into = CounterResets(), Counter()
    for cycle in cycles:
        resets.observe(cycle, into)
    want = _resets_by_key(cycles)
    assert into == want and sum(want.values()) > 100


def test_subsystem_collectors_are_known_to_the_agent():
    from kvscope.agent.runtime import known_collectors

    known = known_collectors()
    assert {"engine", "host", "nvml", "otlp", "tap", "kv_events"} <= set(known)
