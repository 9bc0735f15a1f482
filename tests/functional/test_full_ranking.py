"""Full-ranking metrics (``map``, ``mrr`` beyond K) from one counting pass, against the slow reference.

Both implementations of the counting pass run (compiled kernels and torch passes), with small chunk sizes so
that exact ties and duplicates straddle block boundaries, with every exclusion rule, lone queries, a custom
label comparison and every distance. Each case checks which implementation ran (``kernel_calls``): the compiled
count kernel when forced on, no kernel when forced off.
"""

from __future__ import annotations

import pytest
import torch

import torchmetrics_retrieval.functional as F
from tests import reference
from tests.functional.conftest import KernelCalls
from torchmetrics_retrieval.functional._ranks import plan as ranks_plan

PATHS = pytest.mark.parametrize("compiled", [True, False], ids=["compiled kernels", "torch passes"])


def tied_data(n: int, seed: int, dim: int = 4) -> tuple[torch.Tensor, torch.Tensor]:
    """Small integer coordinates (exact distance ties everywhere) with duplicated rows; a lone label 99."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(-2, 3, (n, dim), generator=g).float()
    x[5:12] = x[3]
    labels = torch.randint(0, 6, (n,), generator=g)
    labels[0] = 99
    return x, labels


def inverse_negative_penalty(r: reference.QueryRanking) -> float:
    """n(q) / rank of the last relevant item (0 without one), from the full ranking."""
    ranks = [i + 1 for i, relevant in enumerate(r.relevant) if relevant]
    return len(ranks) / ranks[-1] if ranks else 0.0


def full_metrics(refs: list[reference.QueryRanking]) -> dict[str, float]:
    return {
        "map": reference.mean_over([reference.average_precision(r) for r in refs], refs),
        "mrr": reference.mean_over([reference.reciprocal_rank(r) for r in refs], refs),
        "minp": reference.mean_over([inverse_negative_penalty(r) for r in refs], refs),
    }


def ours(x: torch.Tensor, labels: torch.Tensor, **kwargs: object) -> dict[str, float]:
    result, per_query = F.retrieval_metrics(
        x, labels, cmc_top_k=(1,), precision_top_k=(), map_top_k=(), map_full=True, mrr=True, minp=True,
        return_per_query=True, **kwargs,
    )  # fmt: skip
    _, alone = F.retrieval_metrics(
        x, labels, cmc_top_k=(), precision_top_k=(), map_top_k=(), minp=True, return_per_query=True, **kwargs
    )
    # the same ranks from the last relevant item alone as from every relevant item
    assert per_query is not None and alone is not None
    assert torch.equal(alone.values["minp"], per_query.values["minp"])
    return {key: result[key].item() for key in ("map", "mrr", "minp")}


@PATHS
@pytest.mark.parametrize("distance", ["euclidean", "sqeuclidean", "cosine", "dot"])
@pytest.mark.parametrize("chunk_size", [None, 7])
def test_map_and_mrr_match_the_reference_with_ties_across_blocks(
    compiled: bool, distance: str, chunk_size: int | None, kernel_calls: KernelCalls
) -> None:
    x, labels = tied_data(90, seed=1)
    if distance == "cosine":
        x[x.abs().sum(dim=1) == 0] = 1.0  # no zero rows
    expected = full_metrics(reference.leave_one_out(x, labels, distance=distance))
    with kernel_calls.forced(compiled, "ranks.count_rows"):
        got = ours(x, labels, distance=distance, chunk_size=chunk_size)
    assert got == pytest.approx(expected, abs=1e-6)


@PATHS
def test_every_exclusion_rule_and_a_query_subset(compiled: bool, kernel_calls: KernelCalls) -> None:
    x, labels = tied_data(120, seed=2)
    g = torch.Generator().manual_seed(5)
    sequence_ids = torch.randint(0, 30, (120,), generator=g)
    search_groups = torch.randint(0, 2, (120,), generator=g)
    is_query = torch.rand(120, generator=g) < 0.6
    is_gallery = torch.rand(120, generator=g) < 0.8
    refs = reference.whole_set(
        x, labels, is_query=is_query.tolist(), is_gallery=is_gallery.tolist(),
        sequence_ids=sequence_ids, search_groups=search_groups,
    )  # fmt: skip
    with kernel_calls.forced(compiled, "ranks.count_rows"):
        got = ours(
            x, labels, is_query=is_query, is_gallery=is_gallery, sequence_ids=sequence_ids,
            search_groups=search_groups, chunk_size=16,
        )  # fmt: skip
    assert got == pytest.approx(full_metrics(refs), abs=1e-6)


@PATHS
def test_separate_gallery_custom_comparison_and_float64(compiled: bool, kernel_calls: KernelCalls) -> None:
    g = torch.Generator().manual_seed(3)
    query = torch.randint(-2, 3, (40, 3), generator=g).double()
    gallery = torch.cat([query[:10], torch.randint(-2, 3, (70, 3), generator=g).double()])
    query_labels = torch.randint(0, 8, (40, 2), generator=g)
    gallery_labels = torch.randint(0, 8, (80, 2), generator=g)

    def same_first(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a[..., 0] == b[..., 0]

    refs = reference.rankings(query, query_labels, gallery, gallery_labels, label_comparison_fn=same_first)
    with kernel_calls.forced(compiled, "ranks.count_rows"):
        got = ours(query, query_labels, gallery=gallery, gallery_labels=gallery_labels, label_comparison_fn=same_first)
    assert got == pytest.approx(full_metrics(refs), abs=1e-6)  # metric values are float32
    # multi-column labels compared as a whole (the default)
    refs = reference.rankings(query, query_labels, gallery, gallery_labels)
    with kernel_calls.forced(compiled, "ranks.count_rows"):
        got = ours(query, query_labels, gallery=gallery, gallery_labels=gallery_labels)
    assert got == pytest.approx(full_metrics(refs), abs=1e-6)  # metric values are float32


@PATHS
def test_continuous_data_against_pytorch_metric_learning(compiled: bool, kernel_calls: KernelCalls) -> None:
    from pytorch_metric_learning.utils.accuracy_calculator import AccuracyCalculator

    g = torch.Generator().manual_seed(4)
    labels = torch.randint(0, 30, (700,), generator=g)
    labels[:3] = torch.tensor([100, 101, 102])  # lone queries
    x = torch.randn(700, 12, generator=g) + torch.nn.functional.one_hot(labels % 12, 12).float()
    theirs = AccuracyCalculator(
        include=("mean_average_precision", "mean_reciprocal_rank"), k=None, device=torch.device("cpu")
    ).get_accuracy(x, labels, x, labels, ref_includes_query=True)
    with kernel_calls.forced(compiled, "ranks.count_rows"):
        got = ours(x, labels, chunk_size=100)
    # pytorch-metric-learning skips lone queries too (they have no relevant reference)
    assert got["map"] == pytest.approx(theirs["mean_average_precision"], abs=1e-5)
    assert got["mrr"] == pytest.approx(theirs["mean_reciprocal_rank"], abs=1e-5)


def test_the_two_counting_paths_agree_rank_by_rank(kernel_calls: KernelCalls) -> None:
    """Ranks of every relevant item, from the compiled kernels and from the torch passes, on near-ties."""
    from torchmetrics_retrieval.functional._options import RetrievalOptions
    from torchmetrics_retrieval.functional._ranks.count import relevant_ranks
    from torchmetrics_retrieval.functional._sets import split_query_gallery

    g = torch.Generator().manual_seed(6)
    x = torch.randn(400, 8, generator=g)
    x[200:] = x[:200] + 1e-7 * torch.randn(200, 8, generator=g)  # near duplicates: ambiguous keys
    labels = torch.randint(0, 10, (400,), generator=g)
    qg = split_query_gallery(x, labels)
    n_relevant = torch.bincount(labels)[labels] - 1
    options = RetrievalOptions.create(chunk_size=64)
    with kernel_calls.forced(True, "ranks.count_rows"):
        compiled = relevant_ranks(qg, n_relevant, options)
    with kernel_calls.forced(False):
        torch_passes = relevant_ranks(qg, n_relevant, options)
    assert torch.equal(compiled, torch_passes)
    refs = reference.leave_one_out(x, labels)
    expected = [[i + 1 for i, rel in enumerate(r.relevant) if rel] for r in refs]
    assert [row[row > 0].tolist() for row in compiled] == expected


@PATHS
def test_query_chunks_give_the_same_ranks(
    compiled: bool, monkeypatch: pytest.MonkeyPatch, kernel_calls: KernelCalls
) -> None:
    """Queries are processed in chunks under a memory budget (no symmetric blocks then): same values."""

    x, labels = tied_data(90, seed=8)
    monkeypatch.setattr(ranks_plan, "BUDGET_ENTRIES", 100)  # a few queries per chunk
    with kernel_calls.forced(compiled, "ranks.count_rows"):
        got = ours(x, labels, chunk_size=16)
    assert got == pytest.approx(full_metrics(reference.leave_one_out(x, labels)), abs=1e-6)


def test_rows_with_more_near_ties_than_the_buffer_holds(
    monkeypatch: pytest.MonkeyPatch, kernel_calls: KernelCalls
) -> None:
    """A row's near ties beyond the kernel's buffer are listed by a second scan of the block: same values."""
    x, labels = tied_data(90, seed=9)
    monkeypatch.setattr(ranks_plan, "AMBIGUOUS_PER_ROW", 1)
    with kernel_calls.forced(True, "ranks.list_ambiguous"):  # the second scan ran
        got = ours(x, labels, chunk_size=32)
    assert got == pytest.approx(full_metrics(reference.leave_one_out(x, labels)), abs=1e-6)


def every_ranking_metric(refs: list[reference.QueryRanking], mode: str, action: str) -> dict[str, float]:
    """The reference value of every key of ``WITHOUT_SEARCH``'s call."""
    per_query = {
        "cmc/1": [reference.cmc(r, 1) for r in refs],
        "cmc/3": [reference.cmc(r, 3) for r in refs],
        "precision/2": [reference.precision(r, 2, mode) for r in refs],
        "precision/5": [reference.precision(r, 5, mode) for r in refs],
        "recall/3": [reference.recall(r, 3) for r in refs],
        "map/4": [reference.map_at_k(r, 4) for r in refs],
        "ndcg/3": [reference.ndcg(r, 3) for r in refs],
        "map_at_r": [reference.map_at_r(r) for r in refs],
        "r_precision": [reference.r_precision(r) for r in refs],
        "mrr": [reference.reciprocal_rank(r) for r in refs],
        "map": [reference.average_precision(r) for r in refs],
        "minp": [inverse_negative_penalty(r) for r in refs],
    }
    return {key: reference.mean_over(values, refs, action) for key, values in per_query.items()}


WITHOUT_SEARCH = {
    "cmc_top_k": (1, 3), "precision_top_k": (2, 5), "recall_top_k": (3,), "map_top_k": (4,), "ndcg_top_k": (3,),
    "map_at_r": True, "r_precision": True, "mrr": True, "map_full": True, "minp": True,
}  # fmt: skip


@PATHS
@pytest.mark.parametrize(("mode", "action"), [("min_k_n", "skip"), ("standard", "neg")])
def test_with_full_map_every_value_comes_from_the_ranks_without_a_search(
    compiled: bool, mode: str, action: str, monkeypatch: pytest.MonkeyPatch, kernel_calls: KernelCalls
) -> None:
    """With ``map_full`` and no per-query table the ranking values are read off the full ranks (no kNN search
    runs): the same values as the reference, on ties, duplicates, lone queries and every exclusion rule."""
    from torchmetrics_retrieval.functional import _per_query

    def no_search(*args: object, **kwargs: object) -> None:
        raise AssertionError("a kNN search ran")

    x, labels = tied_data(120, seed=10)
    g = torch.Generator().manual_seed(11)
    fields = {
        "sequence_ids": torch.randint(0, 30, (120,), generator=g),
        "search_groups": torch.randint(0, 2, (120,), generator=g),
        "is_query": torch.rand(120, generator=g) < 0.6,
        "is_gallery": torch.rand(120, generator=g) < 0.8,
    }
    refs = reference.whole_set(
        x, labels, **{key: value.tolist() if value.dtype == torch.bool else value for key, value in fields.items()}
    )
    expected = every_ranking_metric(refs, mode, action)
    monkeypatch.setattr(_per_query, "_search", no_search)
    with kernel_calls.forced(compiled, "ranks.count_rows"):
        got = F.retrieval_metrics(
            x, labels, **WITHOUT_SEARCH, precision_mode=mode, empty_target_action=action, chunk_size=16, **fields
        )
    assert {key: value.item() for key, value in got.items()} == pytest.approx(expected, abs=1e-6)


def test_without_a_search_the_values_equal_the_searched_ones() -> None:
    """The values read off the ranks equal, bit for bit, those of the search (kept per query), with a custom
    label comparison and a separate gallery, and with more cutoffs than a query has gallery items."""
    g = torch.Generator().manual_seed(12)
    query = torch.randint(-2, 3, (30, 3), generator=g).float()
    gallery = torch.cat([query[:8], torch.randint(-2, 3, (4, 3), generator=g).float()])  # 12 items, cutoff 15
    query_labels, gallery_labels = torch.randint(0, 5, (30, 2), generator=g), torch.randint(0, 5, (12, 2), generator=g)

    def same_first(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a[..., 0] == b[..., 0]

    options = {**WITHOUT_SEARCH, "cmc_top_k": (1, 15), "label_comparison_fn": same_first}
    args = (query, query_labels, gallery, gallery_labels)
    alone = F.retrieval_metrics(*args, **options)
    searched, _ = F.retrieval_metrics(*args, **options, return_per_query=True)
    assert alone.keys() == searched.keys()
    assert all(torch.equal(alone[key], searched[key]) for key in alone)
