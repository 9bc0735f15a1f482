"""TrialMetrics across real processes (gloo on CPU): values identical (``torch.equal``) to one process.

One spawn per world size runs every scenario: DistributedSampler padding (a duplicate dropped by ``indexes``),
uneven shards, an empty rank, trials whose two samples sit on different ranks, ``distributed="gather"``, and a trial
naming an index no process updated (the same error on every rank, the state kept). The sharded path's calls are
counted: the same numbers from a fallback to gathering would not pass.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from tests.metrics._distributed import run_distributed
from tests.metrics._helpers import outcome
from torchmetrics_retrieval.functional.trials import trial_metrics
from torchmetrics_retrieval.metrics.trials import TrialMetrics

N, D, T = 29, 6, 90  # N not a multiple of 2 or 3: DistributedSampler pads with duplicates
OPTIONS: dict[str, Any] = {
    "fmr_vals": (0.05, 0.3),
    "eer": True,
    "min_dcf_p_target": (0.05, 0.5),
    "roc_auc": True,
    "cllr": True,
    "act_dcf_p_target": (0.5,),
}
DISTANCES = ("cosine", "euclidean")
UNEVEN = {1: [N], 2: [20, 9], 3: [3, 19, 7]}
WITH_EMPTY = {1: [N], 2: [0, N], 3: [17, 0, 12]}
SHARDED = ("torchmetrics_retrieval.metrics._sharded.trials", "sharded_trial_compute")


def _data() -> dict[str, Any]:
    g = torch.Generator().manual_seed(7)
    ids = 1000 + 2 * torch.arange(N)  # dataset indexes, not rows
    enrol, test = torch.randint(0, N, (T,), generator=g), torch.randint(0, N, (T,), generator=g)
    return {
        "x": torch.randn(N, D, generator=g),
        "ids": ids,
        "trials": (ids[enrol], ids[test], torch.rand(T, generator=g) < 0.4),
        "rows": (enrol, test),
    }


def _shards(rank: int, sizes: list[int], data: dict[str, Any], **options: Any) -> TrialMetrics:
    """Rank r holds a contiguous block of a fixed permutation of the rows, in batches of 5."""
    order = torch.randperm(N, generator=torch.Generator().manual_seed(3))
    start = sum(sizes[:rank])
    metric = TrialMetrics(data["trials"], **options)
    for rows in order[start : start + sizes[rank]].split(5):
        metric.update(data["x"][rows], data["ids"][rows])
    return metric


def _sampler(rank: int, world_size: int, data: dict[str, Any], **options: Any) -> TrialMetrics:
    dataset = TensorDataset(torch.arange(N))
    sampler: DistributedSampler[Any] = DistributedSampler(dataset, num_replicas=world_size, rank=rank, seed=3)
    metric = TrialMetrics(data["trials"], **options)
    for (rows,) in DataLoader(dataset, batch_size=4, sampler=sampler):
        metric.update(data["x"][rows], data["ids"][rows])
    return metric


def _scenarios(rank: int, world_size: int) -> dict[str, Any]:
    data = _data()
    module = importlib.import_module(SHARDED[0])
    original, calls = getattr(module, SHARDED[1]), []
    setattr(module, SHARDED[1], lambda *args: calls.append(1) or original(*args))
    exchange, received = module._exchanged_rows, []

    def counted(local: Tensor, *args: Any) -> tuple[Tensor, Tensor]:
        rows, where = exchange(local, *args)
        received.append(rows.shape[0] - local.shape[0])  # the test rows this rank received from their owners
        return rows, where

    module._exchanged_rows = counted
    out: dict[str, Any] = {}
    for distance in DISTANCES:
        options = {"distance": distance, **OPTIONS}
        out[f"{distance}/sampler"] = outcome(_sampler(rank, world_size, data, **options))
        out[f"{distance}/uneven"] = outcome(_shards(rank, UNEVEN[world_size], data, **options))
        out[f"{distance}/empty_rank"] = outcome(_shards(rank, WITH_EMPTY[world_size], data, **options))
        gathered = _shards(rank, UNEVEN[world_size], data, distributed="gather", **options)
        out[f"{distance}/gather"] = outcome(gathered)
    # a trial naming an index nobody updated: the same error on every rank, the state kept, the metric usable
    missing_id = int(data["trials"][1][0])
    metric = TrialMetrics(data["trials"], **OPTIONS)
    keep = data["ids"] != missing_id
    x, ids = data["x"][keep], data["ids"][keep]
    mine = torch.arange(ids.numel()) % world_size == rank
    metric.update(x[mine], ids[mine])
    out["missing"] = outcome(metric)
    out["missing/kept"] = int(sum(t.shape[0] for t in metric.embeddings)) == int(mine.sum())
    if rank == 0:
        metric.update(data["x"][~keep], data["ids"][~keep])
    out["missing/then"] = outcome(metric)
    # embeddings of another width on each rank: the same error on every rank (no hang), the state kept
    dims = TrialMetrics(data["trials"], **OPTIONS)
    dims.update(torch.randn(3, D + rank), data["ids"][:3])
    out["dims"] = outcome(dims)
    out["dims/kept"] = [tuple(t.shape) for t in dims.embeddings] == [(3, D + rank)]
    # a zero row under cosine on the last rank only: the one-process ValueError on every rank
    zero = TrialMetrics(data["trials"], **OPTIONS)
    rows = torch.arange(rank, N, world_size)
    zero.update(data["x"][rows] * (data["ids"][rows] != data["ids"][-1])[:, None], data["ids"][rows])
    out["zero"] = outcome(zero)
    out["sharded_calls"] = len(calls)
    out["received"] = received
    return out


@pytest.fixture(scope="module")
def single_process() -> dict[str, dict[str, Tensor]]:
    data = _data()
    trials = (*data["rows"], data["trials"][2])
    return {distance: trial_metrics(data["x"], trials, distance=distance, **OPTIONS) for distance in DISTANCES}


def _assert_identical(actual: Any, expected: dict[str, Tensor], label: str) -> None:
    assert isinstance(actual, dict) and "error" not in actual, f"{label}: {actual}"
    assert list(actual) == list(expected), label
    for key, value in expected.items():
        assert torch.equal(actual[key], value), f"{label} {key}: {actual[key]} != {value}"


def test_trials_cross_ranks() -> None:
    """The uneven shards put many trials' two samples on different ranks (what the exchange of rows is for)."""
    data = _data()
    order = torch.randperm(N, generator=torch.Generator().manual_seed(3))
    for world_size in (2, 3):
        owner_of_position = torch.repeat_interleave(torch.arange(world_size), torch.tensor(UNEVEN[world_size]))
        owner = torch.empty(N, dtype=torch.long)
        owner[order] = owner_of_position
        crossing = owner[data["rows"][0]] != owner[data["rows"][1]]
        assert int(crossing.sum()) >= T // 4, world_size


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_identical_to_one_process(world_size: int, tmp_path: Path, single_process: dict[str, Any]) -> None:
    ranks = run_distributed(_scenarios, world_size, tmp_path)
    data = _data()
    x = data["x"].clone()
    x[-1] = 0
    with pytest.raises(ValueError) as raised:
        trial_metrics(x, (*data["rows"], data["trials"][2]), **OPTIONS)
    zero_error = {"error": str(raised.value)}
    for rank, out in enumerate(ranks):
        for distance in DISTANCES:
            for scenario in ("sampler", "uneven", "empty_rank", "gather"):
                label = f"world_size={world_size} rank={rank} {distance}/{scenario}"
                _assert_identical(out[f"{distance}/{scenario}"], single_process[distance], label)
        assert "which no process passed to update()" in out["missing"]["error"], out["missing"]
        assert out["missing/kept"]
        _assert_identical(out["missing/then"], single_process["cosine"], f"world_size={world_size} missing/then")
        assert out["dims/kept"]
        if world_size > 1:
            assert "`embeddings` must have the same trailing shape and dtype on every process" in out["dims"]["error"]
        # the rank holding the row raises the one-process error, the others a ValueError naming `embeddings` too
        other = {"error": "`embeddings` of 1 other process(es) failed the checks of the rows."}
        assert out["zero"] == (zero_error if rank == (N - 1) % world_size else other), out["zero"]
        # sharded: sampler, uneven and empty_rank per distance, the missing index twice, the widths, the zero row
        assert out["sharded_calls"] == (0 if world_size == 1 else 3 * len(DISTANCES) + 4)
    if world_size > 1:  # rows crossed ranks in the sampler and uneven runs (the empty rank's on 2: all on one)
        per_run = [sum(runs) for runs in zip(*(out["received"] for out in ranks), strict=True)]
        assert len(per_run) == 3 * len(DISTANCES) + 1, per_run  # the widths' error comes before the exchange
        assert all(per_run[3 * d + s] > 0 for d in range(len(DISTANCES)) for s in (0, 1)), per_run
