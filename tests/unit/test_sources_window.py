"""`read_window` and the `Source` protocol: every source satisfies it, the step defaults to the
source's own, and the in-memory and SQLite-store sources give the same frame for the same samples."""

from __future__ import annotations

import numpy as np
import pytest

from kvscope.core.signals import Sample, make_labels
from kvscope.diagnoser.sources.agent import AgentSource
from kvscope.diagnoser.sources.prometheus import PrometheusSource
from kvscope.diagnoser.sources.recording import RecordingSource
from kvscope.diagnoser.sources.samples import SamplesSource, StoreSource
from kvscope.diagnoser.sources.window import DEFAULT_STEP_S, Source, Span, read_window

T0 = 1_800_000_000.0
LABELS = make_labels({"instance": "a:8000", "model": "m"})


def _samples(step: float = 10.0, n: int = 30) -> list[Sample]:
    return [Sample("engine_requests_running", LABELS, float(i % 7), T0 + step * i) for i in range(n)]


def test_every_source_is_a_source(tmp_path):
    for source in (
        RecordingSource(tmp_path / "x.om"),
        AgentSource("http://127.0.0.1:1"),
        PrometheusSource("http://127.0.0.1:1"),
        SamplesSource([]),
        StoreSource(tmp_path / "x.sqlite"),
    ):
        assert isinstance(source, Source)


def test_the_step_is_the_sources_own_unless_named():
    frame = read_window(SamplesSource(_samples(step=10.0)), {"engine_requests_running"})
    assert frame.step == 10.0 and frame.window == (T0, T0 + 290.0)
    assert read_window(SamplesSource(_samples()), {"engine_requests_running"}, Span(), 20.0).step == 20.0
    assert PrometheusSource("http://127.0.0.1:1").natural_step() is None  # callers then get DEFAULT_STEP_S
    assert DEFAULT_STEP_S == 15.0


def test_a_signal_the_source_lacks_is_absent():
    frame = read_window(SamplesSource(_samples()), {"engine_requests_running", "engine_requests_waiting"})
    assert frame.block("engine_requests_waiting") is None
    assert frame.block("engine_requests_running") is not None


def test_without_carry_a_point_holds_only_the_sample_of_its_step():
    samples = [s for s in _samples() if not 10 <= (s.timestamp - T0) / 10 < 15]  # a 50 s hole
    span = Span(T0, T0 + 290.0)
    carried = read_window(SamplesSource(samples), {"engine_requests_running"}, span, 10.0)
    exact = read_window(SamplesSource(samples, carry=False), {"engine_requests_running"}, span, 10.0)
    assert not np.isnan(carried.blocks["engine_requests_running"].values[0, 10:15]).any()  # 5-minute lookback
    assert np.isnan(exact.blocks["engine_requests_running"].values[0, 10:15]).all()


def test_the_store_gives_the_frame_of_its_samples(tmp_path):
    from kvscope.agent.store.sqlite import SqliteStore

    path = tmp_path / "kvscope.sqlite"
    store = SqliteStore(path, retention_s=10 * 365 * 86400, background=False)
    store.write(_samples())
    store.flush()
    store.close()
    span = Span(T0, T0 + 290.0)
    a = read_window(StoreSource(path), {"engine_requests_running"}, span, 10.0)
    b = read_window(SamplesSource(_samples()), {"engine_requests_running"}, span, 10.0)
    assert a.blocks["engine_requests_running"].labels == b.blocks["engine_requests_running"].labels
    np.testing.assert_array_equal(
        a.blocks["engine_requests_running"].values, b.blocks["engine_requests_running"].values
    )


def test_a_missing_store_is_a_source_error_and_is_not_created(tmp_path):
    from kvscope.diagnoser.sources import SourceError

    with pytest.raises(SourceError, match="does not exist"):
        read_window(StoreSource(tmp_path / "typo.sqlite"), {"engine_requests_running"}, Span(T0, T0 + 60), 15.0)
    assert not (tmp_path / "typo.sqlite").exists()
