"""EmbeddingMetrics with ``approximate_index`` across real processes (gloo on CPU): the index is built on the gathered
gallery, so every rank of every world size reports what one process reports on the whole set."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.metrics._distributed import run_distributed
from torchmetrics_retrieval.functional import retrieval_metrics
from torchmetrics_retrieval.metrics import EmbeddingMetrics

N = 301  # not a multiple of 2: uneven shards
OPTIONS: dict[str, Any] = {
    "cmc_top_k": (1, 5),
    "map_top_k": (5,),
    "approximate_index": "IVF8,Flat",
    "approximate_params": "nprobe=2",
    "audit_queries": 100,
    "n_bootstrap": 50,
}


def _data() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    labels = torch.randint(0, 10, (N,), generator=g)
    return torch.randn(10, 8, generator=g)[labels] + torch.randn(N, 8, generator=g), labels


def _scenario(rank: int, world_size: int) -> dict[str, Any]:
    x, labels = _data()
    rows = torch.arange(rank, N, world_size)  # interleaved shards: the indexes put the set back in order
    metric = EmbeddingMetrics(**OPTIONS)
    metric.update(x[rows], labels[rows], indexes=rows)
    return metric.compute()


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2])
def test_same_as_one_process(world_size: int, tmp_path: Path) -> None:
    x, labels = _data()
    expected = retrieval_metrics(x, labels, **OPTIONS)
    for values in run_distributed(_scenario, world_size, tmp_path):
        assert values.keys() == expected.keys()
        for key, value in expected.items():
            assert float(values[key]) == pytest.approx(float(value), abs=1e-6), key
