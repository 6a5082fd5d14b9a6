# rtvoice: `make run` starts the server on the embedded voice; `make test` runs the whole suite.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# A CPU build of torch that lies on these machines; a bare `torch` would pull a CUDA build of several GB.
TORCH_CPU ?= torch==2.13.0
# The slowest tests named at the end of every run, so that a slow CI run says where its time went.
PYTEST_ARGS ?= --durations=25
# Test files run in parallel (pytest-xdist), one more worker than cores: much of a test is waiting on a server, a
# browser or real-time audio. A file stays on one worker, so its servers start once.
PYTEST_WORKERS ?= $(shell echo $$(( $$(nproc) + 1 )))

.PHONY: run test lint venv test-deps browser whep-player deploy-tools bench clean

$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet -e .
	touch $@

venv: $(VENV)/.installed

run: venv
	$(VENV)/bin/rtvoice serve

$(VENV)/.test-installed: $(VENV)/.installed pyproject.toml
	$(PIP) install --quiet $(TORCH_CPU)
	$(PIP) install --quiet -e '.[test,cosyvoice,bench,grpc]'
	touch $@

test-deps: $(VENV)/.test-installed

# Debian's chromium drives the web-page test; install it when missing and we may.
browser:
	@if ! command -v chromium >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null) \
	      || echo "could not install chromium"; \
	  else echo "chromium missing (not root): browser tests will skip unless RTVOICE_REQUIRE_BROWSER=1"; fi; \
	fi

# Debian's haproxy, coturn and prometheus (promtool) run the deployment tests (tests/test_cluster.py,
# test_turn.py, test_deploy.py); install them when missing and we may.
DEPLOY_TOOLS := haproxy:haproxy turnserver:coturn promtool:prometheus
deploy-tools:
	@missing=""; for pair in $(DEPLOY_TOOLS); do command -v $${pair%%:*} >/dev/null 2>&1 || missing="$$missing $${pair#*:}"; done; \
	if [ -n "$$missing" ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null) \
	      || echo "could not install$$missing"; \
	  else echo "missing (not root):$$missing; deployment tests will skip unless RTVOICE_REQUIRE_DEPLOY_TOOLS=1"; fi; \
	fi

# The third-party WHEP player the browser tests and bench.whep_browser drive (medooze's whip-whep from npm,
# pinned by tests/whep_player/package-lock.json).
WHEP_PLAYER := tests/whep_player
$(WHEP_PLAYER)/node_modules/.package-lock.json: $(WHEP_PLAYER)/package-lock.json
	@if command -v npm >/dev/null 2>&1; then cd $(WHEP_PLAYER) && npm ci --no-audit --no-fund --loglevel=error; \
	else echo "npm missing: the WHEP player test will skip unless RTVOICE_REQUIRE_BROWSER=1"; fi

whep-player: $(WHEP_PLAYER)/node_modules/.package-lock.json

# Ruff (format and lint) and mypy, as configured in pyproject.toml: a finding fails `make test` before any test runs.
# mypy reads app/ and engine/ under their installed names through links in build/typecheck (see [tool.mypy]).
LINTED := app engine testkit tests bench
TYPECHECK := build/typecheck/rtvoice
lint: test-deps
	$(VENV)/bin/ruff format --check $(LINTED)
	$(VENV)/bin/ruff check $(LINTED)
	@mkdir -p $(TYPECHECK) && for part in app engine web; do ln -sfn ../../../$$part $(TYPECHECK)/$$part; done
	$(VENV)/bin/mypy

test: test-deps lint browser whep-player deploy-tools
	$(PY) -m pytest -q -n $(PYTEST_WORKERS) --dist loadfile $(PYTEST_ARGS)

bench: test-deps
	$(PY) -m bench.ttfa

clean:
	rm -rf $(VENV) .pytest_cache build *.egg-info $(WHEP_PLAYER)/node_modules
