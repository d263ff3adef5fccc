"""The cap on sequences per request (issue #12, fan-out amplification).

Each sequence is its own engine request: `/v1/completions` with 1,000 prompts and `n: 16` started
16,000 of them from a 6 KB body (the gateway grew to 508 MB, and every replica's queue with it).
The schema already bounds `n` and the prompt list separately; what costs is their product, so that
is what `--max-sequences` caps, for every generating endpoint alike (server/serving/base.py checks
it before building a single engine request).
"""

from __future__ import annotations

from raygate.protocol.errors import BadRequestError


def check_sequence_count(prompts: int, samples_per_prompt: int, limit: int, prompt_param: str) -> None:
    """400 naming the field to reduce when `prompts` x `samples_per_prompt` is over `limit`: `n`
    when one prompt alone is over it (or there is only one), else the prompt list."""
    total = prompts * samples_per_prompt
    if total <= limit:
        return
    if prompts == 1 or samples_per_prompt > limit:
        param = "n"
        detail = f"n={samples_per_prompt}" if prompts == 1 else f"{prompts} prompts x n={samples_per_prompt}"
    else:
        param = prompt_param
        detail = f"{prompts} prompts x n={samples_per_prompt}"
    raise BadRequestError(
        f"This request asks for {total} sequences ({detail}); this server allows at most {limit} "
        "per request (prompts x n). Send fewer prompts or a smaller `n`, or split the request.",
        param=param,
    )
