"""mypy over the kvscope package as it installs (`make typecheck`, part of `make check`).

The repository keeps the design card's top-level folders (agent/, diagnoser/, ...) and maps them
into one `kvscope.*` namespace with setuptools `package-dir` (pyproject.toml). mypy does not read
that mapping, so this lays the package out the same way in a temporary directory (symlinks,
nothing copied or installed) and checks `-p kvscope` there; paths in its messages are given back
as repository paths. Configuration: [tool.mypy] in pyproject.toml. Exit status: mypy's.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def package_dirs() -> dict[str, str]:
    """Import name -> repository folder, from pyproject.toml's package-dir."""
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    return cfg["tool"]["setuptools"]["package-dir"]


def lay_out(tree: Path, dirs: dict[str, str]) -> dict[str, str]:
    """Symlink the top package's files and each mapped subpackage under `tree`; returns the
    prefix map (path under tree -> repository path) for rewriting messages."""
    top = tree / "kvscope"
    top.mkdir()
    for entry in (ROOT / dirs["kvscope"]).iterdir():
        (top / entry.name).symlink_to(entry)
    prefixes = {"kvscope/": f"{dirs['kvscope']}/"}
    for name, folder in dirs.items():
        if name == "kvscope":
            continue
        rel = name.split(".", 1)[1].replace(".", "/")
        (top / rel).symlink_to(ROOT / folder)
        prefixes[f"kvscope/{rel}/"] = f"{folder}/"
    return prefixes


def repo_path(line: str, prefixes: dict[str, str]) -> str:
    """'kvscope/agent/x.py:3: error' -> 'agent/x.py:3: error' (longest prefix first)."""
    for tree_prefix in sorted(prefixes, key=len, reverse=True):
        if line.startswith(tree_prefix):
            return prefixes[tree_prefix] + line[len(tree_prefix) :]
    return line


def main() -> int:
    with tempfile.TemporaryDirectory(prefix="kvscope-typecheck-") as tmp:
        prefixes = lay_out(Path(tmp), package_dirs())
        cmd = [
            sys.executable,
            "-m",
            "mypy",
            "--config-file",
            str(ROOT / "pyproject.toml"),
            "-p",
            "kvscope",
            *sys.argv[1:],
        ]
        proc = subprocess.run(cmd, cwd=tmp, capture_output=True, text=True, env={**os.environ, "MYPYPATH": tmp})
        for line in (proc.stdout + proc.stderr).splitlines():
            print(repo_path(line, prefixes))
        return proc.returncode


if __name__ == "__main__":
    sys.exit(main())
