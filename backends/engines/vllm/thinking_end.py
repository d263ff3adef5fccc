"""A reasoning model may not end its turn while it thinks, on vLLM as on llama.cpp: a vLLM logits
processor that turns the end of generation into the end marker.

The llama.cpp engine replaces an end-of-generation token drawn while thinking by `</think>`
(`llama_cpp/sampling.py`, `TokenSampler.think`), so every turn has an answer part, and a
`response_format` or forced tool call (whose grammar starts after the marker) still gets its
answer. vLLM has no such switch, and a sampled token cannot be swapped after the draw; the same
effect before the draw is to give the end tokens' probability to the marker: for each row still
thinking, the marker's logit becomes log(e^marker + Σ e^eos) and the end tokens' -inf. Greedy
decoding then picks the marker exactly where it would have picked an end token, and sampling draws
it with the probability the end tokens had together.

A request opts in through `SamplingParams.extra_args[THINKING_EXTRA_KEY]` (set by translate.py's
`thinking_args`): the marker token ids, the end-of-generation ids, and whether the prompt left the
thinking open (else it begins at a `<think>` the model writes first). The thinking ends at the
first marker token in the output, which is also where vLLM's structured-output manager starts the
grammar (the engine's `reasoning_parser`).

This module is loaded by vLLM's EngineCore process by name (engine_args.py's `THINKING_END_PROCESSOR`,
in the engine's `logits_processors`), never by the gateway: it imports torch and vLLM at module
level.
"""

from __future__ import annotations

from typing import Any

import torch
from vllm.v1.sample.logits_processor import BatchUpdate, LogitsProcessor
from vllm.v1.sample.logits_processor.builtin import process_dict_updates

from raygate.backends.engines.vllm.thinking_track import THINKING_EXTRA_KEY, ThinkingTrack


class ThinkingEndProcessor(LogitsProcessor):
    """Moves the end-of-generation tokens' probability onto the end marker while a row thinks."""

    def __init__(self, vllm_config: Any, device: torch.device, is_pin_memory: bool) -> None:
        self._rows: dict[int, ThinkingTrack] = {}
        self._thinking: list[int] = []  # the rows whose next token is drawn while thinking

    def is_argmax_invariant(self) -> bool:
        return False  # it changes which token greedy decoding picks

    @staticmethod
    def _add(params: Any, _prompt: list[int] | None, output: list[int]) -> ThinkingTrack | None:
        spec = (params.extra_args or {}).get(THINKING_EXTRA_KEY)
        return None if spec is None else ThinkingTrack(spec, output)

    def update_state(self, batch_update: BatchUpdate | None) -> None:
        process_dict_updates(self._rows, batch_update, self._add)
        states = {index: row.read() for index, row in self._rows.items()}
        for index in [i for i, state in states.items() if state == "answer"]:
            del self._rows[index]  # answering: nothing more to do for it
        self._thinking = [i for i, state in states.items() if state == "thinking" and self._rows[i].eos]

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        for index in self._thinking:
            row = self._rows[index]
            line = logits[index]
            eos = torch.tensor(row.eos, device=line.device)
            merged = torch.logsumexp(torch.cat([line[row.end : row.end + 1], line[eos]]), dim=0)
            line[eos] = float("-inf")
            line[row.end] = merged
        return logits
