"""Python engine and Prometheus agree on firing, for every diagnosis rule with a PromQL form.

For each case of each `rules/diagnosis/<id>.test.yaml` the same input series go to both sides:

* Python: the engine (diagnoser/evaluate/evaluator.py) over the window [0, eval_time]: the groups whose
  finding is still `active` at the end (with severity), and every group that fired at all.
* Prometheus: the case's canonical series are fed to real `promtool test rules` as the agent
  would export them (`kvscope_<signal>`), through the generated canonical recording rules and
  the rule's generated alert (compiled with the case's parameter overrides): the groups with a
  firing `ALERTS` series at eval_time (with severity), and every group whose alert fired at
  any evaluation up to it. One promtool run holds every case of a rule with the same parameters,
  a test group each (its own input series and evaluation).

Both pairs of sets must be equal, on promtool 2.42 and 3.x (the server matrix). Prometheus 2.x
includes a sample exactly 5m old in its lookback and the engine does not (it follows Prometheus
3); against promtool 2.x the Python side is run with the 2.x window, and a case whose outcome
hangs on that edge (a gap of exactly the lookback in grid-aligned data, which real scrape jitter
never produces) is exempt from the must-fire check. Cases cover each rule's must-fire and must-not-fire boundary, so this
also checks that every generated alert fires and stays quiet where the rule says.
"""

from __future__ import annotations

import functools
import re
import tempfile
from pathlib import Path

import pytest

from kvscope.core.signals import load_catalog
from kvscope.diagnoser.evaluate.evaluator import evaluate_rule
from kvscope.diagnoser.evaluate.frame import DEFAULT_LOOKBACK_S, frame_from_samples
from kvscope.diagnoser.findings import SEVERITY_RANK
from kvscope.diagnoser.promql.alerts import alert_name, compile_rule
from kvscope.diagnoser.promql.rulefiles import canonical_rules
from kvscope.diagnoser.rulebook.levers import load_levers
from kvscope.diagnoser.rulebook.rule import read_rule, rule_paths
from testbed import servers
from testbed.prometheus import promtool_got, promtool_input_series, promtool_test_rules
from testbed.rulecases import case_samples, read_test_file

pytestmark = [
    pytest.mark.prometheus,
    pytest.mark.needs("promtool"),
    pytest.mark.servers,
]


def _cases():
    out = []
    for path in rule_paths():
        rule = read_rule(path)
        test_path = path.with_name(path.stem + ".test.yaml")
        if not isinstance(compile_rule(rule), list) or not test_path.exists():
            continue
        tf = read_test_file(test_path)
        out += [pytest.param(path, tf, case, id=f"{rule.id}::{case.name}") for case in tf.cases]
    return out


def _fact_series(facts: dict[str, dict[str, str]], steps: int) -> list[dict[str, str]]:
    out = []
    for instance, known in sorted(facts.items()):
        body = ",".join(f'{k}="{v}"' for k, v in sorted({"instance": instance, **known}.items()))
        out.append({"series": f"kvscope_engine_info{{{body}}}", "values": f"1x{steps}"})
    return out


@functools.cache
def _promtool_major() -> int:
    """2 or 3: the promtool on PATH (the server matrix runs this file on both, testbed/servers.py)."""
    version = servers.prometheus_version("promtool")
    assert version is not None, "promtool --version says no version"
    return version[0]


PROMETHEUS2_LOOKBACK_S = DEFAULT_LOOKBACK_S + 1e-3
"""Prometheus 2.x selects samples in [t - 5m, t]; the engine, like Prometheus 3, in (t - 5m, t].
On grid-aligned test data a sample exactly 5m old is the only difference, and a hair more
lookback on the Python side reproduces the 2.x window."""


def _python_firing(rule, case, interval, lookback_s: float = DEFAULT_LOOKBACK_S) -> tuple[set, set]:
    """(groups still firing at eval_time with their severity, groups that fired at any time)."""
    frame = frame_from_samples(case_samples(case, interval), 0.0, case.eval_time, interval, lookback_s)
    frame.facts = case.facts
    result = evaluate_rule(rule, frame, load_levers())
    if not isinstance(result, list):
        return set(), set()
    where = [tuple(sorted((k, f.where.get(k, "")) for k in rule.by)) for f in result]
    return {(w, f.severity) for w, f in zip(where, result, strict=True) if f.active}, set(where)


CASE_LABEL = "kvscope_parity_case"
"""Set on both promtool expressions of a case (label_replace) so that one run can hold many cases."""


def _params_key(params: dict) -> str:
    return repr(sorted(params.items()))


@functools.cache
def _promtool_firing(rule_path: Path, params_key: str) -> dict[tuple[str, int], tuple[set, set, str]]:
    """The two sets of `_python_firing` from promtool, for every case of the rule's test file whose
    parameters are `params_key`, from one `promtool test rules` run: the rule compiled with them, a
    test group per case (each evaluates on its own input series), each case's expressions labelled
    with its index. Keyed by (case name, line): ALERTS firing at eval_time with severity, ever
    firing up to it, and promtool's output."""
    test_file = read_test_file(rule_path.with_name(rule_path.stem + ".test.yaml"))
    cases = [c for c in test_file.cases if _params_key(c.params) == params_key]
    rule = read_rule(rule_path).with_params(cases[0].params)
    interval = test_file.interval
    alerts = compile_rule(rule)
    assert isinstance(alerts, list), alerts
    used = set(re.findall(r"kvscope:[a-zA-Z0-9_]+", "\n".join(a["expr"] for a in alerts)))
    recording = [r for r in canonical_rules(load_catalog()) if r["record"] in used]
    firing = f'ALERTS{{alertstate="firing",alertname="{alert_name(rule.id)}"}}'
    tests = []
    for i, case in enumerate(cases):
        at = f"{int(case.eval_time)}s"
        exprs = (
            f"group by ({', '.join(('alertname', 'severity', *rule.by))}) ({firing})",
            f"group by ({', '.join(('alertname', *rule.by))}) (max_over_time({firing}[{at}]))",
        )
        tests.append(
            {
                "interval": f"{int(interval)}s",
                "input_series": promtool_input_series(case_samples(case, interval), interval)
                + _fact_series(case.facts, int(case.eval_time / interval) + 1),
                "promql_expr_test": [
                    {"expr": f'label_replace({e}, "{CASE_LABEL}", "{i}", "", "")', "eval_time": at, "exp_samples": []}
                    for e in exprs
                ],
            }
        )
    with tempfile.TemporaryDirectory(prefix="kvs-parity-") as work:
        # one group, recording rules first: promtool evaluates separate groups in an unspecified
        # order at each step, so an alert in its own group saw the recording rules' values of this
        # step or of the last one at random, and a one-step spike fired in some runs and not others
        groups = [{"name": "canonical", "rules": recording + alerts}]
        returncode, out = promtool_test_rules(Path(work), tests, groups, f"{int(interval)}s")
    assert returncode == 0 or "got:" in out, f"promtool failed without a result:\n{out}"
    severity: list[dict[tuple, str]] = [{} for _ in cases]
    ever: list[set[tuple]] = [set() for _ in cases]
    for block in re.split(r"\n\s*expr: ", out)[1:] if returncode else []:  # one block per failed expression
        for pairs in promtool_got(block):
            i, where = int(pairs[CASE_LABEL]), tuple(sorted((k, pairs.get(k, "")) for k in rule.by))
            if "max_over_time" in block.split("\n", 1)[0]:
                ever[i].add(where)
            # a rule with critical_when fires its warning and its critical alert together
            elif SEVERITY_RANK[pairs["severity"]] >= SEVERITY_RANK.get(severity[i].get(where, "info"), 0):
                severity[i][where] = pairs["severity"]
    return {(c.name, c.line): (set(severity[i].items()), ever[i], out) for i, c in enumerate(cases)}


@pytest.mark.parametrize(("rule_path", "test_file", "case"), _cases())
def test_python_and_prometheus_agree(rule_path, test_file, case):
    rule = read_rule(rule_path).with_params(case.params)
    lookback = PROMETHEUS2_LOOKBACK_S if _promtool_major() == 2 else DEFAULT_LOOKBACK_S
    py_end, py_ever = _python_firing(rule, case, test_file.interval, lookback)
    on_the_edge = (py_end, py_ever) != _python_firing(rule, case, test_file.interval)
    prom_end, prom_ever, log = _promtool_firing(rule_path, _params_key(case.params))[(case.name, case.line)]
    where = f"{test_file.path}:{case.line}"
    if case.expect and not on_the_edge:
        assert py_ever, f"{where}: must-fire case does not fire in Python"
    assert prom_end == py_end, (
        f"{where}: at eval_time Python fires {sorted(py_end)}, Prometheus {sorted(prom_end)}\n{log}"
    )
    assert prom_ever == py_ever, (
        f"{where}: over the window Python fired for {sorted(py_ever)}, Prometheus for {sorted(prom_ever)}\n{log}"
    )


def test_parity_covers_a_firing_and_a_quiet_case_for_every_alert():
    cases = _cases()
    rules = {p.values[0].stem for p in cases}
    assert rules, "no diagnosis rule has a PromQL form"
    for rule_id in rules:
        expects = [bool(p.values[2].expect) for p in cases if p.values[0].stem == rule_id]
        assert True in expects and False in expects, f"{rule_id}: needs a must-fire and a must-not-fire case"
