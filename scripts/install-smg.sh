#!/usr/bin/env bash
# Install the real SMG gateway (PyPI `smg`, the SGLang model gateway's successor: a Rust router in
# a Python wheel, `smg launch ...`) for the SMG tests and recordings (testbed/smg.py), cached OUTSIDE
# the repository. Idempotent: a stamp file that records the pinned requirement set makes a rerun
# return at once.
#
# One pinned version in its own venv (smg pulls grpcio, which sglang-router's venv does not need).
# Its /metrics (`smg_*`, cache-aware tree/branch counters, per-worker selections) differs from
# sglang-router 0.3.2's, which is why both are in the test bed.
#
# Environment:
#   KVSCOPE_SMG_HOME     where it lives (default ~/.cache/kvscope/smg)
#   KVSCOPE_SKIP_SMG=1   do nothing (the SMG tests then skip, saying why)
#   PYTHON               interpreter for the venv (default python3; the wheel needs >= 3.9)
set -euo pipefail

VERSION=1.13.0
HOME_DIR=${KVSCOPE_SMG_HOME:-${HOME}/.cache/kvscope/smg}

# smg's runtime requirements (setproctitle, grpcio, grpcio-health-checking, pyyaml), frozen from a
# tested install so CI resolves the same set every time.
REQS=$(cat <<REQ
grpcio==1.85.1
grpcio-health-checking==1.85.1
protobuf==7.36.2
PyYAML==6.0.3
setproctitle==1.3.8
typing_extensions==4.16.0
smg==$VERSION
REQ
)
NAME=install-smg TESTS="the SMG tests" SKIP_VAR=KVSCOPE_SKIP_SMG
WANT=$(printf '%s\n' "$REQS" | sha256sum | cut -c1-16)
STAMP="$HOME_DIR/.kvscope-smg-stamp" READY="$HOME_DIR/venv/bin/smg"
. "$(dirname "$0")/pinned-venv.sh"

begin "smg $VERSION" "about 45 s, 150 MB"
"$VENV/bin/pip" install -q -r "$REQFILE" >>"$LOG" 2>&1 || fail "pip install of smg==$VERSION and its pinned requirements failed"
GOT=$("$VENV/bin/smg" --version 2>>"$LOG") || fail "the installed smg does not run"
[ "$GOT" = "smg $VERSION" ] || fail "smg --version says '$GOT', expected 'smg $VERSION'"
installed
