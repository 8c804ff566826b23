"""Issue 41 N4: `settle`, `lift` and `before_symptom` (diagnoser/evaluate/confidence.py) look
findings up by place through an index, not by comparing every pair, so a log from 5000 pods is
not quadratic in its findings; and they decide exactly what the pairwise comparison decided
(`same_place`: the labels two places share agree, a fleet-wide place matching any)."""

from __future__ import annotations

import random
from dataclasses import replace

from kvscope.diagnoser.evaluate.confidence import before_symptom, lift, settle
from kvscope.diagnoser.findings import SEVERITY_RANK, CascadeInfo, Finding, LeverAdvice, same_mechanism, same_place

T0 = 1_700_000_000.0
DIRECT, INFERRED, OTHER = "prefix_hits_diluted_across_replicas", "routing_ignores_cache_locality", "kv_cache_pressure"


def _finding(rule_id: str, where: dict[str, str], score: float, severity: str = "warning", **kw) -> Finding:
    return Finding(
        rule_id=rule_id, levers_md="P2", title=rule_id, severity=severity, where=where, since=T0, until=T0 + 60,
        active=True, window=(T0 - 60, T0 + 60), step_s=15.0, score=score, summary=rule_id,
        levers=(LeverAdvice("router.routing_policy", 1, "set"),), **kw,
    )  # fmt: skip


def _places(rng: random.Random) -> dict[str, str]:
    """A place of one of several label sets, values from small pools so that places collide."""
    names = rng.choice([(), ("instance",), ("model",), ("instance", "model"), ("instance", "dp_rank"), ("tenant",)])
    return {k: f"{k}-{rng.randrange(4)}" for k in names}


def _random_findings(seed: int, n: int) -> list[Finding]:
    rng = random.Random(seed)
    cascade = CascadeInfo(stage=2, stage_name="k2", stages_total=3, onsets={}, lead_time_s=None)
    out = []
    for i in range(n):
        rule = rng.choice([DIRECT, INFERRED, OTHER])
        out.append(
            _finding(
                rule,
                _places(rng),
                score=float(rng.randrange(100, 400)),
                severity=rng.choice(list(SEVERITY_RANK)),
                defers_to=(DIRECT,) if rule == INFERRED else (),
                cascade=cascade if rule == OTHER and i % 2 else None,
            )
        )
    return out


def _lift_pairwise(findings: list[Finding]) -> list[Finding]:
    out = []
    for g in findings:
        folded = [f.severity for f in findings if g.rule_id in f.defers_to and same_place(g.where, f.where)]
        worst = max([g.severity, *folded], key=SEVERITY_RANK.__getitem__)
        up = 100 * (SEVERITY_RANK[worst] - SEVERITY_RANK[g.severity])
        out.append(replace(g, severity=worst, score=round(g.score + up, 3)) if up else g)
    return out


def _before_symptom_pairwise(findings: list[Finding]) -> list[Finding]:
    out = []
    for f in findings:
        before = f.cascade is not None and f.cascade.lead_time_s is None
        peers = [
            g
            for g in findings
            if before and g.cascade is None and same_place(g.where, f.where) and same_mechanism(f, g)
        ]
        if peers:
            f = replace(f, score=min(f.score, round(min(g.score for g in peers) - 10.0, 3)))
        out.append(f)
    return out


def _settle_pairwise(findings: list[Finding], evaluated: set[str], present: dict[str, bool]) -> list[Finding]:
    kept = []
    for f in _lift_pairwise(findings):
        direct = [rid for rid in f.defers_to if rid in evaluated]
        fired = [g for g in _lift_pairwise(findings) if g.rule_id in direct and same_place(g.where, f.where)]
        if fired:
            kept.append(replace(f, score=min(f.score, round(min(g.score for g in fired) - 10.0, 3))))
        elif not (direct and present.get(f.rule_id, False)):
            kept.append(f)
    return kept


def test_the_indexed_lookups_decide_exactly_what_the_pairwise_comparison_did():
    for seed in range(30):
        findings = _random_findings(seed, 60)
        assert lift(findings) == _lift_pairwise(findings), seed
        assert before_symptom(findings) == _before_symptom_pairwise(findings), seed
        for present in (True, False):
            kept, _ = settle(findings, [], [DIRECT, INFERRED, OTHER], {INFERRED: present})
            assert kept == _settle_pairwise(findings, {DIRECT, INFERRED, OTHER}, {INFERRED: present}), seed


class _Counted(dict):
    """A place that counts how often its labels are read (iterated or looked up)."""

    reads = 0

    def __iter__(self):  # noqa: ANN204
        _Counted.reads += 1
        return super().__iter__()

    def __getitem__(self, key):  # noqa: ANN001, ANN204
        _Counted.reads += 1
        return super().__getitem__(key)

    def keys(self):  # noqa: ANN201
        _Counted.reads += 1
        return super().keys()


def test_work_grows_linearly_with_the_findings_of_many_pods():
    """3000 pods, each with a direct finding, a deferring one and a cascade: the places are read a
    few times per finding, not once per pair (the pairwise scan read them 9000 x 9000 times)."""
    cascade = CascadeInfo(stage=2, stage_name="k2", stages_total=3, onsets={}, lead_time_s=None)
    findings = []
    for pod in range(3000):
        where = _Counted(instance=f"vllm-{pod}")
        findings += [
            _finding(DIRECT, where, 300.0),
            _finding(INFERRED, where, 200.0, severity="critical", defers_to=(DIRECT,)),
            _finding(OTHER, where, 250.0, cascade=cascade),
        ]
    _Counted.reads = 0
    kept, _ = settle(findings, [], [DIRECT, INFERRED, OTHER], {INFERRED: True})
    ordered = before_symptom(kept)
    assert _Counted.reads < 30 * len(findings), _Counted.reads
    lifted = {f.where["instance"]: f for f in ordered if f.rule_id == DIRECT}
    assert len(lifted) == 3000 and all(f.severity == "critical" and f.score == 400.0 for f in lifted.values())
