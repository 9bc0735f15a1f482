"""FNMRAtFMR, PCF and ContrastiveAccuracy across real processes (gloo on CPU): results identical to one process.

One spawn per world size runs every scenario for the three classes; each rank returns what it computed,
and every rank of every world size must give bit-identical values to the functional core on the whole
data set in one process: DistributedSampler padding (duplicates dropped by ``indexes``), uneven shards,
an empty rank, and PCF's streamed sums as well as its kept rows.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import Tensor
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

from tests.metrics._distributed import run_distributed
from tests.metrics._helpers import make_data, outcome
from torchmetrics_retrieval.functional.contrastive import contrastive_accuracy
from torchmetrics_retrieval.functional.topology import pcf
from torchmetrics_retrieval.functional.verification import fnmr_at_fmr
from torchmetrics_retrieval.metrics.contrastive import ContrastiveAccuracy
from torchmetrics_retrieval.metrics.topology import PCF
from torchmetrics_retrieval.metrics.verification import FNMRAtFMR

N = 29  # not a multiple of 2 or 3: DistributedSampler pads with duplicates
FMRS = (0.05, 0.3, 0.5)
FRACTIONS = (0.3, 0.6, 0.9)
TOP_K = (1, 3)
#: rows of each rank, by world size: uneven shards, and shards with an empty rank
UNEVEN = {1: [N], 2: [20, 9], 3: [3, 19, 7]}
WITH_EMPTY = {1: [N], 2: [0, N], 3: [17, 0, 12]}

Factory = Callable[[], Any]


def _data() -> dict[str, Tensor]:
    base = make_data(n=N, seed=31)  # small-integer embeddings: exact distances, many ties
    g = torch.Generator().manual_seed(5)
    z1 = torch.randint(-2, 3, (N, 3), generator=g).float() + 0.5
    return {
        "embeddings": base["embeddings"],
        "labels": base["labels"],
        "is_query": base["is_query"],
        "sequence_ids": base["sequence_ids"],
        "features": torch.randn(N, 6, generator=g) @ torch.randn(6, 6, generator=g),
        "z1": z1,
        "z2": z1 + torch.randint(-1, 2, (N, 3), generator=g).float(),
    }


#: per class: the factory and which data fields go to update() under which name
CLASSES: dict[str, tuple[Factory, dict[str, str]]] = {
    "fnmr": (
        lambda: FNMRAtFMR(fmr_vals=FMRS, eer=True, min_dcf_p_target=(0.05, 0.5), roc_auc=True),
        {"embeddings": "embeddings", "labels": "labels", "is_query": "is_query", "sequence_ids": "sequence_ids"},
    ),
    "pcf": (lambda: PCF(pcf_variance=FRACTIONS), {"features": "embeddings"}),
    "contrastive": (lambda: ContrastiveAccuracy(top_k=TOP_K), {"z1": "z1", "z2": "z2"}),
}


def _update(metric: Any, fields: dict[str, str], data: dict[str, Tensor], rows: Tensor, indexes: bool) -> None:
    metric.update(**{arg: data[name][rows] for name, arg in fields.items()}, indexes=rows if indexes else None)


def _by_sampler(rank: int, world_size: int, name: str, data: dict[str, Tensor]) -> Any:
    """DistributedSampler (shuffled, padded with duplicates) and a DataLoader; indexes given."""
    factory, fields = CLASSES[name]
    dataset = TensorDataset(torch.arange(N))
    sampler: DistributedSampler[Any] = DistributedSampler(
        dataset, num_replicas=world_size, rank=rank, shuffle=True, seed=3, drop_last=False
    )
    metric = factory()
    for rows in DataLoader(dataset, batch_size=4, sampler=sampler):
        _update(metric, fields, data, rows[0], indexes=True)
    return metric


def _by_shards(rank: int, sizes: list[int], name: str, data: dict[str, Tensor], *, indexes: bool) -> Any:
    """Rank r holds rows [sum(sizes[:r]), sum(sizes[:r+1])) in batches of 5 (an empty shard: one zero-row batch)."""
    factory, fields = CLASSES[name]
    start = sum(sizes[:rank])
    rows = torch.arange(start, start + sizes[rank])
    metric = factory()
    for batch in rows.split(5) if rows.numel() else [rows]:
        _update(metric, fields, data, batch, indexes=indexes)
    return metric


#: The sharded path of each class (module, function), looked up at call time by its ``compute``: counting its calls
#: shows that it ran (a fallback to gathering would give the same numbers).
SHARDED_PATHS = {
    "fnmr": ("torchmetrics_retrieval.metrics._sharded.pairs", "sharded_pair_compute"),
    "contrastive": ("torchmetrics_retrieval.metrics._sharded.contrastive", "sharded_contrastive"),
}


def _count_sharded_calls() -> dict[str, list[int]]:
    calls: dict[str, list[int]] = {}
    for name, (module_name, function) in SHARDED_PATHS.items():
        module = importlib.import_module(module_name)
        original, calls[name] = getattr(module, function), []
        setattr(module, function, lambda *args, _o=original, _c=calls[name]: _c.append(1) or _o(*args))
    return calls


def _scenarios(rank: int, world_size: int) -> dict[str, Any]:
    data = _data()
    outcomes: dict[str, Any] = {}
    calls = _count_sharded_calls()
    for name in CLASSES:
        outcomes[f"{name}/sampler"] = outcome(_by_sampler(rank, world_size, name, data))
        outcomes[f"{name}/uneven"] = outcome(_by_shards(rank, UNEVEN[world_size], name, data, indexes=True))
        outcomes[f"{name}/empty_rank"] = outcome(_by_shards(rank, WITH_EMPTY[world_size], name, data, indexes=True))
        # without indexes, contiguous shards in rank order are the whole set once (PCF: the streamed sums)
        outcomes[f"{name}/no_indexes"] = outcome(_by_shards(rank, WITH_EMPTY[world_size], name, data, indexes=False))
        outcomes[f"{name}/nothing"] = outcome(CLASSES[name][0]())
    if world_size > 1:  # PCF: rank 0 keeps rows, the others stream sums -> the same error everywhere, no hang
        metric = _by_shards(rank, UNEVEN[world_size], "pcf", data, indexes=rank == 0)
        outcomes["pcf/mixed"] = outcome(metric)
        metric.update(data["features"][:2], indexes=torch.arange(2) if rank == 0 else None)  # still usable
        outcomes["pcf/mixed_local_count"] = int(metric.count) + sum(t.shape[0] for t in metric.embeddings)
        dims = PCF()  # streamed sums of different dimensions
        dims.update(torch.randn(3, 4 + rank))
        outcomes["pcf/dims"] = outcome(dims)
    outcomes["sharded_calls"] = {name: len(count) for name, count in calls.items()}
    return outcomes


@pytest.fixture(scope="module")
def single_process() -> dict[str, Any]:
    data = _data()
    values = pcf(data["features"], pcf_variance=FRACTIONS)
    return {
        "fnmr": fnmr_at_fmr(
            data["embeddings"],
            data["labels"],
            is_query=data["is_query"],
            sequence_ids=data["sequence_ids"],
            fmr_vals=FMRS,
            eer=True,
            min_dcf_p_target=(0.05, 0.5),
            roc_auc=True,
        ),
        "pcf": {f"pcf/{r}": values[i] for i, r in enumerate(FRACTIONS)},
        "contrastive": contrastive_accuracy(data["z1"], data["z2"], top_k=TOP_K),
    }


def _assert_identical(actual: Any, expected: dict[str, Tensor], label: str) -> None:
    assert isinstance(actual, dict) and "error" not in actual, f"{label}: {actual}"
    assert list(actual) == list(expected), label
    for key, value in expected.items():
        torch.testing.assert_close(actual[key], value, rtol=0, atol=0, msg=f"{label} {key}")


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 3])
def test_identical_to_one_process(world_size: int, tmp_path: Path, single_process: dict[str, Any]) -> None:
    ranks = run_distributed(_scenarios, world_size, tmp_path)
    for rank, outcomes in enumerate(ranks):
        for name in CLASSES:
            for scenario in ("sampler", "uneven", "empty_rank", "no_indexes"):
                label = f"world_size={world_size} rank={rank} {name}/{scenario}"
                _assert_identical(outcomes[f"{name}/{scenario}"], single_process[name], label)
            error = outcomes[f"{name}/nothing"]["error"]
            assert "at least 2 samples" in error if name == "pcf" else "at least one sample" in error
        assert "`indexes` must be given on every process or on none" in outcomes["pcf/mixed"]["error"]
        assert outcomes["pcf/mixed_local_count"] == UNEVEN[world_size][rank] + 2
        assert "`embeddings` must have the same number of columns on every process" in outcomes["pcf/dims"]["error"]
        # the four scenarios with samples ran sharded (the one without any sample raises before the search)
        assert outcomes["sharded_calls"] == {"fnmr": 5, "contrastive": 5}, outcomes["sharded_calls"]
