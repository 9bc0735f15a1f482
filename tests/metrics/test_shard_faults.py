"""A rank whose local work fails inside a sharded ``compute()`` (real gloo processes).

Rank 1 raises a simulated ``MemoryError`` at one step of the computation and catches it, staying alive (a caller
that goes on after the error). Without the agreement of ``_sharded/faults.py``, rank 0 would wait in its next
collective or point-to-point receive for the whole process group's timeout. Here every scenario checks that rank
0 raises, within seconds, a ``ShardedComputeError`` naming rank 1 and its exception, that rank 1 raises its own
``MemoryError``, and that afterwards the metric still holds its samples and the group still works: a second batch
and a second ``compute()`` give one process's values over both batches, on both ranks.

The steps of failure: the first search (a rank's own shard, before any exchange), the bipartite search of the
symmetric rounds in the middle of the point-to-point exchanges (several visiting blocks: ``VISIT_ROWS`` made
small), the pair passes (FNMR@FMR, EER), the full-ranking count of a shard, the reduction after the last
collective, the counts of ``ContrastiveAccuracy`` and the searches of ``CrossModalRetrieval`` (queries apart from
the gallery).
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import timedelta
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
import torch
import torch.distributed as dist
from torch import Tensor
from torchmetrics import Metric

from tests.metrics._distributed import run_distributed
from torchmetrics_retrieval import ContrastiveAccuracy, CrossModalRetrieval, EmbeddingMetrics, FNMRAtFMR
from torchmetrics_retrieval.metrics._sharded import contrastive as shard_contrastive
from torchmetrics_retrieval.metrics._sharded import embedding as shard_embedding
from torchmetrics_retrieval.metrics._sharded import keys as shard_keys
from torchmetrics_retrieval.metrics._sharded import ranks as shard_ranks
from torchmetrics_retrieval.metrics._sharded import search as shard_search

#: The metrics' process group times out after this (not the default 30 minutes): a regression fails, not hangs.
GROUP_TIMEOUT = timedelta(seconds=60)
#: Rank 0 must raise within this many seconds of calling ``compute()``.
WITHIN = 30.0
#: Samples of the first batch and of the second (the one added after the failure).
N_FIRST, N_SECOND = 240, 60

KNN: dict[str, Any] = {"cmc_top_k": (1, 5), "map_at_r": True}
PAIRS: dict[str, Any] = {"fmr_vals": (0.1,), "eer": True, "chunk_size": 32}  # several tiles on every rank
FULL: dict[str, Any] = {"map_full": True, "minp": True}
#: scenario: (metric factory, module, attribute to make fail on rank 1, failing call (1: the first))
SCENARIOS: dict[str, tuple[Callable[..., Metric], Any, str, int]] = {
    "own_search": (lambda **kw: EmbeddingMetrics(**KNN, **kw), shard_search, "_search", 1),
    # on two ranks rank 1 searches its 120 rows, 24 at a time, against 8 visiting blocks of 8 rows (each call
    # counted twice: the smaller side first), so call 40 falls in step 4 of 8
    "bipartite": (lambda **kw: EmbeddingMetrics(**KNN, **kw), shard_search, "_bipartite", 40),
    "pair_passes": (lambda **kw: EmbeddingMetrics(**PAIRS, **kw), shard_keys.ShardedKeys, "_keys", 2),
    # the full-ranking count of a shard, between the gather of the thresholds and the sum of the counts
    "full_ranking_count": (lambda **kw: EmbeddingMetrics(**FULL, **kw), shard_ranks, "shard_counts", 1),
    "after_last_collective": (lambda **kw: EmbeddingMetrics(**KNN, **kw), shard_embedding, "reduce_per_query", 1),
    "fnmr_at_fmr": (lambda **kw: FNMRAtFMR(**PAIRS, **kw), shard_keys.ShardedKeys, "_keys", 1),
    "contrastive": (lambda **kw: ContrastiveAccuracy(top_k=(1, 5), **kw), shard_contrastive, "_count_above", 1),
    # both directions from one stacked search: 120 A and 120 B rows a rank, in blocks of 15: calls 1-64 are the own
    # pass, 65-128 the visiting round
    "cross_modal": (lambda **kw: CrossModalRetrieval(cmc_top_k=(1, 5), **kw), shard_search, "_bipartite", 100),
}


def _data() -> dict[str, Tensor]:
    generator = torch.Generator().manual_seed(7)
    n = N_FIRST + N_SECOND
    x = torch.randn(n, 16, generator=generator)
    return {"x": x, "y": x + 0.3 * torch.randn(n, 16, generator=generator), "labels": torch.arange(n) % 24}


def _update(metric: Metric, rows: Tensor) -> None:
    """Feed the samples ``rows`` (dataset indexes) as every metric of the scenarios takes them."""
    data = _data()
    if isinstance(metric, ContrastiveAccuracy):
        metric.update(data["x"][rows], data["y"][rows], indexes=rows)
    elif isinstance(metric, CrossModalRetrieval):  # sample i: image x[i], caption y[i], both with id label[i]
        ids = data["labels"][rows]
        metric.update(embeddings_a=data["x"][rows], ids_a=ids, indexes_a=rows)
        metric.update(embeddings_b=data["y"][rows], ids_b=ids, indexes_b=rows)
    else:
        metric.update(data["x"][rows], data["labels"][rows], indexes=rows)


def _mine(start: int, stop: int, rank: int, world_size: int) -> Tensor:
    """This rank's samples of ``range(start, stop)``: every other one on two ranks; on three, shares of 1 : 2 : 3,
    so that the ranks send different numbers of visiting blocks and run different numbers of their own steps."""
    shares = torch.tensor([1] * world_size if world_size < 3 else [1, 2, 3])
    owner = torch.repeat_interleave(torch.arange(world_size), shares)
    rows = torch.arange(start, stop)
    return rows[owner[rows % len(owner)] == rank]


def _failing(original: Callable[..., Any], on_call: int) -> Callable[..., Any]:
    """``original``, raising a simulated ``MemoryError`` from its ``on_call``-th call on."""
    calls = itertools.count(1)

    def fail(*args: Any, **kwargs: Any) -> Any:
        if next(calls) >= on_call:
            raise MemoryError("simulated")
        return original(*args, **kwargs)

    return fail


@contextmanager
def _fails_on(rank: int, target: Any, name: str, on_call: int) -> Iterator[None]:
    if rank != 1:
        yield
        return
    with mock.patch.object(target, name, _failing(getattr(target, name), on_call)):
        yield


def _scenarios(rank: int, world_size: int, names: list[str]) -> dict[str, dict[str, Any]]:
    group = dist.new_group(backend="gloo", timeout=GROUP_TIMEOUT)
    shard_search.VISIT_ROWS = 32  # several visiting blocks per round: the failure falls between two exchanges
    outcomes: dict[str, dict[str, Any]] = {}
    for name in names:
        make, target, attribute, on_call = SCENARIOS[name]
        metric = make(process_group=group)
        _update(metric, _mine(0, N_FIRST, rank, world_size))
        outcome: dict[str, Any] = {}
        start = time.monotonic()
        try:
            with _fails_on(rank, target, attribute, on_call):
                metric.compute()
            outcome["error"] = "no error"
        except Exception as error:  # the caller goes on: rank 1 stays alive
            outcome["error"] = f"{type(error).__name__}: {error}"
        outcome["seconds"] = time.monotonic() - start
        _update(metric, _mine(N_FIRST, N_FIRST + N_SECOND, rank, world_size))
        outcome["values"] = metric.compute()
        outcomes[name] = outcome
    return outcomes


def _one_process(name: str) -> Any:
    metric = SCENARIOS[name][0]()
    _update(metric, torch.arange(N_FIRST + N_SECOND))
    return metric.compute()


def _assert_equal(got: Any, expected: Any, name: str) -> None:
    if isinstance(expected, Tensor):
        torch.testing.assert_close(got, expected, rtol=0, atol=0, equal_nan=True, msg=name)
        return
    assert list(got) == list(expected), name
    for key in expected:
        torch.testing.assert_close(got[key], expected[key], rtol=0, atol=0, equal_nan=True, msg=f"{name} {key}")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("world_size", "names"),
    [
        (2, ["own_search", "bipartite", "pair_passes", "full_ranking_count", "after_last_collective"]),
        (2, ["fnmr_at_fmr", "contrastive", "cross_modal"]),
        (3, ["bipartite", "pair_passes"]),
    ],
    ids=["embedding", "others", "three_uneven_ranks"],
)
def test_a_failure_on_one_rank_is_raised_on_every_rank_within_seconds(
    world_size: int, names: list[str], tmp_path: Path
) -> None:
    outcomes = run_distributed(_scenarios, world_size, tmp_path, names, timeout=300.0)
    for name in names:
        where = type(SCENARIOS[name][0]()).__name__
        expected = _one_process(name)
        for rank, outcome in enumerate(outcomes):
            if rank == 1:
                assert outcome[name]["error"] == "MemoryError: simulated", (name, outcome[name]["error"])
            else:
                assert outcome[name]["error"].startswith(
                    f"ShardedComputeError: rank 1 failed in {where}.compute(): MemoryError: simulated"
                ), (name, rank, outcome[name]["error"])
                assert outcome[name]["seconds"] < WITHIN, (name, rank, outcome[name]["seconds"])
            # the samples kept, the group usable: one process's values over both batches
            _assert_equal(outcome[name]["values"], expected, f"{name} rank {rank}")
