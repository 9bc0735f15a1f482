"""The test harness of real gloo processes: results in rank order, what a run rebinds in the modules undone before
the next run, a failing rank failing the run at once, and new processes after a failure."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from tests.metrics._distributed import run_distributed
from torchmetrics_retrieval.metrics._sharded import search as shard_search


def _sum_of_ranks(rank: int, world_size: int) -> tuple[int, int, int]:
    total = torch.tensor([rank])
    dist.all_reduce(total)
    return rank, int(total), os.getpid()


def _shrink_visiting_blocks(rank: int, world_size: int) -> int:
    seen = shard_search.VISIT_ROWS
    shard_search.VISIT_ROWS = 2  # as a scenario does for several visiting blocks
    return seen


def _rank_one_fails(rank: int, world_size: int) -> None:
    if rank == 1:
        raise ValueError("rank one fails")
    dist.barrier()  # the other ranks wait here for a rank that never comes


def test_results_in_rank_order_and_a_failing_rank_fails_the_run(tmp_path: Path) -> None:
    original = shard_search.VISIT_ROWS
    assert run_distributed(_shrink_visiting_blocks, 2, tmp_path) == [original, original]
    assert run_distributed(_shrink_visiting_blocks, 2, tmp_path) == [original, original]  # the rebinding was undone
    first = run_distributed(_sum_of_ranks, 3, tmp_path)
    assert [(rank, total) for rank, total, _ in first] == [(0, 3), (1, 3), (2, 3)]
    again = run_distributed(_sum_of_ranks, 2, tmp_path)
    assert [pid for *_, pid in again] == [pid for *_, pid in first[:2]]  # the same processes served both runs
    start = time.monotonic()
    with pytest.raises(RuntimeError, match=r"rank 1 of _rank_one_fails failed:[\s\S]*ValueError: rank one fails"):
        run_distributed(_rank_one_fails, 2, tmp_path, timeout=120.0)
    assert time.monotonic() - start < 60.0  # not the deadline: the failure is reported as it happens
    after = run_distributed(_sum_of_ranks, 2, tmp_path)
    assert [(rank, total) for rank, total, _ in after] == [(0, 1), (1, 1)]
    assert {pid for *_, pid in after}.isdisjoint(pid for *_, pid in first)  # new processes after the failure
