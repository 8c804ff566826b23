"""Shared test fixtures. Keep heavy imports (pandas, streamlit) out of this file."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"

# testbed/ (real vLLM fixtures, load driver, fleet generator) is test tooling at the repo root,
# not an installed package: make it importable and load its fixtures.
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
pytest_plugins = ["testbed.fixtures"]
from testbed import servers  # noqa: E402
from testbed.prometheus import require_binaries  # noqa: E402


@pytest.fixture
def load_fixture():
    """Read a file under tests/fixtures/ as text."""

    def _load(rel: str) -> str:
        return (FIXTURES / rel).read_text(encoding="utf-8")

    return _load


def pytest_addoption(parser):
    parser.addoption(
        "--update-golden",
        action="store_true",
        default=False,
        help="rewrite golden files (tests/golden/) from the current output; review the diff",
    )


@pytest.fixture
def update_golden(request) -> bool:
    """True when pytest runs with --update-golden."""
    return bool(request.config.getoption("--update-golden"))


def pytest_configure(config):
    """KVSCOPE_SERVERS=current: the current servers go first on PATH for the whole run (the second
    half of the server matrix, testbed/servers.py); a run asked for them stops when they are absent
    rather than testing Debian 12's under the other name."""
    try:
        if servers.generation() == "current" and (why := servers.use_current()):
            pytest.exit(why, returncode=4)
    except ValueError as e:
        pytest.exit(str(e), returncode=4)


def pytest_runtest_setup(item):
    """`@pytest.mark.needs("promtool", ...)`: the test fails, not skips, when a program it needs is
    missing (testbed/prometheus.py `require_binaries`)."""
    for mark in item.iter_markers("needs"):
        require_binaries(*mark.args)


def pytest_collection_modifyitems(config, items):
    """The llama.cpp tests run last: `make test` builds llama-server in the background while the
    rest of the suite runs, and these tests wait for that build (testbed/llamacpp_env.py)."""
    items.sort(key=lambda item: item.get_closest_marker("llamacpp") is not None)
