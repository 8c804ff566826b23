"""Dockerfile and systemd unit, checked with the real tools (hadolint, systemd-analyze) and
against the real CLI: every flag a deployment file passes must be one `kvscope` accepts.

Docker itself cannot run on the test machine (no engine), so the image is checked statically.
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from kvscope.agent.config import KEYS, build_config
from kvscope.cli import build_parser
from testbed.prometheus import require_binaries

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
UNIT = ROOT / "deploy" / "systemd" / "kvscope-agent.service"
UNITS = [UNIT, ROOT / "deploy" / "systemd" / "kvscope-serve.service"]
ENV_FILE = ROOT / "deploy" / "systemd" / "kvscope-agent.env"
NODE_CONFIG = ROOT / "deploy" / "systemd" / "kvscope.yaml"
KVSCOPE_BIN = Path(sys.executable).with_name("kvscope")


def _tool(name: str) -> str:
    """Path of a tool from the venv (pip-installed binaries) or the system."""
    local = Path(sys.executable).with_name(name)
    return str(local) if local.exists() else require_binaries(name)[0]


def _accepts(argv: list[str]) -> None:
    """Fail unless the real kvscope parser accepts `argv` (without running anything)."""
    try:
        build_parser().parse_args(argv)
    except SystemExit as e:  # argparse reports unknown flags this way
        pytest.fail(f"kvscope rejects {argv}: exit {e.code}")


# ------------------------------------------------------------------------------- Dockerfile


def _instructions(text: str) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs with line continuations joined and comments dropped."""
    joined = re.sub(r"\\\n", " ", text)
    out = []
    for line in joined.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            word, _, rest = line.partition(" ")
            out.append((word.upper(), rest.strip()))
    return out


def _stages(text: str) -> dict[str, list[tuple[str, str]]]:
    stages: dict[str, list[tuple[str, str]]] = {}
    current = None
    for word, rest in _instructions(text):
        if word == "FROM":
            current = rest.split()[-1] if " AS " in rest.upper() else rest
            stages[current] = []
        elif current is not None:
            stages[current].append((word, rest))
    return stages


def test_hadolint_finds_nothing_in_the_dockerfile():
    res = subprocess.run([_tool("hadolint"), "--no-color", str(DOCKERFILE)], capture_output=True, text=True)
    assert res.returncode == 0 and res.stdout.strip() == "", res.stdout + res.stderr


def test_hadolint_is_live_it_flags_a_bad_dockerfile(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install requests\nUSER root\n")
    res = subprocess.run([_tool("hadolint"), "--no-color", str(bad)], capture_output=True, text=True)
    assert res.returncode != 0
    assert "DL3007" in res.stdout and "DL3002" in res.stdout


def test_base_image_is_pinned_by_version_tag():
    arg = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", DOCKERFILE.read_text(), re.M)
    assert arg, "the base image is set once, in ARG PYTHON_IMAGE"
    image, _, tag = arg.group(1).partition(":")
    assert image == "python" and re.fullmatch(r"3\.11\.\d+-slim-bookworm", tag), tag


def test_image_targets_run_kvscope_as_non_root():
    stages = _stages(DOCKERFILE.read_text())
    assert {"build", "agent", "ui"} <= set(stages)
    for target in ("agent", "ui"):
        users = [rest for word, rest in stages[target] if word == "USER"]
        assert users and users[-1] == "65532:65532", target
        entry = [rest for word, rest in stages[target] if word == "ENTRYPOINT"]
        cmd = [rest for word, rest in stages[target] if word == "CMD"]
        assert yaml.safe_load(entry[-1]) == ["kvscope"]
        if target == "agent":  # ui flags are checked once `kvscope ui` exists
            _accepts(yaml.safe_load(cmd[-1]))
    assert list(stages)[-1] == "agent", "a plain `docker build .` must give the agent image"


def test_build_stage_copies_every_installed_package_directory():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    dirs = {d for d in pyproject["tool"]["setuptools"]["package-dir"].values()}
    copies = [rest.split() for word, rest in _stages(DOCKERFILE.read_text())["build"] if word == "COPY"]
    sources = {src.rstrip("/") for args in copies for src in args[:-1]}
    assert dirs <= sources, f"not copied into the image: {sorted(dirs - sources)}"
    for src in sources:
        assert (ROOT / src).exists(), f"COPY {src}: no such path in the repository"


def test_dockerignore_keeps_state_and_venv_out_of_the_context():
    lines = {x.strip() for x in (ROOT / ".dockerignore").read_text().splitlines()}
    assert {".git", ".venv", "*.db"} <= lines
    copied = {"kvscope/", "agent/", "rules/", "pyproject.toml", "README.md"}
    assert not any(line.rstrip("/") + "/" in copied or line in copied for line in lines)


# ------------------------------------------------------------------------------- systemd


def _unit_for_verify(tmp_path: Path, unit: Path = UNIT) -> Path:
    """The unit with ExecStart pointing at this venv's kvscope (verify checks it exists)."""
    assert KVSCOPE_BIN.exists(), "kvscope is not installed in this interpreter's venv (scripts/setup.sh)"
    text = unit.read_text().replace("/opt/kvscope/bin/kvscope", str(KVSCOPE_BIN))
    out = tmp_path / unit.name
    out.write_text(text)
    return out


@pytest.mark.parametrize("source", UNITS, ids=lambda p: p.name)
def test_systemd_analyze_verify_accepts_the_unit(tmp_path, source):
    unit = _unit_for_verify(tmp_path, source)
    res = subprocess.run([_tool("systemd-analyze"), "verify", str(unit)], capture_output=True, text=True)
    own = [line for line in (res.stdout + res.stderr).splitlines() if source.name in line]
    assert res.returncode == 0 and not own, res.stdout + res.stderr


def test_systemd_analyze_verify_is_live_it_flags_a_bad_directive(tmp_path):
    unit = _unit_for_verify(tmp_path)
    unit.write_text(unit.read_text().replace("ProtectSystem=strict", "ProtectSystem=strictest"))
    res = subprocess.run([_tool("systemd-analyze"), "verify", str(unit)], capture_output=True, text=True)
    # verify only warns (exit 0) on a bad value, hence the positive test's check of the output
    assert f"{UNIT.name}:" in res.stderr and "strictest" in res.stderr, res.stderr


@pytest.mark.parametrize("source", UNITS, ids=lambda p: p.name)
def test_unit_hardening_exposure_is_low(tmp_path, source):
    unit = _unit_for_verify(tmp_path, source)
    res = subprocess.run(
        [_tool("systemd-analyze"), "security", "--offline=true", "--no-pager", str(unit)],
        capture_output=True,
        text=True,
    )
    m = re.search(r"Overall exposure level for \S+: (\d+\.\d+)", res.stdout)
    assert m, res.stdout[-2000:] + res.stderr
    # systemd's scale: 0 (locked down) .. 10 (unprotected); < 2 is rated "OK".
    assert float(m.group(1)) < 2.0, res.stdout


def _unit_values(key: str, unit: Path = UNIT) -> list[str]:
    return [line.split("=", 1)[1] for line in unit.read_text().splitlines() if line.startswith(key + "=")]


@pytest.mark.parametrize(
    "unit, command, state",
    [(UNITS[0], "agent", "kvscope"), (UNITS[1], "serve", "kvscope-serve")],
    ids=lambda x: x.name if isinstance(x, Path) else x,
)
def test_unit_starts_kvscope_with_flags_it_accepts(unit, command, state):
    argv = shlex.split(_unit_values("ExecStart", unit)[0])
    assert argv[0] == "/opt/kvscope/bin/kvscope" and argv[1] == command
    _accepts(argv[1:])
    assert not any("0.0.0.0" in a for a in argv), "a node install listens on loopback"
    for key in ("DynamicUser", "NoNewPrivileges", "PrivateTmp", "ProtectHome"):
        assert _unit_values(key, unit) == ["yes"], key
    assert _unit_values("ProtectSystem", unit) == ["strict"]
    assert _unit_values("StateDirectory", unit) == [state]
    assert _unit_values("RestrictAddressFamilies", unit) == ["AF_INET AF_INET6 AF_UNIX"]
    # whatever the process writes lives in its StateDirectory
    assert all(f"/var/lib/{state}/" in a for a in argv if a.startswith(("--store", "--config")) and "/var/" in a)


def test_environment_names_are_real_agent_variables():
    known = {k.env for k in KEYS} | {"KVSCOPE_TARGETS"}
    names = [line.split("=", 1)[0] for line in _unit_values("Environment")]
    for line in ENV_FILE.read_text().splitlines():
        m = re.match(r"#?(KVSCOPE_[A-Z0-9_]+)=", line)
        if m:
            names.append(m.group(1))
    assert len(names) >= 5
    assert set(names) <= known, sorted(set(names) - known)


def test_node_config_is_accepted_by_the_agent():
    cfg = build_config(yaml.safe_load(NODE_CONFIG.read_text()), environ={})
    assert cfg.listen_address.startswith("127.0.0.1:"), "a node install stays on loopback by default"
    assert cfg.store_path == "/var/lib/kvscope/kvscope.db"  # the unit's StateDirectory
    assert {t.job for t in cfg.targets} == {"vllm", "dcgm"}
