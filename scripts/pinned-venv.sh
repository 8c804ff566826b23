# Shared steps of the scripts that install a pinned tool into its own venv OUTSIDE the repository
# (install-sglang-router.sh, install-smg.sh, install-dynamo.sh). Sourced, not run, after the
# script has set:
#   NAME      its name in messages (install-smg)
#   TESTS     what skips without the tool (the SMG tests)
#   SKIP_VAR  the name of its KVSCOPE_SKIP_* variable
#   HOME_DIR  where the tool lives; its venv is $HOME_DIR/venv
#   STAMP     the stamp file; WANT what it must hold (a hash of the pinned set)
#   READY     a file that exists once the tool is installed ($HOME_DIR/venv/bin/python ...)
#   REQS      the pinned requirement set, one per line
# Sourcing it: does nothing more when $SKIP_VAR=1, returns at once when the stamp says the same
# set is installed, refuses a machine the set was not tested on; it defines `fail` and `cannot`,
# `begin` (creates the venv, writes the set to $REQFILE) and `installed` (writes the stamp).
# Environment: PYTHON, the interpreter for the venv (default python3).

VENV=$HOME_DIR/venv
PYTHON=${PYTHON:-python3}
LOG=${TMPDIR:-/tmp}/kvscope-$NAME.$$.log

if [ "${!SKIP_VAR:-0}" = 1 ]; then
  echo "$NAME: $SKIP_VAR=1, skipping"; exit 0
fi
if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && [ -x "$READY" ]; then
  echo "$NAME: ok (cached at $HOME_DIR)"; exit 0
fi

fail() {
  echo "$NAME: FAILED: $1" >&2
  [ -f "$LOG" ] && { echo "--- last lines of $LOG:" >&2; tail -25 "$LOG" >&2; }
  echo "$NAME: $TESTS will skip; rerun this script after fixing the cause." >&2
  exit 1
}
cannot() { echo "$NAME: cannot install here: $1; $TESTS will skip" >&2; exit 0; }
[ "$(uname -m)" = x86_64 ] || cannot "the pinned set was tested on x86_64 only (this is $(uname -m))"

# begin WHAT SIZE: say what is installed, then create the venv and $REQFILE.
begin() {
  echo "$NAME: installing $1 into $HOME_DIR ($2; log: $LOG)"
  T0=$SECONDS
  mkdir -p "$HOME_DIR"
  rm -f "$STAMP"
  [ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV" >"$LOG" 2>&1 || fail "could not create the venv"
  REQFILE=$(mktemp)
  trap 'rm -f "$REQFILE"' EXIT
  printf '%s\n' "$REQS" >"$REQFILE"
}

installed() {
  echo "$WANT" >"$STAMP"
  rm -f "$LOG"
  echo "$NAME: ok in $((SECONDS - T0)) s ($HOME_DIR)"
}
