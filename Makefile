# Each target sets up what it needs: a fresh clone with any Python >= 3.12 is enough.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean

$(STAMP): pyproject.toml
	test -x $(PY) || "$$(scripts/find-python)" -m venv $(VENV)
	$(PY) -m pip install --quiet --upgrade pip
	$(PY) -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(STAMP)
	$(VENV)/bin/llm-gateway demo

# One pytest worker per core (TEST_WORKERS=0 runs them in this process, for pdb);
# PYTEST_ARGS: more of pytest's options (.ci/run's second pass: -m 'not slow_once').
TEST_WORKERS ?= auto
PYTEST_ARGS ?=

test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/lint-imports
	$(VENV)/bin/pytest -q -n $(TEST_WORKERS) --dist worksteal $(PYTEST_ARGS)

# The whole comparison (several minutes): table on stdout, JSON + PNG in bench/results/.
bench: $(STAMP)
	$(PY) -m pip install --quiet -e '.[test,bench]'
	$(PY) -m bench.run $(BENCH_ARGS)

clean:
	rm -rf $(VENV) .pytest_cache llm-gateway.db llm-gateway-demo.db

# The gateway with Postgres, Redis, Prometheus, Grafana and demo traffic (compose.yaml).
# Needs a container engine (Docker with Compose v2); nothing here installs one. Ctrl-C stops it.
.PHONY: observe
observe:
	@echo "Grafana: http://127.0.0.1:3030 (the llm-gateway dashboard, no login)  Prometheus: http://127.0.0.1:9090  gateway: http://127.0.0.1:3000"
	docker compose --profile observe up --build
