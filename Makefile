# Two entry points for a fresh machine (see README):
#   make demo   create the environment and run the main job
#   make test   create the environment and run the whole test suite
#   make docs   the guide, built offline into build/docs/ (installs the docs extra into .venv once)
#   make corpus     the language models' corpus (build/corpus/kjv.txt) from Debian's bible-kjv
#   make gpu-wheels   (with a network) the wheels a GPU machine lacks, into wheels/gpu
#   make gpu-check    (on a GPU machine, offline) the suite with CUDA visible and the GPU benchmarks
# Both build .venv once (torch's local CPU wheel first, so pip never pulls a CUDA build).

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test bench env clean gpu-wheels gpu-check docs corpus

env: $(STAMP)

$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -c "import torch" 2>/dev/null || $(BIN)/pip install -q "torch==2.13.0"
	$(BIN)/pip install -q -e ".[test,tl,hf]"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/tcircuits demo

test: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider -n auto --dist loadfile

# the language models' corpus: the King James Bible from Debian's bible-kjv (public domain), one verse a line
corpus: $(STAMP)
	command -v bible >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bible-kjv; }
	$(BIN)/python scripts/corpus.py

# the guide: Sphinx (furo, MyST, myst-nb) with warnings as errors; the tutorial notebooks run during the build
DOCS_STAMP := $(VENV)/.docs-installed

$(DOCS_STAMP): $(STAMP) pyproject.toml
	$(BIN)/pip install -q -e ".[test,tl,hf,docs]"
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	$(BIN)/sphinx-build -W --keep-going -q -b html docs build/docs
	@echo "the guide: build/docs/index.html"

bench: $(STAMP)
	for b in benchmarks/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

# pure-Python wheels that the borrowed GPU machine (torch, transformers, hypothesis, pytest) lacks
GPU_WHEELS := transformer-lens==3.9.0 datasets dill multiprocess better-abc fancy-einsum typeguard beartype \
              jaxtyping wadler-lindig latex2mathml markdown-it-py mdurl

gpu-wheels:
	mkdir -p wheels/gpu
	$(PYTHON) -m pip download -q --no-deps --only-binary=:all: -d wheels/gpu $(GPU_WHEELS)

gpu-check:
	bash scripts/gpu_check.sh

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .hypothesis
