"""``retrieval_metrics(..., neighbours=...)``: the ranking metrics of a user's neighbour lists, against the slow
reference of tests/reference.py applied to those lists, and against the exact evaluation when the lists are exact."""

from __future__ import annotations

import pytest
import torch

from tests import reference as ref
from torchmetrics_retrieval.functional import compare_models, knn, retrieval_metrics

RANKING = {
    "cmc_top_k": (1, 3),
    "precision_top_k": (2, 4),
    "map_top_k": (4,),
    "recall_top_k": (3,),
    "ndcg_top_k": (4,),
    "map_at_r": True,
    "r_precision": True,
    "mrr": True,
}


def _listed(ranking: ref.QueryRanking, row: list[int], labels_match: list[bool], depth: int) -> ref.QueryRanking:
    """The reference ranking of a list: its slots (empty ones not relevant), then empty slots up to ``depth``, then
    the relevant items the list missed, so that the reference's n(q) stays the exact count and no cutoff up to
    ``depth`` reaches them."""
    eligible = set(ranking.positions)
    seen: set[int] = set()
    relevant = []
    for item, match in zip(row, labels_match, strict=True):
        relevant.append(item >= 0 and item in eligible and item not in seen and match)
        seen.add(item)
    relevant += [False] * max(0, depth - len(relevant))
    relevant += [True] * (ranking.n_relevant - sum(relevant))
    return ref.QueryRanking(list(range(len(relevant))), [0.0] * len(relevant), relevant)


def _expected(rankings: list[ref.QueryRanking], width: int) -> dict[str, list[float]]:
    out: dict[str, list[float]] = {}
    for k in RANKING["cmc_top_k"]:
        out[f"cmc/{k}"] = [ref.cmc(r, k) for r in rankings]
    for k in RANKING["precision_top_k"]:
        out[f"precision/{k}"] = [ref.precision(r, k) for r in rankings]
    out["map/4"] = [ref.map_at_k(r, 4) for r in rankings]
    out["recall/3"] = [ref.recall(r, 3) for r in rankings]
    out["ndcg/4"] = [ref.ndcg(r, 4) for r in rankings]
    out["map_at_r"] = [ref.map_at_r(r) for r in rankings]
    out["r_precision"] = [ref.r_precision(r) for r in rankings]
    # the reciprocal rank within the list only
    out["mrr"] = [ref.reciprocal_rank(ref.QueryRanking([], [], r.relevant[:width])) for r in rankings]
    return out


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("form", ["leave_one_out", "masks", "gallery"])
def test_against_the_reference(seed: int, form: str) -> None:
    g = torch.Generator().manual_seed(seed)
    x = torch.randint(0, 4, (30, 2), generator=g).float()  # an integer grid: ties and duplicate rows
    labels = torch.randint(0, 3, (30,), generator=g)
    width = 5
    kwargs: dict = {}
    if form == "leave_one_out":
        rankings = ref.leave_one_out(x, labels)
        n_query, n_positions = 30, 30
    elif form == "masks":
        is_query, is_gallery = torch.arange(30) % 3 != 0, torch.arange(30) % 4 != 1
        kwargs = {"is_query": is_query, "is_gallery": is_gallery}
        rankings = ref.whole_set(x, labels, is_query=is_query.tolist(), is_gallery=is_gallery.tolist())
        n_query, n_positions = int(is_query.sum()), 30
    else:
        gallery, gallery_labels = x[10:], labels[10:]
        kwargs = {"gallery": gallery, "gallery_labels": gallery_labels}
        x, labels = x[:10], labels[:10]
        rankings = ref.rankings(x, labels, gallery, gallery_labels)
        n_query, n_positions = 10, 20
    table = torch.randint(-1, n_positions, (n_query, width), generator=g)  # -1, repeats, self, non-gallery items
    table[:, 0] = table[:, 1]  # certainly some repeats
    _, result = retrieval_metrics(x, labels, neighbours=table, return_per_query=True, **kwargs, **RANKING)
    assert result is not None
    query_labels = result.query_labels
    gallery_labels = kwargs.get("gallery_labels", labels)
    listed = []
    for q, ranking in enumerate(rankings):
        row = table[q].tolist()
        match = [i >= 0 and bool(gallery_labels[i] == query_labels[q]) for i in row]
        listed.append(_listed(ranking, row, match, max(4, *(r.n_relevant for r in rankings))))
    for key, values in _expected(listed, width).items():
        torch.testing.assert_close(result.values[key], torch.tensor(values), rtol=0, atol=1e-6, msg=key)
    assert result.n_relevant.tolist() == [r.n_relevant for r in rankings]  # n(q) stays exact


def test_exact_lists_give_the_exact_evaluation() -> None:
    g = torch.Generator().manual_seed(3)
    x, labels = torch.randn(300, 6, generator=g), torch.randint(0, 12, (300,), generator=g)
    exact = retrieval_metrics(x, labels, **RANKING)
    lists = knn(x, k=299).indices  # the whole ranking: mrr within the list is the full one
    given = retrieval_metrics(x, labels, neighbours=lists, **RANKING)
    assert given.keys() == exact.keys()
    for key in exact:
        assert float(given[key]) == float(exact[key]), key


def test_a_short_list_by_hand() -> None:
    # leave-one-out on a line; labels 0 0 1 0: query 0's relevant items are 1 and 3 (n = 2)
    x = torch.tensor([[0.0], [1.0], [2.0], [3.0]])
    labels = torch.tensor([0, 0, 1, 0])
    table = torch.tensor([[2, 3], [0, -1], [1, 1], [0, 3]])  # row 3 holds the query itself in its 2nd slot
    _, result = retrieval_metrics(
        x, labels, neighbours=table, cmc_top_k=(1, 3), precision_top_k=(3,), map_top_k=(), mrr=True,
        return_per_query=True,
    )  # fmt: skip
    assert result is not None
    # query 0: [irrelevant, relevant] then nothing: cmc/1 0, cmc/3 1, precision/3 = 1 / min(3, 2), rr 1/2
    # query 1: [relevant, -]: 1, 1, 1/2, 1; query 2 (label 1, n = 0): 0 everywhere
    # query 3: [relevant, itself (empty)]: 1, 1, 1/2, 1
    assert result.values["cmc/1"].tolist() == [0.0, 1.0, 0.0, 1.0]
    assert result.values["cmc/3"].tolist() == [1.0, 1.0, 0.0, 1.0]
    assert result.values["precision/3"].tolist() == [0.5, 0.5, 0.0, 0.5]
    assert result.values["mrr"].tolist() == [0.5, 1.0, 0.0, 1.0]
    slots = [[True, True, False], [True, False, False], [True, False, False], [True, False, False]]
    assert result.valid.tolist() == slots  # repeats, -1 and the query itself are empty; K = 3 pads the lists


def test_paired_with_the_exact_evaluation() -> None:
    """What compare_models is given: per-query values of the same queries, from the lists and from exact search."""
    g = torch.Generator().manual_seed(4)
    x, labels = torch.randn(200, 4, generator=g), torch.randint(0, 5, (200,), generator=g)
    lists = knn(x, k=5).indices
    lists[::3, 0] = -1  # a worse index: the nearest item of every third query is lost
    _, approx = retrieval_metrics(x, labels, neighbours=lists, cmc_top_k=(1,), return_per_query=True)
    _, exact = retrieval_metrics(x, labels, cmc_top_k=(1,), return_per_query=True)
    assert approx is not None and exact is not None
    comparison = compare_models(exact.values["cmc/1"], approx.values["cmc/1"])
    lost = exact.values["cmc/1"][::3].sum() / 200
    assert float(comparison["difference"]) == pytest.approx(-float(lost), abs=1e-12)
    assert float(comparison["ci_high"]) < 0


@pytest.mark.parametrize("option", [{"map_full": True}, {"minp": True}, {"fpir_vals": 0.1}])
def test_full_ranking_options_are_refused(option: dict) -> None:
    x, labels = torch.randn(10, 2), torch.arange(10) % 2
    with pytest.raises(ValueError, match="`neighbours`"):
        retrieval_metrics(x, labels, neighbours=torch.zeros(10, 2, dtype=torch.long), **option)
