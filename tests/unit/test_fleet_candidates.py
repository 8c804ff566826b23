"""Reading the `kvscope:candidate` records (diagnoser/pushdown/candidates.py): which groups can
fire and where, and which rules the records do not cover. The TSDB here answers the one range
query from a table of sample times (the real-TSDB proof is tests/integration/test_pushdown.py);
this checks the client's own logic: runs against the rule's `for`, the phase margins, versions
and uncovered spans."""

from __future__ import annotations

from typing import Any

import numpy as np

from kvscope.diagnoser.pushdown.candidates import INTERVAL_S, RECORD_LAG_S, describe, read_candidates, records_end

START = 1_800_000_000.0
GRID = START + 15.0 * np.arange(241)  # one hour at 15 s
END = float(GRID[-1])


class TableTSDB:
    """Answers the candidates' range query from {labels: times held}, at the query's steps."""

    def __init__(self, series: list[tuple[dict[str, str], list[float]]]) -> None:
        self.series = series
        self.asked: list[str] = []

    def range_parts(self, expr: str, start: float, end: float, step: float, **_: Any) -> list[dict[str, Any]]:
        self.asked.append(expr)
        steps = np.arange(start, end + step / 2, step)
        out = []
        for labels, times in self.series:
            at = [t for t in steps if any(abs(t - x) < 1e-6 for x in times)]
            if at:
                out.append({"metric": dict(labels), "values": [[t, "1"] for t in at]})
        return out


def up(rule: str, version: str = "v1", times: list[float] | None = None) -> tuple[dict[str, str], list[float]]:
    every = list(np.arange(START, END + 1, INTERVAL_S)) if times is None else times
    return {"__name__": "kvscope:candidate", "rule_id": rule, "version": version}, every


def cand(rule: str, instance: str, first: float, n: int) -> tuple[dict[str, str], list[float]]:
    return {"__name__": "kvscope:candidate", "rule_id": rule, "instance": instance}, [
        first + i * INTERVAL_S for i in range(n)
    ]


def test_a_group_is_a_candidate_only_with_a_run_as_long_as_the_rules_for() -> None:
    t = START + 600
    tsdb = TableTSDB([up("r"), cand("r", "long", t, 21), cand("r", "short", t, 19), cand("r", "blips", t, 1)])
    tsdb.series.append(cand("r", "blips", t + 120, 1))
    hits = read_candidates(tsdb, {"r": "v1"}, {"r": 300.0}, GRID)["r"]  # for: 5m = 20 intervals
    assert len(tsdb.asked) == 1 and "kvscope:candidate" in tsdb.asked[0]
    assert not hits.everywhere and [g.labels for g in hits.groups] == [{"instance": "long"}]
    g = hits.groups[0]
    # the run's evaluations, widened by two intervals before (the phase) and one after
    assert GRID[g.first] == t - 2 * INTERVAL_S
    assert GRID[g.last] == t + 20 * INTERVAL_S + INTERVAL_S


def test_a_rule_without_for_keeps_one_held_evaluation() -> None:
    hits = read_candidates(TableTSDB([up("r"), cand("r", "e0", START + 60, 1)]), {"r": "v1"}, {"r": 0.0}, GRID)
    assert [g.labels for g in hits["r"].groups] == [{"instance": "e0"}]


def test_records_missing_for_part_of_the_window_fall_back_and_say_when() -> None:
    later = list(np.arange(START + 1800, END + 1, INTERVAL_S))
    tsdb = TableTSDB([up("a", times=later), up("b", version="old"), up("c"), cand("a", "e0", START + 1900, 30)])
    hits = read_candidates(tsdb, {"a": "v1", "b": "v1", "c": "v1"}, {}, GRID)
    assert hits["a"].everywhere and hits["a"].uncovered == [(START, START + 1800 - INTERVAL_S)]
    assert hits["b"].everywhere and hits["b"].uncovered == [(START, END)]  # another version of the rule
    assert not hits["c"].everywhere and not hits["c"].groups and not hits["c"].uncovered
    text = "\n".join(describe(hits))
    assert "  a: 2027-01-15T08:00:00Z - 2027-01-15T08:29:45Z" in text and "  b: " in text and "  c:" not in text
    assert "promtool tsdb create-blocks-from rules" in text and "-replay.timeFrom=" in text


def test_the_candidate_file_is_up_to_date_and_versions_each_rule() -> None:
    """rules/prometheus/kvscope-candidates.yml is what `kvscope rules build` writes from the rules
    (build_all leaves it to the command: promql sits below the compiler it needs), and every
    record's version is the one the fleet path computes, so a changed rule falls back."""
    import re
    from pathlib import Path

    import yaml

    from kvscope.core.signals import load_catalog
    from kvscope.diagnoser.promql.rulefiles import candidate_file
    from kvscope.diagnoser.pushdown.candidates import candidate_exprs
    from kvscope.diagnoser.rulebook.rule import read_rules

    exprs = candidate_exprs(read_rules(), load_catalog())
    name, text = candidate_file(exprs)
    path = Path(__file__).resolve().parents[2] / "rules" / "prometheus" / name
    assert path.read_text() == text, f"{name} is stale: run `kvscope rules build`"
    groups = yaml.safe_load(text)["groups"]
    assert all(len(g["rules"]) == 1 and g["interval"] == "15s" for g in groups)  # one group per rule
    rows = [r for g in groups for r in g["rules"]]
    versions = {r["labels"]["rule_id"]: re.search(r'"version", "(\w+)"', r["expr"]).group(1) for r in rows}
    assert versions == {rid: v for rid, (e, v) in exprs.items() if e is not None}
    assert all(r["record"] == "kvscope:candidate" for r in rows)
    assert len(versions) >= 45


def until(end: float) -> list[float]:
    return list(np.arange(START, end + 1, INTERVAL_S))


def test_the_window_ends_at_the_records_newest_evaluation_when_they_lag_the_present() -> None:
    # a live group writes its record after its interval and evaluation; the slowest rule decides
    tsdb = TableTSDB([up("r", times=until(END - 45)), up("s", times=until(END - 30))])
    assert records_end(tsdb, ["r", "s"], START, END) == END - 45
    assert len(tsdb.asked) == 1 and 'rule_id=~"r|s"' in tsdb.asked[0]
    assert records_end(TableTSDB([up("r"), up("s")]), ["r", "s"], START, END) == END


def test_records_that_stopped_earlier_or_never_ran_leave_the_window_as_asked() -> None:
    stopped = TableTSDB([up("r", times=until(END - RECORD_LAG_S - 60))])
    assert records_end(stopped, ["r"], START, END) == END  # missing, not late: judged in full
    assert records_end(TableTSDB([]), ["r"], START, END) == END
    assert records_end(TableTSDB([up("r", times=until(END - 45))]), [], START, END) == END


def test_a_rule_missing_records_elsewhere_is_judged_in_full_and_does_not_move_the_end() -> None:
    holed = [t for t in until(END - 90) if not START + 600 <= t <= START + 900]
    assert records_end(TableTSDB([up("r", times=holed)]), ["r"], START, END) == END
    both = TableTSDB([up("r", times=holed), up("s", times=until(END - 30))])
    assert records_end(both, ["r", "s"], START, END) == END - 30
    late_start = TableTSDB([up("r", times=until(END - 30)[4:])])
    assert records_end(late_start, ["r"], START, END) == END
