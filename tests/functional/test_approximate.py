"""``retrieval_metrics(..., approximate_index=...)``: approximate metrics on a faiss index and their exact audit.

The oracles: the same faiss index built here, its lists scored by ``retrieval_metrics(neighbours=...)``, and the
exact evaluation of the same queries: the audit's deltas are the difference of those two runs, its recalls faiss's
own measures, its intervals those of ``compare_models`` on the same per-query values."""

from __future__ import annotations

import faiss
import numpy as np
import pytest
import torch
from faiss.contrib.evaluation import knn_intersection_measure

from torchmetrics_retrieval import EmbeddingMetrics
from torchmetrics_retrieval.functional import compare_models, retrieval_metrics

OPTIONS = {"cmc_top_k": (1, 5), "precision_top_k": (5,), "map_top_k": (5,), "recall_top_k": (10,), "mrr": True}
DEPTH = 10  # the largest cutoff
INDEX, PARAMS = "IVF16,Flat", "nprobe=2"


@pytest.fixture(scope="module")
def data() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    centres = torch.randn(40, 16, generator=g) * 2
    labels = torch.randint(0, 40, (3000,), generator=g)
    x = centres[labels] + torch.randn(3000, 16, generator=g)
    return x[:600], labels[:600], x[600:], labels[600:]


def _faiss_lists(query: torch.Tensor, gallery: torch.Tensor, k: int) -> np.ndarray:
    index = faiss.index_factory(gallery.shape[1], INDEX)
    index.train(gallery.numpy())
    index.add(gallery.numpy())
    faiss.ParameterSpace().set_index_parameters(index, PARAMS)
    return index.search(query.numpy(), k)[1]


def _paired_runs(query, labels, gallery, gallery_labels, lists) -> tuple[dict, dict]:
    approx, a = retrieval_metrics(
        query, labels, gallery, gallery_labels, neighbours=torch.from_numpy(lists), return_per_query=True, **OPTIONS
    )
    exact, e = retrieval_metrics(query, labels, gallery, gallery_labels, return_per_query=True, **OPTIONS)
    return {"approx": approx, "exact": exact}, {"approx": a, "exact": e}


def test_every_query_audited_equals_two_runs(data) -> None:
    query, labels, gallery, gallery_labels = data
    result = retrieval_metrics(
        query, labels, gallery, gallery_labels, approximate_index=INDEX, approximate_params=PARAMS, **OPTIONS
    )
    lists = _faiss_lists(query, gallery, DEPTH)
    runs, per_query = _paired_runs(query, labels, gallery, gallery_labels, lists)
    ranking_keys = set(runs["exact"])
    assert {key for key in result if key.startswith("approx/")} == {f"approx/{key}" for key in ranking_keys}
    assert not ranking_keys & set(result)  # no ranking key without its prefix: approximate and exact never mix
    assert float(result["audit/queries"]) == 600
    for key in ranking_keys:
        assert float(result[f"approx/{key}"]) == pytest.approx(float(runs["approx"][key]), abs=1e-6), key
        assert float(result[f"audit/{key}/exact"]) == pytest.approx(float(runs["exact"][key]), abs=1e-6), key
        delta = float(runs["approx"][key]) - float(runs["exact"][key])
        assert float(result[f"audit/{key}/delta"]) == pytest.approx(delta, abs=1e-6), key
        paired = compare_models(per_query["exact"].values[key], per_query["approx"].values[key], n_resamples=1000)
        assert float(result[f"audit/{key}/ci_low"]) == pytest.approx(float(paired["ci_low"]), abs=1e-6), key
        assert float(result[f"audit/{key}/ci_high"]) == pytest.approx(float(paired["ci_high"]), abs=1e-6), key
    assert 0 < float(result["audit/recall@10"]) < 1  # a real approximation, which costs some metric
    assert min(float(result[f"audit/{key}/delta"]) for key in ranking_keys) < 0
    flat = faiss.IndexFlatL2(16)
    flat.add(gallery.numpy())
    exact_lists = flat.search(query.numpy(), DEPTH)[1]
    recall = knn_intersection_measure(lists, exact_lists)
    assert float(result[f"audit/recall@{DEPTH}"]) == pytest.approx(recall, abs=1e-12)


def test_a_sample_of_the_queries(data) -> None:
    query, labels, gallery, gallery_labels = data
    result = retrieval_metrics(
        query, labels, gallery, gallery_labels, approximate_index=INDEX, approximate_params=PARAMS,
        audit_queries=200, seed=7, **OPTIONS,
    )  # fmt: skip
    # the sample as documented: the first 200 of a permutation drawn by a CPU generator seeded with ``seed``
    sample = torch.randperm(600, generator=torch.Generator().manual_seed(7))[:200].sort().values
    lists = _faiss_lists(query, gallery, DEPTH)
    runs, _ = _paired_runs(query[sample], labels[sample], gallery, gallery_labels, lists[sample.numpy()])
    assert float(result["audit/queries"]) == 200
    for key in runs["exact"]:
        delta = float(runs["approx"][key]) - float(runs["exact"][key])
        assert float(result[f"audit/{key}/delta"]) == pytest.approx(delta, abs=1e-6), key
    # the approximate metrics are over every query
    every, _ = _paired_runs(query, labels, gallery, gallery_labels, lists)
    assert float(result["approx/cmc/1"]) == pytest.approx(float(every["approx"]["cmc/1"]), abs=1e-6)


def test_leave_one_out_drops_the_query_itself(data) -> None:
    x, labels = data[2][:800], data[3][:800]
    result = retrieval_metrics(x, labels, approximate_index="Flat", **OPTIONS)
    exact = retrieval_metrics(x, labels, **OPTIONS)
    for key in ("cmc/1", "cmc/5", "precision/5", "map/5", "recall/10"):
        # a flat index is exact (up to float32 near-ties, none in continuous data): no delta at all
        assert float(result[f"approx/{key}"]) == pytest.approx(float(exact[key]), abs=1e-6), key
        assert float(result[f"audit/{key}/delta"]) == pytest.approx(0.0, abs=1e-6), key
    assert float(result[f"audit/recall@{DEPTH}"]) == 1.0
    assert float(result["audit/missing_rate"]) == 0.0
    # mrr of a list is within the list: beyond 10 the exact one still counts, so the delta is <= 0
    assert float(result["audit/mrr/delta"]) <= 0.0


def test_pair_metrics_stay_exact(data) -> None:
    x, labels = data[2][:300], data[3][:300]
    result = retrieval_metrics(x, labels, approximate_index="Flat", eer=True, cmc_top_k=(1,), precision_top_k=())
    assert float(result["eer"]) == float(retrieval_metrics(x, labels, eer=True)["eer"])


def test_embedding_metrics_takes_the_option(data) -> None:
    x, labels = data[2][:500], data[3][:500]
    metric = EmbeddingMetrics(approximate_index=INDEX, approximate_params=PARAMS, audit_queries=100, **OPTIONS)
    metric.update(x[:250], labels[:250])
    metric.update(x[250:], labels[250:])
    expected = retrieval_metrics(
        x, labels, approximate_index=INDEX, approximate_params=PARAMS, audit_queries=100, **OPTIONS
    )
    computed = metric.compute()
    assert computed.keys() == expected.keys()
    for key, value in expected.items():
        assert float(computed[key]) == pytest.approx(float(value), abs=1e-6, nan_ok=True), key


@pytest.mark.parametrize(
    ("options", "name"),
    [
        ({"approximate_index": "IVF16,Nonsense"}, "approximate_index"),
        ({"approximate_index": "PQ5"}, "approximate_index"),  # 16 dimensions are not split in 5 parts
        ({"approximate_index": INDEX, "approximate_params": "nprobee=2"}, "approximate_params"),
        ({"approximate_index": INDEX, "map_full": True}, "approximate_index"),
    ],
)
def test_bad_index_is_named(data, options: dict, name: str) -> None:
    x, labels = data[2][:300], data[3][:300]
    with pytest.raises(ValueError, match=f"`{name}`"):
        retrieval_metrics(x, labels, **options)
