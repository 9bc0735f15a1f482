"""EmbeddingMetrics across real processes (torch.distributed, gloo on CPU): results identical to one process.

One spawn per world size runs every scenario; each rank returns what it computed, and the test checks
that every rank of every world size gives bit-identical values (and retrieved positions) to the
functional core on the whole data set in one process.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from tests.metrics._distributed import run_distributed
from tests.metrics._helpers import ALL_RANKING, make_data
from torchmetrics_retrieval.functional import retrieval_metrics
from torchmetrics_retrieval.metrics import EmbeddingMetrics

N = 29  # not a multiple of 2 or 3: DistributedSampler pads with duplicates
FIELDS = ("is_query", "sequence_ids", "categories", "camera_ids")
OPTIONS: dict[str, Any] = {**ALL_RANKING, "per_class": True, "confidence_level": 0.9, "n_bootstrap": 40}
#: rows of each rank, by world size: uneven shards, and shards with an empty rank (rank 0 for 2 processes)
UNEVEN = {1: [N], 2: [20, 9], 3: [3, 19, 7]}
WITH_EMPTY = {1: [N], 2: [0, N], 3: [17, 0, 12]}


def _data() -> dict[str, Tensor]:
    data = make_data(n=N, seed=21)  # small-integer embeddings: many exact distance ties
    return {name: data[name] for name in ("embeddings", "labels", *FIELDS)}


def _outcome(metric: EmbeddingMetrics) -> dict[str, Any]:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a rank without update() gets torchmetrics' warning
            values = metric.compute()
    except ValueError as err:
        return {"error": str(err)}
    assert metric.per_query is not None
    return {"values": values, "indices": metric.per_query.indices, "sample_indexes": metric.sample_indexes}


def _by_sampler(
    rank: int, world_size: int, data: dict[str, Tensor], options: dict[str, Any] = OPTIONS, **kwargs: Any
) -> EmbeddingMetrics:
    """DistributedSampler (shuffled, padded: drop_last=False) and a DataLoader, indexes given."""
    dataset = TensorDataset(torch.arange(N), *data.values())
    sampler = DistributedSampler(dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=3, drop_last=False)
    metric = EmbeddingMetrics(**{**options, **kwargs})
    for index, *fields in DataLoader(dataset, batch_size=4, sampler=sampler):
        metric.update(**dict(zip(data, fields, strict=True)), indexes=index)
    return metric


def _by_shards(
    rank: int, sizes: list[int], data: dict[str, Tensor], *, indexes: bool, options: dict[str, Any] = OPTIONS
) -> EmbeddingMetrics:
    """Rank r holds rows [sum(sizes[:r]), sum(sizes[:r+1])); with indexes, in a shuffled order and odd batches."""
    start = sum(sizes[:rank])
    rows = torch.arange(start, start + sizes[rank])
    if indexes:
        rows = rows[torch.randperm(rows.numel(), generator=torch.Generator().manual_seed(rank))]
    metric = EmbeddingMetrics(**options)
    for batch in rows.split(5) if rows.numel() else [rows]:  # an empty shard makes one zero-row update
        metric.update(**{name: value[batch] for name, value in data.items()}, indexes=batch if indexes else None)
    return metric


def _scenarios(rank: int, world_size: int) -> dict[str, dict[str, Any]]:
    data = _data()
    outcomes = {
        "sampler": _outcome(_by_sampler(rank, world_size, data)),
        "sampler_float16": _outcome(_by_sampler(rank, world_size, data, storage_dtype=torch.float16)),
        "uneven": _outcome(_by_shards(rank, UNEVEN[world_size], data, indexes=True)),
        "empty_rank": _outcome(_by_shards(rank, WITH_EMPTY[world_size], data, indexes=True)),
        "rank_order_without_indexes": _outcome(_by_shards(rank, UNEVEN[world_size], data, indexes=False)),
        "no_sample_anywhere": _outcome(EmbeddingMetrics()),
    }
    if world_size > 1:  # rank 0 gives `categories`, the others do not: the same error everywhere, no hang
        metric = EmbeddingMetrics()
        fields = {"embeddings": data["embeddings"][rank::world_size], "labels": data["labels"][rank::world_size]}
        if rank == 0:
            fields["categories"] = data["categories"][::world_size]
        metric.update(**fields)
        outcomes["field_on_one_rank"] = _outcome(metric)
        outcomes["usable_after_error"] = {"local_rows": sum(t.shape[0] for t in metric.embeddings)}
    return outcomes


def _assert_identical(actual: dict[str, Any], expected: dict[str, Any], label: str) -> None:
    assert list(actual["values"]) == list(expected["values"]), label
    for key, value in expected["values"].items():
        torch.testing.assert_close(actual["values"][key], value, rtol=0, atol=0, equal_nan=True, msg=f"{label} {key}")
    assert torch.equal(actual["indices"], expected["indices"]), label


@pytest.fixture(scope="module")
def single_process() -> dict[str, Any]:
    data = _data()
    values, result = retrieval_metrics(
        data["embeddings"], data["labels"], **{k: data[k] for k in FIELDS}, return_per_query=True, **OPTIONS
    )
    assert result is not None
    return {"values": values, "indices": result.indices}


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_identical_to_one_process(world_size: int, tmp_path: Path, single_process: dict[str, Any]) -> None:
    ranks = run_distributed(_scenarios, world_size, tmp_path)
    for rank, outcomes in enumerate(ranks):
        for name in ("sampler", "sampler_float16", "uneven", "empty_rank", "rank_order_without_indexes"):
            _assert_identical(outcomes[name], single_process, f"world_size={world_size} rank={rank} {name}")
        for name in ("sampler", "uneven", "empty_rank"):
            assert outcomes[name]["sample_indexes"].tolist() == list(range(N))
        assert outcomes["rank_order_without_indexes"]["sample_indexes"] is None
        assert "at least one sample" in outcomes["no_sample_anywhere"]["error"]
        if world_size > 1:
            assert "`categories` must be given on every process" in outcomes["field_on_one_rank"]["error"]
            assert outcomes["usable_after_error"]["local_rows"] == len(range(rank, N, world_size))
