"""The change verdicts on library recordings whose engines did not change, against their provenance.

Each recording's YAML says how it was made: one engine configuration held for the whole run (the
flags per replica), the load phases the driver offered, and what the scenario changed. None of
the recordings below changed an engine: a verdict of `regression` or `improvement` on any of them
(a `curve` shift between the window's halves, or a replica change judged per instance) says the
engine moved where only the shared box's load or the offered workload did, and is wrong
(docs/curve.md "Did it help"). The truth was written from the YAMLs before the code was changed.
"""

from __future__ import annotations

from functools import cache
from pathlib import Path

import pytest
import yaml

from kvscope.diagnoser.curve.report import ENGINE_VERDICTS, pool_curves
from kvscope.diagnoser.curve.window import read_window
from kvscope.diagnoser.sources.recording import RecordingSource

HERE = Path(__file__).resolve().parent

STEADY = {
    # one replica, one steady phase (4 req/s, --no-enable-prefix-caching from the start)
    "prefix-caching-disabled": "one steady phase on one engine",
    # one replica, one steady phase (3 req/s, the same speculative config throughout)
    "spec-decode-poor-acceptance": "one steady phase on one engine",
    # two replicas, one phase of Poisson arrivals at 3 req/s
    "metrics-only-round-robin-2-poisson": "one Poisson phase on two engines",
    # two replicas, one phase of Poisson arrivals at 6 req/s, sticky by tenant
    "metrics-only-healthy-busy-sticky": "one Poisson phase on two engines",
    # one engine; the offered workload moves (light, a burst of long generations, light again)
    "kv-pressure-cascade": "the workload moves, the engine does not",
    # one engine; the same 3 req/s of three tenants throughout, a fourth sends long prompts mid-run
    "noisy-tenant-long-prompts": "the workload moves, the engine does not",
    # one llama-server; open-loop overload, then the queue drains (it exports no finished requests)
    "llamacpp-saturated": "the queue grows and drains, the engine does not change",
}


@cache
def _curves(name: str):
    source = RecordingSource(HERE / f"{name}.om.gz")
    return pool_curves(read_window(source, None, None, source.natural_step()))


def _flags_constant(name: str) -> bool:
    meta = yaml.safe_load((HERE / f"{name}.yaml").read_text())
    return all(p.get("action") is None for p in meta.get("phases", []))


@pytest.mark.parametrize("name", sorted(STEADY))
def test_no_engine_verdict_where_no_engine_changed(name):
    """No change event (no label moved) and no `curve` shift called a regression or an improvement."""
    assert _flags_constant(name), "the provenance this truth rests on"
    judged = [(j.change.kind, j.verdict, j.worse, j.better) for pc in _curves(name) for j in pc.changes]
    assert not [j for j in judged if j[1] in ENGINE_VERDICTS], (STEADY[name], judged)


def test_a_replica_joining_is_not_a_per_instance_change():
    """fleet-scale-out-hash-mod: a 9th replica joins 8 with the same flags (synthetic, testbed/fleetgen):
    more replicas leave the per-instance curve where it is (§8.5, data parallelism)."""
    judged = [(j.change.kind, j.verdict) for pc in _curves("fleet-scale-out-hash-mod") for j in pc.changes]
    assert [k for k, _ in judged] == ["replicas"]
    assert judged[0][1] in ("no_change", "not_comparable"), judged


REPLICAS = {
    # two replicas; replica-1 drained, restarted with the same flags, and rejoins
    "router-drain-restart-rejoin": "a replica drained and rejoins with the same flags",
    # two replicas; one restarts with the same flags and comes back with a cold prefix cache
    "replica-restart-cold-cache": "a replica restarts cold with the same flags",
}


@pytest.mark.parametrize("name", sorted(REPLICAS))
def test_a_replica_leaving_and_rejoining_is_no_engine_verdict(name):
    """The replica count changes, no engine's flags do (every replica runs the YAML's one set): a
    replica change judged per instance is read on the engines that stayed, whose curve a replica
    coming or going leaves where it is (§8.5), so it is never a regression or an improvement."""
    meta = yaml.safe_load((HERE / f"{name}.yaml").read_text())
    assert len({str(r.get("flags")) for r in meta.get("replicas", [{}])}) <= 1, "one set of flags"
    judged = [(j.change.kind, j.verdict, j.worse, j.better) for pc in _curves(name) for j in pc.changes]
    assert any(k == "replicas" for k, *_ in judged), judged
    assert not [j for j in judged if j[1] in ENGINE_VERDICTS], (REPLICAS[name], judged)
