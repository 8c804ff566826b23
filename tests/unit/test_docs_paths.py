"""Every repository path the documents name exists, and every section they cite by name is there.

A path is a backticked span, or a bare word ending in a file extension, that starts with a
top-level folder (`agent/...py`, `diagnoser/pushdown/`, `tests/recordings/kv-*`). A `*` or a
`<placeholder>` is a glob that must match something; a name without its extension
(`tests/recordings/kv-pressure-cascade`) must match a file with one. A backticked bare module
name (`stitch.py`) must be a file somewhere in the repository. A cited section is
`docs/x.md, "Heading"` in a document, a module or a config: the document must have that heading.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TOPS = "agent|bench|dashboards|deploy|diagnoser|docs|kvscope|report|rules|scripts|testbed|tests|ui"
PATH = re.compile(rf"(?<![\w/.:~-])(?:{TOPS})/[\w./*<>|-]*[\w/*>]")
BARE = re.compile(rf"(?<![\w/.:~-])(?:{TOPS})/[\w./-]*\.(?:py|md|ya?ml|json|txt|sh|toml|gz|c)\b")
FENCE = re.compile(r"^```.*?^```", re.M | re.S)
FILE_NAME = re.compile(r"^[\w-]+\.(?:py|c)$")
UPSTREAM_FILES = {"scheduler.py", "example_connector.py"}
"""File names the documents cite from upstream projects (vLLM), not from this repository."""
SECTION = re.compile(r"((?:docs|deploy)/[\w/-]+\.md)[,:]? (?:section )?[\"'“]([^\"'”\n]{3,80})[\"'”]")


def named_paths(text: str) -> set[str]:
    """The repository paths a Markdown text names, outside fenced blocks."""
    text = FENCE.sub("", text)
    spans = re.findall(r"`([^`]+)`", text)
    found = {m for span in spans for m in PATH.findall(span)}
    found |= set(BARE.findall(re.sub(r"`[^`]+`", " ", text)))
    return found


def named_files(text: str) -> set[str]:
    """Backticked bare module names (`stitch.py`, `_relay.c`) outside fenced blocks."""
    return {span for span in re.findall(r"`([^`]+)`", FENCE.sub("", text)) if FILE_NAME.match(span)}


@cache
def _repo_file_names(root: Path = ROOT) -> set[str]:
    return {p.name for top in TOPS.split("|") for p in (root / top).rglob("*") if ".venv" not in p.parts}


def exists(path: str, root: Path = ROOT) -> bool:
    """Whether a named path (a glob where it has `*` or `<...>`) names something in `root`."""
    pattern = re.sub(r"<[^>]*>", "*", path).rstrip("/")
    if "*" in pattern:
        return any(root.glob(pattern))
    return (root / pattern).exists() or any(root.glob(pattern + ".*"))


def headings(doc: Path) -> set[str]:
    return {m.strip().lower() for m in re.findall(r"^#+ (.+)$", FENCE.sub("", doc.read_text()), re.M)}


def cites(title: str, found: set[str]) -> bool:
    """Whether a cited section title is a heading, or the start of one ("Confidence" for
    "Confidence: inferred mechanisms ...")."""
    title = title.strip().lower()
    return any(h == title or h.startswith((title + " ", title + ":", title + ",")) for h in found)


def _documents() -> list[Path]:
    readmes = [p for p in sorted(ROOT.glob("*/README.md")) if p.parent.name != ".venv"]
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *readmes, ROOT / "tests/recordings/README.md"]


@pytest.mark.parametrize("doc", _documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_named_path_exists(doc):
    stale = sorted(p for p in named_paths(doc.read_text()) if not exists(p))
    assert not stale, f"{doc.relative_to(ROOT)} names paths that do not exist: {stale}"


@pytest.mark.parametrize("doc", _documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_named_module_exists_somewhere(doc):
    """A bare module name must be some file of the repository (a renamed or deleted module left in
    prose), unless it is an upstream project's file."""
    stale = sorted(named_files(doc.read_text()) - _repo_file_names() - UPSTREAM_FILES)
    assert not stale, f"{doc.relative_to(ROOT)} names modules that exist nowhere: {stale}"


def _citing_files() -> list[Path]:
    out = []
    for top in (
        "agent",
        "core",
        "diagnoser",
        "dashboards",
        "ui",
        "report",
        "kvscope",
        "tests",
        "docs",
        "deploy",
        "rules",
    ):
        for ext in ("py", "md", "yaml", "yml"):
            out += (ROOT / top).rglob(f"*.{ext}")
    return [p for p in out if ".venv" not in p.parts and p.name != Path(__file__).name] + [ROOT / "README.md"]


def test_every_cited_section_exists():
    missing = []
    for path in _citing_files():
        for doc, title in SECTION.findall(path.read_text(errors="replace")):
            target = ROOT / doc
            if not target.exists() or not cites(title, headings(target)):
                missing.append(f"{path.relative_to(ROOT)}: {doc}, {title!r}")
    assert not missing, "sections cited but not found:\n" + "\n".join(sorted(set(missing)))


def test_the_checks_report_what_is_not_there(tmp_path):
    """Negative controls: a stale path, a glob that matches nothing, a missing heading."""
    (tmp_path / "agent").mkdir()
    (tmp_path / "agent" / "real.py").write_text("")
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "kv-one.om.gz").write_text("")
    text = (
        "`agent/real.py` and `agent/gone.py`, agent/bare_gone.py, `tests/kv-*`, `tests/kv-one`,\n"
        "`tests/<name>.om.gz`, `tests/x-*`\n```\nagent/in_fence.py\n```\nhttps://e.org/docs/a.md\n"
    )
    named = named_paths(text)
    assert "agent/in_fence.py" not in named and "docs/a.md" not in named
    assert sorted(p for p in named if not exists(p, tmp_path)) == ["agent/bare_gone.py", "agent/gone.py", "tests/x-*"]
    assert named_files("`stitch.py`, `_relay.c`, `a b.py`, `x.yaml`") == {"stitch.py", "_relay.c"}
    assert "real.py" in _repo_file_names(tmp_path) and "gone.py" not in _repo_file_names(tmp_path)
    doc = tmp_path / "d.md"
    doc.write_text("# Title\n\n## Layout\n")
    assert cites("Layout", headings(doc)) and not cites("Data flow", headings(doc))
    assert not cites("Lay", headings(doc))
    assert SECTION.findall('(docs/architecture.md, "Layout")') == [("docs/architecture.md", "Layout")]
