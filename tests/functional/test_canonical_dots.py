"""The canonical dot product of a pair (``keys.canonical_dots``) is one value, whatever computes it: a slow
reference written here with Python floats, the compiled kernel and the torch path agree bit for bit, for every
row dtype, dimension (with and without a remainder of four), side order, thread count and strided rows."""

from __future__ import annotations

import pytest
import torch

from torchmetrics_retrieval.functional._search import keys, plan
from torchmetrics_retrieval.functional._search.keys import Float64Rows, canonical_dots, self_dots

needs_numba = pytest.mark.skipif(not plan.HAS_NUMBA, reason="the compiled kernel needs numba")


def reference(x: torch.Tensor, y: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """The definition, pair by pair in Python floats (IEEE doubles): exact products of the float64 values of the
    entries, summed into four running sums by entry index modulo four, combined as (s0 + s1) + (s2 + s3)."""
    values = []
    for i, j in zip(rows.tolist(), cols.tolist(), strict=True):
        a, b = x[i].double().tolist(), y[j].double().tolist()
        sums = [0.0, 0.0, 0.0, 0.0]
        for d, (u, v) in enumerate(zip(a, b, strict=True)):
            sums[d % 4] += u * v
        values.append((sums[0] + sums[1]) + (sums[2] + sums[3]))
    return torch.tensor(values, dtype=torch.float64)


def adversarial_rows(n: int, dim: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """Rows whose entries span many magnitudes and signs: sums whose value depends on the order of addition."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, dim, generator=g) * torch.exp(3 * torch.randn(n, dim, generator=g))
    return x.to(dtype)


def pairs(n_rows: int, n_cols: int, n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, n_rows, (n,), generator=g), torch.randint(0, n_cols, (n,), generator=g)


def both_paths(monkeypatch: pytest.MonkeyPatch, x: keys.Rows64, y: keys.Rows64, rows, cols) -> list[torch.Tensor]:
    """The values from torch (the compiled kernel never taken) and from the compiled kernel (taken for any list)."""
    values = []
    for compiled_from in (10**12, 1):
        monkeypatch.setattr(keys, "_COMPILED_PAIRS", compiled_from)
        values.append(canonical_dots(rows, cols, x, y))
    return values


@needs_numba
@pytest.mark.parametrize("dim", [1, 2, 3, 4, 5, 7, 8, 24, 130])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.float16, torch.bfloat16])
def test_every_path_gives_the_reference(dim: int, dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(keys, "_LAZY_PAIRS", 17)  # half rows and torch go by blocks of pairs: many here
    x, y = adversarial_rows(40, dim, dtype, seed=dim), adversarial_rows(30, dim, dtype, seed=100 + dim)
    rows, cols = pairs(40, 30, 300, seed=dim)
    want = reference(x, y, rows, cols)
    stored = (x, y) if dtype == torch.float64 else (Float64Rows(x), Float64Rows(y))
    for got in both_paths(monkeypatch, *stored, rows, cols):
        assert torch.equal(got, want)
    # the order of the sums matters on these rows: a plain float64 sum differs for some pair (the test can fail;
    # half rows have so few digits that short sums are exact in any order)
    if dim >= 8 and dtype in (torch.float32, torch.float64):
        assert not torch.equal((x[rows].double() * y[cols].double()).sum(dim=1), want)


@needs_numba
def test_sides_swapped_threads_and_strided_rows_give_the_same_values(monkeypatch: pytest.MonkeyPatch) -> None:
    wide = adversarial_rows(500, 26, torch.float32, seed=1)
    x = wide[:, :24]  # strided rows (a view of wider rows), read as they are
    y = adversarial_rows(400, 24, torch.float32, seed=2)
    rows, cols = pairs(500, 400, 9000, seed=3)
    want = reference(x, y, rows[:200], cols[:200])
    for got in both_paths(monkeypatch, Float64Rows(x), Float64Rows(y), rows, cols):
        assert torch.equal(got[:200], want)
        swapped = canonical_dots(cols, rows, Float64Rows(y), Float64Rows(x.contiguous()))
        assert torch.equal(swapped, got)
    monkeypatch.setattr(keys, "_COMPILED_PAIRS", 1)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = canonical_dots(rows, cols, Float64Rows(x), Float64Rows(y))
        torch.set_num_threads(max(2, threads))
        assert torch.equal(canonical_dots(rows, cols, Float64Rows(x), Float64Rows(y)), one)
    finally:
        torch.set_num_threads(threads)


@needs_numba
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_self_dots_are_the_dots_of_each_row_with_itself(dtype: torch.dtype, monkeypatch: pytest.MonkeyPatch) -> None:
    x = adversarial_rows(300, 13, dtype, seed=4)
    at = torch.arange(300)
    want = reference(x, x, at, at)
    for compiled_from in (10**12, 1):
        monkeypatch.setattr(keys, "_COMPILED_PAIRS", compiled_from)
        assert torch.equal(self_dots(Float64Rows(x)), want)
    exact_duplicate = torch.cat([x[:1], x[:1]])
    sq = self_dots(Float64Rows(exact_duplicate))
    dot = canonical_dots(
        torch.tensor([0]), torch.tensor([1]), Float64Rows(exact_duplicate), Float64Rows(exact_duplicate)
    )
    assert float(sq[0] + sq[1] - 2 * dot[0]) == 0.0  # an exact duplicate is at distance 0


def test_no_pairs() -> None:
    x = torch.randn(3, 4)
    empty = torch.zeros(0, dtype=torch.long)
    assert canonical_dots(empty, empty, Float64Rows(x), Float64Rows(x)).shape == (0,)
