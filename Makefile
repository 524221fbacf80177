# Quick start: `make demo` and `make test`. Both install into .venv when needed.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test lint install clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	# torch is pinned here: this version is a local CPU wheel; a looser pin pulls a CUDA build.
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[all,test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/python -m kdvfs demo

# `make test` is what CI runs: the linter (ruff check, ruff format --check), then the tests,
# two at a time (pytest-xdist; CI has two cores).
test: lint
	$(BIN)/python -m pytest -n 2 tests

lint: $(STAMP)
	$(BIN)/python -m ruff check .
	$(BIN)/python -m ruff format --check .

clean:
	rm -rf $(VENV) mlflow.db mlruns build
