"""``audit_neighbours``: against faiss's own measures on real faiss indexes, and against a slow reference written
here (a Python loop over queries, numpy distances) on small data with ties, duplicates and -1 slots."""

from __future__ import annotations

import faiss
import numpy as np
import pytest
import torch
from faiss.contrib.evaluation import knn_intersection_measure

from torchmetrics_retrieval.functional import audit_neighbours

K = 10


@pytest.fixture(scope="module")
def faiss_data() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """20k x 64 gallery, 5k queries (continuous Gaussian: no ties), and faiss's exact top K."""
    rng = np.random.default_rng(0)
    gallery = rng.standard_normal((20_000, 64)).astype(np.float32)
    query = rng.standard_normal((5_000, 64)).astype(np.float32)
    flat = faiss.IndexFlatL2(64)
    flat.add(gallery)
    return query, gallery, flat.search(query, K)[1]


def _approximate(name: str, query: np.ndarray, gallery: np.ndarray) -> np.ndarray:
    threads = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)  # faiss's graph build is not deterministic across threads; results are then fixed
    try:
        index = faiss.index_factory(64, name)
        index.train(gallery)
        index.add(gallery)
        if name.startswith("IVF"):
            faiss.extract_index_ivf(index).nprobe = 4
        else:
            index.hnsw.efSearch = 16
        return index.search(query, K)[1]
    finally:
        faiss.omp_set_num_threads(threads)


@pytest.mark.parametrize("name", ["IVF64,Flat", "HNSW16", "IVF64,PQ16x4"])
def test_recall_is_faiss_intersection_measure(faiss_data, name: str) -> None:
    query, gallery, exact = faiss_data
    approx = _approximate(name, query, gallery)
    metrics = audit_neighbours(torch.from_numpy(query), torch.from_numpy(gallery), neighbours=torch.from_numpy(approx))
    expected = knn_intersection_measure(approx, exact)
    assert 0.05 < expected < 0.999  # a real approximation (PQ16x4 on Gaussian data is coarse), not exact
    assert abs(float(metrics[f"recall@{K}"]) - expected) <= 1e-12
    # faiss's "1-recall@k" as its benchmarks compute it
    one_recall = (approx == exact[:, :1]).sum() / len(query)
    assert abs(float(metrics[f"recall_1@{K}"]) - one_recall) <= 1e-12
    # no ties in continuous data: an item as near as the k-th is one of the top k
    assert abs(float(metrics[f"tie_recall@{K}"]) - expected) <= 1e-12
    assert float(metrics["missing_rate"]) == float((approx < 0).mean())


def test_flat_index_scores_one(faiss_data) -> None:
    query, gallery, exact = faiss_data
    metrics = audit_neighbours(
        torch.from_numpy(query[:500]), torch.from_numpy(gallery), neighbours=torch.from_numpy(exact[:500])
    )
    assert {key: float(v) for key, v in metrics.items()} == {
        f"recall@{K}": 1.0,
        f"recall_1@{K}": 1.0,
        f"tie_recall@{K}": 1.0,
        "duplicate_rate": 0.0,
        "missing_rate": 0.0,
    }


def test_a_row_repeating_one_id() -> None:
    x = torch.tensor([[0.0], [1.0], [2.0], [3.0], [4.0], [5.0]])
    k = 4
    nearest = torch.tensor([1, 0, 1, 2, 3, 4])  # leave-one-out nearest (ties by position)
    metrics, per_query = audit_neighbours(x, neighbours=nearest[:, None].repeat(1, k), return_per_query=True)
    assert per_query[f"recall@{k}"].tolist() == [1 / k] * 6
    assert per_query["duplicate_rate"].tolist() == [(k - 1) / k] * 6
    assert per_query[f"recall_1@{k}"].tolist() == [1.0] * 6
    assert float(metrics["missing_rate"]) == 0.0


def test_the_other_copy_of_a_duplicate() -> None:
    # items 0 and 1 are copies, 2 and 3 are copies; the exact top 1 of query 4 (at 0.1) is item 0 (by position)
    gallery = torch.tensor([[0.0, 0.0], [0.0, 0.0], [5.0, 5.0], [5.0, 5.0]])
    query = torch.tensor([[0.1, 0.0], [5.0, 5.1]])
    other_copy = torch.tensor([[1], [3]])  # the exact ones are [0] and [2]
    metrics = audit_neighbours(query, gallery, neighbours=other_copy)
    assert float(metrics["tie_recall@1"]) == 1.0
    assert float(metrics["recall@1"]) == 0.0 < 1.0
    assert float(metrics["recall_1@1"]) == 0.0


def test_missing_results() -> None:
    x = torch.tensor([[0.0], [1.0], [2.0], [4.0]])
    table = torch.tensor([[-1, -1, -1], [0, -1, -1], [1, 3, -1], [2, 1, 0]])
    metrics, per_query = audit_neighbours(x, neighbours=table, return_per_query=True)
    # exact leave-one-out top 3 of each query: every other item
    assert per_query["missing_rate"].tolist() == [1.0, 2 / 3, 1 / 3, 0.0]
    assert per_query["recall@3"].tolist() == [0.0, 1 / 3, 2 / 3, 1.0]
    assert per_query["duplicate_rate"].tolist() == [0.0] * 4
    assert float(metrics["missing_rate"]) == pytest.approx((1 + 2 / 3 + 1 / 3) / 4, abs=1e-15)


def test_k_scores_the_first_columns() -> None:
    x = torch.tensor([[0.0], [1.0], [2.0], [4.0]])
    table = torch.tensor([[1, 3, 2], [0, 2, 3], [1, 3, 0], [2, 1, 0]])
    full = audit_neighbours(x, neighbours=table[:, :2])
    assert {key: float(v) for key, v in audit_neighbours(x, neighbours=table, k=2).items()} == {
        key: float(v) for key, v in full.items()
    }


def _reference(query: np.ndarray, gallery: np.ndarray, table: np.ndarray, k: int, loo: bool) -> dict[str, list]:
    """Slow per-query reference in float64 numpy: the definitions of the module, written out."""
    out: dict[str, list] = {f"recall@{k}": [], f"recall_1@{k}": [], f"tie_recall@{k}": [], "duplicate_rate": []}
    out["missing_rate"] = []
    for q in range(len(query)):
        d = np.sqrt(((gallery.astype(np.float64) - query[q].astype(np.float64)) ** 2).sum(1))
        eligible = [g for g in range(len(gallery)) if not (loo and g == q)]
        ranked = sorted(eligible, key=lambda g: (d[g], g))
        top = ranked[:k]
        row = [int(i) for i in table[q, :k]]
        ids = {i for i in row if i >= 0}
        if not top:
            recall = recall_1 = tie = 1.0
        else:
            recall = len(ids & set(top)) / len(top)
            recall_1 = float(top[0] in ids)
            tie = len([i for i in ids if i in eligible and d[i] <= d[top[-1]]]) / len(top)
        out[f"recall@{k}"].append(recall)
        out[f"recall_1@{k}"].append(recall_1)
        out[f"tie_recall@{k}"].append(tie)
        out["duplicate_rate"].append((sum(i >= 0 for i in row) - len(ids)) / k)
        out["missing_rate"].append(sum(i < 0 for i in row) / k)
    return out


@pytest.mark.parametrize("loo", [True, False])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_against_a_slow_reference(loo: bool, seed: int) -> None:
    rng = np.random.default_rng(seed)
    gallery = rng.integers(0, 3, size=(40, 2)).astype(np.float32)  # small integer grid: many ties and copies
    query = gallery if loo else rng.integers(0, 3, size=(25, 2)).astype(np.float32)
    k = 5
    table = rng.integers(-1, len(gallery), size=(len(query), 7))  # random lists: -1, repeats, the query itself
    _, per_query = audit_neighbours(
        torch.from_numpy(query),
        None if loo else torch.from_numpy(gallery),
        neighbours=torch.from_numpy(table),
        k=k,
        return_per_query=True,
    )
    expected = _reference(query, gallery, table, k, loo)
    assert set(per_query) == set(expected)
    for key, values in expected.items():
        np.testing.assert_allclose(per_query[key].numpy(), values, rtol=0, atol=1e-15, err_msg=key)
    assert 0 < float(per_query[f"tie_recall@{k}"].sum() - per_query[f"recall@{k}"].sum())  # the ties matter here


def test_exclusions_apply() -> None:
    # items 0, 1 share a sequence with query 0; only items 2 and 3 are in its gallery
    x = torch.tensor([[0.0], [0.5], [2.0], [3.0]])
    seq = torch.tensor([0, 0, 1, 2])
    _, per_query = audit_neighbours(
        x, neighbours=torch.tensor([[1, 2], [0, 2], [3, 1], [2, 1]]), sequence_ids=seq, return_per_query=True
    )
    # query 0: exact [2, 3]; item 1 is excluded, so neither a hit nor a tie
    assert per_query["recall@2"][0] == 0.5 and per_query["tie_recall@2"][0] == 0.5
    # query 1: exact [2, 3]; item 0 excluded
    assert per_query["recall@2"][1] == 0.5


def test_no_eligible_item_scores_one() -> None:
    x = torch.tensor([[0.0], [1.0]])
    _, per_query = audit_neighbours(
        x, neighbours=torch.tensor([[-1], [-1]]), search_groups=torch.tensor([0, 1]), return_per_query=True
    )
    assert per_query["recall@1"].tolist() == [1.0, 1.0] and per_query["missing_rate"].tolist() == [1.0, 1.0]
