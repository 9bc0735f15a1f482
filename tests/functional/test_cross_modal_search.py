"""Both directions of a cross-modal evaluation from one stacked (bipartite) search: against the slow reference of
tests/reference.py, with exact distance ties, duplicated rows across the two sets, groups without a partner on
the other side and a side smaller than the cutoffs; and against each direction searched on its own."""

from __future__ import annotations

import pytest
import torch
from torch import Tensor

from tests import reference as ref
from torchmetrics_retrieval.functional import retrieval_metrics
from torchmetrics_retrieval.functional._cross_modal import cross_modal_metrics
from torchmetrics_retrieval.functional._options import RetrievalOptions

OPTIONS = {
    "cmc_top_k": (1, 3, 8),
    "precision_top_k": (2,),
    "recall_top_k": (3,),
    "map_top_k": (4,),
    "ndcg_top_k": (5,),
    "map_at_r": True,
    "r_precision": True,
    "mrr": True,
    "map_full": True,
    "minp": True,
}


def tied_sets(n_a: int, n_b: int, seed: int) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Integer points on a small grid (many exact distance ties), B partly copies of A rows (distance 0), ids drawn
    so that some groups have no item on the other side."""
    g = torch.Generator().manual_seed(seed)
    a = torch.randint(-2, 3, (n_a, 3), generator=g).float()
    b = torch.randint(-2, 3, (n_b, 3), generator=g).float()
    b[: n_b // 3] = a[torch.randint(0, n_a, (n_b // 3,), generator=g)]
    return a, torch.randint(0, 6, (n_a,), generator=g), b, torch.randint(0, 7, (n_b,), generator=g)


def reference_metrics(query: Tensor, query_ids: Tensor, gallery: Tensor, gallery_ids: Tensor, distance: str) -> dict:
    rankings = ref.rankings(query, query_ids, gallery, gallery_ids, distance=distance)
    per_query = {
        **{f"cmc/{k}": [ref.cmc(r, k) for r in rankings] for k in OPTIONS["cmc_top_k"]},
        "precision/2": [ref.precision(r, 2) for r in rankings],
        "recall/3": [ref.recall(r, 3) for r in rankings],
        "map/4": [ref.map_at_k(r, 4) for r in rankings],
        "ndcg/5": [ref.ndcg(r, 5) for r in rankings],
        "map_at_r": [ref.map_at_r(r) for r in rankings],
        "r_precision": [ref.r_precision(r) for r in rankings],
        "mrr": [ref.reciprocal_rank(r) for r in rankings],
        "map": [ref.average_precision(r) for r in rankings],
    }
    return {key: ref.mean_over(values, rankings) for key, values in per_query.items()}


@pytest.mark.parametrize("distance", ["euclidean", "cosine"])
@pytest.mark.parametrize(("n_a", "n_b", "seed"), [(9, 30, 0), (40, 5, 1), (25, 25, 2)])
def test_both_directions_equal_the_slow_reference(n_a: int, n_b: int, seed: int, distance: str) -> None:
    a, ids_a, b, ids_b = tied_sets(n_a, n_b, seed)
    if distance == "cosine":  # no zero row
        a[a.abs().sum(dim=1) == 0] = 1.0
        b[b.abs().sum(dim=1) == 0] = 1.0
    got = cross_modal_metrics(a, ids_a, b, ids_b, RetrievalOptions.create(distance=distance, **OPTIONS))
    for direction, sets in (("a_to_b", (a, ids_a, b, ids_b)), ("b_to_a", (b, ids_b, a, ids_a))):
        expected = reference_metrics(*sets, distance)
        values = {key: float(got[direction][key]) for key in expected}
        assert values == pytest.approx(expected, abs=1e-6), direction


@pytest.mark.filterwarnings("ignore:dir@fpir is NaN")
@pytest.mark.parametrize("seed", [3, 4])
def test_each_key_is_identical_to_each_direction_searched_alone(seed: int) -> None:
    a, ids_a, b, ids_b = tied_sets(60, 150, seed)
    options = {**OPTIONS, "fpir_vals": (0.1, 0.5), "confidence_level": 0.9, "n_bootstrap": 50}
    got = cross_modal_metrics(a, ids_a, b, ids_b, RetrievalOptions.create(**options))
    for direction, sets in (("a_to_b", (a, ids_a, b, ids_b)), ("b_to_a", (b, ids_b, a, ids_a))):
        alone = retrieval_metrics(*sets, **options)
        assert list(got[direction]) == list(alone)
        for key, value in alone.items():  # NaN (dir@fpir without a non-mated probe) equals NaN
            torch.testing.assert_close(got[direction][key], value, rtol=0, atol=0, equal_nan=True, msg=key)


def test_a_zero_row_with_cosine_names_its_side() -> None:
    a, ids_a, b, ids_b = tied_sets(6, 8, 5)
    a[a.abs().sum(dim=1) == 0] = 1.0
    b[3] = 0.0
    with pytest.raises(ValueError, match="`embeddings_b` must have no all-zero row"):
        cross_modal_metrics(a, ids_a, b, ids_b, RetrievalOptions.create(distance="cosine"))
