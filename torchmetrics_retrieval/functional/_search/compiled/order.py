"""Stage-2 ordering of the kNN candidates in compiled code (numba), for ``knn(..., exact_distances=False)``.

Two per-row passes around the float64 recomputation of the near ties:

* :func:`sort_by_key` sorts each row's candidates by stage-1 key (ties by gallery position) and flags the
  *near* ones: within ``gap`` of a neighbour's key, or (L2) so close to the query that a key cannot
  resolve the distance from 0;
* :func:`order_runs` then sorts every run of consecutive flagged candidates by (canonical distance,
  position). An unflagged candidate is further than ``gap`` from both neighbours, so its place in the
  key order is its place in the exact order.

When only the relevance of each rank counts, :func:`mixed_runs` keeps the flags of the runs that hold
both relevant and irrelevant items: any order of the other runs gives every rank the same relevance.
:func:`ranked_columns` then reads the first K columns in their final order, with their distances.

The torch equivalent (two full sorts and several (rows, candidates) temporaries) is the fallback.
"""

from __future__ import annotations

from types import ModuleType

import numpy as np
import torch
from torch import Tensor

from torchmetrics_retrieval.functional._search.compiled import DISTANCE_CODES
from torchmetrics_retrieval.functional._search.compiled.buffer import kernel_threads

__all__ = ["merge_sorted", "mixed_runs", "order_runs", "ranked_columns", "sort_by_key"]


def load_kernels() -> ModuleType:
    """The compiled kernels (:mod:`.order_kernels`, imported on first use: importing this module never loads
    numba)."""
    from torchmetrics_retrieval.functional._search.compiled import order_kernels

    return order_kernels


def sort_by_key(keys: Tensor, items: Tensor, gap: Tensor, near_limit: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Per row, candidates sorted by (key, item), and the near flags.

    Args:
        keys: ``(R, n)`` float32 stage-1 keys, +inf for an empty slot.
        items: ``(R, n)`` int64 gallery positions (< 2**31).
        gap: ``(R,)`` float64: keys closer than this are near ties.
        near_limit: ``(R,)`` float64: keys at most this are near as well (-inf: none).

    Returns:
        ``(sorted keys (R, n) float32, sorted items (R, n) int64, near (R, n) bool)``.
    """
    key_bits = keys.contiguous().numpy().view(np.int32)
    sorted_bits = np.empty_like(key_bits)
    sorted_items = np.empty(key_bits.shape, dtype=np.int64)
    near = np.zeros(key_bits.shape, dtype=np.bool_)
    load_kernels().sort_rows(
        key_bits,
        items.contiguous().numpy(),
        gap.numpy(),
        near_limit.numpy(),
        sorted_bits,
        sorted_items,
        near,
        kernel_threads(),
    )
    return torch.from_numpy(sorted_bits.view(np.float32)), torch.from_numpy(sorted_items), torch.from_numpy(near)


def order_runs(values: Tensor, items: Tensor, near: Tensor) -> Tensor:
    """``(R, n)`` int64 permutation that sorts each run of consecutive near entries by (value, item).

    Entries outside the runs keep their place; ``values`` only matter inside the runs.
    """
    order = np.empty(values.shape, dtype=np.int64)
    load_kernels().sort_runs(
        values.contiguous().numpy(), items.contiguous().numpy(), near.numpy(), order, kernel_threads()
    )
    return torch.from_numpy(order)


def mixed_runs(near: Tensor, relevant: Tensor) -> Tensor:
    """``(R, n)`` bool: the entries of the runs of consecutive ``near`` entries that hold both relevant and
    irrelevant items (the other runs can keep any order without changing the relevance of a rank)."""
    mixed = near.numpy().copy()
    load_kernels().clear_uniform_runs(mixed, relevant.contiguous().numpy(), kernel_threads())
    return torch.from_numpy(mixed)


def ranked_columns(
    keys: Tensor, items: Tensor, near: Tensor, values: Tensor, order: Tensor, query_sq: Tensor, distance: str
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """The first ``order.shape[1]`` candidates of each row in the order ``order`` (:func:`order_runs`, cut), in one
    pass.

    Args:
        keys: ``(R, n)`` float32 sorted stage-1 keys (+inf: an empty slot); ``items`` their int64 gallery positions;
            ``near`` their flags; ``values`` ``(R, n)`` the recomputed distances of the near entries.
        order: ``(R, k)`` int64 column of each rank.
        query_sq: ``(R,)`` float64 squared norms of the queries (read for the L2 distances).
        distance: the problem's distance, which maps a key to its distance.

    Returns:
        ``(distances (R, k) in the dtype of values, items (R, k) int64, valid (R, k) bool, recomputed (R, k) bool)``:
        a valid entry's distance is its recomputed value when it is near, else the distance of its key (as
        ``certify`` maps keys, in float64, then rounded); an invalid one has distance +inf and item 0.
    """
    shape = order.shape
    distances = np.empty(shape, dtype=values.numpy().dtype)
    chosen, valid, recomputed = np.empty(shape, np.int64), np.empty(shape, np.bool_), np.empty(shape, np.bool_)
    load_kernels().ranked_columns(
        keys.contiguous().numpy(), items.contiguous().numpy(), near.contiguous().numpy(), values.contiguous().numpy(),
        order.contiguous().numpy(), query_sq.contiguous().numpy(), DISTANCE_CODES[distance],
        distances, chosen, valid, recomputed, kernel_threads(),
    )  # fmt: skip
    return tuple(torch.from_numpy(a) for a in (distances, chosen, valid, recomputed))  # type: ignore[return-value]


def merge_sorted(
    first: tuple[Tensor, Tensor, Tensor], second: tuple[Tensor, Tensor, Tensor], k: int
) -> tuple[Tensor, Tensor, Tensor]:
    """The ``k`` first entries of two candidate lists ``(distances (R, n), items (R, n) int64, valid (R, n) bool)``,
    each row of each list sorted by (distance, item) with its empty slots last: one merge pass per row instead of
    a sort of both. An empty slot of the result has distance +inf, item ``2**31 - 1`` and valid False, as in the
    sharded search's sort-based merge; the lists must not share an item (they come from disjoint galleries)."""
    n_rows, dtype = first[0].shape[0], first[0].numpy().dtype
    merged = (np.empty((n_rows, k), dtype), np.empty((n_rows, k), np.int64), np.empty((n_rows, k), np.bool_))
    lists = tuple(tuple(t.contiguous().numpy() for t in found) for found in (first, second))
    load_kernels().merge_rows(*lists, merged, kernel_threads())
    return torch.from_numpy(merged[0]), torch.from_numpy(merged[1]), torch.from_numpy(merged[2])
