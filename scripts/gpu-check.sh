#!/usr/bin/env bash
# The GPU-only tests (pytest marker `gpu`) on a machine with an NVIDIA GPU, as one command.
#
#   scripts/gpu-check.sh fetch [PYTHON_VERSION]   # here, with the registry: wheels into .gpu-wheels/
#   scripts/gpu-check.sh run OUTDIR               # there, offline: install, import, test, collect
#
# `fetch` downloads, for the GPU machine's Python (3.12 unless given) on x86-64 Linux, the wheels of
# kvscope's pinned runtime dependencies that a CUDA/PyTorch image usually lacks, with what they
# need, into .gpu-wheels/ (ignored by git; a few MB). `run` needs no network: it installs those
# wheels where the machine's python3 lacks them, installs kvscope editable from this checkout
# (its package-dir mapping puts agent/ under kvscope.agent, which a bare checkout on sys.path
# cannot import), checks every kvscope module imports, then runs every `gpu` test and writes to
# OUTDIR: gpu-check.log (everything), junit.xml, nvml-samples.jsonl (the NVML collector's samples on
# that GPU), gpu.txt (nvidia-smi's view). Exit 0 only when every GPU test ran and passed; a GPU test
# that skips on the GPU machine is a failure, and no GPU at all exits 2 after the install checks.
# docs/gpu.md says how to carry .gpu-wheels there and what the last run gave.
set -euo pipefail
cd "$(dirname "$0")/.."
WHEELS=.gpu-wheels
PY=${PYTHON:-python3}
# kvscope's runtime dependencies a PyTorch/CUDA image does not ship (the rest it has: numpy,
# pandas, aiohttp, psutil, PyYAML, nvidia-ml-py, prometheus-client, rich, tqdm, uvloop, pytest).
MISSING="httptools msgspec pyzmq opentelemetry-exporter-otlp-proto-http opentelemetry-proto opentelemetry-sdk"

pins() {  # the pinned requirement (name==version) of each name in $MISSING, read from pyproject.toml
  "$PY" - "$MISSING" <<'EOF'
import sys, tomllib
deps = tomllib.load(open("pyproject.toml", "rb"))["project"]["dependencies"]
by_name = {d.split("==")[0].strip(): d.split(";")[0].split("#")[0].strip() for d in deps}
print("\n".join(by_name[n] for n in sys.argv[1].split()))
EOF
}

case "${1:-}" in
fetch)
  pyver=${2:-3.12}
  mkdir -p "$WHEELS"
  plats=""
  for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
    plats="$plats --platform $p"
  done
  # shellcheck disable=SC2046,SC2086
  "$PY" -m pip download -q --only-binary=:all: --python-version "$pyver" --implementation cp $plats \
    -d "$WHEELS" $(pins)
  echo "gpu-check: $(ls "$WHEELS" | wc -l) wheels for Python $pyver in $WHEELS ($(du -sh "$WHEELS" | cut -f1)); carry it with the checkout"
  ;;
run)
  out=${2:?usage: scripts/gpu-check.sh run OUTDIR}
  mkdir -p "$out"
  exec > >(tee "$out/gpu-check.log") 2>&1
  echo "gpu-check: $("$PY" --version) at $(command -v "$PY"), $(date -u +%FT%TZ)"
  [ -d "$WHEELS" ] || { echo "gpu-check: no $WHEELS here: run 'scripts/gpu-check.sh fetch' where PyPI is reachable, then carry it" >&2; exit 1; }
  # shellcheck disable=SC2046
  "$PY" -m pip install -q --no-index --find-links "$WHEELS" $(pins)
  "$PY" -m pip install -q --no-index --no-deps --no-build-isolation -e .
  # every module kvscope installs imports here, the UI's and the report's optional extras aside
  "$PY" - <<'EOF'
import importlib, pkgutil, sys
sys.path.insert(0, ".")  # as tests/conftest.py does: the checkout's own kvscope/ must not shadow the install
import kvscope
failed = []
for sub in ("core", "agent", "diagnoser"):
    pkg = importlib.import_module(f"kvscope.{sub}")
    for mod in pkgutil.walk_packages(pkg.__path__, f"kvscope.{sub}."):
        try:
            importlib.import_module(mod.name)
        except Exception as exc:  # noqa: BLE001 - reported, then the run fails
            failed.append(f"{mod.name}: {type(exc).__name__}: {exc}")
print("gpu-check: kvscope.core, kvscope.agent and kvscope.diagnoser import" if not failed else "\n".join(failed))
sys.exit(1 if failed else 0)
EOF
  if ! nvidia-smi >"$out/gpu.txt" 2>&1; then
    echo "gpu-check: installed and imported, but no NVIDIA GPU answers here (nvidia-smi failed): run this on the GPU machine" >&2
    exit 2
  fi
  rc=0
  mapfile -t files < <(grep -l 'pytest.mark.gpu' tests/integration/test_*.py)
  KVSCOPE_NVML_DUMP="$out/nvml-samples.jsonl" "$PY" -m pytest -q -rA -m gpu --junitxml="$out/junit.xml" \
    "${files[@]}" || rc=$?
  skipped=$("$PY" -c "import sys, xml.etree.ElementTree as E; print(len(E.parse(sys.argv[1]).findall('.//skipped')))" "$out/junit.xml")
  if [ "$rc" = 0 ] && [ "$skipped" != 0 ]; then
    echo "gpu-check: $skipped GPU test(s) skipped on a machine with a GPU: that is a failure here" >&2
    rc=1
  fi
  echo "gpu-check: pytest exit $rc; results in $out"
  exit "$rc"
  ;;
*)
  echo "usage: scripts/gpu-check.sh fetch [PYTHON_VERSION] | run OUTDIR" >&2
  exit 2
  ;;
esac
