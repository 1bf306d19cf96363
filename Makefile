# The two commands in README.md are `make run` and `make test`; everything else serves them.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
TOOLS ?= $(HOME)/.cache/llmgw/tools
BUF := $(TOOLS)/node_modules/.bin/buf

.PHONY: venv run test lint proto proto-check buf-lint bench

export CMAKE_BUILD_PARALLEL_LEVEL ?= 2

# `make run` needs the runtime packages only; `make test` adds the tools that check the code.
$(VENV)/.runtime: pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e .
	touch $@

$(VENV)/.installed: $(VENV)/.runtime
	$(PY) -m pip install -q -e '.[dev]'
	touch $@

venv: $(VENV)/.installed

# Run the whole control plane on this machine (llmgw up): planner, fleet, a demo agent with
# stand-in cards, an example catalog. llama-server is built first (once) so the llama.cpp
# example answers for real. Only the runtime packages are installed.
run: $(VENV)/.runtime llama-server
	$(VENV)/bin/llmgw up $(UP_ARGS)

# Regenerate the Python code of the protos (committed).
proto: venv
	$(PY) scripts/gen_protos.py --out .

# Fail when the committed generated code differs from what the protos generate.
proto-check: venv
	$(PY) scripts/gen_protos.py --check

$(BUF):
	mkdir -p $(TOOLS)
	cd $(TOOLS) && npm install --silent --no-audit --no-fund @bufbuild/buf@1.75.0

buf-lint: $(BUF)
	cd protos && $(abspath $(BUF)) lint

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-logo

# nginx, for the test of the fleet behind a proxy's grpc_pass (tests/integration/test_behind_nginx.py):
# Debian's, whose grpc and http_v2 modules are built in. Installed once when missing (as root).
.PHONY: nginx
nginx:
	@command -v nginx >/dev/null || test -x /usr/sbin/nginx || { \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	  apt-get install -y -qq --no-install-recommends nginx-light; }

# Run every check and test, as CI does.
test: venv llama-server nginx proto-check buf-lint lint
	$(VENV)/bin/pytest $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: that is a failure here" >&2; exit 1; fi; \
	exit $$rc

bench: venv
	$(PY) -m bench

# llama.cpp, built once from the llama.cpp that the pinned llama-cpp-python sdist vendors, into
# ~/.cache/llmgw/llama.cpp: bin/llama-server (where the agent and `llmgw up` find it) and the
# libllama the tests' oracle loads. Minutes once on 2 cores; a stamp makes it instant after.
.PHONY: llama-server
llama-server: $(VENV)/.runtime
	PYTHON=$(abspath $(PY)) scripts/build_llama_server.sh
