"""Refusing, by name, what an engine does not implement: never silently drop a parameter.

The llama.cpp single-sequence engine implements all of these; the batched llama.cpp engine and the
vLLM engine do not (yet), so they call `refuse_advanced()` before anything is decoded.
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
