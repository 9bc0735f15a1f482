"""QrelsMetrics against qrels_metrics on the same rows: any batch split, either side first, duplicated rows."""

from __future__ import annotations

from typing import Any

import pytest
import torch

from torchmetrics_retrieval import QrelsMetrics
from torchmetrics_retrieval.functional import qrels_metrics

OPTIONS: dict[str, Any] = {
    "ndcg_top_k": (1, 5),
    "map_top_k": 5,
    "recall_top_k": 5,
    "precision_top_k": 3,
    "mrr": True,
    "r_precision": True,
}


def data(seed: int = 0) -> dict[str, Any]:
    """Small-integer embeddings (exact scores, ties) with integer ids, graded qrels."""
    g = torch.Generator().manual_seed(seed)
    query, corpus = torch.randint(0, 3, (12, 3), generator=g).float(), torch.randint(0, 3, (40, 3), generator=g).float()
    query_ids, corpus_ids = 500 + 3 * torch.arange(12), 7 * torch.arange(40)
    qrels = {
        str(int(q)): {str(int(corpus_ids[j])): int(torch.randint(0, 4, (), generator=g)) for j in range(i, 40, 9)}
        for i, q in enumerate(query_ids[:-1])  # the last query has no judgement
    }
    return {"query": query, "query_ids": query_ids, "corpus": corpus, "corpus_ids": corpus_ids, "qrels": qrels}


@pytest.mark.parametrize("ties", ["position", "trec_eval", "expected"])
def test_class_equals_functional_in_any_batches(ties: str) -> None:
    d = data()
    expected = qrels_metrics(
        d["query"], d["query_ids"], d["corpus"], d["corpus_ids"], d["qrels"], ties=ties, distance="dot", **OPTIONS
    )
    metric = QrelsMetrics(d["qrels"], ties=ties, distance="dot", **OPTIONS)
    # the corpus first in reverse id order and in uneven batches, queries interleaved, one duplicated batch:
    # with ties, the corpus order matters, and the class orders rows by id (here the ids ascend with position)
    order = torch.arange(40).flip(0)
    for i, rows in enumerate(order.split(13)):
        metric.update(corpus=d["corpus"][rows], corpus_ids=d["corpus_ids"][rows])
        if i < 3:
            q = torch.arange(i, 12, 3)
            metric.update(query=d["query"][q], query_ids=d["query_ids"][q])
    metric.update(corpus=d["corpus"][:5], corpus_ids=d["corpus_ids"][:5])  # seen again: counted once
    got = metric.compute()
    assert list(got) == list(expected)
    for key, value in expected.items():
        assert torch.equal(got[key], value), key


def test_prefix_reset_and_errors() -> None:
    d = data()
    metric = QrelsMetrics(d["qrels"], prefix="val/", mrr=True)
    metric.update(d["query"], d["query_ids"], d["corpus"], d["corpus_ids"])
    assert all(key.startswith("val/") for key in metric.compute())
    metric.reset()
    with pytest.raises(ValueError, match="`query`"):
        metric.compute()
    with pytest.raises(ValueError, match="`corpus`"):
        metric.update(corpus=d["corpus"])
    with pytest.raises(ValueError, match="`ties`"):
        QrelsMetrics(d["qrels"], ties="random")
    with pytest.raises(ValueError, match="`qrels`"):
        QrelsMetrics({"a": {"b": -1}})
