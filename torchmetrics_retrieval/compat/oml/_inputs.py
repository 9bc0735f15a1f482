"""Inputs of the OML functions: argument checks, ragged lists padded into one ``(Q, K)`` tensor, categories."""

from __future__ import annotations

from collections.abc import Iterable, Sequence, Sized
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.nn.utils.rnn import pad_sequence

from torchmetrics_retrieval.functional._checks import check_fractions, describe

__all__ = [
    "OVERALL_CATEGORIES_KEY",
    "Categories",
    "category_codes",
    "check_cutoffs",
    "check_in_unit_range",
    "check_same_length",
    "groups",
    "hits_from_ids",
    "hits_from_tops",
]

#: Key of the metrics over all queries when results are also given per category (OML's constant).
OVERALL_CATEGORIES_KEY = "OVERALL"

Categories = Tensor | np.ndarray | Sequence[Any]


# OML raises ValueError for every bad cutoff or fraction; so do we.


def check_cutoffs(name: str, top_k: object) -> tuple[int, ...]:
    """A non-empty sequence of ints >= 1, order and repeats kept (OML computes each as given)."""
    if isinstance(top_k, (str, bytes, Tensor)) or not isinstance(top_k, Iterable):
        raise ValueError(f"`{name}` must be a non-empty tuple of ints >= 1, got {describe(top_k)}.")
    ks = tuple(top_k)
    if not ks or not all(isinstance(k, int) and not isinstance(k, bool) and k >= 1 for k in ks):
        raise ValueError(f"`{name}` must be a non-empty tuple of ints >= 1, got {ks!r}.")
    return ks


def check_in_unit_range(name: str, values: object) -> tuple[float, ...]:
    """A non-empty sequence of numbers in [0, 1] (OML's ``_check_if_in_range``)."""
    fractions = check_fractions(name, values)  # type: ignore[arg-type]
    if not fractions:
        raise ValueError(f"`{name}` must not be empty, got {values!r}.")
    return fractions


def check_same_length(name: str, value: Sized, n: int, other: str) -> None:
    if len(value) != n:
        raise ValueError(f"`{name}` must have one entry per query like `{other}` ({n}), got {len(value)}.")


def _pad(rows: Sequence[Any], name: str, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """Pad a ragged list of 1-D tensors into one ``(Q, K)`` tensor of ``dtype`` and return their lengths.

    One pass over the list (input conversion); padding is 0 / False, told apart by the lengths.
    """
    tensors = [row if isinstance(row, Tensor) else torch.as_tensor(row) for row in rows]
    kinds = {(row.ndim, row.dtype, row.numel() > 0) for row in tensors}
    for ndim, kind, filled in kinds:
        if ndim != 1:
            raise ValueError(f"`{name}` must hold 1-D tensors, got one of {ndim} dimensions.")
        if dtype != torch.bool and filled and (kind.is_floating_point or kind.is_complex):
            raise TypeError(f"`{name}` must hold integer ids, got dtype {kind}.")
    if any(kind != dtype for _, kind, _ in kinds):
        tensors = [row.to(dtype) for row in tensors]
    lengths = torch.tensor([row.shape[0] for row in tensors], dtype=torch.int64)
    if not tensors:
        return torch.zeros(0, 0, dtype=dtype), lengths
    padded = pad_sequence(tensors, batch_first=True)
    return padded, lengths.to(padded.device)


def hits_from_ids(retrieved_ids: Sequence[Any], gt_ids: Sequence[Any]) -> tuple[Tensor, Tensor, Tensor]:
    """``(hits, lengths, n_gts)``: ``hits[q, j]`` is True when the j-th retrieved id of q is one of its ids.

    Every (query, id) pair gets one integer key ``q * span + (id - lowest id)``, so one sort of the
    ground-truth keys and one ``searchsorted`` answer the membership of every query at once.
    """
    retrieved, lengths = _pad(retrieved_ids, "retrieved_ids", torch.int64)
    relevant, n_gts = _pad(gt_ids, "gt_ids", torch.int64)
    relevant = relevant.to(retrieved.device)
    n_gts = n_gts.to(retrieved.device)
    in_list = _within_lengths(retrieved.shape[1], lengths)
    in_gt = _within_lengths(relevant.shape[1], n_gts)
    if not bool(in_list.any()):
        return in_list, lengths, n_gts
    real = torch.cat([retrieved[in_list], relevant[in_gt]])
    low = real.min()
    span = real.max() - low + 1
    rows = torch.arange(retrieved.shape[0], device=retrieved.device)[:, None] * span
    retrieved_keys = torch.where(in_list, rows + (retrieved - low), -1)
    relevant_keys = (rows + (relevant - low))[in_gt].sort().values
    return _is_member(retrieved_keys, relevant_keys) & in_list, lengths, n_gts


def _is_member(keys: Tensor, sorted_keys: Tensor) -> Tensor:
    """``torch.isin(keys, sorted_keys)`` by binary search (several times faster than ``isin`` here)."""
    if sorted_keys.numel() == 0:
        return torch.zeros_like(keys, dtype=torch.bool)
    at = torch.searchsorted(sorted_keys, keys).clamp_(max=sorted_keys.numel() - 1)
    return sorted_keys[at] == keys


def _within_lengths(n_columns: int, lengths: Tensor) -> Tensor:
    return torch.arange(n_columns, device=lengths.device)[None, :] < lengths[:, None]


def hits_from_tops(gt_tops: Sequence[Any], n_gts: Sequence[int]) -> tuple[Tensor, Tensor, Tensor]:
    """``(hits, lengths, n_gts)`` from OML's ragged ``gt_tops`` and ``n_gts``."""
    check_same_length("n_gts", n_gts, len(gt_tops), "gt_tops")
    hits, lengths = _pad(gt_tops, "gt_tops", torch.bool)
    n_relevant = torch.as_tensor(n_gts, dtype=torch.int64, device=hits.device).reshape(-1)
    return hits, lengths, n_relevant


def category_codes(categories: Categories, n: int, name: str, *, by_first_appearance: bool) -> tuple[list[Any], Tensor]:
    """Distinct categories (numpy scalars, as OML's keys) and the code of each row.

    Sorted (OML iterates ``np.unique``) or in order of first appearance (OML iterates the categories).
    """
    values = np.asarray(categories.cpu()) if isinstance(categories, Tensor) else np.asarray(categories)
    if values.ndim != 1:
        raise ValueError(f"`{name}` must be 1-D, got {describe(values)}.")
    check_same_length(name, values, n, "the rows")
    distinct, first, inverse = np.unique(values, return_index=True, return_inverse=True)
    inverse = inverse.reshape(-1)
    if by_first_appearance:
        order = np.argsort(first, kind="stable")
        recode = np.empty_like(order)
        recode[order] = np.arange(order.size)
        distinct, inverse = distinct[order], recode[inverse]
    return list(distinct), torch.from_numpy(inverse)


def groups(codes: Tensor, n_groups: int) -> list[Tensor]:
    """Row indices of each group, rows in their original order (one stable sort, no mask per group)."""
    order = torch.argsort(codes, stable=True)
    return list(order.split(torch.bincount(codes, minlength=n_groups).tolist()))
