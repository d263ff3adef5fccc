"""One loaded model behind one seam (`base.Engine`), and what the engines share.

Nothing here imports Ray (an import-linter contract keeps it so): an engine can be run, tested and
benchmarked in a plain process (`bench/engine_runner.py`, `tests/engine/test_llama_batched.py`). Each
engine lives in its own sub-package and imports its library lazily, inside the replica, so the
gateway process never loads llama.cpp or vLLM.
"""
