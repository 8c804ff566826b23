"""Which generation of the real servers (Prometheus + promtool, Alertmanager, VictoriaMetrics +
vmalert) the tests run against: the two halves of the server matrix.

* `debian12` (the default): Debian 12's packages on PATH, Prometheus 2.42, Alertmanager 0.25,
  VictoriaMetrics 1.79 (scripts/setup.sh installs them).
* `current`: Debian sid's Prometheus 3.x, Alertmanager >= 0.28 and VictoriaMetrics >= 1.100,
  extracted by scripts/install-servers-current.sh into ~/.cache/kvscope/servers-current, whose
  usr/bin goes first on PATH for the whole pytest run (every test finds the programs by name).

`KVSCOPE_SERVERS=current pytest -m servers tests/integration` runs the matrix's second half
(`make test` does, after the whole suite); tests marked `servers` are the ones whose outcome
depends on PromQL, rule, Alertmanager or VictoriaMetrics semantics.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

ENV = "KVSCOPE_SERVERS"
GENERATIONS = ("debian12", "current")
CURRENT_HOME = Path(os.environ.get("KVSCOPE_SERVERS_CURRENT", Path.home() / ".cache" / "kvscope" / "servers-current"))


def generation() -> str:
    """The generation this run tests (KVSCOPE_SERVERS, default debian12); ValueError when unknown."""
    name = os.environ.get(ENV, "debian12")
    if name not in GENERATIONS:
        raise ValueError(f"{ENV}={name!r}: expected one of {', '.join(GENERATIONS)}")
    return name


def use_current() -> str | None:
    """Put the current servers first on PATH; None, or why they cannot be used (a sentence)."""
    bindir = CURRENT_HOME / "usr" / "bin"
    if not (bindir / "prometheus").is_file() or not (CURRENT_HOME / "versions").is_file():
        return f"{ENV}=current but {CURRENT_HOME} holds no servers: run scripts/install-servers-current.sh"
    os.environ["PATH"] = f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"
    return None


def _version(argv: list[str], pattern: str) -> tuple[int, ...] | None:
    try:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    except OSError:
        return None
    m = re.search(pattern, out.stdout + out.stderr)
    return tuple(int(p) for p in m.group(1).split(".")) if m else None


def prometheus_version(binary: str = "prometheus") -> tuple[int, ...] | None:
    """The Prometheus (or promtool, with binary="promtool") on PATH as (major, minor, patch)."""
    return _version([binary, "--version"], r"version (\d+\.\d+\.\d+)")


def alertmanager_version(binary: str = "prometheus-alertmanager") -> tuple[int, ...] | None:
    """The Alertmanager on PATH as (major, minor, patch)."""
    return _version([binary, "--version"], r"version (\d+\.\d+\.\d+)")


def victoria_version() -> tuple[int, ...] | None:
    """The VictoriaMetrics on PATH: Debian builds it without a version (`-version` prints nothing,
    /metrics says app_version=""), so this is its package's version: the current generation's from
    the file the install script wrote, Debian 12's from dpkg."""
    if generation() == "current":
        text = (CURRENT_HOME / "versions").read_text()
        m = re.search(r"^victoria-metrics (\d+\.\d+\.\d+)", text, re.M)
        return tuple(int(p) for p in m.group(1).split(".")) if m else None
    return _version(["dpkg-query", "-W", "-f", "${Version}", "victoria-metrics"], r"^(\d+\.\d+\.\d+)")
