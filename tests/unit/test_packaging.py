"""The package list in pyproject.toml must name every Python package directory."""

import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_every_package_directory_is_listed_in_pyproject():
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    dirs = cfg["package-dir"]
    listed = set(cfg["packages"])
    for pkg, rel in dirs.items():
        for init in (ROOT / rel).rglob("__init__.py"):
            sub = init.parent.relative_to(ROOT / rel).parts
            name = ".".join((pkg, *sub))
            assert name in listed, f"add {name!r} to [tool.setuptools].packages in pyproject.toml"
