# Two commands do all the set-up on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
INSTALLED := $(VENV)/.installed

.PHONY: test demo bench venv clean

venv: $(INSTALLED)

$(INSTALLED): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e '.[dev,bench]'
	touch $@

test: $(INSTALLED)
	$(PY) -m pytest

demo: $(INSTALLED)
	$(VENV)/bin/streamdedup demo --config config.yaml

bench: $(INSTALLED)
	$(VENV)/bin/streamdedup bench all

clean:
	rm -rf $(VENV) var .pytest_cache .hypothesis
