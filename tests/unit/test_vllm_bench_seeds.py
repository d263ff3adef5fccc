"""bench/vllm_bench.py's prompt seeds: one per cell, so no round replays an earlier round's prompts
into a prompt cache that still holds them, while every target of a cell gets the same prompts."""

from __future__ import annotations

import itertools

from bench.vllm_bench import WORKLOADS, bench_args, cell_seed


def test_every_cell_has_prompts_of_its_own() -> None:
    cells = list(itertools.product(range(1, 6), WORKLOADS, (1, 2, 4, 8, 16, 32)))
    seeds = [cell_seed(*cell) for cell in cells]
    assert len(set(seeds)) == len(cells)


def test_the_seed_reaches_vllms_client() -> None:
    args = bench_args("http://x", "m", "/tok", "random", 8, 16, cell_seed(2, "random", 8))
    assert args[args.index("--seed") + 1] == str(cell_seed(2, "random", 8))
