"""Every `kvscope` command's --help says what it does and shows at least one runnable example."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys

import pytest

from kvscope.cli import build_parser

EXAMPLE = re.compile(r"^\s+(?:[A-Z_]+=\S+\s+)*kvscope \S+", re.MULTILINE)


def _commands() -> dict[str, argparse.ArgumentParser]:
    """'agent' -> parser, 'rules build' -> parser, ... (one level of nested actions)."""
    out: dict[str, argparse.ArgumentParser] = {}
    top = build_parser()
    for action in top._subparsers._group_actions:
        for name, parser in action.choices.items():
            out[name] = parser
            for sub in (a for a in parser._actions if isinstance(a, argparse._SubParsersAction)):
                out.update({f"{name} {n}": p for n, p in sub.choices.items()})
    return out


COMMANDS = _commands()


def test_all_commands_are_found():
    assert {
        "agent",
        "diagnose",
        "report",
        "ui",
        "serve",
        "rules check",
        "rules build",
        "deploy render-config",
        "deploy prometheusrule",
    } <= set(COMMANDS)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_help_has_a_description_and_an_example(name):
    text = COMMANDS[name].format_help()
    assert len((COMMANDS[name].description or "").split()) >= 8, f"{name}: --help says too little"
    assert EXAMPLE.search(text), f"{name}: --help shows no 'kvscope ...' example"


@pytest.mark.parametrize("name", ["diagnose", "ui"])
def test_agent_examples_use_the_agents_port_not_dcgms(name):
    text = COMMANDS[name].format_help()
    assert "127.0.0.1:9464" in text and ":9400" not in text


# How `kvscope --help` names what each dialect of the catalog (core/catalog.yaml) reads:
# a dialect added to the catalog without a word here fails.
DIALECT_WORDS = {
    "vllm": "vLLM",
    "sglang": "SGLang",
    "llamacpp": "llama.cpp",
    "tgi": "TGI",
    "sglang_router": "routers",
    "epp": "routers",
    "dynamo": "routers",
    "lmcache": "KV tiers",
    "dcgm": "GPUs",
}


def test_the_top_help_names_every_engine_the_catalog_reads():
    from kvscope.core.signals import load_catalog

    assert set(DIALECT_WORDS) == set(load_catalog().dialects)
    text = " ".join(build_parser().format_help().split())
    missing = {d: w for d, w in DIALECT_WORDS.items() if w not in text}
    assert not missing, f"kvscope --help does not name {missing}"


def test_a_named_command_imports_no_other_command():
    """`kvscope diagnose` does not pay for the agent's server and collectors at start."""
    code = "import sys; from kvscope.cli import build_parser; build_parser(['diagnose', '--help']); "
    code += "print(sorted(m for m in sys.modules if m.startswith('kvscope.commands.') and '._' not in m))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "['kvscope.commands.diagnose']"


EXAMPLE_LINE = re.compile(r"^\s+(?:[A-Z_]+=\S+\s+)*(kvscope \S.*)$", re.MULTILINE)


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_example_parses(name, capsys):
    """An example a user copies must be accepted by the parser (flags that exist, values of their
    type). Only the command line up to a pipe or a comment is parsed; nothing runs."""
    import shlex

    text = re.sub(r"\\\n\s*", " ", COMMANDS[name].format_help())  # continued lines joined
    for line in EXAMPLE_LINE.findall(text):
        argv = shlex.split(re.split(r" \| | #", line)[0])[1:]
        if "--help" in argv or "-h" in argv:
            continue
        try:
            build_parser().parse_args(argv)
        except SystemExit as exc:
            pytest.fail(f"{name}: the example `{line}` does not parse: {capsys.readouterr().err.strip()} ({exc})")
