#!/usr/bin/env bash
# Install the real SGLang router (PyPI `sglang-router`: a Rust router in a Python wheel) for the
# router tests and recordings (testbed/router.py), cached OUTSIDE the repository. Idempotent: a
# stamp file that records the pinned requirement set makes a rerun return at once.
#
# Two versions side by side, because they export different metrics (docs/collectors.md):
#   0.3.2  the newest release: `smg_*` names (worker health, in-flight per worker, policy label),
#          no cache-aware tree hit counters;
#   0.2.4  the last release with `sgl_router_*` names: per-worker processed requests, policy
#          decisions per worker, cache-aware hits / misses, load-balancing events.
# One venv holds their (identical, pinned) Python dependencies; each version's wheel is unpacked
# with --no-deps into its own directory, put on PYTHONPATH by testbed/router.py.
#
# Environment:
#   KVSCOPE_ROUTER_HOME    where it lives (default ~/.cache/kvscope/sglang-router)
#   KVSCOPE_SKIP_ROUTER=1  do nothing (the router tests then skip, saying why)
#   PYTHON                 interpreter for the venv (default python3; the wheels need >= 3.8)
set -euo pipefail

VERSIONS="0.3.2 0.2.4"
HOME_DIR=${KVSCOPE_ROUTER_HOME:-${HOME}/.cache/kvscope/sglang-router}

# The runtime requirements of both versions (setproctitle, aiohttp, orjson, uvicorn, fastapi),
# frozen from a tested install so CI resolves the same set every time.
REQS=$(cat <<'REQ'
aiohappyeyeballs==2.7.1
aiohttp==3.14.5
aiosignal==1.4.0
annotated-doc==0.0.7
annotated-types==0.8.0
anyio==4.16.0
attrs==26.1.0
click==8.5.1
fastapi==0.165.0
frozenlist==1.8.0
h11==0.16.0
idna==3.20
multidict==7.2.1
opentelemetry-api==1.45.2
orjson==3.13.0
propcache==0.5.4
pydantic==2.14.3
pydantic_core==2.50.4
setproctitle==1.3.8
starlette==1.10.0
typing-inspection==0.4.5
typing_extensions==4.16.0
uvicorn==0.54.0
yarl==1.25.1
REQ
)
NAME=install-sglang-router TESTS="the router tests" SKIP_VAR=KVSCOPE_SKIP_ROUTER
WANT=$(printf '%s\n%s\n' "$REQS" "$VERSIONS" | sha256sum | cut -c1-16)
STAMP="$HOME_DIR/.kvscope-router-stamp" READY="$HOME_DIR/venv/bin/python"
. "$(dirname "$0")/pinned-venv.sh"

begin "sglang-router $VERSIONS" "about 30-50 s, 250 MB"
"$VENV/bin/pip" install -q -r "$REQFILE" >>"$LOG" 2>&1 || fail "pip install of the requirement set failed"
for v in $VERSIONS; do
  rm -rf "$HOME_DIR/$v"
  "$VENV/bin/pip" install -q --no-deps --target "$HOME_DIR/$v" "sglang-router==$v" >>"$LOG" 2>&1 \
    || fail "pip install of sglang-router==$v failed"
  PYTHONPATH="$HOME_DIR/$v" "$VENV/bin/python" -c \
    'import sglang_router.launch_router, sglang_router.sglang_router_rs' >>"$LOG" 2>&1 \
    || fail "sglang-router $v does not import"
done
installed
