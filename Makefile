# The two commands a newcomer runs: `make demo` and `make test`. Both create and use .venv in the repo root.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --quiet --disable-pip-version-check

.PHONY: install test test-fast demo bench clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install torch==2.13.0
	$(PIP) install -e '.[dev]'
	touch $@

install: $(VENV)/.installed

test: install
	$(PY) -m pytest

test-fast: install
	$(PY) -m pytest -m "not slow"

demo: install
	$(PY) -m deltattg credit examples/credit_example.jsonl --failure-cost 200 --table --out runs/demo/credit.jsonl

bench: install
	$(PY) bench/bench_credit.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis runs
