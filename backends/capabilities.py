"""Refusing, by name, what an engine does not implement: never silently drop a parameter.

Both llama.cpp engines (one sequence, and batched) implement all of these; the vLLM engine does
not (yet), so it calls `refuse_advanced()` before anything is decoded.
"""

from __future__ import annotations

from protocol.errors import UnsupportedParameterError
from protocol.generation import GenerateRequest


def refuse_advanced(request: GenerateRequest, backend: str) -> None:
    sampling = request.sampling
    refused = [
        name
        for name, used in (
            ("logprobs", sampling.logprobs is not None or sampling.prompt_logprobs is not None),
            ("logit_bias", bool(sampling.logit_bias)),
            ("response_format", sampling.json_schema is not None),
            ("tools", bool(request.tools)),
            ("suffix", bool(request.suffix)),
        )
        if used
    ]
    if refused:
        raise UnsupportedParameterError(
            f"`{refused[0]}` is not supported by the {backend} backend yet.", param=refused[0]
        )
