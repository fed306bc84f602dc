# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed

.PHONY: test lint demo bench venv clean promtool kafka

venv: $(INSTALLED)

$(INSTALLED): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,bench]'
	touch $@

test: $(INSTALLED) promtool kafka lint
	$(PY) -m pytest

# Lint, format and types, before the tests (configured in pyproject.toml).
lint: $(INSTALLED)
	$(VENV)/bin/ruff check streamdedup tests
	$(VENV)/bin/ruff format --check streamdedup tests
	$(VENV)/bin/mypy

# promtool and the Prometheus server come from Debian's prometheus package; the tests run their own server
# on free ports, so the packaged service is stopped if the install started it.
promtool:
	@command -v promtool >/dev/null 2>&1 || { \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus && \
		{ systemctl stop prometheus 2>/dev/null || true; }; }

# The local Kafka broker's jars, fetched once from Maven Central into ~/.cache (java and mvn from apt if missing).
kafka:
	deploy/kafka/kafka.sh fetch

demo: $(INSTALLED) kafka
	$(VENV)/bin/streamdedup demo --config config.yaml

bench: $(INSTALLED) kafka
	$(VENV)/bin/streamdedup bench all

clean:
	rm -rf $(VENV) var .pytest_cache .hypothesis
