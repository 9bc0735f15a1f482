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

The torch equivalent (two full sorts and several (rows, candidates) temporaries) is the fallback.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from torchmetrics_retrieval.functional import _compiled_buffer

__all__ = ["mixed_runs", "order_runs", "sort_by_key"]


def _kernels() -> dict[str, Any]:
    """The compiled kernels (defined on first use so that importing this module never compiles)."""
    if _KERNELS:
        return _KERNELS
    jit = _compiled_buffer.cached_njit()

    buffer_kernels = _compiled_buffer._kernels()
    encode, decode, radix_sort = (buffer_kernels[name] for name in ("encode", "decode", "radix_sort"))

    @jit
    def sort_rows(key_bits, items, gap, near_limit, sorted_keys, sorted_items, near):
        n = key_bits.shape[1]
        codes, scratch, counts = np.empty(n, dtype=np.int64), np.empty(n, dtype=np.int64), np.empty(256, np.int64)
        for r in range(key_bits.shape[0]):
            in_order = True
            for j in range(n):
                codes[j] = encode(key_bits[r, j], items[r, j])
                in_order &= j == 0 or codes[j] >= codes[j - 1]
            if not in_order:  # (the compiled buffer returns its rows sorted)
                radix_sort(codes, scratch, counts)
            for j in range(n):
                sorted_keys[r, j], sorted_items[r, j] = decode(codes[j])
            keys = sorted_keys[r].view(np.float32)
            for j in range(n):
                if keys[j] <= near_limit[r]:
                    near[r, j] = True
                if j and np.float64(keys[j]) - np.float64(keys[j - 1]) <= gap[r]:
                    near[r, j] = near[r, j - 1] = True

    @jit
    def sort_runs(values, items, near, order):
        n = values.shape[1]
        for r in range(values.shape[0]):
            for j in range(n):
                order[r, j] = j
            j = 0
            while j < n:
                if not near[r, j]:
                    j += 1
                    continue
                start = j
                while j < n and near[r, j]:
                    j += 1
                for a in range(start + 1, j):  # insertion sort of the run by (value, item)
                    moving = order[r, a]
                    b = a
                    while b > start and (
                        values[r, moving] < values[r, order[r, b - 1]]
                        or (
                            values[r, moving] == values[r, order[r, b - 1]]
                            and items[r, moving] < items[r, order[r, b - 1]]
                        )
                    ):
                        order[r, b] = order[r, b - 1]
                        b -= 1
                    order[r, b] = moving

    @jit
    def clear_uniform_runs(near, relevant):
        n = near.shape[1]
        for r in range(near.shape[0]):
            j = 0
            while j < n:
                if not near[r, j]:
                    j += 1
                    continue
                start, found = j, 0
                while j < n and near[r, j]:
                    found += relevant[r, j]
                    j += 1
                if found == 0 or found == j - start:
                    near[r, start:j] = False

    _KERNELS.update(sort_rows=sort_rows, sort_runs=sort_runs, clear_uniform_runs=clear_uniform_runs)
    return _KERNELS


_KERNELS: dict[str, Any] = {}


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
    _kernels()["sort_rows"](
        key_bits, items.contiguous().numpy(), gap.numpy(), near_limit.numpy(), sorted_bits, sorted_items, near
    )
    return torch.from_numpy(sorted_bits.view(np.float32)), torch.from_numpy(sorted_items), torch.from_numpy(near)


def order_runs(values: Tensor, items: Tensor, near: Tensor) -> Tensor:
    """``(R, n)`` int64 permutation that sorts each run of consecutive near entries by (value, item).

    Entries outside the runs keep their place; ``values`` only matter inside the runs.
    """
    order = np.empty(values.shape, dtype=np.int64)
    _kernels()["sort_runs"](values.contiguous().numpy(), items.contiguous().numpy(), near.numpy(), order)
    return torch.from_numpy(order)


def mixed_runs(near: Tensor, relevant: Tensor) -> Tensor:
    """``(R, n)`` bool: the entries of the runs of consecutive ``near`` entries that hold both relevant and
    irrelevant items (the other runs can keep any order without changing the relevance of a rank)."""
    mixed = near.numpy().copy()
    _kernels()["clear_uniform_runs"](mixed, relevant.contiguous().numpy())
    return torch.from_numpy(mixed)
