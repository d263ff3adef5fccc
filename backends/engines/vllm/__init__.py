"""vLLM's `AsyncLLM` behind the engine seam (`engine`), its arguments (`engine_args`), the mapping of
our parameters to vLLM's (`sampling_params`) and of its outputs to ours (`translate`, `logprobs`),
and its counters (`stats`). vLLM itself is imported only inside the replica."""
