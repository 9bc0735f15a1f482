"""QrelsMetrics across real processes (gloo on CPU): values identical (``torch.equal``) to one process, with
DistributedSampler padding (duplicated rows), uneven shards and an empty rank."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from tests.metrics._distributed import run_distributed, sampler_rows
from tests.metrics._helpers import outcome
from tests.metrics.test_qrels_metrics import OPTIONS, data
from torchmetrics_retrieval import QrelsMetrics
from torchmetrics_retrieval.functional import qrels_metrics

UNEVEN = {1: [40], 2: [29, 11], 3: [3, 0, 37]}  # corpus rows per rank (with an empty rank on 3)
TIES = ("position", "expected")


def _scenarios(rank: int, world_size: int) -> dict[str, Any]:
    d = data()
    out: dict[str, Any] = {}
    for ties in TIES:
        padded = QrelsMetrics(d["qrels"], ties=ties, distance="dot", **OPTIONS)
        for rows in sampler_rows(40, rank, world_size, seed=1).split(4):
            padded.update(corpus=d["corpus"][rows], corpus_ids=d["corpus_ids"][rows])
        q = sampler_rows(12, rank, world_size, seed=2)
        padded.update(query=d["query"][q], query_ids=d["query_ids"][q])
        out[f"{ties}/sampler"] = outcome(padded)
        uneven = QrelsMetrics(d["qrels"], ties=ties, distance="dot", **OPTIONS)
        start = sum(UNEVEN[world_size][:rank])
        rows = torch.arange(start, start + UNEVEN[world_size][rank])
        if rows.numel():
            uneven.update(corpus=d["corpus"][rows], corpus_ids=d["corpus_ids"][rows])
        if rank == world_size - 1:  # every query on the last rank
            uneven.update(query=d["query"], query_ids=d["query_ids"])
        out[f"{ties}/uneven"] = outcome(uneven)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_identical_to_one_process(world_size: int, tmp_path: Path) -> None:
    d = data()
    ranks = run_distributed(_scenarios, world_size, tmp_path)
    for ties in TIES:
        expected = qrels_metrics(
            d["query"], d["query_ids"], d["corpus"], d["corpus_ids"], d["qrels"], ties=ties, distance="dot", **OPTIONS
        )
        for rank, out in enumerate(ranks):
            for scenario in ("sampler", "uneven"):
                got = out[f"{ties}/{scenario}"]
                assert isinstance(got, dict) and "error" not in got, (rank, scenario, got)
                assert list(got) == list(expected)
                for key, value in expected.items():
                    assert torch.equal(got[key], value), (world_size, rank, ties, scenario, key)
