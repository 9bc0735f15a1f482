"""The compiled stage-2 ordering kernels on hand-made rows (knn's tests cover them end to end)."""

from __future__ import annotations

import torch

from torchmetrics_retrieval.functional._search.compiled.order import mixed_runs, order_runs, sort_by_key

INF = float("inf")


def test_sort_by_key_orders_rows_and_flags_near_keys() -> None:
    keys = torch.tensor([[0.5, 0.1, 0.3, 0.3000001, INF], [-2.0, -1.0, -0.5, -3.0, -1.0]])
    items = torch.tensor([[4, 7, 2, 9, 0], [1, 2, 3, 4, 0]])
    gap = torch.tensor([1e-3, 1e-3], dtype=torch.float64)
    near_limit = torch.tensor([0.2, -INF], dtype=torch.float64)  # row 0: keys <= 0.2 are near as well
    sorted_keys, sorted_items, near = sort_by_key(keys, items, gap, near_limit)
    assert torch.equal(sorted_keys, keys.sort(dim=1).values)
    assert sorted_items.tolist() == [[7, 2, 9, 4, 0], [4, 1, 0, 2, 3]]  # equal keys by item
    assert near.tolist() == [[True, True, True, False, False], [False, False, True, True, False]]


def test_order_runs_sorts_each_run_by_value_then_item() -> None:
    values = torch.tensor([[9.0, 0.31, 0.30, 9.0, 0.7, 0.7], [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]])
    items = torch.tensor([[5, 1, 2, 3, 8, 4], [0, 1, 2, 3, 4, 5]])
    near = torch.tensor([[False, True, True, False, True, True], [False] * 6])
    assert order_runs(values, items, near).tolist() == [[0, 2, 1, 3, 5, 4], [0, 1, 2, 3, 4, 5]]


def test_sort_by_key_matches_a_stable_sort_on_mixed_rows() -> None:
    # Signs, zeros of both signs, +inf, repeated keys and positions up to 2**31 - 1: every radix digit varies.
    g = torch.Generator().manual_seed(0)
    pool = torch.tensor([-3e38, -1.5, -1e-30, -0.0, 0.0, 1e-30, 0.25, 1.5, 3e38, INF])
    keys = torch.cat([pool[torch.randint(0, 10, (40, 300), generator=g)], torch.randn(40, 300, generator=g)], dim=1)
    items = torch.randint(0, 2**31 - 1, keys.shape, generator=g)
    items[:, :2] = torch.tensor([0, 2**31 - 1])
    no_limit = torch.full((40,), -INF, dtype=torch.float64)
    sorted_keys, sorted_items, _ = sort_by_key(keys, items, torch.zeros(40, dtype=torch.float64), no_limit)
    by_item = items.argsort(dim=1, stable=True)
    order = by_item.gather(1, keys.gather(1, by_item).argsort(dim=1, stable=True))
    assert torch.equal(sorted_keys, keys.gather(1, order))
    assert torch.equal(sorted_items, items.gather(1, order))


def test_mixed_runs_are_the_runs_of_near_entries_with_both_kinds_of_items() -> None:
    near = torch.tensor([[True, True, False, True, True, True], [True, True, True, False, False, True]])
    relevant = torch.tensor([[True, False, True, True, True, True], [False, False, False, True, True, True]])
    expected = [[True, True, False, False, False, False], [False, False, False, False, False, False]]
    assert mixed_runs(near, relevant).tolist() == expected
    assert near[0].tolist() == [True, True, False, True, True, True]  # the input is left alone
    assert not bool(mixed_runs(torch.zeros(2, 3, dtype=torch.bool), relevant[:, :3]).any())
