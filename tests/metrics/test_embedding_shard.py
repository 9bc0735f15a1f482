"""EmbeddingMetrics in sharded mode (``distributed="shard"``) on real gloo processes:
every key, retrieved position and sample index identical to one process, with DistributedSampler padding,
uneven shards, an empty rank, exact distance ties across shards, exclusion rules, categories, per-class keys,
intervals, and all queries on one rank; bad rows on one rank raise on every rank (no hang)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor

from tests.metrics._distributed import run_distributed
from tests.metrics._helpers import ALL_RANKING, make_data
from tests.metrics.test_embedding_ddp import _by_sampler as by_sampler
from tests.metrics.test_embedding_ddp import _by_shards as by_shards
from tests.metrics.test_embedding_ddp import _outcome
from torchmetrics_retrieval.functional import retrieval_metrics
from torchmetrics_retrieval.metrics import EmbeddingMetrics
from torchmetrics_retrieval.metrics import _shard as shard
from torchmetrics_retrieval.metrics import _shard_search as shard_search

N = 29  # not a multiple of 2 or 3: DistributedSampler pads with duplicates
FIELDS = ("is_query", "sequence_ids", "categories", "camera_ids")
FULL_RANKING = ("mrr", "map_full", "minp")  # not sharded yet: they would make compute() gather
SHARDED: dict[str, Any] = {
    **{name: value for name, value in ALL_RANKING.items() if name not in FULL_RANKING},
    "fpir_vals": (0.5,),
    "per_class": True,
    "confidence_level": 0.9,
    "n_bootstrap": 40,
}
UNEVEN = {1: [N], 2: [20, 9], 3: [3, 19, 7], 4: [3, 11, 7, 8]}
WITH_EMPTY = {1: [N], 2: [0, N], 3: [17, 0, 12], 4: [9, 0, 12, 8]}


def _data(queries_on_rank0: int = 0, every_sample_a_query: bool = False) -> dict[str, Tensor]:
    """With ``every_sample_a_query`` the set is searched against itself (the symmetric sharded search)."""
    data = make_data(n=N, seed=21)  # small-integer embeddings: many exact distance ties
    picked = {name: data[name] for name in ("embeddings", "labels", *FIELDS)}
    if queries_on_rank0:  # only the first rows (rank 0's shard) are queries
        picked["is_query"] = torch.arange(N) < queries_on_rank0
    if every_sample_a_query:
        del picked["is_query"]
    return picked


def _symmetric_scenarios(rank: int, world_size: int) -> dict[str, Any]:
    """The set against itself: each pair of shards meets on one rank; with 2-row visiting blocks, in blocks."""
    calls = []
    searched = shard.symmetric_top_k
    shard.symmetric_top_k = lambda *args: calls.append(1) or searched(*args)  # type: ignore[assignment]
    data = _data(every_sample_a_query=True)
    outcomes = {
        "symmetric_sampler": _outcome(_by_sampler(rank, world_size, data)),
        "symmetric_uneven": _outcome(_by_shards(rank, UNEVEN[world_size], data, indexes=True)),
        "symmetric_empty_rank": _outcome(_by_shards(rank, WITH_EMPTY[world_size], data, indexes=True)),
    }
    shard_search.VISIT_ROWS = 2
    outcomes["symmetric_blocks"] = _outcome(_by_shards(rank, UNEVEN[world_size], data, indexes=False))
    outcomes["symmetric_calls"] = len(calls)
    return outcomes


def _by_sampler(rank: int, world_size: int, data: dict[str, Tensor], **kwargs: Any) -> EmbeddingMetrics:
    return by_sampler(rank, world_size, data, {**SHARDED, "distributed": "shard"}, **kwargs)


def _by_shards(rank: int, sizes: list[int], data: dict[str, Tensor], *, indexes: bool) -> EmbeddingMetrics:
    return by_shards(rank, sizes, data, indexes=indexes, options={**SHARDED, "distributed": "shard"})


def _scenarios(rank: int, world_size: int) -> dict[str, Any]:
    data = _data()
    outcomes: dict[str, Any] = {
        "sampler": _outcome(_by_sampler(rank, world_size, data)),
        "sampler_gathered": _outcome(_by_sampler(rank, world_size, data, distributed="gather")),
        "sampler_float16": _outcome(_by_sampler(rank, world_size, data, storage_dtype=torch.float16)),
        "uneven": _outcome(_by_shards(rank, UNEVEN[world_size], data, indexes=True)),
        "empty_rank": _outcome(_by_shards(rank, WITH_EMPTY[world_size], data, indexes=True)),
        "rank_order_without_indexes": _outcome(_by_shards(rank, UNEVEN[world_size], data, indexes=False)),
        "queries_on_one_rank": _outcome(
            _by_shards(rank, UNEVEN[world_size], _data(UNEVEN[world_size][0]), indexes=True)
        ),
        "no_sample_anywhere": _outcome(EmbeddingMetrics(distributed="shard")),
        **_symmetric_scenarios(rank, world_size),
    }
    if world_size > 1:
        # rank 1 holds an all-zero row: every rank raises
        metric = EmbeddingMetrics(distance="cosine", distributed="shard")
        rows = data["embeddings"][rank::world_size].clone()
        if rank == 1:
            rows[0] = 0.0
        metric.update(rows, data["labels"][rank::world_size])
        outcomes["zero_row_on_one_rank"] = _outcome(metric)
        outcomes["local_rows_after_error"] = sum(t.shape[0] for t in metric.embeddings)
    return outcomes


def _expected(data: dict[str, Tensor]) -> dict[str, Any]:
    values, result = retrieval_metrics(
        data["embeddings"],
        data["labels"],
        **{k: data[k] for k in FIELDS if k in data},
        return_per_query=True,
        **SHARDED,
    )
    assert result is not None
    return {"values": values, "indices": result.indices}


def _assert_identical(actual: dict[str, Any], expected: dict[str, Any], label: str) -> None:
    assert "error" not in actual, (label, actual.get("error"))
    assert list(actual["values"]) == list(expected["values"]), label
    for key, value in expected["values"].items():
        torch.testing.assert_close(actual["values"][key], value, rtol=0, atol=0, equal_nan=True, msg=f"{label} {key}")
    assert torch.equal(actual["indices"], expected["indices"]), label


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_sharded_is_identical_to_one_process(world_size: int, tmp_path: Path) -> None:
    ranks = run_distributed(_scenarios, world_size, tmp_path)
    expected = _expected(_data())
    one_rank_queries = _expected(_data(UNEVEN[world_size][0]))
    symmetric = _expected(_data(every_sample_a_query=True))
    for rank, outcomes in enumerate(ranks):
        for name in ("symmetric_sampler", "symmetric_uneven", "symmetric_empty_rank", "symmetric_blocks"):
            _assert_identical(outcomes[name], symmetric, f"world_size={world_size} rank={rank} {name}")
        assert outcomes["symmetric_calls"] == (4 if world_size > 1 else 0)  # one process: never sharded
        for name in ("sampler", "sampler_gathered", "sampler_float16", "uneven", "empty_rank"):
            _assert_identical(outcomes[name], expected, f"world_size={world_size} rank={rank} {name}")
            if name != "sampler_float16":
                assert outcomes[name]["sample_indexes"].tolist() == list(range(N))
        _assert_identical(outcomes["rank_order_without_indexes"], expected, f"{world_size} {rank} rank order")
        assert outcomes["rank_order_without_indexes"]["sample_indexes"] is None
        _assert_identical(outcomes["queries_on_one_rank"], one_rank_queries, f"{world_size} {rank} one rank's queries")
        assert "at least one sample" in outcomes["no_sample_anywhere"]["error"]
        if world_size > 1:
            assert (
                "all-zero row" in outcomes["zero_row_on_one_rank"]["error"]
                or "other process" in (outcomes["zero_row_on_one_rank"]["error"])
            )
            assert outcomes["local_rows_after_error"] == len(range(rank, N, world_size))


@pytest.mark.slow
def test_symmetric_sharded_search_on_four_ranks(tmp_path: Path) -> None:
    """Four ranks: shards one apart meet whole, shards two apart split their rectangle in halves."""
    ranks = run_distributed(_symmetric_scenarios, 4, tmp_path)
    expected = _expected(_data(every_sample_a_query=True))
    for rank, outcomes in enumerate(ranks):
        for name in ("symmetric_sampler", "symmetric_uneven", "symmetric_empty_rank", "symmetric_blocks"):
            _assert_identical(outcomes[name], expected, f"world_size=4 rank={rank} {name}")


def test_distributed_must_be_shard_or_gather() -> None:
    with pytest.raises(ValueError, match="`distributed` must be one of"):
        EmbeddingMetrics(distributed="ring")  # type: ignore[arg-type]
