"""Scripts and the testbed never log to a fixed /tmp path (issue 39 item 9): two setups or test
runs at once wrote /tmp/kvscope-apt.log and /tmp/kvscope-npm.log over each other. A log under
/tmp is made by mktemp (a XXXXXX template) or lives in the run's own work directory."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIXED_LOG = re.compile(r"/tmp/[\w.-]*\.log\b")


def _files():
    yield ROOT / "Makefile"
    for folder in ("scripts", "testbed"):
        yield from sorted(p for p in (ROOT / folder).rglob("*") if p.suffix in (".sh", ".py", ".mk", ""))


def test_no_fixed_tmp_log_paths():
    fixed = []
    for path in _files():
        if not path.is_file():
            continue
        for n, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            fixed += [f"{path.relative_to(ROOT)}:{n}: {m}" for m in FIXED_LOG.findall(line) if "XXXXXX" not in m]
    assert fixed == []


def test_the_pattern_catches_the_old_form():
    assert FIXED_LOG.findall(">/tmp/kvscope-apt.log 2>&1") == ["/tmp/kvscope-apt.log"]
    assert all("XXXXXX" in m for m in FIXED_LOG.findall("log=$(mktemp /tmp/kvscope-npm.XXXXXX.log)"))
