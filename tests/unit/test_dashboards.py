"""Generated dashboards: golden JSON, lint of the shipped queries, and the lint rules themselves."""

import json

import pytest

from kvscope.cli import main
from kvscope.commands.dashboards import DEFAULT_OUT
from kvscope.dashboards import queries as q
from kvscope.dashboards.board import Board, Panel, Row, render_json
from kvscope.dashboards.build import build_dashboards, check_golden
from kvscope.dashboards.lint import QueryLinter, lint_board, lint_boards, read_recorded_names
from kvscope.dashboards.registry import BOARDS, file_name

SEL = '{model=~"$model"}'


@pytest.fixture(scope="module")
def linter():
    return QueryLinter(recorded=read_recorded_names() | {"model:request_ttft_seconds:p99_5m"})


def test_golden_json_is_up_to_date():
    assert check_golden(DEFAULT_OUT) == [], "run: kvscope dashboards build --update-golden"


def test_shipped_queries_lint_clean():
    assert [str(i) for i in lint_boards(BOARDS)] == []


def test_build_writes_every_board_and_removes_only_its_own_strays(tmp_path):
    (tmp_path / "old.json").write_text('{"uid": "kvscope-retired", "title": "a board kvscope no longer builds"}')
    theirs = '{"uid": "node-exporter-full", "title": "another team\'s board in the same folder"}'
    (tmp_path / "node.json").write_text(theirs)
    (tmp_path / "notes.json").write_text("not json at all")
    paths = build_dashboards(tmp_path)
    assert sorted(p.name for p in paths) == sorted(file_name(b) for b in BOARDS)
    assert not (tmp_path / "old.json").exists()
    assert (tmp_path / "node.json").read_text() == theirs
    assert (tmp_path / "notes.json").read_text() == "not json at all"
    (tmp_path / "node.json").unlink()
    (tmp_path / "notes.json").unlink()
    assert check_golden(tmp_path) == []
    (tmp_path / "kv.json").write_text("{}")
    assert check_golden(tmp_path) == ["kv.json"]


def test_cli_build_detects_stale_output(tmp_path, capsys):
    assert main(["dashboards", "build", "--out", str(tmp_path)]) == 0
    assert main(["dashboards", "lint"]) == 0
    assert "lint clean" in capsys.readouterr().out


@pytest.mark.parametrize("board", BOARDS, ids=lambda b: b.uid)
def test_board_json_uses_variables_and_describes_signals(board):
    data = json.loads(render_json(board))
    names = [t["name"] for t in data["templating"]["list"]]
    assert names[:5] == ["datasource", "job", "namespace", "model", "instance"]
    panels = [p for p in data["panels"] if p["type"] != "row"]
    panels += [c for p in data["panels"] if p["type"] == "row" for c in p.get("panels", [])]
    assert len(panels) == len(board.panels())
    for p in panels:
        assert p["datasource"] == "$datasource", p["title"]
        assert "Reads: " in p["description"], p["title"]
        for t in p["targets"]:
            for series in ("kvscope_", "instance:", "tenant:", "ALERTS"):
                if series in t["expr"]:
                    break
            else:
                pytest.fail(f"{p['title']}: {t['expr']} reads no kvscope series")
    assert "kvscope" in data["tags"]


def test_latency_panels_are_in_seconds_and_ratios_in_percentunit():
    data = json.loads(render_json(BOARDS[0]))
    units = {
        p["title"]: p.get("fieldConfig", {}).get("defaults", {}).get("unit") or p.get("format")
        for p in data["panels"]
        if p["type"] != "row"
    }
    assert units["Time to first token"] == "s"
    assert units["KV cache usage"] == "percentunit"


@pytest.mark.parametrize(
    "expr, rule",
    [
        (f"histogram_quantile(0.99, rate(kvscope_request_ttft_seconds_bucket{SEL}[5m]))", "quantile-without-sum-by-le"),
        (
            f"histogram_quantile(0.99, sum by (instance) (rate(kvscope_request_ttft_seconds_bucket{SEL}[5m])))",
            "quantile-without-sum-by-le",
        ),
        (f"rate(kvscope_engine_requests_running{SEL}[5m])", "rate-on-non-counter"),
        (f"resets(kvscope_engine_kv_capacity_tokens{SEL}[5m])", "rate-on-non-counter"),
        (f"sum(kvscope_engine_preemptions_total{SEL})", "lifetime-maths"),
        (
            f"sum(kvscope_request_queue_seconds_sum{SEL}) / (sum(rate(kvscope_request_queue_seconds_count{SEL}[5m])) > 0)",
            "lifetime-maths",
        ),
        (
            f"sum(rate(kvscope_engine_prefix_cache_hits_tokens_total{SEL}[5m])) / "
            f"sum(rate(kvscope_engine_prefix_cache_queries_tokens_total{SEL}[5m]))",
            "unguarded-division",
        ),
        (f"sum(rate(kvscope_engine_num_preemptions_total{SEL}[5m]))", "unknown-metric"),
        ('sum(rate(vllm:num_preemptions_total{job="x"}[5m]))', "unknown-metric"),
        ('sum(rate(kvscope:engine_nonexistent_total{job="x"}[5m]))', "unknown-metric"),
    ],
)
def test_lint_catches_each_defect(linter, expr, rule):
    assert rule in [r for r, _ in linter.lint_expr(expr)]


@pytest.mark.parametrize(
    "expr",
    [
        q.quantile(0.99, "request_ttft_seconds", ("instance",)),
        q.mean("request_queue_seconds"),
        *(c.expr for c in q.CHANGES),
        q.prefix_hit_ratio(("tenant",)).expr,
        'sum(model:request_ttft_seconds:p99_5m{job=~"$job"})',
        f"{q.sum_rate('engine_generation_tokens_total')} / 1e6",
        'sum(rate(kvscope_engine_prompt_tokens_total{job=~"a/b"}[5m]))',  # '/' inside a string is not division
        'max(instance:request_ttft_seconds:p99_5m{model=~"m"})',  # a recorded derived series
    ],
)
def test_lint_accepts_correct_patterns(linter, expr):
    assert linter.lint_expr(expr) == []


def test_board_level_lint_finds_units_variables_roles_and_descriptions(linter):
    bad = Board(
        "kvscope-bad",
        "bad",
        "bad",
        (
            Row(
                "r",
                (
                    Panel("TTFT", "", q.TTFT, "count"),
                    Panel(
                        "by pod",
                        "role by name",
                        (q.Query('sum(kvscope_engine_requests_running{pod=~".*prefill.*", x="$nope"})', "", ()),),
                        "count",
                    ),
                ),
            ),
        ),
        slo_vars=True,
    )
    rules = {i.rule for i in lint_board(bad, linter)}
    assert {"wrong-unit", "no-description", "pod-name-role", "undefined-variable", "unused-variable"} <= rules


def test_cli_build_without_out_writes_a_folder_and_says_where(tmp_path, capsys, monkeypatch):
    """Issue 39 item 9: `build` with no --out used to only check the repository's copies and say
    'up to date'. It writes ./kvscope-dashboards/ and names it; --check is the staleness check."""
    monkeypatch.chdir(tmp_path)
    assert main(["dashboards", "build"]) == 0
    out = capsys.readouterr().out
    assert sorted(p.name for p in (tmp_path / "kvscope-dashboards").glob("*.json")) == sorted(
        file_name(b) for b in BOARDS
    )
    assert "wrote 7 dashboards to kvscope-dashboards/" in out
    assert str(tmp_path / "kvscope-dashboards") in out and "Grafana" in out
    assert check_golden(tmp_path / "kvscope-dashboards") == []
    assert main(["dashboards", "build", "--check"]) == 0
    assert "up to date" in capsys.readouterr().out
    assert main(["dashboards", "build", "--check", "--out", str(tmp_path / "x")]) == 3
    assert not (tmp_path / "x").exists()
