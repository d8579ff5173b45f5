# Two commands do all the set-up on a fresh machine:
#   make run   — install into .venv and serve the embedded default model
#   make test  — install into .venv and run the tests
# The distribution's Python 3.11+ if there is one (an optimized build: see the script).
PYTHON ?= $(shell sh scripts/venv_python.sh)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint install clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# llama.cpp is built for this CPU (-march=native) but without its AMX matrix path: on CPUs
# that report AMX inside a VM that does not enable it, `ldtilecfg` faults and the engine
# worker dies at its first matrix product; without it the AVX2 / AVX-512 kernels run. Set
# CMAKE_ARGS yourself to build otherwise.
CMAKE_ARGS ?= -DCMAKE_C_FLAGS=-U__AMX_INT8__ -DCMAKE_CXX_FLAGS=-U__AMX_INT8__
export CMAKE_ARGS

# Reinstall only when the project's metadata changes. llama-cpp-python builds from source
# (about 8 minutes on 2 cores); pip caches the wheel afterwards (`pip cache remove
# llama_cpp_python` forgets it, e.g. after changing CMAKE_ARGS).
$(STAMP): pyproject.toml | $(BIN)/python
	CMAKE_BUILD_PARALLEL_LEVEL=$$(nproc) $(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

install: $(STAMP)

run: $(STAMP)
	$(BIN)/quanta migrate
	$(BIN)/quanta run

test: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/pytest

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
