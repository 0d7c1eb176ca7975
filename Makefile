# Two entry points for a fresh machine (see README):
#   make demo   create the environment and run the main job
#   make test   create the environment and run the whole test suite
#   make docs   the guide, built offline into build/docs/ (installs the docs lock into .venv once)
#   make lock   the locks again from pyproject.toml (pins kept where they still fit); UPGRADE=1: the newest releases
#   make corpus     the language models' corpus (build/corpus/kjv.txt) from Debian's bible-kjv
#   make gpu-wheels   (with a network) the wheels a GPU machine lacks, into wheels/gpu
#   make gpu-check    (on a GPU machine, offline) the suite with CUDA visible and the GPU benchmarks
#                     (GPU_CHECK_ORDER3=1: order 3 too; GPU_CHECK_TRAIN=1: the plain-text runs on the card)
# Both build .venv once from the lock (exact versions and their hashes: the same clone, the same environment,
# next month too; torch is the CPU build) and reuse it afterwards.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

LOCK      := requirements/lock.txt
DOCS_LOCK := requirements/docs-lock.txt
# exactly what a lock names, each file checked against its hash (-qq: pip's notes on the machine's local indexes)
INSTALL_LOCKED := $(BIN)/pip install -qq --require-hashes --no-deps -r

.PHONY: demo test bench env clean gpu-wheels gpu-check docs corpus lock check-lock

env: $(STAMP)

$(STAMP): pyproject.toml $(LOCK)
	$(PYTHON) -m venv $(VENV)
	$(INSTALL_LOCKED) $(LOCK)
	$(BIN)/pip install -qq --no-deps --no-build-isolation -e .
	touch $(STAMP)

# one line and a failure when the lock and pyproject.toml disagree (a dependency added to one only)
check-lock: $(STAMP)
	@$(BIN)/python scripts/check_lock.py $(LOCK)

demo: check-lock
	$(BIN)/tcircuits demo

test: check-lock
	$(BIN)/python -m pytest -q -p no:cacheprovider -n auto --dist loadfile

# pip-tools in an environment of its own; a pin is kept while pyproject.toml's range allows it, and UPGRADE=1 takes
# the newest releases the registry serves (README: Upgrading). The docs lock starts from the main lock's pins.
LOCK_ENV   := build/lock-env
LOCK_FLAGS := -q --generate-hashes --allow-unsafe --strip-extras --no-emit-index-url --no-emit-find-links
lock:
	$(PYTHON) -m venv $(LOCK_ENV)
	$(LOCK_ENV)/bin/pip install -qq "pip-tools==7.7.0"
	$(LOCK_ENV)/bin/pip-compile $(LOCK_FLAGS) $(if $(UPGRADE),--upgrade) --extra test --extra tl --extra hf \
	    -o $(LOCK) pyproject.toml requirements/torch-cpu.in
	cp $(LOCK) $(DOCS_LOCK)
	$(LOCK_ENV)/bin/pip-compile $(LOCK_FLAGS) --extra test --extra tl --extra hf --extra docs \
	    -o $(DOCS_LOCK) pyproject.toml requirements/torch-cpu.in
	$(LOCK_ENV)/bin/python scripts/check_lock.py $(LOCK)
	$(LOCK_ENV)/bin/python scripts/check_lock.py $(DOCS_LOCK)

# the language models' corpus: the King James Bible from Debian's bible-kjv (public domain), one verse a line
corpus: $(STAMP)
	command -v bible >/dev/null 2>&1 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq bible-kjv; }
	$(BIN)/python scripts/corpus.py

# the guide: Sphinx (furo, MyST, myst-nb) with warnings as errors; the tutorial notebooks run during the build
DOCS_STAMP := $(VENV)/.docs-installed

$(DOCS_STAMP): $(STAMP) $(DOCS_LOCK)
	$(INSTALL_LOCKED) $(DOCS_LOCK)
	touch $(DOCS_STAMP)

docs: $(DOCS_STAMP)
	@$(BIN)/python scripts/check_lock.py $(DOCS_LOCK)
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
