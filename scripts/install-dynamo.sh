#!/usr/bin/env bash
# Install NVIDIA Dynamo's frontend, KV router and CPU mocker engine (PyPI ai-dynamo 1.6.1 +
# ai-dynamo-runtime 1.6.1, a Rust runtime in the wheel) for the Dynamo tests (testbed/dynamo.py),
# cached OUTSIDE the repository. Idempotent: a stamp file that records the pinned set makes a rerun
# return at once. No GPU, etcd or NATS: the test bed runs it with file discovery, the TCP request
# plane and the ZMQ event plane.
#
# Why --no-deps with a frozen set instead of `pip install ai-dynamo`: two of ai-dynamo 1.6.1's
# declared requirements cannot be met from PyPI alone. aisimulate==0.13.0 (Python 3.11-3.13) is an
# sdist stub that downloads the real wheel from pypi.nvidia.com at install time, and
# certifi>=2026.10.19 is newer than the index this was tested on. Neither is needed by the
# frontend, the KV router or the mocker without its AIConfigurator perf model (--aic-perf-model).
#
# Environment:
#   KVSCOPE_DYNAMO_HOME     where it lives (default ~/.cache/kvscope/dynamo)
#   KVSCOPE_SKIP_DYNAMO=1   do nothing (the Dynamo tests then skip, saying why)
#   PYTHON                  interpreter for the venv (default python3; the wheels need >= 3.10)
set -euo pipefail

VERSION=1.6.1
HOME_DIR=${KVSCOPE_DYNAMO_HOME:-${HOME}/.cache/kvscope/dynamo}

# ai-dynamo's runtime requirements less aisimulate, frozen from a tested install (see above).
REQS=$(cat <<REQ
aiohappyeyeballs==2.7.1
aiohttp==3.14.5
aiosignal==1.4.0
annotated-doc==0.0.7
annotated-types==0.8.0
anyio==4.16.0
attrs==26.1.0
certifi==2026.10.18
cffi==2.1.1
charset-normalizer==3.5.2
click==8.5.1
cryptography==50.0.2
durationpy==0.11
filelock==4.2.12
frozenlist==1.8.0
fsspec==2026.9.0
google-auth==2.62.2
h11==0.16.0
hf-xet==1.8.0
httpcore2==2.16.2
httpx2==2.16.2
huggingface_hub==2.4.0
idna==3.20
kubernetes==32.0.1
markdown-it-py==4.3.0
mdurl==0.1.2
msgspec==0.22.0
multidict==7.2.1
numpy==2.4.6
oauthlib==4.0.1
packaging==26.3
prometheus_client==0.26.0
propcache==0.5.4
pyasn1==0.6.5
pyasn1_modules==0.4.2
pycparser==3.12
pydantic==2.13.5
pydantic_core==2.46.5
Pygments==2.21.0
python-dateutil==4.0.0
PyYAML==6.0.3
pyzmq==27.3.0
redis==8.1.0
regex==2026.11.15
requests==2.34.2
requests-oauthlib==2.0.0
rich==15.0.0
safetensors==0.8.0
shellingham==1.5.4
six==1.17.0
tokenizers==0.23.3
tqdm==4.70.1
transformers==5.23.0
truststore==0.10.5
typer==0.29.2
typing-inspection==0.4.5
typing_extensions==4.16.0
tzdata==2026.6
urllib3==2.8.0
uvloop==0.23.0
websocket-client==1.9.2
yarl==1.25.1
zstandard==0.25.0
ai-dynamo-runtime==$VERSION
ai-dynamo==$VERSION
REQ
)
NAME=install-dynamo TESTS="the Dynamo tests" SKIP_VAR=KVSCOPE_SKIP_DYNAMO
WANT=$(printf '%s\n' "$REQS" | sha256sum | cut -c1-16)
STAMP="$HOME_DIR/.kvscope-dynamo-stamp" READY="$HOME_DIR/venv/bin/python"
. "$(dirname "$0")/pinned-venv.sh"
"$PYTHON" -c 'import sys; sys.exit(sys.version_info < (3, 10))' || cannot "ai-dynamo needs Python >= 3.10"

begin "ai-dynamo $VERSION" "about 90 s, 700 MB"
"$VENV/bin/pip" install -q --no-deps -r "$REQFILE" >>"$LOG" 2>&1 || fail "pip install of the pinned set failed"
"$VENV/bin/python" -c 'import dynamo.frontend, dynamo.mocker, dynamo._core' >>"$LOG" 2>&1 \
  || fail "ai-dynamo $VERSION does not import"
installed
