"""A model's `engine:` block checked against what its engine takes, before anything starts.

The controller refuses a deploy with a misspelt key (400 naming it) and the gateway refuses a
config file with one at start-up, rather than a replica that loads with the key ignored (llama.cpp)
or fails minutes later. vLLM's keys are `AsyncEngineArgs`' fields: importing vLLM to read them costs
seconds and ~200 MB in the process that checks, so its replica refuses them when it starts
(`vllm/engine.py`) and the deployment goes `failed` naming the key.
"""

from __future__ import annotations

from raygate.backends.engines.llama_cpp.options import check_llama_options
from raygate.backends.engines.synthetic.engine import SYNTHETIC_OPTIONS
from raygate.protocol.config import ModelConfig


def check_engine_options(spec: ModelConfig) -> None:
    """Raise ValueError naming the first `engine:` key the model's engine does not take."""
    if spec.backend == "llama_cpp":
        check_llama_options(spec.engine)
    elif spec.backend == "synthetic":
        unknown = sorted(set(spec.engine) - SYNTHETIC_OPTIONS)
        if unknown:
            raise ValueError(f"unknown synthetic engine option `{unknown[0]}`")
