#!/usr/bin/env bash
# Install what kvscope and its tests need on a fresh Debian machine (idempotent):
#   Debian packages: prometheus + promtool, victoria-metrics (single-node, 1.79), alertmanager + amtool, chromium (UI tests), nginx (tap bench), systemd (systemd-analyze checks the unit)
#   .venv with kvscope and its pinned dependencies (pip install -e '.[dev]')
# Environment: VENV (default .venv), KVSCOPE_SKIP_APT=1 to skip the Debian step,
# KVSCOPE_SETUP=runtime for what `make demo` needs: the runtime and the UI ('.[ui]'), no Debian
# test daemons, no test toolchain, no npm (a later `make setup` adds them to the same .venv).
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
APT_PKGS="prometheus victoria-metrics prometheus-alertmanager chromium chromium-driver nginx systemd"

EXTRAS=dev
if [ "${KVSCOPE_SETUP:-full}" = runtime ]; then EXTRAS=ui; KVSCOPE_SKIP_APT=1; fi

if [ "${KVSCOPE_SKIP_APT:-0}" != 1 ] && ! dpkg -s $APT_PKGS >/dev/null 2>&1; then
  echo "setup: installing Debian packages: $APT_PKGS"
  if [ "$(id -u)" != 0 ]; then SUDO=sudo; else SUDO=; fi
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  log=$(mktemp /tmp/kvscope-apt.XXXXXX.log)   # one per run: concurrent setups must not share a log
  $SUDO apt-get install -y -qq --no-install-recommends $APT_PKGS >"$log" 2>&1 \
    || { tail -30 "$log"; echo "setup: apt-get install failed (log: $log)" >&2; exit 1; }
  rm -f "$log"
fi

if [ ! -x "$VENV/bin/python" ] || [ ! -x "$VENV/bin/pip" ]; then
  echo "setup: creating $VENV"   # again from scratch when an interrupted setup left it without pip
  python3 -m venv --clear "$VENV"
fi
stamp="$VENV/.kvscope-installed-$EXTRAS"
full="$VENV/.kvscope-installed-dev"   # the dev extras include the ui ones
if { [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; } && { [ ! -f "$full" ] || [ pyproject.toml -nt "$full" ]; }; then
  echo "setup: installing kvscope[$EXTRAS] into $VENV"
  log=$(mktemp /tmp/kvscope-pip.XXXXXX.log)
  "$VENV/bin/pip" install -q -e ".[$EXTRAS]" >"$log" 2>&1 \
    || { grep -v 'is ignored: it is neither' "$log" | tail -30; echo "setup: pip install failed (log: $log)" >&2; exit 1; }
  rm -f "$log"
  touch "$stamp"
fi
# kvscope's own bytecode, as a regular (non-editable) install writes it: where PYTHONDONTWRITEBYTECODE
# is set (some CI images and sandboxes), an editable install would compile every module it imports
# at every start (with the lighter imports, `diagnose --prometheus` imports in 0.23 s, not 0.52 s).
# Quick when nothing changed.
"$VENV/bin/python" -m compileall -q -j 0 core agent diagnoser dashboards ui report kvscope >/dev/null
[ "$EXTRAS" = ui ] && exit 0   # the demo needs no npm
# CRD schema validator for the Prometheus Operator objects in deploy/kubernetes (npm, pinned by
# deploy/validate/package-lock.json); the machine's Node.js runs it.
if command -v npm >/dev/null 2>&1 && [ ! -d deploy/validate/node_modules/@kubernetes-models ]; then
  echo "setup: installing deploy/validate (npm ci)"
  log=$(mktemp /tmp/kvscope-npm.XXXXXX.log)
  npm ci --prefix deploy/validate --no-audit --no-fund >"$log" 2>&1 \
    || { tail -20 "$log"; echo "setup: npm ci in deploy/validate failed (log: $log)" >&2; exit 1; }
  rm -f "$log"
fi
echo "setup: ok ($("$VENV/bin/kvscope" --version))"
