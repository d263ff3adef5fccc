"""A deployment's default sampling: what a model is served with when the request does not say.

Models come with recommended settings (Qwen's `temperature 0.7, top_p 0.8, top_k 20`, a
repetition penalty for small models that loop); vLLM reads them from `generation_config.json`,
llama-server from its command line. Here they are the `defaults:` block of a model's config, set
in the YAML, through `/admin` or `raygate deploy`, over what the model's own
`generation_config.json` recommends (`generation_config:` in the config; read by the replica, see
`from_generation_config`). A field the request sets always wins, the same rule vLLM applies
("user -> server default -> OpenAI default").
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, Field

from raygate.protocol.base import StrictModel
from raygate.protocol.generation import SamplingParams

BodyT = TypeVar("BodyT", bound=BaseModel)

# The `generation_config.json` keys vLLM takes as sampling defaults (`get_diff_sampling_param`), with
# Hugging Face's own defaults: a key at its default says nothing (vLLM reads the file's *diff*).
_GENERATION_CONFIG_KEYS: dict[str, Any] = {
    "repetition_penalty": 1.0,
    "presence_penalty": None,
    "frequency_penalty": None,
    "temperature": 1.0,
    "top_k": 50,
    "top_p": 1.0,
    "min_p": None,
    "max_new_tokens": None,
}

# Chat's two spellings of the token budget, and the Responses API's: one set by the request
# overrides the default.
_SAME_FIELD = {"max_tokens": ("max_tokens", "max_completion_tokens", "max_output_tokens")}


class SamplingDefaults(StrictModel):
    """Strict, with the request fields' own names and bounds: a typo fails the deploy."""

    temperature: float | None = Field(None, ge=0.0, le=2.0)
    top_p: float | None = Field(None, gt=0.0, le=1.0)
    top_k: int | None = Field(None, ge=-1)
    min_p: float | None = Field(None, ge=0.0, le=1.0)
    repetition_penalty: float | None = Field(None, gt=0.0, allow_inf_nan=False)
    presence_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    frequency_penalty: float | None = Field(None, ge=-2.0, le=2.0)
    max_tokens: int | None = Field(None, ge=1)

    def under(self, body: BodyT) -> BodyT:
        """`body` with each default filled in where the request left the field unset; fields a
        body does not have (an endpoint with other names) are left alone."""
        fields = type(body).model_fields
        sent = body.model_fields_set
        update = {
            name: value
            for name, value in self.model_dump(exclude_none=True).items()
            if name in fields and not sent.intersection(_SAME_FIELD.get(name, (name,)))
        }
        return body.model_copy(update=update) if update else body

    def beyond(self, body: BaseModel, params: SamplingParams) -> None:
        """Set on `params` the defaults `body` has no field for (a repetition penalty on the
        Responses or Messages API, which cannot send one), unless the body set another spelling
        of it (`max_output_tokens`). `under` handles the fields the body has."""
        fields = type(body).model_fields
        sent = body.model_fields_set
        for name, value in self.model_dump(exclude_none=True).items():
            spellings = _SAME_FIELD.get(name, (name,))
            if name not in fields and not sent.intersection(spellings):
                setattr(params, name, value)

    @classmethod
    def from_generation_config(cls, data: dict[str, Any]) -> SamplingDefaults:
        """The sampling defaults a Hugging Face `generation_config.json` recommends, read as vLLM
        reads them: the keys above that differ from Hugging Face's defaults, `max_new_tokens` as
        `max_tokens`. Out-of-range values raise (pydantic's ValidationError names the field)."""
        picked = {
            key: value
            for key, hf_default in _GENERATION_CONFIG_KEYS.items()
            if (value := data.get(key)) is not None and value != hf_default
        }
        if "max_new_tokens" in picked:
            picked["max_tokens"] = picked.pop("max_new_tokens")
        return cls.model_validate(picked)

    def over(self, base: SamplingDefaults) -> SamplingDefaults:
        """These defaults, with `base`'s where these leave a field unset (the deployment's
        `defaults:` over the model's generation config)."""
        return base.model_copy(update=self.model_dump(exclude_none=True))
