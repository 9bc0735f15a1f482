"""Float64 rows read on demand (``make_problem(lazy64=True)``) give the values of the float64 copy, bit for bit:
the canonical dot products, the squared norms, the stage rows, and whole searches (one-sided, symmetric and
bipartite, every distance, exact ties and duplicates)."""

from __future__ import annotations

import pytest
import torch

from torchmetrics_retrieval.functional._search import keys
from torchmetrics_retrieval.functional._search.keys import Float64Rows, canonical_dots, self_dots, stage_rows
from torchmetrics_retrieval.functional._search.problem import make_problem
from torchmetrics_retrieval.functional._search.rounds import Search
from torchmetrics_retrieval.functional._search.types import Exclusions

DISTANCES = ["euclidean", "sqeuclidean", "cosine", "dot"]


def rows(n: int, dim: int, seed: int) -> torch.Tensor:
    """Gaussian rows with a third of them small-integer rows and exact duplicates (distance ties, zeros)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=g)
    x[: n // 3] = torch.randint(-2, 3, (n // 3, dim), generator=g).float()
    x[n // 3 : n // 3 + 5] = x[:5]
    x[x.abs().sum(dim=1) == 0] = 1.0  # no zero row (cosine)
    return x


def test_dots_norms_and_stage_rows_equal_the_copy(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(keys, "_LAZY_PAIRS", 37)  # many blocks, rows shared across them
    x, y = rows(300, 24, 0), rows(200, 24, 1)
    g = torch.Generator().manual_seed(2)
    pair_rows, pair_cols = torch.randint(0, 300, (5000,), generator=g), torch.randint(0, 200, (5000,), generator=g)
    x64, y64 = x.double(), y.double()
    expected = canonical_dots(pair_rows, pair_cols, x64, y64)
    assert torch.equal(canonical_dots(pair_rows, pair_cols, Float64Rows(x), Float64Rows(y)), expected)
    assert torch.equal(canonical_dots(pair_rows, pair_cols, x64, Float64Rows(y)), expected)
    in_order = torch.sort(pair_rows, stable=True)  # pairs grouped by row (the blocks are then slices)
    by_row = canonical_dots(in_order.values, pair_cols[in_order.indices], Float64Rows(x), Float64Rows(y))
    assert torch.equal(by_row, expected[in_order.indices])
    assert torch.equal(self_dots(Float64Rows(x)), self_dots(x64))
    for distance in DISTANCES:
        for got, want in zip(
            stage_rows(Float64Rows(x), self_dots(x64), distance), stage_rows(x64, self_dots(x64), distance), strict=True
        ):
            assert (got is None and want is None) or torch.equal(got, want), distance


@pytest.mark.parametrize("distance", DISTANCES)
@pytest.mark.parametrize("case", ["one_sided", "symmetric", "bipartite"])
def test_searches_equal_the_copy(distance: str, case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(keys, "_LAZY_PAIRS", 53)
    x, y = rows(180, 8, 3), rows(120, 8, 4)
    none = Exclusions(None, None, None)
    if case == "one_sided":
        args = (x, y, distance, none, False)
        kwargs: dict = {}
    elif case == "symmetric":
        args, kwargs = (x, x, distance, Exclusions(torch.arange(180), None, None), True), {}
    else:
        stacked = torch.cat([x, y])
        args, kwargs = (stacked, stacked, distance, none, True), {"split": 180}
    n = args[0].shape[0]
    for exact in (True, False):
        dense = Search.prepare(make_problem(*args, **kwargs), 7, exact_distances=exact)(torch.arange(n))
        lazy = Search.prepare(make_problem(*args, **kwargs, lazy64=True), 7, exact_distances=exact)(torch.arange(n))
        for got, want in zip(lazy, dense, strict=True):
            assert torch.equal(got, want), (case, distance, exact)
