"""A histogram given a stream's values in one call counts what it counts given them one by one."""

import math
import random

from kvscope.agent.metricsets import GENAI_TPOT_BUCKETS, HistogramSet
from kvscope.core.signals import make_labels


def test_observing_a_stream_at_once_renders_what_observing_each_value_renders():
    rng = random.Random(7)
    one, many = HistogramSet("g", GENAI_TPOT_BUCKETS), HistogramSet("g", GENAI_TPOT_BUCKETS)
    streams = [[0.0] * 5, [], [0.01, 0.025, 2.5, 3.0], [math.nan, -1.0, 0.0, 0.2]]
    streams += [[rng.choice([0.0, rng.uniform(0, 3)]) for _ in range(rng.randint(1, 40))] for _ in range(200)]
    for i, gaps in enumerate(streams):
        lab = make_labels({"tenant": f"t{i % 3}"})
        for g in gaps:
            one.observe(lab, g)
        many.observe(lab, *gaps)
    expected, got = one.render(1.0), many.render(1.0)
    assert [s[:2] for s in got] == [s[:2] for s in expected]
    for a, b in zip(got, expected, strict=True):
        assert math.isclose(a.value, b.value, rel_tol=1e-9, abs_tol=1e-12), (a, b)
    counts = {s.labels: s.value for s in got if s.name == "g_count"}
    assert sum(counts.values()) == sum(1 for gaps in streams for g in gaps if g >= 0)


def test_observing_a_stream_respects_the_series_bound():
    h = HistogramSet("g", GENAI_TPOT_BUCKETS, max_series=1)
    h.observe(make_labels({"tenant": "a"}), 0.1, 0.0)
    h.observe(make_labels({"tenant": "b"}), 0.1, 0.2, 0.3)
    assert h.dropped == 3 and {s.label("tenant") for s in h.render()} == {"a"}
