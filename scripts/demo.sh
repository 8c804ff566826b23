#!/usr/bin/env bash
# kvscope demo: replay a real vLLM incident recording through the diagnoser and the triage UI.
# Called by `make demo` after `make setup`. Needs no GPU and no Prometheus. Ctrl-C stops it.
#   scripts/demo.sh            # UI on http://127.0.0.1:8501
#   scripts/demo.sh --check    # print the diagnosis and exit
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
if [ ! -x "$VENV/bin/kvscope" ]; then
  echo "demo: $VENV/bin/kvscope not found; run 'make setup' first" >&2
  exit 1
fi
exec "$VENV/bin/kvscope" demo "$@"
