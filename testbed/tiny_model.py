"""The tiny local model, built once and cached in a directory keyed by the builder's content hash.

Build costs ~5 s (torch import dominates). Concurrent builders (pytest-xdist, two engineers) are
safe: each builds into its own temp dir and renames it into place; the loser discards its copy.
"""

from __future__ import annotations

import hashlib
import shutil
import subprocess
import tempfile
from pathlib import Path

from testbed.vllm_env import cache_root, vllm_python

BUILDER = Path(__file__).with_name("build_tiny_model.py")
SERVED_NAME = "tiny-llama"


def model_key() -> str:
    """Content hash of the builder script: change the builder, get a fresh model."""
    return hashlib.sha256(BUILDER.read_bytes()).hexdigest()[:12]


def ensure_tiny_model(python: Path | None = None, root: Path | None = None) -> Path:
    """Path of the built model directory, building it first if the cache lacks it."""
    root = root or cache_root() / "models"
    target = root / f"tiny-llama-{model_key()}"
    if (target / "model.safetensors").is_file():
        return target
    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".build-", dir=root))
    try:
        proc = subprocess.run(
            [str(python or vllm_python()), str(BUILDER), str(work / "m")], capture_output=True, text=True, timeout=300
        )
        if proc.returncode != 0:
            raise RuntimeError(f"tiny model build failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
        try:
            (work / "m").rename(target)
        except OSError:  # another process won the race
            if not (target / "model.safetensors").is_file():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target
