"""Per-request control of a reasoning model's thinking, as each API spells it, mapped onto the one
switch and budget the engines take (`GenerateRequest.thinking`, `.thinking_budget`).

* Chat completions (vLLM's fields): `chat_template_kwargs: {enable_thinking}`, `reasoning_effort`
  (vLLM's rule: `none` turns thinking off, anything else on), `thinking_token_budget`,
  `include_reasoning`.
* Responses: `reasoning: {effort}`. Anthropic Messages: `thinking: {type, budget_tokens}`.

An effort below `high` also bounds the thinking (`EFFORT_BUDGETS`), so "think a little" means
what it says on a model that would otherwise think for thousands of tokens.
"""

from __future__ import annotations

from typing import Any, Literal

from raygate.protocol.errors import BadRequestError

Effort = Literal["none", "minimal", "low", "medium", "high", "xhigh", "max"]
EFFORTS: tuple[str, ...] = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
# Thinking tokens an effort allows when the request names no budget; None: the model's default.
EFFORT_BUDGETS: dict[str, int | None] = {
    "minimal": 128,
    "low": 512,
    "medium": 2048,
    "high": None,
    "xhigh": None,
    "max": None,
}


def thinking_control(
    effort: str | None,
    template_kwargs: dict[str, Any] | None,
    budget: int | None,
    param: str = "reasoning_effort",
) -> tuple[bool | None, int | None, dict[str, Any] | None]:
    """(switch, budget, other template kwargs) for one request. `enable_thinking` in the template
    kwargs wins over the effort, as in vLLM; an effort the request names is also passed to the
    template (`reasoning_effort`, which gpt-oss's template reads)."""
    kwargs = dict(template_kwargs or {})
    switch: bool | None = None
    if "enable_thinking" in kwargs:
        value = kwargs.pop("enable_thinking")
        if not isinstance(value, bool):
            raise BadRequestError(
                "`chat_template_kwargs.enable_thinking` must be true or false.", param="chat_template_kwargs"
            )
        switch = value
    if effort is not None:
        if effort not in EFFORTS:
            raise BadRequestError(
                f"`{param}` must be one of {', '.join(EFFORTS)}, not {effort!r}.", param=param
            )
        kwargs.setdefault("reasoning_effort", effort)
        if switch is None:
            switch = effort != "none"
        if budget is None and switch:
            budget = EFFORT_BUDGETS.get(effort)
    return switch, budget, kwargs or None
