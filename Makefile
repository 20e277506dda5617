# Each target sets up what it needs: a fresh clone with any Python >= 3.12 is enough.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo test lint bench clean

# Installed from the lockfile, every package checked against its hash; then the project
# itself, with nothing more resolved or fetched (`make lock` refreshes the lock).
LOCK := requirements/test.lock

$(STAMP): pyproject.toml $(LOCK)
	test -x $(PY) || "$$(scripts/find-python)" -m venv $(VENV)
	$(PY) -m pip install --quiet --require-hashes -r $(LOCK)
	$(PY) -m pip install --quiet --no-deps --no-build-isolation -e .
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
	$(VENV)/bin/pytest -q -n $(TEST_WORKERS) --dist worksteal --durations=15 $(PYTEST_ARGS)

# The whole comparison (several minutes): table on stdout, JSON + PNG in bench/results/.
bench: $(STAMP)
	$(PY) -m pip install --quiet -e '.[test,bench]'
	$(PY) -m bench.run $(BENCH_ARGS)

# The chaos soak (not in CI; about 12 minutes): `serve --workers 2` on a Postgres and a Redis
# of its own, the fake upstream failing and stalling, Redis killed, Postgres restarted, a
# worker SIGKILLed; table on stdout, JSON in bench/results/. SOAK_ARGS: e.g. --seconds 60.
.PHONY: soak-chaos
SOAK_ARGS ?=
soak-chaos: $(STAMP)
	$(PY) -m bench.chaos $(SOAK_ARGS)

# The documentation site (mkdocs.yml, docs/): built strictly into site/ (a broken link or
# anchor, or a page left out of the navigation, fails it); docs-serve serves it with live
# reload on http://127.0.0.1:8000; docs-reference writes the pages generated from the code
# (tests/test_docs.py fails while they are stale). NO_MKDOCS_2_WARNING: Material's
# end-of-life notice, printed on every run, is not a warning about the site.
.PHONY: docs docs-serve docs-reference
MKDOCS = NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs
docs: $(STAMP)
	$(MKDOCS) build --strict
docs-serve: $(STAMP)
	$(MKDOCS) serve --strict
docs-reference: $(STAMP)
	$(PY) -m llm_gateway.cli.reference

clean:
	rm -rf $(VENV) .pytest_cache llm-gateway.db llm-gateway-demo.db site

# The gateway with Postgres, Redis, Prometheus, Grafana and demo traffic (compose.yaml).
# Needs a container engine (Docker with Compose v2); nothing here installs one. Ctrl-C stops it.
.PHONY: observe
observe:
	@echo "Grafana: http://127.0.0.1:3030 (the llm-gateway dashboard, no login)  Prometheus: http://127.0.0.1:9090  gateway: http://127.0.0.1:3000"
	docker compose --profile observe up --build

# ---- supply chain: locks, SBOM, audit, release artifacts --------------------------------
# uv resolves (universal, hashed, pip-format locks, in seconds); pip installs them, so a
# fresh machine needs nothing but pip. Pinned versions stay unless UPGRADE=1.
.PHONY: lock sbom audit dist wheel-check image image-test
COMPILE = $(VENV)/bin/uv pip compile pyproject.toml --universal --generate-hashes \
	--python-version 3.12 --quiet $(if $(UPGRADE),--upgrade)
lock: $(STAMP)
	$(COMPILE) requirements/build.in --extra test --extra docs -o $(LOCK)
	$(COMPILE) -o requirements/runtime.lock
	$(COMPILE) --extra all -o requirements/all.lock
	$(VENV)/bin/uv pip compile requirements/build.in --universal --generate-hashes \
		--python-version 3.12 --quiet $(if $(UPGRADE),--upgrade) -o requirements/build.lock

# The components of what the image and `pip install llm-gateway[all]` run, with their
# hashes, as CycloneDX 1.6 JSON: dist/llm-gateway.cdx.json.
sbom: $(STAMP)
	mkdir -p dist
	$(VENV)/bin/cyclonedx-py requirements requirements/all.lock --of JSON \
		--output-reproducible --validate -o dist/llm-gateway.cdx.json
	@echo "wrote dist/llm-gateway.cdx.json"

# Known vulnerabilities in the locked runtime, from PyPI's advisory data (its per-release
# JSON API: where that is not reachable, --strict fails rather than report "none found").
audit: $(STAMP)
	$(VENV)/bin/pip-audit --strict --disable-pip --require-hashes -r requirements/all.lock

# The wheel and the sdist, from the locked build backend.
dist: $(STAMP)
	mkdir -p dist && rm -rf dist/*.whl dist/*.tar.gz
	$(PY) -m build --no-isolation --outdir dist . > dist/build.log 2>&1 \
		|| { cat dist/build.log; exit 1; }
	@tail -n 1 dist/build.log

# What a user installs, tried as they would: the wheel without extras in a fresh virtual
# environment (the core's dependencies from the runtime lock), then its self-test, serve
# started on SQLite, and the sidecar saying which extra it needs. CI runs it, so a file the package needs but does
# not ship, or an optional library the core imports, fails there.
wheel-check: dist
	rm -rf $(VENV)-wheel
	"$$(scripts/find-python)" -m venv $(VENV)-wheel
	$(VENV)-wheel/bin/pip install --quiet --require-hashes -r requirements/runtime.lock
	$(VENV)-wheel/bin/pip install --quiet --no-deps dist/llm_gateway-*.whl
	cd "$$(mktemp -d)" && $(CURDIR)/$(VENV)-wheel/bin/llm-gateway demo --check
	$(VENV)-wheel/bin/python scripts/serve-starts $(VENV)-wheel/bin/llm-gateway
	$(VENV)-wheel/bin/llm-gateway sidecar 2>&1 | grep "pip install 'llm-gateway\[sidecar\]'"

# The container image (sidecar/Dockerfile: every role), built here with buildah: from the
# Dockerfile's base where a registry answers, else from a Debian base made by debootstrap.
image: sbom
	PY=$(PY) scripts/build-image

# The image run with podman, each role as deployed, a request through serve and the sidecar.
image-test: $(STAMP)
	$(PY) scripts/test-image
