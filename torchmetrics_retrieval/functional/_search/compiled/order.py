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

import numpy as np
import torch
from torch import Tensor

from torchmetrics_retrieval.functional._search.compiled.buffer import kernel_threads, load_kernels

__all__ = ["mixed_runs", "order_runs", "sort_by_key"]


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
