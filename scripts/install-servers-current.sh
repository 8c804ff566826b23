#!/usr/bin/env bash
# Fetch the servers users run today (Debian sid's `prometheus` 3.x with promtool,
# `prometheus-alertmanager` and `victoria-metrics` with vmalert) for the second half of the test
# matrix (testbed/servers.py, the "current" generation; tests marked `servers`), WITHOUT installing
# anything system-wide: a private apt configuration (its own sources.list with one sid entry on the
# machine's Debian mirror, its own lists and cache under ~/.cache/kvscope/apt-sid), `apt-get
# download` of the three packages (no dependencies: they are Go binaries that run on Debian 12's
# libraries) and `dpkg-deb -x` into ~/.cache/kvscope/servers-current. About 106 MB to fetch (458 MB
# extracted: the packages carry vmagent, vmctl and the like), 10-20 s cold.
#
# sid holds one version per package and moves: this script prints the versions it got and checks
# them against the floors below (any Prometheus 3.x, Alertmanager >= 0.28, VictoriaMetrics >= 1.100);
# the tests accept any version above the floors. Idempotent: a stamp records the three package
# versions; a rerun returns at once (KVSCOPE_SERVERS_REFRESH=1 fetches sid's newest again).
#
# Environment:
#   KVSCOPE_SERVERS_CURRENT   where the servers land (default ~/.cache/kvscope/servers-current);
#                             their programs are in $KVSCOPE_SERVERS_CURRENT/usr/bin
#   KVSCOPE_SKIP_SERVERS_CURRENT=1   do nothing (the "current" half of the matrix then skips, saying why)
#   KVSCOPE_DEBIAN_MIRROR     the Debian mirror (default: the machine's first deb.debian.org-style
#                             URI in /etc/apt/sources.list.d/*.sources or /etc/apt/sources.list)
set -euo pipefail

NAME=install-servers-current
CACHE=${HOME}/.cache/kvscope
DEST=${KVSCOPE_SERVERS_CURRENT:-$CACHE/servers-current}
APT=$CACHE/apt-sid
STAMP=$DEST/.kvscope-servers-stamp
PKGS="prometheus promtool prometheus-alertmanager victoria-metrics"
LOG=${TMPDIR:-/tmp}/kvscope-$NAME.$$.log

fail() {
  echo "$NAME: FAILED: $1" >&2
  [ -f "$LOG" ] && { echo "--- last lines of $LOG:" >&2; tail -25 "$LOG" >&2; }
  echo "$NAME: the \"current\" half of the server matrix will fail; rerun this script after fixing the cause." >&2
  exit 1
}

if [ "${KVSCOPE_SKIP_SERVERS_CURRENT:-0}" = 1 ]; then
  echo "$NAME: KVSCOPE_SKIP_SERVERS_CURRENT=1, skipping"; exit 0
fi

# versions: print the prometheus, promtool, alertmanager, victoria-metrics and vmalert versions,
# one "name version" line each; fails when a program does not run. Debian's VictoriaMetrics build
# carries no version (`-version` prints nothing, /metrics says app_version=""), so its version is
# the package's, which the fetch records in $DEST/victoria-metrics.version; vmalert is built from
# the same source package.
BIN=$DEST/usr/bin
versions() {
  local v
  v=$("$BIN/prometheus" --version 2>&1 | sed -n 's/^prometheus, version \([0-9.]*\).*/\1/p') && [ -n "$v" ] || return 1
  echo "prometheus $v"
  v=$("$BIN/promtool" --version 2>&1 | sed -n 's/^promtool, version \([0-9.]*\).*/\1/p') && [ -n "$v" ] || return 1
  echo "promtool $v"
  v=$("$BIN/prometheus-alertmanager" --version 2>&1 | sed -n 's/^alertmanager, version \([0-9.]*\).*/\1/p') && [ -n "$v" ] || return 1
  echo "alertmanager $v"
  "$BIN/victoria-metrics" -version >/dev/null 2>&1 && "$BIN/vmalert" -version >/dev/null 2>&1 || return 1
  v=$(sed -n 's/^\([0-9][0-9.]*\).*/\1/p' "$DEST/victoria-metrics.version" 2>/dev/null) && [ -n "$v" ] || return 1
  echo "victoria-metrics $v"
}

# at_least GOT FLOOR: GOT >= FLOOR as dotted versions.
at_least() { [ "$(printf '%s\n%s\n' "$2" "$1" | sort -V | head -1)" = "$2" ]; }

check() {
  local got name v
  got=$(versions) || return 1
  while read -r name v; do
    case $name in
      prometheus | promtool) [ "${v%%.*}" = 3 ] || { echo "$NAME: $name $v is not a 3.x" >&2; return 1; } ;;
      alertmanager) at_least "$v" 0.28 || { echo "$NAME: alertmanager $v is older than 0.28" >&2; return 1; } ;;
      victoria-metrics) at_least "$v" 1.100 || { echo "$NAME: $name $v is older than 1.100" >&2; return 1; } ;;
    esac
  done <<<"$got"
  echo "$got" | tr '\n' ',' | sed 's/,$//; s/,/, /g'
}

if [ "${KVSCOPE_SERVERS_REFRESH:-0}" != 1 ] && [ -f "$STAMP" ] && got=$(check 2>/dev/null); then
  echo "$NAME: ok (cached at $DEST: $got)"; exit 0
fi

# The machine's Debian mirror, for the sid entry: deb822 sources first, then the one-line format.
mirror=${KVSCOPE_DEBIAN_MIRROR:-}
if [ -z "$mirror" ]; then
  mirror=$(cat /etc/apt/sources.list.d/*.sources 2>/dev/null | sed -n 's/^URIs:[[:space:]]*\([^[:space:]]*\/debian\)\/\{0,1\}$/\1/p' | head -1)
fi
if [ -z "$mirror" ] && [ -f /etc/apt/sources.list ]; then
  mirror=$(sed -n 's/^deb[[:space:]]\+\(\[[^]]*\][[:space:]]\+\)\{0,1\}\([^[:space:]]*\/debian\)\/\{0,1\}[[:space:]].*/\2/p' /etc/apt/sources.list | head -1)
fi
mirror=${mirror:-http://deb.debian.org/debian}
keyring=/usr/share/keyrings/debian-archive-keyring.gpg
[ -f "$keyring" ] || fail "$keyring is missing (Debian's debian-archive-keyring package): sid's index cannot be verified"
command -v apt-get >/dev/null && command -v dpkg-deb >/dev/null || fail "apt-get and dpkg-deb are needed (a Debian machine)"

echo "$NAME: fetching Debian sid's $PKGS into $DEST (about 106 MB, 20 s; mirror $mirror; log: $LOG)"
T0=$SECONDS
mkdir -p "$APT/lists/partial" "$APT/cache/archives/partial" "$APT/parts" "$APT/prefs" "$APT/debs"
: >"$APT/status"
cat >"$APT/sources.list" <<EOF
deb [signed-by=$keyring] $mirror sid main
EOF
# Everything apt reads or writes is in $APT: no system list, cache, status or lock is touched.
opts=(
  -o "Dir::Etc::SourceList=$APT/sources.list" -o "Dir::Etc::SourceParts=$APT/parts"
  -o "Dir::Etc::Preferences=$APT/prefs/none" -o "Dir::Etc::PreferencesParts=$APT/prefs"
  -o "Dir::State::Lists=$APT/lists" -o "Dir::State::status=$APT/status" -o "Dir::Cache=$APT/cache"
  -o "APT::Architecture=$(dpkg --print-architecture)" -o "Acquire::Languages=none"
  -o "Acquire::http::Timeout=60" -o "Acquire::Retries=3" -o "APT::Sandbox::User=$(id -un)"
)
timeout 600 apt-get "${opts[@]}" -qq update >"$LOG" 2>&1 || fail "apt-get update of the private sid configuration failed"
rm -f "$APT/debs"/*.deb
(cd "$APT/debs" && timeout 600 apt-get "${opts[@]}" -qq download $PKGS) >>"$LOG" 2>&1 || fail "apt-get download $PKGS from sid failed"

rm -rf "$DEST.new"
mkdir -p "$DEST.new"
for deb in "$APT/debs"/*.deb; do
  dpkg-deb -x "$deb" "$DEST.new" >>"$LOG" 2>&1 || fail "dpkg-deb -x $(basename "$deb") failed"
done
rm -rf "$DEST"
mv "$DEST.new" "$DEST"
dpkg-deb -f "$APT/debs"/victoria-metrics_*.deb Version >"$DEST/victoria-metrics.version"
got=$(check) || fail "the fetched servers do not run or are older than the floors (3.x, 0.28, 1.100)"
versions >"$DEST/versions"   # what the tests read (testbed/servers.py)
(cd "$APT/debs" && ls *.deb) >"$STAMP"
rm -f "$APT/debs"/*.deb "$LOG"
echo "$NAME: ok in $((SECONDS - T0)) s ($DEST: $got)"
