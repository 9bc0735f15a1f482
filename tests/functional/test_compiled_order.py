"""The compiled stage-2 ordering kernels on hand-made rows (knn's tests cover them end to end)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from torchmetrics_retrieval.functional._search.compiled.order import (
    merge_sorted,
    mixed_runs,
    order_runs,
    ranked_columns,
    sort_by_key,
)

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


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("distance", ["dot", "cosine", "sqeuclidean", "euclidean"])
def test_ranked_columns_read_each_rank_and_map_its_key_to_a_distance(distance: str, dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(1)
    keys = torch.randn(30, 12, generator=g).sort(dim=1).values
    keys[:, -3:] = INF  # empty slots
    keys[0, 1] = -2.0  # a squared distance below 0 by its key: the L2 distance is 0
    items = torch.randint(0, 1000, keys.shape, generator=g)
    near = torch.rand(keys.shape, generator=g) < 0.3
    values = torch.rand(keys.shape, generator=g, dtype=torch.float64).to(dtype)
    order = torch.rand(keys.shape, generator=g).argsort(dim=1)[:, :9]
    query_sq = torch.rand(30, generator=g, dtype=torch.float64) + 0.5

    distances, chosen, valid, recomputed = ranked_columns(keys, items, near, values, order, query_sq, distance)

    # the slow reference: each rank's slot, its key's distance in float64 (numpy's square root), then rounded
    key = keys.gather(1, order).double().numpy()
    by_key = {
        "dot": key,
        "cosine": 1.0 + key,
        "sqeuclidean": key + query_sq.numpy()[:, None],
        "euclidean": np.sqrt(np.maximum(key + query_sq.numpy()[:, None], 0.0)),
    }[distance]
    expected_valid = keys.gather(1, order) < INF
    expected_recomputed = near.gather(1, order) & expected_valid
    expected = torch.where(expected_recomputed, values.gather(1, order), torch.from_numpy(by_key).to(dtype))
    assert distances.dtype == dtype
    assert torch.equal(valid, expected_valid) and torch.equal(recomputed, expected_recomputed)
    assert torch.equal(distances, expected.masked_fill(~expected_valid, INF))
    assert torch.equal(chosen, items.gather(1, order).masked_fill(~expected_valid, 0))


def test_merge_sorted_takes_the_first_entries_of_both_lists_by_distance_then_item() -> None:
    # row 0: equal distances across the lists go by item, -0.0 equals 0.0; row 1: one list empty, the other short
    first = (torch.tensor([[-0.0, 0.5, 0.5], [INF, INF, INF]]), torch.tensor([[8, 3, 6], [0, 0, 0]]),
             torch.tensor([[True, True, True], [False, False, False]]))  # fmt: skip
    second = (torch.tensor([[0.0, 0.5, INF], [0.25, INF, INF]]), torch.tensor([[2, 4, 0], [7, 0, 0]]),
              torch.tensor([[True, True, False], [True, False, False]]))  # fmt: skip
    distances, items, valid = merge_sorted(first, second, 4)
    assert items.tolist() == [[2, 8, 3, 4], [7, 2**31 - 1, 2**31 - 1, 2**31 - 1]]
    assert distances.tolist() == [[0.0, 0.0, 0.5, 0.5], [0.25, INF, INF, INF]]
    assert valid.tolist() == [[True, True, True, True], [True, False, False, False]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_merge_sorted_matches_a_sort_of_both_lists(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(5)

    def sorted_list(n_rows: int, width: int, parity: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        distances = (torch.randint(0, 6, (n_rows, width), generator=g) / 4).to(dtype)  # many exact ties
        items = torch.randint(0, 50, (n_rows, width), generator=g) * 2 + parity  # the lists share no item
        valid = torch.arange(width) < torch.randint(0, width + 1, (n_rows, 1), generator=g)  # empty slots last
        distances = distances.masked_fill(~valid, INF)
        rows = [sorted(zip(d.tolist(), i.tolist(), strict=True)) for d, i in zip(distances, items, strict=True)]
        return (
            torch.tensor([[d for d, _ in r] for r in rows], dtype=dtype),
            torch.tensor([[i for _, i in r] for r in rows]),
            valid,
        )

    first, second = sorted_list(200, 7, 0), sorted_list(200, 5, 1)
    distances, items, valid = merge_sorted(first, second, 9)
    assert distances.dtype == dtype
    for r in range(200):
        entries = sorted(
            (d, i)
            for found in (first, second)
            for d, i, v in zip(found[0][r].tolist(), found[1][r].tolist(), found[2][r].tolist(), strict=True)
            if v
        )[:9]
        n = len(entries)
        assert list(zip(distances[r].tolist(), items[r].tolist(), strict=True))[:n] == entries
        assert valid[r].tolist() == [True] * n + [False] * (9 - n)
        assert distances[r, n:].tolist() == [INF] * (9 - n)
