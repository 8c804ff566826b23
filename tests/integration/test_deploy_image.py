"""What the Dockerfile's build stage does, without Docker (no engine on the test machine): copy
exactly the paths its COPY lines name (minus .dockerignore patterns) into an empty context,
`pip wheel --no-deps .` there as `pip install .` would, and run the commands the images and
the Kubernetes manifests run from that wheel alone (not from this checkout)."""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
SITE_PACKAGES = next(Path(sys.prefix).glob("lib/python3*/site-packages"))


def _build_copies() -> list[str]:
    text = re.sub(r"\\\n", " ", (ROOT / "Dockerfile").read_text())
    stage, sources = None, []
    for line in text.splitlines():
        word, _, rest = line.strip().partition(" ")
        if word == "FROM":
            stage = rest.split()[-1]
        elif word == "COPY" and stage == "build" and not rest.startswith("--from"):
            sources += rest.split()[:-1]
    return sources


def _ignored(rel: str, patterns: list[str]) -> bool:
    parts = rel.split("/")
    return any(
        fnmatch.fnmatch(rel, p.removeprefix("**/")) or any(fnmatch.fnmatch(x, p.removeprefix("**/")) for x in parts)
        for p in patterns
    )


def _copy_context(dest: Path) -> None:
    patterns = [
        x.strip().rstrip("/")
        for x in (ROOT / ".dockerignore").read_text().splitlines()
        if x.strip() and not x.startswith("#")
    ]
    for src in _build_copies():
        src_path = ROOT / src.rstrip("/")
        files = [src_path] if src_path.is_file() else [p for p in src_path.rglob("*") if p.is_file()]
        for f in files:
            rel = f.relative_to(ROOT).as_posix()
            if not _ignored(rel, patterns):
                (dest / rel).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(f, dest / rel)


@pytest.fixture(scope="module")
def wheel_root(tmp_path_factory) -> Path:
    ctx = tmp_path_factory.mktemp("context")
    _copy_context(ctx)
    out = tmp_path_factory.mktemp("wheel")
    res = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", ".", "-w", str(out)],
        cwd=ctx,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert res.returncode == 0, res.stderr[-3000:]
    (whl,) = out.glob("kvscope-*.whl")
    root = out / "unpacked"
    zipfile.ZipFile(whl).extractall(root)
    return root


def _python(root: Path, args: list[str], **env: str) -> subprocess.CompletedProcess:
    """`python -S ...` with the wheel first and the venv's dependencies after it; -S skips
    .pth files, so the checkout's editable install cannot answer instead."""
    environ = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{SITE_PACKAGES}", **env}
    return subprocess.run(
        [sys.executable, "-S", *args], capture_output=True, text=True, env=environ, timeout=120, cwd=root
    )


def _run_from_wheel(root: Path, args: list[str], **env: str) -> subprocess.CompletedProcess:
    return _python(root, ["-m", "kvscope", *args], **env)


def test_the_wheel_carries_the_package_data(wheel_root):
    pkg = wheel_root / "kvscope"
    assert (pkg / "core" / "catalog.yaml").is_file()
    assert sorted(p.name for p in (pkg / "rules" / "prometheus").glob("*.yml")) == sorted(
        p.name for p in (ROOT / "rules" / "prometheus").glob("*.yml")
    )
    res = _python(wheel_root, ["-c", "import kvscope.rules as r; print(r.__file__)"])
    assert res.returncode == 0 and res.stdout.strip() == str(pkg / "rules" / "__init__.py"), res.stdout + res.stderr


def test_image_commands_run_from_the_wheel(wheel_root):
    for command in ("agent", "serve", "ui", "deploy"):
        res = _run_from_wheel(wheel_root, [command, "--help"])
        assert res.returncode == 0, f"kvscope {command}: {res.stderr[-2000:]}"
    res = _run_from_wheel(wheel_root, ["deploy", "prometheusrule"])
    assert res.returncode == 0, res.stderr
    assert len([d for d in yaml.safe_load_all(res.stdout) if d]) == len(list((ROOT / "rules/prometheus").glob("*.yml")))


def test_init_container_renders_the_configmap_from_the_wheel(wheel_root, tmp_path):
    cm = yaml.safe_load((ROOT / "deploy/kubernetes/agent-configmap.yaml").read_text())
    template = tmp_path / "kvscope.yaml.tmpl"
    template.write_text(cm["data"]["kvscope.yaml.tmpl"])
    out = tmp_path / "etc" / "kvscope.yaml"
    res = _run_from_wheel(
        wheel_root,
        ["deploy", "render-config", "--template", str(template), "--output", str(out)],
        NODE_IP="10.0.0.9",
        NODE_NAME="gpu-node-9",
    )
    assert res.returncode == 0, res.stderr
    assert "warning" not in res.stderr
    assert "http://10.0.0.9:9400/metrics" in out.read_text()
