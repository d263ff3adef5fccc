"""vLLM's `AsyncLLM` behind the engine seam (`engine`), and the mapping of our parameters to
vLLM's (`support`). vLLM itself is imported only inside the replica."""
