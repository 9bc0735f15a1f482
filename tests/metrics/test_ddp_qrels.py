"""QrelsMetrics across real processes (gloo on CPU): values identical (``torch.equal``) to one process, with
DistributedSampler padding (duplicated rows), uneven shards and an empty rank, sharded (the default) and gathered."""

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
from torchmetrics_retrieval.metrics._sharded import qrels as sharded

UNEVEN = {1: [40], 2: [29, 11], 3: [3, 0, 37]}  # corpus rows per rank (with an empty rank on 3)
TIES = ("position", "trec_eval", "expected")
#: cosine with the queries' own documents in the corpus, left out (BEIR's rule)
IDENTICAL: dict[str, Any] = {"distance": "cosine", "ignore_identical_ids": True}


def _identical_data() -> dict[str, Any]:
    """``data()`` whose query ids are ids of corpus documents (and the qrels keyed by them); no zero row."""
    d = data()
    new_ids = d["corpus_ids"][torch.arange(0, 36, 3)]
    rename = {str(int(old)): str(int(new)) for old, new in zip(d["query_ids"], new_ids, strict=True)}
    qrels = {rename[q]: docs for q, docs in d["qrels"].items()}
    return {**d, "query": d["query"] + 1, "corpus": d["corpus"] + 1, "query_ids": new_ids, "qrels": qrels}


def _cases() -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """``(name, data, options)``: dot-product ties under every tie rule, and cosine with identical ids."""
    d = data()
    cases = [(ties, d, {"ties": ties, "distance": "dot", **OPTIONS}) for ties in TIES]
    cases += [(f"identical/{ties}", _identical_data(), {"ties": ties, **IDENTICAL, **OPTIONS}) for ties in TIES]
    return cases


def _scenarios(rank: int, world_size: int) -> dict[str, Any]:
    out: dict[str, Any] = {}
    seen_rows: list[int] = []
    original = sharded.BlockedCorpus

    def recording(query: Any, corpus: Any, *args: Any) -> Any:  # the corpus rows this rank searches
        seen_rows.append(corpus.shape[0])
        return original(query, corpus, *args)

    sharded.BlockedCorpus = recording  # type: ignore[assignment,misc]
    try:
        for name, d, options in _cases():
            for mode in ("shard", "gather"):
                padded = QrelsMetrics(d["qrels"], distributed=mode, **options)
                for rows in sampler_rows(40, rank, world_size, seed=1).split(4):
                    padded.update(corpus=d["corpus"][rows], corpus_ids=d["corpus_ids"][rows])
                q = sampler_rows(12, rank, world_size, seed=2)
                padded.update(query=d["query"][q], query_ids=d["query_ids"][q])
                out[f"{name}/{mode}/sampler"] = outcome(padded)
            uneven = QrelsMetrics(d["qrels"], **options)
            start = sum(UNEVEN[world_size][:rank])
            rows = torch.arange(start, start + UNEVEN[world_size][rank])
            if rows.numel():
                uneven.update(corpus=d["corpus"][rows], corpus_ids=d["corpus_ids"][rows])
            if rank == world_size - 1:  # every query on the last rank
                uneven.update(query=d["query"], query_ids=d["query_ids"])
            out[f"{name}/shard/uneven"] = outcome(uneven)
    finally:
        sharded.BlockedCorpus = original  # type: ignore[misc]
    out["seen_rows"] = seen_rows
    return out


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_identical_to_one_process(world_size: int, tmp_path: Path) -> None:
    ranks = run_distributed(_scenarios, world_size, tmp_path)
    for name, d, options in _cases():
        expected = qrels_metrics(d["query"], d["query_ids"], d["corpus"], d["corpus_ids"], d["qrels"], **options)
        for rank, out in enumerate(ranks):
            for scenario in ("shard/sampler", "gather/sampler", "shard/uneven"):
                got = out[f"{name}/{scenario}"]
                assert isinstance(got, dict) and "error" not in got, (rank, name, scenario, got)
                assert list(got) == list(expected)
                for key, value in expected.items():
                    assert torch.equal(got[key], value), (world_size, rank, name, scenario, key)
    seen = [out["seen_rows"] for out in ranks]
    if world_size == 1:  # one process: the sharded path is not taken
        assert seen == [[]]
        return
    # the sharded searches: per case the sampler scenario, then the uneven one; the shards of the de-duplicated
    # corpus are disjoint, so no rank searches the whole corpus and the rows add up to it
    for case in range(len(_cases())):
        sampler = [rows[2 * case] for rows in seen]
        uneven = [rows[2 * case + 1] for rows in seen]
        assert sum(sampler) == 40 and max(sampler) < 40, sampler
        assert uneven == UNEVEN[world_size], uneven
