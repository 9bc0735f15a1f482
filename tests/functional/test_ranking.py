"""Ranking kernels: hand-computed cases, the documented examples of open-metric-learning (seed 004), errors."""

import math

import pytest
import torch

from torchmetrics_retrieval.functional import ranking
from torchmetrics_retrieval.functional.reduction import apply_empty_target_action


def padded(rows: list[list[int]]) -> torch.Tensor:
    """A ragged list of 0/1 rows as a (Q, K) bool matrix padded with False."""
    width = max(len(r) for r in rows)
    return torch.tensor([r + [0] * (width - len(r)) for r in rows], dtype=torch.bool)


# --- seed 004 (open-metric-learning) documented examples ----------------------------------------------------------


def test_cmc_seed_example() -> None:
    hits = padded([[1, 0], [0, 1, 1], [0, 0], []])
    n = torch.tensor([2, 2, 1, 0])
    values, _ = apply_empty_target_action(ranking.cmc_at_k(hits, n, (1, 2)), n, "pos")  # OML counts lone queries as 1
    assert values[:, 0].tolist() == [1.0, 0.0, 0.0, 1.0]
    assert values[:, 1].tolist() == [1.0, 1.0, 0.0, 1.0]


def test_precision_seed_example() -> None:
    hits = padded([[1, 0], [0, 1, 1], [0, 0], []])
    n = torch.tensor([2, 3, 5, 2])
    values = ranking.precision_at_k(hits, n, (1, 2))
    assert values[:, 0].tolist() == [1.0, 0.0, 0.0, 0.0]
    assert values[:, 1].tolist() == [0.5, 0.5, 0.0, 0.0]


def test_precision_seed_prose_example() -> None:
    # n = 3, g = [1, 1, 1, 0, 0]: standard 1, 1, 1, 3/4, 3/5, 3/6; OML's min(k, n) definition: always 1.
    hits = padded([[1, 1, 1, 0, 0, 0]])
    n = torch.tensor([3])
    ks = (1, 2, 3, 4, 5, 6)
    assert ranking.precision_at_k(hits, n, ks).tolist() == [[1.0] * 6]
    standard = ranking.precision_at_k(hits, n, ks, mode="standard")
    assert standard[0].tolist() == pytest.approx([1, 1, 1, 3 / 4, 3 / 5, 3 / 6])


def test_map_seed_example() -> None:
    hits = padded([[1, 0], [0, 1], [0, 0, 0, 0], []])
    n = torch.tensor([1, 1, 2, 0])
    values, _ = apply_empty_target_action(ranking.map_at_k(hits, n, (1, 2)), n, "pos")
    assert values[:, 0].tolist() == [1.0, 0.0, 0.0, 1.0]
    assert values[:, 1].tolist() == [1.0, 0.5, 0.0, 1.0]


# --- hand-computed cases --------------------------------------------------------------------------------------------

HITS = padded([[0, 1, 0, 1, 1], [1, 0, 0, 0, 0], [0, 0, 0, 0, 0]])
N = torch.tensor([4, 1, 2])


def test_cmc_hand() -> None:
    assert ranking.cmc_at_k(HITS, N, (1, 2, 5)).tolist() == [[0, 1, 1], [1, 1, 1], [0, 0, 0]]


def test_recall_hand() -> None:
    assert ranking.recall_at_k(HITS, N, (2, 5)).tolist() == [[0.25, 0.75], [1.0, 1.0], [0.0, 0.0]]


def test_map_at_k_hand() -> None:
    # query 0 at k=5: hits at 2, 4, 5 -> (1/2 + 2/4 + 3/5) / 3
    assert ranking.map_at_k(HITS, N, 5)[0].item() == pytest.approx((1 / 2 + 2 / 4 + 3 / 5) / 3)


def test_map_at_r_and_r_precision_hand() -> None:
    # query 0: R = 4, first four = [0, 1, 0, 1] -> MAP@R = (1/2 + 2/4) / 4, R-precision = 2/4
    assert ranking.map_at_r(HITS, N)[0].item() == pytest.approx((1 / 2 + 2 / 4) / 4)
    assert ranking.r_precision(HITS, N).tolist() == pytest.approx([0.5, 1.0, 0.0])


def test_average_precision_hand() -> None:
    # n = 4 but only 3 relevant items listed: the missing one counts as never found.
    assert ranking.average_precision(HITS, N)[0].item() == pytest.approx((1 / 2 + 2 / 4 + 3 / 5) / 4)


def test_ndcg_hand() -> None:
    gain = 1 / math.log2(3) + 1 / math.log2(5) + 1 / math.log2(6)
    ideal = sum(1 / math.log2(i + 2) for i in range(4))
    assert ranking.ndcg_at_k(HITS, N, 5)[0].item() == pytest.approx(gain / ideal)
    assert ranking.ndcg_at_k(HITS, N, 5)[1].item() == pytest.approx(1.0)


def test_reciprocal_rank_hand() -> None:
    assert ranking.reciprocal_rank(HITS).tolist() == [0.5, 1.0, 0.0]


def test_cutoff_beyond_columns_uses_all_columns() -> None:
    assert ranking.cmc_at_k(HITS, N, 50).tolist() == [1.0, 1.0, 0.0]
    assert ranking.precision_at_k(HITS, N, 50, mode="standard", n_candidates=torch.tensor([5, 5, 5]))[
        0
    ].item() == pytest.approx(0.6)


def test_single_int_gives_vector_and_tuple_gives_table() -> None:
    assert ranking.cmc_at_k(HITS, N, 2).shape == (3,)
    assert ranking.cmc_at_k(HITS, N, (5, 2)).shape == (3, 2)
    assert ranking.cmc_at_k(HITS, N, (5, 2))[:, 0].tolist() == [1, 1, 0]  # order as given


def test_empty_hit_matrix() -> None:
    hits = torch.zeros(2, 0, dtype=torch.bool)
    n = torch.tensor([0, 1])
    assert ranking.cmc_at_k(hits, n, 3).tolist() == [0.0, 0.0]
    assert ranking.reciprocal_rank(hits).tolist() == [0.0, 0.0]


@pytest.mark.parametrize(
    ("call", "error", "match"),
    [
        (lambda: ranking.cmc_at_k(HITS, N, 0), ValueError, "top_k"),
        (lambda: ranking.cmc_at_k(HITS, N, -1), ValueError, "top_k"),
        (lambda: ranking.cmc_at_k(HITS, N, ()), ValueError, "top_k"),
        (lambda: ranking.cmc_at_k(HITS, N, 1.5), TypeError, "top_k"),
        (lambda: ranking.cmc_at_k(HITS.float(), N, 1), TypeError, "is_relevant"),
        (lambda: ranking.cmc_at_k(HITS, N.float(), 1), TypeError, "n_relevant"),
        (lambda: ranking.cmc_at_k(HITS, N[:2], 1), ValueError, "n_relevant"),
        (lambda: ranking.precision_at_k(HITS, N, 1, mode="other"), ValueError, "mode"),  # type: ignore[arg-type]
        (lambda: ranking.reciprocal_rank(HITS[0]), TypeError, "is_relevant"),
    ],
)
def test_errors_name_the_argument(call, error, match) -> None:  # type: ignore[no-untyped-def]
    with pytest.raises(error, match=match):
        call()
