"""Bipartite searches (``make_problem(split=...)``): two sets, each searched against the other in one symmetric
pass of the rectangle between them. Each side's neighbours, distances and validity must be those of two
one-sided searches, and the pass must compute no block inside one side."""

from __future__ import annotations

import pytest
import torch

from torchmetrics_retrieval.functional._search import plan, stream_topk
from torchmetrics_retrieval.functional._search.problem import make_problem
from torchmetrics_retrieval.functional._search.rounds import Search
from torchmetrics_retrieval.functional._search.types import Exclusions

NO_RULES = Exclusions(None, None, None)


def _rows(n: int, seed: int) -> torch.Tensor:
    """Small integer points: many exact distance ties, and duplicates across the two sides."""
    x = torch.randint(-2, 3, (n, 6), generator=torch.Generator().manual_seed(seed)).float()
    x[3] = x[-5]
    x[10:20] = x[-1]
    return x


def _one_sided(query: torch.Tensor, gallery: torch.Tensor, distance: str, k: int, sequences=None):  # type: ignore[no-untyped-def]
    rules = NO_RULES if sequences is None else Exclusions(None, sequences, None)
    problem = make_problem(query, gallery, distance, rules, same_set=False)
    return Search.prepare(problem, k, backend="torch")(torch.arange(query.shape[0]))


@pytest.mark.parametrize("compiled", [True, False])
@pytest.mark.parametrize("distance", ["euclidean", "sqeuclidean", "cosine", "dot"])
def test_each_side_gets_its_one_sided_search(compiled: bool, distance: str) -> None:
    left, right, k = _rows(140, 1), _rows(230, 2), 9
    x = torch.cat([left, right])
    with plan.force_compiled(compiled):
        problem = make_problem(x, x, distance, Exclusions(torch.arange(370), None, None), True, split=140)
        both = Search.prepare(problem, k, backend="torch")(torch.arange(370))
        from_right = _one_sided(left, right, distance, k)
        from_left = _one_sided(right, left, distance, k)
    assert torch.equal(both.indices[:140], from_right.indices + 140)
    assert torch.equal(both.indices[140:], from_left.indices)
    assert torch.equal(both.distances[:140], from_right.distances)
    assert torch.equal(both.distances[140:], from_left.distances)
    assert bool(both.valid.all())


def test_other_rules_apply_across_the_sides() -> None:
    """Sequence ids shared across the sides still exclude; a side smaller than k leaves invalid slots."""
    left, right = _rows(5, 3), _rows(60, 4)
    sequences = torch.cat([torch.arange(5), torch.arange(60) % 7])
    x = torch.cat([left, right])
    rules = Exclusions(None, (sequences, sequences), None)
    problem = make_problem(x, x, "euclidean", rules, True, split=5)
    both = Search.prepare(problem, 8, backend="torch")(torch.arange(65))
    from_right = _one_sided(left, right, "euclidean", 8, (sequences[:5], sequences[5:]))
    from_left = _one_sided(right, left, "euclidean", 8, (sequences[5:], sequences[:5]))
    assert torch.equal(both.indices[:5], from_right.indices + 5)
    assert torch.equal(both.distances[5:, :5], from_left.distances)
    assert torch.equal(both.valid[5:, :5], from_left.valid)
    assert not bool(both.valid[5:, 5:].any())  # the right side sees at most the 5 items of the left
    side = torch.arange(65) >= 5
    pairs = (sequences[:, None] != sequences[None, :]) & (side[:, None] != side[None, :])
    assert torch.equal(problem.n_eligible, pairs.sum(dim=1))  # counted by ids, without forming pairs


def test_no_block_inside_one_side_is_computed(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[tuple[slice, slice]] = []

    def recording(key_fn, n, kp, mask_fn, **kwargs):  # type: ignore[no-untyped-def]
        def keys(rows, cols):  # type: ignore[no-untyped-def]
            if isinstance(cols, slice):
                seen.append((rows, cols))
            return key_fn(rows, cols)

        return original(keys, n, kp, mask_fn, **kwargs)

    original = stream_topk.stream_topk_symmetric
    monkeypatch.setattr("torchmetrics_retrieval.functional._search.torch_stage.stream_topk_symmetric", recording)
    monkeypatch.setattr(plan, "STAGE1_ROWS", 32)
    monkeypatch.setattr(plan, "STAGE1_COLUMNS", 32)
    x = _rows(300, 5)
    problem = make_problem(x, x, "euclidean", NO_RULES, True, split=100)
    Search.prepare(problem, 4, backend="torch")(torch.arange(300))
    assert seen and all(rows.stop <= 100 and cols.start >= 100 for rows, cols in seen)
    assert sum((r.stop - r.start) * (c.stop - c.start) for r, c in seen) == 100 * 200
