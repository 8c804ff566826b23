"""One default file name per store (issue 39 item 9): the agent's history is kvscope.db in the
agent, the CLI help, the docs and the deploy files (the report's example said kvscope.sqlite);
`kvscope serve` keeps its enriched webhooks apart, in kvscope-diagnoses.db."""

from __future__ import annotations

from pathlib import Path

from kvscope.agent.config import AgentConfig
from kvscope.cli import build_parser

ROOT = Path(__file__).resolve().parents[2]
OLD_NAMES = ("kvscope.sqlite", "kvscope-diagnoses.sqlite")


def _texts():
    for folder in ("docs", "deploy", "kvscope", "core", "agent", "diagnoser", "ui", "report"):
        for path in (ROOT / folder).rglob("*"):
            if path.suffix in (".md", ".py", ".yaml", ".yml", ".service") and "node_modules" not in path.parts:
                yield path
    yield ROOT / "README.md"
    yield ROOT / "Dockerfile"


def test_the_defaults():
    assert AgentConfig().store_path == "kvscope.db"
    serve = build_parser().parse_args(["serve", "--prometheus", "http://127.0.0.1:9090"])
    assert serve.store == "kvscope-diagnoses.db"


def test_no_other_spelling_of_a_store_file_is_left():
    left = [
        f"{path.relative_to(ROOT)}: {old}"
        for path in _texts()
        for old in OLD_NAMES
        if old in path.read_text(errors="replace")
    ]
    assert left == []
