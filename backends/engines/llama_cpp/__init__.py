"""llama.cpp through llama-cpp-python: the one-sequence engine (`engine`), the batched engine
(`batched`, `n_seq_max` > 1), and the parts both use (`sampling`: sampler chains, grammars and
logprobs; `sequence`: what happens to each sampled token)."""
