# Two entry points for a fresh machine (see README):
#   make demo   create the environment and run the main job
#   make test   create the environment and run the whole test suite
# Both build .venv once (torch's local CPU wheel first, so pip never pulls a CUDA build).

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test bench env clean

env: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q "torch==2.13.0"
	$(BIN)/pip install -q -e ".[test,tl,hf]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/tcircuits demo

test: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider

bench: $(STAMP)
	for b in benchmarks/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
