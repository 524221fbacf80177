# Quick start: `make demo` and `make test`. Both install into .venv when needed.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test install clean

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	# torch is pinned here: this version is a local CPU wheel; a looser pin pulls a CUDA build.
	$(BIN)/pip install -q torch==2.13.0
	$(BIN)/pip install -q -e '.[test]'
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/kdvfs demo

test: $(STAMP)
	$(BIN)/python -m pytest tests

clean:
	rm -rf $(VENV) mlflow.db mlruns
